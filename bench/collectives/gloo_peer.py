#!/usr/bin/env python3
"""gloo_peer.py — the collective benchmark on torch.distributed with the gloo
backend, the Python peer of torus-bench-comm in bench/collectives/run.py.

    MASTER_PORT=29500 mpirun -np 2 -x MASTER_PORT python3 gloo_peer.py -b 8 -e 256M --json gloo.json

Rank and world size come from RANK/WORLD_SIZE, else from Open MPI's
OMPI_COMM_WORLD_RANK/SIZE; MASTER_ADDR defaults to 127.0.0.1 and MASTER_PORT
must be set. f32 and sum only.

It restates the rules of bench/common (sweep.h, pattern.h, report.h) so that
its numbers line up with the C++ tools: the same sizes and element counts,
the same data pattern and closed-form checks (#wrong), the median over
iterations of the slowest rank's time, the same JSON records with backend
"gloo". Placements are torch's own: all_reduce, broadcast and reduce work in
place; reduce_scatter_tensor, all_gather_into_tensor and all_to_all_single
out of place. An op gloo does not serve is skipped with a note.
"""
import argparse
import json
import os
import statistics
import sys
import time

OPS = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce"]
IN_PLACE_OPS = {"all_reduce", "broadcast", "reduce"}


def parse_size(text):
    """'8', '1K', '256M', '1GiB' -> bytes (powers of 1024), as sweep.h."""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    if t and t[-1] in mult:
        return int(t[:-1]) * mult[t[-1]]
    return int(t)


def size_sweep(lo, hi, factor):
    sizes, s = [], float(lo)
    while s <= hi * (1 + 1e-9):
        sizes.append(int(round(s)))
        s *= factor
    return sizes


