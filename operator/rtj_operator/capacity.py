"""Which nodes could take a pod of the job, read from the nodes alone (pure): Ready, schedulable, the
pod's nodeSelector matched, every NoSchedule/NoExecute taint tolerated, enough allocatable GPUs and
EFA devices for one pod.

It answers one question: after the gang was suspended for lack of capacity, have enough fitting nodes
shown up to try again? It does not see other workloads' pods or pod affinity: the scheduler decides,
and a resumed gang that meets no room is suspended again once capacitySuspendSeconds pass.
"""

from __future__ import annotations

import datetime
from typing import Any

from . import ladder
from .builders.job import EFA, GPU
from .spec import parse_quantity


def tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    """core/v1 Toleration.ToleratesTaint."""
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint.get("effect"):
            continue
        if t.get("operator") == "Exists" and (not t.get("key") or t["key"] == taint.get("key")):
            return True
        if t.get("key") == taint.get("key") and (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def fits(node: dict[str, Any], pod_spec: dict[str, Any], now: datetime.datetime) -> bool:
    if ladder.node_lost(node, now) or (node.get("spec") or {}).get("unschedulable"):
        return False
    labels = node["metadata"].get("labels") or {}
    if any(labels.get(k) != v for k, v in (pod_spec.get("nodeSelector") or {}).items()):
        return False
    tolerations = pod_spec.get("tolerations") or []
    if any(t.get("effect") in ("NoSchedule", "NoExecute") and not tolerated(t, tolerations)
           for t in (node.get("spec") or {}).get("taints") or []):
        return False
    requests = {}
    for container in pod_spec.get("containers") or []:
        requests.update(((container.get("resources") or {}).get("requests")) or {})
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    for resource in (GPU, EFA):
        want = parse_quantity(requests.get(resource, 0)) or 0
        if want and (parse_quantity(allocatable.get(resource, 0)) or 0) < want:
            return False
    return True


def fitting_nodes(nodes: list[dict[str, Any]], pod_spec: dict[str, Any], now: datetime.datetime) -> dict[str, str]:
    """name -> uid of the nodes that fit (a node re-created under the same name is another node)."""
    return {n["metadata"]["name"]: n["metadata"].get("uid", "") for n in sorted(
        nodes, key=lambda n: n["metadata"]["name"]) if fits(n, pod_spec, now)}
