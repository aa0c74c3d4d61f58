#!/usr/bin/env python3
"""run.py — the side-by-side collective benchmark: Torus `ofi` (libfabric shm
provider), Torus `mpi`, raw Open MPI and torch.distributed gloo, in one run,
for 2 and 4 ranks, beside the single-core memcpy probe.

    python3 bench/collectives/run.py --build-dir build [--quick]

For each rank count and backend it starts one mpirun of the backend's program
(torus-bench-comm --backend ofi|mpi, the same with --buffers heap for
"ofi heap bufs", torus-bench-mpi-peer, gloo_peer.py) over
all_reduce, reduce_scatter, all_gather, all_to_all and broadcast, 8 B to
256 MiB, f32 sum. Every program verifies every size it measures (#wrong) and
reports the median over iterations of the slowest rank's time per op (bench/
README.md). A backend that is not built or not usable is skipped with the
reason. Outputs, in --out-dir (default bench/results):

  collectives.json  records {backend, op, ranks, bytes, time_us, algbw_gbps,
                    busbw_gbps, wrong, in_place, count, dtype, iters, ...}
                    plus {"probe": "memcpy", "gbps": ...} and, for two copies
                    running at once (one per core, the DRAM limit of a 2-rank
                    all_reduce), {"probe": "memcpy", "concurrent": 2, "gbps": ...}
  collectives.txt   the tables printed at the end (busbw per size and backend,
                    and the goal rows with their ratios: from the sweep, and
                    from --goal-rounds interleaved rounds of the 2-rank goal
                    sizes, whose records the JSON tags with "goal_round")
  collectives.png   busbw against size, per op and rank count, one line per
                    backend, the memcpy probe as a dashed line
and, in --log-dir (default <build-dir>/bench/collectives-logs), the full
nccl-tests style output and records of every run.

Tables and plot compare every backend on the same placement: the one
torch.distributed uses (all_reduce and broadcast in place; reduce_scatter,
all_gather, all_to_all out of place). The JSON holds both placements where a
backend has both.
"""
import argparse
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
OPS = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast"]
# "ofi": the ofi backend on tensor storage, as a Torus program has it: with
# 2+ ranks on a host torus::init installs the shared host allocator (Note
# [Shared host allocator]), so same-host ops take the zero-copy path.
# "ofi-heap": the same on heap memory no peer can map (aligned_alloc): the
# staging path, what tensors get with TORUS_SHARED_HOST_ALLOC=off.
BACKENDS = ["ofi", "ofi-heap", "mpi", "openmpi", "gloo"]
OFI_VARIANTS = ["ofi", "ofi-heap"]
LABEL = {"ofi": "torus ofi", "ofi-heap": "ofi heap bufs", "mpi": "torus mpi", "openmpi": "Open MPI",
         "gloo": "gloo"}
COLOR = {"ofi": "tab:blue", "ofi-heap": "tab:purple", "mpi": "tab:orange", "openmpi": "tab:green",
         "gloo": "tab:red"}
# The placement torch.distributed uses, which every backend here also has.
IN_PLACE = {"all_reduce": True, "broadcast": True, "reduce": True,
            "reduce_scatter": False, "all_gather": False, "all_to_all": False}
MiB = 1 << 20


