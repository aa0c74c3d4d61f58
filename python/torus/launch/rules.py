"""The rules a launch must keep beyond its CRD schema: what each operator
enforces (or silently gets wrong) and what EFA, Karpenter and FSx need.

One rule set serves both `torus-launch render` (which checks its own output
before writing it) and `torus-launch check` (hand-written files). Each rule
says what it prevents; docs/launch.md lists them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Tuple

from .instances import (CAPACITY_LABEL, EFA_RESOURCE, HUGEPAGES_RESOURCE, INSTANCE_LABEL, INSTANCES,
                        OBSOLETE_EFA_VARIABLES, ZONE_LABEL, Instance)
from .mpi import command_tokens, find_mpirun
from .schema import field_path

MPIJOB_HOSTFILE = "/etc/mpi/hostfile"   # where the MPIJob and TrainJob operators mount the hostfile
FSX_DRIVER = "fsx.csi.aws.com"


@dataclass(frozen=True)
class Problem:
    file: str
    where: str          # kind/name of the document, or "script"
    path: str           # field path (spec.mpiReplicaSpecs.Worker.replicas) or "line N"
    message: str

    def __str__(self) -> str:
        return f"{self.file}: {self.where}: {self.path + ': ' if self.path else ''}{self.message}"


@dataclass
class Doc:
    file: str
    index: int
    obj: Dict[str, Any]

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind", ""))

    @property
    def name(self) -> str:
        return str(get(self.obj, "metadata", "name", default=""))

    @property
    def where(self) -> str:
        return f"{self.kind or 'document'}/{self.name or '#' + str(self.index + 1)}"


@dataclass
class Expect:
    """What a render asked for; `check` fills what its options give."""
    instance: Optional[Instance] = None
    nodes: Optional[int] = None


def get(obj: Any, *keys, default=None):
    for k in keys:
        if isinstance(obj, dict) and k in obj:
            obj = obj[k]
        elif isinstance(obj, list) and isinstance(k, int) and -len(obj) <= k < len(obj):
            obj = obj[k]
        else:
            return default
    return obj


class Report:
    """Collects problems of one set of documents, and the cross-document facts (zones, names)."""

    def __init__(self, expect: Expect):
        self.expect = expect
        self.problems: List[Problem] = []
        self.zones: List[Tuple[str, Doc, str]] = []          # (zone, doc, path)
        self.instances: List[Tuple[str, Doc, str]] = []      # (instance type, doc, path) of workers and pools

    def add(self, doc: Doc, parts, message: str) -> None:
        path = parts if isinstance(parts, str) else field_path(parts)
        self.problems.append(Problem(doc.file, doc.where, path, message))


# --------------------------------------------------------------------------------------------------------------
# Pods inside the job kinds

@dataclass
class Pod:
    path: list                                  # to the PodSpec
    spec: Dict[str, Any]
    containers: List[Tuple[list, Dict[str, Any]]]
    role: str                                   # "launcher" or "worker"
    replicas: Optional[int] = None              # pods of this template, where the kind says


def _containers(spec: Dict[str, Any], path: list) -> List[Tuple[list, Dict[str, Any]]]:
    return [(path + ["containers", i], c) for i, c in enumerate(get(spec, "containers", default=[]) or [])
            if isinstance(c, dict)]


def runs_mpirun(container: Dict[str, Any]):
    return find_mpirun(command_tokens(list(container.get("command") or []) + list(container.get("args") or [])))


def pods_of(doc: Doc) -> List[Pod]:
    o, kind = doc.obj, doc.kind
    pods: List[Pod] = []
    if kind == "MPIJob":
        for rname, rs in (get(o, "spec", "mpiReplicaSpecs", default={}) or {}).items():
            path = ["spec", "mpiReplicaSpecs", rname, "template", "spec"]
            spec = get(rs, "template", "spec", default={}) or {}
            pods.append(Pod(path, spec, _containers(spec, path), "launcher" if rname == "Launcher" else "worker",
                            get(rs, "replicas", default=1)))
    elif kind == "Job" and doc.obj.get("apiVersion", "").startswith("batch.volcano.sh/"):
        for i, task in enumerate(get(o, "spec", "tasks", default=[]) or []):
            path = ["spec", "tasks", i, "template", "spec"]
            spec = get(task, "template", "spec", default={}) or {}
            cs = _containers(spec, path)
            role = "launcher" if any(runs_mpirun(c) for _, c in cs) else "worker"
            pods.append(Pod(path, spec, cs, role, get(task, "replicas", default=1)))
    elif kind in ("TrainingRuntime", "ClusterTrainingRuntime"):
        for i, rj in enumerate(get(o, "spec", "template", "spec", "replicatedJobs", default=[]) or []):
            path = ["spec", "template", "spec", "replicatedJobs", i, "template", "spec", "template", "spec"]
            spec = get(rj, "template", "spec", "template", "spec", default={}) or {}
            pods.append(Pod(path, spec, _containers(spec, path),
                            "launcher" if rj.get("name") == "launcher" else "worker"))
    elif kind == "NodeSet":
        path = ["spec", "template", "spec"]
        spec = get(o, "spec", "template", "spec", default={}) or {}
        slurmd = get(o, "spec", "slurmd", default={}) or {}
        pods.append(Pod(path, spec, [(["spec", "slurmd"], slurmd)], "worker", get(o, "spec", "replicas", default=1)))
    return pods


def _zone_terms(spec: Dict[str, Any], path: list) -> List[Tuple[List[str], list]]:
    """Every zone constraint of a pod: from nodeSelector and required node affinity."""
    out = []
    sel = spec.get("nodeSelector") or {}
    if ZONE_LABEL in sel:
        out.append(([str(sel[ZONE_LABEL])], path + ["nodeSelector", ZONE_LABEL]))
    terms = get(spec, "affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                "nodeSelectorTerms", default=[]) or []
    for t, term in enumerate(terms):
        for e, expr in enumerate(term.get("matchExpressions") or []):
            if expr.get("key") == ZONE_LABEL:
                p = path + ["affinity", "nodeAffinity", "requiredDuringSchedulingIgnoredDuringExecution",
                            "nodeSelectorTerms", t, "matchExpressions", e, "values"]
                out.append(([str(v) for v in expr.get("values") or []] if expr.get("operator") == "In" else [], p))
    return out


def check_env(r: Report, doc: Doc, env: Any, path: list) -> None:
    """No obsolete or harmful EFA variable in a container's env list."""
    for i, e in enumerate(env or []):
        name = e.get("name") if isinstance(e, dict) else None
        if name in OBSOLETE_EFA_VARIABLES:
            r.add(doc, path + [i, "name"], f"{name} is obsolete: {OBSOLETE_EFA_VARIABLES[name]} (docs/efa.md)")


