"""torus-launch: every platform x instance x node count renders and passes its
own checks; each rule rejects a manifest or script that breaks it, naming the
field; --plan; --help; usage errors exit 2."""

import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import LAUNCH_DIR
from torus_launch.instances import INSTANCES, OBSOLETE_EFA_VARIABLES, PLATFORMS

K8S = ["--zone", "us-east-1a", "--fsx-id", "fs-0123456789abcdef0", "--fsx-mount-name", "abcdefgh"]
TRAIN = ["--", "--model", "gpt2", "--steps", "100", "--data", "/fsx/data/train.tok"]


def render(run, tmp_path, platform, instance="p5.48xlarge", nodes=2, *extra, args=TRAIN):
    out = tmp_path / f"{platform}-{instance}-{nodes}"
    rc, stdout, err = run("render", "--platform", platform, "--instance", instance, "--nodes", nodes,
                          "--out", out, *K8S, *extra, *args)
    assert rc == 0, err
    return out, stdout


@pytest.mark.parametrize("nodes", [1, 2, 16])
@pytest.mark.parametrize("instance", list(INSTANCES))
@pytest.mark.parametrize("platform", list(PLATFORMS))
def test_every_combination_renders_and_checks(run, tmp_path, platform, instance, nodes):
    out, stdout = render(run, tmp_path, platform, instance, nodes)
    files = sorted(os.listdir(out))
    assert files and all(f"wrote {out / f}" in stdout for f in files)
    inst = INSTANCES[instance]
    world = nodes * inst.ranks_per_node
    text = "".join((out / f).read_text() for f in files)
    assert f"-np {world}" in text or f"--ntasks-per-node={inst.ranks_per_node}" in text
    assert not any(v in text for v in OBSOLETE_EFA_VARIABLES)
    # What was written passes `check` again, read back from disk, with and without the expectations.
    rc, stdout, err = run("check", out)
    assert rc == 0, stdout
    rc, stdout, err = run("check", "--instance", instance, "--nodes", nodes, *[out / f for f in files])
    assert rc == 0, stdout
    if PLATFORMS[platform].family == "kubernetes":
        docs = [d for f in files if f.endswith(".yaml") for d in yaml.safe_load_all((out / f).read_text()) if d]
        kinds = {d["kind"] for d in docs}
        assert {"NodePool", "EC2NodeClass", "PersistentVolume", "PersistentVolumeClaim"} <= kinds
        assert f"vpc.amazonaws.com/efa: {inst.efa}\n" in text
        assert f"{inst.device_resource}: {inst.device_count}\n" in text


# ---------------------------------------------------------------------------------------------------------------
# Negative tests: a rendered launch, broken in one place, is rejected naming the field.

def load(path):
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def write(path, docs):
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))


def broken(run, tmp_path, platform, filename, mutate, instance="p5.48xlarge", nodes=2, others=True):
    """Renders, applies mutate(docs) to one file, and runs check on the whole set: (rc, report)."""
    out, _ = render(run, tmp_path, platform, instance, nodes)
    docs = load(out / filename)
    mutate(docs)
    write(out / filename, docs)
    files = [out / f for f in sorted(os.listdir(out))] if others else [out / filename]
    rc, stdout, err = run("check", *files)
    return rc, stdout


def kind(docs, k):
    return next(d for d in docs if d["kind"] == k)


def mpi_worker(docs):
    return docs[0]["spec"]["mpiReplicaSpecs"]["Worker"]


def worker_container(docs):
    return mpi_worker(docs)["template"]["spec"]["containers"][0]


