"""Rendering a launch: the Slurm batch script or the Kubernetes manifests of
one platform, instance type and node count around a torus-train command line.

render() only builds text; the caller validates it with the same rules as
`torus-launch check` before anything is written (cli.py).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import yaml

from .instances import (CAPACITY_LABEL, EFA_RESOURCE, HUGEPAGES_RESOURCE, INSTANCE_LABEL, ZONE_LABEL, Instance,
                        Platform)
from .rules import FSX_DRIVER, MPIJOB_HOSTFILE
from .slurm import HEADER

NEURON_ROOT_PORT = 62182            # any free port on the first host (docs/neuron.md)
EFA_LIBRARY_PATH = "/opt/amazon/ofi-nccl/lib:/opt/amazon/efa/lib"   # the EFA installer's libfabric and plugin


@dataclass
class Request:
    platform: Platform
    instance: Instance
    nodes: int
    train_args: List[str] = field(default_factory=list)
    name: str = "torus"
    namespace: str = "default"
    image: str = "torus:latest"
    train_bin: str = "torus-train"
    zone: Optional[str] = None
    cluster: str = "torus"
    placement_group: Optional[str] = None
    fsx_id: Optional[str] = None
    fsx_dns_name: Optional[str] = None
    fsx_mount_name: Optional[str] = None
    fsx_capacity: str = "1200Gi"
    s3_data_repository: Optional[str] = None
    data_mount: str = "/fsx"
    queue: str = "default"
    partition: Optional[str] = None
    time: Optional[str] = None
    account: Optional[str] = None
    slinky_controller: str = "slurm"
    slinky_namespace: str = "slurm"

    @property
    def world(self) -> int:
        return self.nodes * self.instance.ranks_per_node

    @property
    def slug(self) -> str:
        return f"{self.name}-{self.instance.name.replace('.', '-')}"

    @property
    def region(self) -> str:
        return re.sub(r"[a-z]+$", "", self.zone or "")

    @property
    def taint_key(self) -> str:
        return self.instance.device_resource


class _Dumper(yaml.SafeDumper):
    """Multi-line strings (the launcher's script) as literal blocks, readable as written."""


_Dumper.add_representer(str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s,
                                                              style="|" if "\n" in s else None))


def _yaml(docs: List[Dict[str, Any]], comment: str) -> str:
    head = "".join(f"# {line}\n" for line in comment.splitlines())
    return head + "---\n".join(yaml.dump(d, Dumper=_Dumper, sort_keys=False, default_flow_style=False, width=120)
                                for d in docs)


# --------------------------------------------------------------------------------------------------------------
# Commands

def _train_command(req: Request) -> str:
    return shlex.join([req.train_bin] + list(req.train_args))


def _neuron_root(req: Request, first_host: str) -> List[str]:
    """NEURON_RT_ROOT_COMM_ID=<first host's IP>:<port> for every rank (docs/neuron.md); empty on GPUs."""
    if req.instance.kind != "neuron":
        return []
    return [f"root_host=$({first_host})",
            f'export NEURON_RT_ROOT_COMM_ID="$(getent ahostsv4 "$root_host" | awk \'NR==1{{print $1}}\'):'
            f'{NEURON_ROOT_PORT}"']


def _mpirun(req: Request, hostfile: str, extra: List[str]) -> str:
    exported = ["PATH", "LD_LIBRARY_PATH"] + (["NEURON_RT_ROOT_COMM_ID"] if req.instance.kind == "neuron" else [])
    parts = ["mpirun", "--hostfile", hostfile, "-np", str(req.world),
             "--map-by", f"ppr:{req.instance.ranks_per_node}:node", "--bind-to", "none"] + extra
    for v in exported:
        parts += ["-x", v]
    return " ".join(parts) + " \\\n  " + _train_command(req)


