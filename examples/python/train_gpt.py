#!/usr/bin/env python3
"""train_gpt.py — torus-train written in Python: trains a byte-level GPT
language model with tensor (--tp), pipeline (--pp) and data (--dp)
parallelism through torus.train.GPTTrainer. Launch one process per rank:

    mpirun -np 8 python3 examples/python/train_gpt.py --tp 2 --pp 2 --dp 2 --steps 200
    python3 examples/python/train_gpt.py --help

It takes the flags of torus-train (docs/train.md), and --config FILE of
`name = value` lines (flags on the command line override the file). Each step
prints one line from the logging rank (the last pipeline stage), e.g.

    step 40 | loss 2.31 | val 2.40 | grad_norm 0.82 | lr 3.0e-4 | 1520 tok/s | MFU 11% | mem 1.3 GiB

and appends a JSON object to <out>/metrics.jsonl; a progress bar is drawn on
stderr when it is a terminal; at the end <out>/loss.png plots the training and
validation loss. The module is importable (main(argv), parse_args(argv)) for
tests; run from a build tree with PYTHONPATH=<build>/python.
"""

import argparse
import json
import math
import os
import sys
import time

import torch

import torus
from torus import models, train

PROG = "train_gpt.py"

# (name, type, default, help, metavar) in the order of torus-train's --help.
OPTIONS = [
    ("layers", int, 4, "transformer blocks", "N"),
    ("hidden", int, 128, "model width", "N"),
    ("heads", int, 4, "attention heads (divisible by --tp)", "N"),
    ("ffn", int, 0, "MLP width (0: 4 x hidden)", "N"),
    ("seq", int, 128, "sequence length in bytes (divisible by --tp with --sp)", "N"),
    ("dropout", float, 0.0, "embedding, residual and attention dropout", "X"),
    ("tie-embeddings", bool, True, "share the input embedding with the output layer", None),
    ("dtype", str, "f32", "parameter and activation dtype: f32 or f64", "T"),
    ("tp", int, 1, "tensor-parallel size", "N"),
    ("pp", int, 1, "pipeline-parallel size", "N"),
    ("dp", int, 0, "data-parallel size (0: world / (tp x pp))", "N"),
    ("sp", bool, False, "sequence parallelism (with --tp > 1)", None),
    ("schedule", str, "1f1b", "pipeline schedule: gpipe, 1f1b, interleaved, zb-h1", "NAME"),
    ("micro-batches", int, 4, "micro-batches per step on each data-parallel rank", "N"),
    ("chunks", int, 1, "virtual stages per pipeline rank (interleaved schedule)", "N"),
    ("stage-layers", str, "", "blocks per stage, e.g. 3,1 (empty: balanced by cost)", "LIST"),
    ("steps", int, 600, "optimizer steps", "N"),
    ("batch", int, 16, "global batch in sequences (divisible by dp x micro-batches)", "N"),
    ("lr", float, 1e-3, "peak learning rate", "X"),
    ("min-lr", float, 1e-4, "learning rate at the end of the cosine decay", "X"),
    ("warmup", int, -1, "linear warm-up steps (-1: 30, at most steps / 10, as torus-train)", "N"),
    ("weight-decay", float, 0.1, "AdamW weight decay (matrices and embeddings)", "X"),
    ("grad-clip", float, 1.0, "clip the global gradient norm to this (0: off)", "X"),
    ("seed", int, 1234, "seed of the initialisation and the data order", "N"),
    ("data", str, "", "a text file or a directory of them (default: the licence texts every Debian system ships)",
     "PATH"),
    ("val-fraction", float, 0.1, "share of the corpus held out for validation (its end)", "X"),
    ("eval-interval", int, 100, "steps between validation passes (0: only at the end)", "N"),
    ("eval-batches", int, 2, "batches per validation pass", "N"),
    ("out", str, "runs/train_gpt", "output directory: metrics.jsonl, loss.png", "DIR"),
    ("log-interval", int, 1, "steps between log lines", "N"),
    ("progress", str, "auto", "progress bar on stderr: auto (if a terminal), on, off", "MODE"),
    ("peak-gflops", float, 0.0, "machine peak for MFU in GFLOP/s (0: measure a GEMM on every rank)", "X"),
    ("threads", int, 0, "intra-op threads per rank (0: cores / local ranks, at least 1)", "N"),
]

_TRUE = ("true", "1", "yes", "on")
_FALSE = ("false", "0", "no", "off")


class UsageError(Exception):
    """A mistake in the flags or the config file (exit status 2)."""


