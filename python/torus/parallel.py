"""Tensor-, sequence- and data-parallel layers as ``torch.nn.Module``s.

The parameters are ordinary ``torch.nn.Parameter``s; every forward calls the
C++ functional forms (``torus._C.tp``), so each collective — and its
conjugate in backward — runs inside the C++ autograd functions. A ``group``
of ``None`` means a group of one rank (no communication).

    world = torus.init()
    mesh = torus.DeviceMesh(world, [("dp", 2), ("tp", 2)])
    groups = torus.parallel.ParallelGroups.from_mesh(mesh)
    fc1 = torus.parallel.ColumnParallelLinear(256, 1024, groups.tp, seed=1)
    fc2 = torus.parallel.RowParallelLinear(1024, 256, groups.tp, seed=2)
    ddp = torus.parallel.DistributedDataParallel(model, groups)

Initialisation is layout independent: with the same ``seed`` a rank's shard
is the slice of the single-process weight (the same values the C++ layers
draw). Each parameter records its layout in ``param.torus_shard``:
``(dim, full_size, tp_partial_grad)`` — ``dim`` is the dimension split over
TP (-1: replicated), ``full_size`` the unpadded global size along it (-1: no
padding), ``tp_partial_grad`` marks replicated parameters whose gradient is a
partial sum over TP (sequence parallelism); ``DistributedDataParallel`` reads
it. See docs/parallel.md.
"""

import contextlib

import torch

from . import _C

_tp = _C.tp
_dp = _C.dp

ParallelGroups = _C.ParallelGroups
RngRegion = _tp.RngRegion
RngTracker = _tp.RngTracker

copy_to_tp_region = _tp.copy_to_tp_region
reduce_from_tp_region = _tp.reduce_from_tp_region
scatter_to_tp_region = _tp.scatter_to_tp_region
gather_from_tp_region = _tp.gather_from_tp_region
scatter_to_sequence_region = _tp.scatter_to_sequence_region
gather_from_sequence_region = _tp.gather_from_sequence_region
reduce_scatter_to_sequence_region = _tp.reduce_scatter_to_sequence_region
vocab_parallel_cross_entropy = _tp.vocab_parallel_cross_entropy
derive_seed = _tp.derive_seed
pad_vocab = _tp.pad_vocab
dropout = _tp.dropout

__all__ = [
    "ColumnParallelLinear",
    "DistributedDataParallel",
    "LayerNorm",
    "ParallelGroups",
    "RngRegion",
    "RngTracker",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "copy_to_tp_region",
    "derive_seed",
    "dropout",
    "gather_from_sequence_region",
    "gather_from_tp_region",
    "gather_full_parameters",
    "pad_vocab",
    "reduce_from_tp_region",
    "reduce_scatter_to_sequence_region",
    "scatter_to_sequence_region",
    "scatter_to_tp_region",
    "vocab_parallel_cross_entropy",
]


def group_size(group):
    return 1 if group is None else group.size


def group_rank(group):
    return 0 if group is None else group.rank


def _divided(size, group, what, layer):
    n = group_size(group)
    if size < 1 or size % n != 0:
        raise _C.InvalidArgument(f"{layer}: {what} ({size}) must be >= 1 and divisible by the tensor-parallel size {n}")
    return size // n


def _parameter(shape, dim, full_size, padded, kind, std, seed, group, dtype, device, partial=False):
    """A Parameter holding this rank's shard of a layout-independent value."""
    t = _tp.init_shard(list(shape), dim, full_size, padded, kind, std, seed, group_rank(group), group_size(group),
                       torch.float64 if dtype == torch.float64 else torch.float32)
    p = torch.nn.Parameter(t.to(device=device, dtype=dtype))
    p.torus_shard = (dim, full_size, partial)
    return p


class ColumnParallelLinear(torch.nn.Module):
    """Y = X W^T + b with W [out, in] split by rows over ``group``; see layers.h."""

    def __init__(self, in_features, out_features, group=None, *, bias=True, gather_output=False,
                 sequence_parallel=False, seed=0, init_std=0.02, dtype=torch.float32, device="cpu"):
        super().__init__()
        _divided(out_features, group, "out_features", "ColumnParallelLinear")
        self.group, self.gather_output, self.sequence_parallel = group, gather_output, sequence_parallel
        self.weight = _parameter([out_features, in_features], 0, -1, out_features, "normal", init_std,
                                 derive_seed(seed, "weight"), group, dtype, device)
        self.bias = (_parameter([out_features], 0, -1, out_features, "zeros", 0.0, 0, group, dtype, device)
                     if bias else None)

    def forward(self, x):
        return _tp.column_parallel_linear(x, self.weight, self.bias, self.group, self.gather_output,
                                          self.sequence_parallel)


