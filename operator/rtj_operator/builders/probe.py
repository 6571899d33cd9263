"""Capacity probes: while a gang is suspended for capacity (policies/placement.wait_for_capacity), one
pod per training node, shaped like a pod of the gang for the scheduler and for autoscalers, that runs
nothing but a sleep.

Why pods and not a count of nodes: a suspended gang has no pending pod, so Karpenter, Cluster
Autoscaler or EKS Auto Mode provision nothing for it, and a count of fitting nodes misses what other
workloads hold on a shared fleet (Capacity Blocks, ODCRs) and everything else the scheduler weighs. A
probe asks the real scheduler the real question (would a pod of the gang be placed?) and, while it is
pending, it is the pending pod autoscalers act on. The gang resumes once every probe has a node.

Each probe has the gang's node selector, tolerations, node affinity (with the job's node exclusions),
scheduler, resources (GPUs and EFA devices included) and checkpoint claim (a volume's zone is a
scheduling constraint too), one probe per node as the gang has one pod per node. It runs the gang's
image: a new node pulls it while the gang is still suspended, not after. With the chart's
PriorityClass (value -1, preemptionPolicy Never; `capacityProbes` in values.yaml) a probe preempts
nobody and any pod of ordinary priority preempts it: it reserves nothing from other workloads (the
overprovisioning pattern), and -1 is above Cluster Autoscaler's cut-off (-10) for pods it scales up for.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any

from .. import api
from ..spec import RTJ
from .job import CONTAINER, build_job
from .names import labels, selector_labels

COMPONENT = "capacity-probe"
ANNOTATION_HASH = f"{api.GROUP}/probe-hash"
# Python, not `sleep`: PID 1 ignores SIGTERM unless it handles it, and every worker image has Python
# (rtj_worker.requirements checks it). Deleted with no grace anyway (nothing to save).
COMMAND = ["python", "-c", "import time\nwhile True: time.sleep(3600)"]


def probe_name(rtj: RTJ, index: int) -> str:
    return f"{rtj.name}-capacity-{index}"


def probe_labels(rtj: RTJ) -> dict[str, str]:
    return labels(rtj, COMPONENT)


def _relabel(affinity: dict[str, Any], rtj: RTJ) -> dict[str, Any]:
    """The gang's pod (anti-)affinity terms select its workers (one per node, the topology domain of the
    attempt's first pod): the probes' select the probes instead. The user's own terms are kept as given."""
    workers = {**selector_labels(rtj), api.LABEL_COMPONENT: "workers"}
    probes = {**selector_labels(rtj), api.LABEL_COMPONENT: COMPONENT}

    def term(t: dict[str, Any]) -> dict[str, Any]:
        match = ((t.get("labelSelector") or {}).get("matchLabels")) or {}
        if any(match.get(k) != v for k, v in workers.items()):
            return t
        return {**t, "labelSelector": {**t["labelSelector"], "matchLabels": dict(probes)}}

    out = dict(affinity)
    for kind in ("podAffinity", "podAntiAffinity"):
        if kind not in out:
            continue
        rules = dict(out[kind])
        for key, items in rules.items():
            if key.startswith("required"):
                rules[key] = [term(t) for t in items]
            else:
                rules[key] = [{**w, "podAffinityTerm": term(w["podAffinityTerm"])} for w in items]
        out[kind] = rules
    return out


def build_capacity_probes(rtj: RTJ, affinity: dict[str, Any] | None = None, priority_class: str = "",
                          template: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """One probe per training node. `affinity`: the gang's, with the job's node exclusions applied (what
    its replacement pods would get: placement.exclusion_terms); None: the template's. `priority_class`:
    the operator's --capacity-probe-priority-class ("" leaves the namespace's default priority).
    `template`: the gang's pod spec (build_job's), if the caller has it."""
    template = template or build_job(rtj)["spec"]["template"]["spec"]
    worker = next(c for c in template["containers"] if c["name"] == CONTAINER)
    claims = [v for v in template["volumes"] if "persistentVolumeClaim" in v]
    mounts = [m for m in worker.get("volumeMounts") or [] if m["name"] in {v["name"] for v in claims}]
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "nodeSelector": dict(template["nodeSelector"]),
        "tolerations": list(template["tolerations"]),
        "affinity": _relabel(template["affinity"] if affinity is None else affinity, rtj),
        "containers": [{
            "name": COMPONENT,
            "image": worker["image"],
            "imagePullPolicy": worker["imagePullPolicy"],
            "command": list(COMMAND),
            "resources": worker["resources"],
            "volumeMounts": [{**m, "readOnly": True} for m in mounts],
        }],
        "volumes": claims,
    }
    for key in ("schedulerName", "serviceAccountName", "imagePullSecrets"):
        if template.get(key):
            spec[key] = template[key]
    if priority_class:
        spec["priorityClassName"] = priority_class
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]
    return [{
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": probe_name(rtj, i), "namespace": rtj.namespace, "labels": probe_labels(rtj),
                     "annotations": {ANNOTATION_HASH: digest}},
        "spec": copy.deepcopy(spec),  # each its own: a caller may change one
    } for i in range(rtj.nodes)]


def probe_hash(pod: dict[str, Any]) -> str:
    return (pod["metadata"].get("annotations") or {}).get(ANNOTATION_HASH, "")
