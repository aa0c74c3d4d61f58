"""Pipeline parallelism: schedules as data, their simulator, and the executor.

A ``Schedule`` is, for every pipeline rank, the ordered list of ``Action``s it
runs in one step (forward/backward of (micro-batch, chunk) pairs and the
sends/receives between neighbouring stages). Generators build GPipe, 1F1B,
interleaved 1F1B and ZB-H1; ``simulate`` checks any schedule — generated or
hand-made — and reports its bubble and memory; ``PipelineExecutor`` runs a
valid one over a process group with your ``StageCallbacks``::

    import torus
    from torus import pipeline

    s = pipeline.make_schedule("1f1b", num_ranks=4, num_micro=8)
    sim = pipeline.simulate(s)                       # sim.bubble(), sim.peak_live()
    assert abs(sim.bubble() - pipeline.closed_form_bubble("1f1b", 4, 8)) < 1e-12

    class MyStage(pipeline.StageCallbacks):
        def __init__(self):
            super().__init__()                       # required
        def forward(self, micro, chunk, input): ...  # input: None on stage 0
        def loss(self, micro, output): ...           # last stage only (default: output)
        def backward_input(self, micro, chunk, grad_output): ...   # grad_output: None on the last stage
        def backward_weight(self, micro, chunk): ...
        # backward(micro, chunk, grad_output): default backward_input + backward_weight

    world = torus.init()
    executor = pipeline.PipelineExecutor(world)      # a group of its own: it owns the point-to-point tags
    result = executor.run(s, MyStage())              # result.losses on the last stage

Stage layout (Note [Stage layout] in schedule.h): with ``p`` ranks of ``v``
chunks, chunk ``c`` of rank ``r`` is stage ``c * p + r``; stage 0 reads the
data and the last stage computes the loss.

Threading: ``run`` releases the GIL and calls the callbacks on the calling
thread, taking the GIL for each call. Tensors handed to the callbacks are
fresh tensors over the executor's storage with no autograd history — keep
your own graph (the tensors your ``forward`` returned), keyed by
``(micro, chunk)``. ``loss(micro, output)`` receives the very object your
last-stage ``forward`` returned, so the loss can be differentiated from it.
An exception raised by a callback propagates out of ``run``; the step is
then lost (build a new executor).

Schedules are plain data: ``Schedule.actions`` (one list of ``Action`` per
rank) is copied in and out, so assign a whole new list to change it.
``parse_schedule`` reads the compact text form of ``Schedule.to_string()``
(``"F0 SA0 RG0 B0"``). ``check_schedule`` raises ``torus.InvalidArgument``
naming each problem (rank, position, action; a deadlock with its wait cycle);
``validate`` returns the messages.
"""

from . import _C

_pp = _C.pipeline

# Schedules.
ActionKind = _pp.ActionKind
Action = _pp.Action
Schedule = _pp.Schedule
ScheduleKind = _pp.ScheduleKind
ALL_SCHEDULE_KINDS = _pp.ALL_SCHEDULE_KINDS
schedule_kind_name = _pp.schedule_kind_name
schedule_kind_from_name = _pp.schedule_kind_from_name
make_schedule = _pp.make_schedule
add_communication = _pp.add_communication
parse_schedule = _pp.parse_schedule

# Validation and simulation.
CostModel = _pp.CostModel
ScheduleIssue = _pp.ScheduleIssue
RankStats = _pp.RankStats
Simulation = _pp.Simulation
simulate = _pp.simulate
validate = _pp.validate
check_schedule = _pp.check_schedule
closed_form_bubble = _pp.closed_form_bubble

# Cutting a model into stages.
Partition = _pp.Partition
partition_balanced = _pp.partition_balanced
partition_from_sizes = _pp.partition_from_sizes
max_stage_cost = _pp.max_stage_cost
imbalance = _pp.imbalance
GPTPart = _pp.GPTPart
gpt_item_costs = _pp.gpt_item_costs
gpt_stage_parts = _pp.gpt_stage_parts
describe_part = _pp.describe_part

# Execution.
StageCallbacks = _pp.StageCallbacks
TensorSpec = _pp.TensorSpec
ExecutorOptions = _pp.ExecutorOptions
ActionRecord = _pp.ActionRecord
StepResult = _pp.StepResult
PipelineExecutor = _pp.PipelineExecutor

__all__ = [
    "ALL_SCHEDULE_KINDS",
    "Action",
    "ActionKind",
    "ActionRecord",
    "CostModel",
    "ExecutorOptions",
    "GPTPart",
    "Partition",
    "PipelineExecutor",
    "RankStats",
    "Schedule",
    "ScheduleIssue",
    "ScheduleKind",
    "Simulation",
    "StageCallbacks",
    "StepResult",
    "TensorSpec",
    "add_communication",
    "check_schedule",
    "closed_form_bubble",
    "describe_part",
    "gpt_item_costs",
    "gpt_stage_parts",
    "imbalance",
    "make_schedule",
    "max_stage_cost",
    "parse_schedule",
    "partition_balanced",
    "partition_from_sizes",
    "schedule_kind_from_name",
    "schedule_kind_name",
    "simulate",
    "validate",
]
