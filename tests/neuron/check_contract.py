"""Keeps the Neuron runtime contract honest (tests/neuron/contract.sh).

1. The CALLS list of contract.sh equals the set of symbols Torus resolves
   from the runtime (src/device/neuron/nrt_library.cpp).
2. Running the Neuron tests against the fake with its call trace on
   exercises every one of those calls, and no other.
3. In every process, nrt_init comes once, before any call that needs it,
   and nrt_close comes once, last, after every tensor was freed.

Usage: check_contract.py --repo DIR --fake LIB --device EXE --backend EXE --mpiexec MPIRUN [--mpiflags FLAGS]
"""
import argparse
import collections
import os
import re
import subprocess
import sys
import tempfile


def contract_calls(repo):
    text = open(os.path.join(repo, "tests/neuron/contract.sh")).read()
    return {c for line in re.findall(r"^# CALLS:(.*)$", text, re.M) for c in line.split()}


def resolved_calls(repo):
    text = open(os.path.join(repo, "src/device/neuron/nrt_library.cpp")).read()
    return set(re.findall(r'(?:need|resolve)\((?:handle, )?"(nrt\w*)"', text))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repo", required=True)
    ap.add_argument("--fake", required=True)
    ap.add_argument("--device", required=True, help="torus_neuron_device_tests")
    ap.add_argument("--backend", required=True, help="torus_neuron_backend_tests")
    ap.add_argument("--mpiexec", required=True)
    ap.add_argument("--mpiflags", default="")
    a = ap.parse_args()
    mpi = [a.mpiexec] + a.mpiflags.split() + ["-x", "TORUS_NEURON_LIBRARY", "-x", "TORUS_TEST_FAKE_NRT_TRACE",
                                              "-x", "TORUS_LOG_LEVEL", "-x", "TORUS_TEST_BACKEND=neuron"]
    cmds = [[a.device, "--gtest_death_test_style=threadsafe",
             "--gtest_filter=NeuronDeviceBuild.*:NeuronDevice.*:NeffProgram.*"],
            mpi + ["-np", "2", a.backend, "--gtest_filter=-NeuronFaults.*"]]
    failures = []
    listed, resolved = contract_calls(a.repo), resolved_calls(a.repo)
    if listed != resolved:
        failures.append(f"contract.sh lists {sorted(listed - resolved)} that Torus does not resolve, and misses "
                        f"{sorted(resolved - listed)}")
    with tempfile.TemporaryDirectory() as tmp:
        trace = os.path.join(tmp, "trace")
        env = dict(os.environ, TORUS_NEURON_LIBRARY=a.fake, TORUS_TEST_FAKE_NRT_TRACE=trace, TORUS_LOG_LEVEL="warn")
        for argv in cmds:
            r = subprocess.run(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=240)
            if r.returncode != 0:
                failures.append(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stdout[-3000:]}")
        per_pid = collections.defaultdict(list)
        for line in open(trace):
            pid, call = line.split()
            per_pid[pid].append(call)
    traced = {c for calls in per_pid.values() for c in calls}
    if traced != listed:
        failures.append(f"the tests exercise {sorted(traced - listed)} beyond the contract and never call "
                        f"{sorted(listed - traced)}")
    before_init = {"nrt_get_version", "nrt_get_total_nc_count"}
    for pid, calls in per_pid.items():
        if calls.count("nrt_init") != 1 or calls.count("nrt_close") != 1:
            failures.append(f"process {pid}: nrt_init x{calls.count('nrt_init')}, nrt_close x{calls.count('nrt_close')}")
            continue
        i = calls.index("nrt_init")
        early = [c for c in calls[:i] if c not in before_init]
        if early:
            failures.append(f"process {pid}: {early} before nrt_init")
        if calls[-1] != "nrt_close":
            failures.append(f"process {pid}: {calls[calls.index('nrt_close') + 1:]} after nrt_close")
        allocs = calls.count("nrt_tensor_allocate") + calls.count("nrt_tensor_allocate_slice")
        if allocs != calls.count("nrt_tensor_free"):
            failures.append(f"process {pid}: {allocs} tensors allocated, {calls.count('nrt_tensor_free')} freed")
    print(f"{len(per_pid)} processes traced; {len(traced)} distinct runtime calls; contract lists {len(listed)}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
