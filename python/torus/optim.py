"""Optimizers of the C++ core (torus::optim) with torch.optim's interface.

``SGD``, ``Adam`` and ``AdamW`` compute what ``torch.optim``'s algorithms of
the same name compute (the same formulas and order of operations, through
ATen's fused multi-tensor kernels), from a list of tensors or a list of
parameter-group dicts::

    import torch, torus
    opt = torus.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0, "lr": 1e-4}],
                            lr=3e-4, betas=(0.9, 0.95))
    loss.backward()
    opt.set_lr(schedule(step))   # every group: its lr scales with the base lr
    opt.step()                   # releases the GIL
    opt.zero_grad()

Differences from torch.optim, all deliberate:

* A group's ``"lr"`` is kept relative to the optimizer's ``lr`` (as the C++
  ``ParamGroup::lr_scale``), so ``set_lr`` (what a schedule calls) moves every
  group; ``param_groups`` is a read-only snapshot, not the live settings.
* f16 and bf16 parameters get an fp32 master copy by default
  (``master_weights="half"``; ``"always"`` also for f32, ``"never"`` for
  none): the update runs in fp32 and the parameter receives the result
  rounded to its dtype.
* ``state_dict()`` is flat: ``{"<name>.<state>": tensor, ..., "step_count": n}``
  with names from the groups' ``"names"`` or ``"g<group>.p<index>"``; the
  tensors alias the live state (clone them to keep a snapshot).
  ``load_state_dict`` checks names, shapes and dtypes before changing
  anything and raises ``torus.InvalidArgument``.
* ``CpuAdam`` and ``CpuAdamW`` are Adam and AdamW on Torus's vectorised CPU
  kernel (CPU parameters updated in fp32; bf16/f16 gradients read directly;
  the master write-back in the same pass; ``set_grad_scale(scale,
  found_inf)`` folds an inverse loss scale into the update and skips a step
  on overflow). ``cpu_adam_step`` runs the kernel on lists of tensors.
* Group dicts accept ``params``, ``names``, ``lr``, ``weight_decay`` and the
  algorithm's own options (``momentum``, ``dampening``, ``nesterov`` for SGD;
  ``betas``, ``eps`` for Adam and AdamW); ``amsgrad``, ``maximize``,
  ``foreach``, ``fused`` and the like are not offered.
"""

import torch

from . import _C

_optim = _C.optim

_MASTER = {
    "half": _optim.MasterWeights.HALF,
    "always": _optim.MasterWeights.ALWAYS,
    "never": _optim.MasterWeights.NEVER,
}


class Optimizer:
    """The common part of SGD, Adam and AdamW (torus::optim::Optimizer)."""

    _name = ""
    _group_options = ()  # the algorithm's own group keys

    def __init__(self, params, spec, master_weights):
        if master_weights not in _MASTER:
            raise ValueError(f"master_weights must be one of {sorted(_MASTER)}, got {master_weights!r}")
        spec.name = self._name
        spec.master_weights = _MASTER[master_weights]
        groups = [params] if isinstance(params, torch.Tensor) else list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        self._params = []  # the caller's tensors, per group
        native = []
        for i, group in enumerate(groups):
            if not isinstance(group, dict):
                raise TypeError(f"parameter group {i} is a {type(group).__name__}, not a dict (mixing is not allowed)")
            unknown = set(group) - {"params", "names", "lr", "weight_decay", *self._group_options}
            if unknown:
                raise ValueError(f"parameter group {i}: {type(self).__name__} does not take {sorted(unknown)}")
            ps = group["params"]
            ps = [ps] if isinstance(ps, torch.Tensor) else list(ps)
            for p in ps:
                if not isinstance(p, torch.Tensor):
                    raise TypeError(f"parameter group {i} holds a {type(p).__name__}, not a torch.Tensor")
            pg = _optim.ParamGroup()
            pg.params = ps
            if "lr" in group:
                pg.lr_scale = self._lr_scale(group["lr"], spec.lr, i)
            if "weight_decay" in group:
                pg.weight_decay = float(group["weight_decay"])
            if "names" in group:
                pg.names = list(group["names"])
            self._set_group_options(pg, group)
            self._params.append(ps)
            native.append(pg)
        self._impl = _optim.make_optimizer(spec, native)

    @staticmethod
    def _lr_scale(group_lr, lr, index):
        if group_lr == lr:
            return 1.0
        if lr == 0:
            raise ValueError(f"parameter group {index} sets lr {group_lr} but the optimizer's lr is 0 "
                             "(a group's lr is kept as a multiple of the optimizer's)")
        return group_lr / lr

    def _set_group_options(self, pg, group):
        raise NotImplementedError

    # ---- torch.optim's interface ----

    def step(self, closure=None):
        """One update of every parameter with a ``.grad`` (others are skipped)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = [[p.grad for p in ps] for ps in self._params]
        self._impl.step(grads)
        # The update wrote through other TensorImpls: tell autograd, as an
        # in-place update of the parameters themselves would.
        for ps in self._params:
            for p in ps:
                if p.grad is not None:
                    torch.autograd.graph.increment_version(p)
        return loss

    def zero_grad(self, set_to_none=True):
        for ps in self._params:
            for p in ps:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    def state_dict(self):
        return self._impl.state_dict()

    def load_state_dict(self, state_dict):
        self._impl.load_state_dict(dict(state_dict))

    # ---- Torus's additions ----

    def set_lr(self, lr):
        """The base learning rate; each group uses lr x its scale."""
        self._impl.set_lr(float(lr))

    @property
    def lr(self):
        return self._impl.lr

    @property
    def step_count(self):
        """Optimizer steps taken (calls of step())."""
        return self._impl.step_count

    def init_state(self):
        """Allocates the state of every parameter now instead of at its first update."""
        self._impl.init_state()

    def state(self, group, index, name):
        """A state tensor ("step", "master", "exp_avg"...) of one parameter, or None."""
        return self._impl.state(group, index, name)

    @property
    def param_groups(self):
        """A snapshot of each group: its parameters and resolved hyper-parameters."""
        return [dict(self._impl.hyperparameters(g), params=list(ps)) for g, ps in enumerate(self._params)]

    def __repr__(self):
        return f"torus.optim.{type(self).__name__}(lr={self.lr}, groups={len(self._params)}, steps={self.step_count})"


class SGD(Optimizer):
    """torch.optim.SGD: momentum, dampening, Nesterov, L2 weight decay."""

    _name = "sgd"
    _group_options = ("momentum", "dampening", "nesterov")

    def __init__(self, params, lr=1e-3, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False, *,
                 master_weights="half"):
        spec = _optim.OptimizerSpec()
        spec.lr, spec.momentum, spec.dampening = float(lr), float(momentum), float(dampening)
        spec.weight_decay, spec.nesterov = float(weight_decay), bool(nesterov)
        super().__init__(params, spec, master_weights)

    def _set_group_options(self, pg, group):
        if "momentum" in group:
            pg.momentum = float(group["momentum"])
        if "dampening" in group:
            pg.dampening = float(group["dampening"])
        if "nesterov" in group:
            pg.nesterov = bool(group["nesterov"])


class _AdamFamily(Optimizer):
    _group_options = ("betas", "eps")

    def __init__(self, params, lr, betas, eps, weight_decay, master_weights):
        spec = _optim.OptimizerSpec()
        spec.lr, spec.eps, spec.weight_decay = float(lr), float(eps), float(weight_decay)
        spec.beta1, spec.beta2 = (float(b) for b in betas)
        super().__init__(params, spec, master_weights)

    def _set_group_options(self, pg, group):
        if "betas" in group:
            pg.beta1, pg.beta2 = (float(b) for b in group["betas"])
        if "eps" in group:
            pg.eps = float(group["eps"])


class Adam(_AdamFamily):
    """torch.optim.Adam: L2 weight decay added to the gradient."""

    _name = "adam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, master_weights="half"):
        super().__init__(params, lr, betas, eps, weight_decay, master_weights)


class AdamW(_AdamFamily):
    """torch.optim.AdamW: decoupled weight decay (torch's default 1e-2)."""

    _name = "adamw"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *, master_weights="half"):
        super().__init__(params, lr, betas, eps, weight_decay, master_weights)


