"""The RTJ's children: the Service, the PVC, the NetworkPolicy, the Job (one per gang attempt), the
coordinator pod and, while the gang is suspended for capacity, its capacity probes.
Created, patched and deleted to converge on what status says (status.attempt: the gang that runs now)."""

from __future__ import annotations

from typing import Any

import kopf

from .. import api, ladder
from ..actions import CREATE, DELETE, PATCH, Action
from ..builders import (
    build_coordinator,
    build_job,
    build_network_policy,
    build_pvc,
    build_service,
    network_policy_name,
    pvc_name,
    service_name,
)
from ..builders.job import PER_INDEX_LIMIT, template_hash
from ..builders.probe import probe_hash
from ..conditions import INVALID_SPEC, timestamp
from ..draft import Draft
from ..spec import RTJ
from ..world import World, owned_by
from . import grace, interval
from .kueue import queued
from .phase import TERMINAL
from .placement import gang_probes
from .pods import is_current, is_older, job_attempt, suspended_by_operator

# Service fields the operator owns (the API server defaults the rest, e.g. clusterIPs).
SERVICE_FIELDS = ("ports", "selector", "publishNotReadyAddresses")


def child_conflict(world: World, rtj: RTJ) -> str:
    """A message if an object holding a child's name is not ours (an unowned, unlabelled one shows up
    only when a create meets it: see reconcile.settle)."""
    for kind, obj in (("Service", world.service), ("Job", world.job)):
        if obj is not None and not owned_by(obj, rtj.uid):
            return (f"{kind} {rtj.namespace}/{obj['metadata']['name']} already exists and is not owned by this "
                    f"ResilientTrainingJob: rename the job or remove that {kind}")
    if world.pvc is not None and not (owned_by(world.pvc, rtj.uid) or retained_by_us(world.pvc, rtj)):
        return (f"PersistentVolumeClaim {rtj.namespace}/{pvc_name(rtj)} already exists and was not made for this "
                "job: rename the job, remove the claim, or name it in spec.storage.existingClaim to use it on purpose")
    return ""


def retained_by_us(pvc: dict[str, Any], rtj: RTJ) -> bool:
    """A claim kept (retention: Retain) from an earlier RTJ of this name: reused on purpose, so a
    re-created job resumes from its checkpoints. It has no owner, and our labels."""
    labels = pvc["metadata"].get("labels") or {}
    return (not pvc["metadata"].get("ownerReferences") and labels.get(api.LABEL_MANAGED_BY) == api.MANAGER
            and labels.get(api.LABEL_NAME) == rtj.name)


def _create(d: Draft, obj: dict[str, Any], adopt: bool = True, retained: dict[str, str] | None = None,
            gates: bool = True) -> None:
    if adopt:
        kopf.adopt(obj, owner=d.rtj.owner)
    meta = obj["metadata"]
    d.do(Action(CREATE, obj["kind"], meta["name"], meta["namespace"], obj, gates=gates, owner_uid=d.rtj.uid,
                retained_labels=retained or {},
                event=("Normal", "Created", f"Created {obj['kind']} {meta['name']}")))


def ensure_service(d: Draft) -> None:
    desired, have = build_service(d.rtj), d.world.service
    if have is None:
        _create(d, desired)
        return
    drift = {k: v for k, v in desired["spec"].items() if k in SERVICE_FIELDS and have["spec"].get(k) != v}
    if drift:
        d.do(Action(PATCH, "Service", service_name(d.rtj), d.rtj.namespace, {"spec": drift}, gates=True,
                    event=("Normal", "Updated", f"Updated Service {service_name(d.rtj)}: {', '.join(sorted(drift))}")))


