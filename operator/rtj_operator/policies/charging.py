"""Charging: each new finding of the recovery ladder (ladder.plan) counted once against the right
budget (ladder.attribute), the restart it needs recorded, the budgets enforced; the Job's own verdict
and the Job controller's replacement back-off; carrying out what was charged (evict, force)."""

from __future__ import annotations

from .. import ladder, metrics, progress
from ..actions import EVICT, FAIL_POD, Action
from ..conditions import FAILED, RESTARTING, parse_time, timestamp
from ..draft import Draft
from ..status import Status
from .children import next_attempt
from .placement import count_node_failure, exclude


def act_on(d: Draft, findings: list[ladder.Finding]) -> None:
    ns = d.rtj.namespace
    for f in findings:
        if f.action == ladder.EVICT:
            d.do(Action(EVICT, "Pod", f.pod, ns, uid=f.uid,
                        event=("Warning", "EvictingPod", f"Evicting pod {f.pod}: {f.message}; the Job controller "
                                                         "replaces it on a healthy node")))
        elif f.action == ladder.FORCE:
            world = d.world
            pod = next(p for p in [*world.pods, *([world.coordinator] if world.coordinator else []),
                                   *world.old_pods, *world.old_coordinators] if p["metadata"]["name"] == f.pod)
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


def charge(d: Draft, plan: ladder.Plan, seen: set[str], short_of_capacity: bool, finished: bool) -> None:
    """Count each new finding once against the right budget (ladder.attribute) and decide the tier.
    `finished`: the Job's success rule is met (pods.success_met): what still runs is being stopped by the
    Job controller, and fails nothing."""
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
    # Losses within CORRELATED_LOSS_SECONDS of the recovery's first charge are one event.
    since = parse_time(status.restart_started_time)
    window_open = since is not None and (d.now - since).total_seconds() <= ladder.CORRELATED_LOSS_SECONDS
    charges, fault = ladder.attribute(plan.findings, fault, {**plan.unhealthy, **plan.lost_nodes},
                                      suspended=suspended, capacity=short_of_capacity,
                                      stopped_by_suspend=ladder.stopped_by_suspend(d.world.pods, job),
                                      lost=frozenset(plan.lost_nodes), window_open=window_open,
                                      finished=finished)
    ledger.charged = fault
    gang: tuple[str, str] | None = None
    for c in charges:
        if c.hold:
            d.wait(c.hold)  # looked at again until its cause shows or the wait is over
            continue
        seen.add(c.finding.uid)
        d.act = d.act or (bool(c.finding.action) and not suspended)
        rule = c.finding.consequence
        if rule.excludes_node:
            exclude(d, c.finding.node, c.finding.message)
        elif rule.counts_node_failure and c.payer == ladder.JOB and c.finding.node:
            count_node_failure(d, c.finding.node, c.finding.reason)
        if c.why == ladder.EXCUSED:
            cause = c.cause or f"a consequence of the fault being recovered ({status.last_failure_reason})"
            d.event("Warning", "NotCharged", f"{c.finding.reason}: {c.message}; {cause}")
        if (rule.fails_if_repeated and c.payer == ladder.JOB and c.finding.detail
                and status.last_failure_reason == c.finding.reason
                and c.finding.detail in (status.last_failure_message or "")):
            # The same failure as the last one charged, from another pod (or this index's next): the
            # job's own code, whatever node it runs on. Failed now, not after every budget is spent.
            fail(d, c.finding.reason, f"{c.message} (the second pod to fail so: not restarted again)")
            return
        if c.payer != ladder.NOBODY:
            record_restart(d, c.tier or ladder.REPLACE_POD, c.finding.reason, c.message,
                           platform=c.payer == ladder.PLATFORM, counted=not c.correlated)
        if c.tier == ladder.GANG_RESTART and not gang:
            gang = (c.finding.reason, rule.gang_reason_excused if c.payer == ladder.NOBODY else rule.gang_reason)
    permanent = plan.permanent
    if permanent is not None and not suspended and not finished:
        fail(d, permanent.reason, permanent.message)
        return
    if enforce_budgets(d):
        return
    if gang:
        # Pods of this attempt only: once the attempt moves on, the old gang's exits are not listed.
        next_attempt(d, *gang)


