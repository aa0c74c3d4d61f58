"""The training engine, the training loop and the utilities of a training run.

The loop of ``torus-train`` is a library component, and Python drives the
same one: ``RunConfig`` is its option table (keyword arguments are the
command-line options with dashes written as underscores; ``from_args``
parses flags and ``--config`` files exactly as torus-train does) and
``TrainLoop`` runs it — data, LR schedule, evaluation, the step line,
metrics JSONL and TensorBoard files::

    import torus
    from torus import train

    cfg = train.RunConfig(tp=2, pp=2, dp=2, steps=200, precision="f32", out="runs/x")
    loop = train.TrainLoop(torus.init(), cfg)      # collective
    loop.on_step(lambda r: None)                   # r: StepRecord, every rank
    summary = loop.run()                           # collective; releases the GIL

ZeRO and the memory pre-check are options like any other:
``RunConfig(zero=2, offload="optimizer")`` shards gradients and optimizer
state over dp and keeps the optimizer state in host memory; the loop
refuses to start a run whose memory estimate (``loop.memory_estimate``, a
``MemoryEstimate``) exceeds what a rank has, unless ``force=True``.
``ParallelLayout(dp=4, zero=3, offload="optimizer+params")`` is the same
for the engine alone (the layout is one value, ``ParallelLayout``, whatever
describes it: ``RunConfig.layout``, a plan, a checkpoint's manifest).

Checkpoints are options too: ``RunConfig(save_every=50, keep_last=3,
async_save=True)`` saves sharded, verified checkpoints under
``<out>/checkpoints`` and ``RunConfig(resume="auto")`` continues from the
newest good one, in any layout (``torus.checkpoint``, docs/checkpoint.md).

``Trainer`` is the engine under the loop (any model adapter; ``GPTTrainer``
over the reference GPT of ``torus.models``)::

    cfg = models.GPTConfig(vocab_size=256, max_seq_len=64, num_layers=4, hidden=128, num_heads=4)
    layout = train.ParallelLayout(tp=2, pp=2, dp=2, schedule="1f1b", num_micro=4)
    trainer = train.GPTTrainer(world, cfg, layout, train.OptimizerConfig(lr=3e-3))
    stats = trainer.train_step(batch, lr)          # [global_batch, seq + 1] int64, same on every rank

``train_step`` and ``evaluate`` are collective and release the GIL. Layout
and size problems raise ``torus.InvalidArgument`` before any communication;
a failed peer raises ``torus.CommError``/``torus.TimeoutError``.

The utilities are the C++ ones: ``LrSchedule`` (linear warm-up, cosine
decay), ``Corpus`` / ``BatchSampler`` (byte corpus with a held-out end,
deterministic batches identical on every rank), ``format_step_line`` /
``format_bytes`` / ``render_progress`` / ``peak_rss_bytes``. Plots:
``python3 -m torus.plot RUN_DIR``.
"""

from . import _C

_train = _C.train

ParallelLayout = _train.ParallelLayout
OptimizerConfig = _train.OptimizerConfig
TrainerOptions = _train.TrainerOptions
StepStats = _train.StepStats
Trainer = _train.Trainer
GPTTrainer = _train.GPTTrainer

MemoryEstimate = _train.MemoryEstimate
RunConfig = _train.RunConfig
run_config_help = _train.run_config_help
run_option_names = _train.run_option_names
StepRecord = _train.StepRecord
RunSummary = _train.RunSummary
TrainLoop = _train.TrainLoop

LrSchedule = _train.LrSchedule
Corpus = _train.Corpus
CorpusSplit = _train.CorpusSplit
BatchSampler = _train.BatchSampler
default_corpus_path = _train.default_corpus_path

format_step_line = _train.format_step_line
format_bytes = _train.format_bytes
format_duration = _train.format_duration
render_progress = _train.render_progress
peak_rss_bytes = _train.peak_rss_bytes
current_rss_bytes = _train.current_rss_bytes

__all__ = [
    "BatchSampler",
    "Corpus",
    "CorpusSplit",
    "GPTTrainer",
    "LrSchedule",
    "MemoryEstimate",
    "OptimizerConfig",
    "ParallelLayout",
    "RunConfig",
    "RunSummary",
    "StepRecord",
    "StepStats",
    "TrainLoop",
    "Trainer",
    "TrainerOptions",
    "current_rss_bytes",
    "default_corpus_path",
    "format_bytes",
    "format_duration",
    "format_step_line",
    "peak_rss_bytes",
    "render_progress",
    "run_config_help",
    "run_option_names",
]