def check_command_env(r: Report, doc: Doc, tokens: List[str], path: list) -> None:
    for t in tokens:
        name = t.split("=", 1)[0]
        if name in OBSOLETE_EFA_VARIABLES and ("=" in t or t == name):
            r.add(doc, path, f"{name} is obsolete: {OBSOLETE_EFA_VARIABLES[name]} (docs/efa.md)")


def _quantity(v: Any) -> str:
    return str(v).strip()


def check_pod(r: Report, doc: Doc, pod: Pod) -> Optional[Instance]:
    """Rules every pod template keeps; returns the instance a worker pod is pinned to."""
    spec, path = pod.spec, pod.path
    for cpath, c in pod.containers:
        check_env(r, doc, c.get("env"), cpath + ["env"])
        cmd = list(c.get("command") or []) + list(c.get("args") or [])
        check_command_env(r, doc, command_tokens(cmd), cpath + ["command"])
    for values, zpath in _zone_terms(spec, path):
        if len(values) != 1:
            r.add(doc, zpath, f"pins {len(values)} zones {values}: EFA reaches only nodes in one availability zone")
        for v in values:
            r.zones.append((v, doc, field_path(zpath)))
    sel = spec.get("nodeSelector") or {}
    if CAPACITY_LABEL in sel and sel[CAPACITY_LABEL] != "on-demand":
        r.add(doc, path + ["nodeSelector", CAPACITY_LABEL],
              f"capacity type '{sel[CAPACITY_LABEL]}': a reclaimed spot node kills the whole gang; use on-demand")

    def total(resource: str, which: str = "limits") -> Tuple[Optional[str], list]:
        found, where = None, pod.containers[0][0] + ["resources", which, resource] if pod.containers else path
        for cpath, c in pod.containers:
            v = get(c, "resources", which, resource)
            if v is not None:
                found, where = _quantity(v), cpath + ["resources", which, resource]
        return found, where

    if pod.role == "launcher":
        for res in (EFA_RESOURCE, "nvidia.com/gpu", "aws.amazon.com/neuron", "aws.amazon.com/neuroncore"):
            for which in ("limits", "requests"):
                v, where = total(res, which)
                if v is not None and v != "0":
                    r.add(doc, where, f"the launcher runs no ranks: it must not take {res} from a worker node")
        return None

    inst_name = sel.get(INSTANCE_LABEL)
    inst = INSTANCES.get(str(inst_name)) if inst_name else None
    if inst_name:
        r.instances.append((str(inst_name), doc, field_path(path + ["nodeSelector", INSTANCE_LABEL])))
    if inst_name is None:
        r.add(doc, path + ["nodeSelector", INSTANCE_LABEL],
              "missing: a worker pod must be pinned to its instance type (device and EFA counts depend on it)")
    elif inst is None:
        r.add(doc, path + ["nodeSelector", INSTANCE_LABEL],
              f"unknown instance type '{inst_name}' (known: {', '.join(INSTANCES)})")
    if inst and r.expect.instance and inst.name != r.expect.instance.name:
        r.add(doc, path + ["nodeSelector", INSTANCE_LABEL], f"'{inst.name}', expected '{r.expect.instance.name}'")
    if not _zone_terms(spec, path):
        r.add(doc, path + ["nodeSelector", ZONE_LABEL],
              "missing: pin worker pods to one availability zone, or ranks may land in two zones")
    if inst is None:
        return None
    dev, dev_path = total(inst.device_resource)
    alt = total(inst.alt_device[0]) if inst.alt_device else (None, None)
    if dev is None and alt[0] is None:
        r.add(doc, dev_path, f"missing: {inst.name} pods take the whole node, {inst.device_count} {inst.device_resource}")
    elif dev is not None and dev != str(inst.device_count):
        r.add(doc, dev_path, f"{dev}, but {inst.name} has {inst.device_count} {inst.device_resource} "
                             f"({inst.ranks_per_node} ranks per node)")
    elif dev is None and alt[0] != str(inst.alt_device[1]):
        r.add(doc, alt[1], f"{alt[0]}, but {inst.name} has {inst.alt_device[1]} {inst.alt_device[0]}")
    efa, efa_path = total(EFA_RESOURCE)
    if efa is None:
        r.add(doc, efa_path, f"missing: request all {inst.efa} EFA devices of a {inst.name}, "
                             "or NCCL/libfabric fall back to fewer devices or to TCP")
    elif efa != str(inst.efa):
        r.add(doc, efa_path, f"{efa} EFA devices, but {inst.name} has {inst.efa}")
    hp, hp_path = total(HUGEPAGES_RESOURCE)
    if hp is None:
        r.add(doc, hp_path, "missing: EFA's libfabric allocates its buffers from 2 MiB huge pages")
    mem, _ = total("memory")
    if hp is not None and mem is None:
        r.add(doc, total("memory")[1], "missing: a pod that asks for huge pages must also ask for memory")
    for cpath, c in pod.containers:
        lim, req = get(c, "resources", "limits", default={}) or {}, get(c, "resources", "requests", default={}) or {}
        for res in (inst.device_resource, EFA_RESOURCE, HUGEPAGES_RESOURCE) + ((inst.alt_device[0],) if inst.alt_device else ()):
            if res in req and _quantity(req[res]) != _quantity(lim.get(res)):
                r.add(doc, cpath + ["resources", "requests", res],
                      f"{req[res]} differs from the limit {lim.get(res)}: extended resources and huge pages "
                      "need requests equal to limits")
    if not _has_shm(pod):
        r.add(doc, path + ["volumes"], "no memory-backed /dev/shm: mount an emptyDir with medium Memory at "
                                       "/dev/shm (the container default of 64 MiB breaks NCCL and data loaders)")
    return inst


