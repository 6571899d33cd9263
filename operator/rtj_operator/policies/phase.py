"""The RTJ's phase and conditions, derived from what runs; live progress; the wait conditions
(WaitingForFencing, WaitingForPodTermination, WaitingForCapacity)."""

from __future__ import annotations

import datetime
from typing import Any

from rtj_worker.launch import stop_bounds
from rtj_worker.report import FINISHED, STARTED, STARTED_SECONDS, TRAINING

from .. import conditions, ladder, metrics, progress
from ..builders import pvc_name, service_name
from ..conditions import (
    CREATED,
    FAILED,
    QUEUED,
    RESTARTING,
    RUNNING,
    SUCCEEDED,
    SUSPENDED,
    parse_time,
    timestamp,
)
from ..draft import Draft
from . import grace, interval
from .kueue import queued
from .pods import is_current, is_older, job_nodes, ready_since, running_ready, suspended_by_operator

TERMINAL = ("Succeeded", "Failed")

# Conditions of waits on the platform (report_waits).
WAITING_FOR_FENCING = "WaitingForFencing"
WAITING_FOR_POD_TERMINATION = "WaitingForPodTermination"
WAITING_FOR_CAPACITY = "WaitingForCapacity"
# True while the health brake holds (ladder._health_brake): evictions for node health wait for a person.
NODE_HEALTH_BRAKE = "NodeHealthBrake"

# Running waits for the ranks (ranks_started): what a pod's report says once they started (rtj_worker.report),
# and how long Ready pods may go without any report before their readiness is taken as all there is (a
# worker writes its first report within about a second of its start).
RANKS_STARTING = "RanksStarting"
STARTED_STATES = frozenset({TRAINING, STARTED, FINISHED})
REPORT_GRACE_SECONDS = 5.0

# Wait reasons that bound nothing (the job trains meanwhile): their time is not the gang's wait.
UNTIMED_WAITS = frozenset({"StandbyUnschedulable"})


def derive_phase(d: Draft, pods: list[dict[str, Any]], finished: bool) -> None:
    """Phase and conditions from what runs. `finished`: the Job's success rule is met (pods.success_met),
    maybe before the Job says so."""
    status, rtj, job, ledger = d.status, d.rtj, d.world.job, d.status.recovery
    ready = running_ready(pods)
    # What runs is what counts: after an invalid edit, the Job still has its old shape. Its training nodes
    # (the rest of its pods are hot spares: the job runs without them). Ready and desired count the same
    # thing (`kubectl get rtj` shows them side by side); ready spares are counted apart.
    desired = job_nodes(job, rtj)
    status.nodes_desired = desired
    status.nodes_ready = min(len(ready), desired)
    status.standbys = max(0, len(ready) - desired)
    d.cond(CREATED, job is not None or bool(status.start_time), "ChildrenCreated",
           f"Service {service_name(rtj)}, Job {d.job_name} and PVC {pvc_name(rtj)}")
    d.cond(SUSPENDED, bool(rtj.spec["suspend"]), "Suspended" if rtj.spec["suspend"] else "NotSuspended",
           "spec.suspend is true" if rtj.spec["suspend"] else "")

    if status.phase == "Failed":
        d.cond(RUNNING, False, status.last_failure_reason or "Failed", "the job failed")
        d.cond(SUCCEEDED, False, "Failed", "")
        return
    d.cond(FAILED, False, "NotFailed", "")
    current = is_current(job, status.attempt)
    if finished:  # of the current attempt's Job (observe)
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
    # Whose suspend it is, as the pass found it: a resume pass has cleared the ledger already, and a Job an
    # earlier operator suspended carries no mark (it would read as someone else's for that one pass).
    elif held and not suspended_by_operator(job, ledger.suspended_job or bool(
            (d.old.get("recovery") or {}).get("suspendedJob"))):
        status.phase = "Queued"
        d.cond(RUNNING, False, "SuspendedExternally", f"Job {d.job_name} was suspended by someone other than "
               "this operator (a queue?): it runs once that one resumes it; nothing is charged meanwhile")
    elif restarting_since:
        status.phase = "Restarting"
        d.busy = True
        reason = ledger.pending_gang_restart or "Restarting"
        d.cond(RUNNING, False, "Restarting", f"{len(ready)}/{desired} nodes ready ({reason})")
    elif all_running and not ranks_started(d, ready):
        status.phase = "Pending"
        d.busy = True
        d.cond(RUNNING, False, RANKS_STARTING, f"{len(ready)}/{desired} nodes ready; no rank has started training "
               f"yet: no pod reports a step, or its ranks up {STARTED_SECONDS:g} s (the rendezvous, imports, "
               "the checkpoint load; a command that fails at start ends CrashLoop)")
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


