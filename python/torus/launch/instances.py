"""The facts torus-launch renders from and checks against: one table of
instance types, one of platforms and one of EFA-related environment variables.

The instance types are the machines of hardware.json (beside this file) that
have a "launch" entry: the one table of hardware facts, which the C++ library
embeds too (include/torus/device/hardware.h). Everything else in the package
reads these tables; nothing restates a device count or a variable name.
docs/launch.md and docs/efa.md explain each entry.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Dict, Optional, Tuple


@dataclass(frozen=True)
class Instance:
    name: str
    kind: str                # "gpu" or "neuron": which build of torus-train runs on it
    ranks_per_node: int      # one rank per GPU or per NeuronCore
    device_resource: str     # the Kubernetes device-plugin resource a worker pod requests
    device_count: int        # how many of device_resource one node has
    efa: int                 # vpc.amazonaws.com/efa devices of one node
    # Another resource name that also counts as the whole node's devices (trn1:
    # whole chips or cores), with its count; None where there is none.
    alt_device: Optional[Tuple[str, int]] = None
    # Per-worker-pod requests besides the devices: what a pod that takes a whole
    # node may ask for, leaving room for the kubelet and daemon sets.
    cpu: str = "90"
    memory: str = "1000Gi"
    hugepages_2mi: str = "5120Mi"   # EFA's libfabric buffers (see docs/launch.md)


HARDWARE_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hardware.json")


def _load_instances(path: str = HARDWARE_TABLE) -> Dict[str, Instance]:
    with open(path, encoding="utf-8") as f:
        table = json.load(f)
    kinds = {d["name"]: d["kind"] for d in table["devices"]}
    out: Dict[str, Instance] = {}
    for m in table["machines"]:
        launch = m.get("launch")
        if not launch:
            continue
        alt = launch.get("alt_device")
        out[m["instance"]] = Instance(m["instance"], kinds[m["device"]], m["devices_per_node"],
                                      launch["device_resource"], launch["device_count"], m["efa"],
                                      alt_device=(alt[0], alt[1]) if alt else None, cpu=launch["pod_cpu"],
                                      memory=launch["pod_memory"], hugepages_2mi=launch["pod_hugepages_2mi"])
    return out


INSTANCES: Dict[str, Instance] = _load_instances()

EFA_RESOURCE = "vpc.amazonaws.com/efa"
HUGEPAGES_RESOURCE = "hugepages-2Mi"
ZONE_LABEL = "topology.kubernetes.io/zone"
INSTANCE_LABEL = "node.kubernetes.io/instance-type"
CAPACITY_LABEL = "karpenter.sh/capacity-type"


@dataclass(frozen=True)
class Platform:
    name: str
    family: str          # "slurm" or "kubernetes"
    summary: str


PLATFORMS: Dict[str, Platform] = {
    p.name: p
    for p in (
        Platform("slurm-mpirun", "slurm", "sbatch script; mpirun with a hostfile built from the Slurm node list"),
        Platform("slurm-srun", "slurm", "sbatch script; srun --mpi=pmix starts every rank"),
        Platform("slinky", "kubernetes",
                 "Slurm on Kubernetes: a Slinky NodeSet of slurmd pods, Karpenter, FSx, and the sbatch script"),
        Platform("mpijob", "kubernetes", "Kubeflow MPIJob v2beta1 (Open MPI), Karpenter, FSx"),
        Platform("trainjob", "kubernetes",
                 "Kubeflow Trainer TrainJob v1alpha1 with an MPI TrainingRuntime, Karpenter, FSx"),
        Platform("volcano", "kubernetes", "Volcano Job (gang of one launcher and N workers), Karpenter, FSx"),
    )
}


# EFA, libfabric and NCCL variables that older guides set and that current
# releases (libfabric >= 1.18, aws-ofi-nccl >= 1.7; EFA installer 1.29+) make
# obsolete or harmful. Rendered launches never set them; `check` rejects them.
# Name -> why (one line, shown in the problem report). docs/efa.md has the
# history and the versions.
OBSOLETE_EFA_VARIABLES: Dict[str, str] = {
    "FI_EFA_USE_DEVICE_RDMA": "libfabric >= 1.18 uses RDMA read on p4d/p5 by itself; set to 1 it only turns "
                              "a missing capability into a start-up failure",
    "FI_PROVIDER": "aws-ofi-nccl selects the efa provider itself (needed only with aws-ofi-nccl <= 1.5); "
                   "a wrong value silently moves NCCL to another provider",
    "NCCL_PROTO": "NCCL_PROTO=simple was a workaround for aws-ofi-nccl <= 1.5; current plugins "
                  "enable LL/LL128 only when EFA gives the ordering they need, and the plugin's tuner "
                  "chooses the protocol",
    "FI_EFA_FORK_SAFE": "libfabric's efa provider checks fork safety itself since 1.13 "
                        "(kernels >= 5.13 copy DMA pages on fork)",
    "FI_EFA_ENABLE_SHM_TRANSFER": "libfabric configures its shared-memory path itself; the variable is gone",
    "RDMAV_FORK_SAFE": "an rdma-core switch (ibv_fork_init) that costs memory registration speed and "
                       "conflicts with the efa provider's own fork handling",
    "IBV_FORK_SAFE": "same as RDMAV_FORK_SAFE",
}