def _has_shm(pod: Pod) -> bool:
    mem_volumes = {v.get("name") for v in pod.spec.get("volumes") or []
                   if isinstance(v, dict) and get(v, "emptyDir", "medium") == "Memory"}
    return any(m.get("mountPath") == "/dev/shm" and m.get("name") in mem_volumes
               for _, c in pod.containers for m in c.get("volumeMounts") or [] if isinstance(m, dict))


def check_launch(r: Report, doc: Doc, pods: List[Pod], worker_pods: Optional[int], ranks_per_node: Optional[int],
                 hostfile: Optional[str], np_path: list) -> None:
    """One launcher, with mpirun given a hostfile and -np = worker pods x ranks per node."""
    launchers = [p for p in pods if p.role == "launcher"]
    if len(launchers) != 1 or (launchers[0].replicas or 1) != 1:
        r.add(doc, np_path, f"{sum((p.replicas or 1) for p in launchers)} launcher pods; exactly one runs mpirun")
        if not launchers:
            return
    calls = [(cpath, call) for cpath, c in launchers[0].containers if (call := runs_mpirun(c))]
    if not calls:
        r.add(doc, launchers[0].path + ["containers"], "the launcher runs no mpirun")
        return
    cpath, call = calls[0]
    if call.hostfile is None:
        r.add(doc, cpath + ["command"], "mpirun has no --hostfile: Open MPI 5 ignores the operator's "
                                        "OMPI_MCA_orte_* variables and would start every rank on the launcher")
    elif hostfile and call.hostfile != hostfile:
        r.add(doc, cpath + ["command"], f"mpirun --hostfile {call.hostfile}; the operator writes {hostfile}")
    for name in call.exported:
        if name in OBSOLETE_EFA_VARIABLES:
            r.add(doc, cpath + ["command"], f"{name} is obsolete: {OBSOLETE_EFA_VARIABLES[name]} (docs/efa.md)")
    if call.np is None:
        r.add(doc, cpath + ["command"], "mpirun has no -np: give the world size explicitly")
    elif worker_pods is not None and ranks_per_node is not None:
        want = worker_pods * ranks_per_node
        if not call.np.isdigit() or int(call.np) != want:
            r.add(doc, cpath + ["command"], f"mpirun -np {call.np}, but {worker_pods} worker pods x "
                                            f"{ranks_per_node} ranks per node = {want}")