def _key(name):
    return name.replace("-", "_")


def _convert(kind, text, where):
    if kind is bool:
        low = text.strip().lower()
        if low in _TRUE:
            return True
        if low in _FALSE:
            return False
        raise UsageError(f"{where}: '{text}' is not a bool (true/false, 1/0, yes/no, on/off)")
    try:
        return kind(text)
    except ValueError:
        raise UsageError(f"{where}: '{text}' is not {'an integer' if kind is int else 'a number'}") from None


def read_config(path):
    """`name = value` lines of a config file (torus-train's format) -> {dest: value}."""
    kinds = {_key(n): k for n, k, *_ in OPTIONS}
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except OSError as e:
        raise UsageError(f"--config: cannot read '{path}': {e.strerror}") from None
    values = {}
    for number, raw in enumerate(lines, 1):
        where = f"{path}:{number}"
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "=" not in line:
            raise UsageError(f"{where}: expected `name = value`, got '{raw}'")
        name, value = (s.strip() for s in line.split("=", 1))
        if len(value) >= 2 and value[0] in "\"'" and value[-1] == value[0]:
            value = value[1:-1]
        elif " #" in value:
            value = value[:value.index(" #")].rstrip()
        key = _key(name)
        if key not in kinds:
            raise UsageError(f"{where}: unknown option '{name}'")
        values[key] = _convert(kinds[key], value, where)
    return values


def build_parser():
    p = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False,
        description="Trains a byte-level GPT language model with tensor (--tp), pipeline (--pp) and data (--dp) "
                    "parallelism. Launch one process per rank, e.g.: "
                    "mpirun -np 8 python3 examples/python/train_gpt.py --tp 2 --pp 2 --dp 2")
    for name, kind, default, help_text, metavar in OPTIONS:
        if kind is bool:
            p.add_argument(f"--{name}", dest=_key(name), action=argparse.BooleanOptionalAction, default=default,
                           help=help_text)
        else:
            p.add_argument(f"--{name}", dest=_key(name), type=kind, default=default, metavar=metavar,
                           help=f"{help_text} (default: {default!r})")
    p.add_argument("--config", action="append", default=[], metavar="FILE",
                   help="read `name = value` lines from FILE (flags on the command line override it)")
    return p


def _dashes(arg):
    """`--min_lr=x` -> `--min-lr=x`: a dash and an underscore are the same in option names."""
    if not arg.startswith("--"):
        return arg
    name, eq, value = arg.partition("=")
    return name.replace("_", "-") + eq + value


def parse_args(argv):
    """Config files first, in command-line order, then every flag (Note [Option precedence])."""
    argv = [_dashes(a) for a in argv]
    parser = build_parser()
    first, _ = parser.parse_known_args(argv)
    for path in first.config:
        try:
            parser.set_defaults(**read_config(path))
        except UsageError as e:
            parser.error(str(e))
    return parser.parse_args(argv)


def option_text(value):
    """A value as torus-train writes it in the config record."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, float) else str(value)


def check(ok, message):
    if not ok:
        raise UsageError(message)


def parse_list(text):
    out = []
    for item in text.split(","):
        if not item:
            continue
        try:
            out.append(int(item))
        except ValueError:
            raise UsageError(f"--stage-layers: '{item}' is not an integer (expected e.g. 3,1)") from None
    return out


def local_ranks():
    for var in ("OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE", "SLURM_NTASKS_PER_NODE"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def measure_gflops(dtype):
    """GEMM throughput of this rank while every rank measures at once."""
    n = 256
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    c = a @ b
    iters, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < 0.3:
        c = a @ c.mul_(1e-3)
        iters += 1
    return 2.0 * n ** 3 * iters / (time.perf_counter() - t0) / 1e9


def all_reduce_scalar(world, value, op):
    t = torch.tensor([float(value)], dtype=torch.float64)
    if world.size > 1:
        world.all_reduce(t, op=op).wait()
    return t.item()


def json_value(v):
    return None if isinstance(v, float) and not math.isfinite(v) else v


class Metrics:
    """JSON Lines, flushed after every record (a crashed run keeps what it wrote)."""

    def __init__(self, path):
        self.file = open(path, "w", encoding="utf-8")

    def write(self, **fields):
        self.file.write(json.dumps({k: json_value(v) for k, v in fields.items()}) + "\n")
        self.file.flush()

    def close(self):
        self.file.close()


class ProgressBar:
    """torus-train's bar (train.render_progress), redrawn in place with '\\r'."""

    def __init__(self, total, out=sys.stderr):
        self.total, self.out, self.start, self.width = total, out, time.perf_counter(), 0

    def update(self, done, tokens_per_s):
        elapsed = time.perf_counter() - self.start
        eta = elapsed / done * (self.total - done) if done > 0 else -1.0
        text = train.render_progress(done, self.total, tokens_per_s, eta)
        self.out.write("\r" + text + " " * max(0, self.width - len(text)))
        self.out.flush()
        self.width = len(text)

    def clear(self):
        if self.width:
            self.out.write("\r" + " " * self.width + "\r")
            self.out.flush()
            self.width = 0

    def finish(self):
        if self.width:
            self.out.write("\n")
            self.out.flush()
            self.width = 0


