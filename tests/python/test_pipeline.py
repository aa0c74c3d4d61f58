"""torus.pipeline and torus.train from Python, on every rank under mpirun.

The pipeline group is the whole world (p = world size); references are plain
torch computed on every rank from values that are identical everywhere, with
no communication:
  * schedules: simulated bubbles against the closed forms; a deadlock found
    and explained;
  * PipelineExecutor with StageCallbacks written in Python (a chain of
    tanh(x W^T + b) layers in f64) against single-process autograd;
  * GPTTrainer (pp = world size; tp2 x pp2 on 4 ranks) against torus.models.GPT
    trained by torch.optim.AdamW with the clipping rule written out;
  * the example script's option parsing (config file and flag precedence).
"""
import dataclasses
import importlib.util
import json
import math
import os
import pathlib

import pytest
import torch

import torus
from torus import models, pipeline, train

KINDS = ["gpipe", "1f1b", "interleaved", "zb-h1"]


@pytest.fixture(scope="module")
def world():
    return torus.init()


# ---- schedules ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_simulated_bubble_equals_the_closed_form(kind):
    p, m = 4, 8
    v = 2 if kind == "interleaved" else 1
    s = pipeline.make_schedule(kind, p, m, v)
    assert (s.num_ranks, s.num_micro, s.num_chunks, s.num_stages) == (p, m, v, p * v)
    assert len(s.actions) == p
    assert pipeline.validate(s) == []
    pipeline.check_schedule(s)
    costs = pipeline.CostModel()  # t_F = t_B = t_W = 1, no communication cost
    sim = pipeline.simulate(s, costs)
    assert sim.ok and len(sim.ranks) == p
    assert sim.bubble() == pytest.approx(pipeline.closed_form_bubble(kind, p, m, v, costs), abs=1e-12)
    assert pipeline.closed_form_bubble(pipeline.schedule_kind_from_name(kind), p, m, v) == pytest.approx(sim.bubble())
    # The text form parses back into the same schedule.
    again = pipeline.parse_schedule(s.name, p, m, v, s.to_string().splitlines())
    assert again.actions == s.actions


def test_zero_bubble_idles_a_third_of_1f1b():
    p, m = 4, 8
    zb = pipeline.simulate(pipeline.make_schedule(pipeline.ScheduleKind.ZB_H1, p, m))
    ofob = pipeline.simulate(pipeline.make_schedule(pipeline.ScheduleKind.ONE_F_ONE_B, p, m))
    idle = lambda sim: sim.bubble() * p * sim.makespan  # noqa: E731
    assert idle(zb) == pytest.approx(idle(ofob) / 3)
    assert zb.peak_live() == p and ofob.peak_live() == p


def test_a_deadlocking_schedule_is_rejected_naming_the_ranks():
    # Rank 0 waits for the gradient of micro-batch 0 before it sends the
    # activation rank 1 needs to produce that gradient.
    bad = pipeline.Schedule("deadlock", 2, 1, 1, [
        [pipeline.Action(pipeline.ActionKind.FORWARD, 0),
         pipeline.Action(pipeline.ActionKind.RECV_GRAD, 0, peer=1),
         pipeline.Action(pipeline.ActionKind.SEND_ACTIVATION, 0, peer=1),
         pipeline.Action(pipeline.ActionKind.BACKWARD, 0)],
        pipeline.parse_schedule("x", 2, 1, 1, ["F0 SA0 RG0 B0", "RA0 F0 B0 SG0"]).actions[1],
    ])
    issues = pipeline.validate(bad)
    assert issues and any("deadlock" in i for i in issues)
    assert any(i.startswith("rank 0, action #1 RecvGrad") for i in issues), issues
    with pytest.raises(torus.InvalidArgument, match=r"(?s)schedule 'deadlock'.*deadlock.*rank 0.*rank 1"):
        pipeline.check_schedule(bad)
    sim = pipeline.simulate(bad)
    assert not sim.ok and {i.rank for i in sim.issues} >= {0, 1}