def _restart_policy(r: Report, doc: Doc, pod: Pod) -> None:
    rp = pod.spec.get("restartPolicy")
    if rp not in ("Never", "OnFailure"):
        r.add(doc, pod.path + ["restartPolicy"], f"{rp!r}: set Never or OnFailure (a restarted rank cannot "
                                                 "rejoin a running job)")


def _check_pods(r: Report, doc: Doc, pods: List[Pod]) -> Any:
    """Checks every pod and its restart policy; the instance the pods run on
    (the first one found), or None."""
    insts = []
    for p in pods:
        insts.append(check_pod(r, doc, p))
        _restart_policy(r, doc, p)
    return next((i for i in insts if i), None)


def _expect_nodes(r: Report, doc: Doc, nodes: Any, path: list) -> None:
    if r.expect.nodes is not None and nodes != r.expect.nodes:
        r.add(doc, path, f"{nodes} worker nodes, expected {r.expect.nodes}")


# --------------------------------------------------------------------------------------------------------------
# The kinds

def rule_mpijob(r: Report, doc: Doc, docs: List[Doc]) -> None:
    spec = doc.obj.get("spec") or {}
    specs = spec.get("mpiReplicaSpecs") or {}
    pods = pods_of(doc)
    insts = [check_pod(r, doc, p) for p in pods]
    inst = next((i for i in insts if i), None)
    worker = specs.get("Worker")
    base = ["spec", "mpiReplicaSpecs"]
    if not isinstance(worker, dict):
        r.add(doc, base + ["Worker"], "missing: an MPIJob needs at least one Worker")
    elif not isinstance(worker.get("replicas"), int) or worker["replicas"] < 1:
        r.add(doc, base + ["Worker", "replicas"], "set it to the number of nodes (>= 1)")
    if "Launcher" not in specs:
        r.add(doc, base + ["Launcher"], "missing: an MPIJob needs exactly one Launcher")
    elif specs["Launcher"].get("replicas", 1) != 1:
        r.add(doc, base + ["Launcher", "replicas"], f"{specs['Launcher'].get('replicas')}: exactly one Launcher")
    for name, rs in specs.items():
        if rs.get("restartPolicy") not in ("Never", "OnFailure"):
            r.add(doc, base + [name, "restartPolicy"], f"{rs.get('restartPolicy')!r}: the operator accepts "
                                                       "Never or OnFailure here")
    if get(spec, "runPolicy", "cleanPodPolicy") is None:
        r.add(doc, ["spec", "runPolicy", "cleanPodPolicy"], "set it explicitly (Running or All): the operator's "
                                                            "default differs from the CRD's text")
    if spec.get("runLauncherAsWorker"):
        r.add(doc, ["spec", "runLauncherAsWorker"], "true: the launcher pod would run ranks without devices")
    workers = worker.get("replicas") if isinstance(worker, dict) else None
    slots = spec.get("slotsPerWorker")
    if slots is None:
        r.add(doc, ["spec", "slotsPerWorker"], "missing: the operator's default is 1 slot per worker")
    elif inst and slots != inst.ranks_per_node:
        r.add(doc, ["spec", "slotsPerWorker"], f"{slots}, but a {inst.name} runs {inst.ranks_per_node} ranks")
    min_avail = get(spec, "runPolicy", "schedulingPolicy", "minAvailable")
    if min_avail is not None and isinstance(workers, int) and min_avail != workers + 1:
        r.add(doc, ["spec", "runPolicy", "schedulingPolicy", "minAvailable"],
              f"{min_avail}, but the gang is {workers} workers + 1 launcher = {workers + 1}")
    _expect_nodes(r, doc, workers, base + ["Worker", "replicas"])
    per_node = slots if isinstance(slots, int) else (inst.ranks_per_node if inst else None)
    check_launch(r, doc, pods, workers if isinstance(workers, int) else None, per_node, MPIJOB_HOSTFILE,
                 base + ["Launcher", "replicas"])


