"""The coordinator: one small CPU pod per gang attempt that hosts the rendezvous (NVRx 0.6's
nvrx-control, which closes the barrier rendezvous' rounds without training; with 0.4.1 a plain c10d
store, whose rounds the launchers close themselves) and the ranks' two stores, so that no training
node hosts them. Losing node 0 is then like losing any other node; losing the coordinator ends the
gang's rendezvous, and the operator starts a new gang.

A bare pod the operator owns (not a Job): it lives exactly as long as its gang attempt, and the
operator decides what its loss means. It prefers nodes of another instance type than the training
nodes (a CPU node) but tolerates the GPU taint, so it runs on a cluster that has only GPU nodes too,
and there prefers a node none of its gang's workers runs on.
"""

from __future__ import annotations

from typing import Any

from .. import api
from ..spec import RTJ
from .job import CONTAINER, GPU, rendezvous_ports
from .names import coordinator_name, job_name, labels, selector_labels, service_name
from .pod import image_pull_secrets, pod_metadata

COMPONENT = "coordinator"  # its api.LABEL_COMPONENT
RESOURCES = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "2Gi"}}
# Autoscalers must not move it to consolidate nodes: its loss ends the gang's rendezvous (a gang restart
# of every node). Karpenter's (v1) and Cluster Autoscaler's per-pod opt-outs; a drain still evicts it.
DO_NOT_DISRUPT = {"karpenter.sh/do-not-disrupt": "true", "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}


def build_coordinator(rtj: RTJ, attempt: int, job: str | None = None) -> dict[str, Any] | None:
    """The coordinator of gang `attempt`, whose Job is named `job` (names.job_name unless it exists)."""
    spec, res = rtj.spec, rtj.spec["resiliency"]
    coordinator = spec["coordinator"]
    if not coordinator["enabled"]:
        return None
    name = coordinator_name(job or job_name(rtj, attempt))
    tolerations = list(coordinator.get("tolerations") or [])
    if not any(t.get("key") == GPU for t in tolerations):
        tolerations.append({"key": GPU, "operator": "Exists", "effect": "NoSchedule"})
    env = {
        "RTJ_NAME": rtj.name,
        "RTJ_RDZV_PORT": str(res["rendezvousPort"]),
        "RTJ_NNODES": f"{rtj.nodes}:{rtj.pods}",
        "RTJ_RDZV_ID": f"{rtj.uid or rtj.name}-{attempt}",
        "RTJ_RDZV_TIMEOUT": str(res["rendezvousTimeoutSeconds"]),
        "RTJ_ATTEMPT": str(attempt),
    }
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": rtj.namespace,
            **pod_metadata(rtj, {**labels(rtj, COMPONENT), api.LABEL_ATTEMPT: str(attempt)},
                           {api.LABEL_ATTEMPT: str(attempt), **DO_NOT_DISRUPT}),
        },
        "spec": {
            "restartPolicy": "Never",  # its state is the gang's rendezvous: a new one means a new gang
            "hostname": name,
            "subdomain": service_name(rtj),
            "terminationGracePeriodSeconds": 30,
            "tolerations": tolerations,
            "affinity": {
                "nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                    "weight": 100, "preference": {"matchExpressions": [{
                        "key": "node.kubernetes.io/instance-type", "operator": "NotIn",
                        "values": [spec["placement"]["instanceType"]]}]}}]},
                # Where it must share GPU nodes, not a node of its own gang's workers: one node loss would
                # otherwise take a worker and the gang's rendezvous (a gang restart) at once.
                "podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{
                    "weight": 50, "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {**selector_labels(rtj), api.LABEL_COMPONENT: "workers"}},
                        "topologyKey": "kubernetes.io/hostname"}}]}},
            "containers": [{
                "name": CONTAINER,
                "image": spec["image"],
                "imagePullPolicy": spec["imagePullPolicy"],
                "command": ["python", "-m", "rtj_worker.coordinator"],
                "env": [{"name": k, "value": v} for k, v in env.items()],
                "ports": rendezvous_ports(spec),
                "resources": RESOURCES,
                "terminationMessagePolicy": "FallbackToLogsOnError",
            }],
        },
    }
    if coordinator.get("nodeSelector"):
        pod["spec"]["nodeSelector"] = dict(coordinator["nodeSelector"])
    # The workers' priority: a coordinator preempted by a lower-priority pod would restart the gang.
    for key in ("serviceAccountName", "priorityClassName"):
        if spec.get(key):
            pod["spec"][key] = spec[key]
    pod["spec"].update(image_pull_secrets(rtj))
    return pod