def test_partition_and_gpt_stage_parts():
    cut = pipeline.partition_balanced([1.0, 2.0, 3.0, 4.0, 5.0], 2)
    assert cut.bounds == [0, 3, 5] and cut.num_stages == 2
    assert pipeline.max_stage_cost(cut, [1.0, 2.0, 3.0, 4.0, 5.0]) == 9.0
    cfg = models.GPTConfig.tiny()
    costs = pipeline.gpt_item_costs(cfg, cfg.max_seq_len)
    assert len(costs) == cfg.num_layers + 2
    parts = pipeline.gpt_stage_parts(cfg, 2, cfg.max_seq_len, [1, 1])
    assert [p.describe(cfg.num_layers) for p in parts] == ["embedding + block 0", "block 1 + head"]
    with pytest.raises(torus.InvalidArgument):
        pipeline.gpt_stage_parts(cfg, 2, cfg.max_seq_len, [2, 1])


# ---- the executor with Python callbacks -----------------------------------------------

WIDTH, BATCH, LAYERS_PER_STAGE = 5, 3, 2
F64 = torch.float64


def chain(num_layers):
    """The whole chain, identical on every rank (a closed formula)."""
    ws, bs = [], []
    for l in range(num_layers):
        i = torch.arange(WIDTH * WIDTH, dtype=F64).reshape(WIDTH, WIDTH)
        ws.append((i * 0.37 + l).sin() * (1.2 / math.sqrt(WIDTH)))
        bs.append((torch.arange(WIDTH, dtype=F64) * 0.91 - l).cos() * 0.1)
    return ws, bs


def chain_input(micro):
    return (torch.arange(BATCH * WIDTH, dtype=F64).reshape(BATCH, WIDTH) * 0.53 + micro).sin()


class ChainStage(pipeline.StageCallbacks):
    """This rank's chunks of the chain; autograd keeps the graph between the halves of the backward."""

    def __init__(self, schedule, rank, ws, bs):
        super().__init__()
        self.s, self.rank = schedule, rank
        self.params = {}
        for chunk in range(schedule.num_chunks):
            for l in self.layers(chunk):
                self.params[l] = (ws[l].clone().requires_grad_(True), bs[l].clone().requires_grad_(True))
        self.saved = {}  # (micro, chunk) -> [input, output or loss, grad_output]
        self.events = []

    def layers(self, chunk):
        stage = self.s.stage(self.rank, chunk)
        return range(stage * LAYERS_PER_STAGE, (stage + 1) * LAYERS_PER_STAGE)

    def chunk_params(self, chunk):
        return [t for l in self.layers(chunk) for t in self.params[l]]

    def forward(self, micro, chunk, input):
        first = self.s.is_first_stage(self.rank, chunk)
        assert (input is None) == first
        x = chain_input(micro) if first else input.detach().requires_grad_(True)
        y = x
        for l in self.layers(chunk):
            w, b = self.params[l]
            y = torch.tanh(y @ w.t() + b)
        self.saved[(micro, chunk)] = [x, y, None]
        self.events.append(("F", micro, chunk))
        return y

    def loss(self, micro, output):
        chunk = self.s.num_chunks - 1
        entry = self.saved[(micro, chunk)]
        assert output is entry[1], "loss() must get the object forward() returned"
        entry[1] = 0.5 * (output * output).sum()
        return entry[1]

    def backward_input(self, micro, chunk, grad_output):
        entry = self.saved[(micro, chunk)]
        assert (grad_output is None) == self.s.is_last_stage(self.rank, chunk)
        entry[2] = grad_output
        self.events.append(("BI", micro, chunk))
        x, target = entry[0], entry[1]
        if not x.requires_grad:  # stage 0: nothing to send
            return None
        (gx,) = torch.autograd.grad(target, [x], grad_output, retain_graph=True)
        return gx

    def backward_weight(self, micro, chunk):
        x, target, grad_output = self.saved.pop((micro, chunk))
        self.events.append(("BW", micro, chunk))
        torch.autograd.backward(target, grad_output, inputs=self.chunk_params(chunk))


class FusedChainStage(ChainStage):
    """Overrides the fused backward (schedules that do not split it)."""

    def backward(self, micro, chunk, grad_output):
        x, target, _ = self.saved.pop((micro, chunk))
        self.events.append(("B", micro, chunk))
        inputs = self.chunk_params(chunk) + ([x] if x.requires_grad else [])
        torch.autograd.backward(target, grad_output, inputs=inputs)
        return x.grad if x.requires_grad else None