def rule_volcano_job(r: Report, doc: Doc, docs: List[Doc]) -> None:
    spec = doc.obj.get("spec") or {}
    tasks = spec.get("tasks") or []
    pods = pods_of(doc)
    inst = _check_pods(r, doc, pods)
    gang = sum(int(t.get("replicas", 1)) for t in tasks if isinstance(t, dict))
    if spec.get("minAvailable") != gang:
        r.add(doc, ["spec", "minAvailable"], f"{spec.get('minAvailable')}, but the gang (sum of task replicas) is "
                                             f"{gang}: a partial gang would start and wait forever")
    if spec.get("schedulerName") != "volcano":
        r.add(doc, ["spec", "schedulerName"], f"{spec.get('schedulerName')!r}: set volcano, or no gang scheduling")
    if not spec.get("queue"):
        r.add(doc, ["spec", "queue"], "missing: name the Volcano queue")
    plugins = spec.get("plugins") or {}
    for p in ("ssh", "svc"):
        if p not in plugins:
            r.add(doc, ["spec", "plugins", p], f"missing: mpirun needs the {p} plugin "
                                               "(ssh keys; svc writes /etc/volcano/<task>.host)")
    if not spec.get("policies"):
        r.add(doc, ["spec", "policies"], "missing: say what a failed or evicted pod does (e.g. AbortJob)")
    for i, p in enumerate(pods):
        if p.role == "launcher":
            pol = tasks[i].get("policies") or []
            if not any(x.get("event") == "TaskCompleted" and x.get("action") == "CompleteJob" for x in pol):
                r.add(doc, ["spec", "tasks", i, "policies"], "the launcher task needs TaskCompleted -> CompleteJob, "
                                                             "or the workers run on after mpirun ends")
    workers = sum(p.replicas or 1 for p in pods if p.role == "worker")
    _expect_nodes(r, doc, workers, ["spec", "tasks"])
    check_launch(r, doc, pods, workers, inst.ranks_per_node if inst else None, None, ["spec", "tasks"])


def _trainjobs_for(runtime: Doc, docs: List[Doc]) -> List[Doc]:
    return [d for d in docs if d.kind == "TrainJob" and get(d.obj, "spec", "runtimeRef", "name") == runtime.name
            and get(d.obj, "spec", "runtimeRef", "kind", default="ClusterTrainingRuntime") == runtime.kind]