def op_count(op, nbytes, elt, n):
    count = max(nbytes // elt, 1)
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        count = max(count // n * n, n)
    return count


def busbw_factor(op, n):
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("reduce_scatter", "all_gather", "all_to_all"):
        return (n - 1) / n
    return 1.0


def iterations_for(nbytes, iters, budget):
    return max(3, min(iters, budget // max(nbytes, 1)))


def warmup_for(nbytes, warmup, budget):
    return 0 if warmup == 0 else max(1, min(warmup, budget // 4 // max(nbytes, 1)))


class Pattern:
    """value(src, dst, i) = (7 src + 5 dst + 3 (i mod m) + 1) mod m (pattern.h)."""

    def __init__(self, n):
        self.m = min(max((1 << 24) // n, 2), 1021)  # f32
        self.n = n

    def table(self, src, dst):
        return [(7 * src + 5 * dst + 3 * k + 1) % self.m for k in range(self.m)]

    def sum_table(self):
        return [sum((7 * s + 3 * k + 1) % self.m for s in range(self.n)) for k in range(self.m)]


def tiled(torch, table, first, count):
    """A float32 tensor t with t[i] = table[(first + i) mod m], i < count."""
    m = len(table)
    t = torch.tensor(table, dtype=torch.float32)
    t = torch.roll(t, -(first % m))
    reps = (count + m - 1) // m
    return t.repeat(reps)[:count].clone()


class Case:
    """One op at one size: buffers, data, the torch.distributed call, the check."""

    def __init__(self, torch, dist, op, nbytes, rank, n):
        self.torch, self.dist, self.op, self.rank, self.n = torch, dist, op, rank, n
        self.count = op_count(op, nbytes, 4, n)
        self.block = self.count // n if op in ("reduce_scatter", "all_gather", "all_to_all") else self.count
        self.p = Pattern(n)
        in_len = {"all_gather": self.block, "broadcast": 0}.get(op, self.count)
        out_len = self.block if op == "reduce_scatter" else self.count
        self.inp = torch.empty(in_len, dtype=torch.float32)
        self.out = torch.empty(out_len, dtype=torch.float32)

    def prepare(self):
        torch, r = self.torch, self.rank
        self.out.fill_(float("nan"))
        if self.op == "all_to_all":
            for d in range(self.n):
                self.inp[d * self.block:(d + 1) * self.block] = tiled(torch, self.p.table(r, d), 0, self.block)
        elif self.op in IN_PLACE_OPS:
            self.out.copy_(tiled(torch, self.p.table(r, 0), 0, self.count))
        else:
            self.inp.copy_(tiled(torch, self.p.table(r, 0), 0, self.inp.numel()))

    def issue(self):
        dist = self.dist
        if self.op == "all_reduce":
            dist.all_reduce(self.out)
        elif self.op == "reduce_scatter":
            dist.reduce_scatter_tensor(self.out, self.inp)
        elif self.op == "all_gather":
            dist.all_gather_into_tensor(self.out, self.inp)
        elif self.op == "all_to_all":
            dist.all_to_all_single(self.out, self.inp)
        elif self.op == "broadcast":
            dist.broadcast(self.out, 0)
        elif self.op == "reduce":
            dist.reduce(self.out, 0)

    def wrong(self):
        torch, r, b = self.torch, self.rank, self.block
        if self.op == "all_reduce" or (self.op == "reduce" and r == 0):
            expected = tiled(torch, self.p.sum_table(), 0, self.count)
        elif self.op == "reduce":
            return 0
        elif self.op == "reduce_scatter":
            expected = tiled(torch, self.p.sum_table(), r * b, b)
        elif self.op == "broadcast":
            expected = tiled(torch, self.p.table(0, 0), 0, self.count)
        else:
            dst = 0 if self.op == "all_gather" else r
            expected = torch.cat([tiled(torch, self.p.table(s, dst), 0, b) for s in range(self.n)])
        return int((self.out != expected).sum().item())


def measure(case, args, n, dist, torch):
    nbytes = case.count * 4
    iters = iterations_for(nbytes, args.iters, args.iter_budget)
    case.prepare()
    dist.barrier()
    for _ in range(warmup_for(nbytes, args.warmup, args.iter_budget)):
        case.issue()
    dist.barrier()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        case.issue()
        times.append((time.perf_counter() - t0) * 1e6)
    t = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    time_us = statistics.median(t.tolist())
    wrong = -1
    if args.check:
        case.prepare()
        case.issue()
        w = torch.tensor([case.wrong()], dtype=torch.float64)
        dist.all_reduce(w)
        wrong = int(w.item())
    algbw = nbytes / (time_us * 1e-6) / 1e9 if time_us > 0 else 0.0
    return {"backend": "gloo", "op": case.op, "ranks": n, "bytes": nbytes, "count": case.count, "dtype": "f32",
            "redop": "sum" if case.op in ("all_reduce", "reduce_scatter", "reduce") else "none",
            "root": 0 if case.op in ("broadcast", "reduce") else -1, "in_place": case.op in IN_PLACE_OPS,
            "iters": iters, "time_us": time_us, "algbw_gbps": algbw, "busbw_gbps": algbw * busbw_factor(case.op, n),
            "wrong": wrong}


def print_row(rec):
    cells = f"  {rec['time_us']:9.2f}  {rec['algbw_gbps']:7.2f}  {rec['busbw_gbps']:7.2f}  " + \
        (f"{rec['wrong']:6d}" if rec["wrong"] >= 0 else f"{'N/A':>6}")
    na = f"  {'N/A':>9}  {'N/A':>7}  {'N/A':>7}  {'N/A':>6}"
    oop, ip = (na, cells) if rec["in_place"] else (cells, na)
    print(f" {rec['bytes']:11d}  {rec['count']:12d}  {'f32':>6}  {rec['redop']:>6}  {rec['root']:5d}{oop}{ip}"
          f"  {rec['iters']:5d}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-b", "--minbytes", type=parse_size, default=8)
    ap.add_argument("-e", "--maxbytes", type=parse_size, default=256 << 20)
    ap.add_argument("-f", "--stepfactor", type=float, default=2.0)
    ap.add_argument("--sizes", help="comma-separated sizes instead of -b/-e/-f")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("-n", "--iters", type=int, default=20)
    ap.add_argument("-w", "--warmup", type=int, default=5)
    ap.add_argument("--settle-ms", type=float, default=200.0,
                    help="before the sweep, small all-reduces back to back for this long (default 200)")
    ap.add_argument("--iter-budget", type=parse_size, default=1 << 30)
    ap.add_argument("--check", dest="check", action="store_true", default=True)
    ap.add_argument("--no-check", dest="check", action="store_false")
    ap.add_argument("--no-probe", action="store_true", help="accepted for symmetry; this peer has no probe")
    ap.add_argument("--json")
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s] if args.sizes else \
        size_sweep(args.minbytes, args.maxbytes, args.stepfactor)
    ops = [o for o in args.ops.split(",") if o]
    for op in ops:
        if op not in OPS:
            ap.error(f"unknown op {op!r}")

    env = os.environ
    env.setdefault("RANK", env.get("OMPI_COMM_WORLD_RANK", "0"))
    env.setdefault("WORLD_SIZE", env.get("OMPI_COMM_WORLD_SIZE", "1"))
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    if env["MASTER_ADDR"] in ("127.0.0.1", "localhost"):
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    if "MASTER_PORT" not in env:
        sys.exit("gloo_peer.py: set MASTER_PORT (and pass it to every rank, e.g. mpirun -x MASTER_PORT)")

    import torch
    import torch.distributed as dist
    torch.set_num_threads(1)  # the ranks share the host's cores; gloo has its own threads
    dist.init_process_group("gloo", init_method="env://")
    rank, n = dist.get_rank(), dist.get_world_size()
    leader = rank == 0
    if leader:
        print(f"# gloo_peer.py: torch.distributed {torch.__version__} gloo, {n} ranks, dtype f32, redop sum")
        print(f"# time: MEDIAN over iterations of the slowest rank's time for one op (us); up to {args.iters} "
              f"iterations per size (no more than {args.iter_budget} B of traffic, at least 3) after "
              f"{args.warmup} warm-up")
        print("# algbw = size / time; busbw = algbw * factor (bench/README.md); 1 GB = 1e9 B", flush=True)

    # As torus-bench-comm --settle-ms: let the scheduler spread the ranks first.
    end = time.perf_counter() + args.settle_ms / 1e3
    go = torch.ones(1)
    while go.item() > 0:
        go.fill_(1.0 if leader and time.perf_counter() < end else 0.0)
        dist.all_reduce(go, op=dist.ReduceOp.MAX)

    records = []
    for index, op in enumerate(ops, 1):
        if leader:
            print(f"#\n# [{index}/{len(ops)}] {op} ({'in place' if op in IN_PLACE_OPS else 'out of place'})")
            print(f"#{'size':>11}  {'count':>12}  {'type':>6}  {'redop':>6}  {'root':>5}" +
                  f"  {'time':>9}  {'algbw':>7}  {'busbw':>7}  {'#wrong':>6}" * 2 + f"  {'iters':>5}", flush=True)
        for nbytes in sizes:
            case = Case(torch, dist, op, nbytes, rank, n)
            try:
                rec = measure(case, args, n, dist, torch)
            except (RuntimeError, NotImplementedError, ValueError) as e:
                # Raised by every rank alike before communicating (an op gloo lacks).
                if leader:
                    print(f"# skipped {op}: {str(e).splitlines()[0]}", flush=True)
                break
            records.append(rec)
            if leader:
                print_row(rec)

    if leader:
        wrong = sum(r["wrong"] for r in records if r["wrong"] > 0)
        avg = statistics.mean(r["busbw_gbps"] for r in records) if records else 0.0
        print(f"#\n# Out of bounds values : {'0 OK' if wrong == 0 else str(wrong) + ' FAILED'}")
        print(f"# Avg bus bandwidth    : {avg:.3f} GB/s", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(records, f, indent=1)
    dist.barrier()
    dist.destroy_process_group()
    return 0 if all(r["wrong"] <= 0 for r in records) else 2


if __name__ == "__main__":
    sys.exit(main())
