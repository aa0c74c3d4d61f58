#!/usr/bin/env python3
"""run.py — ZeRO stages 0-3 on 2 and 4 ranks in one run: memory per rank
against the ZeRO paper's formulas and step time (torus-bench-zero under
mpirun, once per rank count), merged into one table and one JSON.

    python3 bench/record.py zero -- python3 bench/zero/run.py --build-dir build [--sizes 10M,50M] [--ranks 2,4]

Every torus-bench-zero run verifies its losses against stage 0 and, with
--check (passed through by default), that each measured memory is within 10%
of the formula plus the buffers Torus states; a failure fails the run.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default="build")
    ap.add_argument("--sizes", default="10M,50M")
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--steps", default="5")
    ap.add_argument("--micro", default="1")
    ap.add_argument("--no-check", action="store_true", help="report without failing on a memory mismatch")
    ap.add_argument("--json", help="write the merged results here")
    args, extra = ap.parse_known_args()
    exe = os.path.join(args.build_dir, "bench", "torus-bench-zero")
    merged = []
    for n in [int(x) for x in args.ranks.split(",") if x]:
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "zero.json")
            cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "btl",
                   "self,vader,tcp", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo",
                   "-x", "TORUS_LOG_LEVEL=warn", "-np", str(n), exe, "--sizes", args.sizes, "--steps", args.steps,
                   "--micro", args.micro, "--json", out] + ([] if args.no_check else ["--check"]) + extra
            shown = [("FILE" if c == out else c) for c in cmd[cmd.index(exe):]]
            print(f"# {n} ranks: {' '.join(shown)}", flush=True)
            r = subprocess.run(cmd, text=True, capture_output=True)
            sys.stdout.write(r.stdout)
            if r.returncode != 0:
                sys.stderr.write(r.stderr[-4000:])
                return r.returncode
            merged.append(json.load(open(out)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": merged}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
