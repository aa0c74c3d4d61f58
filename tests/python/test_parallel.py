"""torus.parallel and torus.models from Python, on every rank under mpirun.

The TP group is the whole world (tp = world size) unless a test builds a
mesh; references are plain torch computed on every rank from tensors that
are identical everywhere (seeded generators), with no communication.
"""
import pytest
import torch

import torus
from torus import models, parallel as P

TOL = 1e-5


@pytest.fixture(scope="module")
def world():
    return torus.init()


@pytest.fixture(scope="module")
def tp_groups(world):
    mesh = torus.DeviceMesh(world, [("tp", world.size)])
    return mesh, P.ParallelGroups.from_mesh(mesh)


def same_randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def rel(a, b):
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()


def test_column_and_row_parallel_linear_match_torch(world, tp_groups):
    _, g = tp_groups
    n, r = world.size, world.rank
    for sp in (False, True):
        col = P.ColumnParallelLinear(6, 4 * n, g.tp, sequence_parallel=sp, seed=3, init_std=0.3)
        row = P.RowParallelLinear(4 * n, 5, g.tp, sequence_parallel=sp, seed=4, init_std=0.3)
        ref_col = P.ColumnParallelLinear(6, 4 * n, None, seed=3, init_std=0.3)
        ref_row = P.RowParallelLinear(4 * n, 5, None, seed=4, init_std=0.3)
        assert torch.equal(col.weight, ref_col.weight.chunk(n, 0)[r])
        assert torch.equal(row.weight, ref_row.weight.chunk(n, 1)[r])
        x = same_randn(2 * n, 3, 6, seed=1)
        y_ref = ref_row(torch.nn.functional.gelu(ref_col(x)))
        dy = same_randn(*y_ref.shape, seed=2)
        y_ref.backward(dy)
        xl = (x.chunk(n, 0)[r] if sp else x).clone().requires_grad_(True)
        y = row(torch.nn.functional.gelu(col(xl)))
        assert rel(y, y_ref.chunk(n, 0)[r] if sp else y_ref) < TOL
        y.backward(dy.chunk(n, 0)[r] if sp else dy)
        assert rel(col.weight.grad, ref_col.weight.grad.chunk(n, 0)[r]) < TOL
        assert rel(row.weight.grad, ref_row.weight.grad.chunk(n, 1)[r]) < TOL
        assert row.bias.torus_shard == (-1, -1, sp)


def test_vocab_parallel_embedding_and_cross_entropy(world, tp_groups):
    _, g = tp_groups
    n, r = world.size, world.rank
    emb = P.VocabParallelEmbedding(61, 8, g.tp, seed=5, init_std=1.0)
    ref = P.VocabParallelEmbedding(61, 8, None, seed=5, init_std=1.0)
    tokens = torch.randint(0, 61, (4, 3), generator=torch.Generator().manual_seed(6))
    assert rel(emb(tokens), ref(tokens)) < TOL
    full = P.gather_full_parameters(emb, g.tp)["weight"]
    assert torch.equal(full, ref.weight)

    padded = P.pad_vocab(61, n)
    logits = same_randn(5, 61, seed=7) * 3
    targets = torch.randint(0, 61, (5,), generator=torch.Generator().manual_seed(8))
    lr = logits.clone().requires_grad_(True)
    ref_loss = torch.nn.functional.cross_entropy(lr, targets, reduction="none")
    ref_loss.sum().backward()
    big = torch.cat([logits, torch.full((5, padded - 61), 1e4)], -1)
    local = big.chunk(n, -1)[r].clone().requires_grad_(True)
    loss = P.vocab_parallel_cross_entropy(local, targets, g.tp, 61)
    assert rel(loss, ref_loss) < TOL
    loss.sum().backward()
    ref_grad = torch.cat([lr.grad, torch.zeros(5, padded - 61)], -1).chunk(n, -1)[r]
    assert rel(local.grad, ref_grad) < TOL


