#!/usr/bin/env python3
"""SIGKILL of every rank at 20 random moments during repeated saves.

    sigkill_test.py BUILD_DIR

A 2-rank torus-train run saving a checkpoint after every step (--keep-last 2,
--resume auto) is started 20 times in one save directory and killed each
time with SIGKILL -- mpirun and both ranks at once -- after a random delay,
so that the kills land in start-up, in the middle of a save, in the rename
or in the keep-last deletion. After every kill:

  * once a checkpoint has ever been complete, at least one still is;
  * the newest complete step never goes backwards (the next run resumes
    from it, so it grows);
  * every complete checkpoint verifies (torus-ckpt verify: every SHA-256,
    header and tensor);
  * the "resume" record the run wrote (if it got that far) names the newest
    complete step before it.

At the end the same command runs to completion (--steps = newest + 3) and
must exit 0 with a "resume" record at the newest step in metrics.jsonl.

Plain Python, no pytest, no torch import (torus-ckpt is the checker); the
exit status is the result. A fixed seed (random.Random(1234)) picks the
delays; every subprocess has a timeout.
"""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

KILLS = 20
DELAY_S = (1.5, 6.0)  # start-up takes ~1-2 s; ~200 steps/s (one save each) after that
RUN_TIMEOUT_S = 120  # the final run to completion
CKPT_TIMEOUT_S = 60  # one torus-ckpt call

MPI_FLAGS = [
    "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
    "--mca", "btl", "self,vader,tcp", "--mca", "btl_tcp_if_include", "lo",
    "--mca", "oob_tcp_if_include", "lo", "-x", "TORUS_LOG_LEVEL=warn",
]


# step directory -> why torus-ckpt list calls it unusable (for the summary).
PROBLEMS = {}


class Failure(Exception):
    pass


def check(cond, msg):
    if not cond:
        raise Failure(msg)


def train_cmd(build, tmp, steps):
    mpirun = os.environ.get("TORUS_MPIEXEC") or shutil.which("mpirun") or "mpirun"
    return [mpirun, *MPI_FLAGS, "-np", "2", os.path.join(build, "bin", "torus-train"),
            "--layers", "2", "--hidden", "32", "--heads", "2", "--seq", "16", "--batch", "8",
            "--micro-batches", "2", "--steps", str(steps), "--save-every", "1", "--keep-last", "2",
            "--eval-interval", "0", "--tensorboard=false", "--progress", "off", "--peak-tflops", "1",
            "--threads", "1", "--out", os.path.join(tmp, "out"), "--save-dir", os.path.join(tmp, "ckpt"),
            "--resume", "auto"]


def session_pids(sid):
    """Live (non-zombie) processes of session `sid` (mpirun's: it and the ranks it forked)."""
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        # pid (comm) state ppid pgrp session ...; comm may hold spaces and parentheses.
        fields = stat[stat.rindex(")") + 2:].split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            out.append(int(name))
    return out


def kill_all(proc):
    """SIGKILL mpirun's process group and every process of its session.

    Open MPI puts each rank in a process group of its own (setpgid), so
    killpg alone would leave the ranks running: they are found by session id
    (start_new_session made mpirun a session leader and the ranks inherit
    its session)."""
    sid = proc.pid
    victims = session_pids(sid)
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        os.killpg(sid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)
    deadline = time.monotonic() + 15
    while True:  # a rank forked while we were looking
        left = session_pids(sid)
        if not left:
            return
        check(time.monotonic() < deadline, f"processes {left} of the killed job survive SIGKILL")
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.05)


def ckpt_tool(build, *args):
    r = subprocess.run([os.path.join(build, "bin", "torus-ckpt"), *args], stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=CKPT_TIMEOUT_S)
    return r.returncode, r.stdout


def list_checkpoints(build, save_dir):
    """[(step, state, path)] from `torus-ckpt list`, cross-checked with the directory."""
    if not os.path.isdir(save_dir):
        return []
    rc, out = ckpt_tool(build, "list", save_dir)
    check(rc == 0, f"torus-ckpt list {save_dir} exited {rc}:\n{out}")
    entries = []
    for line in out.splitlines():
        tok = line.split()
        # "  step  state  size  layout...  path"; an unusable entry is followed by its problem line.
        if len(tok) >= 3 and tok[0].isdigit() and tok[1] in ("complete", "unusable"):
            entries.append((int(tok[0]), tok[1], tok[-1]))
        elif entries and entries[-1][1] == "unusable" and line.strip():
            PROBLEMS[os.path.basename(entries[-1][2])] = line.strip()
    on_disk = sorted(n for n in os.listdir(save_dir) if n.startswith("step-"))
    listed = sorted(os.path.basename(p) for _, _, p in entries)
    check(on_disk == listed, f"torus-ckpt list shows {listed}, the directory holds {on_disk}:\n{out}")
    return entries


def resume_records(metrics_path):
    """The steps of the "resume" records in metrics.jsonl (a line cut by a kill is skipped)."""
    steps = []
    try:
        with open(metrics_path, errors="replace") as f:
            for line in f:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if isinstance(rec, dict) and rec.get("event") == "resume":
                    steps.append(rec.get("step"))
    except FileNotFoundError:
        pass
    return steps


def tail(path, n=30):
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return "(no log)"