def ranks_started(d: Draft, ready: list[dict[str, Any]]) -> bool:
    """Whether the current gang's ranks have started training, so that it may show Running: a pod of it
    reported Training (a step) or Started (its worker group up STARTED_SECONDS, for a script that reports no
    steps; rtj_worker.report). Pods that have been Ready REPORT_GRACE_SECONDS without any report cannot
    report (no worker in them, or their status patches refused): their readiness is all there is. Once seen,
    the attempt stays started (status.recovery.trainedAttempt): a recovery within the gang shows Restarting,
    then Running with its pods, as before."""
    ledger, attempt = d.status.recovery, d.status.attempt
    if ledger.trained_attempt == attempt:
        return True
    found = [r for r in map(progress.pod_report, ready) if r is not None]
    ready_for = min((d.now - since).total_seconds() for since in map(ready_since, ready))
    if any(r.state in STARTED_STATES for r in found) or (not found and ready_for >= REPORT_GRACE_SECONDS):
        ledger.trained_attempt = attempt
        return True
    if not found:
        d.wait(max(0.5, REPORT_GRACE_SECONDS - ready_for))
    return False


def publish_progress(d: Draft, found: list[progress.Report], folded: progress.Folded) -> None:
    """Live progress, goodput and the in-job recoveries' events, once the phase is known."""
    status = d.status
    progress.rolled_back(status, found)
    ended = status.phase in TERMINAL and d.old.get("phase") != status.phase
    due = progress.update_progress(status, found, d.now, folded.changed, force=ended)
    progress.update_goodput(status, found, d.now)
    stalls = [r.save_stall for r in found if r.save_stall is not None]
    interval.update(d, max(stalls) if stalls else None)
    grace.update(d)
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
    warn_stop_grace(d)


def warn_stop_grace(d: Draft) -> None:
    """StopGraceTooShort, once each time the newest checkpoint's write time (and a step) stops fitting in
    what a stop leaves the running gang's ranks to save (launch.stop_bounds of its grace period, policies/grace):
    a drain, spot reclaim or suspend would then lose every step since the last committed checkpoint."""
    seconds = grace.effective(d.rtj, d.world.job)
    budget = stop_bounds(seconds)[0]
    if grace.needed_seconds(d.status.progress) > budget >= grace.needed_seconds(d.old.get("progress")):
        remedy = ("raise spec.resiliency.terminationGracePeriodSeconds or write faster" if grace.configured(d.rtj)
                  else f"the next gang gets {grace.grace_for(grace.needed_seconds(d.status.progress))} s "
                       "(measured: spec.resiliency.terminationGracePeriodSeconds is unset)")
        d.event("Warning", "StopGraceTooShort",
                f"the newest checkpoint took {d.status.progress['checkpointWriteSeconds']:g} s to write, and a stop "
                f"leaves the ranks {budget:g} s to save (grace period {seconds} s): a drain, a spot reclaim or a "
                f"suspend would lose the steps since the last checkpoint; {remedy} (a spot reclaim gives 120 s)")


FENCING_DO = ("deleted (as the cloud node lifecycle controller does once its instance is gone), tainted "
              "node.kubernetes.io/out-of-service, or (with --check-ec2) its EC2 instance stopped or terminated")
FENCING_HOW = f"its index is replaced once the node is fenced: {FENCING_DO}"