def record_restart(d: Draft, tier: str, reason: str, message: str, platform: bool, counted: bool = True) -> None:
    """Bookkeeping of one restart: counters, progress, condition, metric and event. `counted`: against its
    budget (a node lost in the same event as one charged already is a restart, not another disruption)."""
    status, budget = d.status, d.rtj.spec["restartBudget"]
    status.restarts_by_tier[tier] = status.restarts_by_tier.get(tier, 0) + 1
    status.restarts = sum(status.restarts_by_tier.values())
    progress.count_restart(status, tier, reason, ladder.PLATFORM if platform else ladder.JOB)
    status.last_failure_reason, status.last_failure_message = reason, message
    if not status.restart_started_time:  # the first charge of this recovery: where training was
        status.recovery.step_at_fault = (status.progress or {}).get("step")
    status.restart_started_time = status.restart_started_time or timestamp(d.now)
    d.metrics.append(lambda t=tier, r=reason: metrics.RESTARTS.labels(t, r).inc())
    d.metrics.append(lambda t=tier, c=ladder.PLATFORM if platform else ladder.JOB:
                     metrics.RESTARTS_CHARGED.labels(t, c).inc())
    if platform:
        status.disruptions += 1 if counted else 0
    else:
        status.job_restarts += 1
        track_progress(status)
    if counted and budget["windowSeconds"]:
        counter = "disruptions" if platform else "jobRestarts"
        status.recovery.charge_times[counter] = [*status.recovery.charge_times.get(counter, []), timestamp(d.now)]
    spent = budget_counts(d)
    within = f" in the last {budget['windowSeconds']} s" if budget["windowSeconds"] else ""
    d.cond(RESTARTING, True, tier, message)
    d.event("Warning", tier, f"{reason}: {message} (restart {status.restarts}, job failures "
                             f"{spent['jobRestarts']}/{budget['maxRestarts']}, disruptions "
                             f"{spent['disruptions']}/{budget['maxDisruptions']}{within})")


def track_progress(status: Status) -> None:
    step = int(status.last_checkpoint_step or 0)
    previous = status.step_at_last_restart
    if previous is None or step > int(previous):
        status.restarts_without_progress = 1
    else:
        status.restarts_without_progress += 1
    status.step_at_last_restart = step


def budget_counts(d: Draft) -> dict[str, int]:
    """What counts against each budget now (ladder.budget_counts); the windowed charges' times are pruned
    to what still counts, so the list in status stays bounded."""
    status, budget = d.status, d.rtj.spec["restartBudget"]
    times = status.recovery.charge_times
    for b in ladder.BUDGETS:
        if b.counter in times:
            kept = ladder.charges_in_window(times[b.counter], d.now, budget["windowSeconds"],
                                            int(budget[b.limit]) + 1) if budget["windowSeconds"] else []
            if kept:
                times[b.counter] = kept
            else:
                del times[b.counter]
    lifetime = {"jobRestarts": status.job_restarts, "disruptions": status.disruptions,
                "restartsWithoutProgress": status.restarts_without_progress}
    return ladder.budget_counts(lifetime, times, budget, d.now)


def enforce_budgets(d: Draft) -> bool:
    status = d.status
    spent = ladder.over_budget(budget_counts(d), d.rtj.spec["restartBudget"], status.last_failure_message or "",
                               int(status.step_at_last_restart or 0))
    if spent is not None:
        fail(d, *spent)
    return status.phase == "Failed"


def judge_job(d: Draft, short_of_capacity: bool, finished: bool) -> None:
    """The Job's own verdict (FailureTarget comes first, Failed once every pod is gone), and the Job
    controller's replacement back-off, which a new attempt resets (and a `finished` Job has none of)."""
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
    if not finished:
        replacement_backoff(d, short_of_capacity)


def replacement_backoff(d: Draft, short_of_capacity: bool) -> None:
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
    if left > limit and not short_of_capacity:
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
