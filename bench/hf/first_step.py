#!/usr/bin/env python3
"""Time to first step from Hugging Face weights: torus-train on 4 ranks against transformers.

    python3 bench/hf/first_step.py [--size tiny|125m|1b] [--dtype f32|bf16] [--repeats N]
                                   [--layout OPTIONS] [--model-dir DIR] [--cache warm|cold] [--json FILE]
    python3 bench/record.py hf_first_step_1b -- python3 bench/hf/first_step.py --size 1b

Set-up (not timed): a Llama of the --size preset is created by transformers with random weights
(seed 0, the config's initializer_range) and written with save_pretrained(..., safe_serialization=True)
in --dtype (config.json + model.safetensors) to --model-dir (default <tmp>/torus-hf-first-step/SIZE-DTYPE),
where later runs reuse it. Presets (untied embeddings, vocabulary 32000, SwiGLU, GQA):

  tiny  2 layers,  width 64,   4 heads (2 kv),   ffn 128:   4,170,048 parameters (seconds; for testing)
  125m  12 layers, width 768,  12 heads (4 kv),  ffn 2048:  124,668,672 parameters
  1b    22 layers, width 2048, 32 heads (4 kv),  ffn 5632:  1,100,048,384 (TinyLlama 1.1B's shape; the default)

Then --repeats rounds (default 3), each running the two sides one after the other, each in
processes of its own started by this program, with the model's files in the page cache (read through
once before every run; --cache cold drops their pages instead, posix_fadvise(DONTNEED)):

  torus         mpirun -np 4 torus-train --model DIR --init-from DIR --steps 1 LAYOUT --precision DTYPE
                --batch B --seq S --eval-batches 1 --peak-tflops 1 --no-tensorboard --progress off
                (LAYOUT: --layout, by default --tp 4 --micro-batches 1; tiny, whose 2 kv heads do not
                split 4 ways: --tp 2 --pp 2 --micro-batches 2; B = 4, S = 64 unless --batch, --seq).
                The model is built from config.json and every rank copies only its slices of the
                memory-mapped model.safetensors (docs/hf.md); data: the built-in byte corpus (token ids
                0-255 of the 32000). Times, from the launch of mpirun (this program's clock):
                  up, bootstrap  the wall-clock stamps of rank 0's first log line (its processes and
                              libraries loaded) and of its bootstrap line (the communicator up), left out
                              unless they fall between the launch and `ready`;
                  ready       the `config` record appears in <out>/metrics.jsonl (polled every 5 ms): the
                              job is launched, the model built, the weights loaded, the engine ready (on
                              the logging rank, the last pipeline stage's);
                  build+load  rank 0's log, from its memory-estimate line to its "init: model weights" line:
                              the data, the Trainer (its parameters initialised) and load_hf_weights;
                  step        the first step's step_s (forward, backward, clipping, AdamW);
                  first step  ready + the step record's data_s + step_s: the end of the first step (the
                              step record itself is written after the one validation batch the last step
                              evaluates);
                  exit        mpirun returns.
                --peak-tflops 1 skips the CPU peak probe (about 1 s of GEMMs before the first step, for
                the MFU column only); MFU is not reported.
  transformers  python3 (this file, in a fresh process): import torch and transformers,
                AutoModelForCausalLM.from_pretrained(DIR, dtype=DTYPE), then one step on a batch of the same
                shape (B sequences of S + 1 token ids drawn uniformly from 0-255, seed 0; inputs the first S,
                labels the last S): forward, cross-entropy of the logits, backward,
                clip_grad_norm_(1.0), torch.optim.AdamW(lr 1e-3, betas (0.9, 0.95), eps 1e-8,
                weight_decay 0.1).step(). Times from the launch: imports, from_pretrained, step, first
                step (the end of the step), exit. transformers 5's from_pretrained leaves the parameters
                in a copy-on-write mapping of model.safetensors, so most of the reading happens in the
                first step (page faults, then AdamW's writes copy the pages): from_pretrained's time alone
                is not a whole load, the end of the first step is the comparable figure.

Memory: peak resident memory (VmHWM): torus-train's job_peak_rss_bytes (every rank's peak summed: pages of
the mapped file a rank touched count in its RSS), and the transformers process's own. Both sides hold the
same state in f32 (parameters, gradients, two AdamW moments: 16 bytes per parameter); in bf16 Torus keeps
f32 masters and moments (about 18 bytes per parameter), torch.optim.AdamW bf16 moments (8 bytes).

Verification (exit 1 when any fails; 2 for bad options): torus-train's parameter count (its `config`
record), transformers' num_parameters() and the count computed from the preset are equal; every run's
first-step loss is finite and within 10% of ln(32000) = 10.37 (the loss of uniform predictions; random
weights of std 0.02 give ln(V) + sigma^2/2 with sigma^2 = width x 0.02^2: 10.38 / 10.53 / 10.78 for
tiny / 125m / 1b); the two sides' losses agree within 2% of ln(V) (other token ids, the same weights);
every round gives the same loss as the first on each side (relative 1e-5: runs are deterministic).

The table gives per phase the median over rounds (and every round), then the ratio torus / transformers
of the time to the end of the first step, of the load (build+load against from_pretrained) and of peak
RSS. Progress goes to stderr.
"""

