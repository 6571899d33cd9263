"""Kueue: with a queue, Kueue owns Job.spec.suspend; the operator reports what Kueue does (Queued,
Admitted, status.queue) and stops the gang through its Workload (spec.active)."""

from __future__ import annotations

from typing import Any

from .. import api, conditions
from ..actions import PATCH, Action
from ..conditions import ADMITTED, QUEUED
from ..draft import Draft
from ..world import owned_by


def queued(d: Draft) -> bool:
    """Whether a queue decides when the gang runs: the RTJ names one, or Kueue labelled the Job itself (a
    namespace's default LocalQueue)."""
    job_labels = ((d.world.job or {}).get("metadata") or {}).get("labels") or {}
    return bool(d.rtj.queue_name or job_labels.get(api.KUEUE_QUEUE_LABEL))


def _true(obj: dict[str, Any] | None, type_: str) -> dict[str, Any] | None:
    return next((c for c in ((obj or {}).get("status") or {}).get("conditions") or []
                 if c.get("type") == type_ and c.get("status") == "True"), None)


def ensure_queue(d: Draft) -> None:
    """With a queue, Kueue owns Job.spec.suspend: it admits the gang when its ClusterQueue has quota for
    every pod, and evicts it (preemption, a deactivated Workload) by suspending the Job. The operator
    never un-suspends such a Job; spec.suspend deactivates the Workload (Kueue's own stop), and what
    Kueue does is reported (Queued, Admitted, status.queue) and never charged (the suspended Job's pod
    exits are excused in charging.charge())."""
    job, wl, rtj = d.world.job, d.world.workload, d.rtj
    if not queued(d) or job is None or not owned_by(job, rtj.uid):
        if d.status.queue is not None or conditions.get_condition(d.status.conditions, QUEUED):
            d.status.queue = None
            d.cond(QUEUED, False, "NotQueued", "")
            d.cond(ADMITTED, False, "NotQueued", "")
        return
    name = (job["metadata"].get("labels") or {}).get(api.KUEUE_QUEUE_LABEL, rtj.queue_name)
    before = d.old.get("queue") or {}
    if not d.world.workload_read and before.get("admitted") and not job["spec"].get("suspend"):
        # A running, admitted gang's Workload is not read each pass (world.read_workload): it stays as
        # the last read saw it until the Job is suspended again.
        d.status.queue = {**before, "name": name}
        d.cond(QUEUED, False, "Admitted", f"admitted by ClusterQueue {before.get('clusterQueue') or '?'}")
        d.cond(ADMITTED, True, "Admitted", (conditions.get_condition(d.old.get("conditions") or [], ADMITTED)
                                            or {}).get("message") or "")
        return
    admitted = _true(wl, "Admitted")
    reserved = (wl or {}).get("status", {}).get("admission") or {}
    d.status.queue = {"name": name, "workload": (wl or {}).get("metadata", {}).get("name", ""),
                      "admitted": admitted is not None, "clusterQueue": reserved.get("clusterQueue", "")}
    if wl is not None:
        follow_suspend(d, before)
    suspended = bool(job["spec"].get("suspend"))
    if rtj.spec["suspend"]:
        d.cond(QUEUED, False, "Suspended", "spec.suspend is true: the Workload is deactivated")
    elif suspended:
        reason, message = queue_wait(d, name)
        if not d.was(QUEUED, reason, message):
            d.event("Normal", "Queued", message)
        d.cond(QUEUED, True, reason, message)
    else:
        d.cond(QUEUED, False, "Admitted", f"admitted by ClusterQueue {reserved.get('clusterQueue') or '?'}")
    d.cond(ADMITTED, admitted is not None and not suspended, "Admitted" if admitted else "NotAdmitted",
           (admitted or {}).get("message") or "")


def follow_suspend(d: Draft, before: dict) -> None:
    """spec.suspend is the user's switch of the Workload's spec.active (Kueue's own stop). The operator
    acts on a change of the switch, recorded first (status.queue.activeRequested), never on the
    Workload's state: one that Kueue (its requeue limit) or an admin (`kueuectl stop`) deactivated stays
    so (queue_wait says how to start it again). A status from before the record acts as a change. A gang
    suspended for capacity (placement.wait_for_capacity) is switched off the same way, and on again once its
    capacity probes are placed."""
    assert d.status.queue is not None
    queue, wl = d.status.queue, d.world.workload
    for_capacity = bool(d.status.recovery.suspended_for_capacity) and not d.rtj.spec["suspend"]
    wanted = not d.rtj.spec["suspend"] and not for_capacity
    queue["activeRequested"] = wanted
    if for_capacity:
        # Whether the operator's own patch switches it off (it was on): only then is it switched on again once
        # the probes are placed; one Kueue (its requeue limit) or an admin deactivated stays so.
        mine = before.get("deactivatedForCapacity")
        queue["deactivatedForCapacity"] = mine if mine is not None else bool(
            wl is None or (wl.get("spec") or {}).get("active", True))
    if before.get("activeRequested") != wanted:
        if wanted and before.get("deactivatedForCapacity") is False and not d.rtj.spec["suspend"]:
            return
        why = ("spec.suspend is true" if d.rtj.spec["suspend"] else
               "a pod of the gang finds no node: its quota and nodes are released until its capacity probes are "
               "placed (WaitingForCapacity)" if for_capacity else
               "queued again: spec.suspend is false, and the gang is not suspended for capacity")
        activate_workload(d, wanted, why)


def queue_wait(d: Draft, name: str) -> tuple[str, str]:
    """Why a queued gang does not run, from its Workload (Kueue's conditions carry the reason)."""
    wl = d.world.workload
    if d.status.recovery.suspended_for_capacity:
        return "SuspendedForCapacity", ((f"Workload {wl['metadata']['name']}" if wl is not None else "the Workload")
                                        + " is deactivated by this operator while a pod of the gang finds no node: "
                                        "its quota and nodes are released, and it is queued again once its "
                                        "capacity probes are placed (WaitingForCapacity)")
    if wl is not None and not (wl.get("spec") or {}).get("active", True) and not d.rtj.spec["suspend"]:
        return "Deactivated", (f"Workload {wl['metadata']['name']} was deactivated by Kueue (its requeue limit) "
                               "or an admin, and stays so: set spec.suspend to true, then false, to queue the job "
                               "again")
    if wl is None:
        why = d.world.workload_error or "Kueue has not made a Workload for it yet"
        return "WaitingForWorkload", (f"Job {d.job_name} is suspended for LocalQueue {name}: {why} (is Kueue "
                                      "installed, and does it manage batch/job?)")
    evicted = _true(wl, "Evicted")
    if evicted is not None:
        return evicted.get("reason") or "Evicted", f"evicted by Kueue: {evicted.get('message') or ''}".strip()
    pending = next((c for c in wl.get("status", {}).get("conditions") or [] if c.get("type") == "QuotaReserved"),
                   None)
    message = (pending or {}).get("message") or "waiting for quota"
    return (pending or {}).get("reason") or "Pending", f"waiting in LocalQueue {name} (Workload " \
                                                       f"{wl['metadata']['name']}): {message}"


def activate_workload(d: Draft, active: bool, why: str) -> None:
    wl = d.world.workload
    if wl is None or bool((wl.get("spec") or {}).get("active", True)) == active:
        return
    meta = wl["metadata"]
    d.do(Action(PATCH, "Workload", meta["name"], d.rtj.namespace, {"spec": {"active": active}},
                event=("Normal", "WorkloadActivated" if active else "WorkloadDeactivated",
                       f"{'Activated' if active else 'Deactivated'} Kueue Workload {meta['name']}: {why}")))
