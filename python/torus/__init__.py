"""Torus: a C++ runtime for 3D/4D-parallel training, bound to Python.

    import torch, torus
    world = torus.init()                       # from mpirun / Slurm / torchrun env
    t = torch.ones(4) * (world.rank + 1)
    world.all_reduce(t).wait()                 # t == n(n+1)/2 everywhere
    mesh = torus.DeviceMesh(world, [("dp", 2), ("tp", 2)])
    mesh.group("tp").all_gather(x, out).wait()

Submodules: `torus.parallel` (tensor/sequence/data-parallel layers),
`torus.models` (the reference GPT), `torus.pipeline` (schedules, simulator,
executor with Python stage callbacks) and `torus.train` (the 3D GPTTrainer and
the utilities of a training run).

Every collective returns a `Work`; call `wait()` before reading the output.
Errors are raised as `torus.Error` subclasses: `InvalidArgument` (also a
ValueError), `CommError`, `TimeoutError` (also the builtin TimeoutError) and
`Unsupported` (also NotImplementedError).
"""

import torch  # noqa: F401  (loads LibTorch before the extension)

from ._C import (  # noqa: F401
    CommError,
    DeviceMesh,
    Error,
    InvalidArgument,
    ProcessGroup,
    ReduceOp,
    TimeoutError,
    Unsupported,
    Work,
    __version__,
    build_info,
    init,
    log_level,
    retain_freed_host_memory,
    set_log_level,
)
from . import models, parallel, pipeline, train  # noqa: E402,F401  (after _C: they import it)

__all__ = [
    "CommError",
    "DeviceMesh",
    "Error",
    "InvalidArgument",
    "ProcessGroup",
    "ReduceOp",
    "TimeoutError",
    "Unsupported",
    "Work",
    "build_info",
    "init",
    "log_level",
    "models",
    "parallel",
    "pipeline",
    "retain_freed_host_memory",
    "set_log_level",
    "train",
]