def launcher_command(docs):
    return docs[0]["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]["command"]


def _typo(docs):
    docs[0]["spec"]["slotPerWorker"] = docs[0]["spec"].pop("slotsPerWorker")


def _set(path, value):
    def mutate(docs):
        obj = docs[0]
        for k in path[:-1]:
            obj = obj[k]
        if value is KeyError:
            del obj[path[-1]]
        else:
            obj[path[-1]] = value
    return mutate


MPIJOB_CASES = [
    ("typo slotPerWorker", _typo, "spec.slotPerWorker: unknown field", "did you mean 'slotsPerWorker'"),
    ("typo deep in the pod", lambda d: worker_container(d).__setitem__("volumeMount", []),
     "spec.mpiReplicaSpecs.Worker.template.spec.containers[0].volumeMount: unknown field", None),
    ("wrong worker replicas", _set(["spec", "mpiReplicaSpecs", "Worker", "replicas"], 3),
     "spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].command: mpirun -np 16, but 3 worker pods", None),
    ("two launchers", _set(["spec", "mpiReplicaSpecs", "Launcher", "replicas"], 2),
     "spec.mpiReplicaSpecs.Launcher.replicas: 2: exactly one Launcher", None),
    ("no worker", lambda d: d[0]["spec"]["mpiReplicaSpecs"].pop("Worker"),
     "spec.mpiReplicaSpecs.Worker: missing", None),
    ("slots differ from devices", _set(["spec", "slotsPerWorker"], 4),
     "spec.slotsPerWorker: 4, but a p5.48xlarge runs 8 ranks", None),
    ("missing cleanPodPolicy", lambda d: d[0]["spec"]["runPolicy"].pop("cleanPodPolicy"),
     "spec.runPolicy.cleanPodPolicy: set it explicitly", None),
    ("restartPolicy Always", _set(["spec", "mpiReplicaSpecs", "Worker", "restartPolicy"], "Always"),
     "spec.mpiReplicaSpecs.Worker.restartPolicy: 'Always'", None),
    ("value not in the enum", _set(["spec", "mpiImplementation"], "OpenMP"),
     "spec.mpiImplementation: 'OpenMP' is not one of ['OpenMPI', 'Intel', 'MPICH'] (enum", None),
    ("launcher runs ranks", _set(["spec", "runLauncherAsWorker"], True), "spec.runLauncherAsWorker: true", None),
    ("missing hostfile", lambda d: launcher_command(d).__setitem__(
        2, launcher_command(d)[2].replace("--hostfile /etc/mpi/hostfile ", "")),
     "spec.mpiReplicaSpecs.Launcher.template.spec.containers[0].command: mpirun has no --hostfile", None),
    ("wrong EFA count", lambda d: worker_container(d)["resources"]["limits"].__setitem__("vpc.amazonaws.com/efa", 4),
     'containers[0].resources.limits."vpc.amazonaws.com/efa": 4 EFA devices, but p5.48xlarge has 32', None),
    ("EFA request differs from limit",
     lambda d: worker_container(d)["resources"]["requests"].__setitem__("vpc.amazonaws.com/efa", 16),
     'resources.requests."vpc.amazonaws.com/efa": 16 differs from the limit 32', None),
    ("wrong GPU count", lambda d: worker_container(d)["resources"]["limits"].__setitem__("nvidia.com/gpu", 4),
     'resources.limits."nvidia.com/gpu": 4, but p5.48xlarge has 8', None),
    ("no huge pages", lambda d: [worker_container(d)["resources"][w].pop("hugepages-2Mi") for w in ("limits", "requests")],
     "resources.limits.hugepages-2Mi: missing", None),
    ("no /dev/shm", lambda d: worker_container(d)["volumeMounts"].pop(0),
     "spec.mpiReplicaSpecs.Worker.template.spec.volumes: no memory-backed /dev/shm", None),
    ("obsolete EFA variable", lambda d: worker_container(d).__setitem__(
        "env", [{"name": "FI_EFA_USE_DEVICE_RDMA", "value": "1"}]),
     "spec.mpiReplicaSpecs.Worker.template.spec.containers[0].env[0].name: FI_EFA_USE_DEVICE_RDMA is obsolete", None),
    ("obsolete variable passed by mpirun", lambda d: launcher_command(d).__setitem__(
        2, launcher_command(d)[2].replace("-x PATH", "-x NCCL_PROTO=simple -x PATH")),
     "containers[0].command: NCCL_PROTO is obsolete", None),
    ("spot worker", lambda d: mpi_worker(d)["template"]["spec"]["nodeSelector"].__setitem__(
        "karpenter.sh/capacity-type", "spot"), '"karpenter.sh/capacity-type": capacity type \'spot\'', None),
    ("worker not pinned to a zone", lambda d: mpi_worker(d)["template"]["spec"]["nodeSelector"].pop(
        "topology.kubernetes.io/zone"), '"topology.kubernetes.io/zone": missing', None),
    ("worker in another zone than the NodePool", lambda d: mpi_worker(d)["template"]["spec"]["nodeSelector"].__setitem__(
        "topology.kubernetes.io/zone", "us-east-1b"), "MPIJob/torus pins us-east-1b", "ranks in two zones"),
    ("launcher takes GPUs", lambda d: d[0]["spec"]["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
     ["resources"].__setitem__("limits", {"nvidia.com/gpu": 8}), "the launcher runs no ranks", None),
    ("gang minAvailable", _set(["spec", "runPolicy", "schedulingPolicy", "minAvailable"], 2),
     "spec.runPolicy.schedulingPolicy.minAvailable: 2, but the gang is 2 workers + 1 launcher = 3", None),
    ("unserved version", _set(["apiVersion"], "kubeflow.org/v1"), "apiVersion: kubeflow.org/v1 is not served", None),
    ("wrong type", _set(["spec", "slotsPerWorker"], "8"), "spec.slotsPerWorker: '8' is not of type 'integer'", None),
    ("bad name", _set(["metadata", "name"], "Torus_Job"), "metadata.name: 'Torus_Job' does not match", None),
]


@pytest.mark.parametrize("case", MPIJOB_CASES, ids=[c[0] for c in MPIJOB_CASES])
def test_mpijob_rule(run, tmp_path, case):
    _, mutate, expected, also = case
    rc, report = broken(run, tmp_path, "mpijob", "mpijob.yaml", mutate)
    assert rc == 1
    assert expected in report, report
    if also:
        assert also in report, report


def test_int_or_string_quantities_pass(run, tmp_path):
    """Quantities are int-or-string in the schema: "8" and "5Gi" are as good as 8."""
    def mutate(docs):
        worker_container(docs)["resources"]["limits"]["nvidia.com/gpu"] = "8"
        worker_container(docs)["resources"]["requests"]["nvidia.com/gpu"] = "8"
    rc, report = broken(run, tmp_path, "mpijob", "mpijob.yaml", mutate)
    assert rc == 0, report


def _nodepool_req(key, values, operator="In"):
    def mutate(docs):
        for r in kind(docs, "NodePool")["spec"]["template"]["spec"]["requirements"]:
            if r["key"] == key:
                r["values"], r["operator"] = values, operator
    return mutate


NODEPOOL_CASES = [
    ("two zones", _nodepool_req("topology.kubernetes.io/zone", ["us-east-1a", "us-east-1b"]),
     "spec.template.spec.requirements[1].values: In ['us-east-1a', 'us-east-1b']: pin exactly one zone"),
    ("spot capacity", _nodepool_req("karpenter.sh/capacity-type", ["spot"]),
     "spec.template.spec.requirements[2].values: karpenter.sh/capacity-type must be In [on-demand]"),
    ("spot or on-demand", _nodepool_req("karpenter.sh/capacity-type", ["spot", "on-demand"]),
     "karpenter.sh/capacity-type must be In [on-demand]"),
    ("another instance", _nodepool_req("node.kubernetes.io/instance-type", ["p4d.24xlarge"]),
     "spec.template.spec.requirements[0].values: instance type p4d.24xlarge, but MPIJob/torus pins p5.48xlarge"),
    ("bad operator", _nodepool_req("topology.kubernetes.io/zone", ["us-east-1a"], "Among"),
     "spec.template.spec.requirements[1].operator: 'Among' is not one of"),
    ("consolidation evicts ranks",
     lambda d: kind(d, "NodePool")["spec"]["disruption"].__setitem__("consolidationPolicy", "WhenEmptyOrUnderutilized"),
     "spec.disruption.consolidationPolicy: set WhenEmpty"),
    ("expiry under a job", lambda d: kind(d, "NodePool")["spec"]["template"]["spec"].pop("expireAfter"),
     "spec.template.spec.expireAfter: set it explicitly"),
    ("node class reference", lambda d: kind(d, "NodePool")["spec"]["template"]["spec"]["nodeClassRef"].__setitem__(
        "name", "gpu"), "spec.template.spec.nodeClassRef.name: 'gpu' is none of the EC2NodeClasses"),
    ("role and instance profile", lambda d: kind(d, "EC2NodeClass")["spec"].__setitem__("instanceProfile", "x"),
     "EC2NodeClass/torus-p5-48xlarge: spec.role: set exactly one of role and instanceProfile"),
    ("typo in the node class", lambda d: kind(d, "EC2NodeClass")["spec"].__setitem__("subnetSelector", []),
     "spec.subnetSelector: unknown field"),
]


@pytest.mark.parametrize("case", NODEPOOL_CASES, ids=[c[0] for c in NODEPOOL_CASES])
def test_karpenter_rule(run, tmp_path, case):
    _, mutate, expected = case
    rc, report = broken(run, tmp_path, "mpijob", "nodepool.yaml", mutate)
    assert rc == 1 and expected in report, report


def _volcano_task(i):
    return lambda docs: docs[0]["spec"]["tasks"][i]


VOLCANO_CASES = [
    ("minAvailable is not the gang", _set(["spec", "minAvailable"], 2),
     "spec.minAvailable: 2, but the gang (sum of task replicas) is 3"),
    ("no scheduler", _set(["spec", "schedulerName"], KeyError), "spec.schedulerName: None: set volcano"),
    ("no queue", _set(["spec", "queue"], KeyError), "spec.queue: missing"),
    ("no svc plugin", lambda d: d[0]["spec"]["plugins"].pop("svc"), "spec.plugins.svc: missing"),
    ("no job policies", _set(["spec", "policies"], KeyError), "spec.policies: missing"),
    ("launcher never completes the job", lambda d: d[0]["spec"]["tasks"][0].pop("policies"),
     "spec.tasks[0].policies: the launcher task needs TaskCompleted -> CompleteJob"),
    ("more workers than -np", lambda d: d[0]["spec"]["tasks"][1].__setitem__("replicas", 3),
     "mpirun -np 16, but 3 worker pods"),
    ("missing hostfile", lambda d: d[0]["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"].__setitem__(
        2, d[0]["spec"]["tasks"][0]["template"]["spec"]["containers"][0]["command"][2].replace(
            "--hostfile /tmp/hostfile ", "")), "mpirun has no --hostfile"),
    ("typo in a task", lambda d: d[0]["spec"]["tasks"][1].__setitem__("replica", 2), "spec.tasks[1].replica: unknown"),
]


@pytest.mark.parametrize("case", VOLCANO_CASES, ids=[c[0] for c in VOLCANO_CASES])
def test_volcano_rule(run, tmp_path, case):
    _, mutate, expected = case
    rc, report = broken(run, tmp_path, "volcano", "volcano-job.yaml", mutate)
    assert rc == 1 and "Job/torus" in report and expected in report, report


def _runtime(docs):
    return kind(docs, "TrainingRuntime")


TRAINJOB_CASES = [
    ("procs differ from devices",
     lambda d: _runtime(d)["spec"]["mlPolicy"]["mpi"].__setitem__("numProcPerNode", 4),
     "spec.mlPolicy.mpi.numProcPerNode: 4, but a p5.48xlarge runs 8 ranks"),
    ("launcher as node", lambda d: _runtime(d)["spec"]["mlPolicy"]["mpi"].__setitem__("runLauncherAsNode", True),
     "spec.mlPolicy.mpi.runLauncherAsNode: true"),
    ("no gang", lambda d: _runtime(d)["spec"].pop("podGroupPolicy"), "spec.podGroupPolicy: missing"),
    ("numNodes differs from -np", lambda d: kind(d, "TrainJob")["spec"]["trainer"].__setitem__("numNodes", 3),
     "mpirun -np 16, but 3 worker pods"),
    ("typo in the TrainJob", lambda d: kind(d, "TrainJob")["spec"]["trainer"].__setitem__("numNode", 3),
     "TrainJob/torus: spec.trainer.numNode: unknown field"),
    ("obsolete variable in the TrainJob", lambda d: kind(d, "TrainJob")["spec"]["trainer"].__setitem__(
        "env", [{"name": "FI_PROVIDER", "value": "efa"}]), "spec.trainer.env[0].name: FI_PROVIDER is obsolete"),
    ("no failure policy", lambda d: _runtime(d)["spec"]["template"]["spec"].pop("failurePolicy"),
     "spec.template.spec.failurePolicy: set it explicitly"),
]


@pytest.mark.parametrize("case", TRAINJOB_CASES, ids=[c[0] for c in TRAINJOB_CASES])
def test_trainjob_rule(run, tmp_path, case):
    _, mutate, expected = case
    rc, report = broken(run, tmp_path, "trainjob", "trainjob.yaml", mutate)
    assert rc == 1 and expected in report, report


def test_slinky_nodeset_rules(run, tmp_path):
    def mutate(docs):
        docs[0]["spec"]["slurmd"]["resources"]["limits"]["aws.amazon.com/neuron"] = 8
        docs[0]["spec"]["scalingMode"] = "DaemonSet"
        docs[0]["spec"]["replicas"] = 3
    out, _ = render(run, tmp_path, "slinky", "trn1.32xlarge", 2)
    docs = load(out / "nodeset.yaml")
    mutate(docs)
    write(out / "nodeset.yaml", docs)
    rc, report, _ = run("check", "--nodes", 2, out)
    assert rc == 1
    assert 'NodeSet/torus-trn1-32xlarge: spec.slurmd.resources.limits."aws.amazon.com/neuron": 8, but ' \
           "trn1.32xlarge has 16" in report
    assert "spec.scalingMode: DaemonSet ignores replicas" in report
    assert "spec.replicas: 3 worker nodes, expected 2" in report


def test_trn1_neuroncores_count_as_the_whole_node(run, tmp_path):
    def mutate(docs):
        for w in ("limits", "requests"):
            r = docs[0]["spec"]["slurmd"]["resources"][w]
            r.pop("aws.amazon.com/neuron")
            r["aws.amazon.com/neuroncore"] = 32
    out, _ = render(run, tmp_path, "slinky", "trn1.32xlarge", 2)
    docs = load(out / "nodeset.yaml")
    mutate(docs)
    write(out / "nodeset.yaml", docs)
    assert run("check", out)[0] == 0


FSX_CASES = [
    ("wrong driver", lambda d: kind(d, "PersistentVolume")["spec"]["csi"].__setitem__("driver", "efs.csi.aws.com"),
     "PersistentVolume/torus-fsx: spec.csi.driver: 'efs.csi.aws.com': FSx for Lustre is fsx.csi.aws.com"),
    ("unknown PV field", lambda d: kind(d, "PersistentVolume")["spec"].__setitem__("storageClass", ""),
     "spec.storageClass: unknown field of a PersistentVolume spec"),
    ("unknown top-level field", lambda d: kind(d, "PersistentVolumeClaim").__setitem__("specs", {}),
     "PersistentVolumeClaim/torus-fsx: specs: unknown field"),
    ("claim of another volume", lambda d: kind(d, "PersistentVolumeClaim")["spec"].__setitem__("volumeName", "x"),
     "spec.volumeName: 'x' is none of the PersistentVolumes here"),
    ("dns of another file system", lambda d: kind(d, "PersistentVolume")["spec"]["csi"]["volumeAttributes"]
     .__setitem__("dnsname", "fs-1111111111111111.fsx.us-east-1.amazonaws.com"), "is not fs-0123456789abcdef0's DNS name"),
    ("no mount name", lambda d: kind(d, "PersistentVolume")["spec"]["csi"]["volumeAttributes"].pop("mountname"),
     "spec.csi.volumeAttributes.mountname: missing"),
]


@pytest.mark.parametrize("case", FSX_CASES, ids=[c[0] for c in FSX_CASES])
def test_fsx_rule(run, tmp_path, case):
    _, mutate, expected = case
    rc, report = broken(run, tmp_path, "mpijob", "fsx.yaml", mutate)
    assert rc == 1 and expected in report, report


# ---------------------------------------------------------------------------------------------------------------
# Slurm scripts

def script(run, tmp_path, platform="slurm-mpirun", instance="p4d.24xlarge", nodes=2):
    out, _ = render(run, tmp_path, platform, instance, nodes)
    return out / "torus.sbatch"


@pytest.mark.parametrize("case", [
    ("obsolete export", lambda s: s.replace("set -euo pipefail", "set -euo pipefail\nexport FI_PROVIDER=efa"),
     "line 10: FI_PROVIDER is obsolete"),
    ("obsolete via mpirun -x", lambda s: s.replace("-x PATH", "-x FI_EFA_FORK_SAFE=1 -x PATH"),
     "FI_EFA_FORK_SAFE is obsolete"),
    ("nodes differ from the render", lambda s: s.replace("--nodes=2", "--nodes=3"), "#SBATCH --nodes=3, expected 2"),
    ("node range", lambda s: s.replace("--nodes=2", "--nodes=1-2"), "a range lets Slurm start fewer nodes"),
    ("ranks per node", lambda s: s.replace("--ntasks-per-node=8", "--ntasks-per-node=4"),
     "#SBATCH --ntasks-per-node=4, but a p4d.24xlarge runs 8 ranks"),
    ("not exclusive", lambda s: s.replace("#SBATCH --exclusive\n", ""), "#SBATCH --exclusive: missing"),
    ("no hostfile", lambda s: s.replace('--hostfile "$hostfile" ', ""), "mpirun has no --hostfile"),
    ("-np", lambda s: s.replace("-np 16", "-np 8"), "mpirun -np 8, but 2 nodes x 8 tasks = 16"),
], ids=lambda c: c[0])
def test_slurm_mpirun_rule(run, tmp_path, case):
    _, edit, expected = case
    path = script(run, tmp_path)
    path.write_text(edit(path.read_text()))
    rc, report, _ = run("check", path)
    assert rc == 1 and f"{path}: script: " in report and expected in report, report


def test_slurm_srun_needs_pmix(run, tmp_path):
    path = script(run, tmp_path, "slurm-srun", "trn1.32xlarge", 16)
    path.write_text(path.read_text().replace("--mpi=pmix ", ""))
    rc, report, _ = run("check", path)
    assert rc == 1 and "srun without --mpi=pmix" in report, report


def test_hand_written_script_without_header_needs_instance(run, tmp_path):
    path = tmp_path / "job.sh"
    path.write_text("#!/bin/bash\n#SBATCH --nodes=4\n#SBATCH --ntasks-per-node=32\n#SBATCH --exclusive\n"
                    "srun --mpi=pmix torus-train --model gpt2\n")
    rc, report, _ = run("check", path)
    assert rc == 1 and "cannot tell the instance type" in report
    assert run("check", "--instance", "trn1.32xlarge", path)[0] == 0
    rc, report, _ = run("check", "--instance", "p5.48xlarge", "--nodes", 4, path)
    assert rc == 1 and "--ntasks-per-node=32, but a p5.48xlarge runs 8 ranks" in report


# ---------------------------------------------------------------------------------------------------------------
# check on hand-written manifests

HAND_WRITTEN = """\
# An MPIJob written by hand, with a ConfigMap beside it in the same file.
apiVersion: v1
kind: ConfigMap
metadata: {name: torus-env}
data: {TORUS_LOG_LEVEL: info}
---
apiVersion: kubeflow.org/v2beta1
kind: MPIJob
metadata: {name: llama, namespace: training}
spec:
  slotsPerWorker: 32
  runPolicy: {cleanPodPolicy: Running}
  mpiReplicaSpecs:
    Launcher:
      replicas: 1
      restartPolicy: OnFailure
      template:
        spec:
          containers:
          - name: launcher
            image: example/torus:1
            command: [mpirun, --hostfile, /etc/mpi/hostfile, -np, "128", torus-train, --model, llama-7b]
    Worker:
      replicas: 4
      restartPolicy: Never
      template:
        spec:
          nodeSelector:
            node.kubernetes.io/instance-type: trn1.32xlarge
            topology.kubernetes.io/zone: us-west-2d
          containers:
          - name: worker
            image: example/torus:1
            resources:
              limits: {aws.amazon.com/neuron: 16, vpc.amazonaws.com/efa: 8, hugepages-2Mi: 5Gi, memory: 400Gi}
            volumeMounts: [{name: shm, mountPath: /dev/shm}]
          volumes: [{name: shm, emptyDir: {medium: Memory}}]
"""


def test_check_hand_written(run, tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text(HAND_WRITTEN)
    rc, report, err = run("check", path)
    assert rc == 0, report
    assert "1 file(s): 0 problem(s)" in err
    rc, report, _ = run("check", "--nodes", 2, path)
    assert rc == 1 and "MPIJob/llama: spec.mpiReplicaSpecs.Worker.replicas: 4 worker nodes, expected 2" in report
    path.write_text(HAND_WRITTEN.replace('"128"', '"64"').replace("slotsPerWorker", "slotPerWorker"))
    rc, report, _ = run("check", path)
    assert rc == 1
    assert "MPIJob/llama: spec.slotPerWorker: unknown field" in report
    assert "mpirun -np 64, but 4 worker pods x 32 ranks per node = 128" in report


def test_check_unknown_kind_and_bad_yaml(run, tmp_path):
    (tmp_path / "a.yaml").write_text("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w}\n")
    (tmp_path / "b.yaml").write_text("kind: [unclosed\n")
    rc, report, _ = run("check", tmp_path / "a.yaml", tmp_path / "b.yaml")
    assert rc == 1
    assert "a.yaml: Widget/w: kind: no CRD or rules for example.com/v1 Widget" in report
    assert "b.yaml: yaml: cannot parse" in report


def test_check_usage_errors(run, tmp_path):
    assert run("check")[0] == 2
    assert run("check", tmp_path / "missing.yaml")[0] == 2
    assert run("check", "--instance", "p3.2xlarge", tmp_path)[0] == 2


# ---------------------------------------------------------------------------------------------------------------
# --plan

ARGS = ["--tp", "8", "--pp", "2", "--dp", "1", "--ep", "1", "--sp", "--schedule", "1f1b", "--zero", "1",
        "--recompute", "selective", "--micro-batches", "8"]


def plan_json(nodes=2, per_node=8, **best):
    b = {"layout": "tp=8 pp=2 dp=1", "tp": 8, "pp": 2, "dp": 1, "ep": 1, "sp": True, "schedule": "1f1b",
         "chunks": 1, "zero": 1, "offload": "none", "recompute": "selective", "micro_batches": 8, "fits": True,
         "args": ARGS, "mesh": ["tp", "pp", "dp", "ep"]}
    b.update(best)
    return {"request": {"nodes": nodes, "hardware": {"name": "h100-80gb", "devices_per_node": per_node}},
            "devices": nodes * per_node, "best": b}


def test_plan_becomes_flags(run, tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan_json()))
    out, _ = render(run, tmp_path, "slurm-srun", "p5.48xlarge", 2, "--plan", p)
    text = (out / "torus.sbatch").read_text()
    assert "torus-train " + " ".join(ARGS) + " --model gpt2" in text


@pytest.mark.parametrize("case", [
    ("another node count", plan_json(nodes=4), "planned for 4 nodes, rendering 2"),
    ("another device count per node", plan_json(per_node=32), "planned for 32 devices per node"),
    ("layout of another size", plan_json(dp=2), "tp x pp x dp x ep = 32 devices, but 2 x p5.48xlarge run 16"),
    ("no layout fits", {**plan_json(), "best": None}, 'no "best" layout'),
    ("bad size", plan_json(tp="8"), "best.tp must be a positive integer"),
    ("no arguments", plan_json(args=[]), "best.args must be the layout's torus-train arguments"),
    ("arguments of another layout", plan_json(args=["--tp", "4", "--pp", "2", "--dp", "1", "--ep", "1"]),
     "do not say --tp 8 as best.tp does"),
], ids=lambda c: c[0])
def test_plan_refused(run, tmp_path, case):
    _, plan, expected = case
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan))
    rc, out, err = run("render", "--platform", "mpijob", "--instance", "p5.48xlarge", "--nodes", 2, "--out",
                       tmp_path / "o", *K8S, "--plan", p, *TRAIN)
    assert rc == 2 and expected in err, err
    assert not (tmp_path / "o").exists()


