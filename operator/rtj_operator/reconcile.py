"""One level-triggered pass, as a pure function: the RTJ's world in, what to do about it out.

`reconcile(world, now)` returns an Intent: the new status, the actions that converge the children,
the events to post and when to look again. It reads nothing and writes nothing: the runtime builds
the World from its stores (or tools from the API), carries the actions out (actions.execute), folds
their results in (`settle`), writes the status once, then posts the events.

Idempotent: on the same world it decides the same, and a converged world yields no actions and the
same status. Everything it must remember between passes (budgets, charged pods, the gang attempt)
lives in the status (status.py), so an operator restart or a deleted child cannot reset it.

Crash consistency: a decision is recorded in status before the side effect that carries it out, and
each side effect is derived from status plus the world. A pass that charges a failure or moves to a
new gang attempt records it and acts in the next pass (Requeue.act); a pass that acts (evict, fail a
pod, delete the old Job, create the new one) only carries out what status already says. So an
operator that dies at any point counts each failure once and performs each action once.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

from . import api, conditions, health, ladder, metrics, progress
from .actions import CREATE, DELETE, EVICT, FAIL_POD, PATCH, UNGATE, Action, Result
from .builders import build_coordinator, build_job, build_pvc, build_service, job_name, pvc_name, service_name
from .builders.job import PER_INDEX_LIMIT, template_hash
from .conditions import (
    ADMITTED,
    CREATED,
    FAILED,
    INVALID_SPEC,
    QUEUED,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    parse_time,
    timestamp,
)
from .spec import RTJ, semantic_errors
from .status import Status
from .world import World, owned_by

# Seconds until the next look while something is in flight; a quiet job is looked at less often.
# Watch events (the RTJ, its children, its pods, their nodes) wake a job earlier.
BUSY_SECONDS = 2.0
IDLE_SECONDS = 60.0
TERMINAL = ("Succeeded", "Failed")
# Conditions of waits on the platform (reconcile.report_waits).
WAITING_FOR_FENCING = "WaitingForFencing"
WAITING_FOR_POD_TERMINATION = "WaitingForPodTermination"
WAITING_FOR_CAPACITY = "WaitingForCapacity"
# Wait reasons that bound nothing (the job trains meanwhile): their time is not the gang's wait.
UNTIMED_WAITS = frozenset({"StandbyUnschedulable"})
# Service fields the operator owns (the API server defaults the rest, e.g. clusterIPs).
SERVICE_FIELDS = ("ports", "selector", "publishNotReadyAddresses")


@dataclass(frozen=True)
class Requeue:
    """When to run the next pass: `act` (at once, urgently: a decision waits to be carried out) or
    after `seconds`. `waiting`: the job waits on something a watch event will announce (pods being
    scheduled or started, a gang being replaced), so the runtime may stretch the wait while passes
    change nothing."""

    seconds: float = IDLE_SECONDS
    act: bool = False
    waiting: bool = False
    # A grace period or timeout ends then: never looked at later than this, however quiet the job.
    deadline: float | None = None


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str
    # Reports a side effect already done (a create, an eviction): posted even if the status write
    # fails. Other events announce decisions, which only count once status holds them.
    done: bool = False


@dataclass
class Intent:
    status: Status
    actions: list[Action] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    requeue: Requeue = field(default_factory=Requeue)
    # Metric updates, applied by the caller once the status write succeeded (never twice per count).
    metrics: list[Callable[[], None]] = field(default_factory=list)


@dataclass(frozen=True)
class Config:
    # RTJ_ALLOWED_SERVICE_ACCOUNTS (spec.allowed_service_accounts_from_env); None: any.
    allowed_service_accounts: frozenset[str] | None = None
    # Which node conditions and labels mean a Ready node cannot train (--unhealthy-node-condition/-label).
    node_health: health.NodeHealth = health.DEFAULT


# Node exclusions (restartBudget.nodeExclusionSeconds): at most this many at once (the oldest go first),
# and a node is excluded once this many failures charged to the job happened on it.
MAX_EXCLUDED = 16
REPEATED_FAILURES = 2
MAX_NODE_FAILURES = 64
HOSTNAME_FIELD = "metadata.name"


class Draft:
    """The pass being computed: the new status, actions, events, and when to look again."""

    def __init__(self, world: World, now: datetime.datetime, config: Config | None = None):
        self.world, self.now = world, now
        self.config = config or Config()
        self.rtj = RTJ.from_body(world.rtj)
        self.old = world.rtj.get("status") or {}
        self.status = Status.from_dict(self.old)
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.metrics: list[Callable[[], None]] = []
        self.recheck: float | None = None
        self.busy = False  # something is in flight: look again soon
        self.act = False  # a decision was recorded that the next pass carries out
        # A pod of the gang finds no node (WaitingForCapacity, not a standby's): the gang cannot form.
        self.short_of_capacity = False
        budget = self.rtj.spec["restartBudget"]
        self.timing = ladder.Timing(
            node_grace=datetime.timedelta(seconds=budget.get("nodeLossGraceSeconds", 30)),
            terminating_timeout=datetime.timedelta(seconds=budget["terminatingTimeoutSeconds"]))

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def cond(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        self.status.conditions = conditions.set_condition(self.status.conditions, type_, status, reason, message,
                                                          self.rtj.generation, self.now)

    def was(self, type_: str, reason: str, message: str | None = None) -> bool:
        """Whether the last written status had this condition True with this reason (and message)."""
        old = conditions.get_condition(self.old.get("conditions") or [], type_)
        return bool(old and old.get("status") == "True" and old.get("reason") == reason
                    and (message is None or old.get("message") == message))

    def wait(self, seconds: float) -> None:
        self.recheck = seconds if self.recheck is None else min(self.recheck, seconds)

    def do(self, action: Action) -> None:
        self.actions.append(action)
        self.busy = True

    def intent(self, requeue: float | None = None) -> Intent:
        self.status.observed_generation = self.rtj.generation
        phase = self.status.phase or "Pending"
        rtj = self.rtj
        self.metrics.append(lambda p=phase: metrics.record_phase(rtj.namespace, rtj.name, p))
        seconds = requeue if requeue is not None else BUSY_SECONDS if self.busy else IDLE_SECONDS
        if self.recheck is not None:
            seconds = min(seconds, self.recheck)
        return Intent(self.status, self.actions, self.events,
                      Requeue(seconds, act=self.act, waiting=self.busy and not self.act, deadline=self.recheck),
                      self.metrics)


def reconcile(world: World, now: datetime.datetime | None = None, config: Config | None = None) -> Intent:
    """Converge one RTJ's children and compute its new status (see the module doc)."""
    d = Draft(world, now or datetime.datetime.now(datetime.UTC), config)
    rtj, status = d.rtj, d.status
    status.nodes_desired = rtj.nodes
    if d.old.get("phase") in TERMINAL:
        return terminal(d)
    errors = semantic_errors(rtj, d.config.allowed_service_accounts)
    conflict = child_conflict(world, rtj)
    if conflict:
        return conflicted(d, conflict)
    if errors:
        # Nothing is created or changed; whatever already runs keeps running.
        message = "; ".join(errors)
        if d.old.get("observedGeneration") != rtj.generation or not d.was(INVALID_SPEC, "InvalidSpec"):
            d.event("Warning", "InvalidSpec", message)
        d.cond(INVALID_SPEC, True, "InvalidSpec", message)
        return without_changes(d)
    d.cond(INVALID_SPEC, False, "Valid", "")
    if world.storage is not None and world.job is None:
        ok, reason, message = world.storage
        d.cond(conditions.STORAGE_READY, ok, reason, message)
        if not ok:
            previous = conditions.get_condition(d.old.get("conditions") or [], conditions.STORAGE_READY)
            if (previous or {}).get("reason") != reason:
                d.event("Warning", reason, message)
            status.phase = "Pending"
            d.cond(CREATED, False, reason, "waiting for storage: " + message)
            return d.intent(requeue=IDLE_SECONDS)
    ensure_service(d)
    ensure_pvc(d)
    if template_rejected(d):
        return without_changes(d)
    ensure_coordinator(d)
    ensure_job(d)
    ensure_queue(d)
    observe(d, converge=True)
    return d.intent()


