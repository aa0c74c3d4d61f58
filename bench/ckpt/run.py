#!/usr/bin/env python3
"""Checkpoint save and load: Torus (sync and async) against torch.save/torch.load
and torch.distributed.checkpoint, beside the file system's sequential write and
read bandwidth measured in the same run, on 1 and 4 ranks.

    python3 bench/ckpt/run.py [--build build] [--ranks 1,4] [--hidden 768 --layers 14 --heads 12 --seq 64]
                              [--repeats 3] [--dir DIR] [--json FILE]
    python3 bench/record.py checkpoint -- python3 bench/ckpt/run.py      # writes bench/results/checkpoint.*

For each rank count, `mpirun -np N python3 bench/ckpt/worker.py` (PYTHONPATH=<build>/python) builds a
torus.train.GPTTrainer of the byte-level GPT (vocab 256; the defaults give 99.47M parameters, printed
exactly), f32, dp = N (ZeRO-1 on 4 ranks, so that every rank holds and writes its own AdamW shard;
ZeRO-0 on 1 rank), takes one train_step so that AdamW state exists, keeps a clone of
trainer.state_dict() (again at every round), and then runs --repeats rounds of these phases, in this
order, each started at a barrier and timed on every rank (a phase's time is the slowest rank's; the
table shows the median over rounds):

  fs write / read   the same number of bytes as this rank's Torus file, in 64 MiB os.write calls from
                    a preallocated buffer, then fsync (all ranks at once: on 4 ranks the aggregate);
                    then read back in 64 MiB blocks. The physical limit beside the others.
  torus sync        torus.checkpoint.Checkpointer(...).save(step): every rank writes and fsyncs its
                    safetensors file (hashed with SHA-256 on a second thread, writeback started every
                    64 MiB: docs/checkpoint.md, Note [Overlapped writes]), rank 0 writes the manifest, renames
                    the directory and writes COMPLETE, one all-reduce agrees (keep_last=0: the
                    benchmark deletes old checkpoints itself, untimed).
  torus load        torus.checkpoint.resume(world, trainer, path) into a state zeroed beforehand; the
                    loaded state must equal the clone (torch.equal on every tensor) or the run fails.
                    On 4 ranks every rank reads the (replicated) model from rank 0's file plus its
                    own shard.
  torch             torch.save of the same tensors this rank's Torus file holds (the keys of its
                    rank-N.done.json: each piece once over the job), into a file object that is then
                    flushed and fsynced (torch.save alone does not fsync; the fsync is added so that it
                    is comparable with Torus, which does); torch.load(weights_only=True), checked.
  dcp               torch.distributed.checkpoint.save of the same tensors under rank-prefixed keys
                    ("r0.model...": DCP would deduplicate equal keys over ranks) on a gloo process
                    group (a FileStore in the run's directory; its FileSystemWriter fsyncs: sync_files=True);
                    dcp.load into preallocated tensors, checked; dcp.async_save (stall and total) when
                    the torch version has it (its stall: async_save's return, after DCP's staging copy).
  torus async       last in a round, as a training loop uses it: a plain train_step is timed, then
                    Checkpointer(async_save=True).save(step) followed at once by a train_step and wait().
                    save() copies the small tensors and returns; parameters and optimizer state are
                    copied in the background during the next forward/backward, whose update waits for
                    the copy. The training stall = save()'s return time + (the step during the save -
                    the plain step), per rank; the total runs from save() until wait() returns (a train
                    step included, so no ratios). Beside it Checkpointer.last_stall_s, Torus's own
                    account (save() + the time the update waited for the copy). The checkpoint is then
                    loaded and must equal the state of save() time, not the update that ran meanwhile
                    (a torn snapshot fails the run).

Before every read or load, the files' pages are dropped from the page cache (fsync, then
posix_fadvise(POSIX_FADV_DONTNEED) per file: no root, nothing else's cache touched) and fincore(1)
reports what stayed resident (the "resident" line; 0 B means the loads read the disk, or whatever cache
the virtual disk has below the guest). Free disk space is checked first (4x the expected bytes);
everything the run writes goes into a fresh directory (under --dir, default /tmp) that is deleted at the
end. The table gives, per method: median time, GB/s (its files' bytes / time; 1 GB = 1e9 B), x fs = the
file-system probe's time / its time (same bytes), x torch = torch.save's (or torch.load's) time / its
time. Then the issue's goals: async stall < 10% of the sync save; sync save >= 0.7x the sequential
write; sync save >= 1.0x torch.save (reported met/missed; only a failed verification exits 1). The
header states the SHA-256 throughput of one core (hashlib): the bound of a file's hashing.
"""

