"""Plots of a training run from its metrics file.

    python3 -m torus.plot RUN_DIR [--out FILE]

reads ``RUN_DIR/metrics.jsonl`` (written by ``torus-train`` and
``torus.train.TrainLoop``) and draws ``RUN_DIR/loss.png``: the training and
validation loss per step, and below it the learning rate and the gradient
norm. Drawn by matplotlib (Agg); the file is written to a temporary name and
renamed, so a reader never sees half a PNG.
"""

import argparse
import json
import math
import os
import sys


def read_metrics(run_dir):
    """The records of RUN_DIR/metrics.jsonl: (config, steps, end)."""
    path = os.path.join(run_dir, "metrics.jsonl")
    config, steps, end = None, [], None
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            event = rec.get("event")
            if event == "config":
                config = rec
            elif event == "step":
                steps.append(rec)
            elif event == "end":
                end = rec
    # A resumed run appends to the same file (a "resume" record, then the
    # steps again from the checkpoint's): the last record of a step wins.
    by_step = {}
    for rec in steps:
        by_step[rec["step"]] = rec
    steps = [by_step[k] for k in sorted(by_step)]
    return config, steps, end


def _finite(v):
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


def plot_run(run_dir, out=None):
    """Draws the loss plot of a run; returns the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    config, steps, _ = read_metrics(run_dir)
    if not steps:
        raise ValueError(f"{run_dir}/metrics.jsonl has no step records")
    xs = [r["step"] for r in steps]
    loss = [r["loss"] if _finite(r.get("loss")) else math.nan for r in steps]
    val = [(r["step"], r["val_loss"]) for r in steps if _finite(r.get("val_loss"))]
    fig, (ax, ax2) = plt.subplots(2, 1, figsize=(9, 7), dpi=100, sharex=True,
                                  gridspec_kw={"height_ratios": [3, 1.3]})
    ax.plot(xs, loss, color="#1f77b4", label="train")
    if val:
        ax.plot([s for s, _ in val], [v for _, v in val], color="#d62728", marker="o", label="validation")
    title = "training run"
    if config:
        title = f"{config.get('model', 'model')}: {config.get('layout', '')}"
    ax.set_title(title)
    ax.set_ylabel("loss (nats per token)")
    ax.grid(True, alpha=0.3)
    ax.legend()
    ax2.plot(xs, [r.get("lr") for r in steps], color="#2ca02c", label="lr")
    ax2.set_ylabel("learning rate")
    ax2.set_xlabel("step")
    ax2.grid(True, alpha=0.3)
    norms = [r.get("grad_norm") if _finite(r.get("grad_norm")) else math.nan for r in steps]
    ax3 = ax2.twinx()
    ax3.plot(xs, norms, color="#9467bd", alpha=0.7, label="grad norm")
    ax3.set_ylabel("gradient norm")
    fig.tight_layout()
    path = out or os.path.join(run_dir, "loss.png")
    tmp = path + ".tmp.png"
    fig.savefig(tmp)
    plt.close(fig)
    os.replace(tmp, path)
    return path


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m torus.plot",
                                description="Draws RUN_DIR/loss.png from RUN_DIR/metrics.jsonl.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a run's output directory (--out)")
    p.add_argument("--out", metavar="FILE", help="where to write the PNG (default: RUN_DIR/loss.png)")
    args = p.parse_args(argv)
    try:
        path = plot_run(args.run_dir, args.out)
    except (OSError, ValueError) as e:
        print(f"torus.plot: error: {e}", file=sys.stderr)
        return 1
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
