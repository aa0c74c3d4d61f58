"""torus.optim (SGD, Adam, AdamW over the C++ core) against torch.optim.

One process. Each test runs torus's optimizer and torch.optim's on copies of
the same parameters with the same random gradients for 20 steps and compares
after every step. torch.optim (its default single-tensor implementation) is
the independent reference; tolerances follow the dtype: f64 agrees to 1e-12
relative and f32 to 1e-6 (the fused kernels round a few operations per
element differently). bf16 parameters with fp32 master weights are compared
with torch.optim on f32 copies: the master agrees to the f32 tolerance, and
the bf16 parameter is that f32 result rounded, to one bf16 ulp (the two f32
results may straddle a rounding boundary).
"""
import pytest
import torch

import torus
from torus import optim

STEPS = 20
TOL = {torch.float64: 1e-12, torch.float32: 1e-6}
SHAPES = [(16, 9), (9,), (5, 4, 3), (7,)]


def make_params(dtype, seed=7):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g, dtype=torch.float64).to(dtype).requires_grad_() for s in SHAPES]


def clones(ps, dtype=None):
    return [p.detach().clone().to(dtype or p.dtype).requires_grad_() for p in ps]


def rel(a, b):
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).abs().max() / b.abs().max().clamp_min(1e-300)).item()


def grads_for(ps, step, dtype):
    g = torch.Generator().manual_seed(1000 + step)
    out = [torch.randn(p.shape, generator=g, dtype=torch.float64).to(dtype) for p in ps]
    if step == 3:
        out[3] = None  # no gradient this step: both skip that parameter
    return out


def groups_of(ps, spec):
    """spec: None (a plain list) or a list of (indices, options) pairs."""
    if spec is None:
        return list(ps)
    return [dict(opts, params=[ps[i] for i in idx]) for idx, opts in spec]


def run_against_torch(ours_cls, ref_cls, kwargs, dtype, groups=None, lr_change=True):
    ours_p, ref_p = make_params(dtype), make_params(dtype)
    ours = ours_cls(groups_of(ours_p, groups), **kwargs)
    ref = ref_cls(groups_of(ref_p, groups), **kwargs)
    for step in range(STEPS):
        for p, q, g in zip(ours_p, ref_p, grads_for(ours_p, step, dtype)):
            p.grad = None if g is None else g.clone()
            q.grad = None if g is None else g.clone()
        if lr_change and step == 10:  # what a schedule does: every group's lr halves
            ours.set_lr(ours.lr * 0.5)
            for group in ref.param_groups:
                group["lr"] *= 0.5
        ours.step()
        ref.step()
        for i, (p, q) in enumerate(zip(ours_p, ref_p)):
            assert rel(p, q) <= TOL[dtype], f"step {step} param {i}: {rel(p, q)}"
    assert ours.step_count == STEPS


