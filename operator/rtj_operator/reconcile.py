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

This module holds the order of the steps; each policy lives in policies/ (children, kueue, placement,
charging, phase, and predicates on pods) and writes into the pass's Draft (draft.py).
"""

from __future__ import annotations

import datetime

from . import conditions, ladder, progress
from .actions import CREATE, PATCH, Action, Result
from .conditions import CREATED, INVALID_SPEC, RUNNING, SUCCEEDED, timestamp
from .draft import IDLE_SECONDS, Config, Draft, Event, Intent, Requeue
from .policies.charging import act_on, charge, fail, judge_job
from .policies.children import (
    child_conflict,
    ensure_capacity_probes,
    ensure_coordinator,
    ensure_job,
    ensure_network_policy,
    ensure_pvc,
    ensure_service,
    rejected,
    stop_coordinator,
    template_rejected,
)
from .policies.footprint import warn_gpu_memory
from .policies.kueue import activate_workload, ensure_queue, queued
from .policies.phase import TERMINAL, WAITING_FOR_CAPACITY, derive_phase, publish_progress, report_waits
from .policies.placement import awaiting_coordinator, expire_exclusions, release_gated, wait_for_capacity
from .policies.pods import is_current, success_met
from .spec import semantic_errors
from .world import World, owned_by


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
    warn_gpu_memory(d)
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
    ensure_network_policy(d)
    ensure_pvc(d)
    if template_rejected(d):
        return without_changes(d)
    ensure_coordinator(d)
    ensure_capacity_probes(d)  # before the Job: a resumed gang's pods need the nodes the probes hold
    ensure_job(d)
    ensure_queue(d)
    observe(d, converge=True)
    return d.intent()


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


def terminal(d: Draft) -> Intent:
    job = d.world.job
    # Idempotent: a Failed job never holds GPUs (suspending keeps the Job for inspection). With a queue,
    # Kueue would un-suspend an admitted Job: its Workload is deactivated instead (Kueue then evicts it,
    # suspends the Job and releases the quota).
    if d.old.get("phase") == "Failed" and job is not None and owned_by(job, d.rtj.uid):
        if queued(d):
            activate_workload(d, False, "the job failed")
        elif not job["spec"].get("suspend"):
            d.actions.append(Action(PATCH, "Job", job["metadata"]["name"], d.rtj.namespace,
                                    {"spec": {"suspend": True}}))
    for coordinator in (d.world.coordinator, *d.world.old_coordinators):
        stop_coordinator(d, coordinator)
    ensure_capacity_probes(d)  # none: a job that ended holds no node
    return d.intent()


JOB_CONTROLLER = "kubernetes.io/job-controller"
MULTIKUEUE = "kueue.x-k8s.io/multikueue"


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
    # Pods that ended without a final report of their own (a lost node's, failed by the operator): their
    # last live report is all there will be.
    ended = frozenset(p["metadata"].get("uid", p["metadata"]["name"]) for p in pods
                      if (p.get("status") or {}).get("phase") in ("Failed", "Succeeded")
                      and not isinstance(ladder.termination_report(p).get("progress"), dict))
    folded = progress.fold(status, found, {p["metadata"].get("uid", p["metadata"]["name"]) for p in pods}, d.now,
                           ended)

    ledger = status.recovery
    seen = set(ledger.seen_pods)
    plan = ladder.plan(pods, world.nodes, seen, d.now, d.timing, world.cloud_fencing, world.zones, world.coordinator,
                       d.config.node_health)
    # The older gangs' pods still going away: nothing to charge, only pods on fenced nodes to force (as
    # PodGC would), since a pod on a lost node never confirms its deletion.
    stale = [*world.old_pods, *world.old_coordinators]
    old = None
    if stale:
        old = ladder.plan(stale, world.old_nodes, set(), d.now, d.timing, world.cloud_fencing,
                          rules=d.config.node_health)
        if converge:
            act_on(d, [a for a in old.actions if a.action == ladder.FORCE])
    if plan.recheck is not None:
        d.wait(max(0.5, plan.recheck))
    report_waits(d, plan, old)
    current = is_current(job, status.attempt)
    finished = current and success_met(job, pods)
    short_of_capacity = False
    if converge and current:
        capacity = wait_for_capacity(d, plan)
        short_of_capacity = capacity.short
        if capacity.fails:
            fail(d, *capacity.fails)
    # A Job being deleted (a gang restart, or by hand) takes its pods along: not failures to charge.
    if converge and current:
        # Act only on what an earlier pass already charged: the charge is in status first.
        act_on(d, [a for a in plan.actions if a.uid in seen])
        charge(d, plan, seen, short_of_capacity, finished)
        judge_job(d, short_of_capacity, finished)
        waits, recheck = awaiting_coordinator(d)
        if recheck is not None:
            d.wait(recheck)
        if not waits:
            expire_exclusions(d)
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
    derive_phase(d, [p for p in pods if p["metadata"]["name"] not in troubled], finished)
    publish_progress(d, found, folded)


def managed_elsewhere(d: Draft, managed_by: str) -> None:
    """A Job another controller runs (spec.managedBy): its pods are not here, so nothing is waited on or
    charged; the RTJ mirrors the Job's own status. Except MultiKueue's: it copies the Job to a worker
    cluster without the Service, coordinator and claim its pods rendezvous and checkpoint through, so
    such a gang could never form there; refused (Failed, and terminal() deactivates its Workload, which
    withdraws it from the worker cluster) until that is supported."""
    job, status = d.world.job or {}, d.status
    if managed_by == MULTIKUEUE:
        fail(d, "MultiKueueUnsupported", f"Job {d.job_name} is dispatched by MultiKueue (spec.managedBy "
             f"{managed_by}): its pods would run in a worker cluster without the Service, coordinator and "
             "checkpoint claim they need, which MultiKueue does not copy; use a queue whose ClusterQueue has no "
             "MultiKueue admission check")
        return
    job_status = job.get("status") or {}
    conds = {c.get("type"): c for c in job_status.get("conditions") or [] if c.get("status") == "True"}
    message = (f"Job {d.job_name} is managed by {managed_by}: its pods run elsewhere; this RTJ shows the "
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


def settle(intent: Intent, results: list[Result], world: World, now: datetime.datetime) -> Intent:
    """Fold what the actions did into the intent, before its status is written: the events of effects
    done, a create the server rejected (InvalidSpec), a name held by an object we do not own
    (ChildConflict), the bookkeeping of a Job just created."""
    d = Draft(world, now)
    d.status, d.events, d.metrics = intent.status, [], intent.metrics
    if conditions.is_true(d.status.conditions, conditions.RECONCILE_ERROR):
        # Set by the runtime after passes the API server kept refusing (runtime.Runtime._rejected): this one
        # carried out its actions, so its status write (the pass's one) says it is over.
        d.cond(conditions.RECONCILE_ERROR, False, "Resolved", "the operator's last pass went through")
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
        if r.failed:
            # A capacity probe the server refused (a full ResourceQuota, its PriorityClass missing): said where
            # the wait is, made again at the next pass.
            cond = conditions.get_condition(d.status.conditions, WAITING_FOR_CAPACITY) or {}
            if cond.get("status") == "True" and "could not be made" not in cond.get("message", ""):
                d.cond(WAITING_FOR_CAPACITY, True, cond["reason"], f"{cond.get('message', '')}; capacity probe "
                       f"{a.name} could not be made: {r.failed[:1024]}")
        if r.refused and a.uid not in d.status.recovery.evictions_refused:
            d.status.recovery.evictions_refused.append(a.uid)
            d.event("Warning", "EvictionRefused", f"Evicting pod {a.name} was refused: a PodDisruptionBudget does "
                                                  "not allow it now; trying again until it does")
    requeue = intent.requeue
    if any(not r.ok and (r.rejected or r.conflict) for r in results):
        requeue = Requeue(IDLE_SECONDS)
    return Intent(d.status, intent.actions, done + intent.events + d.events, requeue, d.metrics)
