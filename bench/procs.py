"""Process helpers shared by the Python benchmarks (bench/ckpt/run.py, bench/hf/first_step.py)."""

import os
import signal
import subprocess


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
