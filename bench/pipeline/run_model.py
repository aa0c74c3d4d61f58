#!/usr/bin/env python3
"""run_model.py — the pipeline schedules on the real model: GPipe, 1F1B,
interleaved 1F1B (v=2) and ZB-H1 training the byte-level GPT with GPTTrainer
(tp = dp = 1), for p = 2 and 4 pipeline ranks and m = 4, 8, 16 micro-batches.

    python3 bench/pipeline/run_model.py --build-dir build [--quick]
    python3 bench/pipeline/run.py --model --build-dir build [--quick]   # the same

It starts one `mpirun -np P torus-bench-pipeline-model` per P (bench/pipeline/
model_bench.cpp; its --help explains every column) and collects, per
(schedule, p, m): median step time and tokens/s, the measured bubble of the
real run against its theory (the schedule simulated with the mean measured
action times) and the replay of the step's real action durations, the peak
number of live micro-batches per stage, and the activation memory per stage,
measured by a counting CPU allocator (act/mb: bytes one forward leaves
allocated; act_peak = act/mb x peak live; mem_peak: peak bytes allocated
during the pipeline above its start). Outputs, in --out-dir (default
bench/results):

  pipeline_model.json  the records of torus-bench-pipeline-model --json, plus
                       the 1-minute load average before and after each mpirun
  pipeline_model.txt   the table printed at the end, with the checks
  pipeline_model.png   tokens/s against m per schedule, one panel per p; and
                       the activation memory per stage at the largest m

Exit status: 0 when every run succeeded and passed its checks (losses of all
schedules equal at each m, finite; peak live micro-batches as simulated;
every allocation counted), 1 otherwise. Timings are reported, not judged.
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
from run import COLOR, ORDER, mpirun_base  # the emulated-compute driver's conventions
MIB = float(1 << 20)


def load_average():
    try:
        return float(Path("/proc/loadavg").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def run_p(args, exe, p, out):
    json_path = out / f"pipeline_model_p{p}.json"
    cmd = mpirun_base(args, p) + ["-x", "TORUS_LOG_LEVEL=warn", str(exe),
                                  "--micro", args.micro, "--chunks", str(args.chunks),
                                  "--layers", str(args.layers), "--hidden", str(args.hidden),
                                  "--heads", str(args.heads), "--seq", str(args.seq),
                                  "--micro-rows", str(args.micro_rows),
                                  "--repeats", str(args.repeats), "--warmup", str(args.warmup),
                                  "--json", str(json_path)]
    print("$ " + " ".join(cmd), flush=True)
    before = load_average()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=args.timeout)
    after = load_average()
    print(proc.stdout, end="", flush=True)
    print(f"# load average (1 min): {before} before, {after} after", flush=True)
    if not json_path.exists():
        return None, f"p={p}: exit status {proc.returncode}, no records"
    records = json.loads(json_path.read_text())
    json_path.unlink()
    for r in records:
        r["load_before"], r["load_after"] = before, after
    # 2: some check failed (the records say which); anything else non-zero: an error.
    return records, None if proc.returncode == 0 else f"p={p}: exit status {proc.returncode}"


def mib(values, digits=1):
    return ",".join(f"{v / MIB:.{digits}f}" for v in values)


def table(records):
    head = (f"{'schedule':<12} {'p':>2} {'m':>3} {'v':>2} {'step_ms':>8} {'tok/s':>7} {'cpu':>5} {'bubble':>7} "
            f"{'theory':>7} {'replay':>7} {'closed':>7} {'err/rep':>7}  {'live':<12} {'act/mb MiB':<20} "
            f"{'act_peak MiB':<20} {'mem_peak MiB':<20} {'dloss':>7}")
    lines = [head]
    for r in sorted(records, key=lambda r: (r["p"], ORDER.index(r["schedule"]), r["m"])):
        cpu = sum(r["cpu_share_per_rank"]) / len(r["cpu_share_per_rank"])
        closed = "-" if r["bubble_closed_form"] is None else f"{r['bubble_closed_form']:.4f}"
        lines.append(f"{r['schedule']:<12} {r['p']:>2} {r['m']:>3} {r['v']:>2} {r['step_ms']:>8.1f} "
                     f"{r['tokens_per_s']:>7.0f} {cpu:>5.2f} {r['bubble']:>7.4f} {r['bubble_theory']:>7.4f} "
                     f"{r['bubble_replay']:>7.4f} {closed:>7} {100 * r['rel_err_replay']:>+6.1f}%  "
                     f"{','.join(map(str, r['peak_live'])):<12} {mib(r['act_bytes_per_micro'], 2):<20} "
                     f"{mib(r['act_peak_bytes']):<20} {mib(r['mem_peak_bytes']):<20} {r['loss_max_diff']:>7.1e}")
    r0 = records[0]
    lines.append(
        f"model: GPT {r0['layers']} layers, width {r0['hidden']}, {r0['heads']} heads, seq {r0['seq']}, vocab 256; "
        f"micro-batch {r0['micro_rows']} x {r0['seq']} tokens (global batch m x that); {r0['threads']} thread(s) "
        f"per rank; {r0['backend']} backend; {r0['warmup']} warm-up + {r0['repeats']} timed steps per configuration, "
        f"in rounds; the median step (by step time) is reported")
    loads = sorted({(r["p"], r["load_before"], r["load_after"]) for r in records})
    lines.append("machine load (1-minute load average) before/after each run: "
                 + ", ".join(f"p={p}: {b}/{a}" for p, b, a in loads))
    lines += [
        "step_ms: slowest rank's train_step (pipeline, clipping, AdamW); tok/s: global batch tokens / step_ms;",
        "cpu: process CPU time / step time, mean over ranks; bubble: 1 - busy / pipeline makespan, mean over ranks;",
        "theory: simulate() with the mean measured action times (uniform stages, no message time); replay:",
        "simulate() with every action's real duration; closed: closed form with those costs ('-': ZB-H1 with",
        "t_W > min(t_F, t_B), outside its range); err/rep: bubble vs replay; live: peak live micro-batches per",
        "stage (executor; (micro, chunk) pairs for interleaved); act/mb: bytes one forward leaves allocated",
        "(saved activations + output), per stage; act_peak = act/mb x live; mem_peak: peak bytes allocated",
        "during the pipeline above its start (counting CPU allocator; includes received inputs and op",
        "temporaries); dloss: max |loss - loss of gpipe at the same m| over all steps.",
    ]
    return lines


def checks(records):
    lines, failures = [], []
    for r in records:
        tag = f"{r['schedule']} p={r['p']} m={r['m']}"
        if r["peak_live"] != r["peak_live_theory"]:
            failures.append(f"{tag}: peak live {r['peak_live']} != simulated {r['peak_live_theory']}")
        if any(l != l or abs(l) == float("inf") for l in r["losses"]):
            failures.append(f"{tag}: a loss is not finite")
        if r["loss_max_diff"] > 1e-5:
            failures.append(f"{tag}: losses differ from the first schedule's by {r['loss_max_diff']:.2e}")
    worst = max(r["loss_max_diff"] for r in records)
    lines.append(f"check: losses of all schedules equal at each m over {len(records[0]['losses'])} steps "
                 f"(max difference {worst:.1e}, tolerance 1e-5)")
    lines.append("check: peak live micro-batches per stage equal to the simulated ones: "
                 + ("all" if not any("peak live" in f for f in failures) else "NOT all"))
    by = {(r["schedule"], r["p"], r["m"]): r for r in records}
    for p in sorted({r["p"] for r in records}):
        for m in sorted({r["m"] for r in records if r["p"] == p}):
            rs = [by[(s, p, m)] for s in ORDER if (s, p, m) in by]
            best = max(rs, key=lambda r: r["tokens_per_s"])
            lines.append(f"p={p} m={m:>2}: fastest {best['schedule']} ({best['tokens_per_s']:.0f} tok/s); "
                         "peak act memory, first stage: "
                         + ", ".join(f"{r['schedule']} {r['act_peak_bytes'][0] / MIB:.1f}" for r in rs) + " MiB")
    return lines, failures


def plot(records, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as e:  # noqa: BLE001 - any import failure means no plot
        return f"plot skipped: matplotlib not importable ({e})"
    ps = sorted({r["p"] for r in records})
    fig, axes = plt.subplots(2, len(ps), figsize=(6 * len(ps), 8.4), squeeze=False)
    for col, p in enumerate(ps):
        ax = axes[0][col]
        ms_all = sorted({r["m"] for r in records if r["p"] == p})
        for s in ORDER:
            rs = sorted((r for r in records if r["p"] == p and r["schedule"] == s), key=lambda r: r["m"])
            if not rs:
                continue
            label = s if s != "interleaved" else f"interleaved v={rs[0]['v']}"
            ax.plot([r["m"] for r in rs], [r["tokens_per_s"] for r in rs], "o-", color=COLOR[s], label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ms_all, [str(m) for m in ms_all])
        ax.set_xlabel("micro-batches m")
        ax.set_ylabel("tokens/s (median step)")
        ax.set_title(f"p = {p}: training throughput, real GPT", fontsize=10)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)

        ax = axes[1][col]
        m = max(ms_all)
        rs = [r for r in records if r["p"] == p and r["m"] == m]
        rs.sort(key=lambda r: ORDER.index(r["schedule"]))
        width = 0.8 / max(len(rs), 1)
        for i, r in enumerate(rs):
            xs = [st + (i - (len(rs) - 1) / 2) * width for st in range(p)]
            ax.bar(xs, [b / MIB for b in r["act_peak_bytes"]], width, color=COLOR[r["schedule"]],
                   label=f"{r['schedule']}: act/mb x peak live")
            ax.plot(xs, [b / MIB for b in r["mem_peak_bytes"]], "_", color="black", markersize=12,
                    markeredgewidth=2, label="peak allocated during the pipeline" if i == 0 else None)
        top = max(max(r["act_peak_bytes"] + r["mem_peak_bytes"]) for r in rs) / MIB
        ax.set_ylim(0, top * 1.4)  # room for the legend above the bars
        ax.set_xticks(range(p), [f"stage {st}" for st in range(p)])
        ax.set_ylabel("activation memory (MiB)")
        ax.set_title(f"p = {p}, m = {m}: peak activation memory per stage", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7, loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return f"plot: {path}"


def parser():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--build-dir", default=str(REPO / "build"))
    ap.add_argument("--out-dir", default=str(REPO / "bench" / "results"))
    ap.add_argument("--ranks", default="2,4", help="pipeline sizes p (default 2,4)")
    ap.add_argument("--micro", default="4,8,16", help="micro-batch counts m (default 4,8,16)")
    ap.add_argument("--chunks", type=int, default=2, help="v of the interleaved schedule (default 2)")
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--micro-rows", type=int, default=1, help="sequences per micro-batch (default 1)")
    ap.add_argument("--repeats", type=int, default=9, help="timed steps per configuration (default 9)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--quick", action="store_true", help="2 timed steps after 1 warm-up: a smoke run")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per mpirun")
    ap.add_argument("--mpirun", default="mpirun")
    ap.add_argument("--mpirun-args", default="--oversubscribe --bind-to none --mca btl self,vader,tcp "
                    "--mca btl_tcp_if_include lo --mca oob_tcp_if_include lo",
                    help="flags for every mpirun (default: one host, loopback only)")
    return ap


def main(argv=None):
    args = parser().parse_args(argv)
    if args.quick:
        args.repeats, args.warmup = 2, 1
    exe = Path(args.build_dir).resolve() / "bench" / "torus-bench-pipeline-model"
    if not exe.exists():
        sys.exit(f"{exe} not found: build the target torus_bench_pipeline_model first")
    out = Path(args.out_dir).resolve()
    out.mkdir(parents=True, exist_ok=True)
    records, failures = [], []
    for p in [int(x) for x in args.ranks.split(",")]:
        rs, err = run_p(args, exe, p, out)
        if err:
            failures.append(err)
        if rs:
            records += rs
    if not records:
        print("\n".join("FAILED: " + f for f in failures))
        return 1
    (out / "pipeline_model.json").write_text(json.dumps(records, indent=1) + "\n")
    check_lines, check_failures = checks(records)
    failures += check_failures
    lines = table(records) + [""] + check_lines
    if failures:
        lines += ["FAILED: " + f for f in failures]
    text = "\n".join(lines)
    print("\n" + text)
    (out / "pipeline_model.txt").write_text(text + "\n")
    print(plot(records, out / "pipeline_model.png"))
    print(f"json: {out / 'pipeline_model.json'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