def rule_training_runtime(r: Report, doc: Doc, docs: List[Doc]) -> None:
    spec = doc.obj.get("spec") or {}
    pods = pods_of(doc)
    inst = _check_pods(r, doc, pods)
    mpi = get(spec, "mlPolicy", "mpi")
    if not isinstance(mpi, dict):
        r.add(doc, ["spec", "mlPolicy", "mpi"], "missing: torus-train is started by mpirun (an MPI policy)")
        return
    procs = mpi.get("numProcPerNode")
    if inst and procs != inst.ranks_per_node:
        r.add(doc, ["spec", "mlPolicy", "mpi", "numProcPerNode"],
              f"{procs}, but a {inst.name} runs {inst.ranks_per_node} ranks (the hostfile's slots)")
    if mpi.get("runLauncherAsNode"):
        r.add(doc, ["spec", "mlPolicy", "mpi", "runLauncherAsNode"], "true: the launcher would run ranks")
    if not spec.get("podGroupPolicy"):
        r.add(doc, ["spec", "podGroupPolicy"], "missing: without a gang policy a partial job can start")
    if get(spec, "template", "spec", "failurePolicy") is None:
        r.add(doc, ["spec", "template", "spec", "failurePolicy"], "set it explicitly (e.g. maxRestarts: 0)")
    names = [get(rj, "name") for rj in get(spec, "template", "spec", "replicatedJobs", default=[]) or []]
    if "node" not in names:
        r.add(doc, ["spec", "template", "spec", "replicatedJobs"], "no replicated job named node (the workers)")
    jobs = _trainjobs_for(doc, docs)
    nodes = get(jobs[0].obj, "spec", "trainer", "numNodes") if jobs else get(spec, "mlPolicy", "numNodes")
    procs = get(jobs[0].obj, "spec", "trainer", "numProcPerNode", default=procs) if jobs else procs
    check_launch(r, doc, pods, nodes if isinstance(nodes, int) else None, procs if isinstance(procs, int) else None,
                 MPIJOB_HOSTFILE, ["spec", "template", "spec", "replicatedJobs"])


def rule_trainjob(r: Report, doc: Doc, docs: List[Doc]) -> None:
    trainer = get(doc.obj, "spec", "trainer", default={}) or {}
    check_env(r, doc, trainer.get("env"), ["spec", "trainer", "env"])
    nodes = trainer.get("numNodes")
    if not isinstance(nodes, int) or nodes < 1:
        r.add(doc, ["spec", "trainer", "numNodes"], "set it to the number of nodes (>= 1)")
    _expect_nodes(r, doc, nodes, ["spec", "trainer", "numNodes"])
    ref = get(doc.obj, "spec", "runtimeRef", default={}) or {}
    runtimes = [d for d in docs if d.kind == ref.get("kind", "ClusterTrainingRuntime") and d.name == ref.get("name")]
    procs = trainer.get("numProcPerNode")
    for rt in runtimes:
        rt_procs = get(rt.obj, "spec", "mlPolicy", "mpi", "numProcPerNode")
        if procs is not None and procs != rt_procs:
            r.add(doc, ["spec", "trainer", "numProcPerNode"], f"{procs} overrides the runtime's {rt_procs}")
    lim = get(trainer, "resourcesPerNode", "limits", default={}) or {}
    if EFA_RESOURCE in lim and r.expect.instance and str(lim[EFA_RESOURCE]) != str(r.expect.instance.efa):
        r.add(doc, ["spec", "trainer", "resourcesPerNode", "limits", EFA_RESOURCE],
              f"{lim[EFA_RESOURCE]}, but {r.expect.instance.name} has {r.expect.instance.efa}")


def rule_nodeset(r: Report, doc: Doc, docs: List[Doc]) -> None:
    pods = pods_of(doc)
    for p in pods:
        check_pod(r, doc, p)
    spec = doc.obj.get("spec") or {}
    if spec.get("scalingMode", "StatefulSet") != "StatefulSet":
        r.add(doc, ["spec", "scalingMode"], "DaemonSet ignores replicas: the job's node count is not kept")
    _expect_nodes(r, doc, spec.get("replicas"), ["spec", "replicas"])
    if not get(spec, "controllerRef", "name"):
        r.add(doc, ["spec", "controllerRef", "name"], "missing: the Slinky Controller these slurmd pods join")


def _requirement(reqs: List[Any], key: str) -> Tuple[Optional[int], Optional[dict]]:
    for i, q in enumerate(reqs):
        if isinstance(q, dict) and q.get("key") == key:
            return i, q
    return None, None