def main():
    if len(sys.argv) != 2:
        print(__doc__)
        return 2
    build = os.path.abspath(sys.argv[1])
    for tool in ("torus-train", "torus-ckpt"):
        if not os.access(os.path.join(build, "bin", tool), os.X_OK):
            print(f"FAIL: {build}/bin/{tool} is missing")
            return 1
    rng = random.Random(1234)
    t_start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="torus-sigkill-") as tmp:
        save_dir = os.path.join(tmp, "ckpt")
        metrics = os.path.join(tmp, "out", "metrics.jsonl")
        newest = None  # newest complete step so far
        rows = []
        try:
            for k in range(KILLS):
                delay = rng.uniform(*DELAY_S)
                before = newest
                n_resumes = len(resume_records(metrics))
                log = os.path.join(tmp, f"run-{k:02d}.log")
                with open(log, "w") as logf:
                    proc = subprocess.Popen(train_cmd(build, tmp, 100000), stdout=logf, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True)
                    try:
                        proc.wait(timeout=delay)
                        exited = proc.returncode
                    except subprocess.TimeoutExpired:
                        exited = None
                    kill_all(proc)
                check(exited is None, f"kill {k}: the run exited by itself ({exited}) before the kill:\n{tail(log)}")

                entries = list_checkpoints(build, save_dir)
                complete = [(s, p) for s, st, p in entries if st == "complete"]
                tmp_dirs = sum(1 for _, _, p in entries if ".tmp-" in os.path.basename(p))
                other_bad = sum(1 for _, st, p in entries if st != "complete" and ".tmp-" not in os.path.basename(p))
                if before is not None:
                    check(complete, f"kill {k} (after {delay:.2f} s): no complete checkpoint left; "
                                    f"step {before} was complete before it. Entries: {entries}\n{tail(log)}")
                if complete:
                    step = max(s for s, _ in complete)
                    check(before is None or step >= before,
                          f"kill {k}: the newest complete step went back from {before} to {step}")
                    paths = [p for _, p in complete]
                    rc, out = ckpt_tool(build, "verify", *paths)
                    check(rc == 0, f"kill {k}: torus-ckpt verify {' '.join(paths)} exited {rc}:\n{out}")
                    newest = step
                # The run resumed from the newest complete checkpoint before it (if it got that far).
                new_resumes = resume_records(metrics)[n_resumes:]
                if before is not None:
                    check(all(s == before for s in new_resumes),
                          f"kill {k}: the run resumed at step(s) {new_resumes}, the newest complete was {before}")
                else:
                    check(not new_resumes, f"kill {k}: resumed at {new_resumes} with no checkpoint")
                rows.append((k, delay, newest, len(complete), tmp_dirs, other_bad, bool(new_resumes)))

            print(f"{'kill':>4}  {'delay s':>7}  {'newest':>7}  {'complete':>8}  {'tmp dirs':>8}  "
                  f"{'other unusable':>14}  resumed")
            for k, delay, step, nc, nt, nb, res in rows:
                print(f"{k:>4}  {delay:>7.2f}  {'-' if step is None else step:>7}  {nc:>8}  {nt:>8}  {nb:>14}  "
                      f"{'yes' if res else 'no'}")
            leftovers = sorted(p for _, st, p in entries if st != "complete" and ".tmp-" not in os.path.basename(p))
            for p in leftovers:  # not a failure: what a kill inside a rename or a deletion leaves
                print(f"note: left behind: {os.path.basename(p)}: {PROBLEMS.get(os.path.basename(p), '?')}")
            check(newest is not None and newest > 0, "no checkpoint was ever completed in 20 runs")
            grew = sum(1 for i in range(1, len(rows)) if (rows[i][2] or 0) > (rows[i - 1][2] or 0))
            check(grew >= KILLS // 2, f"the newest step grew after only {grew} of {KILLS - 1} kills")

            # To completion from the newest checkpoint.
            final_steps = newest + 3
            log = os.path.join(tmp, "final.log")
            with open(log, "w") as logf:
                proc = subprocess.Popen(train_cmd(build, tmp, final_steps), stdout=logf, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, start_new_session=True)
                try:
                    rc = proc.wait(timeout=RUN_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    kill_all(proc)
                    raise Failure(f"the final run did not finish in {RUN_TIMEOUT_S} s:\n{tail(log)}")
            check(rc == 0, f"the final run (--steps {final_steps}) exited {rc}:\n{tail(log)}")
            resumes = resume_records(metrics)
            check(resumes and resumes[-1] == newest,
                  f"the final run's last resume record is at {resumes[-1:] or 'none'}, the newest checkpoint "
                  f"is step {newest}:\n{tail(log)}")
            entries = list_checkpoints(build, save_dir)
            final_complete = [(s, p) for s, st, p in entries if st == "complete"]
            check(final_complete and max(s for s, _ in final_complete) == final_steps,
                  f"after the final run the newest complete checkpoint is not step {final_steps}: {entries}")
            rc, out = ckpt_tool(build, "verify", *[p for _, p in final_complete])
            check(rc == 0, f"torus-ckpt verify after the final run exited {rc}:\n{out}")
        except Failure as e:
            print(f"FAIL: {e}")
            return 1
        except subprocess.TimeoutExpired as e:
            print(f"FAIL: timed out: {e}")
            return 1
    print(f"PASS: {KILLS} SIGKILLs, newest complete step {newest} always verified; resumed from it and ran to "
          f"step {final_steps} in {time.monotonic() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