import argparse
import hashlib
import json
import os
import pathlib
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from procs import cpu_busy, kill_session  # noqa: E402  (bench/procs.py)

ROOT = pathlib.Path(__file__).resolve().parents[2]
MPI_FLAGS = ["--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader,tcp",
             "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"]


def run_job(cmd, env, timeout):
    """Runs mpirun in a session of its own; on a timeout, SIGTERM (mpirun passes it on), then SIGKILL of every
    process left in the session (Open MPI gives each rank a process group of its own, the session they keep).
    Returns (returncode or None on a timeout, stdout, stderr)."""
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         start_new_session=True)
    try:
        out, err = p.communicate(timeout=timeout)
        return p.returncode, out, err
    except subprocess.TimeoutExpired:
        out, err = kill_session(p)
        return None, out, err


def sha256_gbps(nbytes=256 << 20):
    buf = os.urandom(nbytes)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        hashlib.sha256(buf).digest()
        times.append(time.perf_counter() - t0)
    return nbytes / min(times) / 1e9


def expected_params(a):
    ffn = 4 * a.hidden
    per_layer = 4 * a.hidden * a.hidden + 2 * a.hidden * ffn + 9 * a.hidden + ffn
    return a.layers * per_layer + (256 + a.seq) * a.hidden + 2 * a.hidden


def human(b):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.1f} {unit}" if unit != "B" else f"{int(b)} B"
        b /= 1024


def phase_times(doc, phase):
    """Per round, the slowest rank's time of `phase`."""
    per = [r["times"].get(phase) for r in doc["per_rank"]]
    if any(p is None for p in per):
        return None
    return [max(ts) for ts in zip(*per)]


def summarize(doc):
    """Medians, GB/s and ratios of one rank count."""
    ranks = doc["per_rank"]
    total_bytes = {k: sum(r["bytes"][k] for r in ranks) for k in ranks[0]["bytes"]}
    state = sum(r["state_bytes"] for r in ranks)
    fs_bytes = sum(r["rank_file_bytes"] for r in ranks)
    med = {}
    rounds = {}
    for phase in ["fs_write", "fs_read", "torus_sync", "torus_async", "torus_async_stall", "torus_async_return",
                  "torus_async_reported", "step_plain", "step_during_async", "torus_load", "torch_save", "torch_load",
                  "dcp_save", "dcp_load", "dcp_async", "dcp_async_stall"]:
        t = phase_times(doc, phase)
        if t:
            rounds[phase] = t
            med[phase] = statistics.median(t)
    rows = []

    def row(name, phase, nbytes, vs_fs, vs_torch):
        if phase not in med:
            return
        t = med[phase]
        rows.append(dict(method=name, phase=phase, time_s=t, bytes=nbytes, gbps=nbytes / t / 1e9 if nbytes else None,
                         x_fs=med[vs_fs] / t if vs_fs in med else None,
                         x_torch=med[vs_torch] / t if vs_torch in med else None, rounds=rounds[phase]))

    row("fs seq write+fsync", "fs_write", fs_bytes, "fs_write", "torch_save")
    row("torus sync save", "torus_sync", total_bytes["torus_sync"], "fs_write", "torch_save")
    row("torus async: train step", "step_plain", 0, None, None)
    row("  step during async save", "step_during_async", 0, None, None)
    row("  save() return", "torus_async_return", 0, None, None)
    row("  stall (return + delay)", "torus_async_stall", 0, None, None)
    row("  last_stall_s (Torus)", "torus_async_reported", 0, None, None)
    row("  total (to wait())", "torus_async", total_bytes["torus_async"], None, None)
    row("torch.save+fsync", "torch_save", total_bytes["torch"], "fs_write", "torch_save")
    row("dcp.save (gloo)", "dcp_save", total_bytes["dcp"], "fs_write", "torch_save")
    row("dcp.async_save (total)", "dcp_async", total_bytes["dcp_async"], "fs_write", "torch_save")
    row("dcp.async_save stall", "dcp_async_stall", 0, None, None)
    row("fs seq read", "fs_read", fs_bytes, "fs_read", "torch_load")
    row("torus load", "torus_load", total_bytes["torus_sync"], "fs_read", "torch_load")
    row("torch.load", "torch_load", total_bytes["torch"], "fs_read", "torch_load")
    row("dcp.load (gloo)", "dcp_load", total_bytes["dcp"], "fs_read", "torch_load")
    goals = []
    if "torus_sync" in med:
        sync = med["torus_sync"]
        if "torus_async_stall" in med:
            v = med["torus_async_stall"] / sync
            goals.append(dict(goal="async stall < 10% of sync save", value=v, text=f"{100 * v:.1f}%", met=v < 0.10))
        if "fs_write" in med:
            v = med["fs_write"] / sync
            goals.append(dict(goal="sync save >= 0.7x seq write", value=v, text=f"{v:.2f}x", met=v >= 0.7))
        if "torch_save" in med:
            v = med["torch_save"] / sync
            goals.append(dict(goal="sync save >= 1.0x torch.save", value=v, text=f"{v:.2f}x", met=v >= 1.0))
    resident = {}
    for r in ranks:
        for k, vals in r["resident"].items():
            resident[k] = max([resident.get(k, -1)] + vals)
    notes = {}
    for r in ranks:
        notes.update(r["notes"])
    return dict(ranks=doc["ranks"], zero_stage=doc["zero_stage"], parameters=doc["parameters"], state_bytes=state,
                ckpt_bytes=doc["ckpt_bytes"], rows=rows, goals=goals, resident_after_evict=resident, notes=notes,
                rss_peak_per_rank=[r["rss_peak"] for r in ranks],
                rank_file_bytes=[r["rank_file_bytes"] for r in ranks])


