"""Python bindings of the comm layer, run on every rank under mpirun.

Expected values are closed forms of the rank and the world size.
"""
import time

import pytest
import torch

import torus


@pytest.fixture(scope="module")
def world():
    return torus.init()


def test_exception_types_match_python_hierarchy():
    assert issubclass(torus.InvalidArgument, torus.Error)
    assert issubclass(torus.InvalidArgument, ValueError)
    assert issubclass(torus.TimeoutError, TimeoutError)
    assert issubclass(torus.Unsupported, NotImplementedError)
    assert issubclass(torus.Error, RuntimeError)


def test_retain_freed_host_memory_reports_its_settings():
    import platform
    import struct
    s = torus.retain_freed_host_memory()
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("not glibc: the setting does nothing here")
    assert s["applied"]
    assert s["mmap_threshold"] == 4 * 2**20 * struct.calcsize("l")  # glibc's ceiling
    assert torus.retain_freed_host_memory() == s  # idempotent


def test_all_reduce_sum_and_ops(world):
    n, r = world.size, world.rank
    t = torch.full((8,), float(r + 1))
    work = world.all_reduce(t)
    assert isinstance(work, torus.Work)
    work.wait()
    assert torch.all(t == n * (n + 1) / 2)
    m = torch.tensor([r, -r], dtype=torch.int64)
    world.all_reduce(m, op=torus.ReduceOp.MAX).wait()
    assert m.tolist() == [n - 1, 0]
    a = torch.full((3,), float(r), dtype=torch.bfloat16)
    world.all_reduce(a, op="avg").wait()
    assert torch.allclose(a.float(), torch.full((3,), (n - 1) / 2), rtol=1e-2)
    out = torch.empty(8)
    world.all_reduce(torch.ones(8), output=out).wait()
    assert torch.all(out == n)


def test_gather_scatter_broadcast_p2p(world):
    n, r = world.size, world.rank
    out = torch.empty(n * 2, dtype=torch.int32)
    world.all_gather(torch.tensor([r, 10 * r], dtype=torch.int32), out).wait()
    assert out.tolist() == [v for q in range(n) for v in (q, 10 * q)]
    rs_out = torch.empty(3)
    world.reduce_scatter(torch.arange(3 * n, dtype=torch.float32), rs_out).wait()
    assert rs_out.tolist() == [n * (3 * r + i) for i in range(3)]
    b = torch.full((4,), 9.0) if r == 0 else torch.zeros(4)
    world.broadcast(b, root=0).wait()
    assert torch.all(b == 9)
    a_in = torch.arange(n, dtype=torch.int64) + 100 * r
    a_out = torch.empty(n, dtype=torch.int64)
    world.all_to_all(a_in, a_out).wait()
    assert a_out.tolist() == [100 * q + r for q in range(n)]
    recv = torch.empty(5)
    rw = world.recv(recv, src=(r - 1) % n, tag=3)
    world.send(torch.full((5,), float(r)), dst=(r + 1) % n, tag=3).wait()
    rw.wait()
    assert torch.all(recv == (r - 1) % n)
    world.barrier().wait()


def test_bad_input_raises_invalid_argument(world):
    with pytest.raises(torus.InvalidArgument, match="contiguous"):
        world.all_reduce(torch.ones(4, 4).t())
    with pytest.raises(ValueError):
        world.all_reduce(torch.ones(4, dtype=torch.bool))
    with pytest.raises(torus.InvalidArgument):
        world.broadcast(torch.ones(2), root=world.size)


