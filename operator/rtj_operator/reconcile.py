"""One level-triggered pass: read the RTJ's world, converge its children, compute its status.

`reconcile()` is idempotent: running it twice on the same world changes nothing the second time.
Everything it must remember between passes (budgets, charged pods, the gang attempt) lives in the
RTJ's status, so an operator restart or a deleted child cannot reset it.

Crash consistency: a decision is written to status before the side effect that carries it out, and
each side effect is derived from status plus the world. A pass that charges a failure or moves to a
new gang attempt writes status and acts in the next pass; a pass that acts (evict, fail a pod,
delete the old Job, create the new one) only carries out what status already says. So an operator
that dies at any point counts each failure once and performs each action once.
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
# Watch events (the RTJ, its pods, its Job, nodes) wake a job earlier.
ACT_REQUEUE = 0.05  # a decision was just written: carry it out
BUSY_REQUEUE = 2.0
IDLE_REQUEUE = 60.0
TERMINAL = ("Succeeded", "Failed")
# Service fields the operator owns (the API server defaults the rest, e.g. clusterIPs).
SERVICE_FIELDS = ("ports", "selector", "publishNotReadyAddresses")
# Client errors of a create or dry run that mean the spec produces an object the server rejects:
# validation (400, 422), or an admission webhook or policy that denied it (403 "denied"). Other 403s
# (RBAC, a namespace being deleted) are not the spec's fault.
REJECTED = (400, 422)

# An optional pre-flight check of the storage (see fsx.py): returns (ok, reason, message).
StorageCheck = Callable[[RTJ], tuple[bool, str, str]]
# Node lookup: the operator serves nodes from its watch; tests and tools may GET them.
NodeSource = Callable[[str], dict[str, Any] | None]


@dataclass
class Event:
    type: str  # Normal | Warning
    reason: str
    message: str
    # Reports a side effect already done (a create, an eviction): posted even if the status write
    # fails. Other events announce decisions, which only count once status holds them.
    done: bool = False


@dataclass
class Outcome:
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    requeue: float = IDLE_REQUEUE
    # Metric updates, applied by the caller once the status write succeeded (never twice per count).
    metrics: list[Callable[[], None]] = field(default_factory=list)


class ChildConflict(Exception):
    """An object with a child's name exists and this RTJ does not own it."""


def owned_by(obj: dict[str, Any], uid: str) -> bool:
    return any(ref.get("uid") == uid for ref in obj.get("metadata", {}).get("ownerReferences") or [])


