"""The recovery ladder: what a pod's or node's state means, and how the operator answers it.

Layers below the operator come first: in-process restart (inprocess.Wrapper) and worker respawn
(ft_launcher) recover faults while the pod is alive, so a live pod on a healthy node is left alone.
The operator acts only when a pod or its node is gone:

- ReplacePod: one index is lost (pod failed, evicted, or its node died). The Job controller makes
  the new pod. For a node that stays NotReady/unreachable past restartBudget.nodeLossGraceSeconds
  the operator evicts its pod (DisruptionTarget, so the Job's backoffLimit is not charged); a pod
  then stuck Terminating there past terminatingTimeoutSeconds is failed and deleted the way PodGC
  does it, since a dead kubelet never confirms the deletion and the Job controller (with a pod
  failure policy) holds the index until the pod is Failed.
- GangRestart: rendezvous cannot complete (a worker said so, or the Job itself failed or is about
  to: FailureTarget), or the Job controller's replacement back-off would outlast the rendezvous,
  and budget remains: the Job is recreated as the next attempt.
- Failed: a permanent failure, a spent budget, or restarts that make no checkpoint progress.

Failures caused by the job count against restartBudget.maxRestarts; those caused by the platform
(preemption, eviction, node loss) against restartBudget.maxDisruptions.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Any

from rtj_worker import exit_codes

from .conditions import parse_time

REPLACE_POD = "ReplacePod"
GANG_RESTART = "GangRestart"
TIERS = (REPLACE_POD, GANG_RESTART)

JOB_FAILURE = "JobFailure"
PLATFORM = "Platform"
PERMANENT = "Permanent"
RENDEZVOUS = "Rendezvous"
PEER = "Peer"  # the pod's worker says a peer ended it: node 0's rendezvous store went away
# How long a peer's failure waits for its cause to show (the control plane marks a dead node NotReady
# only after kube-controller-manager's node-monitor-grace-period, 50 s by default) before it is
# charged to the job.
PEER_ATTRIBUTION_SECONDS = 60.0

# What the operator does to a pod (Finding.action).
EVICT = "evict"  # Eviction API: DisruptionTarget, then a graceful delete
FORCE = "force"  # what PodGC does for orphans: phase Failed + DisruptionTarget, then delete now

# Waiting reasons no retry can fix.
PERMANENT_WAITING = {"InvalidImageName", "ErrImageNeverPull"}
# Pull errors and missing Secrets/ConfigMaps are often transient (a registry hiccup, a Secret created
# a moment later): they count as permanent only after a grace period.
WAITING_GRACE = {
    "ImagePullBackOff": datetime.timedelta(minutes=5),
    "ErrImagePull": datetime.timedelta(minutes=5),
    "CreateContainerConfigError": datetime.timedelta(minutes=2),
}
# The reason the operator puts on the DisruptionTarget condition when it fails a pod on a lost node.
FORCE_REASON = "DeletionByRTJOperator"
# kube-controller-manager's Job controller delays a replacement pod by 10 s x 2^(failures-1), capped
# at 10 min, counting every failed pod of the Job (pkg/controller/job: DefaultJobPodFailureBackOff).
JOB_BACKOFF_BASE, JOB_BACKOFF_MAX = 10.0, 600.0


@dataclass(frozen=True)
class Finding:
    """One pod's trouble, classified."""

    pod: str
    uid: str
    kind: str  # JOB_FAILURE | PLATFORM | PERMANENT | RENDEZVOUS
    reason: str  # CamelCase, shown in status and events
    message: str
    action: str = ""  # "" | EVICT | FORCE
    lost_node: str = ""  # the lost node this finding is about, if any
    age: float = 0.0  # seconds since the pod's container ended (PEER findings)


@dataclass(frozen=True)
class Timing:
    """How long the operator waits before it acts on a lost node (see restartBudget)."""

    node_grace: datetime.timedelta = datetime.timedelta(seconds=30)
    terminating_timeout: datetime.timedelta = datetime.timedelta(seconds=60)


@dataclass
class Plan:
    findings: list[Finding] = field(default_factory=list)  # not charged yet
    actions: list[Finding] = field(default_factory=list)  # pods to evict or force, charged or not
    gang_restart: bool = False
    fail_reason: str = ""
    fail_message: str = ""
    # Seconds until a grace period runs out and the world should be looked at again.
    recheck: float | None = None
    # Nodes of the gang's pods that are NotReady, unreachable or gone now (any duration): name -> why.
    lost_nodes: dict[str, str] = field(default_factory=dict)

    def wait(self, seconds: float) -> None:
        self.recheck = seconds if self.recheck is None else min(self.recheck, seconds)