class _CpuAdamFamily(_AdamFamily):
    def set_grad_scale(self, grad_scale, found_inf=None):
        """Multiplies every gradient by ``grad_scale`` inside the update until changed; while ``found_inf`` (a
        one-element float32 CPU tensor, read at each step) is non-zero, ``step()`` changes nothing."""
        self._impl.set_grad_scale(float(grad_scale), found_inf)


class CpuAdam(_CpuAdamFamily):
    """Adam (L2 weight decay) on Torus's vectorised CPU kernel."""

    _name = "cpu_adam"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, *, master_weights="half"):
        super().__init__(params, lr, betas, eps, weight_decay, master_weights)


class CpuAdamW(_CpuAdamFamily):
    """AdamW (decoupled weight decay, torch's default 1e-2) on Torus's vectorised CPU kernel."""

    _name = "cpu_adamw"

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, *, master_weights="half"):
        super().__init__(params, lr, betas, eps, weight_decay, master_weights)


def cpu_adam_step(params, grads, exp_avgs, exp_avg_sqs, *, lr, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0,
                  step, decoupled=True, grad_scale=1.0, found_inf=None, param_outs=None, threads=0, isa="auto"):
    """One Adam (``decoupled=False``) or AdamW update of lists of contiguous CPU tensors, in place.

    ``params``, ``exp_avgs`` and ``exp_avg_sqs`` are float32; ``grads`` float32, bfloat16 or float16;
    ``param_outs`` (optional, entries may be None) receive the updated parameters rounded to their dtype.
    ``step`` is the 1-based update count (bias correction); ``threads`` 0 uses torch's intra-op thread count;
    ``isa`` is "auto", "scalar", "avx2" or "avx512". Releases the GIL.
    """
    b1, b2 = (float(b) for b in betas)
    _optim.cpu_adam_step(list(params), list(grads), list(exp_avgs), list(exp_avg_sqs), lr=float(lr), beta1=b1,
                         beta2=b2, eps=float(eps), weight_decay=float(weight_decay), step=int(step),
                         decoupled=bool(decoupled), grad_scale=float(grad_scale), found_inf=found_inf,
                         param_outs=None if param_outs is None else list(param_outs), threads=int(threads),
                         isa=str(isa))


def cpu_adam_best_isa():
    """The fastest CPU Adam path of this CPU: "avx512", "avx2" or "scalar"."""
    return _optim.cpu_adam_best_isa()


__all__ = ["Adam", "AdamW", "CpuAdam", "CpuAdamW", "Optimizer", "SGD", "cpu_adam_best_isa", "cpu_adam_step"]
