#!/usr/bin/env python3
"""After a peer dies or hangs, every surviving rank exits within deadline + bound.

Runs killed_peer_check (one rank of the check, see its header) under
`mpirun --mca orte_enable_recovery 1`, which keeps the survivors running
when a rank dies (Open MPI's default kills them, hiding what Torus does).
The victim kills itself with SIGKILL (--fault kill) inside an all_reduce
whose deadline is --deadline-ms, or stops itself with SIGSTOP (--fault stop:
alive but never coming back; the driver kills it once the survivors are
done). Each survivor must then

  * fail that op (or a later one) with TimeoutError or CommError whose message
    names the group and the sequence number,
  * tear down its backend and Context, and exit with status 3 (the check's
    "peer failure detected" status),
  * exit, as a whole process, within deadline + --bound-s seconds of the
    victim's death.

The survivors' exit must not depend on the victim: with --fault stop,
MPI_Finalize would wait for the stopped rank for ever, and with --fault kill
Open MPI 4.1's MPI_Finalize now and then waits for the dead one for ever
(mpi_runtime.h, Note [Finalize after a failure]).

Each rank runs under `sh -c` so that its exit status and exit time are
recorded after the process has fully exited (static destructors and all).
The check is repeated --reps times with a varied kill delay and victim (the
finalize hang this guards against was intermittent). A repetition that does
not end by itself is killed and reported as HUNG.

usage: killed_peer_test.py --exe CHECK --backend mpi [--ranks 3] [--reps 5]
                           [--fault kill|stop] [--deadline-ms 3000] [--bound-s 30]
                           [--env VAR=VALUE ...] -- MPIRUN [MPIRUN FLAGS ...]
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

EXIT_PEER_FAILED = 3  # killed_peer_check.cpp: kExitPeerFailed
VICTIM_STATUS = 128 + signal.SIGKILL  # as sh reports a child killed by SIGKILL

# Records the rank's exit status and wall time once the process is gone.
RANK_SHELL = ('"$0" "$@"; rc=$?; '
              'printf "%s %s\\n" "$rc" "$(date +%s.%N)" > "$KILLED_PEER_OUT/exit$OMPI_COMM_WORLD_RANK"; '
              'exit $rc')


def read_kv(path):
    kv = {}
    try:
        with open(path) as f:
            for line in f:
                k, _, v = line.rstrip("\n").partition("=")
                kv[k] = v
    except FileNotFoundError:
        return None
    return kv


def read_exit(path):
    try:
        with open(path) as f:
            rc, t = f.read().split()
            return int(rc), float(t)
    except (FileNotFoundError, ValueError):
        return None


def one_rep(args, mpirun, rep):
    out = tempfile.mkdtemp(prefix=f"torus-killed-peer-{args.backend}-")
    # Victims 1..n-1 in turn (rank 0 hosts the store), kill delays 2..26 ms.
    victim = 1 + rep % (args.ranks - 1)
    kill_delay_ms = 2 + (rep * 6) % 25
    limit_s = args.deadline_ms / 1000 + args.bound_s + args.startup_s
    env_flags = ["-x", f"TORUS_BACKEND={args.backend}", "-x", f"KILLED_PEER_OUT={out}"]
    for e in args.env:
        env_flags += ["-x", e]
    # mpirun's own --timeout tears down whatever is left shortly after the
    # limit (ranks stuck in MPI_Finalize included); killing mpirun's process
    # group is the last resort.
    cmd = (mpirun + ["--mca", "orte_enable_recovery", "1", "--timeout", str(int(limit_s) + 5)] + env_flags +
           ["-np", str(args.ranks), "/bin/sh", "-c", RANK_SHELL, args.exe, "--victim", str(victim),
            "--fault", args.fault, "--deadline-ms", str(args.deadline_ms), "--kill-delay-ms", str(kill_delay_ms),
            "--out", out])
    env = dict(os.environ, KILLED_PEER_OUT=out)
    t0 = time.time()
    log_file = tempfile.TemporaryFile(mode="w+")
    p = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    survivors = [r for r in range(args.ranks) if r != victim]
    # Wait for every survivor to exit (or for the limit), then for mpirun,
    # once a stopped victim has been killed.
    while time.time() - t0 < limit_s and p.poll() is None:
        if all(os.path.exists(os.path.join(out, f"exit{r}")) for r in survivors):
            break
        time.sleep(0.1)
    hung = not all(os.path.exists(os.path.join(out, f"exit{r}")) for r in survivors)
    death = read_kv(os.path.join(out, "death.txt"))
    if death and args.fault == "stop":
        try:
            os.kill(int(death["pid"]), signal.SIGKILL)
        except ProcessLookupError:
            pass
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    wall = time.time() - t0
    log_file.seek(0)
    log = log_file.read()

    failures, lines = [], []
    death_t = float(death["time"]) if death else None
    if death is None:
        failures.append("the victim never reached its kill point (no death.txt)")
    elif int(death["rank"]) != victim:
        failures.append(f"death.txt names rank {death['rank']}, expected the victim {victim}")
    worst = 0.0
    for r in range(args.ranks):
        ex = read_exit(os.path.join(out, f"exit{r}"))
        rep_kv = read_kv(os.path.join(out, f"rank{r}.txt"))
        if r == victim:
            if not hung and (ex is None or ex[0] != VICTIM_STATUS):
                failures.append(f"rank {r} (victim): exit {ex}, expected status {VICTIM_STATUS} (SIGKILL)")
            continue
        if ex is None:
            failures.append(f"rank {r}: HUNG, no exit after {wall:.1f} s" +
                            (f" (its teardown had not finished: report {rep_kv})" if rep_kv is None else
                             f" (teardown done after {rep_kv.get('teardown_s')} s, stuck after that)"))
            continue
        rc, t_exit = ex
        since_death = t_exit - death_t if death_t else float("nan")
        worst = max(worst, since_death)
        if rc != EXIT_PEER_FAILED:
            failures.append(f"rank {r}: exit status {rc}, expected {EXIT_PEER_FAILED}; report {rep_kv}")
        if rep_kv is None:
            failures.append(f"rank {r}: no report")
            continue
        if rep_kv.get("error_type") not in ("TimeoutError", "CommError"):
            failures.append(f"rank {r}: outcome {rep_kv.get('outcome')} {rep_kv.get('error_type')}: "
                            f"{rep_kv.get('message')}")
        msg = rep_kv.get("message", "")
        if "'world'" not in msg or "seq" not in msg:
            failures.append(f"rank {r}: the error names no group or sequence number: {msg}")
        bound = args.deadline_ms / 1000 + args.bound_s
        if death_t and since_death > bound:
            failures.append(f"rank {r}: exited {since_death:.1f} s after the victim died, bound {bound:.1f} s")
        lines.append(f"rank {r}: {rep_kv.get('error_type')} after {float(rep_kv['error']) - death_t:.2f} s, "
                     f"teardown {rep_kv['teardown_s']} s (MPI finalized: {rep_kv.get('mpi_finalized')}), "
                     f"exit {rc} at +{since_death:.2f} s")
    status = "HUNG" if hung else ("FAILED" if failures else "ok")
    print(f"[{args.backend} {args.fault} rep {rep + 1}/{args.reps}] victim {victim}, delay {kill_delay_ms} ms, "
          f"mpirun exit {p.returncode}, wall {wall:.1f} s, slowest survivor +{worst:.2f} s: {status}")
    for l in lines:
        print("   " + l)
    if failures or hung:
        print("   " + "\n   ".join(failures))
        print("   --- mpirun output ---\n" + "\n".join("   " + l for l in log.splitlines()[-60:]))
    else:
        shutil.rmtree(out, ignore_errors=True)
    return not failures and not hung, worst


def main():
    argv = sys.argv[1:]
    if "--" not in argv:
        sys.exit("usage: killed_peer_test.py [options] -- MPIRUN [FLAGS...]")
    split = argv.index("--")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--exe", required=True, help="path of killed_peer_check")
    ap.add_argument("--backend", required=True, help="TORUS_BACKEND of the ranks")
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--fault", choices=("kill", "stop"), default="kill")
    ap.add_argument("--deadline-ms", type=int, default=3000)
    ap.add_argument("--bound-s", type=float, default=30.0, help="survivors exit within deadline + this")
    ap.add_argument("--startup-s", type=float, default=20.0, help="allowance for start-up before the kill")
    ap.add_argument("--env", action="append", default=[], help="VAR=VALUE for the ranks (repeatable)")
    args = ap.parse_args(argv[:split])
    mpirun = argv[split + 1:]
    if args.ranks < 2:
        sys.exit("needs at least 2 ranks")
    results = []
    for rep in range(args.reps):
        results.append(one_rep(args, mpirun, rep))
        if not results[-1][0]:
            break  # a hang costs the whole bound: do not repeat it
    ok = len(results) == args.reps and all(r[0] for r in results)
    print(f"{args.backend} {args.fault}: {sum(r[0] for r in results)}/{args.reps} repetitions ok, slowest survivor "
          f"exit {max(r[1] for r in results):.2f} s after the victim's death (bound "
          f"{args.deadline_ms / 1000 + args.bound_s:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