def node_lost(node: dict[str, Any] | None) -> str:
    """Why a node can no longer run our pod, or '' if it can."""
    return node_loss(node, datetime.datetime.now(datetime.UTC))[0]


def node_loss(node: dict[str, Any] | None, now: datetime.datetime) -> tuple[str, datetime.timedelta]:
    """Why a node can no longer run our pod ('' if it can) and for how long that has been so.

    The duration comes from the Ready condition's lastTransitionTime (set by the node-lifecycle
    controller), so a node that flaps is judged by its current outage, not by its first one.
    """
    if node is None:
        return "NodeDeleted", datetime.timedelta.max
    ready = next((c for c in node.get("status", {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    unreachable = any(t.get("key") == "node.kubernetes.io/unreachable"
                      for t in node.get("spec", {}).get("taints") or [])
    if ready is not None and ready.get("status") == "True" and not unreachable:
        return "", datetime.timedelta(0)
    since = parse_time((ready or {}).get("lastTransitionTime")) or now
    reason = "NodeUnreachable" if unreachable or (ready or {}).get("status") == "Unknown" else "NodeNotReady"
    return reason, max(now - since, datetime.timedelta(0))


def _terminated(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term:
            return term
    return None


def _waiting(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        wait = (cs.get("state") or {}).get("waiting")
        if wait:
            return wait
    return None


def _disruption(pod: dict[str, Any]) -> dict[str, Any] | None:
    for cond in pod.get("status", {}).get("conditions") or []:
        if cond.get("type") == "DisruptionTarget" and cond.get("status") == "True":
            return cond
    return None


def termination_report(pod: dict[str, Any]) -> dict[str, Any]:
    """The JSON the worker writes to its termination log (see rtj_worker.entrypoint)."""
    term = _terminated(pod)
    try:
        report = json.loads((term or {}).get("message") or "{}")
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


def classify(pod: dict[str, Any], node: dict[str, Any] | None, now: datetime.datetime,
             timing: Timing, plan: Plan | None = None) -> Finding | None:
    """What this pod's state means for the job; `plan.wait()` learns when a grace period ends."""
    meta, status = pod["metadata"], pod.get("status", {})
    name, uid = meta["name"], meta.get("uid", meta["name"])
    node_name = pod.get("spec", {}).get("nodeName")
    lost, lost_for = node_loss(node, now) if node_name else ("", datetime.timedelta(0))
    phase = status.get("phase")
    disruption = _disruption(pod)

    if meta.get("deletionTimestamp") and phase not in ("Failed", "Succeeded"):
        # deletionTimestamp is when the grace period ends, not when the deletion was asked for.
        deleted = (parse_time(meta["deletionTimestamp"]) or now) - datetime.timedelta(
            seconds=int(meta.get("deletionGracePeriodSeconds") or 0))
        if lost:
            # A dead kubelet never confirms the deletion, and the Job controller (with a pod failure
            # policy) keeps the index until the pod is Failed: do what PodGC does for orphans.
            waited = now - deleted
            if waited >= timing.terminating_timeout:
                return Finding(name, uid, PLATFORM, lost, f"pod {name} stuck Terminating on lost node "
                               f"{node_name} for {int(waited.total_seconds())}s", FORCE, node_name)
            if plan is not None:
                plan.wait((timing.terminating_timeout - waited).total_seconds())
            return Finding(name, uid, PLATFORM, lost, f"pod {name} terminating on lost node {node_name}",
                           lost_node=node_name)
        if disruption:
            # Evicted, drained or preempted on a healthy node: the kubelet finishes it; count it now.
            return Finding(name, uid, PLATFORM, disruption.get("reason") or "Disrupted",
                           disruption.get("message") or f"pod {name} is being disrupted")
        return None

    if phase == "Failed":
        if disruption:
            return Finding(name, uid, PLATFORM, disruption.get("reason") or "Disrupted",
                           disruption.get("message") or f"pod {name} was disrupted")
        if status.get("reason") in ("Evicted", "Preempting", "Shutdown", "Terminated", "NodeLost"):
            return Finding(name, uid, PLATFORM, status["reason"], status.get("message") or status["reason"])
        if lost:
            return Finding(name, uid, PLATFORM, lost, f"pod {name} failed on lost node {node_name}",
                           lost_node=node_name)
        term = _terminated(pod) or {}
        code = term.get("exitCode")
        if meta.get("deletionTimestamp") and code in (exit_codes.SIGTERM, exit_codes.SIGKILL):
            # Killed because someone deleted it (kubectl delete, a controller): not the job's fault.
            return Finding(name, uid, PLATFORM, "PodDeleted", f"pod {name} was deleted while running")
        report = termination_report(pod)
        detail = report.get("reason") or term.get("reason") or ""
        message = f"pod {name} exited with code {code}" + (f": {detail}" if detail else "")
        if code in exit_codes.PERMANENT:
            return Finding(name, uid, PERMANENT, "ConfigError" if code == exit_codes.CONFIG_ERROR
                           else "PermanentFailure", message)
        if code == exit_codes.RENDEZVOUS_FAILED:
            return Finding(name, uid, RENDEZVOUS, "RendezvousFailed", message)
        if code == exit_codes.RENDEZVOUS_HOST_LOST:
            ended = parse_time(term.get("finishedAt")) or now
            return Finding(name, uid, PEER, "RendezvousHostLost", message,
                           age=max(0.0, (now - ended).total_seconds()))
        if code == exit_codes.LAUNCHER_BUDGET_EXHAUSTED:
            return Finding(name, uid, JOB_FAILURE, "LauncherRestartsExhausted", message)
        if term.get("reason") == "OOMKilled":
            return Finding(name, uid, JOB_FAILURE, "OOMKilled", message)
        return Finding(name, uid, JOB_FAILURE, f"ExitCode{code}" if code is not None else "PodFailed",
                       message)

    if phase in ("Pending", "Running") and lost:
        # A short blip (NotReady for less than the grace period) must not kill a healthy rank.
        if lost_for >= timing.node_grace:
            return Finding(name, uid, PLATFORM, lost, f"node {node_name} of pod {name} is lost ({lost} "
                           f"for {_seconds(lost_for)})", EVICT, node_name)
        if plan is not None:
            plan.wait((timing.node_grace - lost_for).total_seconds())
        return None

    waiting = _waiting(pod)
    if waiting:
        reason = waiting.get("reason", "")
        started = parse_time(status.get("startTime") or meta.get("creationTimestamp")) or now
        grace = WAITING_GRACE.get(reason)
        if reason in PERMANENT_WAITING or (grace is not None and now - started >= grace):
            return Finding(name, uid, PERMANENT, reason, waiting.get("message") or f"pod {name}: {reason}")
        if grace is not None and plan is not None:
            plan.wait((grace - (now - started)).total_seconds())
    return None


def _seconds(delta: datetime.timedelta) -> str:
    return "ever" if delta == datetime.timedelta.max else f"{int(delta.total_seconds())}s"


def replacement_backoff(failed_pods: int) -> float:
    """Seconds the Job controller waits before it creates the replacement of the next failed pod."""
    if failed_pods <= 0:
        return 0.0
    return min(JOB_BACKOFF_MAX, JOB_BACKOFF_BASE * 2 ** min(failed_pods - 1, 16))


def checkpoint_step(pods: list[dict[str, Any]]) -> int | None:
    """Newest complete checkpoint step in the pods' own termination reports.

    Only what the container itself wrote at exit counts: a pod annotation could be set by any
    process allowed to patch pods in the namespace, including another job's workers.
    """
    steps: list[int] = []
    for pod in pods:
        try:
            steps.append(int(termination_report(pod).get("checkpointStep")))
        except (TypeError, ValueError):
            pass
    return max(steps) if steps else None


def plan(pods: list[dict[str, Any]], nodes: dict[str, dict[str, Any] | None], seen: set[str],
         now: datetime.datetime, timing: Timing) -> Plan:
    """Classify every pod; new findings (uids not in `seen`) are to be charged by the caller."""
    result = Plan()
    for name, node in nodes.items():
        if lost := node_loss(node, now)[0]:
            result.lost_nodes[name] = lost
    for pod in pods:
        finding = classify(pod, nodes.get(pod.get("spec", {}).get("nodeName") or ""), now, timing, result)
        if finding is None:
            continue
        if finding.action:
            result.actions.append(finding)
        if finding.uid in seen:
            continue
        result.findings.append(finding)
        if finding.kind == PERMANENT and not result.fail_reason:
            result.fail_reason, result.fail_message = finding.reason, finding.message
        if finding.kind == RENDEZVOUS:
            result.gang_restart = True
    return result
