"""Rules for Slurm batch scripts (slurm-mpirun, slurm-srun, and the script of
a Slinky launch), shared by render's self-check and `check`.
"""

from __future__ import annotations

import re
from typing import List, Optional, Tuple

from .instances import INSTANCES, OBSOLETE_EFA_VARIABLES
from .mpi import find_mpirun, shell_tokens
from .rules import Expect, Problem

HEADER = "# torus-launch:"   # "# torus-launch: platform=P instance=I nodes=N", written by render


def _lines(text: str) -> List[Tuple[int, str]]:
    """(first line number, logical line) with backslash continuations joined."""
    out, buf, start = [], "", 0
    for n, line in enumerate(text.splitlines(), 1):
        if not buf:
            start = n
        if line.rstrip().endswith("\\"):
            buf += line.rstrip()[:-1] + " "
            continue
        out.append((start, buf + line))
        buf = ""
    if buf:
        out.append((start, buf))
    return out


def header(text: str) -> dict:
    for line in text.splitlines():
        if line.startswith(HEADER):
            return dict(kv.split("=", 1) for kv in line[len(HEADER):].split() if "=" in kv)
    return {}


def _sbatch(lines) -> dict:
    """Long-option name -> (value or True, line number) of the #SBATCH directives."""
    short = {"-N": "nodes", "-n": "ntasks", "-p": "partition", "-t": "time", "-J": "job-name"}
    opts = {}
    for n, line in lines:
        if not line.startswith("#SBATCH"):
            continue
        toks = line.split()[1:]
        i = 0
        while i < len(toks):
            t = toks[i]
            if t.startswith("--"):
                name, eq, val = t[2:].partition("=")
                if not eq and i + 1 < len(toks) and not toks[i + 1].startswith("-"):
                    val, i = toks[i + 1], i + 1
                opts[name] = (val if (eq or val) else True, n)
            elif t in short and i + 1 < len(toks):
                opts[short[t]] = (toks[i + 1], n)
                i += 1
            i += 1
    return opts


def check_script(file: str, text: str, expect: Expect) -> List[Problem]:
    problems: List[Problem] = []

    def add(path: str, msg: str) -> None:
        problems.append(Problem(file, "script", path, msg))

    meta = header(text)
    inst = expect.instance or INSTANCES.get(meta.get("instance", ""))
    nodes_expected = expect.nodes if expect.nodes is not None else (
        int(meta["nodes"]) if meta.get("nodes", "").isdigit() else None)
    lines = _lines(text)
    opts = _sbatch(lines)
    body = [(n, l) for n, l in lines if not l.lstrip().startswith("#")]

    nodes = opts.get("nodes")
    nodes_n: Optional[int] = None
    if nodes is None:
        add("#SBATCH --nodes", "missing: give the node count")
    elif not str(nodes[0]).isdigit():
        add(f"line {nodes[1]}", f"#SBATCH --nodes={nodes[0]}: a range lets Slurm start fewer nodes than the job needs")
    else:
        nodes_n = int(nodes[0])
        if nodes_expected is not None and nodes_n != nodes_expected:
            add(f"line {nodes[1]}", f"#SBATCH --nodes={nodes_n}, expected {nodes_expected}")
    tpn = opts.get("ntasks-per-node")
    tpn_n = int(tpn[0]) if tpn and str(tpn[0]).isdigit() else None
    if tpn is None:
        add("#SBATCH --ntasks-per-node", "missing: one task per device of the node")
    elif inst is None:
        add(f"line {tpn[1]}", "cannot tell the instance type: pass --instance to check, or keep render's "
                              f"'{HEADER} instance=...' line")
    elif tpn_n != inst.ranks_per_node:
        add(f"line {tpn[1]}", f"#SBATCH --ntasks-per-node={tpn[0]}, but a {inst.name} runs "
                              f"{inst.ranks_per_node} ranks")
    if "exclusive" not in opts:
        add("#SBATCH --exclusive", "missing: another job on the node would share its devices and EFA")

    launched = False
    for n, line in body:
        toks = shell_tokens(line)
        call = find_mpirun(toks)
        if call is not None:
            launched = True
            if call.hostfile is None:
                add(f"line {n}", "mpirun has no --hostfile: build one from the Slurm node list")
            elif "scontrol show hostname" not in text:
                add(f"line {n}", "the hostfile is not built from the Slurm node list (scontrol show hostnames)")
            if call.np is None:
                add(f"line {n}", "mpirun has no -np")
            elif call.np.isdigit() and nodes_n and tpn_n and int(call.np) != nodes_n * tpn_n:
                add(f"line {n}", f"mpirun -np {call.np}, but {nodes_n} nodes x {tpn_n} tasks = {nodes_n * tpn_n}")
        elif "srun" in toks:
            i = toks.index("srun")
            launched = True
            mpi = [t.split("=", 1)[1] for t in toks[i:] if t.startswith("--mpi=")]
            if not mpi or not mpi[0].startswith("pmix"):
                add(f"line {n}", "srun without --mpi=pmix: ranks would not find each other")
    if not launched:
        add("", "no mpirun or srun line starts the ranks")
    for n, line in body:
        for name in OBSOLETE_EFA_VARIABLES:
            if re.search(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])", line):
                add(f"line {n}", f"{name} is obsolete: {OBSOLETE_EFA_VARIABLES[name]} (docs/efa.md)")
    return problems