def slurm_script(req: Request) -> str:
    inst, srun = req.instance, req.platform.name in ("slurm-srun", "slinky")
    lines = ["#!/bin/bash",
             f"{HEADER} platform={req.platform.name} instance={inst.name} nodes={req.nodes}",
             f"# {inst.name}: {inst.ranks_per_node} ranks per node, {req.nodes} nodes, {req.world} ranks. "
             "Rendered by torus-launch (docs/launch.md).",
             f"#SBATCH --job-name={req.name}",
             f"#SBATCH --nodes={req.nodes}",
             f"#SBATCH --ntasks-per-node={inst.ranks_per_node}",
             "#SBATCH --exclusive",
             "#SBATCH --output=%x-%j.out"]
    partition = req.partition or (req.slug if req.platform.name == "slinky" else None)
    for opt, val in (("partition", partition), ("time", req.time), ("account", req.account)):
        if val:
            lines.append(f"#SBATCH --{opt}={val}")
    lines += ["set -euo pipefail",
              "# libfabric and the aws-ofi-nccl plugin of the EFA installer; no other EFA variable is needed.",
              f"export LD_LIBRARY_PATH={EFA_LIBRARY_PATH}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"]
    if srun:
        lines += _neuron_root(req, 'scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1')
        lines += [f"srun --mpi=pmix --nodes={req.nodes} --ntasks-per-node={inst.ranks_per_node} "
                  "--cpu-bind=none --kill-on-bad-exit=1 \\\n  " + _train_command(req)]
    else:
        lines += ["# An explicit hostfile from the Slurm node list: every node gets its share of ranks.",
                  'hostfile="/tmp/torus-hostfile.$SLURM_JOB_ID"',
                  f'scontrol show hostnames "$SLURM_JOB_NODELIST" | sed \'s/$/ slots={inst.ranks_per_node}/\' '
                  '> "$hostfile"',
                  f'test "$(wc -l < "$hostfile")" -eq {req.nodes} || '
                  f'{{ echo "expected {req.nodes} hosts in $hostfile" >&2; exit 1; }}']
        lines += _neuron_root(req, 'head -n1 "$hostfile" | cut -d" " -f1')
        lines += [_mpirun(req, '"$hostfile"', [])]
    return "\n".join(lines) + "\n"


def _launcher_script(req: Request, hostfile: str, prepare: List[str]) -> str:
    lines = ["set -euo pipefail"] + prepare
    lines += _neuron_root(req, f"head -n1 {hostfile} | cut -d' ' -f1")
    lines += ["exec " + _mpirun(req, hostfile, ["--allow-run-as-root"])]
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------------------------------------
# Pods

def _labels(req: Request) -> Dict[str, str]:
    return {"app.kubernetes.io/name": "torus", "app.kubernetes.io/instance": req.name}


def _worker_resources(inst: Instance) -> Dict[str, Any]:
    whole_node = {inst.device_resource: inst.device_count, EFA_RESOURCE: inst.efa,
                  HUGEPAGES_RESOURCE: inst.hugepages_2mi, "memory": inst.memory}
    return {"limits": dict(whole_node), "requests": {**whole_node, "cpu": inst.cpu}}


def _worker_container(req: Request, name: str, command: Optional[List[str]]) -> Dict[str, Any]:
    c: Dict[str, Any] = {"name": name, "image": req.image}
    if command:
        c["command"] = command
        c["readinessProbe"] = {"tcpSocket": {"port": 22}, "initialDelaySeconds": 2, "periodSeconds": 2}
    c["resources"] = _worker_resources(req.instance)
    c["volumeMounts"] = [{"name": "dshm", "mountPath": "/dev/shm"},
                         {"name": "data", "mountPath": req.data_mount}]
    return c


def _worker_pod(req: Request, containers: List[Dict[str, Any]], restart: Optional[str] = "Never") -> Dict[str, Any]:
    spec: Dict[str, Any] = {}
    if restart:
        spec["restartPolicy"] = restart
    spec["nodeSelector"] = {INSTANCE_LABEL: req.instance.name, ZONE_LABEL: req.zone, CAPACITY_LABEL: "on-demand"}
    spec["tolerations"] = [{"key": req.taint_key, "operator": "Exists", "effect": "NoSchedule"}]
    if containers:
        spec["containers"] = containers
    spec["volumes"] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}},
                       {"name": "data", "persistentVolumeClaim": {"claimName": f"{req.name}-fsx"}}]
    return spec


def _launcher_pod(req: Request, container: str, script: str) -> Dict[str, Any]:
    return {"restartPolicy": "Never",
            "containers": [{"name": container, "image": req.image, "command": ["/bin/bash", "-c", script],
                            "resources": {"requests": {"cpu": "1", "memory": "2Gi"}}}]}


SSHD = ["/usr/sbin/sshd", "-De"]


def _meta(name: str, namespace: Optional[str], req: Request) -> Dict[str, Any]:
    m: Dict[str, Any] = {"name": name}
    if namespace:
        m["namespace"] = namespace
    m["labels"] = _labels(req)
    return m


# --------------------------------------------------------------------------------------------------------------
# Kubernetes objects

def mpijob(req: Request) -> Dict[str, Any]:
    inst = req.instance
    return {
        "apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob",
        "metadata": _meta(req.name, req.namespace, req),
        "spec": {
            "slotsPerWorker": inst.ranks_per_node,
            "runLauncherAsWorker": False,
            "mpiImplementation": "OpenMPI",
            "launcherCreationPolicy": "WaitForWorkersReady",
            "runPolicy": {"cleanPodPolicy": "Running", "backoffLimit": 0, "ttlSecondsAfterFinished": 86400,
                          "schedulingPolicy": {"minAvailable": req.nodes + 1}},
            "mpiReplicaSpecs": {
                "Launcher": {"replicas": 1, "restartPolicy": "Never", "template": {
                    "metadata": {"labels": _labels(req)},
                    "spec": _launcher_pod(req, "launcher", _launcher_script(req, MPIJOB_HOSTFILE, []))}},
                "Worker": {"replicas": req.nodes, "restartPolicy": "Never", "template": {
                    "metadata": {"labels": _labels(req)},
                    "spec": _worker_pod(req, [_worker_container(req, "worker", SSHD)])}},
            },
        },
    }