def test_bad_configurations_raise_invalid_argument(world, tp_groups):
    _, g = tp_groups
    n = world.size
    with pytest.raises(torus.InvalidArgument):
        models.GPTConfig.tiny().validate(3)  # 4 heads over 3 ranks
    with pytest.raises(ValueError):  # torus.InvalidArgument is a ValueError too
        models.GPTConfig(hidden=30, num_heads=4).validate(1)
    if n > 1:
        with pytest.raises(torus.InvalidArgument):
            P.ColumnParallelLinear(4, 4 * n + 1, g.tp)
    if n in (2, 4):
        cfg = models.GPTConfig.tiny()
        cfg.sequence_parallel = True
        model = models.GPT(cfg, g)
        with pytest.raises(torus.InvalidArgument):  # sequence 15 over n ranks, before any communication
            model(torch.zeros(2, 15, dtype=torch.long))


def test_python_gpt_is_the_twin_of_the_cpp_gpt():
    cfg = models.GPTConfig.tiny()
    py_model = models.GPT(cfg)
    cpp_model = torus._C.models.GPT(cfg.to_native())
    cpp_params = cpp_model.named_parameters()
    py_params = dict(py_model.named_parameters())
    assert sorted(py_params) == sorted(cpp_params)
    for name, p in py_params.items():
        assert torch.equal(p, cpp_params[name]), name
    tokens = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(9))
    labels = torch.randint(0, 61, (2, 16), generator=torch.Generator().manual_seed(10))
    assert rel(py_model.loss(tokens, labels), cpp_model.loss(tokens, labels)) < 1e-6


def _train(cfg, groups, steps, data):
    model = models.GPT(cfg, groups)
    ddp = P.DistributedDataParallel(model, groups) if groups is not None else None
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    dp = groups.dp_size if groups is not None else 1
    d = groups.dp_rank if groups is not None else 0
    losses = []
    for step in range(steps):
        local = data[step].chunk(dp, 0)[d]
        loss = model.loss(local[:, :-1].contiguous(), local[:, 1:].contiguous())
        loss.backward()
        opt.step()
        if ddp is not None:
            ddp.zero_grad()
        else:
            opt.zero_grad()
        value = loss.detach().double().reshape(1)
        if dp > 1:
            groups.dp.all_reduce(value, op="avg").wait()
        losses.append(value.item())
    weights = P.gather_full_parameters(model, groups.tp if groups is not None else None)
    return losses, weights


@pytest.mark.parametrize("sp", [False, True])
def test_training_in_a_parallel_layout_matches_one_process(world, sp):
    n = world.size
    tp = 2 if n % 2 == 0 else 1
    if sp and tp == 1:
        pytest.skip("sequence parallelism needs tp > 1")
    mesh = torus.DeviceMesh(world, [("dp", n // tp), ("tp", tp)])
    groups = P.ParallelGroups.from_mesh(mesh)
    cfg = models.GPTConfig.tiny()
    gen = torch.Generator().manual_seed(11)
    data = []
    for _ in range(5):
        d = torch.randint(0, 61, (12, 17), generator=gen)
        for i in range(1, 17):
            d[:, i] = (d[:, i - 1] * 3 + 7) % 61
        data.append(d)
    ref_losses, ref_weights = _train(cfg, None, 5, data)
    cfg.sequence_parallel = sp
    losses, weights = _train(cfg, groups, 5, data)
    for a, b in zip(losses, ref_losses):
        assert abs(a - b) / abs(b) < 1e-5
    for name, w in ref_weights.items():
        assert rel(weights[name], w) < 1e-4, name


def test_ddp_on_a_plain_torch_module(world):
    n, r = world.size, world.rank
    mesh = torus.DeviceMesh(world, [("dp", n)])
    groups = P.ParallelGroups.from_mesh(mesh)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    ref = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))
    ref.load_state_dict(model.state_dict())
    ddp = P.DistributedDataParallel(model, groups, bucket_cap_mb=0.0001, first_bucket_cap_mb=0.0001)
    x = same_randn(4 * n, 6, seed=12)
    ref(x).pow(2).sum(1).mean().backward()
    ddp(x.chunk(n, 0)[r]).pow(2).sum(1).mean().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        assert rel(p.grad, q.grad) < TOL, name
    if n > 1:
        assert ddp.stats()["syncs"] == 1
        assert ddp.stats()["buckets_started_in_backward"] == len(ddp.buckets())
        with ddp.no_sync():
            ddp(x.chunk(n, 0)[r]).sum().backward()
        assert ddp.stats()["syncs"] == 1
