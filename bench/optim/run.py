#!/usr/bin/env python3
"""CPU Adam step throughput: Torus's kernel against torch.optim.AdamW
(foreach=True, fused=True) and DeepSpeed's CPU Adam, beside the memory
bandwidth limit, in one run.

    python3 bench/optim/run.py [--build build] [--threads 1,2] [--cases 1M,16M,64M,100x1M] [--json FILE]

1. Runs <build>/bench/torus-bench-cpu-adam: the copy bandwidth of 1 and 2
   cores (bench/common/membw.h) and Torus's kernel from C++.
2. For each thread count, a worker process (OMP_NUM_THREADS and
   torch.set_num_threads set to it, so that DeepSpeed's OpenMP loop gets the
   same count) times, on the same f32 tensors: Torus through its Python
   binding (torus.optim.cpu_adam_step), torch.optim.AdamW with foreach=True
   and with fused=True, and deepspeed.ops.adam.DeepSpeedCPUAdam (adamw_mode).
   Each is checked against torch's fused AdamW after one step from the same
   state before it is timed (a failure exits 1). When DeepSpeed's op cannot
   be built or imported, the table says why.
Numbers are medians of steps; ratios are against the bandwidth limit
(28 bytes per parameter per step) and against the other implementations.
Record a run with bench/record.py:  python3 bench/record.py cpu_adam -- python3 bench/optim/run.py
"""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
LR, BETAS, EPS, WD = 1e-3, (0.9, 0.999), 1e-8, 0.01
# Max relative difference from torch's fused AdamW after one step (per tensor, max |a - b| / max |b| over param,
# exp_avg, exp_avg_sq). DeepSpeed's kernel rounds further from torch (about 1e-5 measured here), hence its bound.
TOL = {"torus (py)": 1e-6, "torch foreach": 1e-6, "deepspeed": 1e-4}


def parse_case(s):
    def count(v):
        mult = {"M": 1 << 20, "K": 1024}.get(v[-1], 1)
        return int(v.rstrip("MK")) * mult
    if "x" in s:
        n, size = s.split("x")
        return s, int(n), count(size) // int(n)
    return s, 1, count(s)


def make_state(tensors, numel, seed):
    import torch
    g = torch.Generator().manual_seed(seed)
    p = [torch.randn(numel, generator=g) for _ in range(tensors)]
    grads = [torch.randn(numel, generator=g) for _ in range(tensors)]
    m = [torch.randn(numel, generator=g).mul_(0.01) for _ in range(tensors)]
    v = [torch.rand(numel, generator=g).mul_(0.01) for _ in range(tensors)]
    return p, grads, m, v


class TorusImpl:
    name = "torus (py)"

    def __init__(self, p, g, m, v):
        import torus.optim
        self.args, self.t, self.step_fn = (p, g, m, v), 0, torus.optim.cpu_adam_step

    def step(self):
        self.t += 1
        self.step_fn(*self.args, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, step=self.t)

    def state(self):
        return self.args[0], self.args[2], self.args[3]


class _TorchStylePeer:
    """A torch-style optimizer (self.opt over self.params): one step, and its state read back."""

    def step(self):
        import torch
        with torch.no_grad():
            self.opt.step()

    def state(self):
        return ([t.detach() for t in self.params], [self.opt.state[t]["exp_avg"] for t in self.params],
                [self.opt.state[t]["exp_avg_sq"] for t in self.params])


class TorchImpl(_TorchStylePeer):
    def __init__(self, p, g, m, v, fused):
        import torch
        self.name = "torch fused" if fused else "torch foreach"
        self.params = [t.requires_grad_() for t in p]
        for t, gr in zip(self.params, g):
            t.grad = gr
        self.opt = torch.optim.AdamW(self.params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD,
                                     foreach=not fused, fused=fused)
        for t, mm, vv in zip(self.params, m, v):  # start from the given moments
            self.opt.state[t] = {"step": torch.tensor(0.0), "exp_avg": mm, "exp_avg_sq": vv}


