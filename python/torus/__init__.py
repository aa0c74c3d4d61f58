"""Torus: a C++ runtime for 3D/4D-parallel training, bound to Python.

    import torch, torus
    world = torus.init()                       # from mpirun / Slurm / torchrun env
    t = torch.ones(4) * (world.rank + 1)
    world.all_reduce(t).wait()                 # t == n(n+1)/2 everywhere
    mesh = torus.DeviceMesh(world, [("dp", 2), ("tp", 2)])
    mesh.group("tp").all_gather(x, out).wait()

Submodules: `torus.parallel` (tensor/sequence/data-parallel layers),
`torus.models` (the reference GPT), `torus.pipeline` (schedules, simulator,
executor with Python stage callbacks), `torus.optim` (SGD, Adam, AdamW with
torch.optim's interface, fp32 master weights) and `torus.train` (the 3D
GPTTrainer and the utilities of a training run).

Every collective returns a `Work`; call `wait()` before reading the output.
Errors are raised as `torus.Error` subclasses: `InvalidArgument` (also a
ValueError), `CommError`, `TimeoutError` (also the builtin TimeoutError) and
`Unsupported` (also NotImplementedError).
"""

import torch  # noqa: F401  (loads LibTorch before the extension)

from . import _C  # noqa: E402
from ._C import (  # noqa: F401
    CheckpointError,
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
    is_shared_host,
    log_level,
    retain_freed_host_memory,
    set_log_level,
    shared_host_allocator_installed,
    shared_host_pool_stats,
)
from . import checkpoint, models, optim, parallel, pipeline, train  # noqa: E402,F401  (after _C: they import it)


def shared_host_zeros(shape, dtype=torch.float32):
    """A zeroed CPU tensor over shared host memory (torus/comm/shared_host.h).

    Collectives on the ofi backend whose buffers are all such tensors, on every
    rank of a same-host group, skip the staging copies of the host path: each
    rank reads its peers' inputs and writes their outputs directly. Anything
    else works with them as with any CPU tensor. ``shape`` is an int or a
    sequence of ints.
    """
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    numel = 1
    for d in shape:
        if d < 0:
            raise ValueError(f"shared_host_zeros: negative size in {shape}")
        numel *= d
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    raw = _C._shared_host_bytes(max(nbytes, 1))
    return raw[:nbytes].view(dtype).reshape(shape)


__all__ = [
    "CheckpointError",
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
    "is_shared_host",
    "log_level",
    "models",
    "optim",
    "parallel",
    "pipeline",
    "retain_freed_host_memory",
    "set_log_level",
    "shared_host_allocator_installed",
    "shared_host_pool_stats",
    "shared_host_zeros",
    "train",
]