def chain_reference(num_layers, num_micro):
    ws, bs = chain(num_layers)
    ws = [w.clone().requires_grad_(True) for w in ws]
    bs = [b.clone().requires_grad_(True) for b in bs]
    losses = []
    for mb in range(num_micro):
        x = chain_input(mb)
        for w, b in zip(ws, bs):
            x = torch.tanh(x @ w.t() + b)
        loss = 0.5 * (x * x).sum()
        loss.backward()
        losses.append(loss.item())
    return [w.grad for w in ws], [b.grad for b in bs], losses


@pytest.mark.parametrize("kind,fused", [("gpipe", False), ("gpipe", True), ("1f1b", True), ("interleaved", False),
                                        ("zb-h1", False)])
def test_executor_with_python_callbacks_matches_autograd(world, kind, fused):
    p, r = world.size, world.rank
    v = 2 if kind == "interleaved" and p >= 2 else 1
    m = 4 if p <= 2 else 2 * p
    s = pipeline.make_schedule(kind, p, m, v)
    num_layers = p * v * LAYERS_PER_STAGE
    ref_w, ref_b, ref_losses = chain_reference(num_layers, m)
    ws, bs = chain(num_layers)
    stage = (FusedChainStage if fused else ChainStage)(s, r, ws, bs)
    options = pipeline.ExecutorOptions(record_trace=True, timeout=120.0)
    executor = pipeline.PipelineExecutor(world, options)
    for step in range(2):  # two steps with one executor: gradients accumulate
        result = executor.run(s, stage)
        assert stage.saved == {}
        assert result.wall >= result.busy >= 0 and result.peak_live >= 1
        assert len(result.trace) == len(s.actions[r])
        assert [t.action for t in result.trace] == s.actions[r]
        if s.is_last_stage(r, v - 1):
            assert len(result.losses) == m
            for got, want in zip(result.losses, ref_losses):
                assert got.dtype == F64 and not got.requires_grad
                assert abs(got.item() - want) <= 1e-12 * max(1.0, abs(want))
        else:
            assert result.losses == []
    split = any(e[0] == "BW" for e in stage.events)
    assert split == (kind == "zb-h1" or not fused), "the fused override was not used (or used for a split schedule)"
    for l, (w, b) in stage.params.items():
        assert (w.grad - 2 * ref_w[l]).abs().max().item() <= 1e-12, f"layer {l} weight"
        assert (b.grad - 2 * ref_b[l]).abs().max().item() <= 1e-12, f"layer {l} bias"


def test_a_callback_error_propagates_out_of_run(world):
    if world.size != 1:
        pytest.skip("a failed step leaves its peers waiting: one rank only")

    class Broken(pipeline.StageCallbacks):
        def __init__(self):
            super().__init__()

        def forward(self, micro, chunk, input):
            raise KeyError("no such micro-batch")

    group = world
    s = pipeline.make_schedule("1f1b", 1, 2)
    with pytest.raises(KeyError, match="no such micro-batch"):
        pipeline.PipelineExecutor(group).run(s, Broken())

    class Incomplete(pipeline.StageCallbacks):
        def __init__(self):
            super().__init__()

        def forward(self, micro, chunk, input):
            return torch.ones(1)

    with pytest.raises(NotImplementedError, match="backward_input"):
        pipeline.PipelineExecutor(group).run(s, Incomplete())


def test_invalid_schedule_is_refused_before_communication(world):
    s = pipeline.make_schedule("1f1b", world.size + 1, 2)  # sized for another group
    with pytest.raises(torus.InvalidArgument):
        pipeline.PipelineExecutor(world).run(s, ChainStage(pipeline.make_schedule("1f1b", 1, 1), 0, *chain(2)))


# ---- GPTTrainer ------------------------------------------------------------------------

STEPS, ROWS, LR, CLIP, EPS = 5, 8, 1e-3, 0.5, 1e-6


def gpt_config():
    cfg = models.GPTConfig.tiny()
    cfg.dtype = torch.float64
    return cfg


def gpt_batch(cfg, step):
    """A learnable stream: random first tokens, then t' = (3 t + 7) mod vocab."""
    gen = torch.Generator().manual_seed(300 + step)
    data = torch.randint(0, cfg.vocab_size, (ROWS, cfg.max_seq_len + 1), generator=gen)
    for i in range(1, data.shape[1]):
        data[:, i] = (data[:, i - 1] * 3 + 7) % cfg.vocab_size
    return data


