#!/usr/bin/env python3
"""torus-train --plan and torus-plan as an operator meets them.

- `mpirun -np 2 torus-train --plan` plans for this host, prints its choice
  before training, every rank applies it (the run's recorded options equal
  the printed layout, tp x pp x dp x ep = 2) and the loss falls.
- `--plan --plan-hardware h100-80gb` on 2 ranks (not whole 8-device nodes)
  fails on every rank with a clear error, no hang.
- `torus-plan --json` and `--evaluate` agree on the best layout; a plan
  with nothing that fits exits 3 and explains the smallest layout.

usage: plan_train_test.py TORUS_TRAIN TORUS_PLAN MPIEXEC [MPIEXEC_FLAGS...]
"""
import json
import os
import re
import subprocess
import sys
import tempfile


def check(cond, msg):
    if not cond:
        print("FAILED: " + msg)
        sys.exit(1)


def records(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    train, plan, mpiexec, flags = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    flags = flags + ["-x", "TORUS_LOG_LEVEL=info"]
    model = ["--model", "gpt2-tiny", "--batch", "8", "--seq", "64", "--threads", "1"]

    out = tempfile.mkdtemp(prefix="torus-plan-train-")
    cmd = [mpiexec] + flags + ["-np", "2", train] + model + [
        "--plan", "--steps", "12", "--lr", "3e-3", "--warmup", "2", "--progress", "off", "--no-tensorboard",
        "--out", out]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    text = r.stdout + r.stderr
    print(text[-3000:])
    check(r.returncode == 0, f"torus-train --plan failed ({r.returncode})")
    m = re.search(r"--plan chose: (.*)", text)
    check(m is not None, "no '--plan chose:' line in the log")
    chosen = m.group(1).strip()
    check("best:" in text, "the plan's table (with its best layout explained) was not logged")
    recs = records(os.path.join(out, "metrics.jsonl"))
    cfg = [x for x in recs if x.get("event") == "config"]
    check(len(cfg) == 1, f"expected one config record, got {len(cfg)}")
    o = cfg[0]["options"]
    check(o["tp"] * o["pp"] * o["dp"] * o["ep"] == 2, f"the applied layout is not 2 ranks: {o}")
    want = {"tp": o["tp"], "pp": o["pp"], "dp": o["dp"], "zero": o["zero"], "recompute": o["recompute"]}
    for k, v in want.items():
        check(f"{k}={v}" in chosen, f"the recorded option {k}={v} differs from the printed choice '{chosen}'")
    check(f"m={o['micro-batches']}" in chosen, f"micro-batches {o['micro-batches']} differ from '{chosen}'")
    check(not o["plan"], "the recorded options still say --plan (the choice must replace it)")
    steps = [x for x in recs if x.get("event") == "step"]
    check(len(steps) == 12, f"expected 12 step records, got {len(steps)}")
    check(steps[-1]["loss"] < steps[0]["loss"] - 0.2, f"the loss did not fall: {steps[0]['loss']} -> {steps[-1]['loss']}")

    # A preset whose nodes do not divide the world: a clear error on every rank.
    cmd = [mpiexec] + flags + ["-np", "2", train] + model + [
        "--plan", "--plan-hardware", "h100-80gb", "--steps", "1", "--progress", "off", "--no-tensorboard",
        "--out", tempfile.mkdtemp(prefix="torus-plan-bad-")]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    check(r.returncode != 0, "--plan-hardware h100-80gb on 2 ranks was accepted")
    check("not whole h100-80gb nodes of 8 devices" in r.stderr, f"unclear error: {r.stderr[-2000:]}")

    # torus-plan: JSON, then the best layout evaluated alone gives the same prediction.
    base = ["--hardware", "a100-80gb", "--nodes", "2", "--model", "gpt2-medium", "--global-batch", "64",
            "--seq", "1024", "--precision", "bf16"]
    r = subprocess.run([plan] + base + ["--json", "--top", "3"], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"torus-plan --json failed: {r.stderr}")
    j = json.loads(r.stdout)
    best = j["best"]
    check(best is not None and best["fits"], "no best layout for gpt2-medium on 16 x A100 80 GB")
    check(len(j["candidates"]) == 3, "--top 3 did not give 3 candidates")
    check(best["tp"] * best["pp"] * best["dp"] * best["ep"] == 16, f"best layout is not 16 devices: {best['layout']}")
    # The layout's own arguments (what torus-launch --plan passes on) say what its fields say.
    lay = best["args"]
    for key, flag in (("tp", "--tp"), ("pp", "--pp"), ("dp", "--dp"), ("ep", "--ep"), ("zero", "--zero"),
                      ("micro_batches", "--micro-batches"), ("schedule", "--schedule"), ("recompute", "--recompute")):
        check(flag in lay and lay[lay.index(flag) + 1] == str(best[key]), f"best.args {lay} disagrees on {key}")
    check(("--sp" in lay) == best["sp"] and ("--no-sp" in lay) != best["sp"], f"best.args {lay} disagrees on sp")
    r = subprocess.run([plan] + base + lay + ["--evaluate", "--json"], capture_output=True, text=True, timeout=120)
    check(r.returncode == 0, f"torus-plan --evaluate of the best layout failed: {r.stderr}")
    e = json.loads(r.stdout)["candidates"][0]
    check(abs(e["seconds"]["step"] - best["seconds"]["step"]) <= 1e-12 * best["seconds"]["step"],
          f"--evaluate predicts {e['seconds']['step']} s, the plan {best['seconds']['step']} s")
    check(e["memory_bytes"]["device"] == best["memory_bytes"]["device"], "--evaluate and the plan disagree on memory")

    # Nothing fits: exit 3, the smallest layout explained.
    r = subprocess.run([plan, "--hardware", "a100-40gb", "--nodes", "1", "--layers", "96", "--hidden", "12288",
                        "--heads", "96", "--global-batch", "8", "--seq", "2048", "--no-offload"],
                       capture_output=True, text=True, timeout=120)
    check(r.returncode == 3, f"a 175B model on 8 x 40 GB: exit {r.returncode}, expected 3\n{r.stdout}{r.stderr}")
    check("no layout fits" in r.stdout and "does not fit" in r.stdout, f"unclear report:\n{r.stdout[-2000:]}")

    # Bad options: exit 2 and a message.
    for bad, words in ((["--hardware", "tpu"], "unknown hardware 'tpu'"), (["--nodes", "0"], "--nodes"),
                       (["--search-zero", "x"], "--search-zero")):
        r = subprocess.run([plan] + bad, capture_output=True, text=True, timeout=60)
        check(r.returncode == 2 and words in r.stderr, f"{bad}: exit {r.returncode}: {r.stderr}")
    print("plan_train: all checks passed")


if __name__ == "__main__":
    main()
