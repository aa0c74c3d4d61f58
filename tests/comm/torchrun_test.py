#!/usr/bin/env python3
"""Torus launched by torchrun, whose elastic agent serves its own store at
MASTER_ADDR:MASTER_PORT (Note [torchrun's agent store] in
src/comm/agent_store.h).

Modes (one CTest test each):
  standalone  torchrun --standalone --nproc-per-node 2 --no-python torus-train,
              then the --nnodes 1 --master-port form: both train, their losses
              equal a single-process run of the same model within float
              tolerance, and rank 0 says how the store was found.
  multinode   two torchrun agents (--nnodes 2, one process each) joined by a
              c10d rendezvous on this machine: the same.
  python      the README's snippet (torus.init(), an all_reduce) under
              torchrun --standalone --nproc-per-node 2, then again with
              --max-restarts 1 and rank 1 failing in the first attempt: the
              restarted group must find the new store, not the first
              attempt's (the key names the restart attempt).

Ports come from the OS (torchrun picks its own for --standalone). Every run
is time bounded and its whole process group killed on expiry.

usage: torchrun_test.py MODE PYTHON TORUS_TRAIN [PYTHON_PACKAGE_DIR]
"""
import fcntl
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import tempfile

RUN_TIMEOUT_S = 150

# A model small enough that a run is mostly start-up.
TRAIN_ARGS = ["--layers", "2", "--hidden", "64", "--heads", "2", "--seq", "32", "--batch", "8", "--steps", "3",
              "--eval-interval", "0", "--threads", "1", "--peak-tflops", "1", "--progress", "off"]

SNIPPET = r'''
import os, sys
import torch, torus
world = torus.init()
t = torch.ones(4) * (world.rank + 1)
world.all_reduce(t).wait()
n = world.size
assert torch.equal(t, torch.full((4,), n * (n + 1) / 2)), t
attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
print(f"snippet rank {world.rank} of {n} attempt {attempt} sum {t[0].item():g}", flush=True)
if len(sys.argv) > 1 and sys.argv[1] == "--fail-first-attempt" and attempt == 0 and world.rank == 1:
    sys.exit(3)
'''


def check(cond, msg):
    if not cond:
        print("FAILED: " + msg)
        sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def has_non_loopback_ipv4():
    """Whether the bootstrap's default multi-host choice (the first
    non-loopback IPv4 interface) exists here."""
    for _, name in socket.if_nameindex():
        if name == "lo":
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            try:
                fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))  # SIOCGIFADDR
                return True
            except OSError:
                pass
    return False


