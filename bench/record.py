#!/usr/bin/env python3
"""Runs a benchmark and records its output under bench/results/ with the
command, the commit and the date.

    python3 bench/record.py NAME -- COMMAND [ARGS...]

The command gets ``--json FILE`` appended; its stdout (the table) is written
to bench/results/NAME.txt after three header lines (``# command:``,
``# commit:``, ``# date:``), and its JSON to bench/results/NAME.json as
``{"command", "commit", "date", "data"}``. The exit status is the
benchmark's (a benchmark that fails its own verification exits non-zero and
nothing is recorded).
"""

import datetime
import json
import os
import pathlib
import shlex
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]


def main(argv):
    if len(argv) < 3 or argv[1] != "--":
        print(__doc__, file=sys.stderr)
        return 2
    name, cmd = argv[0], argv[2:]
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    if dirty:
        commit += " (with uncommitted changes)"
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    with tempfile.TemporaryDirectory() as tmp:
        jpath = os.path.join(tmp, "out.json")
        r = subprocess.run(cmd + ["--json", jpath], capture_output=True, text=True)
        sys.stdout.write(r.stdout)
        sys.stderr.write(r.stderr)
        if r.returncode != 0:
            return r.returncode
        data = json.load(open(jpath)) if os.path.exists(jpath) else None
    shown = " ".join(shlex.quote(c) for c in cmd)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.txt").write_text(f"# command: {shown}\n# commit: {commit}\n# date: {date}\n" + r.stdout)
    (out / f"{name}.json").write_text(
        json.dumps({"command": shown, "commit": commit, "date": date, "data": data}, indent=1) + "\n")
    print(f"recorded bench/results/{name}.txt and .json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