def volcano_job(req: Request) -> Dict[str, Any]:
    prepare = [f"sed 's/$/ slots={req.instance.ranks_per_node}/' /etc/volcano/worker.host > /tmp/hostfile"]
    return {
        "apiVersion": "batch.volcano.sh/v1alpha1", "kind": "Job",
        "metadata": _meta(req.name, req.namespace, req),
        "spec": {
            "schedulerName": "volcano",
            "queue": req.queue,
            "minAvailable": req.nodes + 1,
            "maxRetry": 1,
            "ttlSecondsAfterFinished": 86400,
            "plugins": {"ssh": [], "svc": []},
            "policies": [{"event": "PodEvicted", "action": "AbortJob"}, {"event": "PodFailed", "action": "AbortJob"}],
            "tasks": [
                {"name": "launcher", "replicas": 1,
                 "dependsOn": {"name": ["worker"]},
                 "policies": [{"event": "TaskCompleted", "action": "CompleteJob"}],
                 "template": {"metadata": {"labels": _labels(req)},
                              "spec": _launcher_pod(req, "launcher",
                                                    _launcher_script(req, "/tmp/hostfile", prepare))}},
                {"name": "worker", "replicas": req.nodes,
                 "template": {"metadata": {"labels": _labels(req)},
                              "spec": _worker_pod(req, [_worker_container(req, "worker", SSHD)])}},
            ],
        },
    }


def training_runtime(req: Request) -> Dict[str, Any]:
    # The Trainer's MPI plugin mounts the hostfile into, and sets the slots for, containers named "node".
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainingRuntime",
        "metadata": _meta(f"{req.name}-runtime", req.namespace, req),
        "spec": {
            "mlPolicy": {"numNodes": req.nodes,
                         "mpi": {"numProcPerNode": req.instance.ranks_per_node, "mpiImplementation": "OpenMPI",
                                 "sshAuthMountPath": "/root/.ssh", "runLauncherAsNode": False}},
            "podGroupPolicy": {"coscheduling": {"scheduleTimeoutSeconds": 600}},
            "template": {"spec": {
                "network": {"publishNotReadyAddresses": True},
                "successPolicy": {"operator": "All", "targetReplicatedJobs": ["launcher"]},
                "failurePolicy": {"maxRestarts": 0},
                "replicatedJobs": [
                    {"name": "launcher", "replicas": 1, "dependsOn": [{"name": "node", "status": "Ready"}],
                     "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                  "spec": {"backoffLimit": 0, "template": {
                                      "metadata": {"labels": _labels(req)},
                                      "spec": _launcher_pod(req, "node",
                                                            _launcher_script(req, MPIJOB_HOSTFILE, []))}}}},
                    {"name": "node", "replicas": 1,
                     "template": {"spec": {"backoffLimit": 0, "template": {
                         "metadata": {"labels": _labels(req)},
                         "spec": _worker_pod(req, [_worker_container(req, "node", SSHD)])}}}},
                ],
            }},
        },
    }


def trainjob(req: Request) -> Dict[str, Any]:
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1", "kind": "TrainJob",
        "metadata": _meta(req.name, req.namespace, req),
        "spec": {
            "runtimeRef": {"name": f"{req.name}-runtime", "apiGroup": "trainer.kubeflow.org",
                           "kind": "TrainingRuntime"},
            "trainer": {"numNodes": req.nodes, "numProcPerNode": req.instance.ranks_per_node},
        },
    }


def nodeset(req: Request) -> Dict[str, Any]:
    slurmd = _worker_container(req, "slurmd", None)
    slurmd.pop("name")
    # A NodeSet's pods are a StatefulSet's: restartPolicy stays the default (Always).
    return {
        "apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
        "metadata": _meta(req.slug, req.slinky_namespace, req),
        "spec": {
            "controllerRef": {"name": req.slinky_controller},
            "replicas": req.nodes,
            "scalingMode": "StatefulSet",
            "partition": {"enabled": True},
            "slurmd": slurmd,
            "template": {"metadata": {"labels": _labels(req)}, "spec": _worker_pod(req, [], restart=None)},
        },
    }


