"""MoE from Python: a GPT with MoE blocks (``GPTConfig.moe_every``, ``.moe``)
trained by ``GPTTrainer`` with ``ParallelLayout(ep=...)``.

* The expert-parallel layout (ep = world size) trains the same model as the
  data-parallel one (dp = world size): the losses of 8 steps within 1e-5
  relative, dropless and with a capacity factor.
* ``StepStats.routing`` reports each MoE layer: tokens per expert summing to
  k x tokens, a drop rate of 0 when dropless and > 0 at capacity 0.5.
* Experts split over TP (``expert_tensor_parallel``) train the same model.
* A bad MoE layout is refused before any communication.
"""
import pytest
import torch

import torus
from torus import models, train


@pytest.fixture(scope="module")
def world():
    return torus.init()


def moe_config(capacity_factor):
    moe = models.MoEConfig(num_experts=4, top_k=2, capacity_factor=capacity_factor, aux_loss_weight=0.01)
    return models.GPTConfig(vocab_size=256, max_seq_len=16, num_layers=2, hidden=32, num_heads=2, moe_every=1, moe=moe)


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, 256, (8, 17), generator=g)


def run(world, cfg, layout, steps=8):
    trainer = train.GPTTrainer(world, cfg, layout, train.OptimizerConfig(lr=3e-3))
    return [trainer.train_step(batch(k)) for k in range(steps)]


@pytest.mark.parametrize("capacity_factor", [0.0, 0.5])
def test_expert_parallel_matches_data_parallel(world, capacity_factor):
    n = world.size
    cfg = moe_config(capacity_factor)
    ref = run(world, cfg, train.ParallelLayout(dp=n, num_micro=2))
    got = run(world, cfg, train.ParallelLayout(dp=1, ep=n, num_micro=2))
    for a, b in zip(ref, got):
        assert b.loss == pytest.approx(a.loss, rel=1e-5)
    for st in got:
        assert len(st.routing) == 2
        for layer in st.routing:
            assert sum(layer["tokens_per_expert"]) == pytest.approx(layer["assignments"])
            assert layer["assignments"] == 2 * 8 * 16
            if capacity_factor == 0:
                assert layer["drop_rate"] == 0
    if capacity_factor > 0:
        assert max(layer["drop_rate"] for st in got for layer in st.routing) > 0


@pytest.mark.parametrize("capacity_factor", [0.0, 0.5])
def test_experts_split_over_tp_match_data_parallel(world, capacity_factor):
    """``MoEConfig.expert_tensor_parallel``: each expert split over TP trains
    the model that whole experts train (dp = world size)."""
    n = world.size  # np2 splits the experts; on one rank the setting changes nothing
    cfg = moe_config(capacity_factor)
    ref = run(world, cfg, train.ParallelLayout(dp=n, num_micro=2))
    cfg.moe.expert_tensor_parallel = True
    got = run(world, cfg, train.ParallelLayout(tp=n, dp=1, num_micro=2))
    for a, b in zip(ref, got):
        assert b.loss == pytest.approx(a.loss, rel=1e-5)


def test_bad_moe_layouts_are_refused(world):
    cfg = moe_config(0.0)
    cfg.moe.num_experts = 3
    if world.size > 1:
        with pytest.raises(torus.InvalidArgument, match="experts"):
            train.GPTTrainer(world, cfg, train.ParallelLayout(dp=1, ep=world.size))
    dense = models.GPTConfig(vocab_size=256, max_seq_len=16, num_layers=2, hidden=32, num_heads=2)
    if world.size > 1:
        with pytest.raises(torus.InvalidArgument, match="MoE"):
            train.GPTTrainer(world, dense, train.ParallelLayout(dp=1, ep=world.size))
