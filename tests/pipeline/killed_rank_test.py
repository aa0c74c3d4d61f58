#!/usr/bin/env python3
"""A rank killed in the middle of a 3D training run ends every rank with a
clear error, not a hang.

Starts torus-train on 4 ranks (tp=1, pp=2, dp=2, the ofi backend) as plain
processes with torchrun-style variables — no mpirun, which would tear the
job down itself and hide what Torus does. Rank 1 kills itself (SIGKILL) at
the start of step 3. Every other rank must exit on its own, with a non-zero
status and an error that names a CommError/TimeoutError condition, within
a bound well below the test's time limit.

usage: killed_rank_test.py TORUS_TRAIN [--ranks 4] [--bound-s 90]
"""
import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("exe", help="path of the torus-train executable")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--victim", type=int, default=1)
    ap.add_argument("--bound-s", type=float, default=90.0, help="every survivor must exit within this")
    args = ap.parse_args()

    port = free_port()
    out = tempfile.mkdtemp(prefix="torus-killed-")
    procs = []
    t0 = time.monotonic()
    for r in range(args.ranks):
        env = dict(os.environ)
        for k in list(env):
            if k.startswith(("OMPI_", "PMIX_", "SLURM_")):
                del env[k]
        env.update(RANK=str(r), WORLD_SIZE=str(args.ranks), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(args.ranks),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORUS_BACKEND="ofi", FI_PROVIDER="shm",
                   TORUS_TIMEOUT_MS="30000", TORUS_LOG_LEVEL="warn")
        cmd = [args.exe, "--pp", "2", "--tp", "1", "--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "32",
               "--batch", "8", "--micro-batches", "2", "--steps", "50", "--eval-interval", "0", "--threads", "1",
               "--peak-tflops", "1", "--progress", "off", "--out", out, "--fail-rank", str(args.victim),
               "--fail-step", "3"]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))

    deadline = t0 + args.bound_s
    outputs, codes, took = {}, {}, {}
    for r, p in enumerate(procs):
        try:
            outputs[r], _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            codes[r] = p.returncode
            took[r] = time.monotonic() - t0
        except subprocess.TimeoutExpired:
            p.kill()
            outputs[r], _ = p.communicate()
            codes[r] = None
    failures = []
    for r in range(args.ranks):
        text = outputs[r] or ""
        if r == args.victim:
            if codes[r] != -9:
                failures.append(f"rank {r} (the victim) exited with {codes[r]}, expected SIGKILL")
            continue
        if codes[r] is None:
            failures.append(f"rank {r} HUNG: still running after {args.bound_s:.0f} s\n{text}")
        elif codes[r] == 0:
            failures.append(f"rank {r} exited 0 although a peer died\n{text}")
        elif "torus-train: error:" not in text:
            failures.append(f"rank {r} exited {codes[r]} without a clear error message\n{text}")
        else:
            line = next(l for l in text.splitlines() if "torus-train: error:" in l)
            print(f"rank {r}: exit {codes[r]} after {took[r]:.1f} s: {line.strip()[:300]}")
            # The message must say which peer, group or operation failed.
            if not any(w in line for w in ("rank", "seq", "group")):
                failures.append(f"rank {r}: the error names no rank, group or sequence number: {line}")
    if failures:
        print("FAILED:\n" + "\n\n".join(failures))
        return 1
    print(f"ok: the victim died at step 3 and all {args.ranks - 1} other ranks failed cleanly "
          f"within {max(took.values()):.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
