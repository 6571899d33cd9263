"""Predicates on the job's pods and Job: which attempt a Job or coordinator belongs to, which pods
train, which hold a node or wait at the operator's scheduling gate. Pure: no Draft, no clock."""

from __future__ import annotations

import datetime
from typing import Any

from .. import api, conditions, ladder
from ..builders.names import job_name
from ..spec import RTJ


def is_current(job: dict[str, Any] | None, attempt: int) -> bool:
    """The Job is this attempt's gang and not going away."""
    return job is not None and job_attempt(job) == attempt and not job["metadata"].get("deletionTimestamp")


def is_older(job: dict[str, Any] | None, attempt: int) -> bool:
    """The newest Job is an older gang's: `attempt`'s Job is not made yet (the old one may be going away)."""
    return job is not None and job_attempt(job) < attempt


def attempt_job_name(job: dict[str, Any] | None, rtj: RTJ, attempt: int) -> str:
    """The name of `attempt`'s Job, given the newest Job: that one's own if it is of `attempt` (an earlier
    operator's gang is '<name>'), else the name it gets (builders/names.py)."""
    if job is not None and job_attempt(job) == attempt:
        return job["metadata"]["name"]
    return job_name(rtj, attempt)


def job_attempt(job: dict[str, Any]) -> int:
    try:
        return int((job["metadata"].get("annotations") or {}).get(api.LABEL_ATTEMPT, 1))
    except (TypeError, ValueError):
        return 1


def suspended_by_operator(job: dict[str, Any] | None, recorded: bool) -> bool:
    """Whether the Job's suspend is this operator's to lift: `recorded` in status (recovery.suspendedJob), or
    the Job's own mark says so (api.ANNOTATION_SUSPENDED_BY: a suspend whose status write was lost)."""
    annotations = ((job or {}).get("metadata") or {}).get("annotations") or {}
    return recorded or annotations.get(api.ANNOTATION_SUSPENDED_BY) == api.MANAGER


def coordinator_attempt(pod: dict[str, Any]) -> int:
    """The gang attempt a coordinator pod was made for (its label; 0 if unreadable: an old one)."""
    return int((pod["metadata"].get("labels") or {}).get(api.LABEL_ATTEMPT, 0) or 0)


def job_succeeded(job: dict[str, Any] | None) -> bool:
    """The Job says it succeeded: Complete, or SuccessCriteriaMet (its success rule met, the rest stopping)."""
    return any(c.get("type") in ("Complete", "SuccessCriteriaMet") and c.get("status") == "True"
               for c in ((job or {}).get("status") or {}).get("conditions") or [])


def success_met(job: dict[str, Any] | None, pods: list[dict[str, Any]]) -> bool:
    """Whether the Job has succeeded: its Complete or SuccessCriteriaMet condition, or as many Succeeded
    indexes among `pods` (its own) as its success rule asks (spec.successPolicy's succeededCount, else
    spec.completions), which its controller has seen or is about to. The Job controller then stops the
    pods still running (a spare's, a lost index's replacement); their exits are that stop, never a fault.
    The pods' store shows those exits only after the exits 0 before them, the Job's store maybe later."""
    if job is None:
        return False
    if job_succeeded(job):
        return True
    spec = job.get("spec") or {}
    rules = (spec.get("successPolicy") or {}).get("rules") or []
    need = next((r["succeededCount"] for r in rules if r.get("succeededCount")), spec.get("completions"))
    return bool(need) and len(succeeded_indexes(pods)) >= int(need)


def succeeded_indexes(pods: list[dict[str, Any]]) -> set[str]:
    """The completion indexes of `pods` (a Job's) that exited 0: done, as the Job controller counts them."""
    return {(p["metadata"].get("annotations") or {}).get(ladder.INDEX) for p in pods
            if (p.get("status") or {}).get("phase") == "Succeeded"} - {None}


def job_nodes(job: dict[str, Any] | None, rtj: RTJ) -> int:
    """The training nodes of a Job (annotated; an earlier operator's Job: all its completions)."""
    if not job:
        return rtj.nodes
    try:
        return int((job["metadata"].get("annotations") or {})[api.ANNOTATION_NODES])
    except (KeyError, TypeError, ValueError):
        return int(job.get("spec", {}).get("completions", rtj.nodes))


def _ready_condition(pod: dict[str, Any]) -> dict[str, Any] | None:
    conds = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conds if c.get("type") == "Ready"), None)


def _ready(pod: dict[str, Any]) -> bool:
    ready = _ready_condition(pod)
    return ready is None or ready.get("status") == "True"


def ready_since(pod: dict[str, Any]) -> datetime.datetime:
    """When the pod's Ready condition last changed (the earliest time, where it says nothing)."""
    ready = _ready_condition(pod) or {}
    return conditions.parse_time(ready.get("lastTransitionTime")) or datetime.datetime.min.replace(tzinfo=datetime.UTC)


def running_ready(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods that run and are Ready, not being deleted: what the job trains on."""
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")
            and p.get("status", {}).get("phase") == "Running" and _ready(p)]


def on_node(pod: dict[str, Any]) -> bool:
    """Whether the pod holds a node: bound to one, not going away, not finished."""
    return bool(pod.get("spec", {}).get("nodeName") and not pod["metadata"].get("deletionTimestamp")
                and pod.get("status", {}).get("phase") in ("Pending", "Running"))


def bound_since(pod: dict[str, Any] | None) -> str | None:
    """When the pod was bound to a node (its PodScheduled condition turned True)."""
    cond = conditions.get_condition(((pod or {}).get("status") or {}).get("conditions") or [], "PodScheduled")
    return cond.get("lastTransitionTime") if cond and cond.get("status") == "True" else None


def addressed_coordinator(coordinator: dict[str, Any] | None, attempt: int) -> dict[str, Any] | None:
    """The coordinator if it is the one of gang `attempt`, not going away, and has an address."""
    if (coordinator is None or coordinator_attempt(coordinator) != attempt
            or coordinator["metadata"].get("deletionTimestamp") or not (coordinator.get("status") or {}).get("podIP")):
        return None
    return coordinator


def gated(pod: dict[str, Any]) -> bool:
    """Whether a pod (not going away) is held by the operator's scheduling gate."""
    return not pod["metadata"].get("deletionTimestamp") and any(
        g.get("name") == api.SCHEDULING_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])
