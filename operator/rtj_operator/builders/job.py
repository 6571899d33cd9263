"""The Indexed Job: one pod per node, each running ft_launcher through the worker entrypoint."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from rtj_worker import exit_codes
from rtj_worker.crashloop import REPEATS as CRASH_LOOP_REPEATS

from .. import api
from ..spec import RTJ, nccl_timeout, parse_quantity
from .names import job_name, labels, pvc_name, rendezvous_host, selector_labels, service_name
from .pod import extra_mounts, extra_volumes, pod_metadata, worker_pod_fields

CONTAINER = "worker"
GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
# NVRx in-process restart with NCCL (NVRx known issues): NCCL errors must reach Python instead of
# aborting on CUDA errors, and NVLink SHARP keeps state an in-process restart cannot reset. The NCCL
# watchdog stays on (ASYNC_ERROR_HANDLING=1, what ft_launcher sets too) as the last resort: its timeout
# (ncclTimeoutSeconds) is longer than the in-process hard timeout, so it fires only on what that missed.
NVRX_NCCL_ENV = (("NCCL_NVLS_ENABLE", "0"), ("TORCH_NCCL_RETHROW_CUDA_ERRORS", "0"),
                 ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"))
# libfabric/NCCL over EFA on p5, as the NVRx reference deploys it (awsome-distributed-training
# 3.test_cases/pytorch/nvrx); the user's env may override these. RDMAV_FORK_SAFE/FI_EFA_FORK_SAFE: the
# checkpoint writer and ft_launcher fork processes that hold registered memory.
EFA_ENV = (("FI_PROVIDER", "efa"), ("FI_EFA_USE_DEVICE_RDMA", "1"), ("FI_EFA_FORK_SAFE", "1"),
           ("RDMAV_FORK_SAFE", "1"), ("FI_LOG_LEVEL", "warn"), ("NCCL_SOCKET_IFNAME", "^docker,lo,veth"),
           ("NCCL_BUFFSIZE", "8388608"), ("NCCL_P2P_NET_CHUNKSIZE", "2097152"), ("NCCL_NET_GDR_LEVEL", "5"),
           ("NCCL_TUNER_PLUGIN", "/opt/amazon/ofi-nccl/lib/libnccl-ofi-tuner.so"))
# Requests per GPU when the spec gives neither CPU nor memory requests: most of a p5.48xlarge (192 vCPUs,
# 2 TiB, 8 GPUs) with room for system daemons. Without requests the pod is BestEffort, and its
# memory-backed /dev/shm makes it the first pod evicted under memory pressure.
CPU_PER_GPU = 20
MEMORY_PER_GPU_GI = 200


# spec.semantic_errors rejects specs of the wrong shape first; these keep a builder from crashing
# on one that slipped through (e.g. `resources.limits: "8"`): a wrong-typed part counts as absent.
def _as_dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _as_list(value: Any) -> list[dict[str, Any]]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def grace_seconds(rtj: RTJ, grace: int | None) -> int:
    """The pods' grace period: the spec's, else the measured one a gang was built with, else the default
    (policies/grace.py reads it here)."""
    return rtj.spec["resiliency"].get("terminationGracePeriodSeconds") or grace or api.DEFAULT_GRACE_SECONDS


def _env(rtj: RTJ, attempt: int, interval: int | None, grace: int | None, name: str) -> list[dict[str, Any]]:
    spec, res, ckpt = rtj.spec, rtj.spec["resiliency"], rtj.spec["checkpoint"]
    ipr = res["inProcessRestart"]
    port = res["rendezvousPort"]
    host = rendezvous_host(rtj, name)
    values = {
        "RTJ_NAME": rtj.name,
        "NNODES": str(rtj.nodes),
        # ft_launcher's --nnodes=MIN:MAX: NVRx 0.6's barrier rendezvous trains on MIN nodes and keeps the
        # others, up to MAX, as hot spares.
        "RTJ_NNODES": f"{rtj.nodes}:{rtj.pods}",
        # The rendezvous (P) and the ranks' stores (P+1, P+2) are the coordinator's: no node hosts them.
        "RTJ_COORDINATOR": "1" if spec["coordinator"]["enabled"] else "0",
        "NPROC_PER_NODE": str(rtj.procs_per_node),
        "MASTER_ADDR": host,
        # For scripts run without ft_launcher (it sets its own MASTER_ADDR/PORT for ranks, so rtj_worker
        # finds its stores from RTJ_RDZV_ENDPOINT: P+1 and P+2).
        "MASTER_PORT": str(port + 1),
        "RTJ_RDZV_ENDPOINT": f"{host}:{port}",
        # A new id per gang attempt keeps a recreated gang out of the old rendezvous round.
        "RTJ_RDZV_ID": f"{rtj.uid or rtj.name}-{attempt}",
        "RTJ_RDZV_TIMEOUT": str(res["rendezvousTimeoutSeconds"]),
        "RTJ_CHECKPOINT_DIR": rtj.checkpoint_dir,
        "RTJ_CHECKPOINT_INTERVAL": str(interval or ckpt["intervalSteps"]),
        "RTJ_CHECKPOINT_ASYNC": "1" if ckpt["async"] else "0",
        "RTJ_CHECKPOINT_KEEP": str(ckpt["keep"]),
        "RTJ_FT_HEARTBEAT_TIMEOUT": str(res["heartbeatTimeoutSeconds"]),
        "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT": str(res["initialHeartbeatTimeoutSeconds"]),
        "RTJ_FT_MONITOR_INTERVAL": str(res["monitorIntervalSeconds"]),
        "RTJ_FT_MAX_RESTARTS": str(res["maxLauncherRestarts"]),
        "RTJ_INPROCESS_ENABLED": "1" if ipr["enabled"] else "0",
        "RTJ_INPROCESS_MAX_ITERATIONS": str(ipr["maxIterations"]),
        "RTJ_INPROCESS_SOFT_TIMEOUT": str(ipr["softTimeoutSeconds"]),
        "RTJ_INPROCESS_HARD_TIMEOUT": str(ipr["hardTimeoutSeconds"]),
        "RTJ_NCCL_TIMEOUT": str(nccl_timeout(spec)),
        "RTJ_FT_MAX_NO_PROGRESS_CYCLES": str(res["maxNoProgressCycles"]),
        "RTJ_ATTEMPT": str(attempt),
        # The pod's terminationGracePeriodSeconds: the worker stops its ranks (and saves) within it.
        "RTJ_GRACE_SECONDS": str(grace_seconds(rtj, grace)),
        # Stored in every checkpoint's COMPLETE marker: a job never loads or prunes another's steps.
        "RTJ_UID": rtj.uid or rtj.name,
    }
    copies = ckpt["memoryCopies"]
    # Only what differs from the worker's defaults: a Job built before memoryCopies existed keeps its hash.
    if not copies["enabled"]:
        values["RTJ_STATE_COPIES"] = "0"
    elif copies["maxBytesPerNode"] != api.STATE_COPIES_BYTES_PER_NODE:
        values["RTJ_STATE_COPIES_BYTES_PER_NODE"] = str(int(parse_quantity(copies["maxBytesPerNode"]) or 0))
    repeats = spec["restartBudget"]["maxRestartsWithoutProgress"]
    if repeats != CRASH_LOOP_REPEATS:
        # A crash loop inside the pod ends by the rule that ends one across pods (rtj_worker.crashloop).
        # Only when not the worker's default: a Job built before it existed keeps its template hash.
        values["RTJ_CRASH_LOOP_REPEATS"] = str(repeats)
    env: list[dict[str, Any]] = [{"name": k, "value": v} for k, v in values.items()]
    env += [
        {"name": "NODE_RANK", "valueFrom": {"fieldRef": {"fieldPath": COMPLETION_INDEX}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
    ]
    user = _as_list(spec.get("env"))
    user_names = {e.get("name") for e in user}
    defaults: list[tuple[str, str]] = []
    if spec["gpusPerNode"] > 0:
        defaults += NVRX_NCCL_ENV
    if spec["efaPerNode"] > 0:
        defaults += EFA_ENV
    env += [{"name": k, "value": v} for k, v in defaults if k not in user_names]
    return env + user


def _resources(rtj: RTJ) -> dict[str, Any]:
    resources = copy.deepcopy(_as_dict(rtj.spec.get("resources")))
    accel = {}
    if rtj.spec["gpusPerNode"] > 0:
        accel[GPU] = str(rtj.spec["gpusPerNode"])
    if rtj.spec["efaPerNode"] > 0:
        accel[EFA] = str(rtj.spec["efaPerNode"])
    if accel:
        # Extended resources must have requests == limits.
        resources["limits"] = {**_as_dict(resources.get("limits")), **accel}
        resources["requests"] = {**_as_dict(resources.get("requests")), **accel}
    gpus = rtj.spec["gpusPerNode"]
    requests = _as_dict(resources.get("requests"))
    if gpus > 0 and "cpu" not in requests and "memory" not in requests:
        # A limit alone already sets the request (the API server defaults it to the limit).
        limits = _as_dict(resources.get("limits"))
        defaults = {"cpu": str(CPU_PER_GPU * gpus), "memory": f"{MEMORY_PER_GPU_GI * gpus}Gi"}
        resources["requests"].update({k: v for k, v in defaults.items() if k not in limits})
    return resources


def _affinity(rtj: RTJ, attempt: int) -> dict[str, Any]:
    affinity = copy.deepcopy(_as_dict(rtj.spec["placement"].get("affinity")))
    workers = {**selector_labels(rtj), api.LABEL_COMPONENT: "workers"}
    # One pod per node: two ranks' pods on one node would fight over GPUs and EFA devices.
    affinity.setdefault("podAntiAffinity", {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            # The workers only: the coordinator is a small CPU pod, not a reason to leave a node unused.
            "labelSelector": {"matchLabels": workers},
            "topologyKey": "kubernetes.io/hostname",
        }],
    })
    topology = _as_dict(rtj.spec["placement"].get("topology"))
    if topology.get("key") and not rtj.queue_name:
        # Every pod with the gang's other pods of this attempt (an old gang's pods still terminating must
        # not pin the new one): the scheduler places the first pod anywhere it fits (a required term
        # its own labels match does not block the first pod) and the rest in that pod's domain. With a
        # queue, Kueue's Topology Aware Scheduling places the gang as a whole instead (the annotations).
        term = {"labelSelector": {"matchLabels": {**workers, api.LABEL_ATTEMPT: str(attempt)}},
                "topologyKey": topology["key"]}
        pod_affinity = affinity.setdefault("podAffinity", {})
        if topology.get("mode", "Required") == "Required":
            pod_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", []).append(term)
        else:
            pod_affinity.setdefault("preferredDuringSchedulingIgnoredDuringExecution", []).append(
                {"weight": 100, "podAffinityTerm": term})
    return affinity


def _template_annotations(rtj: RTJ) -> dict[str, str]:
    topology = _as_dict(rtj.spec["placement"].get("topology"))
    if not (topology.get("key") and rtj.queue_name):
        return {}
    key = api.KUEUE_REQUIRED_TOPOLOGY if topology.get("mode", "Required") == "Required" else \
        api.KUEUE_PREFERRED_TOPOLOGY
    return {key: topology["key"]}


def _tolerations(rtj: RTJ) -> list[dict[str, Any]]:
    tolerations = _as_list(rtj.spec["placement"].get("tolerations"))
    if rtj.spec["gpusPerNode"] > 0 and not any(t.get("key") == GPU for t in tolerations):
        tolerations.append({"key": GPU, "operator": "Exists", "effect": "NoSchedule"})
    return tolerations


def _pod_spec(rtj: RTJ, attempt: int, interval: int | None, grace: int | None, name: str) -> dict[str, Any]:
    spec, placement = rtj.spec, rtj.spec["placement"]
    node_selector = {"node.kubernetes.io/instance-type": placement["instanceType"],
                     **_as_dict(placement.get("nodeSelector"))}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec["image"],
        "imagePullPolicy": spec["imagePullPolicy"],
        "command": ["rtj-worker", "--", *spec["command"]],
        "env": _env(rtj, attempt, interval, grace, name),
        "resources": _resources(rtj),
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "checkpoints", "mountPath": spec["storage"]["mountPath"]},
            *extra_mounts(rtj),
        ],
        # The worker writes its exit reason and last checkpoint step here for the operator.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if not spec["coordinator"]["enabled"]:
        # P: ft_launcher's rendezvous, P+1: the ranks' store, P+2: inprocess.Wrapper's store, on node 0.
        container["ports"] = rendezvous_ports(spec)
    if spec.get("args"):
        container["args"] = list(spec["args"])
    if spec["gpusPerNode"] > 0:
        # EFA and NCCL register (pin) memory for RDMA: without IPC_LOCK the memlock limit stops them.
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",  # restarts inside the pod belong to ft_launcher
        "subdomain": service_name(rtj),
        "terminationGracePeriodSeconds": grace_seconds(rtj, grace),
        "nodeSelector": node_selector,
        "tolerations": _tolerations(rtj),
        "affinity": _affinity(rtj, attempt),
        # Scheduled only once the operator applied the job's node exclusions (policies/placement.release_gated).
        "schedulingGates": [{"name": api.SCHEDULING_GATE}],
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec["shmSize"]}},
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": pvc_name(rtj)}},
            *extra_volumes(rtj),
        ],
        **worker_pod_fields(rtj),
    }
    for key in ("serviceAccountName", "priorityClassName"):
        if spec.get(key):
            pod[key] = spec[key]
    return pod


def rendezvous_ports(spec: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"name": name, "containerPort": spec["resiliency"]["rendezvousPort"] + offset}
            for offset, name in enumerate(("rendezvous", "store", "inprocess-store"))]


def _pod_failure_policy() -> dict[str, Any]:
    # Rules are first-match (pkg/controller/job/pod_failure_policy.go): a drained or evicted pod is a
    # disruption whatever its exit code, so the Ignore rule comes before FailJob.
    return {"rules": [
        # Evictions, preemptions, node drains and PodGC's (or the operator's) forced failures are not the
        # job's fault: the index is replaced, nothing is counted.
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
        # Configuration errors fail fast: another pod would fail the same way.
        {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                                              "values": sorted(exit_codes.PERMANENT)}},
    ]}


# The Job is a plain executor of the operator's decisions: it never fails on its own for failures the
# operator excuses (a peer's exit after node 0 was lost, a survivor's exit while its replacement waits
# for capacity). So no Job-wide backoffLimit (it defaults to MaxInt32 with per-index limits) and no
# practical per-index limit; the operator's budgets (status) decide. Per-index mode is for what it
# exposes: the Job controller's per-index replacement back-off, computable from each index's failed pod
# (batch.kubernetes.io/job-index-failure-count and -ignored-failure-count; see ladder.replacement_due).
PER_INDEX_LIMIT = 2**31 - 1


def template_hash(job: dict[str, Any]) -> str:
    """Hash of the pod template: what the user's spec decides and a running Job cannot change (a new
    gang carries a change). The Job's own fields (policies, limits) are the operator's: a new operator
    version that shapes them differently applies them at the next gang, never restarts a running one.
    So is the operator's scheduling gate: a Job made before it had one keeps running (its pods are
    scheduled ungated, without the node exclusions)."""
    template = job["spec"]["template"]
    spec = dict(template.get("spec") or {})  # only the gates differ: no deep copy (every pass hashes)
    gates = [g for g in spec.get("schedulingGates") or [] if g.get("name") != api.SCHEDULING_GATE]
    if gates:
        spec["schedulingGates"] = gates
    else:
        spec.pop("schedulingGates", None)
    blob = json.dumps({**template, "spec": spec} if "spec" in template else template, sort_keys=True,
                      separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def build_job(rtj: RTJ, attempt: int = 1, interval: int | None = None, grace: int | None = None,
              name: str | None = None) -> dict[str, Any]:
    """The gang of `attempt`: recreated (attempt + 1) only when the whole gang must restart. `interval`: the
    checkpoint interval its pods were built with when not checkpoint.intervalSteps (policies/interval.py);
    `grace`: their measured grace period when the spec sets none (policies/grace.py); `name`: the Job's
    name, when it exists (an earlier operator's is '<name>'), else names.job_name."""
    name = name or job_name(rtj, attempt)
    pods = rtj.pods
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": name,
            "namespace": rtj.namespace,
            # With a queue, Kueue admits the Job (its webhook suspends it at creation, its controller
            # un-suspends it once the gang's quota is reserved).
            "labels": {**labels(rtj, "workers"), **rtj.queue_labels},
            "annotations": {api.LABEL_ATTEMPT: str(attempt), api.ANNOTATION_NODES: str(rtj.nodes),
                            # Made suspended for spec.suspend: the operator's to resume (with a queue, Kueue's).
                            **({api.ANNOTATION_SUSPENDED_BY: api.MANAGER}
                               if rtj.spec["suspend"] and not rtj.queue_name else {})},
        },
        "spec": {
            "completionMode": "Indexed",
            # Training nodes and spares: every index ends Succeeded once training has (a spare's worker
            # exits 0 when the gang it waited for finished).
            "completions": pods,
            "parallelism": pods,
            "suspend": bool(rtj.spec["suspend"] or rtj.queue_name),
            "backoffLimitPerIndex": PER_INDEX_LIMIT,
            "podFailurePolicy": _pod_failure_policy(),
            # Never run two pods of one index at once: they would share a hostname in rendezvous.
            "podReplacementPolicy": "Failed",
            "template": {
                "metadata": pod_metadata(rtj, {**labels(rtj, "workers"), api.LABEL_ATTEMPT: str(attempt)},
                                         _template_annotations(rtj)),
                "spec": _pod_spec(rtj, attempt, interval, grace, name),
            },
        },
    }
    if interval:
        job["metadata"]["annotations"][api.ANNOTATION_CHECKPOINT_INTERVAL] = str(interval)
    if grace and not rtj.spec["resiliency"].get("terminationGracePeriodSeconds"):
        job["metadata"]["annotations"][api.ANNOTATION_GRACE] = str(grace)
    if rtj.spares:
        # N exits 0 end the job: the entrypoint exits 0 only once training finished, so a lost index
        # whose replacement never got a node (the spare took its ranks) does not hold the Job open; the
        # Job controller then stops whatever still runs (pkg/controller/job: SuccessCriteriaMet).
        job["spec"]["successPolicy"] = {"rules": [{"succeededCount": rtj.nodes}]}
    job["metadata"]["annotations"][api.ANNOTATION_TEMPLATE_HASH] = template_hash(job)
    return job


def template_pod(job: dict[str, Any]) -> dict[str, Any]:
    """A pod of `job`'s template, as the Job controller would create it, for a server-side dry run: the
    pod admission plugins (Priority, ServiceAccount, Pod Security) judge pods, never a Job's template,
    so only a pod shows whether the gang's pods could be created at all."""
    template = copy.deepcopy(job["spec"]["template"])
    meta = template.get("metadata") or {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"{job['metadata']['name']}-probe", "namespace": job["metadata"]["namespace"],
                     "labels": meta.get("labels") or {}, "annotations": meta.get("annotations") or {}},
        "spec": template.get("spec") or {},
    }