import argparse
import json
import math
import os
import pathlib
import re
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
RANKS = 4
VOCAB = 32000
INIT_STD = 0.02

# name: layers, hidden, heads, kv_heads, ffn, max positions, rms_norm_eps; the step's batch and seq; the layout
SIZES = {
    "tiny": dict(layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, positions=256, eps=1e-6, batch=4, seq=64,
                 layout="--tp 2 --pp 2 --micro-batches 2"),
    "125m": dict(layers=12, hidden=768, heads=12, kv_heads=4, ffn=2048, positions=2048, eps=1e-5, batch=4, seq=64,
                 layout="--tp 4 --micro-batches 1"),
    "1b": dict(layers=22, hidden=2048, heads=32, kv_heads=4, ffn=5632, positions=2048, eps=1e-5, batch=4, seq=64,
               layout="--tp 4 --micro-batches 1"),
}
DTYPES = {"f32": "float32", "bf16": "bfloat16"}


def log(msg):
    print(f"first_step: {msg}", file=sys.stderr, flush=True)


def expected_params(p):
    """Parameters of an untied Llama of preset p: embedding and head, per block q, k, v, o, the SwiGLU MLP and
    two RMSNorms, the final norm."""
    h, head_dim = p["hidden"], p["hidden"] // p["heads"]
    block = 2 * h * h + 2 * h * p["kv_heads"] * head_dim + 3 * h * p["ffn"] + 2 * h
    return 2 * VOCAB * h + p["layers"] * block + h


def human(b):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(b) < 1024 or unit == "TiB":
            return f"{b:.1f} {unit}" if unit != "B" else f"{int(b)} B"
        b /= 1024


def meminfo(key):
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None


def vm_hwm():
    """This process's peak resident memory (VmHWM), bytes."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return None


# ---------------------------------------------------------------------------------------------------------------
# Workers: run in processes of their own (this file with --worker), so that the parent never holds a model.

def worker_make(args, p):
    """Creates the preset's Llama with random weights and saves it to args.model_dir (through a temporary
    directory renamed at the end, so an interrupted run leaves no half-written model behind)."""
    import torch
    import transformers
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=p["hidden"], intermediate_size=p["ffn"],
                                   num_hidden_layers=p["layers"], num_attention_heads=p["heads"],
                                   num_key_value_heads=p["kv_heads"], max_position_embeddings=p["positions"],
                                   rms_norm_eps=p["eps"], initializer_range=INIT_STD, tie_word_embeddings=False)
    torch.manual_seed(0)
    dtype = getattr(torch, DTYPES[args.dtype])
    model = transformers.AutoModelForCausalLM.from_config(cfg, **{dtype_kwarg(transformers): dtype})
    final = pathlib.Path(args.model_dir)
    tmp = final.with_name(final.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    (tmp / "first_step.json").write_text(json.dumps(dict(size=args.size, dtype=args.dtype,
                                                         parameters=model.num_parameters())) + "\n")
    os.replace(tmp, final)


def dtype_kwarg(transformers):
    """from_pretrained/from_config take `dtype` from transformers 4.56 on, `torch_dtype` before."""
    major, minor = (int(x) for x in re.findall(r"\d+", transformers.__version__)[:2])
    return "dtype" if (major, minor) >= (4, 56) else "torch_dtype"


def worker_hf(args, p):
    """One transformers run: the times (time.time(), compared with the parent's launch time), loss, counts."""
    t = {"start": time.time()}
    import torch
    import transformers
    t["imports"] = time.time()
    dtype = getattr(torch, DTYPES[args.dtype])
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model_dir, **{dtype_kwarg(transformers): dtype})
    t["loaded"] = time.time()
    model.train()
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 256, (args.batch, args.seq + 1), generator=gen)
    inputs, labels = tokens[:, :-1], tokens[:, 1:]
    t["step_begin"] = time.time()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    logits = model(input_ids=inputs).logits
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    t["step_end"] = time.time()
    out = dict(times=t, loss=loss.item(), parameters=model.num_parameters(), vm_hwm=vm_hwm(),
               threads=torch.get_num_threads(), torch=torch.__version__, transformers=transformers.__version__,
               param_dtype=str(next(model.parameters()).dtype))
    with open(args.worker_out, "w") as f:
        json.dump(out, f)


