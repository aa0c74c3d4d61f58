"""torus-launch render | check: the command line (one argparse table per command).

Exit status: 0 done / no problem; 1 `check` found problems; 2 usage error
(bad option, unknown platform or instance, a plan for another cluster, an
unreadable file); 3 a rendered launch broke a rule (a bug in torus-launch:
nothing is written).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from typing import List, Optional

from .instances import INSTANCES, PLATFORMS
from .plan import PlanError, conflicting, load_plan, plan_flags
from .render import Request, render
from .rules import Expect
from .validate import check_sources, read_sources

USAGE_ERROR, RENDER_BUG = 2, 3


def _positive(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


def _instance(text: str) -> str:
    if text not in INSTANCES:
        raise argparse.ArgumentTypeError(f"unknown instance type '{text}' (known: {', '.join(INSTANCES)})")
    return text


def _zone(text: str) -> str:
    if not re.fullmatch(r"[a-z]{2}(-[a-z]+)+-\d+[a-z]", text):
        raise argparse.ArgumentTypeError(f"'{text}' is not an availability zone name (e.g. us-east-1a)")
    return text


def _fsx_id(text: str) -> str:
    if not re.fullmatch(r"fs-[0-9a-f]{8,17}", text):
        raise argparse.ArgumentTypeError(f"'{text}' is not an FSx file system id (fs-0123456789abcdef0)")
    return text


def _name(text: str) -> str:
    if not re.fullmatch(r"[a-z0-9]([-a-z0-9]{0,38}[a-z0-9])?", text):
        raise argparse.ArgumentTypeError(f"'{text}': use lower-case letters, digits and '-' (at most 40)")
    return text


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="torus-launch",
        description="Render and check launches of torus-train on Slurm and Kubernetes (docs/launch.md).")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    r = sub.add_parser(
        "render", help="write the batch script or manifests of one launch",
        usage="torus-launch render --platform P --instance I --nodes N [options] -- TRAIN_ARGS...",
        description="Render a launch of torus-train and check it with the same rules as `check` before writing "
                    "it. Everything after `--` is torus-train's command line.",
        epilog="platforms: " + "; ".join(f"{p.name}: {p.summary}" for p in PLATFORMS.values()))
    r.add_argument("--platform", required=True, choices=list(PLATFORMS), help="where the job runs")
    r.add_argument("--instance", required=True, type=_instance, metavar="I",
                   help="instance type: " + ", ".join(INSTANCES))
    r.add_argument("--nodes", required=True, type=_positive, metavar="N", help="nodes (one rank per device)")
    r.add_argument("--out", metavar="DIR", help="output directory, new or empty "
                                                "(default: ./torus-launch-<platform>-<instance>-<N>n)")
    r.add_argument("--plan", metavar="PLAN.json",
                   help="a torus-plan --json output: its best layout becomes torus-train's layout flags")
    r.add_argument("--name", type=_name, default="torus", help="job name, prefix of every object (default torus)")
    r.add_argument("--train-bin", default="torus-train", help="the torus-train executable on the nodes")
    g = r.add_argument_group("Slurm (slurm-mpirun, slurm-srun, slinky)")
    g.add_argument("--partition", help="#SBATCH --partition (slinky: the NodeSet's own partition)")
    g.add_argument("--time", help="#SBATCH --time, e.g. 2-00:00:00")
    g.add_argument("--account", help="#SBATCH --account")
    g = r.add_argument_group("Kubernetes (slinky, mpijob, trainjob, volcano)")
    g.add_argument("--zone", type=_zone, help="the one availability zone of every node (required)")
    g.add_argument("--image", default="torus:latest", help="container image with torus-train, Open MPI, "
                                                           "sshd and the EFA user space (default torus:latest)")
    g.add_argument("--namespace", default="default", help="namespace of the job and the claim (default default)")
    g.add_argument("--cluster", default="torus", help="EKS cluster name: Karpenter's discovery tag and node role "
                                                      "KarpenterNodeRole-<cluster> (default torus)")
    g.add_argument("--placement-group", metavar="NAME", help="EC2 cluster placement group of the nodes")
    g.add_argument("--fsx-id", type=_fsx_id, help="FSx for Lustre file system id (required)")
    g.add_argument("--fsx-mount-name", help="the file system's mount name (required; aws fsx describe-file-systems)")
    g.add_argument("--fsx-dns-name", help="the file system's DNS name (default <id>.fsx.<region>.amazonaws.com)")
    g.add_argument("--fsx-capacity", default="1200Gi", help="the volume's capacity (default 1200Gi)")
    g.add_argument("--s3-data-repository", metavar="S3_URI",
                   help="s3://bucket/prefix linked to the file system (recorded as an annotation)")
    g.add_argument("--data-mount", default="/fsx", help="where the file system is mounted (default /fsx)")
    g.add_argument("--queue", default="default", help="volcano: the queue (default default)")
    g.add_argument("--slinky-controller", default="slurm", help="slinky: the Controller's name (default slurm)")
    g.add_argument("--slinky-namespace", default="slurm", help="slinky: the NodeSet's namespace (default slurm)")

    c = sub.add_parser(
        "check", help="validate hand-written manifests and batch scripts",
        description="Validate manifests (multi-document YAML) and Slurm batch scripts with the rules render "
                    "keeps: each custom resource against its CRD in strict mode, then the operators' and "
                    "EFA's rules. Manifests given together are checked as one set (one zone, references). "
                    "Exit status 1 if any problem, 0 if none, 2 on a usage error.")
    c.add_argument("files", nargs="+", metavar="FILE", help="YAML manifests or batch scripts (a directory: "
                                                             "every file in it)")
    c.add_argument("--instance", type=_instance, metavar="I", help="expect this instance type")
    c.add_argument("--nodes", type=_positive, metavar="N", help="expect this many worker nodes")
    parser.commands = {"render": r, "check": c}  # each command's parser, for its own error()
    return parser


def _split(argv: List[str]):
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def cmd_render(parser: argparse.ArgumentParser, a: argparse.Namespace, train_args: List[str]) -> int:
    platform, instance = PLATFORMS[a.platform], INSTANCES[a.instance]
    render_parser = parser.commands["render"]
    if platform.family == "kubernetes":
        missing = [o for o, v in (("--zone", a.zone), ("--fsx-id", a.fsx_id), ("--fsx-mount-name", a.fsx_mount_name))
                   if not v]
        if missing:
            render_parser.error(f"platform {a.platform} needs {', '.join(missing)}")
    if a.plan:
        try:
            flags = plan_flags(load_plan(a.plan), a.nodes, instance, a.plan)
        except PlanError as e:
            render_parser.error(str(e))
        dup = conflicting(train_args, flags)
        if dup:
            render_parser.error(f"--plan sets the layout, but the torus-train arguments already give {', '.join(dup)}")
        train_args = flags + train_args
    req = Request(platform=platform, instance=instance, nodes=a.nodes, train_args=train_args, name=a.name,
                  namespace=a.namespace, image=a.image, train_bin=a.train_bin, zone=a.zone, cluster=a.cluster,
                  placement_group=a.placement_group, fsx_id=a.fsx_id, fsx_dns_name=a.fsx_dns_name,
                  fsx_mount_name=a.fsx_mount_name, fsx_capacity=a.fsx_capacity,
                  s3_data_repository=a.s3_data_repository, data_mount=a.data_mount, queue=a.queue,
                  partition=a.partition, time=a.time, account=a.account, slinky_controller=a.slinky_controller,
                  slinky_namespace=a.slinky_namespace)
    files = render(req)
    problems = check_sources(files, Expect(instance=instance, nodes=a.nodes))
    if problems:
        print("torus-launch: internal error: the rendered launch breaks its own rules (a bug; nothing written):",
              file=sys.stderr)
        for p in problems:
            print(f"  {p}", file=sys.stderr)
        return RENDER_BUG
    out = a.out or f"torus-launch-{a.platform}-{a.instance}-{a.nodes}n"
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        render_parser.error(f"--out {out} exists and is not an empty directory")
    os.makedirs(out, exist_ok=True)
    for name, text in files:
        path = os.path.join(out, name)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        if name.endswith(".sbatch"):
            os.chmod(path, 0o755)
        print(f"wrote {path}")
    print(f"{a.platform}, {instance.name} x {a.nodes}: {req.world} ranks, {instance.ranks_per_node} per node; "
          f"checked: no problem")
    return 0


def cmd_check(a: argparse.Namespace) -> int:
    try:
        sources = read_sources(a.files)
    except OSError as e:
        print(f"torus-launch check: {e}", file=sys.stderr)
        return USAGE_ERROR
    expect = Expect(instance=INSTANCES[a.instance] if a.instance else None, nodes=a.nodes)
    problems = check_sources(sources, expect)
    for p in problems:
        print(p)
    print(f"{len(sources)} file(s): {len(problems)} problem(s)", file=sys.stderr)
    return 1 if problems else 0


def main(argv: Optional[List[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    own, train_args = _split(argv)
    parser = build_parser()
    a = parser.parse_args(own)
    if a.command == "render":
        return cmd_render(parser, a, train_args)
    if train_args:
        parser.commands["check"].error("`--` and arguments after it belong to render")
    return cmd_check(a)
