"""A torus-plan --json layout turned into torus-train flags for a render."""

from __future__ import annotations

import json
from typing import Any, List

from .instances import Instance

# (field of "best", torus-train flag): the planner's names and run_config.cpp's options.
PLAN_FLAGS = (("tp", "--tp"), ("pp", "--pp"), ("dp", "--dp"), ("ep", "--ep"), ("schedule", "--schedule"),
              ("chunks", "--chunks"), ("zero", "--zero"), ("offload", "--offload"), ("recompute", "--recompute"),
              ("micro_batches", "--micro-batches"))
_INTS = ("tp", "pp", "dp", "ep", "chunks", "zero", "micro_batches")


class PlanError(Exception):
    """A plan that cannot be used for this render; reported as a usage error."""


def load_plan(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise PlanError(f"--plan {path}: {e}") from None


def plan_flags(plan: Any, nodes: int, instance: Instance, path: str = "plan") -> List[str]:
    """The flags of plan["best"], refusing a plan made for another node or device count."""
    best = plan.get("best") if isinstance(plan, dict) else None
    if not isinstance(best, dict):
        raise PlanError(f"{path}: no \"best\" layout (the planner found none that fits)")
    request = plan.get("request") or {}
    if request.get("nodes") != nodes:
        raise PlanError(f"{path}: planned for {request.get('nodes')} nodes, rendering {nodes}")
    hardware = request.get("hardware") or {}
    per_node = hardware.get("devices_per_node")
    if per_node is not None and per_node != instance.ranks_per_node:
        raise PlanError(f"{path}: planned for {per_node} devices per node ({hardware.get('name')}), but a "
                        f"{instance.name} runs {instance.ranks_per_node} ranks")
    for k in _INTS:
        if not isinstance(best.get(k), int) or isinstance(best.get(k), bool) or best[k] < (0 if k == "zero" else 1):
            raise PlanError(f"{path}: best.{k} must be a positive integer, got {best.get(k)!r}")
    for k in ("schedule", "offload", "recompute"):
        if not isinstance(best.get(k), str) or not best[k]:
            raise PlanError(f"{path}: best.{k} must be a string, got {best.get(k)!r}")
    if not isinstance(best.get("sp"), bool):
        raise PlanError(f"{path}: best.sp must be true or false, got {best.get('sp')!r}")
    devices = best["tp"] * best["pp"] * best["dp"] * best["ep"]
    world = nodes * instance.ranks_per_node
    if devices != world:
        raise PlanError(f"{path}: tp x pp x dp x ep = {devices} devices, but {nodes} x {instance.name} "
                        f"run {world} ranks")
    flags: List[str] = []
    for key, flag in PLAN_FLAGS:
        flags += [flag, str(best[key])]
    flags.append("--sp" if best["sp"] else "--no-sp")
    return flags


def conflicting(train_args: List[str]) -> List[str]:
    """The layout flags a command line already sets (a plan would set them twice)."""
    names = {f for _, f in PLAN_FLAGS} | {"--sp", "--no-sp"}
    return [a.split("=", 1)[0] for a in train_args if a.split("=", 1)[0] in names]
