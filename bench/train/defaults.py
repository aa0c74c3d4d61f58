#!/usr/bin/env python3
"""defaults.py — what a user gets from torus-train without tuning flags,
against the same run with the fast choices spelled out and with the
defaults of before, in one run:

    defaults         torus-train with no backend variable and no --micro-batches
    explicit fast    TORUS_BACKEND=ofi --micro-batches 1 (the fast choices, given by hand)
    old defaults     TORUS_BACKEND=mpi --micro-batches 4 (what torus-train chose before)

The model is a Llama of about 3.2M parameters (llama-tiny widened: 4
blocks, width 256, 8 heads, 4 kv heads, sequence 128) trained with data
parallelism on 2 ranks, global batch 8, f32, AdamW. Each case runs --reps
times, interleaved; a run's figure is its median tokens/s over the steps
after the first --skip; the table gives each case's median and best over
the repetitions and the ratios of the medians. Verification: every loss is
finite, "defaults" and "explicit fast" give the same losses (the same
layout and backend: to 1e-6 relative), and "old defaults" the same losses
to 1e-4 (the accumulation of 4 micro-batches sums in another order).

    python3 bench/record.py defaults -- python3 bench/train/defaults.py --build-dir build
"""
import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

MODEL = ["--model", "llama-tiny", "--layers", "4", "--hidden", "256", "--heads", "8", "--kv-heads", "4",
         "--seq", "128", "--batch", "8", "--precision", "f32"]
CASES = [
    ("defaults", {}, []),
    ("explicit fast", {"TORUS_BACKEND": "ofi"}, ["--micro-batches", "1"]),
    ("old defaults", {"TORUS_BACKEND": "mpi"}, ["--micro-batches", "4"]),
]


def mpirun(n, env):
    cmd = [shutil.which("mpirun") or "mpirun", "-np", str(n)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    cmd += ["--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include",
            "lo", "--mca", "oob_tcp_if_include", "lo", "-x", "TORUS_LOG_LEVEL=warn"]
    for k in env:
        cmd += ["-x", k]
    return cmd


def run_case(train, env, extra, steps, out, timeout):
    e = dict(os.environ)
    e.pop("TORUS_BACKEND", None)
    e.update(env)
    cmd = mpirun(2, env) + [train] + MODEL + extra + [
        "--steps", str(steps), "--warmup", "2", "--eval-interval", "0", "--eval-batches", "1", "--progress", "off",
        "--no-tensorboard", "--out", out]
    r = subprocess.run(cmd, env=e, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        sys.exit(f"failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
    recs = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl")) if line.strip()]
    steps_ = [x for x in recs if x.get("event") == "step"]
    cfg = [x for x in recs if x.get("event") == "config"][0]
    return steps_, cfg


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--skip", type=int, default=5, help="steps left out of a run's figure (warm-up)")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--json", help="write the records here")
    a = ap.parse_args()
    train = os.path.join(a.build_dir, "bin", "torus-train")
    if not os.access(train, os.X_OK):
        sys.exit(f"{train}: not built")
    figures = {name: [] for name, _, _ in CASES}
    losses, chosen = {}, {}
    with tempfile.TemporaryDirectory(prefix="torus-defaults-") as tmp:
        for rep in range(a.reps):
            for name, env, extra in CASES:
                steps, cfg = run_case(train, env, extra, a.steps, os.path.join(tmp, f"{rep}-{name}"), a.timeout)
                tps = [s["tokens_per_s"] for s in steps[a.skip:] if s.get("tokens_per_s")]
                figures[name].append(statistics.median(tps))
                losses.setdefault(name, [s["loss"] for s in steps])
                chosen[name] = {"micro_batches": cfg["options"].get("micro-batches"),
                                "backend": cfg.get("backend")}
    ok = all(math.isfinite(x) for v in losses.values() for x in v)

    def rel(a_, b_):
        return max(abs(x - y) / max(abs(y), 1e-12) for x, y in zip(a_, b_))

    same_fast = rel(losses["defaults"], losses["explicit fast"])
    same_old = rel(losses["defaults"], losses["old defaults"])
    ok = ok and same_fast <= 1e-6 and same_old <= 1e-4
    print("Llama ~3.2M parameters (4 x 256, 8 heads, 4 kv heads, seq 128), dp=2 on 2 ranks, global batch 8, f32, "
          f"AdamW; {a.reps} interleaved runs of {a.steps} steps, the first {a.skip} left out")
    print(f"{'case':<15} {'median tok/s':>13} {'best tok/s':>11}  runs")
    for name, _, _ in CASES:
        v = figures[name]
        print(f"{name:<15} {statistics.median(v):>13.0f} {max(v):>11.0f}  " + " ".join(f"{x:.0f}" for x in v))
    med = {k: statistics.median(v) for k, v in figures.items()}
    print()
    print(f"defaults / explicit fast      {med['defaults'] / med['explicit fast']:.2f}x")
    print(f"defaults / old defaults       {med['defaults'] / med['old defaults']:.2f}x")
    print(f"losses: defaults vs explicit fast max rel diff {same_fast:.1e}; vs old defaults {same_old:.1e}; "
          f"verified: {ok}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"cases": figures, "medians": med, "chosen": chosen, "verified": ok,
                       "loss_rel_diff": {"explicit fast": same_fast, "old defaults": same_old}}, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
