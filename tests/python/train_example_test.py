#!/usr/bin/env python3
"""examples/python/train_gpt.py as a user meets it: --help, a bad flag, and a
short PP=2 run on 2 ranks (under mpirun) with a config file, whose log lines,
JSONL metrics, TensorBoard file and plot are checked; then torus-train with
the same options, whose metrics records must equal the Python run's apart
from times (one loop, one option table).

usage: train_example_test.py PYTHON PYTHON_PACKAGE_DIR TORUS_TRAIN MPIEXEC [MPIEXEC_FLAGS...]
"""
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "examples" / "python" / "train_gpt.py"


def check(cond, msg):
    if not cond:
        print("FAILED: " + msg)
        sys.exit(1)


def main():
    py, pkg, exe, mpiexec, flags = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
    env = dict(os.environ, PYTHONPATH=pkg + (os.pathsep + os.environ["PYTHONPATH"] if "PYTHONPATH" in os.environ else ""),
               TORUS_LOG_LEVEL="warn")

    h = subprocess.run([py, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=120, env=env)
    check(h.returncode == 0, f"--help exited {h.returncode}: {h.stderr}")
    for opt in ("--tp", "--pp", "--dp", "--sp", "--schedule", "--micro-batches", "--chunks", "--stage-layers",
                "--layers", "--hidden", "--heads", "--ffn", "--seq", "--dropout", "--precision", "--recompute",
                "--optimizer", "--steps", "--batch",
                "--lr", "--min-lr", "--warmup", "--weight-decay", "--grad-clip", "--seed", "--data", "--val-fraction",
                "--eval-interval", "--eval-batches", "--out", "--log-interval", "--progress", "--config"):
        check(opt in h.stdout, f"--help does not list {opt}")
    r = subprocess.run([py, str(SCRIPT), "--precision", "f8"], capture_output=True, text=True, timeout=120, env=env)
    check(r.returncode == 2 and "--precision" in r.stderr, f"--precision f8: exit {r.returncode}: {r.stderr}")

    out = tempfile.mkdtemp(prefix="train-gpt-example-")
    cfg = os.path.join(out, "run.cfg")
    with open(cfg, "w") as f:
        f.write("# flags override this file\nlayers = 2\nhidden = 32\nheads = 4\nseq = 32\nsteps = 999\n")
    steps = 8
    run_flags = ["--config", cfg, "--pp", "2", "--batch", "8", "--micro-batches", "2", "--steps", str(steps),
                 "--warmup", "2", "--lr", "3e-3", "--eval-interval", "4", "--threads", "1", "--progress", "off",
                 "--peak-tflops", "1"]
    cmd = [mpiexec] + flags + ["-x", "PYTHONPATH=" + env["PYTHONPATH"], "-np", "2", py, str(SCRIPT)] + run_flags + [
        "--out", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=500, env=env)
    print(r.stdout[-3000:])
    check(r.returncode == 0, f"the run failed ({r.returncode}):\n{r.stderr[-4000:]}")
    step_lines = [l for l in r.stdout.splitlines() if l.startswith("step ")]
    check(len(step_lines) == steps, f"expected {steps} step lines (one per step), got {len(step_lines)}")
    pat = re.compile(r"^step \d+ \| loss [\d.]+ (\| val [\d.]+ )?\| grad_norm [\d.e-]+ \| lr [\d.e+-]+ \| [\d.]+ tok/s "
                     r"\| MFU [\d.]+% \| mem [\d.]+ [KMG]iB$")
    for l in step_lines:
        check(pat.match(l), f"step line not in the documented format: {l!r}")
    check(sum(" | val " in l for l in step_lines) == 2, "validation loss expected at steps 4 and 8")
    check("stage 0: embedding + block 0" in r.stdout and "stage 1: block 1 + head" in r.stdout,
          "the stage cut is not reported")

    recs = [json.loads(l) for l in open(os.path.join(out, "metrics.jsonl"))]
    check(recs[0]["event"] == "config" and recs[0]["options"]["layers"] == 2 and recs[0]["options"]["steps"] == steps,
          "config record: the config file or the flag override was not applied")
    check(recs[0]["layout"] == "tp=1 pp=2 dp=1, 1f1b, m=2", f"layout {recs[0]['layout']!r}")
    step_recs = [x for x in recs if x.get("event") == "step"]
    check([x["step"] for x in step_recs] == list(range(1, steps + 1)), "one JSON record per step")
    check(abs(step_recs[0]["loss"] - 5.545) < 0.3, f"first loss {step_recs[0]['loss']} is not near ln(256) = 5.545")
    check(step_recs[-1]["loss"] < step_recs[0]["loss"], "the loss did not fall")
    check(step_recs[0]["val_loss"] is None and step_recs[3]["val_loss"] is not None, "val_loss placement")
    check(recs[-1]["event"] == "end", "no end record")

    png = open(os.path.join(out, "loss.png"), "rb").read()
    check(png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000, "loss.png is not a PNG")
    tb = [f for f in os.listdir(os.path.join(out, "tb")) if f.startswith("events.out.tfevents.")]
    check(len(tb) == 1 and os.path.getsize(os.path.join(out, "tb", tb[0])) > 100, f"no TensorBoard event file: {tb}")

    # torus-train with the same options: the same records, apart from times.
    out_cpp = tempfile.mkdtemp(prefix="torus-train-parity-")
    r = subprocess.run([mpiexec] + flags + ["-np", "2", exe] + run_flags + ["--out", out_cpp], capture_output=True,
                       text=True, timeout=500, env=env)
    check(r.returncode == 0, f"torus-train failed ({r.returncode}):\n{r.stderr[-4000:]}")
    cpp = [json.loads(l) for l in open(os.path.join(out_cpp, "metrics.jsonl"))]
    timing = {"tokens_per_s", "mfu", "step_s", "pipeline_s", "sync_s", "wall_s", "mem_bytes", "peak_rss_bytes",
              "job_peak_rss_bytes", "data_s", "data_fraction"}

    def strip(rec):
        rec = {k: v for k, v in rec.items() if k not in timing}
        if rec.get("event") == "config":
            rec["options"] = {k: v for k, v in rec["options"].items() if k != "out"}
        return rec

    check(len(cpp) == len(recs), f"{len(cpp)} records from torus-train, {len(recs)} from Python")
    for a, b in zip(recs, cpp):
        check(strip(a) == strip(b), f"records differ:\n  python: {strip(a)}\n  c++:    {strip(b)}")
    print(f"ok: {steps} steps on 2 ranks (pp=2), loss {step_recs[0]['loss']:.3f} -> {step_recs[-1]['loss']:.3f}; "
          f"metrics, TensorBoard and plot written; torus-train wrote the same {len(cpp)} records")


if __name__ == "__main__":
    main()
