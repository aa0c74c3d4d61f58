"""A torus-plan --json layout turned into torus-train flags for a render."""

from __future__ import annotations

import json
from typing import Any, List

from .instances import Instance

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
    # The mesh's dimensions size the job: torus-plan names them in best.mesh (from the layout's own
    # field table, parallel/layout.h), so a dimension added there reaches this check unchanged.
    dims = best.get("mesh")
    if not isinstance(dims, list) or not dims or not all(isinstance(k, str) and k for k in dims):
        raise PlanError(f"{path}: best.mesh must list the mesh's dimensions, got {dims!r} "
                        "(a plan from an older torus-plan has none: run torus-plan --json again)")
    devices = 1
    for k in dims:
        if not isinstance(best.get(k), int) or isinstance(best.get(k), bool) or best[k] < 1:
            raise PlanError(f"{path}: best.{k} must be a positive integer, got {best.get(k)!r}")
        devices *= best[k]
    world = nodes * instance.ranks_per_node
    if devices != world:
        raise PlanError(f"{path}: {' x '.join(dims)} = {devices} devices, but {nodes} x {instance.name} "
                        f"run {world} ranks")
    args = best.get("args")
    if (not isinstance(args, list) or not args or not all(isinstance(a, str) and a for a in args)
            or not args[0].startswith("--")):
        raise PlanError(f"{path}: best.args must be the layout's torus-train arguments, got {args!r} "
                        "(a plan from an older torus-plan has none: run torus-plan --json again)")
    for k in dims:
        flag = "--" + k
        if flag not in args or args.index(flag) + 1 >= len(args) or args[args.index(flag) + 1] != str(best[k]):
            raise PlanError(f"{path}: best.args {args} do not say {flag} {best[k]} as best.{k} does")
    # torus-plan writes them (parallel::Layout::args): torus-train parses them.
    return list(args)


def conflicting(train_args: List[str], plan_args: List[str]) -> List[str]:
    """The layout flags a command line already sets (the plan's arguments would set them twice)."""
    def name(a: str) -> str:
        # torus-train reads --micro_batches as --micro-batches and --no_sp as --no-sp.
        a = a.split("=", 1)[0].replace("_", "-")
        return "--" + a[5:] if a.startswith("--no-") else a
    names = {name(a) for a in plan_args if a.startswith("--")}
    return [a.split("=", 1)[0] for a in train_args if a.startswith("--") and name(a) in names]
