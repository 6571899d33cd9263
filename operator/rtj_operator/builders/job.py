"""The Indexed Job: one pod per node, each running ft_launcher through the worker entrypoint."""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from rtj_worker import exit_codes

from .. import api
from ..spec import RTJ
from .names import job_name, labels, pvc_name, rendezvous_host, selector_labels, service_name

CONTAINER = "worker"
GPU = "nvidia.com/gpu"
EFA = "vpc.amazonaws.com/efa"
COMPLETION_INDEX = "metadata.annotations['batch.kubernetes.io/job-completion-index']"
# Enough for in-flight async checkpoints to finalize after SIGTERM.
GRACE_SECONDS = 120
# NVRx in-process restart with NCCL (NVRx known issues): NCCL errors must reach Python instead of
# aborting on CUDA errors, and NVLink SHARP keeps state an in-process restart cannot reset.
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


def _env(rtj: RTJ, attempt: int) -> list[dict[str, Any]]:
    spec, res, ckpt = rtj.spec, rtj.spec["resiliency"], rtj.spec["checkpoint"]
    ipr = res["inProcessRestart"]
    port = res["rendezvousPort"]
    host = rendezvous_host(rtj)
    values = {
        "RTJ_NAME": rtj.name,
        "NNODES": str(rtj.nodes),
        "RTJ_NNODES": f"{rtj.nodes_min}:{rtj.nodes_max}",
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
        "RTJ_CHECKPOINT_INTERVAL": str(ckpt["intervalSteps"]),
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
        "RTJ_NCCL_TIMEOUT": str(res["ncclTimeoutSeconds"]),
        "RTJ_FT_MAX_NO_PROGRESS_CYCLES": str(res["maxNoProgressCycles"]),
        "RTJ_ATTEMPT": str(attempt),
        # Stored in every checkpoint's COMPLETE marker: a job never loads or prunes another's steps.
        "RTJ_UID": rtj.uid or rtj.name,
    }
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


def _affinity(rtj: RTJ) -> dict[str, Any]:
    affinity = copy.deepcopy(_as_dict(rtj.spec["placement"].get("affinity")))
    # One pod per node: two ranks' pods on one node would fight over GPUs and EFA devices.
    affinity.setdefault("podAntiAffinity", {
        "requiredDuringSchedulingIgnoredDuringExecution": [{
            "labelSelector": {"matchLabels": selector_labels(rtj)},
            "topologyKey": "kubernetes.io/hostname",
        }],
    })
    return affinity


def _tolerations(rtj: RTJ) -> list[dict[str, Any]]:
    tolerations = _as_list(rtj.spec["placement"].get("tolerations"))
    if rtj.spec["gpusPerNode"] > 0 and not any(t.get("key") == GPU for t in tolerations):
        tolerations.append({"key": GPU, "operator": "Exists", "effect": "NoSchedule"})
    return tolerations


def _pod_spec(rtj: RTJ, attempt: int) -> dict[str, Any]:
    spec, placement = rtj.spec, rtj.spec["placement"]
    node_selector = {"node.kubernetes.io/instance-type": placement["instanceType"],
                     **_as_dict(placement.get("nodeSelector"))}
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec["image"],
        "imagePullPolicy": spec["imagePullPolicy"],
        "command": ["rtj-worker", "--", *spec["command"]],
        "env": _env(rtj, attempt),
        "resources": _resources(rtj),
        # P: ft_launcher's rendezvous, P+1: the ranks' store, P+2: inprocess.Wrapper's store (node 0).
        "ports": [{"name": name, "containerPort": spec["resiliency"]["rendezvousPort"] + offset}
                  for offset, name in enumerate(("rendezvous", "store", "inprocess-store"))],
        "volumeMounts": [
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "checkpoints", "mountPath": spec["storage"]["mountPath"]},
        ],
        # The worker writes its exit reason and last checkpoint step here for the operator.
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    if spec.get("args"):
        container["args"] = list(spec["args"])
    if spec["gpusPerNode"] > 0:
        # EFA and NCCL register (pin) memory for RDMA: without IPC_LOCK the memlock limit stops them.
        container["securityContext"] = {"capabilities": {"add": ["IPC_LOCK"]}}
    pod: dict[str, Any] = {
        "restartPolicy": "Never",  # restarts inside the pod belong to ft_launcher
        "subdomain": service_name(rtj),
        "terminationGracePeriodSeconds": GRACE_SECONDS,
        "nodeSelector": node_selector,
        "tolerations": _tolerations(rtj),
        "affinity": _affinity(rtj),
        "containers": [container],
        "volumes": [
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": spec["shmSize"]}},
            {"name": "checkpoints", "persistentVolumeClaim": {"claimName": pvc_name(rtj)}},
        ],
    }
    for key in ("serviceAccountName", "priorityClassName"):
        if spec.get(key):
            pod[key] = spec[key]
    return pod


def _pod_failure_policy() -> dict[str, Any]:
    return {"rules": [
        # Configuration errors fail fast: another pod would fail the same way.
        {"action": "FailJob", "onExitCodes": {"containerName": CONTAINER, "operator": "In",
                                              "values": sorted(exit_codes.PERMANENT)}},
        # Evictions, preemptions and node drains are not the job's fault: replace, don't count.
        {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]},
    ]}


def template_hash(job: dict[str, Any]) -> str:
    """Hash of what a running Job cannot change in place (suspend and backoffLimit are patched)."""
    spec = {k: v for k, v in job["spec"].items()
            if k not in ("suspend", "parallelism", "completions", "backoffLimit")}
    blob = json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def build_job(rtj: RTJ, attempt: int = 1) -> dict[str, Any]:
    """The gang of `attempt`: recreated (attempt + 1) only when the whole gang must restart."""
    nodes = rtj.nodes
    job: dict[str, Any] = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {
            "name": job_name(rtj),
            "namespace": rtj.namespace,
            "labels": labels(rtj, "workers"),
            "annotations": {api.LABEL_ATTEMPT: str(attempt)},
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": nodes,
            "parallelism": nodes,
            "suspend": bool(rtj.spec["suspend"]),
            # A backstop above the operator's own budget (status.jobRestarts), so the operator decides
            # first; disruptions are ignored by the pod failure policy. Patched in place when edited.
            "backoffLimit": rtj.spec["restartBudget"]["maxRestarts"] + 1,
            "podFailurePolicy": _pod_failure_policy(),
            # Never run two pods of one index at once: they would share a hostname in rendezvous.
            "podReplacementPolicy": "Failed",
            "template": {
                "metadata": {"labels": {**labels(rtj, "workers"), api.LABEL_ATTEMPT: str(attempt)}},
                "spec": _pod_spec(rtj, attempt),
            },
        },
    }
    job["metadata"]["annotations"][api.ANNOTATION_SPEC_HASH] = template_hash(job)
    return job