def test_plan_conflicts_with_layout_flags(run, tmp_path):
    p = tmp_path / "plan.json"
    p.write_text(json.dumps(plan_json()))
    rc, _, err = run("render", "--platform", "slurm-srun", "--instance", "p5.48xlarge", "--nodes", 2,
                     "--plan", p, "--", "--tp", "4")
    assert rc == 2 and "already give --tp" in err
    rc, _, err = run("render", "--platform", "slurm-srun", "--instance", "p5.48xlarge", "--nodes", 2,
                     "--plan", p, "--", "--no_sp")
    assert rc == 2 and "already give --no_sp" in err


# ---------------------------------------------------------------------------------------------------------------
# Command line

@pytest.mark.parametrize("argv", [["--help"], ["render", "--help"], ["check", "--help"]])
def test_help(run, argv):
    rc, out, _ = run(*argv)
    assert rc == 0 and "usage: torus-launch" in out


@pytest.mark.parametrize("case", [
    ("unknown platform", ["--platform", "k8s", "--instance", "p5.48xlarge", "--nodes", "2"], "invalid choice: 'k8s'"),
    ("nodes 0", ["--platform", "slurm-srun", "--instance", "p5.48xlarge", "--nodes", "0"], "must be >= 1, got 0"),
    ("unknown instance", ["--platform", "slurm-srun", "--instance", "trn2.48xlarge", "--nodes", "2"],
     "unknown instance type 'trn2.48xlarge'"),
    ("kubernetes without a zone", ["--platform", "volcano", "--instance", "trn1.32xlarge", "--nodes", "2",
                                   "--fsx-id", "fs-0123456789abcdef0", "--fsx-mount-name", "m"], "needs --zone"),
    ("not a zone", ["--platform", "mpijob", "--instance", "p4d.24xlarge", "--nodes", "2", "--zone", "us-east-1"],
     "is not an availability zone"),
    ("missing nodes", ["--platform", "mpijob", "--instance", "p4d.24xlarge"], "required: --nodes"),
], ids=lambda c: c[0])
def test_bad_arguments(run, tmp_path, case):
    _, argv, expected = case
    rc, _, err = run("render", *argv, "--out", tmp_path / "o", *TRAIN)
    assert rc == 2 and expected in err, err
    assert not (tmp_path / "o").exists()