def clean_env(extra=None):
    """The environment of a user's shell: no other launcher's variables."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OMPI_", "PMIX_", "SLURM_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                         "TORUS_RANK", "TORUS_WORLD_SIZE", "TORUS_LOCAL_RANK", "TORUS_LOCAL_SIZE",
                         "TORUS_MASTER_ADDR", "TORUS_MASTER_PORT", "TORUS_JOB_TOKEN")}
    env.update(TORUS_LOG_LEVEL="info", OMP_NUM_THREADS="1", TORUS_STORE_TIMEOUT_MS="60000")
    env.update(extra or {})
    return env


def start(cmd, env):
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def finish(proc, what):
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        check(False, f"{what} HUNG: still running after {RUN_TIMEOUT_S} s\n{out[-6000:]}")
    return proc.returncode, out


def run(cmd, env, what):
    return finish(start(cmd, env), what)


def losses(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        recs = [json.loads(l) for l in f]
    return [r["loss"] for r in recs if r.get("event") == "step"]


def reference_losses(exe):
    """The same model trained by one process, no launcher at all."""
    out = tempfile.mkdtemp(prefix="torchrun-ref-")
    rc, text = run([exe] + TRAIN_ARGS + ["--out", out], clean_env(), "the single-process reference")
    check(rc == 0, f"the single-process reference failed ({rc}):\n{text[-4000:]}")
    ref = losses(out)
    check(len(ref) == 3, f"the reference wrote {len(ref)} step records")
    return ref


def check_training(what, rc, text, out_dir, ref, token_via):
    check(rc == 0, f"{what}: exit {rc}\n{text[-6000:]}")
    check("Address already in use" not in text, f"{what}: a rank tried the agent's port\n{text[-4000:]}")
    check("through the agent's store" in text and f"the job token through {token_via}" in text,
          f"{what}: rank 0 did not say the store was published through the agent's store, token through "
          f"{token_via}\n{text[-4000:]}")
    print(next(l for l in text.splitlines() if "through the agent's store" in l))
    got = losses(out_dir)
    check(len(got) == len(ref), f"{what}: {len(got)} step records, expected {len(ref)}")
    for step, (a, b) in enumerate(zip(got, ref), 1):
        check(abs(a - b) <= 1e-4 * max(1.0, abs(b)),
              f"{what}: step {step} loss {a} differs from one process's {b}")
    print(f"{what}: ok, losses {got}")


def torchrun(py):
    return [py, "-m", "torch.distributed.run"]


def mode_standalone(py, exe):
    ref = reference_losses(exe)
    out = tempfile.mkdtemp(prefix="torchrun-standalone-")
    rc, text = run(torchrun(py) + ["--standalone", "--nproc-per-node", "2", "--no-python", exe] + TRAIN_ARGS +
                   ["--out", out], clean_env(), "torchrun --standalone")
    check_training("torchrun --standalone", rc, text, out, ref, "a file only this user can read")

    out = tempfile.mkdtemp(prefix="torchrun-master-port-")
    rc, text = run(torchrun(py) + ["--nnodes", "1", "--nproc-per-node", "2", "--master-port", str(free_port()),
                                   "--no-python", exe] + TRAIN_ARGS + ["--out", out],
                   clean_env(), "torchrun --nnodes 1 --master-port")
    check_training("torchrun --nnodes 1 --master-port", rc, text, out, ref, "a file only this user can read")


def mode_multinode(py, exe):
    ref = reference_losses(exe)
    extra, token_via = {}, "the agent's store, with the address"
    if not has_non_loopback_ipv4():
        # Only loopback here: the store listens there and the token takes the private file.
        extra, token_via = {"TORUS_SOCKET_IFNAME": "lo"}, "a file only this user can read"
    endpoint = f"127.0.0.1:{free_port()}"
    out = tempfile.mkdtemp(prefix="torchrun-multinode-")
    agents = []
    for node in range(2):
        cmd = torchrun(py) + ["--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1",
                              "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint,
                              "--rdzv-id", f"torus-test-{os.getpid()}", "--no-python", exe] + TRAIN_ARGS + [
                                  "--out", out]
        agents.append(start(cmd, clean_env(extra)))
    results = [finish(a, f"torchrun agent {i}") for i, a in enumerate(agents)]
    text = "\n".join(f"--- agent {i} ---\n{t}" for i, (_, t) in enumerate(results))
    rc = next((r for r, _ in results if r != 0), 0)
    check_training("two torchrun agents (c10d rendezvous)", rc, text, out, ref, token_via)


def mode_python(py, exe, pkg):
    check(pkg is not None, "python mode needs the Python package directory")
    script = os.path.join(tempfile.mkdtemp(prefix="torchrun-snippet-"), "snippet.py")
    with open(script, "w") as f:
        f.write(SNIPPET)
    path = pkg + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    env = clean_env({"PYTHONPATH": path})

    rc, text = run(torchrun(py) + ["--standalone", "--nproc-per-node", "2", script], env, "the snippet")
    check(rc == 0, f"the snippet under torchrun: exit {rc}\n{text[-6000:]}")
    for r in range(2):
        check(f"snippet rank {r} of 2 attempt 0 sum 3" in text, f"no result from rank {r}\n{text[-4000:]}")
    check("through the agent's store" in text, f"rank 0 did not say how the store was found\n{text[-4000:]}")
    print("the snippet under torchrun --standalone: ok")

    # A worker group restarted by the agent: the first attempt's address is
    # still in the agent's store, under the first attempt's key.
    rc, text = run(torchrun(py) + ["--standalone", "--nproc-per-node", "2", "--max-restarts", "1",
                                   "--monitor-interval", "0.5", script, "--fail-first-attempt"], env,
                   "the snippet with a restart")
    check(rc == 0, f"the restarted snippet: exit {rc}\n{text[-6000:]}")
    for r in range(2):
        check(f"snippet rank {r} of 2 attempt 1 sum 3" in text,
              f"rank {r} did not finish the second attempt\n{text[-4000:]}")
    check("attempt_1/store" in text, f"the second attempt did not use its own key\n{text[-4000:]}")
    print("the snippet restarted by torchrun (--max-restarts 1): ok")


def main():
    mode, py, exe = sys.argv[1], sys.argv[2], sys.argv[3]
    pkg = sys.argv[4] if len(sys.argv) > 4 else None
    if mode == "standalone":
        mode_standalone(py, exe)
    elif mode == "multinode":
        mode_multinode(py, exe)
    elif mode == "python":
        mode_python(py, exe, pkg)
    else:
        check(False, f"unknown mode {mode}")


if __name__ == "__main__":
    main()