class DeepSpeedImpl(_TorchStylePeer):
    name = "deepspeed"

    def __init__(self, p, g, m, v):
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
        from deepspeed.ops.adam import DeepSpeedCPUAdam
        self.params = [t.requires_grad_() for t in p]
        for t, gr in zip(self.params, g):
            t.grad = gr
        self.opt = DeepSpeedCPUAdam(self.params, lr=LR, betas=BETAS, eps=EPS, weight_decay=WD, adamw_mode=True)
        import torch
        for t, mm, vv in zip(self.params, m, v):
            self.opt.state[t] = {"step": 0, "exp_avg": mm, "exp_avg_sq": vv}


def max_rel(a, b):
    worst = 0.0
    for xs, ys in zip(a, b):
        for x, y in zip(xs, ys):
            worst = max(worst, ((x - y).abs().max() / y.abs().max()).item())
    return worst


def time_impl(impl, min_seconds):
    for _ in range(2):
        impl.step()
    times, start = [], time.perf_counter()
    while len(times) < 5 or (time.perf_counter() - start < min_seconds and len(times) < 1000):
        t0 = time.perf_counter()
        impl.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), len(times)


def worker(args):
    """One thread count, every case and implementation; prints one JSON object."""
    import torch
    torch.set_num_threads(args.threads)
    rows, notes = [], {}
    factories = {"torus (py)": TorusImpl, "torch foreach": lambda *s: TorchImpl(*s, fused=False),
                 "torch fused": lambda *s: TorchImpl(*s, fused=True), "deepspeed": DeepSpeedImpl}
    for case in args.cases.split(","):
        name, tensors, numel = parse_case(case)
        # The reference: torch's fused AdamW, one step from seed 1's state.
        ref = factories["torch fused"](*make_state(tensors, numel, 1))
        ref.step()
        ref_state = ref.state()
        del ref
        for impl_name, make in factories.items():
            if impl_name in notes:
                continue
            try:
                impl = make(*make_state(tensors, numel, 1))
            except Exception as e:  # DeepSpeed's JIT op build or import
                notes[impl_name] = f"{type(e).__name__}: {e}".strip().splitlines()[0][:300]
                continue
            impl.step()
            err = 0.0 if impl_name == "torch fused" else max_rel(impl.state(), ref_state)
            if err > TOL.get(impl_name, 0.0) and impl_name != "torch fused":
                print(f"verification failed: {impl_name} {name} {args.threads} threads: {err:.3g} relative to torch "
                      f"fused AdamW (tolerance {TOL[impl_name]})", file=sys.stderr)
                sys.exit(1)
            del impl
            impl = make(*make_state(tensors, numel, 2))
            sec, runs = time_impl(impl, args.min_seconds)
            del impl
            rows.append(dict(case=name, tensors=tensors, params=tensors * numel, threads=args.threads,
                             impl=impl_name, median_s=sec, runs=runs, params_per_s=tensors * numel / sec,
                             max_rel_err_vs_torch_fused=err))
    print(json.dumps(dict(rows=rows, notes=notes, torch=torch.__version__)))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cases", default="1M,16M,64M,100x1M")
    ap.add_argument("--min-seconds", type=float, default=1.0)
    ap.add_argument("--json")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        args.threads = int(args.threads)
        return worker(args)

    build = pathlib.Path(args.build)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(build / "python"), os.environ.get("PYTHONPATH", "")]),
               DS_ACCELERATOR="cpu", TORUS_LOG_LEVEL="warn")
    with tempfile.TemporaryDirectory() as tmp:
        cjson = os.path.join(tmp, "cpp.json")
        r = subprocess.run([str(build / "bench" / "torus-bench-cpu-adam"), "--threads", args.threads, "--cases",
                            args.cases, "--min-seconds", str(args.min_seconds), "--json", cjson],
                           capture_output=True, text=True, env=env)
        if r.returncode != 0:
            sys.stderr.write(r.stdout + r.stderr)
            return r.returncode
        cpp = json.load(open(cjson))
    rows, notes, versions = list(cpp["rows"]), {}, {}
    for t in args.threads.split(","):
        r = subprocess.run([sys.executable, __file__, "--worker", "--threads", t, "--cases", args.cases,
                            "--min-seconds", str(args.min_seconds)], capture_output=True, text=True,
                           env=dict(env, OMP_NUM_THREADS=t))
        if r.returncode != 0:
            sys.stderr.write(r.stdout + r.stderr)
            return r.returncode
        w = json.loads(r.stdout.strip().splitlines()[-1])
        rows += w["rows"]
        notes.update(w["notes"])
        versions["torch"] = w["torch"]
    try:
        import importlib.metadata as md
        versions["deepspeed"] = md.version("deepspeed")
    except Exception:
        versions["deepspeed"] = "not installed"

    bw = {int(k): v for k, v in cpp["bandwidth_gbps"].items()}
    print(f"# CPU Adam: one AdamW step over f32 param/grad/exp_avg/exp_avg_sq; Torus ISA {cpp['isa']}; "
          f"torch {versions['torch']}; deepspeed {versions['deepspeed']}")
    for t, g in sorted(bw.items()):
        print(f"# bandwidth limit, {t} thread(s): memcpy traffic {g:.2f} GB/s / 28 B per param = "
              f"{g * 1e9 / 28 / 1e6:.1f} Mparam/s")
    print("# Mparam/s (median step); x_limit = rate / bandwidth limit; x_ds, x_fused = Torus (C++) / DeepSpeed, "
          "/ torch fused")
    impls = ["torus (C++)", "torus (py)", "torch foreach", "torch fused", "deepspeed"]
    head = f"{'case':>9} {'thr':>3} " + " ".join(f"{i:>13}" for i in impls) + f" {'limit':>8} {'x_limit':>7} " \
           f"{'x_ds':>6} {'x_fused':>7}"
    print(head)
    summary = []
    for case in args.cases.split(","):
        for t in (int(x) for x in args.threads.split(",")):
            by = {r["impl"]: r for r in rows if r["case"] == case and r["threads"] == t}
            rate = {i: by[i]["params_per_s"] / 1e6 for i in impls if i in by}
            limit = bw[t] * 1e9 / 28 / 1e6
            tor = rate["torus (C++)"]
            x_ds = tor / rate["deepspeed"] if "deepspeed" in rate else None
            x_fused = tor / rate["torch fused"]
            summary.append(dict(case=case, threads=t, limit_mparams_per_s=limit, x_limit=tor / limit, x_ds=x_ds,
                                x_fused=x_fused))
            cells = " ".join(f"{rate[i]:>13.1f}" if i in rate else f"{'n/a':>13}" for i in impls)
            print(f"{case:>9} {t:>3} {cells} {limit:>8.1f} {tor / limit:>7.2f} "
                  f"{(f'{x_ds:.2f}' if x_ds else 'n/a'):>6} {x_fused:>7.2f}")
    for impl, why in notes.items():
        print(f"# {impl}: not measured: {why}")
    goals = [("x_limit", 0.8), ("x_ds", 1.0), ("x_fused", 1.5)]
    for key, goal in goals:
        vals = [s[key] for s in summary if s[key] is not None]
        met = [f"{s['case']}/{s['threads']}t" for s in summary if s[key] is not None and s[key] >= goal]
        print(f"# goal {key} >= {goal}: met in {len(met)} of {len(vals)} rows"
              + (f" (min {min(vals):.2f}, max {max(vals):.2f})" if vals else ""))
    if args.json:
        json.dump(dict(isa=cpp["isa"], bandwidth_gbps=cpp["bandwidth_gbps"], versions=versions, rows=rows,
                       summary=summary, notes=notes), open(args.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