def test_out_must_be_new(run, tmp_path):
    (tmp_path / "o").mkdir()
    (tmp_path / "o" / "x").write_text("")
    rc, _, err = run("render", "--platform", "slurm-srun", "--instance", "p5.48xlarge", "--nodes", 2,
                     "--out", tmp_path / "o", *TRAIN)
    assert rc == 2 and "not an empty directory" in err


def test_default_out_directory(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, _ = run("render", "--platform", "slurm-mpirun", "--instance", "p4d.24xlarge", "--nodes", 16, *TRAIN)
    assert rc == 0 and "wrote torus-launch-slurm-mpirun-p4d.24xlarge-16n/torus.sbatch" in out


def test_a_rendered_launch_that_breaks_a_rule_is_not_written(run, tmp_path, monkeypatch):
    import torus_launch.cli as cli
    real = cli.render
    monkeypatch.setattr(cli, "render", lambda req: [(n, t.replace("slotsPerWorker", "slotPerWorker"))
                                                    for n, t in real(req)])
    rc, _, err = run("render", "--platform", "mpijob", "--instance", "p5.48xlarge", "--nodes", 2,
                     "--out", tmp_path / "o", *K8S, *TRAIN)
    assert rc == 3 and "internal error" in err and "spec.slotPerWorker" in err
    assert not (tmp_path / "o").exists()


def test_runs_as_a_plain_script_without_torus(tmp_path):
    """python3 path/to/torus/launch works with nothing else importable: no torch, no extension."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = tmp_path / "o"
    p = subprocess.run([sys.executable, "-I", LAUNCH_DIR, "render", "--platform", "slinky",
                        "--instance", "trn1.32xlarge", "--nodes", "2", "--out", str(out), *K8S, *TRAIN],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([sys.executable, "-I", "-c",
                        "import runpy, sys; sys.argv = ['torus-launch', 'check', sys.argv[1]]\n"
                        "try: runpy.run_path(" + repr(LAUNCH_DIR) + ", run_name='__main__')\n"
                        "except SystemExit as e: assert e.code == 0, e.code\n"
                        "assert 'torch' not in sys.modules and 'torus' not in sys.modules", str(out)],
                       capture_output=True, text=True, env=env, cwd=tmp_path)
    assert p.returncode == 0, p.stderr + p.stdout