def nodepool(req: Request) -> List[Dict[str, Any]]:
    pool = {
        "apiVersion": "karpenter.sh/v1", "kind": "NodePool",
        "metadata": {"name": req.slug},
        "spec": {
            "template": {
                "metadata": {"labels": _labels(req)},
                "spec": {
                    "nodeClassRef": {"group": "karpenter.k8s.aws", "kind": "EC2NodeClass", "name": req.slug},
                    "requirements": [
                        {"key": INSTANCE_LABEL, "operator": "In", "values": [req.instance.name]},
                        {"key": ZONE_LABEL, "operator": "In", "values": [req.zone]},
                        {"key": CAPACITY_LABEL, "operator": "In", "values": ["on-demand"]},
                    ],
                    "taints": [{"key": req.taint_key, "effect": "NoSchedule"}],
                    "expireAfter": "Never",
                },
            },
            "disruption": {"consolidationPolicy": "WhenEmpty", "consolidateAfter": "10m"},
        },
    }
    discovery = {"karpenter.sh/discovery": req.cluster}
    node_class: Dict[str, Any] = {
        "apiVersion": "karpenter.k8s.aws/v1", "kind": "EC2NodeClass",
        "metadata": {"name": req.slug},
        "spec": {
            "amiSelectorTerms": [{"alias": "al2023@latest"}],
            "role": f"KarpenterNodeRole-{req.cluster}",
            "subnetSelectorTerms": [{"tags": discovery}],
            "securityGroupSelectorTerms": [{"tags": discovery}],
            "instanceStorePolicy": "RAID0",
            "blockDeviceMappings": [{"deviceName": "/dev/xvda",
                                     "ebs": {"volumeSize": "500Gi", "volumeType": "gp3", "deleteOnTermination": True}}],
        },
    }
    if req.placement_group:
        node_class["spec"]["placementGroupSelector"] = {"name": req.placement_group}
    return [pool, node_class]


def fsx_storage(req: Request, namespace: str) -> List[Dict[str, Any]]:
    pv_meta: Dict[str, Any] = {"name": f"{req.name}-fsx", "labels": _labels(req)}
    if req.s3_data_repository:
        pv_meta["annotations"] = {"torus.launch/s3-data-repository": req.s3_data_repository}
    dns = req.fsx_dns_name or f"{req.fsx_id}.fsx.{req.region}.amazonaws.com"
    pv = {"apiVersion": "v1", "kind": "PersistentVolume", "metadata": pv_meta,
          "spec": {"capacity": {"storage": req.fsx_capacity}, "volumeMode": "Filesystem",
                   "accessModes": ["ReadWriteMany"], "persistentVolumeReclaimPolicy": "Retain",
                   "storageClassName": "", "mountOptions": ["flock"],
                   "csi": {"driver": FSX_DRIVER, "volumeHandle": req.fsx_id,
                           "volumeAttributes": {"dnsname": dns, "mountname": req.fsx_mount_name}}}}
    pvc = {"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": f"{req.name}-fsx", "namespace": namespace, "labels": _labels(req)},
           "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": f"{req.name}-fsx",
                    "resources": {"requests": {"storage": req.fsx_capacity}}}}
    return [pv, pvc]


def render(req: Request) -> List[Tuple[str, str]]:
    """(file name, text) of every file of the launch."""
    p = req.platform.name
    what = f"torus-launch: {p}, {req.instance.name} x {req.nodes} ({req.world} ranks). docs/launch.md explains it."
    if req.platform.family == "slurm":
        return [("torus.sbatch", slurm_script(req))]
    files: List[Tuple[str, str]] = []
    if p == "mpijob":
        files.append(("mpijob.yaml", _yaml([mpijob(req)], what)))
    elif p == "trainjob":
        files.append(("trainjob.yaml", _yaml([training_runtime(req), trainjob(req)], what)))
    elif p == "volcano":
        files.append(("volcano-job.yaml", _yaml([volcano_job(req)], what)))
    elif p == "slinky":
        files.append(("nodeset.yaml", _yaml([nodeset(req)], what + "\nSubmit torus.sbatch to this NodeSet's "
                                                                   "partition once its slurmd pods are up.")))
        files.append(("torus.sbatch", slurm_script(req)))
    files.append(("nodepool.yaml", _yaml(nodepool(req), f"Karpenter: on-demand {req.instance.name} nodes in "
                                                         f"{req.zone} only (EFA does not cross zones).")))
    s3 = (f"\nS3 data repository: {req.s3_data_repository} is linked to the file system by a data repository "
          "association (aws fsx create-data-repository-association), not by the CSI driver."
          if req.s3_data_repository else
          "\nTo back it with S3, create a data repository association on the file system "
          "(torus-launch render --s3-data-repository records it here).")
    files.append(("fsx.yaml", _yaml(fsx_storage(req, req.slinky_namespace if p == "slinky" else req.namespace),
                                    f"FSx for Lustre {req.fsx_id}, statically provisioned through {FSX_DRIVER}."
                                    + s3)))
    return files