def rule_nodepool(r: Report, doc: Doc, docs: List[Doc]) -> None:
    tspec = get(doc.obj, "spec", "template", "spec", default={}) or {}
    reqs = tspec.get("requirements") or []
    base = ["spec", "template", "spec", "requirements"]
    i, q = _requirement(reqs, ZONE_LABEL)
    if q is None:
        r.add(doc, base, f"no {ZONE_LABEL} requirement: pin the NodePool to one availability zone")
    else:
        vals = q.get("values") or []
        if q.get("operator") != "In" or len(vals) != 1:
            r.add(doc, base + [i, "values"], f"{q.get('operator')} {vals}: pin exactly one zone (operator In)")
        for v in vals:
            r.zones.append((str(v), doc, field_path(base + [i, "values"])))
    i, q = _requirement(reqs, CAPACITY_LABEL)
    if q is None or q.get("operator") != "In" or q.get("values") != ["on-demand"]:
        r.add(doc, base + ([i, "values"] if i is not None else []),
              f"{CAPACITY_LABEL} must be In [on-demand]: a reclaimed spot node kills the whole gang")
    i, q = _requirement(reqs, INSTANCE_LABEL)
    if q is None or q.get("operator") != "In" or len(q.get("values") or []) != 1:
        r.add(doc, base + ([i, "values"] if i is not None else []),
              f"pin {INSTANCE_LABEL} to exactly one EFA instance type")
    else:
        v = q["values"][0]
        r.instances.append((str(v), doc, field_path(base + [i, "values"])))
        if v not in INSTANCES:
            r.add(doc, base + [i, "values"], f"unknown instance type '{v}' (known: {', '.join(INSTANCES)})")
        elif r.expect.instance and v != r.expect.instance.name:
            r.add(doc, base + [i, "values"], f"'{v}', expected '{r.expect.instance.name}'")
    ref = tspec.get("nodeClassRef") or {}
    classes = [d.name for d in docs if d.kind == "EC2NodeClass"]
    if classes and ref.get("name") not in classes:
        r.add(doc, ["spec", "template", "spec", "nodeClassRef", "name"],
              f"'{ref.get('name')}' is none of the EC2NodeClasses here ({', '.join(classes)})")
    if get(doc.obj, "spec", "disruption", "consolidationPolicy") != "WhenEmpty":
        r.add(doc, ["spec", "disruption", "consolidationPolicy"],
              "set WhenEmpty: consolidating an underutilized node evicts a running rank")
    if tspec.get("expireAfter") is None:
        r.add(doc, ["spec", "template", "spec", "expireAfter"],
              "set it explicitly (Never, or longer than a job): the default 720h drains nodes under a running job")


def rule_ec2nodeclass(r: Report, doc: Doc, docs: List[Doc]) -> None:
    spec = doc.obj.get("spec") or {}
    if ("role" in spec) == ("instanceProfile" in spec):
        r.add(doc, ["spec", "role"], "set exactly one of role and instanceProfile")
    terms = spec.get("amiSelectorTerms") or []
    if any(isinstance(t, dict) and "alias" in t for t in terms) and len(terms) != 1:
        r.add(doc, ["spec", "amiSelectorTerms"], "an alias term must be the only term")
    for i, t in enumerate(terms):
        a = t.get("alias") if isinstance(t, dict) else None
        if a is not None and not re.fullmatch(r"[a-z0-9]+@(latest|v\d+)", str(a)):
            r.add(doc, ["spec", "amiSelectorTerms", i, "alias"], f"'{a}': expected family@version (al2023@latest)")
    pg = spec.get("placementGroupSelector")
    if isinstance(pg, dict) and ("name" in pg) == ("id" in pg):
        r.add(doc, ["spec", "placementGroupSelector"], "set exactly one of name and id")


_PV_SPEC = {"accessModes", "capacity", "claimRef", "csi", "mountOptions", "nodeAffinity",
            "persistentVolumeReclaimPolicy", "storageClassName", "volumeMode", "volumeAttributesClassName"}
_PVC_SPEC = {"accessModes", "resources", "selector", "storageClassName", "volumeMode", "volumeName",
             "dataSource", "dataSourceRef", "volumeAttributesClassName"}


def _core_shape(r: Report, doc: Doc, top: set, spec_fields: Optional[set]) -> None:
    if doc.obj.get("apiVersion") != "v1":
        r.add(doc, ["apiVersion"], f"{doc.obj.get('apiVersion')!r}: {doc.kind} is v1")
    for k in doc.obj:
        if k not in top:
            r.add(doc, [k], f"unknown field of a {doc.kind}")
    if spec_fields is not None:
        for k in doc.obj.get("spec") or {}:
            if k not in spec_fields:
                r.add(doc, ["spec", k], f"unknown field of a {doc.kind} spec (or not one torus-launch expects)")


