"""The recovery ladder: what a pod's or node's state means, and how the operator answers it.

Layers below the operator come first: in-process restart (inprocess.Wrapper) and worker respawn
(ft_launcher) recover faults while the pod is alive, so a live pod on a healthy node is left alone.
The operator acts only when a pod or its node is gone:

- ReplacePod: one index is lost (pod failed, evicted, or its node died). The Job controller makes
  the new pod; the operator deletes pods on lost nodes and force-deletes those stuck Terminating
  there, since a dead kubelet never confirms the deletion and the index would wait forever.
- GangRestart: rendezvous cannot complete (a worker said so, or the Job itself failed) and
  budget remains: the Job is recreated as the next attempt.
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

from . import api
from .conditions import parse_time

REPLACE_POD = "ReplacePod"
GANG_RESTART = "GangRestart"
TIERS = (REPLACE_POD, GANG_RESTART)

JOB_FAILURE = "JobFailure"
PLATFORM = "Platform"
PERMANENT = "Permanent"
RENDEZVOUS = "Rendezvous"

# Waiting reasons no retry can fix.
PERMANENT_WAITING = {"InvalidImageName", "CreateContainerConfigError", "ErrImageNeverPull"}
# Pull errors that might be transient get this long before they count as permanent.
IMAGE_PULL_GRACE = datetime.timedelta(minutes=5)
IMAGE_PULL_WAITING = {"ImagePullBackOff", "ErrImagePull"}


@dataclass(frozen=True)
class Finding:
    """One pod's trouble, classified."""

    pod: str
    uid: str
    kind: str  # JOB_FAILURE | PLATFORM | PERMANENT | RENDEZVOUS
    reason: str  # CamelCase, shown in status and events
    message: str
    action: str = ""  # "" | "delete" | "force-delete"


@dataclass
class Plan:
    findings: list[Finding] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
    force_deletes: list[str] = field(default_factory=list)
    gang_restart: bool = False
    fail_reason: str = ""
    fail_message: str = ""


def node_lost(node: dict[str, Any] | None) -> str:
    """Why a node can no longer run our pod, or '' if it can."""
    if node is None:
        return "NodeDeleted"
    for taint in node.get("spec", {}).get("taints") or []:
        if taint.get("key") == "node.kubernetes.io/unreachable":
            return "NodeUnreachable"
    for cond in node.get("status", {}).get("conditions") or []:
        if cond.get("type") == "Ready" and cond.get("status") != "True":
            return "NodeNotReady"
    return ""


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
             terminating_timeout: datetime.timedelta) -> Finding | None:
    meta, status = pod["metadata"], pod.get("status", {})
    name, uid = meta["name"], meta.get("uid", meta["name"])
    node_name = pod.get("spec", {}).get("nodeName")
    lost = node_lost(node) if node_name else ""

    if meta.get("deletionTimestamp"):
        deleted = parse_time(meta["deletionTimestamp"]) or now
        if lost and now - deleted >= terminating_timeout:
            return Finding(name, uid, PLATFORM, lost, f"pod {name} stuck Terminating on lost node "
                           f"{node_name} for {int((now - deleted).total_seconds())}s", "force-delete")
        if lost:
            return Finding(name, uid, PLATFORM, lost, f"pod {name} terminating on lost node {node_name}")
        return None

    phase = status.get("phase")
    if phase == "Failed":
        disruption = _disruption(pod)
        if disruption:
            return Finding(name, uid, PLATFORM, disruption.get("reason") or "Disrupted",
                           disruption.get("message") or f"pod {name} was disrupted")
        if status.get("reason") in ("Evicted", "Preempting", "Shutdown", "Terminated", "NodeLost"):
            return Finding(name, uid, PLATFORM, status["reason"], status.get("message") or status["reason"])
        if lost:
            return Finding(name, uid, PLATFORM, lost, f"pod {name} failed on lost node {node_name}")
        term = _terminated(pod) or {}
        code = term.get("exitCode")
        report = termination_report(pod)
        detail = report.get("reason") or term.get("reason") or ""
        message = f"pod {name} exited with code {code}" + (f": {detail}" if detail else "")
        if code in exit_codes.PERMANENT:
            return Finding(name, uid, PERMANENT, "ConfigError" if code == exit_codes.CONFIG_ERROR
                           else "PermanentFailure", message)
        if code == exit_codes.RENDEZVOUS_FAILED:
            return Finding(name, uid, RENDEZVOUS, "RendezvousFailed", message)
        if code == exit_codes.LAUNCHER_BUDGET_EXHAUSTED:
            return Finding(name, uid, JOB_FAILURE, "LauncherRestartsExhausted", message)
        if term.get("reason") == "OOMKilled":
            return Finding(name, uid, JOB_FAILURE, "OOMKilled", message)
        return Finding(name, uid, JOB_FAILURE, f"ExitCode{code}" if code is not None else "PodFailed",
                       message)

    if phase in ("Pending", "Running") and lost:
        return Finding(name, uid, PLATFORM, lost, f"node {node_name} of pod {name} is lost ({lost})",
                       "delete")

    waiting = _waiting(pod)
    if waiting:
        reason = waiting.get("reason", "")
        started = parse_time(meta.get("creationTimestamp")) or now
        if reason in PERMANENT_WAITING or (reason in IMAGE_PULL_WAITING and now - started >= IMAGE_PULL_GRACE):
            return Finding(name, uid, PERMANENT, reason, waiting.get("message") or f"pod {name}: {reason}")
    return None


def checkpoint_step(pods: list[dict[str, Any]]) -> int | None:
    """Newest complete checkpoint step reported by any pod (annotation or termination report)."""
    steps: list[int] = []
    for pod in pods:
        value = (pod["metadata"].get("annotations") or {}).get(api.ANNOTATION_CHECKPOINT_STEP)
        report_step = termination_report(pod).get("checkpointStep")
        for candidate in (value, report_step):
            try:
                steps.append(int(candidate))
            except (TypeError, ValueError):
                pass
    return max(steps) if steps else None


def plan(pods: list[dict[str, Any]], nodes: dict[str, dict[str, Any] | None], seen: set[str],
         now: datetime.datetime, terminating_timeout: datetime.timedelta) -> Plan:
    """Classify every pod; new findings (uids not in `seen`) are to be charged by the caller."""
    result = Plan()
    for pod in pods:
        finding = classify(pod, nodes.get(pod.get("spec", {}).get("nodeName") or ""), now,
                           terminating_timeout)
        if finding is None:
            continue
        if finding.action == "delete":
            result.deletes.append(finding.pod)
        elif finding.action == "force-delete":
            result.force_deletes.append(finding.pod)
        if finding.uid in seen:
            continue
        result.findings.append(finding)
        if finding.kind == PERMANENT and not result.fail_reason:
            result.fail_reason, result.fail_message = finding.reason, finding.message
        if finding.kind == RENDEZVOUS:
            result.gang_restart = True
    return result