class RowParallelLinear(torch.nn.Module):
    """W [out, in] split by columns; outputs summed over ``group``; see layers.h."""

    def __init__(self, in_features, out_features, group=None, *, bias=True, input_is_parallel=True,
                 sequence_parallel=False, seed=0, init_std=0.02, dtype=torch.float32, device="cpu"):
        super().__init__()
        _divided(in_features, group, "in_features", "RowParallelLinear")
        self.group, self.input_is_parallel, self.sequence_parallel = group, input_is_parallel, sequence_parallel
        self.weight = _parameter([out_features, in_features], 1, -1, in_features, "normal", init_std,
                                 derive_seed(seed, "weight"), group, dtype, device)
        self.bias = (_parameter([out_features], -1, -1, 0, "zeros", 0.0, 0, group, dtype, device,
                                partial=sequence_parallel) if bias else None)

    def forward(self, x):
        return _tp.row_parallel_linear(x, self.weight, self.bias, self.group, self.input_is_parallel,
                                       self.sequence_parallel)


class VocabParallelEmbedding(torch.nn.Module):
    """Embedding table [vocab, h] split by rows (vocabulary padded); see layers.h."""

    def __init__(self, num_embeddings, embedding_dim, group=None, *, pad_multiple=1, reduce_scatter_output=False,
                 seed=0, init_std=0.02, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.group, self.reduce_scatter_output = group, reduce_scatter_output
        self.num_embeddings = num_embeddings
        self.padded_vocab = pad_vocab(num_embeddings, group_size(group), pad_multiple)
        self.weight = _parameter([num_embeddings, embedding_dim], 0, num_embeddings, self.padded_vocab, "normal",
                                 init_std, derive_seed(seed, "weight"), group, dtype, device)

    def forward(self, tokens):
        return _tp.vocab_parallel_embedding(tokens, self.weight, self.group, self.reduce_scatter_output)


class LayerNorm(torch.nn.Module):
    """LayerNorm whose parameters know whether they sit in a sequence-parallel region."""

    def __init__(self, dim, eps=1e-5, *, sequence_parallel=False, dtype=torch.float32, device="cpu"):
        super().__init__()
        self.dim, self.eps = dim, eps
        self.weight = _parameter([dim], -1, -1, 0, "ones", 0.0, 0, None, dtype, device, partial=sequence_parallel)
        self.bias = _parameter([dim], -1, -1, 0, "zeros", 0.0, 0, None, dtype, device, partial=sequence_parallel)

    def forward(self, x):
        return torch.nn.functional.layer_norm(x, (self.dim,), self.weight, self.bias, self.eps)


def _shard(p):
    return getattr(p, "torus_shard", (-1, -1, False))


def gather_full_parameters(module, tp_group):
    """Full (TP=1, unpadded) tensors of every parameter, by name. Collective over ``tp_group``."""
    out = {}
    for name, p in module.named_parameters():
        dim, full_size, _ = _shard(p)
        out[name] = _tp.gather_full(p.detach(), dim, full_size, tp_group)
    return out


class DistributedDataParallel(torch.nn.Module):
    """Data parallelism for any ``torch.nn.Module`` (the C++ torus::dp wrapper).

    Gradients are packed into flat buckets; each bucket's all-reduce starts from
    a backward hook as soon as it is complete and all are finished when backward
    ends, so ``loss.backward(); optimizer.step()`` sees averaged gradients.
    Replicated parameters with gradients partial over TP (``torus_shard[2]``,
    sequence parallelism) are summed over TP as well. ``zero_grad()`` zeroes
    the buckets and keeps the views; ``zero_grad(set_to_none=True)`` (or the
    optimizer's) sets the grads to None, and the next backward copies each
    gradient into its bucket as it arrives. CPU buckets live in shared host
    memory (``shared_host_buckets``), so the ofi backend reduces them between
    same-host ranks without staging copies.
    """

    def __init__(self, module, groups, *, bucket_cap_mb=25.0, first_bucket_cap_mb=1.0, average=True, overlap=True,
                 finish_in_backward=True, broadcast_parameters=True, shared_host_buckets=True):
        super().__init__()
        self.module = module
        params = [(name, p, *_shard(p)) for name, p in module.named_parameters()]
        self._ddp = _dp.DistributedDataParallel(
            params, groups, bucket_cap_bytes=int(bucket_cap_mb * (1 << 20)),
            first_bucket_cap_bytes=int(first_bucket_cap_mb * (1 << 20)), average=average, overlap=overlap,
            finish_in_backward=finish_in_backward, broadcast_parameters=broadcast_parameters,
            shared_host_buckets=shared_host_buckets)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def start_grad_sync(self):
        self._ddp.start_grad_sync()

    def finish_grad_sync(self):
        self._ddp.finish_grad_sync()

    def zero_grad(self, set_to_none=False):
        """Zeroes the buckets, or with ``set_to_none`` sets every ``.grad`` to None:
        the next backward then copies each fresh gradient into its bucket (one
        pass instead of zeroing and accumulating, two)."""
        self._ddp.zero_grad(set_to_none)

    @contextlib.contextmanager
    def no_sync(self):
        """Backward inside only accumulates; the next synced backward reduces the sum."""
        previous = self._ddp.grad_sync_enabled
        self._ddp.grad_sync_enabled = False
        try:
            yield
        finally:
            self._ddp.grad_sync_enabled = previous

    def stats(self):
        return self._ddp.stats()

    def buckets(self):
        return self._ddp.buckets()