def write_plot(path, title, xs, losses, val_xs, val_losses):
    """loss.png with matplotlib (Agg); without matplotlib, Torus's own PNG writer."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        series = [("train", (31, 119, 180), xs, losses)]
        if val_xs:
            series.append(("validation", (214, 39, 40), val_xs, val_losses))
        train.write_line_plot_png(path, series, title, "step", "loss (nats per byte)")
        return
    fig, ax = plt.subplots(figsize=(9, 5.6), dpi=100)
    ax.plot(xs, losses, color="#1f77b4", label="train")
    if val_xs:
        ax.plot(val_xs, val_losses, color="#d62728", marker="o", label="validation")
    ax.set_title(title)
    ax.set_xlabel("step")
    ax.set_ylabel("loss (nats per byte)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)


def run(args):
    # Validate what needs no communication before starting any.
    check(args.dtype in ("f32", "f64"), f"--dtype must be f32 or f64, got '{args.dtype}'")
    check(args.progress in ("auto", "on", "off"), f"--progress must be auto, on or off, got '{args.progress}'")
    check(args.steps >= 1 and args.batch >= 1 and args.log_interval >= 1 and args.eval_batches >= 1
          and args.eval_interval >= 0,
          "--steps, --batch, --log-interval and --eval-batches must be >= 1 and --eval-interval >= 0")
    check(0 < args.val_fraction < 1, f"--val-fraction must be in (0, 1), got {args.val_fraction}")
    check(args.dp >= 0, f"--dp must be >= 0, got {args.dp}")
    stage_layers = parse_list(args.stage_layers)
    schedule_kind = torus.pipeline.schedule_kind_from_name(args.schedule)
    warmup = args.warmup if args.warmup >= 0 else min(30, args.steps // 10)
    lr = train.LrSchedule(args.lr, args.min_lr, warmup, args.steps)
    corpus = train.Corpus.load(args.data or train.default_corpus_path())
    split = corpus.split(args.val_fraction)
    dtype = torch.float64 if args.dtype == "f64" else torch.float32

    # As torus-train: the buffers a step frees stay in the process for the next
    # one instead of being faulted in again (torus/core/host_allocator.h).
    torus.retain_freed_host_memory()
    world = torus.init()
    rank, world_size = world.rank, world.size
    torch.set_num_threads(args.threads if args.threads > 0 else max(1, (os.cpu_count() or 1) // local_ranks()))

    cfg = models.GPTConfig(vocab_size=256, max_seq_len=args.seq, num_layers=args.layers, hidden=args.hidden,
                           num_heads=args.heads, ffn_hidden=args.ffn, dropout=args.dropout,
                           attention_dropout=args.dropout, tie_embeddings=args.tie_embeddings, seed=args.seed,
                           dtype=dtype)
    check(args.tp >= 1 and args.pp >= 1 and world_size % (args.tp * args.pp) == 0,
          f"--tp x --pp = {args.tp} x {args.pp} does not divide the {world_size} ranks")
    layout = train.ParallelLayout(tp=args.tp, pp=args.pp, dp=args.dp or world_size // (args.tp * args.pp),
                                  sequence_parallel=args.sp, schedule=schedule_kind, num_micro=args.micro_batches,
                                  num_chunks=args.chunks, layers_per_stage=stage_layers)
    optim = train.OptimizerConfig(lr=args.lr, weight_decay=args.weight_decay, grad_clip=args.grad_clip)

    train_data = train.BatchSampler(split.train, args.seq, args.batch, args.seed, "training split")
    val_data = train.BatchSampler(split.val, args.seq, args.batch, args.seed ^ 0x5EED, "validation split")

    trainer = train.GPTTrainer(world, cfg, layout, optim)
    logger = trainer.is_logging_rank()

    peak_gflops = (args.peak_gflops if args.peak_gflops > 0
                   else all_reduce_scalar(world, measure_gflops(dtype), torus.ReduceOp.SUM))
    flops_per_token = trainer.flops_per_token(args.seq)

    metrics, bar = None, None
    if logger:
        os.makedirs(args.out, exist_ok=True)
        metrics = Metrics(os.path.join(args.out, "metrics.jsonl"))
        print(f"{PROG}: {world_size} ranks, {layout.describe()}; model {args.layers} layers, width {args.hidden}, "
              f"{args.heads} heads, seq {args.seq}, {trainer.num_parameters() / 1e6:.2f}M parameters, {args.dtype}")
        for s, text in enumerate(trainer.describe_stages()):
            print(f"  stage {s}: {text}")
        print(f"data: {corpus.source} ({len(corpus)} bytes: {len(split.train)} train, {len(split.val)} validation); "
              f"batch {args.batch} x {args.seq} bytes; peak {peak_gflops:.1f} GFLOP/s", flush=True)
        config = {"event": "config", "world_size": world_size, "layout": layout.describe(),
                  "parameters": trainer.num_parameters(), "peak_gflops": peak_gflops, "corpus": corpus.source,
                  "corpus_bytes": len(corpus)}
        for name, *_ in OPTIONS:
            config["opt." + name] = option_text(getattr(args, _key(name)))
        metrics.write(**config)
        if args.progress == "on" or (args.progress == "auto" and sys.stderr.isatty()):
            bar = ProgressBar(args.steps)

    def evaluate():
        return sum(trainer.evaluate(val_data.batch(i)) for i in range(args.eval_batches)) / args.eval_batches

    xs, losses, val_xs, val_losses = [], [], [], []
    tokens = seconds = 0.0
    t_start = time.perf_counter()
    for step in range(args.steps):
        step_lr = lr.at(step)
        st = trainer.train_step(train_data.batch(step), step_lr)
        last = step + 1 == args.steps
        val = math.nan
        if last or (args.eval_interval > 0 and (step + 1) % args.eval_interval == 0):
            val = evaluate()
        mem = all_reduce_scalar(world, train.peak_rss_bytes(), torus.ReduceOp.MAX)
        tokens += st.tokens
        seconds += st.seconds
        if not logger:
            continue
        tok_s = st.tokens / st.seconds
        mfu = tok_s * flops_per_token / (peak_gflops * 1e9)
        xs.append(st.step)
        losses.append(st.loss)
        if not math.isnan(val):
            val_xs.append(st.step)
            val_losses.append(val)
        metrics.write(event="step", step=st.step, loss=st.loss, val_loss=val, grad_norm=st.grad_norm,
                      clip=st.clip_coefficient, lr=step_lr, tokens_per_s=tok_s, mfu=mfu, mem_bytes=mem,
                      step_s=st.seconds, pipeline_s=st.pipeline_seconds, sync_s=st.sync_seconds, skipped=st.skipped,
                      peak_live_micro=st.peak_live)
        if st.step % args.log_interval == 0 or last or not math.isnan(val):
            if bar:
                bar.clear()
            print(train.format_step_line(st.step, loss=st.loss, val_loss=val, grad_norm=st.grad_norm, lr=step_lr,
                                         tokens_per_s=tok_s, mfu=mfu, mem_bytes=mem), flush=True)
        if bar:
            bar.update(st.step, tok_s)
    wall = time.perf_counter() - t_start
    if logger:
        if bar:
            bar.finish()
        first, final = losses[0], losses[-1]
        val = val_losses[-1] if val_losses else math.nan
        metrics.write(event="end", steps=args.steps, wall_s=wall, tokens_per_s=tokens / seconds, first_loss=first,
                      final_loss=final, final_val_loss=val)
        metrics.close()
        plot = os.path.join(args.out, "loss.png")
        write_plot(plot, f"{PROG}: {layout.describe()}", xs, losses, val_xs, val_losses)
        print(f"done: {args.steps} steps in {wall:.1f} s, {tokens / seconds:.0f} tok/s; loss {first:.3f} -> "
              f"{final:.3f}, validation {val:.3f}; wrote {args.out}/metrics.jsonl and {plot}", flush=True)
    return 0


def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    try:
        return run(args)
    except (UsageError, torus.InvalidArgument) as e:
        print(f"{PROG}: error: {e}\n(see {PROG} --help)", file=sys.stderr)
        return 2
    except torus.Error as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