def test_work_metadata_and_groups(world):
    n, r = world.size, world.rank
    w = world.all_reduce(torch.ones(3))
    w.wait()
    assert w.op == "all_reduce" and w.group == "world" and w.seq >= 1 and w.is_completed()
    parity = world.split(r % 2, r, "py-parity")
    t = torch.tensor([float(r)])
    parity.all_reduce(t).wait()
    assert t.item() == sum(q for q in range(r % 2, n, 2))
    if n % 2 == 0:
        mesh = torus.DeviceMesh(world, [("dp", n // 2), ("tp", 2)])
        assert mesh.coord("tp") == r % 2
        g = mesh.group("tp")
        x = torch.tensor([float(r)])
        g.all_reduce(x).wait()
        assert x.item() == 2 * (r - r % 2) + 1
    with pytest.raises(torus.InvalidArgument):
        torus.DeviceMesh(world, [("dp", n + 1)])


def test_missing_rank_raises_timeout_error(world):
    if world.size < 2:
        pytest.skip("a missing peer needs two ranks")
    victim = world.split(0, world.rank, "py-victim")
    victim.timeout = 1.0
    if world.rank != world.size - 1:
        start = time.monotonic()
        with pytest.raises(torus.TimeoutError, match="all_reduce"):
            victim.all_reduce(torch.ones(4)).wait()
        assert time.monotonic() - start < 1.0 + 3.0
    world.barrier().wait()


def test_shared_host_zeros_tensors_work_in_collectives(world):
    n, r = world.size, world.rank
    t = torus.shared_host_zeros((3, 5), dtype=torch.bfloat16)
    assert t.shape == (3, 5) and t.dtype == torch.bfloat16 and t.device.type == "cpu"
    assert t.is_contiguous() and torch.all(t == 0)
    assert torus.shared_host_zeros(0).numel() == 0
    with pytest.raises(ValueError):
        torus.shared_host_zeros((2, -1))
    # Large enough for the zero-copy host path on the ofi backend; any
    # backend must give the same sums.
    count = 300001
    a = torus.shared_host_zeros(count)
    a.copy_(torch.arange(count, dtype=torch.float32) % 7 + r)
    out = torus.shared_host_zeros(count)
    world.all_reduce(a, output=out).wait()
    want = n * (torch.arange(count, dtype=torch.float32) % 7) + n * (n - 1) / 2
    assert torch.equal(out, want)
    world.all_reduce(a).wait()
    assert torch.equal(a, want)
    g = torus.shared_host_zeros((n, count), dtype=torch.int32)
    world.all_gather(torch.full((count,), r, dtype=torch.int32), g).wait()
    assert torch.equal(g, torch.arange(n, dtype=torch.int32).repeat_interleave(count).view(n, count))


def test_shared_host_allocator_follows_the_policy(world):
    """torus.init installs the shared host allocator on ofi with 2+ ranks on
    this host (TORUS_SHARED_HOST_ALLOC=auto, the default): large tensors are
    then pool blocks, small ones are not, and collectives on them give the
    closed-form sums. Elsewhere ordinary tensors stay ordinary memory."""
    import os
    n, r = world.size, world.rank
    policy = os.environ.get("TORUS_SHARED_HOST_ALLOC", "auto") or "auto"
    installed = torus.shared_host_allocator_installed()
    if policy == "off":
        assert not installed
    elif policy == "on":
        assert installed
    else:  # every rank of these tests is on this host
        assert installed == (world.backend == "ofi" and n >= 2)
    big = torch.empty(1 << 18)
    assert torus.is_shared_host(big) == torus.shared_host_allocator_installed()
    assert not torus.is_shared_host(torch.empty(16))
    assert torus.is_shared_host(torus.shared_host_zeros(4))
    stats = torus.shared_host_pool_stats()
    assert set(stats) >= {"slabs", "live_bytes", "free_bytes", "cached_bytes", "allocs"}
    if torus.shared_host_allocator_installed():
        assert stats["live_bytes"] >= big.numel() * 4
    count = 1 << 18
    x = torch.arange(count, dtype=torch.float32) % 5 + r
    world.all_reduce(x).wait()
    assert torch.equal(x, n * (torch.arange(count, dtype=torch.float32) % 5) + n * (n - 1) / 2)


def test_forked_data_loader_workers_read_pool_tensors(world):
    """DataLoader workers forked after torus.init read a dataset tensor that
    lives in the shared host pool (where the allocator is installed): their
    batches are right, and what they write to their copies never reaches
    this process."""
    n, r = world.size, world.rank
    rows = 4096
    data = torch.arange(rows * 64, dtype=torch.float32).view(rows, 64) + r  # 1 MiB: a pool block on ofi
    keep = data.clone()
    assert torus.is_shared_host(data) == torus.shared_host_allocator_installed()

    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return rows

        def __getitem__(self, i):
            row = data[i].clone()
            data[i].fill_(-1.0)  # a worker's write: must stay in the worker
            return row

    loader = torch.utils.data.DataLoader(Rows(), batch_size=256, num_workers=2,
                                         multiprocessing_context="fork")
    got = torch.cat(list(loader))
    assert torch.equal(got, keep)
    assert torch.equal(data, keep), "a forked worker's write reached the parent's tensor"
    world.all_reduce(got).wait()  # still usable in collectives afterwards
    assert torch.equal(got, n * (keep - r) + n * (n - 1) / 2)