class _Pass:
    """State of one pass; methods are the steps of `reconcile()`."""

    def __init__(self, kube: Kube, body: dict[str, Any], now: datetime.datetime, nodes: NodeSource | None,
                 allowed_service_accounts: frozenset[str] | None):
        self.kube, self.body, self.now = kube, body, now
        self.rtj = RTJ.from_body(body)
        self.old = body.get("status") or {}
        self.status: dict[str, Any] = copy.deepcopy(self.old)
        self.status.pop("kopf", None)  # kopf's own bookkeeping is not ours to write
        self.events: list[Event] = []
        self.metrics: list[Callable[[], None]] = []
        self.requeue: float | None = None
        self.busy = False
        self.acted = False  # a decision was recorded that the next pass carries out
        self.get_node = nodes or (lambda name: self.kube.get("Node", name))
        self.allowed_service_accounts = allowed_service_accounts
        budget = self.rtj.spec["restartBudget"]
        self.timing = recovery.Timing(
            node_grace=datetime.timedelta(seconds=budget.get("nodeLossGraceSeconds", 30)),
            terminating_timeout=datetime.timedelta(seconds=budget["terminatingTimeoutSeconds"]))

    # --- helpers -----------------------------------------------------------------------------
    def event(self, type_: str, reason: str, message: str, done: bool = False) -> None:
        self.events.append(Event(type_, reason, message, done))

    def cond(self, type_: str, status: bool, reason: str, message: str = "") -> None:
        self.status["conditions"] = conditions.set_condition(
            self.status.get("conditions") or [], type_, status, reason, message, self.rtj.generation, self.now)

    def recovery_state(self) -> dict[str, Any]:
        return self.status.setdefault("recovery", {})

    def wait(self, seconds: float) -> None:
        self.requeue = seconds if self.requeue is None else min(self.requeue, seconds)

    def create(self, obj: dict[str, Any], adopt: bool = True) -> bool:
        """Create a child; False when the server rejects what the spec produced (InvalidSpec set)."""
        if adopt:
            # The owner is explicit: reconcile also runs outside kopf handlers (demo, bench).
            kopf.adopt(obj, owner=self.rtj.owner)
        try:
            self.kube.create(obj)
        except KubeError as exc:
            if exc.status == 409:  # a previous pass (or a crash right after it) was faster: fine
                return True
            if _rejected(exc):
                self.rejected(obj, str(exc))
                return False
            raise
        self.event("Normal", "Created", f"Created {obj['kind']} {obj['metadata']['name']}", done=True)
        return True

    def rejected(self, obj: dict[str, Any], message: str) -> None:
        text = f"the API server rejects the {obj['kind']} this spec produces: {message}"
        if not self._cond_is(INVALID_SPEC, "ChildRejected", text):
            self.event("Warning", "InvalidSpec", text)
        self.cond(INVALID_SPEC, True, "ChildRejected", text)

    def _cond_is(self, type_: str, reason: str, message: str | None = None) -> bool:
        old = conditions.get_condition(self.old.get("conditions") or [], type_)
        return bool(old and old.get("status") == "True" and old.get("reason") == reason
                    and (message is None or old.get("message") == message))

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

        errors = semantic_errors(rtj, self.allowed_service_accounts)
        try:
            service, job, pvc = self.read_children()
        except ChildConflict as exc:
            return self.conflict(str(exc))
        if errors:
            # Nothing is created or changed; whatever already runs keeps running.
            message = "; ".join(errors)
            if self.old.get("observedGeneration") != rtj.generation or not self._cond_is(INVALID_SPEC, "InvalidSpec"):
                self.event("Warning", "InvalidSpec", message)
            self.cond(INVALID_SPEC, True, "InvalidSpec", message)
            return self.without_changes(job)
        self.cond(INVALID_SPEC, False, "Valid", "")

        if storage_check is not None and job is None:
            ok, reason, message = storage_check(rtj)
            self.cond(conditions.STORAGE_READY, ok, reason, message)
            if not ok:
                previous = conditions.get_condition(self.old.get("conditions") or [], conditions.STORAGE_READY)
                if (previous or {}).get("reason") != reason:
                    self.event("Warning", reason, message)
                self.status["phase"] = "Pending"
                self.cond(CREATED, False, reason, "waiting for storage: " + message)
                return self.outcome(requeue=IDLE_REQUEUE)

        if not self.ensure_service(service) or not self.ensure_pvc(pvc):
            return self.without_changes(job)
        job = self.ensure_job(job)
        if conditions.is_true(self.status.get("conditions") or [], INVALID_SPEC):
            return self.without_changes(job)
        self.observe(job, converge=True)
        return self.outcome()

    def without_changes(self, job: dict[str, Any] | None) -> Outcome:
        """The spec cannot be applied: report what runs (if anything) and change nothing."""
        if job is None:
            self.status["phase"] = "Invalid"
            self.cond(CREATED, False, "InvalidSpec", "nothing was created: fix the spec")
            return self.outcome()
        self.observe(job, converge=False)
        return self.outcome()

    def read_children(self) -> tuple[dict[str, Any] | None, dict[str, Any] | None, dict[str, Any] | None]:
        """The Service, Job and PVC, if they exist; ChildConflict if one exists that is not ours."""
        rtj, uid = self.rtj, self.rtj.uid
        service = self.kube.get("Service", service_name(rtj), rtj.namespace)
        job = self.kube.get("Job", job_name(rtj), rtj.namespace)
        pvc = None
        for kind, obj in (("Service", service), ("Job", job)):
            if obj is not None and not owned_by(obj, uid):
                raise ChildConflict(f"{kind} {rtj.namespace}/{obj['metadata']['name']} already exists and is not "
                                    f"owned by this ResilientTrainingJob: rename the job or remove that {kind}")
        if build_pvc(rtj) is not None:
            pvc = self.kube.get("PersistentVolumeClaim", pvc_name(rtj), rtj.namespace)
            if pvc is not None and not (owned_by(pvc, uid) or self.retained_by_us(pvc)):
                raise ChildConflict(f"PersistentVolumeClaim {rtj.namespace}/{pvc_name(rtj)} already exists and was "
                                    "not made for this job: rename the job, remove the claim, or name it in "
                                    "spec.storage.existingClaim to use it on purpose")
        return service, job, pvc

    def retained_by_us(self, pvc: dict[str, Any]) -> bool:
        """A claim kept (retention: Retain) from an earlier RTJ of this name: reused on purpose, so a
        re-created job resumes from its checkpoints. It has no owner, and our labels."""
        labels = pvc["metadata"].get("labels") or {}
        return (not pvc["metadata"].get("ownerReferences") and labels.get(api.LABEL_MANAGED_BY) == api.MANAGER
                and labels.get(api.LABEL_NAME) == self.rtj.name)

    def conflict(self, message: str) -> Outcome:
        if not self._cond_is(CREATED, "ChildConflict") and not (
                (conditions.get_condition(self.old.get("conditions") or [], CREATED) or {}).get("reason")
                == "ChildConflict"):
            self.event("Warning", "ChildConflict", message)
        self.cond(CREATED, False, "ChildConflict", message)
        self.status["phase"] = "Pending"
        self.cond(RUNNING, False, "ChildConflict", "nothing is created or changed until the conflict is resolved")
        return self.outcome(requeue=IDLE_REQUEUE)

    def ensure_service(self, have: dict[str, Any] | None) -> bool:
        desired = build_service(self.rtj)
        if have is None:
            return self.create(desired)
        drift = {k: v for k, v in desired["spec"].items() if k in SERVICE_FIELDS and have["spec"].get(k) != v}
        if drift:
            try:
                self.kube.patch("Service", service_name(self.rtj), self.rtj.namespace, {"spec": drift})
            except KubeError as exc:
                if _rejected(exc):
                    self.rejected(desired, str(exc))
                    return False
                raise
            self.event("Normal", "Updated", f"Updated Service {service_name(self.rtj)}: "
                                            f"{', '.join(sorted(drift))}", done=True)
        return True

    def ensure_pvc(self, have: dict[str, Any] | None) -> bool:
        desired = build_pvc(self.rtj)
        if desired is None or have is not None:
            return True
        # Retain: no owner reference, so deleting the job keeps the checkpoints.
        return self.create(desired, adopt=self.rtj.spec["storage"]["retention"] == "Delete")

    def ensure_job(self, job: dict[str, Any] | None) -> dict[str, Any] | None:
        """Converge the Job to status.attempt: the gang that should run now."""
        rtj, attempt = self.rtj, int(self.status["attempt"])
        recov = self.recovery_state()
        if job is not None and job["metadata"].get("deletionTimestamp"):
            self.busy = True  # the old gang is still going away (Foreground: its pods first)
            return job
        if job is not None and job_attempt(job) < attempt:
            # status already says which gang runs next (written before this delete, see the module doc).
            self.kube.delete("Job", job_name(rtj), rtj.namespace, propagation="Foreground")
            why = recov.get("pendingGangRestart") or "restart"
            self.event("Normal", "RecreatingJob", f"Deleting Job {job_name(rtj)} (attempt {job_attempt(job)}) for "
                                                  f"attempt {attempt}: {why}", done=True)
            self.busy = True
            return None
        desired = build_job(rtj, attempt)
        if job is None:
            if not self.create(desired):
                return None
            recov.pop("pendingGangRestart", None)
            self.busy = True
            self.status.setdefault("startTime", timestamp(self.now))
            return desired
        if (job["metadata"].get("annotations") or {}).get(api.ANNOTATION_SPEC_HASH) != template_hash(desired):
            # The pod template changed: the user's decision, a new gang with no budget charged. Check first
            # that the server takes the new Job; a rejected edit must not take down the running one.
            if not self.server_accepts(desired):
                return job
            self.next_attempt("SpecChanged", f"the pod template changed (generation {rtj.generation})")
            return job
        recov.pop("pendingGangRestart", None)
        patch: dict[str, Any] = {}
        if bool(job["spec"].get("suspend")) != bool(rtj.spec["suspend"]):
            patch["suspend"] = bool(rtj.spec["suspend"])
            self.event("Normal", "Suspended" if rtj.spec["suspend"] else "Resumed",
                       f"Job {job_name(rtj)} {'suspended' if rtj.spec['suspend'] else 'resumed'}", done=True)
        if job["spec"].get("backoffLimit") != desired["spec"]["backoffLimit"]:
            patch["backoffLimit"] = desired["spec"]["backoffLimit"]  # a budget edit keeps the gang
        if patch:
            self.kube.patch("Job", job_name(rtj), rtj.namespace, {"spec": patch})
            job["spec"].update(patch)
        return job

    def server_accepts(self, obj: dict[str, Any]) -> bool:
        """Server-side dry-run create: validation runs before the name clash, so 409 means valid."""
        candidate = copy.deepcopy(obj)
        kopf.adopt(candidate, owner=self.rtj.owner)
        try:
            self.kube.create(candidate, dry_run=True)
        except KubeError as exc:
            if exc.status == 409:
                return True
            if _rejected(exc):
                self.rejected(obj, str(exc))
                return False
            raise
        return True

    def next_attempt(self, reason: str, message: str) -> None:
        """Record that the gang restarts as the next attempt; the next pass replaces the Job."""
        recov = self.recovery_state()
        attempt = int(self.status["attempt"]) + 1
        self.status["attempt"] = attempt
        recov["pendingGangRestart"] = reason
        recov["gangRestartTime"] = timestamp(self.now)
        self.event("Warning" if reason != "SpecChanged" else "Normal", "RecreatingGang",
                   f"Recreating all {self.rtj.nodes} pods as attempt {attempt}: {message}")
        self.acted = True

    def observe(self, job: dict[str, Any] | None, converge: bool) -> None:
        """Read pods and nodes, run the recovery ladder, and derive phase and conditions."""
        rtj, status = self.rtj, self.status
        pods = self.job_pods(job)
        nodes = {name: self.get_node(name) for name in
                 sorted({p.get("spec", {}).get("nodeName") for p in pods} - {None, ""})}

        step = recovery.checkpoint_step(pods)
        if step is not None and step > int(status.get("lastCheckpointStep", -1)):
            status["lastCheckpointStep"] = step
            status["lastCheckpointTime"] = timestamp(self.now)
        last_ckpt = parse_time(status.get("lastCheckpointTime"))
        self.metrics.append(lambda: metrics.record_checkpoint(rtj.namespace, rtj.name, last_ckpt, self.now))

        recov = self.recovery_state()
        seen = set(recov.get("seenPods") or [])
        plan = recovery.plan(pods, nodes, seen, self.now, self.timing)
        if plan.recheck is not None:
            self.wait(max(0.5, plan.recheck))
        # A Job being deleted (a gang restart, or by hand) takes its pods along: not failures to charge.
        if converge and job is not None and job_attempt(job) == int(status["attempt"]) and not job[
                "metadata"].get("deletionTimestamp"):
            # Act only on what an earlier pass already charged: the charge is in status first.
            self.act([a for a in plan.actions if a.uid in seen], pods)
            self.charge(plan, seen)
            self.judge_job(job, pods)
        elif converge and job is not None and job["metadata"].get("deletionTimestamp"):
            # The old gang is gone (Foreground) only once its pods are; a pod on a lost node never
            # confirms its deletion: fail and delete it as PodGC would, or the next gang waits for ever.
            self.act([a for a in plan.actions if a.action == recovery.FORCE], pods)
        # Only pods still listed can turn up again, so the charged set is bounded by the pods themselves.
        listed = {p["metadata"].get("uid", p["metadata"]["name"]) for p in pods}
        recov["seenPods"] = sorted(seen & listed)

        troubled = {f.pod for f in plan.findings} | {a.pod for a in plan.actions}
        self.derive_phase(job, [p for p in pods if p["metadata"]["name"] not in troubled])

    def job_pods(self, job: dict[str, Any] | None) -> list[dict[str, Any]]:
        """Pods of the current Job: the labels select, the owner reference decides. A pod that only
        carries our labels (made by anyone who may create pods here) is not ours to count."""
        if job is None or "uid" not in job.get("metadata", {}):
            return []
        uid = job["metadata"]["uid"]
        return [p for p in self.kube.list("Pod", self.rtj.namespace, selector_labels(self.rtj)) if owned_by(p, uid)]

    def act(self, actions: list[recovery.Finding], pods: list[dict[str, Any]]) -> None:
        ns = self.rtj.namespace
        by_name = {p["metadata"]["name"]: p for p in pods}
        for action in actions:
            pod = by_name[action.pod]
            if action.action == recovery.EVICT:
                if self.kube.evict(action.pod, ns):
                    self.event("Warning", "EvictingPod", f"Evicting pod {action.pod}: {action.message}; the Job "
                                                         "controller replaces it on a healthy node", done=True)
            elif action.action == recovery.FORCE:
                if pod.get("status", {}).get("phase") != "Failed":
                    # As PodGC does: the pod is Failed (and a disruption) before it is deleted, so the Job
                    # controller frees its index without charging backoffLimit.
                    self.kube.patch("Pod", action.pod, ns, {"status": {"phase": "Failed", "conditions": [{
                        "type": "DisruptionTarget", "status": "True", "reason": recovery.FORCE_REASON,
                        "message": f"rtj-operator: {action.message}",
                        "lastTransitionTime": timestamp(self.now)}]}}, subresource="status", strategic=True)
                    self.event("Warning", "ForceDeletedPod", f"Failed and deleted pod {action.pod}: {action.message}",
                               done=True)
                self.kube.delete("Pod", action.pod, ns, grace_seconds=0)
            self.busy = True

    def charge(self, plan: recovery.Plan, seen: set[str]) -> None:
        """Count each new finding once against the right budget and decide the next tier.

        One fault, one charge. Node 0 hosts the rendezvous store, so when its node is lost (or its pod
        fails) the other pods' launchers exit too, and their workers say so (RendezvousHostLost, a
        PEER finding), usually before the control plane has marked the node NotReady. Per attempt,
        until the gang has recovered, a PEER failure is charged as the disruption of a peer's lost
        node if there is one (that node's own finding is then not charged again); else it is the
        consequence of a failure already charged, and not charged; else it waits up to
        PEER_ATTRIBUTION_SECONDS for its cause to show, and is then charged to the job. Each charged
        fault excuses one PEER failure, so a job that keeps failing still ends Failed."""
        recov, attempt = self.recovery_state(), int(self.status["attempt"])
        loss = recov.pop("charged", None) or {}
        if loss.get("attempt") != attempt or not self.status.get("restartStartedTime"):
            loss = {"attempt": attempt, "nodes": [], "excusable": 0}  # none being recovered
        gang = False
        # Platform findings first and PEER findings last: the cause may be seen in the same pass.
        order = {recovery.PLATFORM: 0, recovery.PEER: 2}
        for f in sorted(plan.findings, key=lambda f: order.get(f.kind, 1)):
            seen.add(f.uid)
            self.acted = self.acted or bool(f.action)
            if f.kind == recovery.PERMANENT:
                continue
            if f.kind == recovery.RENDEZVOUS:
                if gang:
                    continue  # every pod of the gang reports the same failed rendezvous: one charge
                gang = True
            tier = recovery.GANG_RESTART if f.kind == recovery.RENDEZVOUS else recovery.REPLACE_POD
            if f.lost_node in loss["nodes"]:
                continue  # charged already, through the failure of a pod of its gang
            if f.kind == recovery.PEER:
                if peers := [n for n in sorted(plan.lost_nodes) if n not in loss["nodes"]]:
                    loss["nodes"].append(peers[0])
                    self.record_restart(tier, f.reason, f"{f.message} (node {peers[0]} of its gang is lost: "
                                        f"{plan.lost_nodes[peers[0]]})", platform=True)
                    continue
                if loss["excusable"]:
                    loss["excusable"] -= 1
                    cause = self.status.get("lastFailureReason")
                    self.event("Warning", "NotCharged", f"{f.reason}: {f.message}; a consequence of the fault "
                                                        f"being recovered ({cause})")
                    continue
                if f.age < recovery.PEER_ATTRIBUTION_SECONDS:
                    seen.discard(f.uid)  # looked at again until its cause shows or the wait is over
                    self.wait(max(0.5, recovery.PEER_ATTRIBUTION_SECONDS - f.age))
                    continue
            self.record_restart(tier, f.reason, f.message, platform=f.kind == recovery.PLATFORM)
            if f.lost_node:
                loss["nodes"].append(f.lost_node)
            loss["excusable"] += 1
        if loss["nodes"] or loss["excusable"]:
            recov["charged"] = loss
        if plan.fail_reason:
            self.fail(plan.fail_reason, plan.fail_message)
            return
        if self.enforce_budgets():
            return
        if plan.gang_restart:
            # Pods of this attempt only: once the attempt moves on, the old gang's exits are not listed.
            self.next_attempt("RendezvousFailed", "a pod could not complete the rendezvous")

    def record_restart(self, tier: str, reason: str, message: str, platform: bool) -> None:
        """Bookkeeping of one restart: counters, progress, condition, metric and event."""
        status, budget = self.status, self.rtj.spec["restartBudget"]
        tiers = status["restartsByTier"]
        tiers[tier] = tiers.get(tier, 0) + 1
        status["restarts"] = sum(tiers.values())
        status["lastFailureReason"], status["lastFailureMessage"] = reason, message
        status.setdefault("restartStartedTime", timestamp(self.now))
        self.metrics.append(lambda: metrics.RESTARTS.labels(tier, reason).inc())
        if platform:
            status["disruptions"] += 1
        else:
            status["jobRestarts"] += 1
            self.track_progress()
        self.cond(RESTARTING, True, tier, message)
        self.event("Warning", tier, f"{reason}: {message} (restart {status['restarts']}, "
                                    f"job failures {status['jobRestarts']}/{budget['maxRestarts']}, "
                                    f"disruptions {status['disruptions']}/{budget['maxDisruptions']})")

    def enforce_budgets(self) -> bool:
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
        return status.get("phase") == "Failed"

    def track_progress(self) -> None:
        status = self.status
        step = int(status.get("lastCheckpointStep", 0))
        previous = status.get("stepAtLastRestart")
        if previous is None or step > int(previous):
            status["restartsWithoutProgress"] = 1
        else:
            status["restartsWithoutProgress"] += 1
        status["stepAtLastRestart"] = step

    def judge_job(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        """The Job's own verdict (FailureTarget comes first, Failed once every pod is gone), and the
        Job controller's replacement back-off, which a new attempt resets."""
        if self.status.get("phase") == "Failed" or self.recovery_state().get("pendingGangRestart"):
            return
        job_conds = (job.get("status") or {}).get("conditions") or []
        failed = next((c for c in job_conds if c.get("type") in ("FailureTarget", "Failed")
                       and c.get("status") == "True"), None)
        if failed:
            if failed.get("reason") == "PodFailurePolicy":
                self.fail("PermanentFailure", failed.get("message") or "a pod failed with a permanent exit code")
                return
            # The Job gave up on its own (e.g. its deadline); a new gang may still succeed.
            reason = failed.get("reason") or "JobFailed"
            self.record_restart(recovery.GANG_RESTART, reason, failed.get("message") or "the Job failed",
                                platform=False)
            if not self.enforce_budgets():
                self.next_attempt(reason, failed.get("message") or "the Job failed")
            return
        self.replacement_backoff(job, pods)

    def replacement_backoff(self, job: dict[str, Any], pods: list[dict[str, Any]]) -> None:
        failed = sum(1 for p in pods if p.get("status", {}).get("phase") == "Failed")
        active = sum(1 for p in pods if p.get("status", {}).get("phase") in ("Pending", "Running")
                     and not p["metadata"].get("deletionTimestamp"))
        recov = self.recovery_state()
        if not failed or active >= int(job["spec"].get("parallelism", self.rtj.nodes)):
            recov.pop("replacementBackoffSeconds", None)
            return
        delay = recovery.replacement_backoff(failed)
        if recov.get("replacementBackoffSeconds") != delay:
            recov["replacementBackoffSeconds"] = delay
            self.event("Normal", "ReplacementBackoff", f"The Job controller delays the replacement pod by about "
                                                       f"{delay:.0f}s ({failed} failed pods in this Job)")
        limit = self.rtj.spec["resiliency"]["rendezvousTimeoutSeconds"] / 2
        if delay > limit:
            # The surviving ranks would give up on the rendezvous first: a new Job starts without back-off.
            self.next_attempt("ReplacementBackoff", f"the Job controller would delay the replacement by "
                                                    f"{delay:.0f}s, beyond half the rendezvous timeout")

    def fail(self, reason: str, message: str) -> None:
        if self.status.get("phase") == "Failed":
            return
        self.status["phase"] = "Failed"
        self.status["completionTime"] = timestamp(self.now)
        self.status["lastFailureReason"], self.status["lastFailureMessage"] = reason, message
        self.cond(FAILED, True, reason, message)
        self.cond(RESTARTING, False, reason, "no further restarts")
        self.event("Warning", "Failed", f"{reason}: {message}")
        self.acted = True  # the next pass (terminal) suspends the Job

    def stop_job(self) -> None:
        """Suspending keeps the Job for inspection while its pods go away."""
        job = self.kube.get("Job", job_name(self.rtj), self.rtj.namespace)
        if job is not None and owned_by(job, self.rtj.uid) and not job["spec"].get("suspend"):
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
        current = job is not None and job_attempt(job) == int(status["attempt"]) and not job["metadata"].get(
            "deletionTimestamp")
        if complete and current:
            status["phase"] = "Succeeded"
            status["completionTime"] = status.get("completionTime") or timestamp(self.now)
            self.cond(SUCCEEDED, True, "JobComplete", f"all {desired} nodes completed")
            self.cond(RUNNING, False, "Completed", "")
            self.cond(RESTARTING, False, "Completed", "")
            status.pop("restartStartedTime", None)
            if self.old.get("phase") != "Succeeded":
                self.event("Normal", "Succeeded", f"Training finished at checkpoint step "
                                                  f"{status.get('lastCheckpointStep', 'unknown')}")
            return
        self.cond(SUCCEEDED, False, "NotCompleted", "")

        gang_pending = bool(self.recovery_state().get("pendingGangRestart")) or not current
        if gang_pending and status.get("startTime"):
            status.setdefault("restartStartedTime", timestamp(self.now))
        restarting_since = parse_time(status.get("restartStartedTime"))
        all_running = current and len(ready) >= desired
        if restarting_since and all_running and not gang_pending:
            seconds = round((self.now - restarting_since).total_seconds(), 3)
            status["lastRecoverySeconds"] = seconds
            status.pop("restartStartedTime", None)
            self.recovery_state().pop("charged", None)  # recovered: later failures are new faults
            restarting_since = None
            self.metrics.append(lambda: metrics.RECOVERY_SECONDS.observe(seconds))
            self.event("Normal", "Recovered", f"All {desired} nodes running again after {seconds}s")
        if rtj.spec["suspend"]:
            status["phase"] = "Suspended"
            self.cond(RUNNING, False, "Suspended", "spec.suspend is true")
        elif restarting_since:
            status["phase"] = "Restarting"
            self.busy = True
            reason = self.recovery_state().get("pendingGangRestart") or "Restarting"
            self.cond(RUNNING, False, "Restarting", f"{len(ready)}/{desired} nodes ready ({reason})")
        elif all_running:
            status["phase"] = "Running"
            self.cond(RUNNING, True, "AllNodesRunning", f"{len(ready)}/{desired} nodes ready")
        else:
            status["phase"] = "Pending"
            self.busy = True
            self.cond(RUNNING, False, "WaitingForPods", f"{len(ready)}/{desired} nodes ready")
        if not restarting_since:
            self.cond(RESTARTING, False, "Stable", "")
        elif gang_pending and not conditions.is_true(self.status.get("conditions") or [], RESTARTING):
            self.cond(RESTARTING, True, recovery.GANG_RESTART, self.recovery_state().get("pendingGangRestart") or "")
        if status["phase"] != self.old.get("phase") and status["phase"] == "Running":
            self.event("Normal", "Running", f"All {desired} nodes running")

    def finish_terminal(self) -> Outcome:
        if self.old.get("phase") == "Failed":
            self.stop_job()  # idempotent: a Failed job never holds GPUs
        return self.outcome()

    def outcome(self, requeue: float | None = None) -> Outcome:
        self.status["observedGeneration"] = self.rtj.generation
        phase = self.status.get("phase", "Pending")
        self.metrics.append(lambda: metrics.record_phase(self.rtj.namespace, self.rtj.name, phase))
        if requeue is None:
            requeue = ACT_REQUEUE if self.acted else BUSY_REQUEUE if self.busy else IDLE_REQUEUE
        if self.requeue is not None:
            requeue = min(requeue, self.requeue)
        return Outcome(self.status, self.events, requeue, self.metrics)


def _rejected(exc: KubeError) -> bool:
    return exc.status in REJECTED or (exc.status == 403 and "denied" in str(exc))


def job_attempt(job: dict[str, Any]) -> int:
    try:
        return int((job["metadata"].get("annotations") or {}).get(api.LABEL_ATTEMPT, 1))
    except (TypeError, ValueError):
        return 1


def _ready(pod: dict[str, Any]) -> bool:
    conds = pod.get("status", {}).get("conditions") or []
    ready = next((c for c in conds if c.get("type") == "Ready"), None)
    return ready is None or ready.get("status") == "True"


def reconcile(kube: Kube, body: dict[str, Any], now: datetime.datetime | None = None,
              storage_check: StorageCheck | None = None, nodes: NodeSource | None = None,
              allowed_service_accounts: frozenset[str] | None = None) -> Outcome:
    """Converge one RTJ's children and return its new status, the events to post and the metrics
    to record once that status is written."""
    now = now or datetime.datetime.now(datetime.UTC)
    with metrics.RECONCILE_SECONDS.time():
        return _Pass(kube, body, now, nodes, allowed_service_accounts).run(storage_check)