def gpt_reference(cfg):
    """One process, the whole batch: forward, backward, clip by the global norm, AdamW (decay on dim >= 2)."""
    model = models.GPT(cfg)
    params = list(model.parameters())
    groups = [{"params": [q for q in params if q.dim() >= 2], "weight_decay": 0.1},
              {"params": [q for q in params if q.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=LR, betas=(0.9, 0.95), eps=EPS, foreach=False)
    losses, norms = [], []
    for step in range(STEPS):
        data = gpt_batch(cfg, step)
        s = cfg.max_seq_len
        loss = model.loss(data[:, :s].contiguous(), data[:, 1:s + 1].contiguous())
        loss.backward()
        norm = math.sqrt(sum(q.grad.double().pow(2).sum().item() for q in params))
        if norm > CLIP:
            for q in params:
                q.grad.mul_(CLIP / (norm + 1e-6))
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        norms.append(norm)
    return losses, norms, {k: v.detach().clone() for k, v in model.named_parameters()}


LAYOUTS = {
    "pp=world,1f1b": lambda n: (train.ParallelLayout(pp=n, num_micro=4), n),
    "pp=world,zb-h1": lambda n: (train.ParallelLayout(pp=n, num_micro=4, schedule="zb-h1"), n),
    "tp2,pp2,gpipe": lambda n: (train.ParallelLayout(tp=2, pp=2, dp=1, num_micro=4,
                                                     schedule=pipeline.ScheduleKind.GPIPE), 4),
}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_gpt_trainer_matches_single_process_training(world, name):
    layout, ranks = LAYOUTS[name](world.size)
    if ranks != world.size:
        pytest.skip(f"needs {ranks} ranks")
    cfg = gpt_config()
    ref_losses, ref_norms, ref_weights = gpt_reference(cfg)
    assert ref_losses[-1] < ref_losses[0]
    assert any(n > CLIP for n in ref_norms), "no step clipped: the test does not exercise clipping"

    optim = train.OptimizerConfig(lr=LR, grad_clip=CLIP, eps=EPS)
    trainer = train.GPTTrainer(world, cfg, layout, optim)
    assert trainer.layout.describe() == layout.describe()
    assert len(trainer.describe_stages()) == layout.pp
    assert trainer.schedule().num_ranks == layout.pp
    assert trainer.num_parameters() == sum(v.numel() for v in ref_weights.values())
    for step in range(STEPS):
        st = trainer.train_step(gpt_batch(cfg, step))
        assert st.step == step + 1 and not st.skipped and st.tokens == ROWS * cfg.max_seq_len
        assert abs(st.loss - ref_losses[step]) <= 1e-10 * abs(ref_losses[step]), (step, st.loss, ref_losses[step])
        assert abs(st.grad_norm - ref_norms[step]) <= 1e-9 * ref_norms[step]
        assert (st.clip_coefficient < 1) == (ref_norms[step] > CLIP)
    assert trainer.steps_taken() == STEPS
    logging = torch.tensor([1.0 if trainer.is_logging_rank() else 0.0], dtype=F64)
    world.all_reduce(logging).wait()
    assert logging.item() == 1.0

    weights = trainer.gather_local_parameters()
    assert weights
    for got_name, w in weights.items():
        ref_name = "embedding.word.weight" if got_name == "head.output" else got_name
        ref = ref_weights[ref_name]
        assert w.shape == ref.shape, got_name
        rel = ((w - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
        assert rel <= 1e-10, (got_name, rel)

    # Evaluation is forward only: the same value everywhere, and it changes nothing.
    before = trainer.evaluate(gpt_batch(cfg, 99))
    assert before == trainer.evaluate(gpt_batch(cfg, 99))
    assert math.isfinite(before)


def test_bad_layouts_raise_before_any_communication(world):
    cfg = gpt_config()
    with pytest.raises(torus.InvalidArgument, match="ranks"):
        train.GPTTrainer(world, cfg, train.ParallelLayout(pp=world.size + 1))
    with pytest.raises(torus.InvalidArgument, match="interleaved"):
        train.GPTTrainer(world, cfg, train.ParallelLayout(pp=world.size, num_chunks=2))
    with pytest.raises(torus.InvalidArgument):
        train.ParallelLayout(schedule="nonesuch")


def test_training_utilities():
    lr = train.LrSchedule(peak=1.0, min=0.1, warmup_steps=2, total_steps=6)
    assert [round(lr(s), 12) for s in (0, 1, 5, 9)] == [0.5, 1.0, 0.1, 0.1]
    with pytest.raises(torus.InvalidArgument):
        train.LrSchedule(peak=1.0, min=2.0)
    corpus = train.Corpus.from_bytes(bytes(range(200)) * 5, "mem")
    split = corpus.split(0.2)
    assert len(corpus) == 1000 and len(split.val) == 200 and split.train + split.val == corpus.data
    sampler = train.BatchSampler(split.train, seq_len=16, batch=4, seed=7)
    b = sampler.batch(3)
    assert b.shape == (4, 17) and b.dtype == torch.int64
    assert torch.equal(b, sampler.batch(3)) and torch.equal(sampler.rows(3, 1, 2), b[1:3])
    assert bytes(b[0].tolist()) == split.train[sampler.offset(3, 0):sampler.offset(3, 0) + 17]
    line = train.format_step_line(40, loss=2.31, val_loss=2.40, grad_norm=0.82, lr=3e-4, tokens_per_s=1520, mfu=0.11,
                                  mem_bytes=1.3 * 2**30)
    assert line == "step 40 | loss 2.31 | val 2.40 | grad_norm 0.82 | lr 3.0e-4 | 1520 tok/s | MFU 11% | mem 1.3 GiB"
    assert train.format_step_line(3, loss=1.0) == "step 3 | loss 1.00"
    assert train.peak_rss_bytes() > 0


def test_gpt_trainer_recompute_equals_no_recompute(world):
    # The C++ GPT's recompute policy from Python: with dropout, every policy
    # gives the losses and gradient norms of the run without recompute.
    def run(policy):
        cfg = dataclasses.replace(gpt_config(), dropout=0.1, attention_dropout=0.1, recompute=policy)
        trainer = train.GPTTrainer(world, cfg, train.ParallelLayout(pp=world.size, num_micro=2),
                                   train.OptimizerConfig(lr=LR, grad_clip=0.0))
        return [(st.loss, st.grad_norm) for st in (trainer.train_step(gpt_batch(cfg, k)) for k in range(2))]

    base = run("none")
    for policy in ("full", "every:2", "selective"):
        for (l, g), (l0, g0) in zip(run(policy), base):
            assert abs(l - l0) <= 1e-12 * abs(l0) and abs(g - g0) <= 1e-10 * g0, (policy, l, l0, g, g0)
    with pytest.raises(torus.InvalidArgument, match="recompute"):
        models.GPTConfig(recompute="sometimes").to_native()


def test_gpt_trainer_on_this_ranks_rows_equals_the_whole_batch(world):
    # dp = world size, 2 micro-batches: each rank trains on local_rows only
    # and gets the losses, norms and evaluation of training on the whole batch.
    cfg = gpt_config()
    layout = train.ParallelLayout(dp=world.size, num_micro=2)
    whole = train.GPTTrainer(world, cfg, layout, train.OptimizerConfig(lr=LR))
    local = train.GPTTrainer(world, cfg, layout, train.OptimizerConfig(lr=LR))
    rows = local.local_rows(ROWS)
    assert len(rows) == ROWS // world.size and len(set(rows)) == len(rows)
    for step in range(2):
        batch = gpt_batch(cfg, step)
        a = whole.train_step(batch)
        b = local.train_step_local(batch[rows], ROWS)
        assert (a.loss, a.grad_norm) == (b.loss, b.grad_norm)
    batch = gpt_batch(cfg, 9)
    assert whole.evaluate(batch) == local.evaluate_local(batch[rows], ROWS)
    with pytest.raises(torus.InvalidArgument):
        local.train_step_local(batch[rows[:1]], ROWS)


LOGIT_LAYOUTS = {
    1: [dict(dp=1, num_micro=2)],
    2: [dict(dp=2, num_micro=2), dict(tp=2, dp=1), dict(pp=2, dp=1, num_micro=2)],
    4: [dict(dp=4, num_micro=2), dict(tp=2, pp=2, dp=1, num_micro=2), dict(tp=2, dp=2, num_micro=2)],
}


def test_logits_in_every_layout_equal_one_process(world):
    # Trainer.logits gathers the logits of the whole batch over tp, the data
    # ranks (rows back in batch order) and the pipeline: position for
    # position the one-process model's (f64, same initial weights).
    cfg = gpt_config()
    batch = gpt_batch(cfg, 7)
    ref_model = models.GPT(cfg)
    ref_model.eval()
    with torch.no_grad():
        want = ref_model(batch[:, :-1].contiguous()).transpose(0, 1)[..., :cfg.vocab_size]
    for kw in LOGIT_LAYOUTS[world.size]:
        trainer = train.GPTTrainer(world, cfg, train.ParallelLayout(**kw), train.OptimizerConfig(lr=LR))
        got = trainer.logits(batch)
        assert got.dtype == torch.float64 and got.shape == (ROWS, cfg.max_seq_len, cfg.vocab_size), kw
        err = ((got - want).abs().max() / want.abs().max()).item()
        assert err <= 1e-10, (kw, err)
        loss = torch.nn.functional.cross_entropy(got.reshape(-1, cfg.vocab_size), batch[:, 1:].reshape(-1)).item()
        assert loss == pytest.approx(trainer.evaluate(batch), rel=1e-10), kw


# ---- the option table from Python ---------------------------------------------------------


def test_run_config_keywords_flags_and_config_files(tmp_path):
    # Keywords, flags and config files all go through the C++ option table.
    defaults = train.RunConfig()
    # micro_batches 0: the layout's default (1 without a pipeline, max(4, pp) with one; issue 36 item 9).
    assert (defaults.tp, defaults.pp, defaults.dp, defaults.schedule, defaults.micro_batches) == (1, 1, 0, "1f1b", 0)
    assert defaults.layout.resolved(2).num_micro == 1 and train.RunConfig(pp=2).layout.resolved(2).num_micro == 4
    assert defaults.tie_embeddings and not defaults.sp and defaults.precision == "f32"
    kw = train.RunConfig(tp=2, min_lr=2e-5, sp=True, precision="bf16", stage_layers="3,1")
    assert (kw.tp, kw.min_lr, kw.sp, kw.precision, kw.stage_layers) == (2, 2e-5, True, "bf16", "3,1")
    cfg = tmp_path / "run.toml"
    cfg.write_text("# a config file\nlayers = 3\nhidden = 48   # trailing comment\nmin_lr = 1e-5\n"
                   "schedule = 'zb-h1'\nsp = true\ntie-embeddings = false\nsteps = 999\n")
    args = train.RunConfig.from_args(["--steps", "7", "--config", str(cfg), "--pp", "2", "--min_lr=2e-5"])
    assert (args.layers, args.hidden, args.schedule, args.sp, args.tie_embeddings) == (3, 48, "zb-h1", True, False)
    assert (args.steps, args.pp, args.min_lr) == (7, 2, 2e-5)  # the command line wins
    assert train.RunConfig.from_args(["--help"]) is None
    bad = tmp_path / "bad.toml"
    bad.write_text("layers = 3\nlayrs = 4\n")
    with pytest.raises(torus.InvalidArgument, match="layrs"):
        train.RunConfig.from_args(["--config", str(bad)])
    with pytest.raises(torus.InvalidArgument, match="schedul"):
        train.RunConfig.from_args(["--schedul", "1f1b"])
    with pytest.raises(torus.InvalidArgument, match="tpp"):
        train.RunConfig(tpp=2)
    with pytest.raises(torus.InvalidArgument, match="--precision"):
        train.RunConfig(precision="f8").validate()
    with pytest.raises(AttributeError):
        defaults.no_such_option
    assert json.loads(kw.to_json())["tp"] == 2
    assert [n for n, _ in kw.values()] == train.run_option_names()
    # ZeRO, offload and the memory pre-check's --force through the same table.
    z = train.RunConfig(zero=3, offload="optimizer+params", zero_prefetch=2, force=True)
    assert (z.zero, z.offload, z.zero_prefetch, z.force) == (3, "optimizer+params", 2, True)
    z.validate()
    with pytest.raises(torus.InvalidArgument, match="needs --zero 3"):
        train.RunConfig(zero=2, offload="optimizer+params").validate()
    with pytest.raises(torus.InvalidArgument, match="--zero must be 0, 1, 2 or 3"):
        train.RunConfig(zero=4).validate()
    opts = train.ParallelLayout(zero=2, offload="optimizer")
    assert (opts.zero, opts.offload, train.TrainerOptions(zero_prefetch=0).zero_prefetch) == (2, "optimizer", 0)
    opts.offload = "optimizer+params"
    assert opts.offload == "optimizer+params"
    with pytest.raises(torus.InvalidArgument, match="none, optimizer, optimizer\\+params"):
        train.ParallelLayout(offload="gpu")
