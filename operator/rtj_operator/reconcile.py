"""One level-triggered pass: read the RTJ's world, converge its children, compute its status.

`reconcile()` is idempotent: running it twice on the same world changes nothing the second time.
Everything it must remember between passes (budgets, charged pods, the gang attempt) lives in the
RTJ's status, so an operator restart or a deleted child cannot reset it.
"""

from __future__ import annotations

import copy
import datetime
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

from . import api, conditions, metrics, recovery
from .builders import build_job, build_pvc, build_service, job_name, pvc_name, service_name
from .builders.job import template_hash
from .builders.names import selector_labels
from .conditions import CREATED, FAILED, INVALID_SPEC, RESTARTING, RUNNING, SUCCEEDED, SUSPENDED, parse_time, timestamp
from .kube import Kube, KubeError
from .spec import RTJ, semantic_errors

# Seconds until the next pass while something is in flight; a quiet job is checked less often.
BUSY_REQUEUE = 2.0
IDLE_REQUEUE = 30.0
TERMINAL = ("Succeeded", "Failed")
# Service fields the operator owns (the API server defaults the rest, e.g. clusterIPs).
SERVICE_FIELDS = ("ports", "selector", "publishNotReadyAddresses")

# An optional pre-flight check of the storage (see fsx.py): returns (ok, reason, message).
StorageCheck = Callable[[RTJ], tuple[bool, str, str]]


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str


@dataclass
class Outcome:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    requeue: float = IDLE_REQUEUE


