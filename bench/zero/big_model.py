#!/usr/bin/env python3
"""big_model.py — a model that cannot train without ZeRO trains with it.

On 4 local ranks, a GPT of about 1.2 billion parameters (43 blocks, width
1536, bf16 parameters with fp32 masters and Adam, gradients in bf16: 16 bytes
per parameter, 19 GB per rank when replicated):

  1. plain data parallelism (--zero 0) must be refused by torus-train's
     memory pre-check before anything is allocated (exit status 2, the
     estimate per rank printed beside the memory available per rank);
  2. ZeRO-3 (--zero 3 --offload optimizer: the CPU Adam reads the bf16
     gradient shards as they are, with no f32 copy) must train 3 steps with
     the loss falling, on the ofi backend (--backend; mpi stages every
     16-bit reduction in f32 over the whole buffer: 113 MB per block here,
     which this machine cannot spare). Reported: the job's peak resident
     memory (torus-train's end-of-run report: every rank's VmHWM summed,
     which counts the shared-memory pages of ofi's host allocator once per
     rank that touches them) and the machine's memory in use at the peak
     (MemAvailable before the run minus its lowest value during it,
     sampled every 0.2 s).

The learning rate is 3e-6 without warm-up: at 1e-5 and above, Adam's first
steps on 128 tokens overshoot this 43-block model and the loss of the next
(different) batch rises.

    python3 bench/record.py zero3_1b -- python3 bench/zero/big_model.py --build-dir build

Exit status 0 only when both hold.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time


def mem_available():
    """MemAvailable of /proc/meminfo, bytes."""
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")

MPIRUN = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader,tcp",
          "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--layers", type=int, default=43)
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--out", default="runs/zero3-big")
    ap.add_argument("--backend", default="ofi", help="TORUS_BACKEND of the ZeRO-3 run")
    ap.add_argument("--lr", default="3e-6")
    ap.add_argument("--json")
    args = ap.parse_args()
    exe = os.path.join(args.build_dir, "bin", "torus-train")
    model = ["--layers", str(args.layers), "--hidden", str(args.hidden), "--heads", "12", "--seq", "32",
             "--batch", str(args.ranks), "--micro-batches", "1", "--precision", "bf16", "--grad-dtype", "param", "--steps", str(args.steps),
             "--lr", args.lr, "--min-lr", args.lr, "--warmup", "0", "--eval-interval", "1000", "--progress", "off", "--threads", "1",
             "--no-tensorboard"]
    result = {"ranks": args.ranks, "layers": args.layers, "hidden": args.hidden}
    ok = True

    # 1. DDP: refused by the pre-check.
    cmd = MPIRUN + ["-np", str(args.ranks), exe, "--zero", "0", "--out", args.out + "-ddp"] + model
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    text = r.stdout + r.stderr
    pre = [l for l in text.splitlines() if "memory pre-check" in l]
    print(f"# zero 0: exit {r.returncode} after {time.time() - t0:.1f} s")
    for line in pre[:1]:
        print(line.strip())
    result["ddp_exit"] = r.returncode
    result["ddp_message"] = pre[0].strip() if pre else ""
    if r.returncode == 0 or not pre:
        print("FAIL: plain data parallelism was not refused by the memory pre-check")
        ok = False

    # 2. ZeRO-3: trains.
    cmd = MPIRUN + ["-np", str(args.ranks), "-x", f"TORUS_BACKEND={args.backend}", exe, "--zero", "3", "--offload",
                    "optimizer", "--out", args.out] + model
    print("# TORUS_BACKEND=" + args.backend + " " + " ".join(cmd[cmd.index(exe):]), flush=True)
    before = mem_available()
    lowest = [before]
    done = threading.Event()

    def sample():
        while not done.wait(0.2):
            lowest[0] = min(lowest[0], mem_available())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t0
    done.set()
    sampler.join()
    in_use = before - lowest[0]
    result.update({"mem_available_before": before, "mem_available_lowest": lowest[0], "machine_peak_in_use": in_use})
    text = r.stdout + r.stderr
    losses = [float(m.group(1)) for m in re.finditer(r"^step +\d+ \| loss ([0-9.]+)", text, re.M)]
    interesting = [l for l in text.splitlines()
                   if re.search(r"parameters|memory|step +\d|peak resident|loss", l)]
    for line in interesting[-16:]:
        print(line.rstrip())
    result.update({"zero3_exit": r.returncode, "zero3_wall_s": wall, "losses": losses,
                   "log_tail": interesting[-16:]})
    peak = re.search(r"peak resident memory: ([0-9.]+ [KMGT]?i?B) on this rank, ([0-9.]+ [KMGT]?i?B) over the job", text)
    if peak:
        result["rank_peak"], result["job_peak"] = peak.group(1), peak.group(2)
        print(f"# job peak resident memory: {peak.group(2)} (VmHWM summed over ranks; this rank {peak.group(1)})")
    print(f"# machine memory in use at the peak: {in_use / 2**30:.1f} GiB (MemAvailable {before / 2**30:.1f} GiB "
          f"before, {lowest[0] / 2**30:.1f} GiB at its lowest)")
    if r.returncode != 0:
        sys.stderr.write(text[-4000:])
        print(f"FAIL: ZeRO-3 exited {r.returncode}")
        ok = False
    elif len(losses) < 2 or not losses[-1] < losses[0]:
        print(f"FAIL: the loss did not fall: {losses}")
        ok = False
    print(f"# ZeRO-3: {args.steps} steps in {wall:.1f} s, losses {losses}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