SGD_CASES = {
    "plain": dict(lr=0.1),
    "momentum": dict(lr=0.1, momentum=0.9),
    "nesterov": dict(lr=0.1, momentum=0.9, nesterov=True),
    "dampening": dict(lr=0.1, momentum=0.9, dampening=0.3),
    "weight_decay": dict(lr=0.1, weight_decay=0.05),
    "all": dict(lr=0.05, momentum=0.8, dampening=0.2, weight_decay=0.01),
}
ADAM_CASES = {
    "default": dict(lr=1e-2),
    "tuned": dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1),
}
DTYPES = [torch.float64, torch.float32]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(SGD_CASES))
def test_sgd_matches_torch(case, dtype):
    run_against_torch(optim.SGD, torch.optim.SGD, SGD_CASES[case], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", sorted(ADAM_CASES))
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_adam_family_matches_torch(name, case, dtype):
    # "default" leaves AdamW's weight decay at both libraries' default (1e-2).
    run_against_torch(getattr(optim, name), getattr(torch.optim, name), ADAM_CASES[case], dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sgd_groups_with_their_own_options(dtype):
    groups = [([0, 1], dict(momentum=0.9, nesterov=True)),
              ([2], dict(lr=0.05, weight_decay=0.1, momentum=0.5, dampening=0.2)),
              ([3], dict())]
    run_against_torch(optim.SGD, torch.optim.SGD, dict(lr=0.1), dtype, groups)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_adam_family_groups_with_their_own_options(name, dtype):
    groups = [([0, 2], dict(weight_decay=0.1)),
              ([1], dict(lr=3e-3, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.0)),
              ([3], dict(lr=2e-2))]
    run_against_torch(getattr(optim, name), getattr(torch.optim, name), dict(lr=1e-2), dtype, groups)


def bf16_ulp(x):
    """One unit in the last place of bf16 values x (8 significant bits)."""
    _, e = torch.frexp(x.float())
    return torch.ldexp(torch.ones_like(x, dtype=torch.float32), e - 8)


@pytest.mark.parametrize("name,kwargs", [
    ("SGD", dict(lr=0.05, momentum=0.9, weight_decay=0.01)),
    ("Adam", dict(lr=1e-2, weight_decay=0.1)),
    ("AdamW", dict(lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)),
])
def test_bf16_master_weights_follow_torch_on_f32(name, kwargs):
    ours_p = make_params(torch.bfloat16)
    ref_p = clones(ours_p, torch.float32)
    ours = getattr(optim, name)(ours_p, **kwargs)
    ref = getattr(torch.optim, name)(ref_p, **kwargs)
    for step in range(STEPS):
        for p, q, g in zip(ours_p, ref_p, grads_for(ours_p, step, torch.bfloat16)):
            p.grad = g
            q.grad = None if g is None else g.float()
        ours.step()
        ref.step()
        for i, (p, q) in enumerate(zip(ours_p, ref_p)):
            master = ours.state(0, i, "master")
            assert master.dtype == torch.float32
            assert rel(master, q) <= TOL[torch.float32], f"step {step} param {i}"
            assert p.dtype == torch.bfloat16
            # The parameter is its master rounded (to nearest even) ...
            assert torch.equal(p.detach(), master.to(torch.bfloat16))
            # ... and so within one bf16 ulp of torch's f32 result rounded.
            expected = q.detach().to(torch.bfloat16)
            assert ((p.detach().float() - expected.float()).abs() <= bf16_ulp(expected)).all(), f"step {step} param {i}"
    for key, t in ours.state_dict().items():
        if key != "step_count" and not key.endswith(".step"):
            assert t.dtype == torch.float32, key


@pytest.mark.parametrize("name,kwargs,dtype", [
    ("SGD", dict(lr=0.1, momentum=0.9, dampening=0.1), torch.float32),
    ("Adam", dict(lr=1e-2, weight_decay=0.1), torch.float64),
    ("AdamW", dict(lr=1e-2, weight_decay=0.1), torch.float32),
    ("AdamW", dict(lr=1e-2, weight_decay=0.1), torch.bfloat16),
])
def test_state_dict_round_trip_resumes_identically(name, kwargs, dtype):
    cls = getattr(optim, name)
    a = make_params(dtype)
    groups = lambda ps: [{"params": ps[:2], "names": ["w", "b"]}, {"params": ps[2:], "weight_decay": 0.0}]  # noqa: E731
    opt_a = cls(groups(a), **kwargs)
    half = STEPS // 2
    for step in range(half):
        for p, g in zip(a, grads_for(a, step, dtype)):
            p.grad = g
        opt_a.step()
    saved = {k: v.clone() for k, v in opt_a.state_dict().items()}
    assert saved["step_count"].item() == half
    assert "w.step" in saved and "g1.p0.step" in saved and "g1.p1.step" in saved
    assert ("w.master" in saved) == (dtype == torch.bfloat16)
    b = clones(a)
    for step in range(half, STEPS):
        for p, g in zip(a, grads_for(a, step, dtype)):
            p.grad = g
        opt_a.step()
    opt_b = cls(groups(b), **kwargs)
    opt_b.load_state_dict(saved)
    assert opt_b.step_count == half
    for step in range(half, STEPS):
        for p, g in zip(b, grads_for(b, step, dtype)):
            p.grad = g
        opt_b.step()
    for p, q in zip(a, b):
        assert torch.equal(p, q)
    sa, sb = opt_a.state_dict(), opt_b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k


def test_load_state_dict_errors_change_nothing():
    ps = make_params(torch.float32)
    opt = optim.AdamW(ps, lr=1e-2)
    for p in ps:
        p.grad = torch.ones_like(p)
    opt.step()
    good = {k: v.clone() for k, v in opt.state_dict().items()}
    bad_shape = dict(good, **{"g0.p1.exp_avg": torch.zeros(10)})
    with pytest.raises(torus.InvalidArgument, match=r"'g0.p1.exp_avg' has shape \[10\], expected \[9\]"):
        opt.load_state_dict(bad_shape)
    with pytest.raises(ValueError, match="'g0.p0.exp_avg_sq' is f64, expected f32"):
        opt.load_state_dict(dict(good, **{"g0.p0.exp_avg_sq": torch.zeros(16, 9, dtype=torch.float64)}))
    with pytest.raises(torus.InvalidArgument, match="'x.exp_avg'"):
        opt.load_state_dict(dict(good, **{"x.exp_avg": torch.zeros(1)}))
    with pytest.raises(torus.InvalidArgument, match="step_count"):
        opt.load_state_dict({k: v for k, v in good.items() if k != "step_count"})
    now = opt.state_dict()
    for k in good:
        assert torch.equal(now[k], good[k]), k


def test_step_semantics():
    ps = make_params(torch.float32)
    opt = optim.SGD([{"params": ps[:2]}, {"params": ps[2:], "lr": 0.05}], lr=0.1, momentum=0.9)
    assert opt.step_count == 0
    assert opt.state(0, 0, "momentum_buffer") is None
    before = [p.detach().clone() for p in ps]
    versions = [p._version for p in ps]
    ps[0].grad = torch.ones_like(ps[0])
    opt.step()  # only ps[0] has a gradient
    assert opt.step_count == 1
    assert not torch.equal(ps[0], before[0])
    for p, b in zip(ps[1:], before[1:]):
        assert torch.equal(p, b)
    assert ps[0]._version > versions[0]  # autograd sees the in-place update
    assert opt.param_groups[1]["lr"] == pytest.approx(0.05)
    opt.set_lr(0.2)
    assert opt.lr == 0.2 and opt.param_groups[1]["lr"] == pytest.approx(0.1)
    opt.zero_grad()
    assert ps[0].grad is None
    ps[1].grad = torch.ones_like(ps[1])
    opt.zero_grad(set_to_none=False)
    assert torch.equal(ps[1].grad, torch.zeros_like(ps[1]))
    # Eager state, a generator of parameters, a single tensor.
    opt2 = optim.Adam(p for p in make_params(torch.float32))
    opt2.init_state()
    assert opt2.state(0, 0, "exp_avg") is not None and opt2.state_dict()["g0.p0.step"].item() == 0
    optim.AdamW(torch.zeros(3, requires_grad=True))


def test_bad_arguments():
    p = torch.zeros(3, requires_grad=True)
    with pytest.raises(torus.InvalidArgument):
        optim.SGD([p], lr=-1.0)
    with pytest.raises(torus.InvalidArgument):
        optim.SGD([p], lr=0.1, nesterov=True)
    with pytest.raises(torus.InvalidArgument):
        optim.Adam([p], betas=(1.0, 0.9))
    with pytest.raises(torus.InvalidArgument, match="listed twice"):
        optim.AdamW([p, p])
    with pytest.raises(torus.InvalidArgument, match="listed twice"):
        optim.AdamW([{"params": [p]}, {"params": [p]}])
    with pytest.raises(ValueError, match="does not take"):
        optim.Adam([{"params": [p], "momentum": 0.9}])
    with pytest.raises(ValueError, match="empty"):
        optim.SGD([])
    with pytest.raises(ValueError, match="master_weights"):
        optim.SGD([p], master_weights="sometimes")


# ---- CpuAdam / CpuAdamW (Torus's CPU kernel) against torch.optim ----
# The kernel rounds a few operations per element differently from torch.optim
# (it multiplies by 1/sqrt(1 - b2^t) where torch divides by its square root,
# and decays p by one precomputed factor), so f32 results agree to 2e-6
# relative over 20 steps rather than torch's own fused-vs-plain 1e-6.
CPU_TOL = 2e-6


@pytest.mark.parametrize("case", sorted(ADAM_CASES))
@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_cpu_adam_family_matches_torch(name, case):
    ours_p, ref_p = make_params(torch.float32), make_params(torch.float32)
    ours = getattr(optim, "Cpu" + name)(ours_p, **ADAM_CASES[case])
    ref = getattr(torch.optim, name)(ref_p, **ADAM_CASES[case])
    for step in range(STEPS):
        for p, q, g in zip(ours_p, ref_p, grads_for(ours_p, step, torch.float32)):
            p.grad = None if g is None else g.clone()
            q.grad = None if g is None else g.clone()
        ours.step()
        ref.step()
        for i, (p, q) in enumerate(zip(ours_p, ref_p)):
            assert rel(p, q) <= CPU_TOL, f"step {step} param {i}: {rel(p, q)}"
    # The same state layout as torus.optim.AdamW / Adam.
    plain = getattr(optim, name)(make_params(torch.float32), **ADAM_CASES[case])
    for p in plain._params[0]:
        p.grad = torch.ones_like(p)
    plain.step()
    assert sorted(ours.state_dict()) == sorted(plain.state_dict())


def test_cpu_adamw_bf16_masters_follow_torch_on_f32():
    ours_p = make_params(torch.bfloat16)
    ref_p = clones(ours_p, torch.float32)
    ours = optim.CpuAdamW(ours_p, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    ref = torch.optim.AdamW(ref_p, lr=1e-2, betas=(0.9, 0.95), weight_decay=0.1)
    for step in range(STEPS):
        for p, q, g in zip(ours_p, ref_p, grads_for(ours_p, step, torch.bfloat16)):
            p.grad = None if g is None else g.clone()  # bf16 gradients, read by the kernel as they are
            q.grad = None if g is None else g.float()
        ours.step()
        ref.step()
    for i, (p, q) in enumerate(zip(ours_p, ref_p)):
        master = ours.state(0, i, "master")
        assert rel(master, q) <= CPU_TOL
        assert torch.equal(p, master.to(torch.bfloat16))  # written back in the kernel's pass
        assert ((p.float() - q).abs() <= bf16_ulp(q)).all()


def test_cpu_adam_step_matches_torch_fused_and_skips_on_found_inf():
    g = torch.Generator().manual_seed(3)
    ps = [torch.randn(n, generator=g) for n in (1, 17, 1000)]
    grads = [torch.randn(p.shape, generator=g).to(torch.bfloat16) for p in ps]
    ms, vs = [torch.zeros_like(p) for p in ps], [torch.zeros_like(p) for p in ps]
    outs = [torch.empty_like(p, dtype=torch.bfloat16) for p in ps]
    ref = [p.clone().requires_grad_() for p in ps]
    torch_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.1, fused=True)
    for step in (1, 2, 3):
        optim.cpu_adam_step(ps, grads, ms, vs, lr=1e-2, weight_decay=0.1, step=step, param_outs=outs)
        for r, gr in zip(ref, grads):
            r.grad = gr.float()
        torch_opt.step()
    for p, r, o in zip(ps, ref, outs):
        assert rel(p, r) <= CPU_TOL
        assert torch.equal(o, p.to(torch.bfloat16))
    # A found_inf flag: nothing is written; a grad scale is folded into the pass.
    before = [t.clone() for t in ps + ms + vs]
    optim.cpu_adam_step(ps, grads, ms, vs, lr=1e-2, step=4, found_inf=torch.ones(1))
    assert all(torch.equal(a, b) for a, b in zip(ps + ms + vs, before))
    assert optim.cpu_adam_best_isa() in ("scalar", "avx2", "avx512")
    opt = optim.CpuAdamW([torch.zeros(3, requires_grad=True)])
    found_inf = torch.ones(1)
    opt.set_grad_scale(0.5, found_inf)
    opt._params[0][0].grad = torch.ones(3)
    opt.step()
    assert opt.state(0, 0, "exp_avg") is None  # skipped: no state, no count
    found_inf.zero_()
    opt.step()
    assert opt.step_count == 1 and torch.equal(opt.state(0, 0, "exp_avg"), torch.full((3,), 0.05))
    with pytest.raises(torus.InvalidArgument):
        optim.cpu_adam_step([torch.zeros(3)], [torch.zeros(4)], [torch.zeros(3)], [torch.zeros(3)], lr=1e-3, step=1)