# ---------------------------------------------------------------------------------------------------------------
# The parent.

def launch(cmd, env, log_path, timeout, watch=None):
    """Runs cmd in a session of its own with stdout and stderr to log_path. With watch (a metrics.jsonl path),
    polls it every 5 ms and returns the time.time() at which each record's event first appeared.
    Returns (returncode or None on a timeout, t_launch, t_exit, {event: time}, records)."""
    seen, records, buf, pos = {}, [], "", 0
    with open(log_path, "w") as logf:
        t0 = time.time()
        p = subprocess.Popen(cmd, env=env, stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        while True:
            rc = p.poll()
            now = time.time()
            if watch is not None:
                try:
                    with open(watch) as f:
                        f.seek(pos)
                        chunk = f.read()
                        pos = f.tell()
                    buf += chunk
                    while "\n" in buf:
                        line, buf = buf.split("\n", 1)
                        rec = json.loads(line)
                        records.append(rec)
                        seen.setdefault(rec.get("event"), now)
                except FileNotFoundError:
                    pass
            if rc is not None:
                return rc, t0, now, seen, records
            if now - t0 > timeout:
                kill_session(p)
                return None, t0, time.time(), seen, records
            time.sleep(0.005)


def model_files(d):
    return sorted(q for q in pathlib.Path(d).iterdir() if q.is_file() and q.suffix in (".safetensors", ".json"))


def prepare_cache(d, mode):
    """warm: read every file of the model through (into the page cache); cold: drop their cached pages."""
    for q in model_files(d):
        fd = os.open(q, os.O_RDONLY)
        try:
            if mode == "warm":
                while os.read(fd, 64 << 20):
                    pass
            else:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


LOG_LINE = re.compile(r"^\[torus (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)(\.\d+)? r0/\d+ \w\] (.*)$")
LOG_EVENTS = (("up", ""), ("bootstrap", "bootstrap:"), ("estimate", "memory estimate"),
              ("loaded", "init: model weights"))


def rank0_stamps(log_text):
    """Times (seconds since the epoch, the log's local time) of rank 0's first log line ("up"), its bootstrap
    line, its memory-estimate line and its "init: model weights" line, those found."""
    stamps = {}
    for line in log_text.splitlines():
        m = LOG_LINE.match(line)
        if not m:
            continue
        for key, prefix in LOG_EVENTS:
            if key not in stamps and m.group(3).startswith(prefix):
                stamps[key] = time.mktime(time.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")) + float(m.group(2) or 0)
    return stamps


def run_torus(args, p, layout, work, i):
    out = os.path.join(work, f"torus-{i}")
    train = [str(args.build / "bin" / "torus-train"), "--model", args.model_dir, "--init-from", args.model_dir,
             *layout, "--precision", args.dtype, "--steps", "1", "--batch", str(args.batch), "--seq", str(args.seq),
             "--eval-batches", "1", "--peak-tflops", "1", "--no-tensorboard", "--progress", "off", "--out", out]
    cmd = ["mpirun", *MPI_FLAGS, "-np", str(RANKS), *train]
    log_path = os.path.join(work, f"torus-{i}.log")
    rc, t0, t_exit, seen, records = launch(cmd, dict(os.environ), log_path, args.timeout,
                                           watch=os.path.join(out, "metrics.jsonl"))
    text = open(log_path, errors="replace").read()
    if rc != 0:
        sys.stderr.write(text[-6000:])
        raise RuntimeError(f"torus-train {'timed out' if rc is None else f'failed (exit {rc})'}, round {i + 1}")
    by = {r.get("event"): r for r in records}
    if not {"config", "step", "end"} <= by.keys() or "config" not in seen:
        sys.stderr.write(text[-6000:])
        raise RuntimeError(f"torus-train wrote no config/step/end records, round {i + 1}")
    step = by["step"]
    ready = seen["config"] - t0
    shutil.rmtree(out, ignore_errors=True)
    stamps = rank0_stamps(text)
    build_load = stamps["loaded"] - stamps["estimate"] if {"estimate", "loaded"} <= stamps.keys() else None
    # The log's wall-clock stamps (millisecond resolution) against the launch: used only where rank 0's first
    # two lines fall between the launch and `ready`, as they must when both clocks agree (its later lines may
    # follow `ready`: the config record is the logging rank's, the last pipeline stage's, not rank 0's).
    since = {k: v - t0 for k, v in stamps.items()}
    anchored = all(-0.01 <= since.get(k, -1) <= ready + 0.01 for k in ("up", "bootstrap"))
    return dict(up_s=since.get("up") if anchored else None, bootstrap_s=since.get("bootstrap") if anchored else None,
                ready_s=ready, build_load_s=build_load, step_s=step["step_s"],
                first_step_s=ready + step["data_s"] + step["step_s"], step_record_s=seen["step"] - t0,
                exit_s=t_exit - t0, loss=step["loss"], parameters=by["config"]["parameters"],
                layout=by["config"]["layout"], peak_rss_bytes=by["end"]["job_peak_rss_bytes"],
                rank_peak_rss_bytes=by["end"]["peak_rss_bytes"])


def run_hf(args, work, i):
    res = os.path.join(work, f"hf-{i}.json")
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", "hf", "--size", args.size,
           "--dtype", args.dtype, "--model-dir", args.model_dir, "--batch", str(args.batch), "--seq", str(args.seq),
           "--worker-out", res]
    log_path = os.path.join(work, f"hf-{i}.log")
    rc, t0, t_exit, _, _ = launch(cmd, dict(os.environ), log_path, args.timeout)
    if rc != 0 or not os.path.exists(res):
        sys.stderr.write(open(log_path, errors="replace").read()[-6000:])
        raise RuntimeError(f"the transformers run {'timed out' if rc is None else f'failed (exit {rc})'}, "
                           f"round {i + 1}")
    r = json.load(open(res))
    t = r["times"]
    return dict(imports_s=t["imports"] - t0, load_s=t["loaded"] - t["imports"], step_s=t["step_end"] - t["step_begin"],
                first_step_s=t["step_end"] - t0, exit_s=t_exit - t0, loss=r["loss"], parameters=r["parameters"],
                peak_rss_bytes=r["vm_hwm"], threads=r["threads"], torch=r["torch"], transformers=r["transformers"],
                param_dtype=r["param_dtype"])


def ensure_model(args, p):
    d = pathlib.Path(args.model_dir)
    marker = d / "first_step.json"
    if d.exists() and any(d.iterdir()):
        if not marker.is_file():
            raise ValueError(f"--model-dir {args.model_dir} exists but was not written by this benchmark "
                             f"(no first_step.json): give an empty or new directory")
        m = json.loads(marker.read_text())
        if m.get("size") != args.size or m.get("dtype") != args.dtype:
            raise ValueError(f"--model-dir {args.model_dir} holds the {m.get('size')} model in {m.get('dtype')}, "
                             f"not {args.size} in {args.dtype}: give another directory or delete it")
        log(f"reusing the {args.size} model ({m['parameters']:,} parameters, {args.dtype})")
        return
    d.parent.mkdir(parents=True, exist_ok=True)
    need = expected_params(p) * (4 if args.dtype == "f32" else 2)
    free = shutil.disk_usage(d.parent).free
    if free < 1.2 * need:
        raise ValueError(f"{d.parent} has {human(free)} free, the {args.size} model needs {human(need)}")
    log(f"creating the {args.size} Llama ({expected_params(p):,} parameters, {args.dtype}, "
        f"{human(need)}) with random weights ...")
    t0 = time.time()
    cmd = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", "make", "--size", args.size,
           "--dtype", args.dtype, "--model-dir", str(d)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        sys.stderr.write(r.stdout[-3000:] + r.stderr[-6000:])
        raise RuntimeError(f"creating the model failed (exit {r.returncode})")
    log(f"created in {time.time() - t0:.1f} s")


def summarize(rounds, key):
    vals = [r[key] for r in rounds if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def verify(args, p, torus, hf):
    """Returns a list of (check, ok, detail)."""
    checks = []
    want = expected_params(p)
    counts = {r["parameters"] for r in torus} | {r["parameters"] for r in hf}
    checks.append(("parameter counts equal (torus, transformers, preset)", counts == {want},
                   f"torus {sorted({r['parameters'] for r in torus})}, transformers "
                   f"{sorted({r['parameters'] for r in hf})}, preset {want}"))
    ln_v = math.log(VOCAB)
    for side, runs in (("torus", torus), ("transformers", hf)):
        losses = [r["loss"] for r in runs]
        ok = all(x is not None and math.isfinite(x) and abs(x - ln_v) <= 0.1 * ln_v for x in losses)
        checks.append((f"{side} first-step loss finite, within 10% of ln(V) = {ln_v:.3f}", ok,
                       " ".join(f"{x:.4f}" if x is not None else "null" for x in losses)))
        ok = None not in losses and all(abs(x - losses[0]) <= 1e-5 * abs(losses[0]) for x in losses)
        checks.append((f"{side} loss equal in every round (rel 1e-5)", ok, ""))
    nan_if_none = lambda x: math.nan if x is None else x
    a, b = (statistics.median(nan_if_none(r["loss"]) for r in runs) for runs in (torus, hf))
    checks.append(("torus and transformers losses within 2% of ln(V)", abs(a - b) <= 0.02 * ln_v,
                   f"{a:.4f} vs {b:.4f}, difference {abs(a - b):.4f} (bound {0.02 * ln_v:.3f})"))
    return checks


def print_report(torus, hf, checks, header):
    for line in header:
        print(line)
    rounds = lambda rs, k: " ".join(f"{r[k]:.2f}" if r.get(k) is not None else "-" for r in rs)

    def row(name, rs, key, unit="s"):
        med = summarize(rs, key)
        if med is None:
            print(f"{name:<34} {'-':>11}")
        elif unit == "B":
            print(f"{name:<34} {human(med):>11}   {' '.join(human(r[key]) for r in rs)}")
        else:
            print(f"{name:<34} {med:>9.2f} s   {rounds(rs, key)}")

    print(f"{'from the launch; (d): a duration':<34} {'median':>11}   rounds")
    print(f"torus-train, {RANKS} ranks, {torus[0]['layout']}:")
    row("  rank 0 up (its first log line)", torus, "up_s")
    row("  bootstrap done (rank 0)", torus, "bootstrap_s")
    row("  ready (job up, weights loaded)", torus, "ready_s")
    row("  build+load, rank 0 (d)", torus, "build_load_s")
    row("  step: fwd+bwd+clip+AdamW (d)", torus, "step_s")
    row("  end of the first step", torus, "first_step_s")
    row("  step record (+1 val batch)", torus, "step_record_s")
    row("  exit", torus, "exit_s")
    row("  peak RSS, sum over ranks", torus, "peak_rss_bytes", "B")
    print(f"transformers {hf[0]['transformers']}, torch {hf[0]['torch']}, 1 process, {hf[0]['threads']} threads:")
    row("  imported torch, transformers", hf, "imports_s")
    row("  from_pretrained (d)", hf, "load_s")
    row("  step: fwd+bwd+clip+AdamW (d)", hf, "step_s")
    row("  end of the first step", hf, "first_step_s")
    row("  exit", hf, "exit_s")
    row("  peak RSS", hf, "peak_rss_bytes", "B")
    ratios = {}
    for name, tk, hk in (("end of the first step", "first_step_s", "first_step_s"),
                         ("load (build+load / from_pretrained)", "build_load_s", "load_s"),
                         ("first step alone", "step_s", "step_s"),
                         ("exit", "exit_s", "exit_s"),
                         ("peak RSS", "peak_rss_bytes", "peak_rss_bytes")):
        a, b = summarize(torus, tk), summarize(hf, hk)
        if a is not None and b:
            ratios[name] = a / b
            print(f"# torus / transformers, {name}: {a / b:.2f}x")
    for name, ok, detail in checks:
        print(f"# check {name}: {'ok' if ok else 'FAILED'}" + (f" ({detail})" if detail else ""))
    return ratios


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", choices=sorted(SIZES), default="1b", help="model preset (default 1b)")
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32",
                    help="the file's, the parameters' and torus-train's --precision (default f32)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    ap.add_argument("--layout", default=None,
                    help="torus-train layout options for the 4 ranks, one string (default: the preset's, "
                         "'--tp 4 --micro-batches 1' for 125m and 1b, '--tp 2 --pp 2 --micro-batches 2' for tiny)")
    ap.add_argument("--batch", type=int, default=None, help="sequences in the step (default 4)")
    ap.add_argument("--seq", type=int, default=None, help="tokens per sequence (default 64)")
    ap.add_argument("--model-dir", default=None,
                    help="where the model is created once and reused (default <tmp>/torus-hf-first-step/SIZE-DTYPE)")
    ap.add_argument("--cache", choices=["warm", "cold"], default="warm",
                    help="the model files in the page cache before every run (warm, default) or dropped (cold)")
    ap.add_argument("--build", default=str(ROOT / "build"), help="the build directory (bin/torus-train)")
    ap.add_argument("--timeout", type=int, default=1800, help="seconds per run before it is killed")
    ap.add_argument("--keep-logs", action="store_true", help="keep the runs' logs (their directory is printed)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--worker", choices=["hf", "make"], help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    args = ap.parse_args()

    p = SIZES[args.size]
    args.batch = p["batch"] if args.batch is None else args.batch
    args.seq = p["seq"] if args.seq is None else args.seq
    if args.worker == "make":
        worker_make(args, p)
        return 0
    if args.worker == "hf":
        worker_hf(args, p)
        return 0

    def bad(msg):
        print(f"first_step.py: {msg}", file=sys.stderr)
        return 2

    repeats = args.repeats
    if repeats < 1:
        return bad(f"--repeats must be at least 1, got {repeats}")
    if args.batch < 1 or args.seq < 2:
        return bad(f"--batch must be at least 1 and --seq at least 2, got {args.batch} and {args.seq}")
    if args.seq > p["positions"]:
        return bad(f"--seq {args.seq} is longer than the {args.size} model's {p['positions']} positions")
    if args.timeout < 1:
        return bad(f"--timeout must be positive, got {args.timeout}")
    layout_text = p["layout"] if args.layout is None else args.layout
    try:
        layout = shlex.split(layout_text)
    except ValueError as e:
        return bad(f"--layout {layout_text!r}: {e}")
    owned = {"--model", "--init-from", "--precision", "--steps", "--batch", "--seq", "--out", "--data"}
    clash = [o for o in layout if o.split("=")[0] in owned]
    if clash:
        return bad(f"--layout may not set {', '.join(clash)}: the benchmark sets these (see --batch, --seq, --dtype)")
    args.build = pathlib.Path(args.build).resolve()
    if not os.access(args.build / "bin" / "torus-train", os.X_OK):
        return bad(f"{args.build}/bin/torus-train is missing: build the project first (or give --build)")
    if shutil.which("mpirun") is None:
        return bad("mpirun is not on PATH")
    user_dir = args.model_dir is not None
    if not user_dir:
        args.model_dir = os.path.join(tempfile.gettempdir(), "torus-hf-first-step", f"{args.size}-{args.dtype}")
    args.model_dir = os.path.abspath(args.model_dir)
    shown_dir = args.model_dir if user_dir else f"<tmp>/torus-hf-first-step/{args.size}-{args.dtype}"

    try:
        ensure_model(args, p)
    except ValueError as e:
        return bad(str(e))
    except RuntimeError as e:
        print(f"first_step.py: {e}", file=sys.stderr)
        return 1

    # Both sides hold about 16 bytes per parameter (18 for Torus in bf16), plus the runtime (~0.5 GiB per process).
    need = expected_params(p) * (16 if args.dtype == "f32" else 18) + (RANKS + 1) * (512 << 20)
    if (meminfo("MemAvailable") or 0) < need:
        log(f"warning: {human(meminfo('MemAvailable'))} of memory available, a run may need {human(need)}")
    file_bytes = sum(q.stat().st_size for q in model_files(args.model_dir) if q.suffix == ".safetensors")
    busy = cpu_busy()
    load0 = os.getloadavg()
    avail = meminfo("MemAvailable")
    header = [
        f"# time to first step from Hugging Face weights: Llama {args.size} ({expected_params(p):,} parameters: "
        f"{p['layers']} layers, width {p['hidden']}, {p['heads']} heads ({p['kv_heads']} kv), ffn {p['ffn']}, "
        f"vocab {VOCAB}, untied), {args.dtype}; model.safetensors {human(file_bytes)} in {shown_dir}",
        f"# torus: mpirun -np {RANKS} torus-train --model DIR --init-from DIR {layout_text} --precision {args.dtype} "
        f"--steps 1 --batch {args.batch} --seq {args.seq}; transformers: from_pretrained + 1 AdamW step on "
        f"{args.batch} x {args.seq} tokens",
        f"# {repeats} round(s), medians; page cache {args.cache} before every run; {os.cpu_count()} CPUs, "
        f"memory {human(meminfo('MemTotal'))} ({human(avail)} available), "
        f"{'?' if busy is None else f'{100 * busy:.0f}%'} busy over 2 s before the run",
    ]
    work = tempfile.mkdtemp(prefix="torus-hf-first-step-")
    torus, hf = [], []
    t_all = time.time()
    try:
        for i in range(repeats):
            prepare_cache(args.model_dir, args.cache)
            log(f"round {i + 1}/{repeats}: torus-train, {RANKS} ranks ...")
            torus.append(run_torus(args, p, layout, work, i))
            r = torus[-1]
            log(f"  first step ends at {r['first_step_s']:.2f} s (ready {r['ready_s']:.2f} s, step "
                f"{r['step_s']:.2f} s), exit {r['exit_s']:.2f} s, loss {r['loss']}, "
                f"peak RSS {human(r['peak_rss_bytes'])}")
            prepare_cache(args.model_dir, args.cache)
            log(f"round {i + 1}/{repeats}: transformers ...")
            hf.append(run_hf(args, work, i))
            r = hf[-1]
            log(f"  first step ends at {r['first_step_s']:.2f} s (from_pretrained {r['load_s']:.2f} s, step "
                f"{r['step_s']:.2f} s), exit {r['exit_s']:.2f} s, loss {r['loss']}, "
                f"peak RSS {human(r['peak_rss_bytes'])}")
    except RuntimeError as e:
        print(f"first_step.py: {e}", file=sys.stderr)
        if args.keep_logs:
            log(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
        return 1
    if args.keep_logs:
        log(f"logs kept in {work}")
    else:
        shutil.rmtree(work, ignore_errors=True)

    checks = verify(args, p, torus, hf)
    load1 = os.getloadavg()
    header.append(f"# load average at the start {load0[0]:.2f}, at the end {load1[0]:.2f} (this run's processes "
                  f"included); the whole run took {time.time() - t_all:.0f} s"
                  + ("; other work kept the CPUs busy at the start: rerun on a quiet machine"
                     if busy and busy > 0.25 else ""))
    ratios = print_report(torus, hf, checks, header)
    ok = all(c[1] for c in checks)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(config=dict(size=args.size, dtype=args.dtype, parameters=expected_params(p),
                                       layers=p["layers"], hidden=p["hidden"], heads=p["heads"],
                                       kv_heads=p["kv_heads"], ffn=p["ffn"], vocab=VOCAB, ranks=RANKS,
                                       layout=layout_text, batch=args.batch, seq=args.seq, repeats=repeats,
                                       cache=args.cache, model_dir=shown_dir, file_bytes=file_bytes),
                           machine=dict(cpus=os.cpu_count(), mem_total=meminfo("MemTotal"), mem_available=avail,
                                        cpu_busy_before=busy, load_average=[load0[0], load1[0]]),
                           torus=dict(rounds=torus, median={k: summarize(torus, k) for k in torus[0]
                                                            if isinstance(torus[0][k], (int, float))}),
                           transformers=dict(rounds=hf, median={k: summarize(hf, k) for k in hf[0]
                                                                if isinstance(hf[0][k], (int, float))}),
                           ratios_torus_over_transformers=ratios,
                           checks=[dict(check=c, ok=o, detail=d) for c, o, d in checks], ok=ok), f, indent=1)
    if not ok:
        print("first_step.py: verification failed", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