class _Pass:
    """State of one pass; methods are the steps of `reconcile()`."""

    def __init__(self, kube: Kube, body: dict[str, Any], now: datetime.datetime):
        self.kube, self.body, self.now = kube, body, now
        self.rtj = RTJ.from_body(body)
        self.old = body.get("status") or {}
        self.status: dict[str, Any] = copy.deepcopy(self.old)
        self.status.pop("kopf", None)  # kopf's own bookkeeping is not ours to write
        self.events: list[Event] = []
        self.busy = False

    # --- helpers -----------------------------------------------------------------------------
    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def cond(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        self.status["conditions"] = conditions.set_condition(
            self.status.get("conditions") or [], type_, status, reason, message, self.rtj.generation, self.now)

    def create(self, obj: dict[str, Any], adopt: bool = True) -> None:
        if adopt:
            # The owner is explicit: reconcile also runs outside kopf handlers (demo, bench).
            kopf.adopt(obj, owner=self.rtj.owner)
        try:
            self.kube.create(obj)
        except KubeError as exc:
            if exc.status != 409:  # someone (a previous pass) was faster: fine
                raise
        self.event("Normal", "Created", f"Created {obj['kind']} {obj['metadata']['name']}")

    # --- steps -------------------------------------------------------------------------------
    def run(self, storage_check: StorageCheck | None) -> Outcome:
        rtj = self.rtj
        self.status.setdefault("attempt", 1)
        for key in ("restarts", "jobRestarts", "disruptions", "restartsWithoutProgress"):
            self.status.setdefault(key, 0)
        self.status.setdefault("restartsByTier", dict.fromkeys(recovery.TIERS, 0))
        self.status["nodesDesired"] = rtj.nodes

        if self.old.get("phase") in TERMINAL:
            return self.finish_terminal()

        errors = semantic_errors(rtj)
        job = self.kube.get("Job", job_name(rtj), rtj.namespace)
        if errors:
            # Nothing is created or changed; whatever already runs keeps running.
            message = "; ".join(errors)
            if self.old.get("observedGeneration") != rtj.generation or not conditions.is_true(
                    self.status.get("conditions") or [], INVALID_SPEC):
                self.event("Warning", "InvalidSpec", message)
            self.cond(INVALID_SPEC, True, "InvalidSpec", message)
            if job is None:
                self.status["phase"] = "Invalid"
                self.cond(CREATED, False, "InvalidSpec", "nothing was created: fix the spec")
                return self.outcome()
            self.observe(job, converge=False)
            return self.outcome()
        self.cond(INVALID_SPEC, False, "Valid", "")

        if storage_check is not None and job is None:
            ok, reason, message = storage_check(rtj)
            self.cond(conditions.STORAGE_READY, ok, reason, message)
            if not ok:
                if self.old.get("phase") != "Pending" or not self._cond_reason(conditions.STORAGE_READY, reason):
                    self.event("Warning", reason, message)
                self.status["phase"] = "Pending"
                self.cond(CREATED, False, reason, "waiting for storage: " + message)
                return self.outcome(requeue=IDLE_REQUEUE)

        self.ensure_service()
        self.ensure_pvc()
        job = self.ensure_job(job)
        self.observe(job, converge=True)
        return self.outcome()

    def _cond_reason(self, type_: str, reason: str) -> bool:
        old = conditions.get_condition(self.old.get("conditions") or [], type_)
        return bool(old and old.get("reason") == reason)

    def ensure_service(self) -> None:
        desired = build_service(self.rtj)
        have = self.kube.get("Service", service_name(self.rtj), self.rtj.namespace)
        if have is None:
            self.create(desired)
            return
        drift = {k: v for k, v in desired["spec"].items() if k in SERVICE_FIELDS and have["spec"].get(k) != v}
        if drift:
            self.kube.patch("Service", service_name(self.rtj), self.rtj.namespace, {"spec": drift})
            self.event("Normal", "Updated", f"Updated Service {service_name(self.rtj)}: {', '.join(sorted(drift))}")

    def ensure_pvc(self) -> None:
        desired = build_pvc(self.rtj)
        if desired is None:
            return
        if self.kube.get("PersistentVolumeClaim", pvc_name(self.rtj), self.rtj.namespace) is None:
            # Retain: no owner reference, so deleting the job keeps the checkpoints.
            self.create(desired, adopt=self.rtj.spec["storage"]["retention"] == "Delete")

    def ensure_job(self, job: dict[str, Any] | None) -> dict[str, Any] | None:
        rtj, attempt = self.rtj, int(self.status["attempt"])
        pending = (self.status.get("recovery") or {}).get("pendingGangRestart")
        if job is not None and job["metadata"].get("deletionTimestamp"):
            self.busy = True  # the old gang is still going away
            return None
        if job is None:
            if pending:
                attempt += 1
                self.status["attempt"] = attempt
                self.status["recovery"] = {**(self.status.get("recovery") or {}), "pendingGangRestart": None}
            desired = build_job(rtj, attempt)
            self.create(desired)
            self.busy = True
            self.status.setdefault("startTime", timestamp(self.now))
            return desired
        current_attempt = int((job["metadata"].get("annotations") or {}).get(api.LABEL_ATTEMPT, attempt))
        desired = build_job(rtj, current_attempt)
        have_hash = (job["metadata"].get("annotations") or {}).get(api.ANNOTATION_SPEC_HASH)
        if pending or have_hash != template_hash(desired):
            why = pending or "the pod template changed"
            if not pending:
                # A spec change is the user's decision: a new gang, no budget charged.
                self.status["recovery"] = {**(self.status.get("recovery") or {}),
                                           "pendingGangRestart": "SpecChanged"}
            self.kube.delete("Job", job_name(rtj), rtj.namespace, propagation="Foreground")
            self.event("Normal", "RecreatingJob", f"Deleting Job {job_name(rtj)} (attempt {current_attempt}): "
                                                  f"{why}")
            self.busy = True
            return None
        if bool(job["spec"].get("suspend")) != bool(rtj.spec["suspend"]):
            self.kube.patch("Job", job_name(rtj), rtj.namespace, {"spec": {"suspend": rtj.spec["suspend"]}})
            job["spec"]["suspend"] = rtj.spec["suspend"]
            self.event("Normal", "Suspended" if rtj.spec["suspend"] else "Resumed",
                       f"Job {job_name(rtj)} {'suspended' if rtj.spec['suspend'] else 'resumed'}")
        return job

    def observe(self, job: dict[str, Any] | None, converge: bool) -> None:
        """Read pods and nodes, run the recovery ladder, and derive phase and conditions."""
        rtj, status = self.rtj, self.status
        attempt = str(status["attempt"])
        pods = [p for p in self.kube.list("Pod", rtj.namespace, selector_labels(rtj))
                if (p["metadata"].get("labels") or {}).get(api.LABEL_ATTEMPT, attempt) == attempt]
        nodes = self.nodes_of(pods)

        step = recovery.checkpoint_step(pods)
        if step is not None and step > int(status.get("lastCheckpointStep", -1)):
            status["lastCheckpointStep"] = step
            status["lastCheckpointTime"] = timestamp(self.now)
        metrics.record_checkpoint(rtj.namespace, rtj.name, parse_time(status.get("lastCheckpointTime")),
                                  self.now)

        seen = set((status.get("recovery") or {}).get("seenPods") or [])
        budget = rtj.spec["restartBudget"]
        plan = recovery.plan(pods, nodes, seen, self.now,
                             datetime.timedelta(seconds=budget["terminatingTimeoutSeconds"]))
        if converge:
            self.act(plan)
            self.charge(plan, seen)
        # Only pods still listed can turn up again, so the charged set is bounded by the pods themselves.
        listed = {p["metadata"].get("uid", p["metadata"]["name"]) for p in pods}
        status["recovery"] = {**(status.get("recovery") or {}), "seenPods": sorted(seen & listed)}

        job_status = (job or {}).get("status") or {}
        job_conds = job_status.get("conditions") or []
        if converge and status.get("phase") not in TERMINAL:
            self.judge_job(job_conds)
        # Pods found in trouble this pass are on their way out, whatever their phase says.
        troubled = {f.pod for f in plan.findings} | set(plan.deletes) | set(plan.force_deletes)
        self.derive_phase(job, [p for p in pods if p["metadata"]["name"] not in troubled])

    def nodes_of(self, pods: list[dict[str, Any]]) -> dict[str, dict[str, Any] | None]:
        names = {p.get("spec", {}).get("nodeName") for p in pods} - {None, ""}
        return {name: self.kube.get("Node", name) for name in sorted(names)}

    def act(self, plan: recovery.Plan) -> None:
        ns = self.rtj.namespace
        for pod in plan.deletes:
            if self.kube.delete("Pod", pod, ns):
                self.event("Warning", "ReplacingPod", f"Deleting pod {pod}: its node is lost; the Job "
                                                      f"controller replaces it on a healthy node")
        for pod in plan.force_deletes:
            if self.kube.delete("Pod", pod, ns, grace_seconds=0):
                self.event("Warning", "ForceDeletedPod", f"Force-deleted pod {pod} stuck Terminating on a "
                                                         f"lost node")
        if plan.deletes or plan.force_deletes:
            self.busy = True

    def charge(self, plan: recovery.Plan, seen: set[str]) -> None:
        """Count each new finding once against the right budget and decide the next tier."""
        gang_charged = False
        for f in plan.findings:
            seen.add(f.uid)
            if f.kind == recovery.PERMANENT:
                continue
            if f.kind == recovery.RENDEZVOUS:
                if gang_charged:
                    continue  # every pod of the gang reports the same failed rendezvous
                gang_charged = True
            tier = recovery.GANG_RESTART if f.kind == recovery.RENDEZVOUS else recovery.REPLACE_POD
            self.record_restart(tier, f.reason, f.message, platform=f.kind == recovery.PLATFORM)
        if plan.fail_reason:
            self.fail(plan.fail_reason, plan.fail_message)
            return
        if plan.gang_restart:
            self.request_gang_restart("RendezvousFailed")
        self.enforce_budgets()

    def record_restart(self, tier: str, reason: str, message: str, platform: bool) -> None:
        """Bookkeeping of one restart: counters, progress, condition, metric and event."""
        status, budget = self.status, self.rtj.spec["restartBudget"]
        tiers = status["restartsByTier"]
        tiers[tier] = tiers.get(tier, 0) + 1
        status["restarts"] = sum(tiers.values())
        status["lastFailureReason"], status["lastFailureMessage"] = reason, message
        status.setdefault("restartStartedTime", timestamp(self.now))
        metrics.RESTARTS.labels(tier, reason).inc()
        if platform:
            status["disruptions"] += 1
        else:
            status["jobRestarts"] += 1
            self.track_progress()
        self.cond(RESTARTING, True, tier, message)
        self.event("Warning", tier, f"{reason}: {message} (restart {status['restarts']}, "
                                    f"job failures {status['jobRestarts']}/{budget['maxRestarts']}, "
                                    f"disruptions {status['disruptions']}/{budget['maxDisruptions']})")

    def enforce_budgets(self) -> None:
        status, budget = self.status, self.rtj.spec["restartBudget"]
        if status["jobRestarts"] > budget["maxRestarts"]:
            self.fail("RestartBudgetExhausted", f"{status['jobRestarts']} job failures exceed "
                      f"restartBudget.maxRestarts={budget['maxRestarts']}; last: {status.get('lastFailureMessage')}")
        elif status["disruptions"] > budget["maxDisruptions"]:
            self.fail("DisruptionBudgetExhausted", f"{status['disruptions']} platform disruptions exceed "
                      f"restartBudget.maxDisruptions={budget['maxDisruptions']}")
        elif status["restartsWithoutProgress"] > budget["maxRestartsWithoutProgress"]:
            self.fail("NoProgress", f"{status['restartsWithoutProgress']} restarts in a row without the "
                      f"checkpoint step advancing past {status.get('stepAtLastRestart', 0)}")

    def track_progress(self) -> None:
        status = self.status
        step = int(status.get("lastCheckpointStep", 0))
        previous = status.get("stepAtLastRestart")
        if previous is None or step > int(previous):
            status["restartsWithoutProgress"] = 1
        else:
            status["restartsWithoutProgress"] += 1
        status["stepAtLastRestart"] = step

    def request_gang_restart(self, reason: str) -> None:
        recov = self.status.setdefault("recovery", {})
        if not recov.get("pendingGangRestart"):
            recov["pendingGangRestart"] = reason
            self.event("Warning", "RecreatingGang", f"Recreating all {self.rtj.nodes} pods as attempt "
                                                 f"{int(self.status['attempt']) + 1}: {reason}")
            self.busy = True

    def judge_job(self, job_conds: list[dict[str, Any]]) -> None:
        failed = next((c for c in job_conds if c.get("type") == "Failed" and c.get("status") == "True"), None)
        if not failed or self.status.get("phase") == "Failed":
            return
        if failed.get("reason") == "PodFailurePolicy":
            self.fail("PermanentFailure", failed.get("message") or "a pod failed with a permanent exit code")
            return
        if (self.status.get("recovery") or {}).get("pendingGangRestart"):
            return
        # The Job gave up on its own (e.g. its backoff limit); a new gang may still succeed.
        reason = failed.get("reason") or "JobFailed"
        self.record_restart(recovery.GANG_RESTART, reason, failed.get("message") or "the Job failed",
                            platform=False)
        self.enforce_budgets()
        if self.status.get("phase") != "Failed":
            self.request_gang_restart(reason)

    def fail(self, reason: str, message: str) -> None:
        if self.status.get("phase") == "Failed":
            return
        self.status["phase"] = "Failed"
        self.status["completionTime"] = timestamp(self.now)
        self.status["lastFailureReason"], self.status["lastFailureMessage"] = reason, message
        self.cond(FAILED, True, reason, message)
        self.cond(RESTARTING, False, reason, "no further restarts")
        self.event("Warning", "Failed", f"{reason}: {message}")
        self.stop_job()

    def stop_job(self) -> None:
        """Suspending keeps the Job for inspection while its pods go away."""
        job = self.kube.get("Job", job_name(self.rtj), self.rtj.namespace)
        if job is not None and not job["spec"].get("suspend"):
            self.kube.patch("Job", job_name(self.rtj), self.rtj.namespace, {"spec": {"suspend": True}})

    def derive_phase(self, job: dict[str, Any] | None, pods: list[dict[str, Any]]) -> None:
        status, rtj = self.status, self.rtj
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        ready = [p for p in live if p.get("status", {}).get("phase") == "Running" and _ready(p)]
        status["nodesReady"] = len(ready)
        # What runs is what counts: after an invalid edit, the Job still has its old shape.
        desired = int(job["spec"]["completions"]) if job and "completions" in job.get("spec", {}) else rtj.nodes
        status["nodesDesired"] = desired
        job_conds = ((job or {}).get("status") or {}).get("conditions") or []
        complete = any(c.get("type") in ("Complete", "SuccessCriteriaMet") and c.get("status") == "True"
                       for c in job_conds)
        self.cond(CREATED, job is not None or bool(status.get("startTime")), "ChildrenCreated",
                  f"Service {service_name(rtj)}, Job {job_name(rtj)} and PVC {pvc_name(rtj)}")
        self.cond(SUSPENDED, bool(rtj.spec["suspend"]), "Suspended" if rtj.spec["suspend"] else "NotSuspended",
                  "spec.suspend is true" if rtj.spec["suspend"] else "")

        if status.get("phase") == "Failed":
            self.cond(RUNNING, False, status.get("lastFailureReason", "Failed"), "the job failed")
            self.cond(SUCCEEDED, False, "Failed", "")
            return
        self.cond(FAILED, False, "NotFailed", "")
        if complete:
            status["phase"] = "Succeeded"
            status["completionTime"] = status.get("completionTime") or timestamp(self.now)
            self.cond(SUCCEEDED, True, "JobComplete", f"all {rtj.nodes} nodes completed")
            self.cond(RUNNING, False, "Completed", "")
            self.cond(RESTARTING, False, "Completed", "")
            status.pop("restartStartedTime", None)
            if self.old.get("phase") != "Succeeded":
                self.event("Normal", "Succeeded", f"Training finished at checkpoint step "
                                                  f"{status.get('lastCheckpointStep', 'unknown')}")
            return
        self.cond(SUCCEEDED, False, "NotCompleted", "")

        restarting_since = parse_time(status.get("restartStartedTime"))
        all_running = len(ready) >= desired
        if restarting_since and all_running and not (status.get("recovery") or {}).get("pendingGangRestart"):
            seconds = round((self.now - restarting_since).total_seconds(), 3)
            status["lastRecoverySeconds"] = seconds
            status.pop("restartStartedTime", None)
            restarting_since = None
            metrics.RECOVERY_SECONDS.observe(seconds)
            self.event("Normal", "Recovered", f"All {desired} nodes running again after {seconds}s")
        if rtj.spec["suspend"]:
            status["phase"] = "Suspended"
            self.cond(RUNNING, False, "Suspended", "spec.suspend is true")
        elif restarting_since:
            status["phase"] = "Restarting"
            self.busy = True
            self.cond(RUNNING, False, "Restarting", f"{len(ready)}/{desired} nodes ready")
        elif all_running:
            status["phase"] = "Running"
            self.cond(RUNNING, True, "AllNodesRunning", f"{len(ready)}/{desired} nodes ready")
        else:
            status["phase"] = "Pending"
            self.busy = True
            self.cond(RUNNING, False, "WaitingForPods", f"{len(ready)}/{desired} nodes ready")
        if not restarting_since:
            self.cond(RESTARTING, False, "Stable", "")
        if status["phase"] != self.old.get("phase") and status["phase"] == "Running":
            self.event("Normal", "Running", f"All {desired} nodes running")

    def finish_terminal(self) -> Outcome:
        if self.old.get("phase") == "Failed":
            self.stop_job()  # idempotent: a Failed job never holds GPUs
        return self.outcome()

    def outcome(self, requeue: float | None = None) -> Outcome:
        self.status["observedGeneration"] = self.rtj.generation
        metrics.record_phase(self.rtj.namespace, self.rtj.name, self.status.get("phase", "Pending"))
        if requeue is None:
            requeue = BUSY_REQUEUE if self.busy else IDLE_REQUEUE
        return Outcome(self.status, self.events, requeue)


def _ready(pod: dict[str, Any]) -> bool:
    conds = pod.get("status", {}).get("conditions") or []
    ready = next((c for c in conds if c.get("type") == "Ready"), None)
    return ready is None or ready.get("status") == "True"


def reconcile(kube: Kube, body: dict[str, Any], now: datetime.datetime | None = None,
              storage_check: StorageCheck | None = None) -> Outcome:
    """Converge one RTJ's children and return its new status and the events to post."""
    now = now or datetime.datetime.now(datetime.UTC)
    with metrics.RECONCILE_SECONDS.time():
        return _Pass(kube, body, now).run(storage_check)