def ensure_network_policy(d: Draft) -> None:
    """The gang's NetworkPolicy (builders/network.py): created, its spec kept as built, deleted when the
    user turns spec.isolation off. Only ours is ever patched or deleted (World.assemble drops one that
    is labelled like ours but owned by another)."""
    desired, have, name = build_network_policy(d.rtj), d.world.network_policy, network_policy_name(d.rtj)
    if desired is None:
        if have is not None and not have["metadata"].get("deletionTimestamp"):
            d.do(Action(DELETE, "NetworkPolicy", name, d.rtj.namespace, uid=have["metadata"].get("uid", ""),
                        event=("Normal", "Deleted", f"Deleted NetworkPolicy {name}: spec.isolation.enabled is "
                                                    "false")))
        return
    # Not a gate: the gang runs without it (a refusal is reported: ReconcileError), as it would where no
    # network policy engine runs.
    if have is None:
        _create(d, desired, gates=False)
    elif have.get("spec") != desired["spec"]:
        d.do(Action(PATCH, "NetworkPolicy", name, d.rtj.namespace, {"spec": desired["spec"]},
                    event=("Normal", "Updated", f"Updated NetworkPolicy {name}: spec.isolation")))


def ensure_pvc(d: Draft) -> None:
    desired = build_pvc(d.rtj)
    if desired is None or d.world.pvc is not None:
        return
    # Retain: no owner reference, so deleting the job keeps the checkpoints.
    retain = d.rtj.spec["storage"]["retention"] != "Delete"
    _create(d, desired, adopt=not retain,
            retained={api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_NAME: d.rtj.name} if retain else None)


def template_rejected(d: Draft) -> bool:
    """The pod template changed and the server rejects the new Job (the dry run in World.probe):
    the running gang keeps running."""
    verdict = d.world.template
    if verdict is None or verdict[0]:
        return False
    rejected(d, "Job", verdict[1])
    return True


def rejected(d: Draft, kind: str, message: str) -> None:
    text = f"the API server rejects the {kind} this spec produces: {message}"
    if not d.was(INVALID_SPEC, "ChildRejected", text):
        d.event("Warning", "InvalidSpec", text)
    d.cond(INVALID_SPEC, True, "ChildRejected", text)


def ensure_job(d: Draft) -> None:
    """Converge the Job to status.attempt: the gang that should run now. Each attempt has its own Job
    (builders/names.py): an older gang's is deleted (Foreground: its pods first), and the new one is made
    once none of the old gang's pods still runs on a node that answers (old_gang_in_the_way). A pod on a
    lost node is not waited for: it cannot confirm its end until the node is fenced, which may take as
    long as the instance lives; under its own names, the new gang is out of its reach."""
    rtj, job, status = d.rtj, d.world.job, d.status
    ledger = status.recovery
    for old in d.world.old_jobs:
        retire_job(d, old)
    if is_older(job, status.attempt):
        if not job["metadata"].get("deletionTimestamp"):
            retire_job(d, job, f"for attempt {status.attempt}: {ledger.pending_gang_restart or 'restart'}")
            return
        if old_gang_in_the_way(d):
            d.busy = True  # its pods are stopping (and saving) on nodes that answer: the new gang loads after
            return
        job = None
    elif job is not None and job["metadata"].get("deletionTimestamp"):
        d.busy = True  # this attempt's Job, deleted by someone else: made again once it is gone
        return
    if job is None:
        # Made suspended for spec.suspend: the operator's to resume (with a queue, Kueue's instead).
        ledger.suspended_job = bool(rtj.spec["suspend"]) and not rtj.queue_name
        _create(d, build_job(rtj, status.attempt, interval.for_new_gang(d), grace.for_new_gang(d)))
        return
    desired = build_job(rtj, status.attempt, interval.applied(rtj, job), grace.applied(rtj, job), d.job_name)
    annotations = job["metadata"].get("annotations") or {}
    have, want = annotations.get(api.ANNOTATION_TEMPLATE_HASH), template_hash(desired)
    if have is not None and have != want:
        # The pod template changed (and the dry run passed): the user's decision, a new gang, no budget
        # charged.
        next_attempt(d, "SpecChanged", f"the pod template changed (generation {rtj.generation})")
        return
    ledger.pending_gang_restart = ""
    patch: dict[str, Any] = {}
    # Suspended by the user, or (recorded in status first) to release its nodes while a pod of it finds none.
    for_capacity = bool(ledger.suspended_for_capacity) and not rtj.spec["suspend"]
    suspend = bool(rtj.spec["suspend"]) or for_capacity
    event = None
    is_suspended = bool(job["spec"].get("suspend"))
    # A queue owns Job.spec.suspend (Kueue admits, preempts, re-queues: ensure_queue). Without one, the
    # operator resumes only a Job it suspended itself, as its status or the Job's own mark says (a suspend
    # whose status write was lost: a leader that lost its Lease mid-write): one suspended by someone else
    # (a queue that adds its own label, a person) is waited for, never fought over (phase.py says so).
    if queued(d):
        ledger.suspended_job = False
    elif is_suspended != suspend and (suspend or suspended_by_operator(job, ledger.suspended_job)):
        patch["spec"] = {"suspend": suspend}
        patch["metadata"] = {"annotations": {api.ANNOTATION_SUSPENDED_BY: api.MANAGER if suspend else None}}
        ledger.suspended_job = suspend
        why = " to release its nodes: a pod of it finds no node (WaitingForCapacity)" if for_capacity else ""
        event = ("Normal", "Suspended" if suspend else "Resumed",
                 f"Job {job['metadata']['name']} {'suspended' if suspend else 'resumed'}{why}")
    elif is_suspended == suspend:
        # Suspended as the operator wants it (whoever did it, a crash between the patch and the status write
        # included): the operator's to resume.
        ledger.suspended_job = suspend
    if have is None:
        # A Job an earlier operator made (a hash of its whole spec): adopted as it runs, so an upgrade
        # restarts no gang; from now on its template is compared. Its Job-wide backoffLimit (the old
        # backstop, maxRestarts + 1) would fail it for failures the operator excuses: lifted.
        patch.setdefault("metadata", {}).setdefault("annotations", {})[api.ANNOTATION_TEMPLATE_HASH] = want
        if job["spec"].get("backoffLimitPerIndex") is None:
            patch.setdefault("spec", {})["backoffLimit"] = PER_INDEX_LIMIT
    if patch:
        d.do(Action(PATCH, "Job", job["metadata"]["name"], rtj.namespace, patch, event=event))