# --- children --------------------------------------------------------------------------------------
def child_conflict(world: World, rtj: RTJ) -> str:
    """A message if an object holding a child's name is not ours (an unowned, unlabelled one shows up
    only when a create meets it: see settle)."""
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


def conflicted(d: Draft, message: str) -> Intent:
    was = conditions.get_condition(d.old.get("conditions") or [], CREATED) or {}
    if was.get("reason") != "ChildConflict":
        d.event("Warning", "ChildConflict", message)
    d.cond(CREATED, False, "ChildConflict", message)
    d.status.phase = "Pending"
    d.cond(RUNNING, False, "ChildConflict", "nothing is created or changed until the conflict is resolved")
    return d.intent(requeue=IDLE_SECONDS)


def without_changes(d: Draft) -> Intent:
    """The spec cannot be applied: report what runs (if anything) and change nothing."""
    if d.world.job is None:
        d.status.phase = "Invalid"
        d.cond(CREATED, False, "InvalidSpec", "nothing was created: fix the spec")
        return d.intent()
    observe(d, converge=False)
    return d.intent()


def _create(d: Draft, obj: dict[str, Any], adopt: bool = True, retained: dict[str, str] | None = None) -> None:
    if adopt:
        kopf.adopt(obj, owner=d.rtj.owner)
    meta = obj["metadata"]
    d.do(Action(CREATE, obj["kind"], meta["name"], meta["namespace"], obj, gates=True, owner_uid=d.rtj.uid,
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
    """Converge the Job to status.attempt: the gang that should run now."""
    rtj, job, status = d.rtj, d.world.job, d.status
    ledger = status.recovery
    if job is not None and job["metadata"].get("deletionTimestamp"):
        d.busy = True  # the old gang is still going away (Foreground: its pods first)
        return
    if job is not None and job_attempt(job) < status.attempt:
        # Status already says which gang runs next (written before this delete, see the module doc).
        why = ledger.pending_gang_restart or "restart"
        d.do(Action(DELETE, "Job", job_name(rtj), rtj.namespace, propagation="Foreground",
                    uid=job["metadata"].get("uid", ""),
                    event=("Normal", "RecreatingJob", f"Deleting Job {job_name(rtj)} (attempt {job_attempt(job)}) "
                                                      f"for attempt {status.attempt}: {why}")))
        return
    desired = build_job(rtj, status.attempt)
    if job is None:
        coordinator = d.world.coordinator
        if coordinator is not None and (coordinator["metadata"].get("deletionTimestamp")
                                        or coordinator_attempt(coordinator) < status.attempt):
            d.busy = True  # the old gang's coordinator still answers its name: the new pods would find it
            return
        # Made suspended for spec.suspend: the operator's to resume (with a queue, Kueue's instead).
        ledger.suspended_job = bool(rtj.spec["suspend"]) and not rtj.queue_name
        _create(d, desired)
        return
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
    # operator resumes only a Job it suspended itself: one suspended by someone else (a queue that adds
    # its own label, a person) is waited for, never fought over (observe reports it).
    if queued(d):
        ledger.suspended_job = False
    elif is_suspended != suspend and (suspend or ledger.suspended_job):
        patch["spec"] = {"suspend": suspend}
        ledger.suspended_job = suspend
        why = " to release its nodes: a pod of it finds no node (WaitingForCapacity)" if for_capacity else ""
        event = ("Normal", "Suspended" if suspend else "Resumed",
                 f"Job {job_name(rtj)} {'suspended' if suspend else 'resumed'}{why}")
    elif is_suspended == suspend:
        # Suspended as the operator wants it (whoever did it, a crash between the patch and the status write
        # included): the operator's to resume.
        ledger.suspended_job = suspend
    if have is None:
        # A Job an earlier operator made (a hash of its whole spec): adopted as it runs, so an upgrade
        # restarts no gang; from now on its template is compared. Its Job-wide backoffLimit (the old
        # backstop, maxRestarts + 1) would fail it for failures the operator excuses: lifted.
        patch["metadata"] = {"annotations": {api.ANNOTATION_TEMPLATE_HASH: want}}
        if job["spec"].get("backoffLimitPerIndex") is None:
            patch.setdefault("spec", {})["backoffLimit"] = PER_INDEX_LIMIT
    if patch:
        d.do(Action(PATCH, "Job", job_name(rtj), rtj.namespace, patch, event=event))


def next_attempt(d: Draft, reason: str, message: str) -> None:
    """Record that the gang restarts as the next attempt; the next pass replaces the Job."""
    status = d.status
    status.attempt += 1
    status.recovery.pending_gang_restart = reason
    status.recovery.gang_restart_time = timestamp(d.now)
    d.event("Warning" if reason != "SpecChanged" else "Normal", "RecreatingGang",
            f"Recreating all {d.rtj.nodes} pods as attempt {status.attempt}: {message}")
    d.act = True


def terminal(d: Draft) -> Intent:
    job = d.world.job
    # Idempotent: a Failed job never holds GPUs (suspending keeps the Job for inspection). With a queue,
    # Kueue would un-suspend an admitted Job: its Workload is deactivated instead (Kueue then evicts it,
    # suspends the Job and releases the quota).
    if d.old.get("phase") == "Failed" and job is not None and owned_by(job, d.rtj.uid):
        if queued(d):
            activate_workload(d, False, "the job failed")
        elif not job["spec"].get("suspend"):
            d.actions.append(Action(PATCH, "Job", job_name(d.rtj), d.rtj.namespace, {"spec": {"suspend": True}}))
    stop_coordinator(d)
    return d.intent()


# --- Kueue --------------------------------------------------------------------------------------------
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
    exits are excused in charge())."""
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
        activate_workload(d, not rtj.spec["suspend"], "spec.suspend is true" if rtj.spec["suspend"] else
                          "spec.suspend is false")
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


def queue_wait(d: Draft, name: str) -> tuple[str, str]:
    """Why a queued gang does not run, from its Workload (Kueue's conditions carry the reason)."""
    wl = d.world.workload
    if wl is None:
        why = d.world.workload_error or "Kueue has not made a Workload for it yet"
        return "WaitingForWorkload", (f"Job {job_name(d.rtj)} is suspended for LocalQueue {name}: {why} (is Kueue "
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


def ensure_coordinator(d: Draft) -> None:
    """The coordinator lives with its gang attempt: created before the Job (whose pods wait for its DNS
    name), deleted with the gang (a new attempt), while the gang is suspended, and once the job is over.
    Its loss is charged in observe (ladder.coordinator_finding) as a new gang."""
    rtj, status, have = d.rtj, d.status, d.world.coordinator
    job = d.world.job
    suspended = bool(rtj.spec["suspend"] or status.recovery.suspended_for_capacity
                     or (job is not None and (job.get("spec") or {}).get("suspend")))
    if have is not None:
        if not have["metadata"].get("deletionTimestamp") and (
                coordinator_attempt(have) < status.attempt or suspended or not rtj.spec["coordinator"]["enabled"]):
            stop_coordinator(d)
        d.busy = d.busy or bool(have["metadata"].get("deletionTimestamp"))
        return
    desired = build_coordinator(rtj, status.attempt)
    # With the gang of this attempt only: a Job still going away is the old gang's. With a queue the Job
    # is made suspended, so its coordinator waits for Kueue's admission too.
    this_gang = is_current(job, status.attempt)
    if desired is not None and not suspended and (this_gang or (job is None and not rtj.queue_name)):
        _create(d, desired)


def stop_coordinator(d: Draft) -> None:
    """Delete the coordinator on purpose: settled in status first (seen, never charged), so a pass that
    reads it gone after the Job resumed (Kueue admits again within seconds) does not call it lost."""
    have = d.world.coordinator
    if have is not None and not have["metadata"].get("deletionTimestamp"):
        uid = have["metadata"].get("uid", "")
        ledger = d.status.recovery
        ledger.seen_pods = sorted({*ledger.seen_pods, uid} - {""})
        d.do(Action(DELETE, "Pod", have["metadata"]["name"], d.rtj.namespace, uid=uid))


# --- pods and the ladder ---------------------------------------------------------------------------
def is_current(job: dict[str, Any] | None, attempt: int) -> bool:
    """The Job is this attempt's gang and not going away."""
    return job is not None and job_attempt(job) == attempt and not job["metadata"].get("deletionTimestamp")


def job_attempt(job: dict[str, Any]) -> int:
    try:
        return int((job["metadata"].get("annotations") or {}).get(api.LABEL_ATTEMPT, 1))
    except (TypeError, ValueError):
        return 1


def coordinator_attempt(pod: dict[str, Any]) -> int:
    """The gang attempt a coordinator pod was made for (its label; 0 if unreadable: an old one)."""
    return int((pod["metadata"].get("labels") or {}).get(api.LABEL_ATTEMPT, 0) or 0)


JOB_CONTROLLER = "kubernetes.io/job-controller"


def observe(d: Draft, converge: bool) -> None:
    """Read pods and nodes, run the recovery ladder, and derive phase and conditions."""
    world, status = d.world, d.status
    job, pods = world.job, world.pods
    managed_by = ((job or {}).get("spec") or {}).get("managedBy")
    if managed_by and managed_by != JOB_CONTROLLER:
        managed_elsewhere(d, managed_by)
        return

    step = ladder.checkpoint_step([*pods, *world.departed])
    if step is not None and step > int(status.last_checkpoint_step if status.last_checkpoint_step is not None
                                       else -1):
        status.last_checkpoint_step = step
        status.last_checkpoint_time = timestamp(d.now)
    # The pods' own reports (progress.py): in-job recoveries, the newest recovery, a live checkpoint step.
    found = progress.reports(pods)
    folded = progress.fold(status, found, {p["metadata"].get("uid", p["metadata"]["name"]) for p in pods}, d.now)

    ledger = status.recovery
    seen = set(ledger.seen_pods)
    plan = ladder.plan(pods, world.nodes, seen, d.now, d.timing, world.cloud_fencing, world.zones, world.coordinator,
                       d.config.node_health)
    if plan.recheck is not None:
        d.wait(max(0.5, plan.recheck))
    report_waits(d, plan)
    current = is_current(job, status.attempt)
    if converge and current:
        wait_for_capacity(d, plan)
    # A Job being deleted (a gang restart, or by hand) takes its pods along: not failures to charge.
    if converge and current:
        # Act only on what an earlier pass already charged: the charge is in status first.
        act_on(d, [a for a in plan.actions if a.uid in seen])
        charge(d, plan, seen)
        judge_job(d)
        release_gated(d)
    elif converge and job is not None and job["metadata"].get("deletionTimestamp"):
        # The old gang is gone (Foreground) only once its pods are; a pod on a lost node never
        # confirms its deletion: fail and delete it as PodGC would, or the next gang waits for ever.
        act_on(d, [a for a in plan.actions if a.action == ladder.FORCE])
    # Only pods still listed can turn up again, so the charged set is bounded by the pods themselves.
    listed = {p["metadata"].get("uid", p["metadata"]["name"]) for p in [
        *pods, *([world.coordinator] if world.coordinator else [])]}
    ledger.seen_pods = sorted(seen & listed)
    ledger.evictions_refused = [uid for uid in ledger.evictions_refused if uid in listed]

    troubled = {f.pod for f in plan.findings} | {a.pod for a in plan.actions}
    derive_phase(d, [p for p in pods if p["metadata"]["name"] not in troubled])
    publish_progress(d, found, folded)


def publish_progress(d: Draft, found: list[progress.Report], folded: progress.Folded) -> None:
    """Live progress, goodput and the in-job recoveries' events, once the phase is known."""
    status = d.status
    progress.rolled_back(status, found)
    ended = status.phase in TERMINAL and d.old.get("phase") != status.phase
    due = progress.update_progress(status, found, d.now, folded.changed, force=ended)
    progress.update_goodput(status, found, d.now)
    last = status.last_recovery or {}
    if folded.new.get(last.get("tier", "")) and last.get("seconds") is not None:
        tier, seconds = last["tier"], float(last["seconds"])
        d.metrics.append(lambda t=tier, s=seconds: metrics.RECOVERY_SECONDS.labels(t).observe(s))
    events, event_due = progress.in_job_events(status, found, d.now)
    for reason, message in events:
        d.event("Warning", reason, message)
    for wait in (due, event_due):  # not `seconds`: the metrics above run after the pass
        if wait is not None:
            d.wait(max(0.5, wait))


FENCING_HOW = ("its index is replaced once the node is fenced: deleted (as the cloud node lifecycle controller "
               "does once its instance is gone), tainted node.kubernetes.io/out-of-service, or (with --check-ec2) "
               "its EC2 instance stopped or terminated")


def report_waits(d: Draft, plan: ladder.Plan) -> None:
    """Waits on the platform that outlast their timeout, each a condition (and an event when it begins)."""
    if plan.brake:
        waiting(d, WAITING_FOR_FENCING, "MassNodeLoss", f"{plan.brake}: likely a partition or a control-plane "
                "problem, not node failures; nothing is evicted or charged for those nodes until they come back or "
                "are fenced")
    elif plan.unfenced:
        pods = "; ".join(f"pod {pod} on node {node} ({why})" for node, (pod, why, _) in sorted(plan.unfenced.items()))
        waiting(d, WAITING_FOR_FENCING, "NodeNotFenced", f"{pods}: its ranks may still run, so no second pod of its "
                f"index is started; {FENCING_HOW}")
    else:
        waiting(d, WAITING_FOR_FENCING, "", "")
    if plan.stuck:
        pods = "; ".join(f"pod {pod} on node {node}" for pod, (node, _) in sorted(plan.stuck.items()))
        waiting(d, WAITING_FOR_POD_TERMINATION, "PodStuckTerminating", f"{pods}: terminating past its grace period "
                "and terminatingTimeoutSeconds on a node that is not lost; its container does not stop (a process in "
                "uninterruptible sleep?). Its index waits until it ends; no other pod of the gang lands on that node; "
                "nothing is forced unless the node is fenced (deleted or tainted node.kubernetes.io/out-of-service)")
    else:
        waiting(d, WAITING_FOR_POD_TERMINATION, "", "")


def wait_for_capacity(d: Draft, plan: ladder.Plan) -> None:
    """A pod the scheduler finds no node for: say so (WaitingForCapacity, with the scheduler's message);
    after capacitySuspendSeconds suspend the gang so its healthy nodes are released, and resume it once
    enough fitting nodes show up; after capacityTimeoutSeconds in all, end Failed with the platform's
    reason. Never charged to the job (ladder.attribute excuses the survivors' failed rendezvous)."""
    ledger, budget = d.status.recovery, d.rtj.spec["restartBudget"]
    if d.rtj.spec["suspend"]:
        return
    old = conditions.get_condition(d.old.get("conditions") or [], WAITING_FOR_CAPACITY) or {}
    since = parse_time(old.get("lastTransitionTime")) if (
        old.get("status") == "True" and old.get("reason") not in UNTIMED_WAITS) else None
    waited = (d.now - since).total_seconds() if since else 0.0
    fits = d.world.fitting_nodes or {}
    whose = "the job's pods"
    if ledger.suspended_for_capacity:
        if len(fits) >= d.rtj.nodes and set(fits.values()) != set(ledger.capacity_nodes):
            ledger.suspended_for_capacity, ledger.capacity_nodes = "", []
            d.event("Normal", "ResumingForCapacity", f"{len(fits)} nodes fit a pod of the job now "
                                                     f"({', '.join(list(fits)[:8])}): resuming the gang")
            d.act = True
            waiting(d, WAITING_FOR_CAPACITY, "Resuming", "enough fitting nodes showed up: the gang resumes")
        else:
            d.short_of_capacity = True
            waiting(d, WAITING_FOR_CAPACITY, "SuspendedForCapacity", f"suspended since "
                    f"{ledger.suspended_for_capacity} to release its nodes: {len(fits)} node(s) fit a pod of it, "
                    f"{d.rtj.nodes} needed; it resumes by itself once enough do")
    elif why := coordinator_unschedulable(d):
        # The gang's pods keep their gate meanwhile (awaiting_coordinator), so they hold no node:
        # nothing to release by suspending (and resuming would wait for worker nodes, not for the
        # coordinator's). Not the job's fault; bounded by capacityTimeoutSeconds.
        holding = sum(1 for p in d.world.pods if on_node(p))
        d.short_of_capacity, whose = True, "the job's coordinator"
        waiting(d, WAITING_FOR_CAPACITY, "CoordinatorUnschedulable",
                f"the coordinator pod {d.world.coordinator['metadata']['name']}: {why}; the gang's pods wait for it "
                + (f"({holding} of them on nodes)" if holding else "(gated: they hold no node)"))
        if budget["capacityTimeoutSeconds"]:
            d.wait(max(1.0, budget["capacityTimeoutSeconds"] - waited))
    elif plan.unschedulable or (old.get("reason") == "Unschedulable" and not scheduled(d)):
        # Once a pod found no node, the wait (and its clock) goes on until every index has a node: a gang
        # short of nodes has its pods take turns on the nodes it has (each failing its rendezvous, the
        # next waiting out the Job controller's back-off), so at a given moment none may be unschedulable.
        if plan.unschedulable:
            pod, message = sorted(plan.unschedulable.items())[0]
            more = f" (and {len(plan.unschedulable) - 1} more)" if len(plan.unschedulable) > 1 else ""
            what = f"pod {pod}{more}: {message}"
            training = running_ready(d.world.pods)
            if len(training) >= d.rtj.nodes:
                # A spare's (or a lost index's, whose ranks a spare took) pod: the job trains on its nodes
                # meanwhile, so nothing is suspended or timed out; one standby fewer, said so.
                waiting(d, WAITING_FOR_CAPACITY, "StandbyUnschedulable",
                        f"{what}; the job trains on its {d.rtj.nodes} nodes meanwhile, "
                        f"with {len(training) - d.rtj.nodes} standby(s)")
                return
        else:
            what = old.get("message") or "a pod of the gang found no node"
        d.short_of_capacity = True
        waiting(d, WAITING_FOR_CAPACITY, "Unschedulable", what)
        if waited >= budget["capacitySuspendSeconds"]:
            ledger.suspended_for_capacity, ledger.capacity_nodes = timestamp(d.now), sorted(fits.values())
            d.event("Warning", "SuspendingForCapacity", f"the gang has lacked a node for {waited:.0f}s "
                                                       f"(restartBudget.capacitySuspendSeconds; {what}): suspending "
                                                       "it to release its nodes until enough fitting nodes show up")
            # Said in the same write that decides it: the Job is suspended before the next pass.
            waiting(d, WAITING_FOR_CAPACITY, "SuspendedForCapacity", f"suspended since {ledger.suspended_for_capacity} "
                    f"to release its nodes: {len(fits)} node(s) fit a pod of it, {d.rtj.nodes} needed; it resumes "
                    "by itself once enough do")
            d.act = True
        else:
            d.wait(max(1.0, budget["capacitySuspendSeconds"] - waited))
    else:
        waiting(d, WAITING_FOR_CAPACITY, "", "")
        return
    limit = budget["capacityTimeoutSeconds"]
    if limit and waited >= limit:
        fail(d, "InsufficientCapacity", f"no capacity for {whose} for {waited:.0f}s "
                                        f"(restartBudget.capacityTimeoutSeconds={limit})")


def coordinator_unschedulable(d: Draft) -> str:
    """The scheduler's message if it finds no node for the coordinator of the gang's attempt."""
    coordinator = d.world.coordinator
    if coordinator is None or coordinator_attempt(coordinator) != d.status.attempt:
        return ""
    return ladder.unschedulable(coordinator)


def scheduled(d: Draft) -> bool:
    """Whether every index of the gang has a pod bound to a node (not going away), or none is wanted."""
    if ((d.world.job or {}).get("spec") or {}).get("suspend"):
        return True  # a queue holds the gang: no pod to place
    bound = {(p["metadata"].get("annotations") or {}).get(ladder.INDEX) for p in d.world.pods if on_node(p)}
    return len(bound - {None}) >= d.rtj.nodes


def on_node(pod: dict[str, Any]) -> bool:
    """Whether the pod holds a node: bound to one, not going away, not finished."""
    return bool(pod.get("spec", {}).get("nodeName") and not pod["metadata"].get("deletionTimestamp")
                and pod.get("status", {}).get("phase") in ("Pending", "Running"))


def waiting(d: Draft, type_: str, reason: str, message: str) -> None:
    """A wait condition: True with `reason` (an event when it begins or its reason changes), or, with no
    reason, False if it was there (RTJs that never waited carry none)."""
    old = conditions.get_condition(d.old.get("conditions") or [], type_)
    if not reason:
        if old is not None and old.get("status") == "True":
            d.cond(type_, False, "Resolved", "")
        return
    if not (old and old.get("status") == "True" and old.get("reason") == reason):
        d.event("Warning", reason, message)
    d.cond(type_, True, reason, message)
    if old and old.get("status") == "True" and old.get("reason") in UNTIMED_WAITS and reason not in UNTIMED_WAITS:
        # The condition stayed True, but the wait its clock bounds (wait_for_capacity) begins now: a
        # standby that lacked a node for a day must not time the gang out at its first wait.
        cond = conditions.get_condition(d.status.conditions, type_)
        cond["lastTransitionTime"] = timestamp(d.now)
    d.busy = True


def managed_elsewhere(d: Draft, managed_by: str) -> None:
    """A Job another controller runs (spec.managedBy, e.g. MultiKueue dispatching it to a worker cluster):
    its pods are not here, so nothing is waited on or charged; the RTJ mirrors the Job's own status."""
    job, status = d.world.job or {}, d.status
    job_status = job.get("status") or {}
    conds = {c.get("type"): c for c in job_status.get("conditions") or [] if c.get("status") == "True"}
    message = (f"Job {job_name(d.rtj)} is managed by {managed_by}: its pods run elsewhere; this RTJ shows the "
               "Job's own status, and recovery is that controller's")
    was = conditions.get_condition(d.old.get("conditions") or [], RUNNING) or {}
    if was.get("reason") != "ManagedElsewhere":
        d.event("Warning", "ManagedElsewhere", message)
    status.nodes_ready = int(job_status.get("ready") or 0)
    if "Complete" in conds or "SuccessCriteriaMet" in conds:
        status.phase = "Succeeded"
        status.completion_time = status.completion_time or timestamp(d.now)
        d.cond(SUCCEEDED, True, "JobComplete", message)
    elif "Failed" in conds:
        fail(d, "FailedElsewhere", conds["Failed"].get("message") or message)
    else:
        status.phase = "Running" if status.nodes_ready >= d.rtj.nodes else "Pending"
    d.cond(RUNNING, status.phase == "Running", "ManagedElsewhere", message)


def act_on(d: Draft, findings: list[ladder.Finding]) -> None:
    ns = d.rtj.namespace
    for f in findings:
        if f.action == ladder.EVICT:
            d.do(Action(EVICT, "Pod", f.pod, ns, uid=f.uid,
                        event=("Warning", "EvictingPod", f"Evicting pod {f.pod}: {f.message}; the Job controller "
                                                         "replaces it on a healthy node")))
        elif f.action == ladder.FORCE:
            pod = next(p for p in [*d.world.pods, *([d.world.coordinator] if d.world.coordinator else [])]
                       if p["metadata"]["name"] == f.pod)
            body = None
            if pod.get("status", {}).get("phase") != "Failed":
                # As PodGC does: the pod is Failed (and a disruption) before it is deleted, so the Job
                # controller frees its index without charging backoffLimit. metadata.uid makes the patch
                # apply to this pod only, never to a new one of the same name.
                body = {"metadata": {"uid": f.uid}, "status": {"phase": "Failed", "conditions": [{
                    "type": "DisruptionTarget", "status": "True", "reason": ladder.FORCE_REASON,
                    "message": f"rtj-operator: {f.message}", "lastTransitionTime": timestamp(d.now)}]}}
            d.do(Action(FAIL_POD, "Pod", f.pod, ns, body, uid=f.uid,
                        event=("Warning", "ForceDeletedPod", f"Failed and deleted pod {f.pod}: {f.message}")
                        if body else None))


def charge(d: Draft, plan: ladder.Plan, seen: set[str]) -> None:
    """Count each new finding once against the right budget (ladder.attribute) and decide the tier."""
    status = d.status
    ledger = status.recovery
    fault = ledger.charged
    settling = bool(ledger.fault_settles_at) and d.now < (parse_time(ledger.fault_settles_at) or d.now)
    if fault is None or fault.attempt != status.attempt or not (status.restart_started_time or settling):
        fault = ladder.Fault(status.attempt)  # none being recovered
        ledger.fault_settles_at = ""
    job = d.world.job or {}
    # Suspended, or being suspended (by the user, or to release the nodes while a pod waits for capacity):
    # the pods (and the coordinator) go because of it.
    suspended = bool(d.rtj.spec["suspend"] or job.get("spec", {}).get("suspend") or ledger.suspended_for_capacity)
    # A peer's exit is explained by a node of the gang that is lost or that its health agent reports bad.
    charges, fault = ladder.attribute(plan.findings, fault, {**plan.unhealthy, **plan.lost_nodes},
                                      suspended=suspended, capacity=d.short_of_capacity,
                                      stopped_by_suspend=ladder.stopped_by_suspend(d.world.pods, job))
    ledger.charged = fault
    gang: tuple[str, str] | None = None
    for c in charges:
        if c.hold:
            d.wait(c.hold)  # looked at again until its cause shows or the wait is over
            continue
        seen.add(c.finding.uid)
        d.act = d.act or (bool(c.finding.action) and not suspended)
        if c.finding.reason == ladder.UNHEALTHY:
            exclude(d, c.finding.node, c.finding.message)
        elif c.payer == ladder.JOB and c.finding.kind == ladder.JOB_FAILURE and c.finding.node:
            count_node_failure(d, c.finding.node, c.finding.reason)
        if c.why == ladder.EXCUSED:
            cause = c.cause or f"a consequence of the fault being recovered ({status.last_failure_reason})"
            d.event("Warning", "NotCharged", f"{c.finding.reason}: {c.message}; {cause}")
        if c.payer != ladder.NOBODY:
            record_restart(d, c.tier or ladder.REPLACE_POD, c.finding.reason, c.message,
                           platform=c.payer == ladder.PLATFORM)
        if c.tier == ladder.GANG_RESTART and not gang:
            gang = (c.finding.reason, "the coordinator is gone" if c.finding.kind in (
                ladder.COORDINATOR_LOST, ladder.COORDINATOR_FAILED) else "a pod could not complete the rendezvous"
                + (" (not charged: its launcher closed the rendezvous)" if c.payer == ladder.NOBODY else ""))
    permanent = plan.permanent
    if permanent is not None and not suspended:
        fail(d, permanent.reason, permanent.message)
        return
    if enforce_budgets(d):
        return
    if gang:
        # Pods of this attempt only: once the attempt moves on, the old gang's exits are not listed.
        next_attempt(d, *gang)


# --- placement: node exclusions -------------------------------------------------------------------
def exclude(d: Draft, node: str, reason: str) -> None:
    """Keep `node` out of the job's placement for restartBudget.nodeExclusionSeconds (recorded in status
    before any pod is placed by it: release_gated reads status)."""
    seconds = d.rtj.spec["restartBudget"]["nodeExclusionSeconds"]
    if not seconds or not node:
        return
    until = timestamp(d.now + datetime.timedelta(seconds=seconds))
    entries = [e for e in d.status.excluded_nodes if e.get("node") != node]
    d.status.excluded_nodes = [*entries, {"node": node, "reason": reason[:512], "until": until}][-MAX_EXCLUDED:]
    if not any(e.get("node") == node for e in entries):
        d.event("Warning", "NodeExcluded", f"Node {node} is kept out of the job's placement until {until}: {reason}")


def count_node_failure(d: Draft, node: str, reason: str) -> None:
    """A failure charged to the job on `node`: the second one there excludes the node (a restart storm on
    one machine is the machine's, whatever the health agents say)."""
    failures = d.status.recovery.node_failures
    n = failures.pop(node, 0) + 1
    if n >= REPEATED_FAILURES:
        exclude(d, node, f"{n} failures of the job's pods on this node (last: {reason})")
        return
    failures[node] = n
    while len(failures) > MAX_NODE_FAILURES:
        failures.pop(next(iter(failures)))


def excluded(d: Draft) -> list[str]:
    """The nodes excluded now; expired exclusions are dropped from status."""
    d.status.excluded_nodes = [e for e in d.status.excluded_nodes
                               if (parse_time(e.get("until")) or d.now) > d.now]
    return sorted({e["node"] for e in d.status.excluded_nodes if e.get("node")})


def exclusion_terms(pod_spec: dict[str, Any], nodes: list[str]) -> list[dict[str, Any]]:
    """The pod's required node selector terms with `metadata.name NotIn nodes` added to each (a pod
    held by a scheduling gate may only have its node affinity narrowed: KEP-3838)."""
    expression = {"key": HOSTNAME_FIELD, "operator": "NotIn", "values": nodes}
    terms = ((((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    if not terms:
        return [{"matchFields": [expression]}]
    return [{**t, "matchFields": [*(t.get("matchFields") or []), expression]} for t in terms]


def release_gated(d: Draft) -> None:
    """Hand the job's new pods (replacements, spares, a new gang) to the scheduler, each with the node
    exclusions in force now: the operator's scheduling gate removed (others' gates, e.g. Kueue's, kept),
    the excluded nodes added to its node affinity, in one patch guarded by the pod's uid and
    resourceVersion."""
    if awaiting_coordinator(d):
        return
    nodes = excluded(d)
    for pod in d.world.pods:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        gates = spec.get("schedulingGates") or []
        if not gated(pod):
            continue
        body: dict[str, Any] = {
            "metadata": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
            "spec": {"schedulingGates": [g for g in gates if g.get("name") != api.SCHEDULING_GATE]}}
        if nodes:
            body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": exclusion_terms(spec, nodes)}}}
        d.do(Action(UNGATE, "Pod", meta["name"], d.rtj.namespace, body, uid=meta.get("uid", "")))


def bound_since(pod: dict[str, Any] | None) -> str | None:
    """When the pod was bound to a node (its PodScheduled condition turned True)."""
    cond = conditions.get_condition(((pod or {}).get("status") or {}).get("conditions") or [], "PodScheduled")
    return cond.get("lastTransitionTime") if cond and cond.get("status") == "True" else None


def gated(pod: dict[str, Any]) -> bool:
    """Whether a pod (not going away) is held by the operator's scheduling gate."""
    return not pod["metadata"].get("deletionTimestamp") and any(
        g.get("name") == api.SCHEDULING_GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def awaiting_coordinator(d: Draft) -> bool:
    """Whether the gang's gated pods wait for the coordinator of their attempt to have an address.

    A worker's first act is to resolve the coordinator's name, within rendezvousTimeoutSeconds, and a
    name that does not resolve in time fails the pod (71, charged). The Service publishes not-ready
    addresses, so the name resolves once the coordinator has an IP: until then the gate stays (CI: a
    coordinator slow to start on a busy node cost a job a gang restart). Bounded: once the Job is
    rendezvousTimeoutSeconds old, and the coordinator as long bound to a node, the pods go anyway,
    and their own wait says what is wrong. A coordinator the scheduler finds no node for keeps them
    gated with no such bound: that wait is WaitingForCapacity's (wait_for_capacity), never the job's."""
    if not d.rtj.spec["coordinator"]["enabled"] or d.world.job is None:
        return False
    coordinator = d.world.coordinator
    if coordinator is not None and coordinator_attempt(coordinator) != d.status.attempt:
        coordinator = None  # an older gang's: it says nothing of this one
    if (coordinator is not None and not coordinator["metadata"].get("deletionTimestamp")
            and (coordinator.get("status") or {}).get("podIP")):
        return False
    if coordinator_unschedulable(d):
        return True  # wait_for_capacity says so and bounds it (capacityTimeoutSeconds)
    since = [t for t in (parse_time(d.world.job["metadata"].get("creationTimestamp")),
                         parse_time(bound_since(coordinator))) if t is not None]
    left = d.rtj.spec["resiliency"]["rendezvousTimeoutSeconds"] - ((d.now - max(since)).total_seconds() if since else 0)
    if left <= 0:
        return False
    d.wait(max(0.5, left))  # the coordinator's own events wake the job sooner
    return True


def record_restart(d: Draft, tier: str, reason: str, message: str, platform: bool) -> None:
    """Bookkeeping of one restart: counters, progress, condition, metric and event."""
    status, budget = d.status, d.rtj.spec["restartBudget"]
    status.restarts_by_tier[tier] = status.restarts_by_tier.get(tier, 0) + 1
    status.restarts = sum(status.restarts_by_tier.values())
    progress.count_restart(status, tier, reason, ladder.PLATFORM if platform else ladder.JOB)
    status.last_failure_reason, status.last_failure_message = reason, message
    if not status.restart_started_time:  # the first charge of this recovery: where training was
        status.recovery.step_at_fault = (status.progress or {}).get("step")
    status.restart_started_time = status.restart_started_time or timestamp(d.now)
    d.metrics.append(lambda t=tier, r=reason: metrics.RESTARTS.labels(t, r).inc())
    if platform:
        status.disruptions += 1
    else:
        status.job_restarts += 1
        track_progress(status)
    d.cond(RESTARTING, True, tier, message)
    d.event("Warning", tier, f"{reason}: {message} (restart {status.restarts}, job failures "
                             f"{status.job_restarts}/{budget['maxRestarts']}, disruptions "
                             f"{status.disruptions}/{budget['maxDisruptions']})")


def track_progress(status: Status) -> None:
    step = int(status.last_checkpoint_step or 0)
    previous = status.step_at_last_restart
    if previous is None or step > int(previous):
        status.restarts_without_progress = 1
    else:
        status.restarts_without_progress += 1
    status.step_at_last_restart = step


def enforce_budgets(d: Draft) -> bool:
    status = d.status
    counters = {"jobRestarts": status.job_restarts, "disruptions": status.disruptions,
                "restartsWithoutProgress": status.restarts_without_progress}
    spent = ladder.over_budget(counters, d.rtj.spec["restartBudget"], status.last_failure_message or "",
                               int(status.step_at_last_restart or 0))
    if spent is not None:
        fail(d, *spent)
    return status.phase == "Failed"


def judge_job(d: Draft) -> None:
    """The Job's own verdict (FailureTarget comes first, Failed once every pod is gone), and the Job
    controller's replacement back-off, which a new attempt resets."""
    if d.status.phase == "Failed" or d.status.recovery.pending_gang_restart:
        return
    job = d.world.job or {}
    verdict = ladder.job_verdict(job)
    if verdict is not None:
        meaning, cond = verdict
        message = cond.get("message") or "the Job failed"
        if meaning.fails:
            fail(d, meaning.fails, cond.get("message") or "a pod failed with a permanent exit code")
            return
        # The Job gave up on its own (e.g. its deadline); a new gang may still succeed.
        reason = cond.get("reason") or "JobFailed"
        record_restart(d, meaning.tier or ladder.GANG_RESTART, reason, message,
                       platform=meaning.payer == ladder.PLATFORM)
        if not enforce_budgets(d):
            next_attempt(d, reason, message)
        return
    replacement_backoff(d)


def replacement_backoff(d: Draft) -> None:
    """The Job controller's delay before it replaces a failed pod, read from the pods (per index); once
    the replacement would come later than half the rendezvous timeout, the survivors would give up on
    the rendezvous first: a new Job starts without back-off."""
    pods, job, ledger = d.world.pods, d.world.job or {}, d.status.recovery
    if job.get("spec", {}).get("backoffLimitPerIndex") is not None:
        due = ladder.replacement_due(pods, d.now)
        delay, left = max(due.values(), key=lambda v: v[1]) if due else (0.0, 0.0)
        why = f"{len(due)} failed index{'es' if len(due) != 1 else ''} waiting"
    else:  # a Job made by an earlier operator: one back-off over all its failed pods
        failed = sum(1 for p in pods if p.get("status", {}).get("phase") == "Failed")
        active = sum(1 for p in pods if p.get("status", {}).get("phase") in ("Pending", "Running")
                     and not p["metadata"].get("deletionTimestamp"))
        full = failed and active < int(job.get("spec", {}).get("parallelism", d.rtj.nodes))
        delay = left = ladder.replacement_backoff(failed) if full else 0.0
        why = f"{failed} failed pods in this Job"
    if not delay:
        ledger.replacement_backoff_seconds = None
        return
    if ledger.replacement_backoff_seconds != delay:
        ledger.replacement_backoff_seconds = delay
        d.event("Normal", "ReplacementBackoff", f"The Job controller delays the replacement pod by {delay:.0f}s "
                                                f"({why}; due in {left:.0f}s)")
    limit = d.rtj.spec["resiliency"]["rendezvousTimeoutSeconds"] / 2
    # Short of capacity, a new gang would wait for the same node: it would only restart the survivors
    # (and the capacity clock with them).
    if left > limit and not d.short_of_capacity:
        next_attempt(d, "ReplacementBackoff", f"the Job controller would replace the pod only in {left:.0f}s, "
                                              "beyond half the rendezvous timeout")


def fail(d: Draft, reason: str, message: str) -> None:
    status = d.status
    if status.phase == "Failed":
        return
    status.phase = "Failed"
    status.completion_time = timestamp(d.now)
    status.last_failure_reason, status.last_failure_message = reason, message
    d.cond(FAILED, True, reason, message)
    d.cond(RESTARTING, False, reason, "no further restarts")
    d.event("Warning", "Failed", f"{reason}: {message}")
    d.act = True  # the next pass (terminal) suspends the Job


def job_nodes(job: dict[str, Any] | None, rtj: RTJ) -> int:
    """The training nodes of a Job (annotated; an earlier operator's Job: all its completions)."""
    if not job:
        return rtj.nodes
    try:
        return int((job["metadata"].get("annotations") or {})[api.ANNOTATION_NODES])
    except (KeyError, TypeError, ValueError):
        return int(job.get("spec", {}).get("completions", rtj.nodes))


def _ready(pod: dict[str, Any]) -> bool:
    conds = pod.get("status", {}).get("conditions") or []
    ready = next((c for c in conds if c.get("type") == "Ready"), None)
    return ready is None or ready.get("status") == "True"


def running_ready(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Pods that run and are Ready, not being deleted: what the job trains on."""
    return [p for p in pods if not p["metadata"].get("deletionTimestamp")
            and p.get("status", {}).get("phase") == "Running" and _ready(p)]


def derive_phase(d: Draft, pods: list[dict[str, Any]]) -> None:
    status, rtj, job, ledger = d.status, d.rtj, d.world.job, d.status.recovery
    ready = running_ready(pods)
    status.nodes_ready = len(ready)
    # What runs is what counts: after an invalid edit, the Job still has its old shape. Its training nodes
    # (the rest of its pods are hot spares: the job runs without them).
    desired = job_nodes(job, rtj)
    status.nodes_desired = desired
    status.standbys = max(0, len(ready) - desired)
    job_conds = ((job or {}).get("status") or {}).get("conditions") or []
    complete = any(c.get("type") in ("Complete", "SuccessCriteriaMet") and c.get("status") == "True"
                   for c in job_conds)
    d.cond(CREATED, job is not None or bool(status.start_time), "ChildrenCreated",
           f"Service {service_name(rtj)}, Job {job_name(rtj)} and PVC {pvc_name(rtj)}")
    d.cond(SUSPENDED, bool(rtj.spec["suspend"]), "Suspended" if rtj.spec["suspend"] else "NotSuspended",
           "spec.suspend is true" if rtj.spec["suspend"] else "")

    if status.phase == "Failed":
        d.cond(RUNNING, False, status.last_failure_reason or "Failed", "the job failed")
        d.cond(SUCCEEDED, False, "Failed", "")
        return
    d.cond(FAILED, False, "NotFailed", "")
    current = is_current(job, status.attempt)
    if complete and current:
        status.phase = "Succeeded"
        status.completion_time = status.completion_time or timestamp(d.now)
        d.cond(SUCCEEDED, True, "JobComplete", f"all {desired} nodes completed")
        d.cond(RUNNING, False, "Completed", "")
        d.cond(RESTARTING, False, "Completed", "")
        status.restart_started_time = None
        if d.old.get("phase") != "Succeeded":
            step = status.last_checkpoint_step
            d.event("Normal", "Succeeded", f"Training finished at checkpoint step "
                                           f"{step if step is not None else 'unknown'}")
        return
    d.cond(SUCCEEDED, False, "NotCompleted", "")

    gang_pending = bool(ledger.pending_gang_restart) or not current
    if gang_pending and status.start_time:
        status.restart_started_time = status.restart_started_time or timestamp(d.now)
    restarting_since = parse_time(status.restart_started_time)
    all_running = current and len(ready) >= desired
    if restarting_since and all_running and not gang_pending:
        seconds = round((d.now - restarting_since).total_seconds(), 3)
        status.last_recovery_seconds = seconds
        restarting = conditions.get_condition(status.conditions, RESTARTING) or {}
        tier = restarting.get("reason") if restarting.get("reason") in ladder.TIERS else ladder.REPLACE_POD
        progress.note_recovery(status, {"tier": tier, "reason": status.last_failure_reason,
                                        "message": status.last_failure_message, "seconds": seconds,
                                        "time": status.restart_started_time})
        status.restart_started_time = None
        # Recovered as far as pods go; the fault stays the cause of what follows until the replacement's
        # launcher could have joined the rendezvous (it gives up after rendezvousTimeoutSeconds): a rendezvous
        # that fails meanwhile is its consequence. Later failures are new faults.
        ledger.fault_settles_at = timestamp(d.now + datetime.timedelta(
            seconds=rtj.spec["resiliency"]["rendezvousTimeoutSeconds"])) if ledger.charged else ""
        restarting_since = None
        d.metrics.append(lambda t=tier, s=seconds: metrics.RECOVERY_SECONDS.labels(t).observe(s))
        d.event("Normal", "Recovered", f"All {desired} nodes running again after {seconds}s")
    held = bool((job or {}).get("spec", {}).get("suspend")) and current and not ledger.suspended_for_capacity
    if rtj.spec["suspend"]:
        status.phase = "Suspended"
        d.cond(RUNNING, False, "Suspended", "spec.suspend is true")
    elif held and queued(d):
        status.phase = "Queued"
        d.cond(RUNNING, False, "Queued", (conditions.get_condition(status.conditions, QUEUED) or {}).get(
            "message") or "waiting in its queue")
    elif held and not ledger.suspended_job:
        status.phase = "Queued"
        d.cond(RUNNING, False, "SuspendedExternally", f"Job {job_name(rtj)} was suspended by someone other than "
               "this operator (a queue?): it runs once that one resumes it; nothing is charged meanwhile")
    elif restarting_since:
        status.phase = "Restarting"
        d.busy = True
        reason = ledger.pending_gang_restart or "Restarting"
        d.cond(RUNNING, False, "Restarting", f"{len(ready)}/{desired} nodes ready ({reason})")
    elif all_running:
        status.phase = "Running"
        d.cond(RUNNING, True, "AllNodesRunning", f"{len(ready)}/{desired} nodes ready")
    else:
        status.phase = "Pending"
        d.busy = True
        d.cond(RUNNING, False, "WaitingForPods", f"{len(ready)}/{desired} nodes ready")
    if not restarting_since:
        d.cond(RESTARTING, False, "Stable", "")
    elif gang_pending and not conditions.is_true(status.conditions, RESTARTING):
        d.cond(RESTARTING, True, ladder.GANG_RESTART, ledger.pending_gang_restart or "")
    if status.phase != d.old.get("phase") and status.phase == "Running":
        d.event("Normal", "Running", f"All {desired} nodes running")


# --- after the actions ---------------------------------------------------------------------------
def settle(intent: Intent, results: list[Result], world: World, now: datetime.datetime | None = None) -> Intent:
    """Fold what the actions did into the intent, before its status is written: the events of effects
    done, a create the server rejected (InvalidSpec), a name held by an object we do not own
    (ChildConflict), the bookkeeping of a Job just created."""
    now = now or datetime.datetime.now(datetime.UTC)
    d = Draft(world, now)
    d.status, d.events, d.metrics = intent.status, [], intent.metrics
    done: list[Event] = []
    for r in results:
        a = r.action
        if r.ok and a.event is not None:
            done.append(Event(*a.event, done=True))
        if r.ok and a.verb == CREATE and a.kind == "Job":
            d.status.recovery.pending_gang_restart = ""
            d.status.start_time = d.status.start_time or timestamp(now)
        if r.rejected:
            rejected(d, a.kind, r.rejected)
            if world.job is None:
                d.status.phase = "Invalid"
                d.cond(CREATED, False, "InvalidSpec", "nothing was created: fix the spec")
        if r.conflict:
            message = (f"{r.conflict}: rename the job or remove that {a.kind}" if a.kind != "PersistentVolumeClaim" else
                       f"{r.conflict}: rename the job, remove the claim, or name it in spec.storage.existingClaim "
                       "to use it on purpose")
            was = conditions.get_condition(world.rtj.get("status", {}).get("conditions") or [], CREATED) or {}
            if was.get("reason") != "ChildConflict":
                d.event("Warning", "ChildConflict", message)
            d.cond(CREATED, False, "ChildConflict", message)
            d.status.phase = "Pending"
            d.cond(RUNNING, False, "ChildConflict", "nothing is created or changed until the conflict is resolved")
        if r.refused and a.uid not in d.status.recovery.evictions_refused:
            d.status.recovery.evictions_refused.append(a.uid)
            d.event("Warning", "EvictionRefused", f"Evicting pod {a.name} was refused: a PodDisruptionBudget does "
                                                  "not allow it now; trying again until it does")
    requeue = intent.requeue
    if any(not r.ok and (r.rejected or r.conflict) for r in results):
        requeue = Requeue(IDLE_SECONDS)
    return Intent(d.status, intent.actions, done + intent.events + d.events, requeue, d.metrics)
