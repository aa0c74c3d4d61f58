"""Process and machine helpers shared by the Python benchmarks (bench/ckpt/run.py, bench/hf/first_step.py)."""

import os
import signal
import subprocess
import time


def kill_session(p, grace=15):
    """Ends the session that subprocess ``p`` leads (started with ``start_new_session=True``).

    SIGTERM to the whole session (mpirun passes it on to its ranks), ``grace`` seconds for it
    to end, then SIGKILL of p's children that are still there and of p itself. Returns what
    ``p.communicate`` collected during the grace period when p's pipes were open, else
    ``("", "")``.
    """
    out, err = "", ""
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return out, err
    try:
        out, err = p.communicate(timeout=grace)
    except subprocess.TimeoutExpired:
        pass
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
            if name.isdigit() and int(stat[stat.rindex(")") + 2:].split()[3]) == p.pid:
                os.kill(int(name), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    p.kill()
    p.wait()
    return out or "", err or ""


def cpu_busy(seconds=2.0):
    """The fraction of the CPUs that other work kept busy over `seconds` (/proc/stat), None when unknown."""
    def sample():
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        return v[3] + v[4], sum(v)  # idle + iowait, total
    try:
        i0, t0 = sample()
        time.sleep(seconds)
        i1, t1 = sample()
        return 1.0 - (i1 - i0) / max(1, t1 - t0)
    except (OSError, ValueError, IndexError):
        return None