def human(nbytes):
    for unit, scale in (("GiB", 1 << 30), ("MiB", MiB), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Runner:
    def __init__(self, args):
        self.args = args
        self.bench = Path(args.build_dir).resolve() / "bench"
        self.out = Path(args.out_dir).resolve()
        self.logs = Path(args.log_dir).resolve() if args.log_dir else self.bench / "collectives-logs"
        self.out.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        for b in BACKENDS + ["membw"]:  # no stale runs beside this one's
            for stale in self.logs.glob(f"{b}*.*"):
                stale.unlink()
        self.skipped = {}  # backend -> reason
        self.failed = []   # (backend, ranks, reason)

    # -- what can run --------------------------------------------------------------
    def mpirun_base(self, n):
        mpirun = shutil.which(self.args.mpirun)
        # mpirun's own --timeout tears the whole job down; the subprocess
        # timeout (a little later) is only a backstop.
        cmd = [mpirun, "-np", str(n), "--timeout", str(self.args.timeout)]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
        return cmd + self.args.mpirun_args.split()

    def available(self):
        """Backends that can run, each missing one recorded with its reason."""
        if not shutil.which(self.args.mpirun):
            for b in self.args.backends:
                self.skipped[b] = f"'{self.args.mpirun}' not found (install Open MPI: openmpi-bin)"
            return []
        ok = []
        comm = self.bench / "torus-bench-comm"
        built = []
        if comm.exists():
            r = subprocess.run([str(comm), "--list-backends"], capture_output=True, text=True)
            built = r.stdout.split() if r.returncode == 0 else []
        for b in self.args.backends:
            if b in ("ofi", "ofi-heap", "mpi"):
                be = "ofi" if b == "ofi-heap" else b
                if not comm.exists():
                    self.skipped[b] = f"{comm} not built (configure with -DTORUS_BUILD_BENCH=ON, build torus_bench_comm)"
                elif be not in built:
                    self.skipped[b] = f"the '{be}' host backend is not built into this Torus (built: {', '.join(built) or 'none'})"
                elif be == "ofi" and shutil.which("fi_info") and subprocess.run(
                        ["fi_info", "-p", "shm"], capture_output=True).returncode != 0:
                    self.skipped[b] = "libfabric has no usable 'shm' provider (fi_info -p shm fails)"
                else:
                    ok.append(b)
            elif b == "openmpi":
                peer = self.bench / "torus-bench-mpi-peer"
                if peer.exists():
                    ok.append(b)
                else:
                    self.skipped[b] = f"{peer} not built (needs MPI at configure time; target torus_bench_mpi_peer)"
            elif b == "gloo":
                r = subprocess.run([sys.executable, "-c",
                                    "import torch.distributed as d; assert d.is_available() and d.is_gloo_available()"],
                                   capture_output=True, text=True)
                if r.returncode == 0:
                    ok.append(b)
                else:
                    self.skipped[b] = "torch with torch.distributed gloo is not importable: " + \
                        (r.stderr.strip().splitlines() or ["?"])[-1]
            else:
                self.skipped[b] = "unknown backend"
        return ok

    # -- running -------------------------------------------------------------------
    def sweep_args(self):
        a = self.args
        return ["--sizes", ",".join(str(s) for s in a.sizes), "--ops", ",".join(a.ops),
                "--iters", str(a.iters), "--warmup", str(a.warmup), "--iter-budget", str(a.iter_budget),
                "--no-probe"]

    def command(self, backend, n, json_path, sweep=None):
        """The mpirun command line and the variables it exports to the ranks
        (`sweep`: the program's sweep flags, default the run's)."""
        env = {"TORUS_LOG_LEVEL": "warn", "OMP_NUM_THREADS": "1"}
        if backend in ("ofi", "ofi-heap", "mpi"):
            prog = [str(self.bench / "torus-bench-comm"), "--backend", "mpi" if backend == "mpi" else "ofi"]
            if backend == "ofi-heap":
                prog += ["--buffers", "heap"]
            # One host: the store listens on loopback at an address given up
            # front, so the bootstrap needs no hand-off through MPI (the ofi
            # runs then never initialise MPI), with a fresh job token.
            env.update({"TORUS_MASTER_ADDR": "127.0.0.1", "TORUS_MASTER_PORT": str(free_port()),
                        "TORUS_JOB_TOKEN": secrets.token_hex(32)})
            if backend != "mpi":
                env["FI_PROVIDER"] = "shm"
        elif backend == "openmpi":
            prog = [str(self.bench / "torus-bench-mpi-peer")]
        else:
            prog = [sys.executable, str(HERE / "gloo_peer.py")]
            env.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
        exports = []
        for k in env:
            exports += ["-x", k]  # by name: values (the token) stay off the command line
        return (self.mpirun_base(n) + exports + prog + (sweep or self.sweep_args()) + ["--json", str(json_path)],
                env)

    def run_one(self, backend, n, index, total, sweep=None, tag=""):
        json_path = self.logs / f"{backend}-{n}{tag}.json"
        log_path = self.logs / f"{backend}-{n}{tag}.log"
        json_path.unlink(missing_ok=True)
        cmd, env = self.command(backend, n, json_path, sweep)
        print(f"[{index}/{total}] {LABEL[backend]}, {n} ranks{tag and ' (' + tag.strip('-') + ')'} ... ", end="",
              flush=True)
        t0 = time.monotonic()
        with open(log_path, "w") as log:
            log.write("$ " + " ".join(cmd) + "\n")
            log.flush()
            try:
                rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, timeout=self.args.timeout + 30,
                                    cwd=REPO, env={**os.environ, **env}).returncode
            except subprocess.TimeoutExpired:
                rc = "timeout"
        took = time.monotonic() - t0
        records = json.loads(json_path.read_text()) if json_path.exists() else []
        records = [r for r in records if "op" in r]
        if backend == "ofi-heap":  # the program says "ofi"
            records = [{**r, "backend": backend, "buffers": "heap"} for r in records]
        wrong = sum(r["wrong"] for r in records if r.get("wrong", -1) > 0)
        if rc != 0 and not (rc == 2 and records):
            tail = log_path.read_text().strip().splitlines()[-3:]
            reason = f"exit {rc} after {took:.0f} s; see {log_path}: " + " | ".join(t.strip() for t in tail)
            self.failed.append((backend, n, reason))
            print(f"FAILED ({reason})", flush=True)
        else:
            print(f"{len(records)} records, #wrong {wrong}, {took:.0f} s", flush=True)
        return records

    def probe(self, quiet=False):
        exe = self.bench / "torus-bench-membw"
        if not exe.exists():
            self.skipped["memcpy probe"] = f"{exe} not built (target torus_bench_membw)"
            return None
        path = self.logs / "membw.json"
        r = subprocess.run([str(exe), "--json", str(path)], capture_output=True, text=True)
        if r.returncode != 0:
            self.skipped["memcpy probe"] = r.stderr.strip()
            return None
        if not quiet:
            print(f"probe: {r.stdout.strip()}", flush=True)
        return json.loads(path.read_text())[0]

    def goal_rounds(self, backends, rounds):
        """Note [Goal rounds]: the goal rows measured again in `rounds`
        interleaved rounds. This machine's speed drifts within minutes (how
        far apart its two cores are, how much memory bandwidth each gets), so
        backends measured minutes apart in the sweep may have run on a
        different machine, in effect. Each round runs both memcpy probes and
        then every backend's 2-rank all_reduce of 8 B and 64 MiB back to back:
        first the ofi variants with Open MPI between them (the pairs the
        goals compare, next to each other in time, in alternating order),
        then the others, starting with a different one each round. The goal
        rows report the median over rounds and in how many rounds a goal held
        within the round. Returns records tagged with their round."""
        out = []
        sweep = ["--sizes", f"8,{64 * MiB}", "--ops", "all_reduce", "--iters", "200", "--warmup", "20",
                 "--iter-budget", str(1 << 30), "--no-probe"]
        for k in range(1, rounds + 1):
            probe = self.probe(quiet=True)
            pair = self.probe_pair(quiet=True)
            print(f"goal round {k}/{rounds}: memcpy {probe['gbps'] if probe else float('nan'):.2f} GB/s, "
                  f"two at once {pair or float('nan'):.2f} GB/s each", flush=True)
            if probe:
                out.append({"goal_round": k, "probe": "memcpy", "gbps": probe["gbps"]})
            if pair:
                out.append({"goal_round": k, "probe": "memcpy", "concurrent": 2, "gbps": pair})
            core = [b for b in ("ofi", "openmpi", "ofi-heap") if b in backends]
            if k % 2 == 0:
                core.reverse()
            rest = [b for b in backends if b not in core]
            shift = (k - 1) % len(rest) if rest else 0
            order = core + rest[shift:] + rest[:shift]
            for i, b in enumerate(order, 1):
                for r in self.run_one(b, 2, i, len(order), sweep, tag=f"-goal{k}"):
                    out.append({**r, "goal_round": k})
        return out

    def probe_pair(self, quiet=False):
        """Two memcpy probes at once, one per core: the copy rate each gets when
        two ranks stream through memory together, as in a 2-rank all_reduce
        (each rank reads its input and writes its output at least once). The
        slower of the two, or None."""
        exe = self.bench / "torus-bench-membw"
        if not exe.exists():
            return None
        paths = [self.logs / f"membw-pair-{i}.json" for i in range(2)]
        procs = [subprocess.Popen([str(exe), "--json", str(p)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for p in paths]
        if any(p.wait() != 0 for p in procs):
            return None
        gbps = min(json.loads(p.read_text())[0]["gbps"] for p in paths)
        if not quiet:
            print(f"probe: two memcpys at once, the slower: {gbps:.2f} GB/s per core", flush=True)
        return gbps


# -- reporting ---------------------------------------------------------------------------
def find(records, backend, op, n, nbytes=None, in_place=None):
    """Records of one backend/op/rank count (optionally one size and placement)."""
    ip = IN_PLACE.get(op, False) if in_place is None else in_place
    return [r for r in records if r["backend"] == backend and r["op"] == op and r["ranks"] == n
            and r["in_place"] == ip and (nbytes is None or r["bytes"] == nbytes)]


def one(records, backend, op, n, nbytes, in_place=None):
    found = find(records, backend, op, n, nbytes, in_place)
    return found[0] if found else None


def side_by_side(records, backends, ranks, ops):
    lines = []
    for n in ranks:
        for op in ops:
            sizes = sorted({r["bytes"] for r in records if r["op"] == op and r["ranks"] == n})
            if not sizes:
                continue
            place = "in place" if IN_PLACE[op] else "out of place"
            lines.append(f"\n## {op}, {n} ranks, f32 ({place}): time (us) | busbw (GB/s); #wrong summed")
            head = f"{'size':>10} " + "".join(f"| {LABEL[b]:>21} " for b in backends)
            lines += [head, "-" * len(head)]
            for s in sizes:
                row = f"{human(s):>10} "
                for b in backends:
                    r = one(records, b, op, n, s)
                    if r is None:
                        row += f"| {'-':>21} "
                    else:  # "!" marks a size with wrong elements
                        row += f"| {r['time_us']:10.1f} {r['busbw_gbps']:8.3f}{'' if r['wrong'] == 0 else '!':>2} "
                lines.append(row)
    return lines


def ratio(a, b):
    if not a or not b:
        return "-"
    r = a / b
    return f"{r:.2f}x" if r >= 0.1 else f"{r:.4f}x"


def goal_table(records, probe_gbps, pair_gbps=None):
    """The goal rows of the ofi issue, both placements: every backend's value,
    then the ratios of each ofi variant (tensor and heap buffers); and
    the 64 MiB busbw against the two-copies-at-once probe, the rate DRAM
    gives each of two ranks streaming together."""
    cols = [b for b in BACKENDS if any(r["backend"] == b for r in records)]
    lines = ["\n## Goal rows from the sweep (2 ranks, f32 all_reduce)"]
    head = f"{'row':<34}" + "".join(f"{LABEL[b]:>16}" for b in cols) + f"{'memcpy':>9}"
    lines += [head, "-" * len(head)]
    rows = []
    for in_place in (False, True):
        place = "in place" if in_place else "out of place"
        for what, nbytes, key in (("busbw GB/s", 64 * MiB, "busbw_gbps"), ("latency us", 8, "time_us")):
            vals = {}
            for b in cols:
                # gloo's all_reduce exists in place only; its value stands in both rows.
                r = one(records, b, "all_reduce", 2, nbytes, True if b == "gloo" else in_place)
                vals[b] = r[key] if r else None
            fmt = (lambda v: f"{v:16.3f}" if v is not None else f"{'-':>16}")
            label = f"{human(nbytes)} {what} ({place})"
            mem = f"{probe_gbps:9.2f}" if probe_gbps and key == "busbw_gbps" else f"{'-':>9}"
            lines.append(f"{label:<34}" + "".join(fmt(vals[b]) for b in cols) + mem)
            rows.append((label, key, vals))
    head = f"{'ratios':<52}{'x OMPI':>9}{'x tmpi':>9}{'x gloo':>9}{'x memcpy':>10}"
    lines += ["", head, "-" * len(head)]
    for v in [b for b in OFI_VARIANTS if b in cols]:
        for label, key, vals in rows:
            g = vals.get
            mem = ratio(g(v), probe_gbps) if key == "busbw_gbps" else "-"
            lines.append(f"{LABEL[v] + ', ' + label:<52}{ratio(g(v), g('openmpi')):>9}{ratio(g(v), g('mpi')):>9}"
                         f"{ratio(g(v), g('gloo')):>9}{mem:>10}")
    lines.append("Goals: busbw x OMPI >= 2, x gloo >= 3, x memcpy >= 0.5; latency x OMPI <= 1 (a time ratio).")
    if pair_gbps and probe_gbps:
        lines.append(f"Limit: two memcpys at once get {pair_gbps:.2f} GB/s each = {pair_gbps / probe_gbps:.2f}x the "
                     "1-core probe; a 2-rank all_reduce reads and writes at least as much per rank.")
        for v in [b for b in OFI_VARIANTS if b in cols]:
            for in_place in (False, True):
                r = one(records, v, "all_reduce", 2, 64 * MiB, in_place)
                if r:
                    lines.append(f"  {LABEL[v]} 64 MiB busbw ({'in place' if in_place else 'out of place'}): "
                                 f"{r['busbw_gbps'] / pair_gbps:.2f}x that limit")
    return lines


def median(v):
    v = sorted(x for x in v if x is not None)
    if not v:
        return None
    m = len(v) // 2
    return v[m] if len(v) % 2 else (v[m - 1] + v[m]) / 2


def goal_rounds_table(rounds_records, rounds):
    """The goal rows from the interleaved rounds (Note [Goal rounds]):
    medians over rounds, and for each ofi variant its ratios and how many
    rounds met each goal within the round."""
    def value(k, b, nbytes, key, in_place):
        for r in rounds_records:
            if (r.get("goal_round") == k and r.get("backend") == b and r.get("op") == "all_reduce"
                    and r.get("bytes") == nbytes and r.get("in_place") == (True if b == "gloo" else in_place)):
                return r[key]
        return None

    def probe(k, concurrent):
        for r in rounds_records:
            if r.get("goal_round") == k and r.get("probe") == "memcpy" and (r.get("concurrent") == 2) == concurrent:
                return r["gbps"]
        return None

    cols = [b for b in BACKENDS if any(r.get("backend") == b for r in rounds_records)]
    ks = range(1, rounds + 1)
    lines = [f"\n## Goal rows, {rounds} interleaved rounds (2 ranks, f32 all_reduce; median over rounds, and the "
             "rounds in which the goal held within the round)"]
    single = [probe(k, False) for k in ks]
    pair = [probe(k, True) for k in ks]
    lines.append("memcpy probe per round, 1 core: " + ", ".join(f"{g:.2f}" if g else "-" for g in single) +
                 " GB/s; two at once, each: " + ", ".join(f"{g:.2f}" if g else "-" for g in pair) + " GB/s")
    head = f"{'row':<34}" + "".join(f"{LABEL[b]:>16}" for b in cols)
    lines += [head, "-" * len(head)]
    fmt = (lambda v: f"{v:16.3f}" if v is not None else f"{'-':>16}")
    rows = []
    for in_place in (False, True):
        place = "in place" if in_place else "out of place"
        for what, nbytes, key in (("busbw GB/s", 64 * MiB, "busbw_gbps"), ("latency us", 8, "time_us")):
            per = {b: [value(k, b, nbytes, key, in_place) for k in ks] for b in cols}
            med = {b: median(per[b]) for b in cols}
            label = f"{human(nbytes)} {what} ({place})"
            lines.append(f"{label:<34}" + "".join(fmt(med[b]) for b in cols))
            rows.append((label, key, in_place, per, med))
    head = f"{'ratios of the medians':<52}{'x OMPI':>9}{'x gloo':>9}{'x memcpy':>10}{'goal met':>10}"
    lines += ["", head, "-" * len(head)]
    for v in [b for b in OFI_VARIANTS if b in cols]:
        for label, key, in_place, per, med in rows:
            pv, po, pg = per[v], per.get("openmpi", [None] * rounds), per.get("gloo", [None] * rounds)
            if key == "busbw_gbps":
                met = sum(1 for i in range(rounds) if pv[i] and po[i] and pg[i] and single[i]
                          and pv[i] >= 2 * po[i] and pv[i] >= 3 * pg[i] and pv[i] >= 0.5 * single[i])
                mem = ratio(med[v], median(single))
            else:
                met = sum(1 for i in range(rounds) if pv[i] is not None and po[i] is not None and pv[i] <= po[i])
                mem = "-"
            lines.append(f"{LABEL[v] + ', ' + label:<52}{ratio(med[v], med.get('openmpi')):>9}"
                         f"{ratio(med[v], med.get('gloo')):>9}{mem:>10}{f'{met}/{rounds}':>10}")
        for in_place in (False, True):
            place = "in place" if in_place else "out of place"
            for what, nbytes, key in (("busbw", 64 * MiB, "busbw_gbps"), ("latency", 8, "time_us")):
                per_round = [ratio(value(k, v, nbytes, key, in_place), value(k, "openmpi", nbytes, key, in_place))
                             for k in ks]
                lines.append(f"  {LABEL[v]} / OMPI {what} ({place}) per round: " + ", ".join(per_round))
            per_round = [ratio(value(k, v, 64 * MiB, "busbw_gbps", in_place), single[k - 1]) for k in ks]
            lines.append(f"  {LABEL[v]} busbw / 1-core memcpy ({place}) per round: " + ", ".join(per_round))
            per_round = [ratio(value(k, v, 64 * MiB, "busbw_gbps", in_place), pair[k - 1]) for k in ks]
            lines.append(f"  {LABEL[v]} busbw / two-at-once memcpy ({place}) per round: " + ", ".join(per_round))
    lines.append("Goals met in a round: busbw >= 2x Open MPI, >= 3x gloo and >= 0.5x that round's 1-core "
                 "memcpy probe; latency <= Open MPI.")
    return lines


def plot(records, backends, ranks, ops, probe_gbps, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"plot skipped: matplotlib not importable ({e})"
    fig, axes = plt.subplots(len(ranks), len(ops), figsize=(4.2 * len(ops), 3.6 * len(ranks)), squeeze=False)
    for i, n in enumerate(ranks):
        for j, op in enumerate(ops):
            ax = axes[i][j]
            for b in backends:
                rs = sorted(find(records, b, op, n), key=lambda r: r["bytes"])
                if rs:
                    ax.plot([r["bytes"] for r in rs], [max(r["busbw_gbps"], 1e-6) for r in rs],
                            marker="o", markersize=3, label=LABEL[b], color=COLOR[b])
            if probe_gbps:
                ax.axhline(probe_gbps, linestyle="--", color="gray", label="memcpy, 1 core")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{op}, {n} ranks ({'in place' if IN_PLACE[op] else 'out of place'})", fontsize=9)
            ax.set_xlabel("size (bytes)", fontsize=8)
            ax.set_ylabel("busbw (GB/s)", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(True, which="major", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", ncol=len(labels), fontsize=9)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"plot: {path}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=str(REPO / "build"), help="CMake build directory (default: build)")
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    ap.add_argument("--log-dir", help="full output of every run (default: <build-dir>/bench/collectives-logs)")
    ap.add_argument("--ranks", default="2,4", help="comma-separated rank counts (default 2,4)")
    ap.add_argument("--backends", default=",".join(BACKENDS), help="subset of " + ",".join(BACKENDS))
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--quick", action="store_true",
                    help="sizes x4 (plus 8 B), 10 iterations, 256 MiB of traffic per size: a few minutes")
    ap.add_argument("--sizes", help="comma-separated sizes (bytes, or 1K/64M/...) instead of the default sweep")
    ap.add_argument("--iters", type=int)
    ap.add_argument("--warmup", type=int)
    ap.add_argument("--iter-budget", help="bytes of traffic per size and placement (e.g. 1G)")
    ap.add_argument("--timeout", type=int, help="seconds per mpirun (default 1200, --quick 600)")
    ap.add_argument("--goal-rounds", type=int, default=5,
                    help="interleaved rounds of the 2-rank goal rows after the sweep (Note [Goal rounds]; 0: none)")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--mpirun-args", default="--oversubscribe --bind-to none --mca btl self,vader,tcp "
                    "--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo",
                    help="flags for every mpirun (default: one host, loopback only)")
    a = ap.parse_args()

    def parse_size(t):
        t = t.strip().upper().removesuffix("IB").removesuffix("B")
        mult = {"K": 1 << 10, "M": MiB, "G": 1 << 30}
        return int(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else int(t)

    a.ranks = [int(x) for x in a.ranks.split(",") if x]
    a.backends = [b for b in a.backends.split(",") if b]
    a.ops = [o for o in a.ops.split(",") if o]
    for b in a.backends:
        if b not in BACKENDS:
            ap.error(f"unknown backend {b!r} (known: {', '.join(BACKENDS)})")
    if a.sizes:
        a.sizes = [parse_size(s) for s in a.sizes.split(",") if s]
    elif a.quick:
        a.sizes = [8] + [16 << (2 * k) for k in range(13)]  # 8, 16, 64, ..., 64 MiB, 256 MiB
    else:
        a.sizes = [8 << k for k in range(26)]                # 8 B .. 256 MiB, x2
    a.iters = a.iters or (10 if a.quick else 20)
    a.warmup = a.warmup if a.warmup is not None else (2 if a.quick else 5)
    a.iter_budget = parse_size(a.iter_budget) if a.iter_budget else (256 * MiB if a.quick else 1 << 30)
    a.timeout = a.timeout or (600 if a.quick else 1200)

    runner = Runner(a)
    load_start = os.getloadavg()[0]
    print(f"side-by-side collectives: ranks {a.ranks}, ops {', '.join(a.ops)}, {len(a.sizes)} sizes "
          f"{human(min(a.sizes))}..{human(max(a.sizes))}, up to {a.iters} iterations "
          f"(at most {human(a.iter_budget)} of traffic per size), f32 sum", flush=True)
    t_start = time.monotonic()
    probe = runner.probe()  # first, on a quiet machine
    pair_gbps = runner.probe_pair()
    backends = runner.available()
    for b, why in runner.skipped.items():
        print(f"skipping {b}: {why}", flush=True)

    records = []
    jobs = [(b, n) for n in a.ranks for b in backends]
    for i, (b, n) in enumerate(jobs, 1):
        records += runner.run_one(b, n, i, len(jobs))
    goal_records = []
    if a.goal_rounds > 0 and 2 in a.ranks and "all_reduce" in a.ops and backends:
        goal_records = runner.goal_rounds(backends, a.goal_rounds)

    out = Path(a.out_dir)
    probe_gbps = probe["gbps"] if probe else None
    doc = records + ([{"probe": "memcpy", "bytes": probe["bytes"], "runs": probe["runs"], "gbps": probe_gbps}]
                     if probe else [])
    if pair_gbps:
        doc.append({"probe": "memcpy", "concurrent": 2, "gbps": pair_gbps})
    doc += goal_records
    (out / "collectives.json").write_text(json.dumps(doc, indent=1) + "\n")

    cpus, load_end = os.cpu_count() or 1, os.getloadavg()[0]
    lines = [f"# Side-by-side collectives ({time.strftime('%Y-%m-%d %H:%M')}, {cpus} CPUs): "
             "time = median over iterations of the slowest rank's time per op; busbw as nccl-tests",
             f"memcpy probe, 1 core: {probe_gbps:.2f} GB/s" if probe else "memcpy probe: not measured",
             f"memcpy probe, two at once (one per core), the slower: {pair_gbps:.2f} GB/s" if pair_gbps
             else "memcpy probe, two at once: not measured",
             f"load average (1 min) {load_start:.1f} at the start, {load_end:.1f} at the end (which counts this "
             "run's own 4-rank jobs)"]
    if load_start > cpus / 2:
        lines.append(f"WARNING: other work kept the {cpus} CPUs busy when this run started; its numbers, above all "
                     "small-message times of ranks that poll, measure the scheduler more than the transports")
    lines += [f"skipped {b}: {why}" for b, why in runner.skipped.items()]
    lines += [f"FAILED {LABEL[b]} on {n} ranks: {why}" for b, n, why in runner.failed]
    ran = [b for b in BACKENDS if any(r["backend"] == b for r in records)]
    lines += side_by_side(records, ran, a.ranks, a.ops)
    if 2 in a.ranks and "all_reduce" in a.ops:
        lines += goal_table(records, probe_gbps, pair_gbps)
    if goal_records:
        lines += goal_rounds_table(goal_records, a.goal_rounds)
    total_wrong = sum(r["wrong"] for r in records + goal_records if r.get("wrong", -1) > 0)
    lines.append(f"\n#wrong over all runs: {total_wrong}{' OK' if total_wrong == 0 else ' FAILED'}; "
                 f"{len(records)} records; {time.monotonic() - t_start:.0f} s")
    lines.append(plot(records, ran, a.ranks, a.ops, probe_gbps, out / "collectives.png"))
    text = "\n".join(lines)
    print(text)
    (out / "collectives.txt").write_text(text + "\n")
    return 1 if total_wrong or runner.failed or not records else 0


if __name__ == "__main__":
    sys.exit(main())
