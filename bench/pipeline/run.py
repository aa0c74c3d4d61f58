#!/usr/bin/env python3
"""run.py — the pipeline schedule benchmark: GPipe, 1F1B, interleaved 1F1B
(v=2) and ZB-H1 on the real executor with emulated stage compute, for p = 2
and 4 pipeline ranks and m = 4, 8, 16 micro-batches.

    python3 bench/pipeline/run.py --build-dir build [--quick]
    python3 bench/pipeline/run.py --model --build-dir build [--quick]

--model runs the schedules on the real model instead (run_model.py, which
takes the remaining options; see its --help): tokens/s, measured vs
theoretical bubble and activation memory per stage, written to
pipeline_model.{json,txt,png}. What follows is the emulated benchmark.

It starts one `mpirun -np P torus-bench-pipeline` per P (bench/pipeline/
main.cpp; every stage's compute is a fixed-duration sleep, so that 4 ranks fit
on 2 cores) and collects each schedule's measured bubble fraction against its
theory (the schedule simulated with the same costs) and closed form, and the
peak number of live activations per stage. Three theories: "theory" is the
schedule simulated with the nominal costs and zero communication time; "+lat"
adds the one-way message latency each run measures first (messages do take
time: ~0.2-0.3 ms here, which matters when a schedule's whole bubble is a few
tens of ms); "replay" simulates the schedule with the durations the emulated
compute really took in the reported step plus that latency — what is left
between it and the measurement is the idle time the executor itself added,
while theory vs replay is the machine's jitter.
Outputs, in --out-dir (default
bench/results):

  pipeline.json  records {schedule, p, m, v, t_*_ms, latency_ms, step_ms,
                 bubble, bubble_theory, bubble_theory_latency, bubble_replay,
                 bubble_closed_form, rel_err, rel_err_latency, rel_err_replay,
                 bubble_per_rank, peak_live, peak_live_theory, wrong, ...}
  pipeline.txt   the table printed at the end
  pipeline.png   bubble against m, measured (dots), theory (lines; dotted:
                 with latency) and replay (crosses), per p; and the peak
                 live activations of the first stage

Exit status: 0 when every run succeeded and verified its data, 1 otherwise.
Whether each bubble is within 10% of theory and ZB-H1 below 1F1B is printed,
not turned into the exit status (timing noise on a shared machine is not a
bug).
"""
import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
ORDER = ["gpipe", "1f1b", "interleaved", "zb-h1"]
COLOR = {"gpipe": "tab:gray", "1f1b": "tab:blue", "interleaved": "tab:green", "zb-h1": "tab:red"}


def mpirun_base(args, n):
    cmd = [shutil.which(args.mpirun) or args.mpirun, "-np", str(n)]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-run-as-root")
    return cmd + args.mpirun_args.split()