def rule_pv(r: Report, doc: Doc, docs: List[Doc]) -> None:
    _core_shape(r, doc, {"apiVersion", "kind", "metadata", "spec"}, _PV_SPEC)
    spec = doc.obj.get("spec") or {}
    csi = spec.get("csi") or {}
    if csi.get("driver") != FSX_DRIVER:
        r.add(doc, ["spec", "csi", "driver"], f"{csi.get('driver')!r}: FSx for Lustre is {FSX_DRIVER}")
        return
    handle = str(csi.get("volumeHandle", ""))
    if not re.fullmatch(r"fs-[0-9a-f]{8,17}", handle):
        r.add(doc, ["spec", "csi", "volumeHandle"], f"{handle!r}: an FSx file system id (fs-0123456789abcdef0)")
    attrs = csi.get("volumeAttributes") or {}
    for a in ("dnsname", "mountname"):
        if not attrs.get(a):
            r.add(doc, ["spec", "csi", "volumeAttributes", a], "missing: the FSx for Lustre CSI driver needs it")
    dns = str(attrs.get("dnsname", ""))
    if attrs.get("dnsname") and not dns.startswith(handle + ".fsx."):
        r.add(doc, ["spec", "csi", "volumeAttributes", "dnsname"], f"{dns!r} is not {handle}'s DNS name")
    if "ReadWriteMany" not in (spec.get("accessModes") or []):
        r.add(doc, ["spec", "accessModes"], "ReadWriteMany: every node mounts the file system")
    if not get(spec, "capacity", "storage"):
        r.add(doc, ["spec", "capacity", "storage"], "missing")
    if spec.get("storageClassName") != "":
        r.add(doc, ["spec", "storageClassName"], 'set "" for a static volume (else a default class provisions one)')
    if spec.get("persistentVolumeReclaimPolicy") != "Retain":
        r.add(doc, ["spec", "persistentVolumeReclaimPolicy"], "Retain: deleting the claim must not touch the data")


def rule_pvc(r: Report, doc: Doc, docs: List[Doc]) -> None:
    _core_shape(r, doc, {"apiVersion", "kind", "metadata", "spec"}, _PVC_SPEC)
    spec = doc.obj.get("spec") or {}
    pvs = [d.name for d in docs if d.kind == "PersistentVolume"]
    if pvs and spec.get("volumeName") not in pvs:
        r.add(doc, ["spec", "volumeName"], f"{spec.get('volumeName')!r} is none of the PersistentVolumes here")
    if spec.get("storageClassName") != "":
        r.add(doc, ["spec", "storageClassName"], 'set "" to bind the static FSx volume')
    if "ReadWriteMany" not in (spec.get("accessModes") or []):
        r.add(doc, ["spec", "accessModes"], "ReadWriteMany: every node mounts the file system")
    if not get(spec, "resources", "requests", "storage"):
        r.add(doc, ["spec", "resources", "requests", "storage"], "missing")


def rule_configmap(r: Report, doc: Doc, docs: List[Doc]) -> None:
    _core_shape(r, doc, {"apiVersion", "kind", "metadata", "data", "binaryData", "immutable"}, None)
    for k, v in (doc.obj.get("data") or {}).items():
        if not isinstance(v, str):
            r.add(doc, ["data", k], "ConfigMap values are strings")


RULES: Dict[str, Callable[[Report, Doc, List[Doc]], None]] = {
    "MPIJob": rule_mpijob,
    "Job": rule_volcano_job,                 # batch.volcano.sh; a batch/v1 Job has no schema here
    "TrainingRuntime": rule_training_runtime,
    "ClusterTrainingRuntime": rule_training_runtime,
    "TrainJob": rule_trainjob,
    "NodeSet": rule_nodeset,
    "NodePool": rule_nodepool,
    "EC2NodeClass": rule_ec2nodeclass,
    "PersistentVolume": rule_pv,
    "PersistentVolumeClaim": rule_pvc,
    "ConfigMap": rule_configmap,
}
CORE_KINDS = ("PersistentVolume", "PersistentVolumeClaim", "ConfigMap")


def check_consistency(r: Report) -> None:
    """Every zone named anywhere in the set is the same one; so is every worker's and pool's instance type."""
    for items, what, why in ((r.zones, "zone", "ranks in two zones"),
                             (r.instances, "instance type", "workers and nodes disagree")):
        if items:
            first, first_doc, _ = items[0]
            for value, doc, path in items[1:]:
                if value != first:
                    r.add(doc, path, f"{what} {value}, but {first_doc.where} pins {first}: {why}")
