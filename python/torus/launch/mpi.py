"""Reading an mpirun command line back out of a container command or a script
line, so that the rules can check -np, the hostfile and exported variables.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from typing import Dict, List, Optional

LAUNCHERS = ("mpirun", "mpiexec", "prterun")
_SHELLS = ("sh", "bash", "dash", "zsh")
# mpirun options that take a value (Open MPI 4 and 5); --mca/-mca take two.
_WITH_VALUE = {"-np", "-n", "--np", "-c", "--n", "--hostfile", "-hostfile", "--machinefile", "-machinefile",
               "-H", "--host", "-host", "-x", "--map-by", "-map-by", "--bind-to", "-bind-to", "--rank-by",
               "--display", "--prefix", "--output", "--timeout", "-wdir", "--wdir", "--wd", "-wd", "--npernode",
               "-npernode", "--personality", "--rankfile", "-rf", "--report-bindings-to", "--tune"}
_WITH_TWO = {"--mca", "-mca", "--gmca", "-gmca", "--prtemca", "--pmixmca"}
_END = {";", "&&", "||", "|", "&", "\n", ")", "("}


@dataclass
class MpirunCall:
    np: Optional[str] = None
    hostfile: Optional[str] = None
    exported: Dict[str, Optional[str]] = field(default_factory=dict)   # -x NAME[=VALUE]
    program: List[str] = field(default_factory=list)


def shell_tokens(text: str) -> List[str]:
    lex = shlex.shlex(text, posix=True, punctuation_chars=";&|()")
    lex.whitespace_split = True
    lex.commenters = "#"
    try:
        return list(lex)
    except ValueError:          # unbalanced quotes: fall back to whitespace
        return text.split()


def command_tokens(argv: List[str]) -> List[str]:
    """A container's command + args as shell tokens ("bash -c SCRIPT" is looked into)."""
    argv = [str(a) for a in argv]
    if len(argv) >= 3 and os.path.basename(argv[0]) in _SHELLS and argv[1].startswith("-") and "c" in argv[1]:
        return shell_tokens(argv[2])
    return argv


def find_mpirun(tokens: List[str]) -> Optional[MpirunCall]:
    """The first mpirun/mpiexec call among shell tokens, or None."""
    for i, t in enumerate(tokens):
        if os.path.basename(t) in LAUNCHERS:
            return _parse(tokens[i + 1:])
    return None


def _parse(rest: List[str]) -> MpirunCall:
    call = MpirunCall()
    i = 0
    while i < len(rest):
        t = rest[i]
        if t in _END:
            break
        opt, eq, inline = t.partition("=") if t.startswith("--") else (t, "", "")
        if opt in _WITH_TWO:
            i += 3
            continue
        if opt in _WITH_VALUE:
            value = inline if eq else (rest[i + 1] if i + 1 < len(rest) else "")
            i += 1 if eq else 2
            if opt in ("-np", "-n", "--np", "-c", "--n"):
                call.np = value
            elif opt in ("--hostfile", "-hostfile", "--machinefile", "-machinefile"):
                call.hostfile = value
            elif opt == "-x":
                name, has, val = value.partition("=")
                call.exported[name] = val if has else None
            continue
        if t.startswith("-"):
            i += 1
            continue
        j = i
        while j < len(rest) and rest[j] not in _END:
            j += 1
        call.program = rest[i:j]
        break
    return call