def retire_job(d: Draft, job: dict[str, Any], why: str = "an older gang's") -> None:
    """Delete an older attempt's Job, Foreground: the Job stays until its pods are gone, so they stay
    visible (World.old_pods) to be waited for or, on a fenced node, forced."""
    meta = job["metadata"]
    if meta.get("deletionTimestamp"):
        return
    d.do(Action(DELETE, "Job", meta["name"], d.rtj.namespace, propagation="Foreground", uid=meta.get("uid", ""),
                event=("Normal", "RecreatingJob", f"Deleting Job {meta['name']} (attempt {job_attempt(job)}) {why}")))


def old_gang_in_the_way(d: Draft) -> list[str]:
    """The older gangs' pods the new gang waits for: those still running on a node whose kubelet answers
    (Ready, or NotReady but reporting: it stops the pod and confirms). They get their grace period to stop
    and save, and the new gang must load what they saved. Not waited for: a pod that ended, one never
    bound, or one on a node gone or unreachable (it may never confirm its end until fenced)."""
    world = d.world
    old_gang = is_older(world.job, d.status.attempt)
    return (still_running(d, world.old_pods, world.old_nodes)
            + still_running(d, world.pods if old_gang else [], world.nodes))


def still_running(d: Draft, pods: list[dict[str, Any]], nodes: dict[str, dict[str, Any] | None]) -> list[str]:
    """The names of `pods` that have not ended and are bound to a node whose kubelet answers (it will stop
    them and confirm): not to one that is gone or unreachable."""
    running = []
    for pod in pods:
        node_name = (pod.get("spec") or {}).get("nodeName")
        if (pod.get("status") or {}).get("phase") in ("Failed", "Succeeded") or not node_name:
            continue
        if ladder.node_lost(nodes.get(node_name), d.now) not in (ladder.NODE_UNREACHABLE, ladder.NODE_DELETED):
            running.append(pod["metadata"]["name"])
    return running