def run_p(args, exe, p, out):
    json_path = out / f"pipeline_p{p}.json"
    cmd = mpirun_base(args, p) + ["-x", "TORUS_LOG_LEVEL=warn", str(exe),
                                  "--micro", args.micro, "--chunks", str(args.chunks),
                                  "--t-forward", str(args.t), "--t-backward", str(args.t),
                                  "--t-weight", str(args.t), "--repeats", str(args.repeats),
                                  "--warmup", str(args.warmup), "--json", str(json_path)]
    print("$ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=args.timeout)
    print(proc.stdout, end="", flush=True)
    if proc.returncode != 0 or not json_path.exists():
        return None, f"p={p}: exit status {proc.returncode}"
    records = json.loads(json_path.read_text())
    json_path.unlink()
    return records, None


def table(records):
    lines = [f"{'schedule':<12} {'p':>2} {'m':>3} {'v':>2} {'step_ms':>9} {'bubble':>8} {'theory':>8} "
             f"{'+lat':>8} {'replay':>8} {'closed':>8} {'err':>7} {'err+lat':>7} {'err/rep':>7}  {'peak live/stage':<16} {'theory':<16}"]
    for r in sorted(records, key=lambda r: (r["p"], ORDER.index(r["schedule"]), r["m"])):
        lines.append(f"{r['schedule']:<12} {r['p']:>2} {r['m']:>3} {r['v']:>2} {r['step_ms']:>9.1f} "
                     f"{r['bubble']:>8.4f} {r['bubble_theory']:>8.4f} {r['bubble_theory_latency']:>8.4f} {r['bubble_replay']:>8.4f} "
                     f"{r['bubble_closed_form']:>8.4f} {100 * r['rel_err']:>+6.1f}% {100 * r['rel_err_latency']:>+6.1f}% "
                     f"{100 * r['rel_err_replay']:>+6.1f}%"
                     f"  {','.join(map(str, r['peak_live'])):<16} {','.join(map(str, r['peak_live_theory'])):<16}")
    lat = sorted({(r["p"], r["latency_ms"]) for r in records})
    lines.append("theory: simulated with the nominal costs, no communication time; +lat: with the measured "
                 "message latency (" + ", ".join(f"p={p}: {ms:.3f} ms" for p, ms in lat) + "); replay: with the "
                 "step's real action durations and that latency")
    return lines


def goals(records):
    lines = []
    for key, what in (("", "theory"), ("_latency", "theory with the measured latency"), ("_replay", "the replay")):
        within = [r for r in records if abs(r["rel_err" + key]) <= 0.10]
        lines.append(f"goal: measured bubble within 10% of {what}: {len(within)} of {len(records)} configurations")
        for r in records:
            if abs(r["rel_err" + key]) > 0.10:
                lines.append(f"  outside: {r['schedule']} p={r['p']} m={r['m']}: {r['bubble']:.4f} vs "
                             f"{r['bubble_theory' + key if key != '_replay' else 'bubble_replay']:.4f} "
                             f"({100 * r['rel_err' + key]:+.1f}%)")
    by = {(r["schedule"], r["p"], r["m"]): r for r in records}
    for (s, p, m), r in sorted(by.items()):
        if s != "zb-h1" or ("1f1b", p, m) not in by:
            continue
        f = by[("1f1b", p, m)]
        verdict = "below" if r["bubble"] < f["bubble"] else "NOT below"
        lines.append(f"goal: ZB-H1 {verdict} 1F1B at p={p} m={m}: {r['bubble']:.4f} vs {f['bubble']:.4f} "
                     f"({r['bubble'] / f['bubble']:.2f}x)")
    for r in records:
        if r["schedule"] == "1f1b" and max(r["peak_live"]) > r["p"]:
            lines.append(f"goal FAILED: 1F1B p={r['p']} m={r['m']} keeps {max(r['peak_live'])} > p live")
    one = [r for r in records if r["schedule"] == "1f1b"]
    if one and all(max(r["peak_live"]) <= r["p"] for r in one):
        lines.append("goal: 1F1B keeps at most p micro-batches of activations alive per stage")
    return lines


def plot(records, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 - any import failure means no plot
        return f"plot skipped: matplotlib not importable ({e})"
    ps = sorted({r["p"] for r in records})
    fig, axes = plt.subplots(1, len(ps) + 1, figsize=(5 * (len(ps) + 1), 4.2))
    for ax, p in zip(axes, ps):
        for s in ORDER:
            rs = sorted((r for r in records if r["p"] == p and r["schedule"] == s), key=lambda r: r["m"])
            if not rs:
                continue
            label = s if s != "interleaved" else f"interleaved v={rs[0]['v']}"
            ms = [r["m"] for r in rs]
            ax.plot(ms, [r["bubble_theory"] for r in rs], "-", color=COLOR[s], alpha=0.6)
            ax.plot(ms, [r["bubble_theory_latency"] for r in rs], ":", color=COLOR[s], alpha=0.6)
            ax.plot(ms, [r["bubble_replay"] for r in rs], "x", color=COLOR[s], alpha=0.8)
            ax.plot(ms, [r["bubble"] for r in rs], "o", color=COLOR[s], label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks([4, 8, 16], ["4", "8", "16"])
        ax.set_xlabel("micro-batches m")
        ax.set_ylabel("bubble fraction")
        ax.set_title(f"p = {p}: measured (dots), theory (lines; dotted: with\nmessage latency), replay of the step (crosses)", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend()
    ax = axes[-1]
    width = 0.8 / max(len(ps), 1)
    for i, p in enumerate(ps):
        rs = [r for r in records if r["p"] == p and r["m"] == max(x["m"] for x in records if x["p"] == p)]
        rs.sort(key=lambda r: ORDER.index(r["schedule"]))
        xs = [ORDER.index(r["schedule"]) + i * width for r in rs]
        ax.bar(xs, [r["peak_live"][0] / r["v"] for r in rs], width, label=f"p = {p}, m = {rs[0]['m']}")
    ax.set_xticks([k + width * (len(ps) - 1) / 2 for k in range(len(ORDER))], ORDER)
    ax.set_ylabel("peak live activations, first stage\n(micro-batch equivalents)")
    ax.set_title("activation memory")
    ax.legend()
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return f"plot: {path}"


def main():
    if "--model" in sys.argv[1:]:
        sys.path.insert(0, str(HERE))
        import run_model
        return run_model.main([a for a in sys.argv[1:] if a != "--model"])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=str(REPO / "build"))
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    ap.add_argument("--ranks", default="2,4", help="pipeline sizes p (default 2,4)")
    ap.add_argument("--micro", default="4,8,16", help="micro-batch counts m (default 4,8,16)")
    ap.add_argument("--chunks", type=int, default=2, help="v of the interleaved schedule (default 2)")
    ap.add_argument("--t", type=float, default=50.0, help="t_F = t_B = t_W in ms (default 50)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--quick", action="store_true", help="t = 5 ms, 1 timed step: a smoke run")
    ap.add_argument("--model", action="store_true",
                    help="run the real-model benchmark instead (run_model.py; the other options are its own)")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per mpirun")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--mpirun-args", default="--oversubscribe --bind-to none --mca btl self,vader,tcp "
                    "--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo",
                    help="flags for every mpirun (default: one host, loopback only)")
    args = ap.parse_args()
    if args.quick:
        args.t, args.repeats = 5.0, 1
    exe = Path(args.build_dir).resolve() / "bench" / "torus-bench-pipeline"
    if not exe.exists():
        sys.exit(f"{exe} not found: build the target torus_bench_pipeline first")
    out = Path(args.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    records, failures = [], []
    for p in [int(x) for x in args.ranks.split(",")]:
        rs, err = run_p(args, exe, p, out)
        if err:
            failures.append(err)
        else:
            records += rs
    failures += [f"{r['schedule']} p={r['p']} m={r['m']}: {r['wrong']} wrong elements"
                 for r in records if r["wrong"]]
    (out / "pipeline.json").write_text(json.dumps(records, indent=1) + "\n")
    lines = table(records) + [""] + goals(records)
    if failures:
        lines += ["FAILED: " + f for f in failures]
    text = "\n".join(lines)
    print("\n" + text)
    (out / "pipeline.txt").write_text(text + "\n")
    if records:
        print(plot(records, out / "pipeline.png"))
    print(f"json: {out / 'pipeline.json'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