def report_waits(d: Draft, plan: ladder.Plan, old: ladder.Plan | None = None) -> None:
    """Waits on the platform that outlast their timeout, each a condition (and an event when it begins).
    `old`: the plan of older gangs' pods still going away (World.old_pods)."""
    job = d.world.job
    old_gang = is_older(job, d.status.attempt)
    unfenced_old = {**(plan.unfenced if old_gang else {}), **(old.unfenced if old is not None else {})}
    if plan.brake:
        waiting(d, WAITING_FOR_FENCING, "MassNodeLoss", f"{plan.brake}: likely a partition or a control-plane "
                "problem, not node failures; nothing is evicted or charged for those nodes until they come back or "
                "are fenced")
    elif plan.unfenced and not old_gang:
        pods = "; ".join(f"pod {pod} on node {node} ({why})" for node, (pod, why, _) in sorted(plan.unfenced.items()))
        waiting(d, WAITING_FOR_FENCING, "NodeNotFenced", f"{pods}: its ranks may still run, so no second pod of "
                f"its index is started; {FENCING_HOW}")
    elif unfenced_old:
        # A gang restart: the old gang's pod on an unfenced node never confirms its end, so it is not waited
        # for (ensure_job); the new gang runs under its own names beside it (issue 29.3).
        pods = "; ".join(f"pod {pod} on node {node} ({why})" for node, (pod, why, _) in sorted(unfenced_old.items()))
        waiting(d, WAITING_FOR_FENCING, "OldGangNotFenced", f"{pods}, of an earlier gang attempt: its ranks may "
                f"still run, so it is deleted only once the node is fenced ({FENCING_DO}); meanwhile gang attempt "
                f"{d.status.attempt} runs under its own Job, coordinator and hostnames, out of their reach, and a "
                "checkpoint commit of theirs is refused (the checkpoint directory's attempt fence)")
    elif plan.in_grace:
        pods = "; ".join(f"pod {pod} on node {node} ({why} for {seconds:.0f}s)"
                         for node, (pod, why, seconds) in sorted(plan.in_grace.items()))
        grace = d.rtj.spec["restartBudget"]["nodeLossGraceSeconds"]
        waiting(d, WAITING_FOR_FENCING, "NodeLost", f"{pods}: its ranks may still run (a kubelet or network blip), "
                f"so it is left alone for nodeLossGraceSeconds ({grace}s) or until the node comes back, and failed at "
                f"once if the node is fenced; {FENCING_HOW}")
    else:
        waiting(d, WAITING_FOR_FENCING, "", "")
    if plan.health_brake:
        waiting(d, NODE_HEALTH_BRAKE, "MassNodeUnhealthy", f"{plan.health_brake}: more likely the health agent or "
                "something the nodes share than that many bad GPUs; no pod is evicted for its node's health "
                "until fewer nodes are reported, and the job keeps training where it can; check the agent")
    else:
        waiting(d, NODE_HEALTH_BRAKE, "", "")
    if plan.stuck:
        pods = "; ".join(f"pod {pod} on node {node}" for pod, (node, _) in sorted(plan.stuck.items()))
        waiting(d, WAITING_FOR_POD_TERMINATION, "PodStuckTerminating", f"{pods}: terminating past its grace period "
                "and terminatingTimeoutSeconds on a node that is not lost; its container does not stop (a process in "
                "uninterruptible sleep?). Its index waits until it ends; no other pod of the gang lands on that node; "
                "nothing is forced unless the node is fenced (deleted or tainted node.kubernetes.io/out-of-service)")
    else:
        waiting(d, WAITING_FOR_POD_TERMINATION, "", "")


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
    # The condition may stay True while the wait its clock bounds (wait_for_capacity) begins now: a
    # standby that lacked a node for a day must not time the gang out at its first wait.
    timed_now = bool(old and old.get("status") == "True" and old.get("reason") in UNTIMED_WAITS
                     and reason not in UNTIMED_WAITS)
    d.cond(type_, True, reason, message, restart=timed_now)
    d.busy = True