def next_attempt(d: Draft, reason: str, message: str) -> None:
    """Record that the gang restarts as the next attempt; the next pass replaces the Job."""
    status = d.status
    status.attempt += 1
    status.recovery.pending_gang_restart = reason
    status.recovery.gang_restart_time = timestamp(d.now)
    d.event("Warning" if reason != "SpecChanged" else "Normal", "RecreatingGang",
            f"Recreating all {d.rtj.nodes} pods as attempt {status.attempt}: {message}")
    d.act = True


def ensure_coordinator(d: Draft) -> None:
    """The coordinator lives with its gang attempt, under the attempt's name: created before the Job
    (whose pods wait for its DNS name), deleted with the gang (a new attempt: the new one is made at once,
    under its own name), while the gang is suspended, and once the job is over. Its loss is charged in
    reconcile.observe (ladder.coordinator_finding) as a new gang."""
    rtj, status, have = d.rtj, d.status, d.world.coordinator
    job = d.world.job
    for old in d.world.old_coordinators:
        stop_coordinator(d, old)
    suspended = bool(rtj.spec["suspend"] or status.recovery.suspended_for_capacity
                     or (job is not None and (job.get("spec") or {}).get("suspend")))
    if have is not None:
        if suspended or not rtj.spec["coordinator"]["enabled"]:
            stop_coordinator(d, have)
        d.busy = d.busy or bool(have["metadata"].get("deletionTimestamp"))
        return
    desired = build_coordinator(rtj, status.attempt, d.job_name)
    # With the gang of this attempt, or just before its Job is made (an older gang's going away included).
    # With a queue the Job is made suspended, so its coordinator waits for Kueue's admission too. Not while
    # an older one still runs on a node that answers (it stops within its 30 s grace): they would share
    # nothing by name, but where pods share their node's network (hostNetwork, the tests' node agents)
    # they would share the rendezvous ports. The gang's pods stay gated meanwhile (awaiting_coordinator).
    this_gang = is_current(job, status.attempt)
    before_job = job is None or is_older(job, status.attempt)
    if desired is not None and not suspended and (this_gang or (before_job and not rtj.queue_name)):
        if still_running(d, d.world.old_coordinators, d.world.old_nodes):
            d.busy = True
            return
        _create(d, desired)


def ensure_capacity_probes(d: Draft) -> None:
    """While the gang is suspended for capacity its capacity probes exist, as built now (builders/probe.py;
    placement.wait_for_capacity resumes the gang once all are placed); otherwise none does. A probe that
    ended (evicted, or failed by its kubelet) or was built from another spec or exclusion list is deleted,
    and made again by a later pass. No event per probe: the suspension's event says they are made."""
    status = d.status
    want = (bool(status.recovery.suspended_for_capacity) and not d.rtj.spec["suspend"]
            and d.old.get("phase") not in TERMINAL)
    desired = {p["metadata"]["name"]: p for p in gang_probes(d)} if want else {}
    have = {p["metadata"]["name"]: p for p in d.world.capacity_probes}
    for name, pod in have.items():
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            continue
        built = desired.get(name)
        if built is None or probe_hash(built) != probe_hash(pod) or (pod.get("status") or {}).get("phase") in (
                "Failed", "Succeeded"):
            d.do(Action(DELETE, "Pod", name, d.rtj.namespace, uid=meta.get("uid", "")))
    for name, pod in desired.items():
        if name not in have:
            kopf.adopt(pod, owner=d.rtj.owner)
            d.do(Action(CREATE, "Pod", name, d.rtj.namespace, pod, owner_uid=d.rtj.uid, best_effort=True))


def stop_coordinator(d: Draft, have: dict[str, Any] | None) -> None:
    """Delete a coordinator on purpose: settled in status first (seen, never charged), so a pass that
    reads it gone after the Job resumed (Kueue admits again within seconds) does not call it lost."""
    if have is not None and not have["metadata"].get("deletionTimestamp"):
        uid = have["metadata"].get("uid", "")
        ledger = d.status.recovery
        ledger.seen_pods = sorted({*ledger.seen_pods, uid} - {""})
        d.do(Action(DELETE, "Pod", have["metadata"]["name"], d.rtj.namespace, uid=uid))
