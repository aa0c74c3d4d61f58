#!/usr/bin/env python3
"""run.py — the training benchmark, side by side in one run: a small GPT
(4 layers, width 256, 8 heads, sequence 128, vocabulary 8192; AdamW) on

  data parallelism, 2 ranks x 1 thread, global batch 8:
    torus-cpp  dp   C++ trainer: torus::models::GPT + torus::dp (torus-bench-train)
    torus-dp        Python: torus.models.GPT + torus.parallel.DistributedDataParallel
    torch-ddp       Python: torus.models.GPT + torch DistributedDataParallel on gloo
    torch-ddp-view  the same, gradient_as_bucket_view=True
    torch-ddp fused-adamw   torch-ddp with torch.optim.AdamW(fused=True)
    torus-cpp dp torch-adamw  torus-cpp dp with torch::optim::AdamW instead of
                    Torus's fused AdamW (torus::optim::AdamW, the default)
    torus-cpp dp glibc-malloc  torus-cpp dp with glibc's default malloc settings
                    (torus-bench-train and torus-train otherwise call
                    torus::retain_freed_host_memory(), core/host_allocator.h)
    torus-cpp dp-nosync, py nosync   the same ranks and batches with no gradient
                    sync at all: the limit each data-parallel row can reach here
    torch-ddp torch.nn, torus-dp torch.nn, py nosync torch.nn   the same three
                    on the same GPT written in plain torch.nn (torch_gpt.py),
                    what a user of torch DDP runs; same weights and step-0 loss
  tensor parallelism against one process, global batch 8:
    torus-cpp  tp   2 ranks x 1 thread, TP=2
    torus-cpp  single  1 rank x 1 thread, and 1 rank x 2 threads (the same cores as TP=2)

Torus rows run on the host backend named by --backend (default ofi, Torus's
own shared-memory transport on one host; mpi is the other). The Python rows
share the model code, data and optimizer, so the data-parallel
machinery is the only difference between torus-dp and torch-ddp. Each case
runs --reps times, interleaved (A B C ... A B C ...); the table reports each
case's best tokens/s over the repetitions (the least disturbed run: machines
shared with other work vary up to 2x over minutes) beside the median and the
machine's load, and the ratios compare best with best. Every program
verifies its run (finite losses, replicas equal, step-0 loss equal to one
process's) and a failed verification fails the whole benchmark.

    python3 bench/train/run.py --build-dir build [--reps 3] [--steps 10] [--quick]
    python3 bench/train/run.py --summarize bench/results/train.json   # the table again

Outputs in --out-dir (default bench/results): train.json (every record, plus
the summary) and train.txt (the table).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent


def mpirun(args, n):
    cmd = [shutil.which("mpirun") or "mpirun", "-np", str(n)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + ["--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader,tcp", "--mca",
                  "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo", "-x", "TORUS_LOG_LEVEL=warn",
                  "-x", "PYTHONPATH", "-x", "OMP_NUM_THREADS=1", "-x", f"TORUS_BACKEND={args.backend}"]


def cases(args):
    exe = str(Path(args.build_dir) / "bench" / "torus-bench-train")
    common = ["--steps", str(args.steps), "--warmup", str(args.warmup), "--batch", str(args.batch),
              "--layers", str(args.layers), "--hidden", str(args.hidden), "--seq", str(args.seq),
              "--vocab", str(args.vocab)]
    peer = [sys.executable, str(HERE / "torch_peer.py")]
    out = [
        ("torus-cpp dp", mpirun(args, 2) + [exe, "--mode", "dp", "--threads", "1"] + common),
        ("torus-cpp dp glibc-malloc", mpirun(args, 2) + [exe, "--mode", "dp", "--threads", "1", "--host-alloc",
                                                          "default"] + common),
        ("torus-cpp dp-nosync", mpirun(args, 2) + [exe, "--mode", "dp-nosync", "--threads", "1"] + common),
        ("py nosync", mpirun(args, 2) + peer + ["--impl", "nosync"] + common),
        ("torch-ddp", mpirun(args, 2) + peer + ["--impl", "torch-ddp", "--port", str(args.port)] + common),
        ("torch-ddp fused-adamw", mpirun(args, 2) + peer + ["--impl", "torch-ddp", "--optimizer", "fused",
                                                            "--port", str(args.port + 2)] + common),
        ("torus-cpp dp torch-adamw", mpirun(args, 2) + [exe, "--mode", "dp", "--threads", "1", "--optimizer", "torch"]
         + common),
        ("torus-dp", mpirun(args, 2) + peer + ["--impl", "torus-dp"] + common),
        ("torch-ddp-view", mpirun(args, 2) + peer + ["--impl", "torch-ddp-view", "--port", str(args.port + 1)] + common),
        ("torch-ddp torch.nn", mpirun(args, 2) + peer + ["--impl", "torch-ddp", "--model", "torch",
                                                         "--port", str(args.port + 3)] + common),
        ("torus-dp torch.nn", mpirun(args, 2) + peer + ["--impl", "torus-dp", "--model", "torch"] + common),
        ("py nosync torch.nn", mpirun(args, 2) + peer + ["--impl", "nosync", "--model", "torch"] + common),
        ("torus-cpp tp", mpirun(args, 2) + [exe, "--mode", "tp", "--threads", "1"] + common),
        ("torus-cpp single x1", mpirun(args, 1) + [exe, "--mode", "single", "--threads", "1"] + common),
        ("torus-cpp single x2", mpirun(args, 1) + [exe, "--mode", "single", "--threads", "2"] + common),
    ]
    return [c for c in out if not args.only or c[0] in args.only.split(",")]


def run_case(name, cmd, timeout):
    print("$ " + " ".join(cmd), flush=True)
    load = os.getloadavg()[0]  # other work on the machine skews everything: record it
    try:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, f"{name}: timed out after {timeout} s"
    record = None
    for line in proc.stdout.splitlines():
        if line.startswith("{") and '"tokens_per_s"' in line:
            record = json.loads(line)
    if proc.returncode != 0 or record is None:
        print(proc.stdout[-4000:], flush=True)
        return None, f"{name}: exit status {proc.returncode}"
    record["case"] = name
    record["load1_before"] = load
    print(f"  {name}: {record['tokens_per_s']:.0f} tokens/s, step {record['step_ms_median']:.0f} ms, "
          f"verified {record['verified']}", flush=True)
    return record, None


def summarise(records, names):
    rows = {}
    for name in names:
        rs = [r for r in records if r["case"] == name]
        if rs:
            best = max(rs, key=lambda r: r["tokens_per_s"])
            rows[name] = {
                "tokens_per_s": best["tokens_per_s"],
                "step_ms": best["step_ms_median"],
                "median_tps": statistics.median(r["tokens_per_s"] for r in rs),
                "min_tps": min(r["tokens_per_s"] for r in rs), "max_tps": max(r["tokens_per_s"] for r in rs),
                "ranks": rs[0]["ranks"], "threads": rs[0]["threads"], "reps": len(rs),
                "verified": all(r["verified"] for r in rs),
                "load1": statistics.median(r.get("load1_before", float("nan")) for r in rs),
            }
    return rows


def ratio(rows, a, b):
    if a in rows and b in rows:
        return rows[a]["tokens_per_s"] / rows[b]["tokens_per_s"]
    return None


def ratios_of(rows):
    return {
        "Torus DP (C++) / its no-sync limit": ratio(rows, "torus-cpp dp", "torus-cpp dp-nosync"),
        "Torus DP (Python) / its no-sync limit": ratio(rows, "torus-dp", "py nosync"),
        "torch DDP gloo / its no-sync limit": ratio(rows, "torch-ddp", "py nosync"),
        "Torus DP (C++) / torch DDP gloo": ratio(rows, "torus-cpp dp", "torch-ddp"),
        "Torus DP (C++) / torch DDP gloo, both fused AdamW": ratio(rows, "torus-cpp dp", "torch-ddp fused-adamw"),
        "Torus DP (C++), torch::optim::AdamW / torch DDP gloo": ratio(rows, "torus-cpp dp torch-adamw", "torch-ddp"),
        "Torus DP (Python) / torch DDP gloo": ratio(rows, "torus-dp", "torch-ddp"),
        "Torus DP (Python) / torch DDP gloo (bucket view)": ratio(rows, "torus-dp", "torch-ddp-view"),
        "torch DDP gloo, torch.nn GPT / its no-sync limit": ratio(rows, "torch-ddp torch.nn", "py nosync torch.nn"),
        "Torus DP (C++) / torch DDP gloo, torch.nn GPT": ratio(rows, "torus-cpp dp", "torch-ddp torch.nn"),
        "Torus DP (C++), glibc malloc / torch DDP gloo, torch.nn GPT": ratio(rows, "torus-cpp dp glibc-malloc",
                                                                             "torch-ddp torch.nn"),
        "Torus DP (Python) / torch DDP gloo, both torch.nn GPT": ratio(rows, "torus-dp torch.nn",
                                                                      "torch-ddp torch.nn"),
        "TP=2 (2 ranks) / one process, 1 thread": ratio(rows, "torus-cpp tp", "torus-cpp single x1"),
        "TP=2 (2 ranks) / one process, 2 threads": ratio(rows, "torus-cpp tp", "torus-cpp single x2"),
    }


def table(rows, ratios, args):
    lines = [f"GPT {args.layers} layers, width {args.hidden}, seq {args.seq}, vocab {args.vocab}, "
             f"global batch {args.batch} ({args.batch * args.seq} tokens/step), AdamW, f32, "
             f"best of {args.reps} interleaved runs of {args.steps} steps, Torus host backend {args.backend}",
             f"{'case':<26} {'ranks x threads':>15} {'step ms':>8} {'tokens/s':>9} {'median':>7} "
             f"{'min tokens/s':>12} {'verified':>8} {'load':>5}"]
    for name, r in rows.items():
        lines.append(f"{name:<26} {str(r['ranks']) + ' x ' + str(r['threads']):>15} {r['step_ms']:>8.0f} "
                     f"{r['tokens_per_s']:>9.0f} {r['median_tps']:>7.0f} {r['min_tps']:>12.0f} "
                     f"{str(r['verified']):>8} {r['load1']:>5.1f}")
    lines.append("(step ms and tokens/s: the best run; load: the 1-minute load average before the runs, median; "
                 "the machine has 2 cores)")
    lines.append("")
    for label, value in ratios.items():
        lines.append(f"{label:<62} {'n/a' if value is None else f'{value:.2f}x'}")
    return "\n".join(lines)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--build-dir", default=str(REPO / "build"))
    p.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--port", type=int, default=29533)
    p.add_argument("--backend", default="ofi", choices=["ofi", "mpi"],
                   help="Torus host backend of the Torus rows (TORUS_BACKEND; default: ofi, Torus's own transport)")
    p.add_argument("--timeout", type=int, default=900)
    p.add_argument("--only", default="", help="comma-separated case names")
    p.add_argument("--quick", action="store_true", help="1 repetition of 4 steps")
    p.add_argument("--summarize", default="", help="print the table of a saved train.json and exit")
    args = p.parse_args()
    if args.summarize:
        saved = json.loads(Path(args.summarize).read_text())
        records = saved["records"]
        first = records[0]
        for k in ("batch", "layers", "hidden", "seq", "vocab", "steps"):
            setattr(args, k, first["global_batch" if k == "batch" else k])
        args.reps = max(r.get("rep", 0) for r in records) + 1
        names = list(dict.fromkeys(r["case"] for r in records))
        rows = summarise(records, names)
        print(table(rows, ratios_of(rows), args))
        return 0
    if args.quick:
        args.reps, args.steps, args.warmup = 1, 4, 1
    py = Path(args.build_dir) / "python"
    os.environ["PYTHONPATH"] = str(py) + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")

    todo = cases(args)
    records, errors = [], []
    for rep in range(args.reps):
        print(f"--- repetition {rep + 1}/{args.reps}", flush=True)
        for name, cmd in todo:
            record, err = run_case(name, cmd, args.timeout)
            if record:
                record["rep"] = rep
                records.append(record)
            else:
                errors.append(err)
    rows = summarise(records, [n for n, _ in todo])
    ratios = ratios_of(rows)
    text = table(rows, ratios, args)
    print("\n" + text)
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "train.txt").write_text(text + "\n")
    (out / "train.json").write_text(json.dumps({"records": records, "summary": rows, "ratios": ratios,
                                                "errors": errors}, indent=1) + "\n")
    for e in errors:
        print("ERROR: " + e, file=sys.stderr)
    bad = [r["case"] for r in records if not r["verified"]]
    for b in bad:
        print(f"ERROR: {b}: verification failed", file=sys.stderr)
    return 1 if errors or bad else 0


if __name__ == "__main__":
    sys.exit(main())