def print_table(s):
    print(f"## {s['ranks']} rank(s), ZeRO-{s['zero_stage']}: {s['parameters'] / 1e6:.2f}M parameters "
          f"({s['parameters']}), state saved {s['state_bytes'] / 1e9:.3f} GB over the job "
          f"(rank files {', '.join(human(b) for b in s['rank_file_bytes'])})")
    res = s["resident_after_evict"]
    if res:
        worst = max(res.values())
        print("# page cache after eviction: " + (f"{human(worst)} resident at most (reads hit the disk)" if worst >= 0
                                                 else "unknown (no fincore)"))
    print(f"{'method':<26} {'time s':>8} {'GB/s':>7} {'x fs':>6} {'x torch':>7} {'bytes':>11}  rounds (s)")
    for r in s["rows"]:
        gb = f"{r['gbps']:.3f}" if r["gbps"] else "-"
        xf = f"{r['x_fs']:.2f}" if r["x_fs"] is not None else "-"
        xt = f"{r['x_torch']:.2f}" if r["x_torch"] is not None else "-"
        by = human(r["bytes"]) if r["bytes"] else "-"
        rounds = " ".join(f"{t:.3f}" for t in r["rounds"])
        print(f"{r['method']:<26} {r['time_s']:>8.3f} {gb:>7} {xf:>6} {xt:>7} {by:>11}  {rounds}")
    for k, v in s["notes"].items():
        print(f"# {k}: not measured: {v}")
    by = {r["phase"]: r["time_s"] for r in s["rows"]}
    if {"torus_async_stall", "torus_async_reported"} <= by.keys() and by["torus_async_stall"] > \
            2 * by["torus_async_reported"] + 0.05:
        cpus = os.cpu_count()
        slower = by["torus_async_stall"] - by["torus_async_return"]
        waited = by["torus_async_reported"] - by["torus_async_return"]
        print(f"# the step during the async save took {slower:.3f} s longer, of which its update waited for the copy "
              f"{max(0.0, waited):.3f} s (Checkpointer.last_stall_s): the rest is the background copy, write and "
              f"hashing competing for the CPUs"
              + (f" ({s['ranks']} ranks on {cpus} CPUs)" if s["ranks"] > cpus / 2 else ""))
    for g in s["goals"]:
        print(f"# goal {g['goal']}: {g['text']} ({'met' if g['met'] else 'missed'})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--ranks", default="1,4")
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--layers", type=int, default=14)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--dir", default=None, help="where to write (a fresh subdirectory; default /tmp)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per mpirun")
    ap.add_argument("--json")
    args = ap.parse_args()

    build = pathlib.Path(args.build).resolve()
    if not (build / "python" / "torus").is_dir():
        print(f"run.py: {build}/python/torus is missing (build with TORUS_BUILD_PYTHON=ON)", file=sys.stderr)
        return 1
    base = args.dir or tempfile.gettempdir()
    os.makedirs(base, exist_ok=True)
    expect = 12 * expected_params(args)  # f32 parameters + AdamW exp_avg + exp_avg_sq
    free = shutil.disk_usage(base).free
    if free < 4 * expect:
        print(f"run.py: {base} has {human(free)} free, needs 4x the checkpoint's {human(expect)}", file=sys.stderr)
        return 1
    work = tempfile.mkdtemp(prefix="torus-ckpt-bench-", dir=base)
    sha = sha256_gbps()
    load0 = os.getloadavg()
    busy = cpu_busy()
    import torch
    print(f"# checkpoint save/load: byte-level GPT hidden {args.hidden}, {args.layers} layers, {args.heads} heads, "
          f"seq {args.seq}, f32 + AdamW; {args.repeats} rounds, medians of the slowest rank; torch {torch.__version__}")
    print(f"# file system: {base} ({human(free)} free); SHA-256 of one core (hashlib): {sha:.2f} GB/s; "
          f"{os.cpu_count()} CPUs, "
          f"{'?' if busy is None else f'{100 * busy:.0f}%'} busy over 2 s before the run")
    results = []
    try:
        for n in [int(x) for x in args.ranks.split(",") if x]:
            out = os.path.join(work, f"result-{n}.json")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(build / "python"),
                                                                             os.environ.get("PYTHONPATH")])),
                       TORUS_LOG_LEVEL="warn",
                       OMP_NUM_THREADS=str(args.threads))
            worker = [sys.executable, str(pathlib.Path(__file__).with_name("worker.py")), "--dir", work, "--out", out,
                      "--hidden", str(args.hidden), "--layers", str(args.layers), "--heads", str(args.heads),
                      "--seq", str(args.seq), "--repeats", str(args.repeats), "--threads", str(args.threads),
                      "--gloo-store", os.path.join(work, f"gloo-{n}.store")]
            cmd = ["mpirun", *MPI_FLAGS, "-x", "PYTHONPATH", "-x",
                   "TORUS_LOG_LEVEL", "-x", "OMP_NUM_THREADS", "-np", str(n), *worker]
            # Printed relative to the repository (where the worker lies there), so a result names no machine's paths.
            shown = [os.path.relpath(c, ROOT) if c == worker[1] else c for c in worker[1:]]
            print(f"# {n} rank(s): mpirun -np {n} {' '.join(shlex.quote(c) for c in shown)}", flush=True)
            t0 = time.time()
            rc, stdout, stderr = run_job(cmd, env, args.timeout)
            if rc is None:
                sys.stderr.write(stdout[-3000:] + stderr[-6000:])
                print(f"run.py: {n} ranks: no result in {args.timeout} s (killed)", file=sys.stderr)
                return 1
            if rc != 0 or not os.path.exists(out):
                sys.stderr.write(stdout[-3000:] + stderr[-6000:])
                print(f"run.py: {n} ranks: the worker failed (exit {rc})", file=sys.stderr)
                return 1
            doc = json.load(open(out))
            s = summarize(doc)
            s["wall_s"] = time.time() - t0
            s["raw"] = doc
            print_table(s)
            results.append(s)
            sys.stdout.flush()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    load1 = os.getloadavg()
    # The end's load average counts this run's own ranks (and their I/O waits); the start's is other work.
    print(f"# load average at the start {load0[0]:.2f}, at the end {load1[0]:.2f} (this run's ranks included)"
          + ("; other work kept the CPUs busy at the start: rerun on a quiet machine" if busy and busy > 0.25 else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(sha256_gbps=sha, load_average=[load0[0], load1[0]], cpu_busy_before=busy, dir=base,
                           config=dict(hidden=args.hidden, layers=args.layers, heads=args.heads, seq=args.seq,
                                       repeats=args.repeats, threads=args.threads),
                           results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
