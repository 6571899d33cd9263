"""The recovery ladder as data: what a pod's, node's or Job's state means, who pays for it, what the
operator does about it. Pure: no I/O, no clock (callers pass `now`); table-tested in
tests/unit/test_ladder.py, exercised end to end in tests/cluster/test_recovery.py.

Layers below the operator come first: in-process restart (inprocess.Wrapper) and worker respawn
(ft_launcher) recover faults while the pod is alive, so a live pod on a healthy node is left alone.
The operator acts only when a pod or its node is gone:

- ReplacePod: one index is lost (the pod failed, was evicted, or its node died); the Job controller
  makes the new pod. A pod on a node lost past restartBudget.nodeLossGraceSeconds is evicted
  (DisruptionTarget: the Job's pod failure policy ignores it); one on a fenced node is failed and
  deleted at once, as PodGC does (fencing()).
- GangRestart: the rendezvous cannot complete, the Job itself failed (or is about to), or the Job
  controller's replacement back-off would outlast the rendezvous: the Job is recreated as the next
  attempt.
- Failed: a permanent failure, a spent budget, or restarts that make no checkpoint progress.

Reading order: FINDINGS (what each kind of finding means), CONSEQUENCES (what charging it does
besides the restart: exclude its node, count a failure against the node, why a gang restarts), the
tables that map what the API shows to a finding (EXIT_CODES, PLATFORM_POD_REASONS, waiting reasons),
JOB_VERDICTS, BUDGETS; then the functions: classify (one pod), plan (a gang), attribute (one fault, one
charge), over_budget.
"""

from __future__ import annotations

import datetime
import json
from dataclasses import dataclass, field
from typing import Any

from rtj_worker import exit_codes

from . import health
from .conditions import get_condition, parse_time
from .memo import per_version

# --- tiers, payers, actions -------------------------------------------------------------------------
REPLACE_POD = "ReplacePod"
GANG_RESTART = "GangRestart"
TIERS = (REPLACE_POD, GANG_RESTART)
# The layers inside the pods, which recover without the operator; the pods report them (progress.py).
IN_PROCESS = "InProcess"
LAUNCHER = "Launcher"
IN_JOB_TIERS = (IN_PROCESS, LAUNCHER)
ALL_TIERS = (*IN_JOB_TIERS, *TIERS)

JOB = "job"  # counts against restartBudget.maxRestarts (status.jobRestarts)
PLATFORM = "platform"  # counts against restartBudget.maxDisruptions (status.disruptions)
NOBODY = "nobody"
PEERS = "peers"  # decided by attribute(): a lost peer's node, the fault being recovered, or the job

POD = "pod"  # a finding is charged once per pod (its uid)
ATTEMPT = "attempt"  # once per gang attempt, however many pods report it

EVICT = "evict"  # Eviction API: DisruptionTarget, then a graceful delete
FORCE = "force"  # what PodGC does for orphans: phase Failed + DisruptionTarget, then delete now


@dataclass(frozen=True)
class Meaning:
    """What a kind of finding means for the job."""

    tier: str | None  # the restart it needs (None: none)
    payer: str  # JOB | PLATFORM | NOBODY | PEERS
    once_per: str = POD
    fails: bool = False  # the job cannot succeed: Failed at once


# Finding kinds.
JOB_FAILURE = "JobFailure"
# The reason of a platform finding on a Ready node its health agent reports bad (health.py).
UNHEALTHY = "NodeUnhealthy"
PLATFORM_FAULT = "Platform"
PERMANENT = "Permanent"
RENDEZVOUS = "Rendezvous"
PEER = "Peer"  # the pod's worker says a peer ended it: node 0's rendezvous store went away
# The rendezvous of this attempt closed for good (exit 78): a peer's or a node's doing, decided as a
# PEER's is (a lost or unhealthy node of the gang, the fault being recovered, else the job's after a
# wait), once per attempt, and a new gang either way.
RDZV_CLOSED = "RendezvousClosed"
# The reason of a job failure whose pod stopped its ranks' crash loop (rtj_worker.crashloop).
CRASH_LOOP = "CrashLoop"
# The most of a rank's last lines an exit's message carries (the worker sends at most 1800 characters).
MAX_LINES_CHARS = 2000
# The rendezvous host's name did not resolve in time: the cluster's DNS (or the publication of the host
# pod's address) failed the gang before any launcher started; the platform's, and a new gang.
UNRESOLVED = "Unresolved"

# The coordinator pod (it hosts the gang's rendezvous) is gone: the platform's doing (its node lost, an
# eviction, a deletion) or its own failure. Either way the rendezvous is gone with it: a new gang.
COORDINATOR_LOST = "CoordinatorLost"
COORDINATOR_FAILED = "CoordinatorFailed"
# The coordinator's nvrx-control raised (exit 77): a rendezvous round could not close, a failed
# rendezvous as a launcher's 71 is, but the platform's (no training code runs there), and like a 71 not
# charged while a platform fault is recovered or a pod of the gang finds no node.
CONTROL_FAILED = "RendezvousControlFailed"

FINDINGS: dict[str, Meaning] = {
    JOB_FAILURE: Meaning(REPLACE_POD, JOB),
    PLATFORM_FAULT: Meaning(REPLACE_POD, PLATFORM),
    PERMANENT: Meaning(None, NOBODY, fails=True),
    RENDEZVOUS: Meaning(GANG_RESTART, JOB, once_per=ATTEMPT),
    UNRESOLVED: Meaning(GANG_RESTART, PLATFORM, once_per=ATTEMPT),
    RDZV_CLOSED: Meaning(GANG_RESTART, PEERS, once_per=ATTEMPT),
    PEER: Meaning(REPLACE_POD, PEERS),
    COORDINATOR_LOST: Meaning(GANG_RESTART, PLATFORM, once_per=ATTEMPT),
    COORDINATOR_FAILED: Meaning(GANG_RESTART, JOB, once_per=ATTEMPT),
    CONTROL_FAILED: Meaning(GANG_RESTART, PLATFORM, once_per=ATTEMPT),
}


def _charges() -> dict[str, tuple[str, ...]]:
    """Who each tier's restarts can be charged to (status.restartCounts' `charged`): the pods' own
    recoveries are the job's (progress.fold); an operator tier's, the payers of the findings that need it
    (PEERS is decided per fault, either; NOBODY restarts nothing)."""
    charges = {tier: (JOB,) for tier in IN_JOB_TIERS}
    for tier in TIERS:
        payers = set()
        for meaning in FINDINGS.values():
            if meaning.tier == tier:
                payers |= {JOB, PLATFORM} if meaning.payer == PEERS else {meaning.payer} - {NOBODY}
        charges[tier] = tuple(sorted(payers))
    return charges


# tier -> the payers its restarts can be charged to: the metrics start each pair at 0 (metrics.py).
CHARGES = _charges()


@dataclass(frozen=True)
class Consequence:
    """What charging a finding does besides the restart its Meaning needs (policies/charging.charge)."""

    excludes_node: bool = False  # its node is kept out of the placement (restartBudget.nodeExclusionSeconds)
    counts_node_failure: bool = False  # charged to the job: the second such failure on a node excludes it
    # Charged to the job right after a failure with the same reason and detail (another pod's, or this
    # index's previous pod's): the job fails instead of restarting.
    fails_if_repeated: bool = False
    # Why its GangRestart recreates the gang, when charged and when not (EXCUSED).
    gang_reason: str = "a pod could not complete the rendezvous"
    gang_reason_excused: str = ("a pod could not complete the rendezvous (not charged: its launcher closed the "
                                "rendezvous)")


COORDINATOR_GONE = Consequence(gang_reason="the coordinator is gone", gang_reason_excused="the coordinator is gone")
# By finding kind; a kind not listed has none but the restart.
CONSEQUENCES: dict[str, Consequence] = {
    JOB_FAILURE: Consequence(counts_node_failure=True),
    COORDINATOR_LOST: COORDINATOR_GONE,
    COORDINATOR_FAILED: COORDINATOR_GONE,
    CONTROL_FAILED: COORDINATOR_GONE,
    RDZV_CLOSED: Consequence(gang_reason="the rendezvous was closed for good",
                             gang_reason_excused="the rendezvous was closed for good"),
    UNRESOLVED: Consequence(gang_reason="the rendezvous host's name did not resolve",
                            gang_reason_excused="the rendezvous host's name did not resolve"),
}
# By finding reason, in place of its kind's: a node its health agent reports bad is excluded.
REASON_CONSEQUENCES: dict[str, Consequence] = {
    UNHEALTHY: Consequence(excludes_node=True),
    # A pod stopped its ranks' crash loop (the same exception, twice, no progress): a new pod, possibly
    # on a better node, once; the same from a second pod is the job's code, not a node.
    CRASH_LOOP: Consequence(counts_node_failure=True, fails_if_repeated=True),
}
NO_CONSEQUENCE = Consequence()

# A pass charges platform findings first and peer findings last: a peer's failure may be explained
# by a lost node (or the coordinator) seen in the same pass.
CHARGE_ORDER = {COORDINATOR_LOST: 0, COORDINATOR_FAILED: 0, PLATFORM_FAULT: 0, UNRESOLVED: 0, CONTROL_FAILED: 1,
                JOB_FAILURE: 1,
                RENDEZVOUS: 1, PERMANENT: 1, PEER: 2, RDZV_CLOSED: 2}

# The worker's exit codes (rtj_worker.exit_codes, the contract with the entrypoint) -> (kind, reason).
EXIT_CODES: dict[int, tuple[str, str]] = {
    exit_codes.CONFIG_ERROR: (PERMANENT, "ConfigError"),
    exit_codes.PERMANENT_FAILURE: (PERMANENT, "PermanentFailure"),
    exit_codes.CRASH_LOOP: (JOB_FAILURE, CRASH_LOOP),
    exit_codes.LAUNCHER_BUDGET_EXHAUSTED: (JOB_FAILURE, "LauncherRestartsExhausted"),
    exit_codes.RENDEZVOUS_FAILED: (RENDEZVOUS, "RendezvousFailed"),
    exit_codes.RENDEZVOUS_HOST_LOST: (PEER, "RendezvousHostLost"),
    exit_codes.RENDEZVOUS_HOST_UNRESOLVED: (UNRESOLVED, "RendezvousHostUnresolved"),
    exit_codes.RENDEZVOUS_CLOSED: (RDZV_CLOSED, RDZV_CLOSED),
    # NVRx 0.7 said "do not requeue" (its launcher's exit 93): Failed, as it asks.
    exit_codes.LAUNCHER_DECLINED: (PERMANENT, "LauncherDeclined"),
    # A standby, or a node whose peer closed the rendezvous: the peer's own exit says why.
    exit_codes.GANG_STOPPED: (PEER, "GangStopped"),
    exit_codes.NODE_UNHEALTHY: (PLATFORM_FAULT, "NodeUnhealthy"),
    # Only the coordinator exits so (its nvrx-control raised): coordinator_finding makes it CONTROL_FAILED.
    exit_codes.RENDEZVOUS_CONTROL_FAILED: (PLATFORM_FAULT, CONTROL_FAILED),
    # NVRx stopped restarting for lack of checkpoint progress: a new pod (often on another node) may
    # progress; restartBudget.maxRestartsWithoutProgress decides, never the Job controller (FailJob).
    exit_codes.NO_PROGRESS: (JOB_FAILURE, "LauncherNoProgress"),
    # The entrypoint was sent SIGTERM/SIGINT with no deletion of its pod asked for (a node shutdown the
    # kubelet did not report, a runtime stopping containers): not the job's doing.
    exit_codes.SIGTERM: (PLATFORM_FAULT, "Terminated"),
    exit_codes.SIGINT: (PLATFORM_FAULT, "Interrupted"),
}
# status.reason of a Failed pod the kubelet (or a controller) ended: the platform's doing.
PLATFORM_POD_REASONS = frozenset({"Evicted", "Preempting", "Shutdown", "Terminated", "NodeLost"})
# Waiting reasons no retry can fix.
PERMANENT_WAITING = frozenset({"InvalidImageName", "ErrImageNeverPull"})
# Pull errors and missing Secrets/ConfigMaps are often transient (a registry hiccup, a Secret created
# a moment later): they count as permanent only after a grace period.
WAITING_GRACE = {
    "ImagePullBackOff": datetime.timedelta(minutes=5),
    "ErrImagePull": datetime.timedelta(minutes=5),
    "CreateContainerConfigError": datetime.timedelta(minutes=2),
}
# The reason the operator puts on the DisruptionTarget condition when it fails a pod on a fenced node.
FORCE_REASON = "DeletionByRTJOperator"
# The taint an administrator (or an automation) puts on a node that is shut down (non-graceful node
# shutdown, KEP-2268): PodGC force-deletes its terminating pods, and so may the operator.
OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"


@dataclass(frozen=True)
class Verdict:
    """What the Job's own FailureTarget/Failed condition (by its reason) means."""

    fails: str = ""  # the RTJ fails with this reason
    tier: str | None = None
    payer: str = JOB


# The Job controller's verdicts, by condition reason; anything else (a deadline, a backoffLimit the
# operator's budget should have pre-empted) is the job's failure, answered by a new gang.
JOB_VERDICTS: dict[str, Verdict] = {
    "PodFailurePolicy": Verdict(fails="PermanentFailure"),
}
DEFAULT_VERDICT = Verdict(tier=GANG_RESTART, payer=JOB)


@dataclass(frozen=True)
class Budget:
    counter: str  # status field
    limit: str  # spec.restartBudget field
    reason: str  # the Failed reason once counter > limit
    message: str  # format(n=, limit=, last=, step=, within=)
    # Counted over restartBudget.windowSeconds when it is set (the charges' times, status.recovery.chargeTimes);
    # else over the job's life. A count of charges in a row is never windowed.
    windowed: bool = False


# Checked in this order after every charge: the first one spent fails the job.
BUDGETS = (
    Budget("jobRestarts", "maxRestarts", "RestartBudgetExhausted",
           "{n} job failures{within} exceed restartBudget.maxRestarts={limit}; last: {last}", windowed=True),
    Budget("disruptions", "maxDisruptions", "DisruptionBudgetExhausted",
           "{n} platform disruptions{within} exceed restartBudget.maxDisruptions={limit}", windowed=True),
    Budget("restartsWithoutProgress", "maxRestartsWithoutProgress", "NoProgress",
           "{n} restarts in a row without the checkpoint step advancing past {step}"),
)

# How long a peer's failure waits for its cause to show (the control plane marks a dead node NotReady
# only after kube-controller-manager's node-monitor-grace-period, 50 s by default) before it is
# charged to the job.
PEER_ATTRIBUTION_SECONDS = 60.0
# Node losses charged within this many seconds of the first of a recovery are one event (a rack, a switch,
# an availability zone's network): one disruption, each lost node's pod replaced all the same.
CORRELATED_LOSS_SECONDS = 120.0
# kube-controller-manager's Job controller delays a replacement pod by 10 s x 2^(failures-1), capped
# at 10 min, counting every failed pod of the Job (pkg/controller/job: DefaultJobPodFailureBackOff).
JOB_BACKOFF_BASE, JOB_BACKOFF_MAX = 10.0, 600.0


# --- what classify() returns --------------------------------------------------------------------------
@dataclass(frozen=True)
class Finding:
    """One pod's trouble, classified."""

    pod: str
    uid: str
    kind: str  # a key of FINDINGS
    reason: str  # CamelCase, shown in status and events
    message: str
    action: str = ""  # "" | EVICT | FORCE
    lost_node: str = ""  # the lost (or unhealthy) node this finding is about, if any
    age: float = 0.0  # seconds since the pod's container ended (PEER findings)
    node: str = ""  # the pod's node, if it was scheduled
    detail: str = ""  # what the worker's exit report says (its `reason`), the same for the same failure

    @property
    def meaning(self) -> Meaning:
        return FINDINGS[self.kind]

    @property
    def consequence(self) -> Consequence:
        return REASON_CONSEQUENCES.get(self.reason) or CONSEQUENCES.get(self.kind, NO_CONSEQUENCE)


@dataclass(frozen=True)
class Timing:
    """How long the operator waits before it acts on a lost node (see restartBudget)."""

    node_grace: datetime.timedelta = datetime.timedelta(seconds=300)
    terminating_timeout: datetime.timedelta = datetime.timedelta(seconds=60)


@dataclass
class Plan:
    findings: list[Finding] = field(default_factory=list)  # not charged yet
    actions: list[Finding] = field(default_factory=list)  # pods to evict or force, charged or not
    # Seconds until a grace period runs out and the world should be looked at again.
    recheck: float | None = None
    # Nodes of the gang's pods that are NotReady, unreachable or gone now (any duration): name -> why.
    lost_nodes: dict[str, str] = field(default_factory=dict)
    # Pods terminating on a lost node with no evidence it runs nothing any more: node -> (pod, why the
    # node is lost, seconds past the grace period). Replaced only once fenced.
    unfenced: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    # Pods on a lost node that is not fenced, within nodeLossGraceSeconds: node -> (pod, why the node is
    # lost, seconds it has been).
    in_grace: dict[str, tuple[str, str, float]] = field(default_factory=dict)
    # Pods terminating past the timeout on a node that is not lost: pod -> (node, seconds).
    stuck: dict[str, tuple[str, float]] = field(default_factory=dict)
    # Set when many nodes went dark at once: nothing is evicted or charged for them (why).
    brake: str = ""
    # Pods the scheduler finds no node for: pod -> its message ("0/8 nodes are available: ...").
    unschedulable: dict[str, str] = field(default_factory=dict)
    # Ready nodes of the gang's pods that cannot train (health.unhealthy): name -> why.
    unhealthy: dict[str, str] = field(default_factory=dict)
    # Set when many of the gang's nodes were reported unhealthy at once: none is evicted for it (why).
    health_brake: str = ""

    def wait(self, seconds: float) -> None:
        self.recheck = seconds if self.recheck is None else min(self.recheck, seconds)

    @property
    def permanent(self) -> Finding | None:
        return next((f for f in self.findings if f.meaning.fails), None)


# --- nodes and pods ---------------------------------------------------------------------------------
# node_loss's reasons for a node whose kubelet no longer answers (and so confirms no pod's end).
NODE_DELETED, NODE_UNREACHABLE = "NodeDeleted", "NodeUnreachable"
def node_loss(node: dict[str, Any] | None, now: datetime.datetime) -> tuple[str, datetime.timedelta]:
    """Why a node can no longer run our pod ('' if it can) and for how long that has been so.

    The duration comes from the Ready condition's lastTransitionTime (set by the node-lifecycle
    controller), so a node that flaps is judged by its current outage, not by its first one.
    """
    if node is None:
        return NODE_DELETED, datetime.timedelta.max
    reason, since = _node_state(node)
    if not reason:
        return "", datetime.timedelta(0)
    return reason, max(now - (since or now), datetime.timedelta(0))


@per_version
def _node_state(node: dict[str, Any]) -> tuple[str, datetime.datetime | None]:
    """node_loss's reason for a node ('' if it can run pods) and since when its Ready condition says so."""
    ready = next((c for c in node.get("status", {}).get("conditions") or [] if c.get("type") == "Ready"), None)
    unreachable = any(t.get("key") == "node.kubernetes.io/unreachable"
                      for t in node.get("spec", {}).get("taints") or [])
    if ready is not None and ready.get("status") == "True" and not unreachable:
        return "", None
    reason = NODE_UNREACHABLE if unreachable or (ready or {}).get("status") == "Unknown" else "NodeNotReady"
    return reason, parse_time((ready or {}).get("lastTransitionTime"))


def node_lost(node: dict[str, Any] | None, now: datetime.datetime) -> str:
    """Why a node can no longer run our pod, or '' if it can."""
    return node_loss(node, now)[0]


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


@per_version
def termination_report(pod: dict[str, Any]) -> dict[str, Any]:
    """The JSON the worker writes to its termination log (see rtj_worker.entrypoint). Shared per pod
    version (memo.py): read it, never modify it."""
    term = _terminated(pod)
    try:
        report = json.loads((term or {}).get("message") or "{}")
    except ValueError:
        return {}
    return report if isinstance(report, dict) else {}


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


# kubelet's clock (finishedAt) against the API server's (deletionTimestamp).
CLOCK_SKEW = datetime.timedelta(seconds=2)


def deleted_while_running(pod: dict[str, Any], term: dict[str, Any]) -> bool:
    """Whether the pod's deletion was asked for before its container ended (so it ended of it)."""
    asked = deletion_asked(pod)
    if asked is None:
        return False
    ended = parse_time(term.get("finishedAt"))
    return ended is None or ended >= asked - CLOCK_SKEW


def deletion_asked(pod: dict[str, Any]) -> datetime.datetime | None:
    """When the pod's deletion was asked for (deletionTimestamp is when its grace period ends)."""
    meta = pod["metadata"]
    deleted = parse_time(meta.get("deletionTimestamp"))
    if deleted is None:
        return None
    return deleted - datetime.timedelta(seconds=int(meta.get("deletionGracePeriodSeconds") or 0))


def resumed_at(job: dict[str, Any] | None) -> datetime.datetime | None:
    """When the Job was last resumed (its Suspended condition turned False), if it ever was suspended."""
    cond = get_condition(((job or {}).get("status") or {}).get("conditions") or [], "Suspended")
    return parse_time(cond.get("lastTransitionTime")) if cond and cond.get("status") == "False" else None


def stopped_by_suspend(pods: list[dict[str, Any]], job: dict[str, Any] | None) -> frozenset[str]:
    """Pods whose deletion was asked for before the Job's last resume: a suspend's (the Job controller
    deletes a suspended Job's pods), even when their end shows only after the resume."""
    resumed = resumed_at(job)
    if resumed is None:
        return frozenset()
    return frozenset(p["metadata"].get("uid", p["metadata"]["name"]) for p in pods
                     if (asked := deletion_asked(p)) is not None and asked <= resumed + CLOCK_SKEW)


def _seconds(delta: datetime.timedelta) -> str:
    return "ever" if delta == datetime.timedelta.max else f"{int(delta.total_seconds())}s"


def fencing(node: dict[str, Any] | None, cloud: str = "") -> str:
    """Evidence that nothing runs on a node any more (what makes a forced delete safe), or ''.
    `cloud`: what a cloud check said (fencing.py), e.g. that its EC2 instance is terminated."""
    if node is None:
        return "its Node object is deleted"
    ready = get_condition((node.get("status") or {}).get("conditions") or [], "Ready") or {}
    # As PodGC: the out-of-service taint fences a node that is also not Ready (a person's or an
    # automation's word that it is shut down); on a Ready node its kubelet still runs the pods.
    if ready.get("status") != "True" and any(
            t.get("key") == OUT_OF_SERVICE for t in node.get("spec", {}).get("taints") or []):
        return f"it is tainted {OUT_OF_SERVICE}"
    return cloud


def classify(pod: dict[str, Any], node: dict[str, Any] | None, now: datetime.datetime,
             timing: Timing, plan: Plan | None = None, fenced: str = "", sick: str = "") -> Finding | None:
    """What this pod's state means for the job; `plan` learns when a grace period ends and what waits.
    `fenced`: the evidence (fencing()) that its node runs nothing any more, if any; `sick`: why its
    (Ready) node cannot train (health.unhealthy), if so."""
    meta, status = pod["metadata"], pod.get("status", {})
    name, uid = meta["name"], meta.get("uid", meta["name"])
    node_name = pod.get("spec", {}).get("nodeName")
    lost, lost_for = node_loss(node, now) if node_name else ("", datetime.timedelta(0))
    phase = status.get("phase")
    disruption = _disruption(pod)

    def found(kind: str, reason: str, message: str, action: str = "", lost_node: str = "", detail: str = "",
              age: float = 0.0) -> Finding:
        return Finding(name, uid, kind, reason, message, action, lost_node, age, node_name or "", detail)

    if meta.get("deletionTimestamp") and phase not in ("Failed", "Succeeded"):
        # deletionTimestamp is when the grace period ends; timeouts count from there.
        overdue = now - (parse_time(meta["deletionTimestamp"]) or now)
        if node_name and fenced:
            # Nothing runs there any more: fail and delete the pod as PodGC does, so the Job controller
            # (which keeps an index until its pod is Failed) replaces it. Never without this evidence: a
            # node that lost the API server may still run its ranks, and a replacement would be a second
            # process of the same node rank, writing the same checkpoints.
            return found(PLATFORM_FAULT, lost or "NodeFenced", f"pod {name} terminating on node {node_name}, "
                         f"which runs nothing any more ({fenced})", FORCE, node_name)
        if lost:
            # Its kubelet cannot confirm the deletion; the Job controller keeps the index until the pod
            # is Failed. Wait for fencing, and say so.
            if plan is not None:
                plan.unfenced[node_name] = (name, lost, overdue.total_seconds())
            return found(PLATFORM_FAULT, lost, f"pod {name} terminating on lost node {node_name}",
                         lost_node=node_name)
        if overdue >= timing.terminating_timeout and plan is not None:
            plan.stuck[name] = (node_name or "", overdue.total_seconds())
        elif overdue > -datetime.timedelta(days=1) and plan is not None:
            plan.wait(max(1.0, (timing.terminating_timeout - overdue).total_seconds()))
        if disruption:
            # Evicted, drained or preempted on a healthy node: the kubelet finishes it; count it now.
            return found(PLATFORM_FAULT, disruption.get("reason") or "Disrupted",
                         disruption.get("message") or f"pod {name} is being disrupted")
        return None

    if phase == "Failed":
        if disruption:
            return found(PLATFORM_FAULT, disruption.get("reason") or "Disrupted",
                         disruption.get("message") or f"pod {name} was disrupted")
        if status.get("reason") in PLATFORM_POD_REASONS:
            return found(PLATFORM_FAULT, status["reason"], status.get("message") or status["reason"])
        if lost:
            return found(PLATFORM_FAULT, lost, f"pod {name} failed on lost node {node_name}", lost_node=node_name)
        if sick:
            # Its ranks failed on hardware the node's own health agent reports bad: the platform's fault.
            return found(PLATFORM_FAULT, UNHEALTHY, f"pod {name} failed on node {node_name}, which cannot train: "
                         f"{sick}", lost_node=node_name)
        term = _terminated(pod) or {}
        code = term.get("exitCode")
        if deleted_while_running(pod, term):
            # Someone deleted it (kubectl delete, a controller, a suspend) and it ended of that, whatever
            # it exited with (ft_launcher turns SIGTERM into 1): not the job's fault.
            return found(PLATFORM_FAULT, "PodDeleted", f"pod {name} was deleted while running (exit code {code})")
        report = termination_report(pod)
        detail = str(report.get("reason") or term.get("reason") or "")
        message = f"pod {name} exited with code {code}" + (f": {detail}" if detail else "")
        if isinstance(report.get("lines"), list) and report["lines"]:
            # The last lines of a rank's traceback (the worker bounds them), where the user looks.
            message += "; its last lines: " + " | ".join(str(line) for line in report["lines"])[-MAX_LINES_CHARS:]
        if code in EXIT_CODES:
            kind, reason = EXIT_CODES[code]
            age = 0.0
            if FINDINGS[kind].payer == PEERS:  # decided by its cause: when it ended matters
                ended = parse_time(term.get("finishedAt")) or now
                age = max(0.0, (now - ended).total_seconds())
            return found(kind, reason, message, age=age, detail=detail)
        if term.get("reason") == "OOMKilled":
            return found(JOB_FAILURE, "OOMKilled", message)
        return found(JOB_FAILURE, f"ExitCode{code}" if code is not None else "PodFailed", message)

    if phase in ("Pending", "Running") and lost:
        if node_name and fenced and lost != NODE_DELETED:
            # Nothing runs there any more, so there is no blip to wait out and no rank to spare: failed and
            # deleted now, as PodGC does (a deleted Node's pod goes through the eviction below at once).
            return found(PLATFORM_FAULT, lost, f"node {node_name} of pod {name} is lost ({lost} for "
                         f"{_seconds(lost_for)}) and runs nothing any more ({fenced})", FORCE, node_name)
        # Not fenced: its ranks may still run (a kubelet restart, a network blip), and a replacement would
        # wait for fencing anyway. Upstream's taint eviction waits 300 s (tolerationSeconds); so does the
        # default grace.
        if lost_for >= timing.node_grace:
            return found(PLATFORM_FAULT, lost, f"node {node_name} of pod {name} is lost ({lost} for "
                         f"{_seconds(lost_for)})", EVICT, node_name)
        if plan is not None:
            plan.wait((timing.node_grace - lost_for).total_seconds())
            plan.in_grace[node_name] = (name, lost, lost_for.total_seconds())
        return None

    if phase in ("Pending", "Running") and sick and node_name:
        # A health agent's verdict, not a blip: no grace period. The kubelet still works, so a graceful
        # eviction ends the pod (its ranks save within their grace period) and nothing needs fencing.
        return found(PLATFORM_FAULT, UNHEALTHY, f"node {node_name} of pod {name} cannot train: {sick}", EVICT,
                     node_name)

    waiting = _waiting(pod)
    if waiting:
        reason = waiting.get("reason", "")
        started = parse_time(status.get("startTime") or meta.get("creationTimestamp")) or now
        grace = WAITING_GRACE.get(reason)
        if reason in PERMANENT_WAITING or (grace is not None and now - started >= grace):
            return found(PERMANENT, reason, waiting.get("message") or f"pod {name}: {reason}")
        if grace is not None and plan is not None:
            plan.wait((grace - (now - started)).total_seconds())
    return None


def plan(pods: list[dict[str, Any]], nodes: dict[str, dict[str, Any] | None], seen: set[str],
         now: datetime.datetime, timing: Timing, cloud: dict[str, str] | None = None,
         zones: dict[str, tuple[int, int]] | None = None, coordinator: dict[str, Any] | None = None,
         rules: health.NodeHealth = health.DEFAULT) -> Plan:
    """Classify every pod; new findings (uids not in `seen`) are to be charged by the caller.
    `cloud`: fencing evidence from a cloud check, by node; `zones`: (nodes, lost nodes) of the zones
    of the gang's lost nodes, for the mass-loss brake; `coordinator`: the gang's coordinator pod;
    `rules`: which node conditions and labels mean a Ready node cannot train."""
    result = Plan()
    if coordinator is not None:
        node_name = coordinator.get("spec", {}).get("nodeName") or ""
        found = coordinator_finding(coordinator, nodes.get(node_name), now, timing,
                                    fencing(nodes.get(node_name), (cloud or {}).get(node_name, "")), result)
        if found is not None:
            if found.action:
                result.actions.append(found)
            if found.uid not in seen:
                result.findings.append(found)
    evidence = {name: fencing(node, (cloud or {}).get(name, "")) for name, node in nodes.items()}
    for name, node in nodes.items():
        if lost := node_loss(node, now)[0]:
            result.lost_nodes[name] = lost
    result.brake = _brake(result.lost_nodes, evidence, len(nodes), zones or {})
    for name, node in nodes.items():
        if name not in result.lost_nodes and (why := health.unhealthy(node, rules)):
            result.unhealthy[name] = why
    result.health_brake = _health_brake(result.unhealthy, len(nodes))
    for pod in pods:
        node_name = pod.get("spec", {}).get("nodeName") or ""
        if (_steady(pod) and (not node_name or node_name in nodes) and node_name not in result.lost_nodes
                and node_name not in result.unhealthy):
            continue  # classify finds nothing and waits for nothing: most of a big gang's pods, each pass
        if why := unschedulable(pod):
            result.unschedulable[pod["metadata"]["name"]] = why
        finding = classify(pod, nodes.get(node_name), now, timing, result, evidence.get(node_name, ""),
                           result.unhealthy.get(node_name, ""))
        if finding is None:
            continue
        if result.brake and finding.action == EVICT:
            continue  # not a fault of this node: nothing is evicted or charged while most nodes are dark
        if result.health_brake and finding.action == EVICT and finding.lost_node in result.unhealthy:
            continue  # nor while most of the gang's nodes are reported unhealthy at once
        if finding.action:
            result.actions.append(finding)
        if finding.uid not in seen:
            result.findings.append(finding)
    return result


@per_version
def _steady(pod: dict[str, Any]) -> bool:
    """A pod that classify() passes over on a node neither lost nor unhealthy, at any time: pending or
    running, not being deleted, no container waiting, not left unscheduled by the scheduler."""
    phase = (pod.get("status") or {}).get("phase")
    return (not pod["metadata"].get("deletionTimestamp") and phase in ("Pending", "Running")
            and _waiting(pod) is None and not unschedulable(pod))


def coordinator_finding(pod: dict[str, Any], node: dict[str, Any] | None, now: datetime.datetime, timing: Timing,
                        fenced: str, plan: Plan) -> Finding | None:
    """The coordinator read as any pod (classify), then as what its loss means: its rendezvous is gone.
    Deleted or evicted by anyone but the operator (whose own deletions are settled in status first, never
    charged): a drain, a consolidation, `kubectl delete`. It exits 0 on SIGTERM, so once ended it reads
    Succeeded; it is the platform's loss all the same (issue 29.4: the workers' exits for their lost store
    were charged to the job), found as soon as it is Terminating."""
    deleted = bool(pod["metadata"].get("deletionTimestamp")) or bool(_disruption(pod))
    succeeded = (pod.get("status") or {}).get("phase") == "Succeeded"
    if succeeded and not deleted:
        return None  # nvrx-control ends once the gang stopped; the workers say why
    found = None if succeeded else classify(pod, node, now, timing, plan, fenced)
    if found is None and deleted:
        name = pod["metadata"]["name"]
        found = Finding(name, pod["metadata"].get("uid", name), PLATFORM_FAULT, "PodDeleted",
                        f"pod {name} was deleted or evicted before its gang ended (a drain, a consolidation, "
                        "kubectl delete)", node=pod.get("spec", {}).get("nodeName") or "")
    if found is None:
        return None
    if found.kind == PERMANENT:
        return found
    if found.reason == CONTROL_FAILED:
        return Finding(found.pod, found.uid, CONTROL_FAILED, CONTROL_FAILED, f"the coordinator: {found.message}",
                       found.action, found.lost_node, found.age)
    kind = COORDINATOR_LOST if found.kind == PLATFORM_FAULT else COORDINATOR_FAILED
    return Finding(found.pod, found.uid, kind, kind, f"the coordinator ({found.reason}): {found.message}",
                   found.action, found.lost_node, found.age)


def unschedulable(pod: dict[str, Any]) -> str:
    """The scheduler's message if it finds no node for a pending pod (PodScheduled False, Unschedulable)."""
    if pod.get("spec", {}).get("nodeName") or pod["metadata"].get("deletionTimestamp"):
        return ""
    cond = next((c for c in (pod.get("status") or {}).get("conditions") or [] if c.get("type") == "PodScheduled"),
                None)
    if cond and cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
        return cond.get("message") or "no node fits"
    return ""


# Upstream's zone disruption (pkg/controller/nodelifecycle: unhealthyZoneThreshold 0.55, more than 2
# nodes not ready): many nodes going dark at once is the network or the control plane, not that many
# node failures. Applied to the gang's own nodes and to their zones.
BRAKE_FRACTION, BRAKE_MIN_NODES = 0.55, 2


def _health_brake(unhealthy: dict[str, str], gang_nodes: int) -> str:
    """The mass-loss brake's rule for health verdicts: two or more of the gang's nodes, and 55 % of them,
    reported unhealthy at once is more likely the health agent (a bad rollout, a shared dependency such as
    a driver or fabric manager update) than that many bad GPUs; evicting them all would stop the job for a
    verdict that may be wrong, so none is evicted for health until fewer are reported."""
    if len(unhealthy) >= BRAKE_MIN_NODES and len(unhealthy) >= BRAKE_FRACTION * gang_nodes:
        return (f"{len(unhealthy)} of the gang's {gang_nodes} nodes reported unhealthy at once "
                f"({', '.join(sorted(unhealthy))})")
    return ""


def _brake(lost: dict[str, str], evidence: dict[str, str], gang_nodes: int,
           zones: dict[str, tuple[int, int]]) -> str:
    dark = [n for n in lost if not evidence.get(n)]
    if len(dark) >= BRAKE_MIN_NODES and len(dark) >= BRAKE_FRACTION * gang_nodes:
        return f"{len(dark)} of the gang's {gang_nodes} nodes went dark at once ({', '.join(sorted(dark))})"
    for zone, (total, down) in sorted(zones.items()):
        if total and (down == total or (down > 2 and down >= BRAKE_FRACTION * total)):
            return f"{down} of {total} nodes in zone {zone} are NotReady or unreachable"
    return ""


# --- one fault, one charge -----------------------------------------------------------------------
@dataclass(frozen=True)
class Fault:
    """The fault being recovered in this attempt, from its first charge until the gang runs again: the
    lost nodes charged already, how many faults were charged, and whether one was the platform's."""

    attempt: int
    nodes: tuple[str, ...] = ()
    faults: int = 0
    platform: bool = False


# Why attribute() charged nobody.
FAILS, DUPLICATE, EXCUSED, HOLD, SUSPENDED, FINISHED = (
    "fails", "duplicate", "excused", "hold", "suspended", "finished")
SHORT_OF_CAPACITY = "a pod of the gang finds no node (WaitingForCapacity)"


@dataclass(frozen=True)
class Charge:
    """attribute()'s decision for one finding."""

    finding: Finding
    payer: str  # JOB | PLATFORM | NOBODY
    tier: str | None = None
    message: str = ""
    why: str = ""  # for NOBODY: FAILS (the job fails instead), DUPLICATE, EXCUSED (NotCharged), HOLD, SUSPENDED,
    # FINISHED
    hold: float = 0.0  # HOLD: decide again in this many seconds (the finding stays unseen)
    cause: str = ""  # EXCUSED: what it follows from, when not the fault being recovered
    correlated: bool = False  # PLATFORM: a node lost in the same event as one charged already (not counted again)

    @property
    def seen(self) -> bool:
        """Whether the finding is settled (its pod never charged again)."""
        return self.why != HOLD


def attribute(findings: list[Finding], fault: Fault, lost_nodes: dict[str, str],
              suspended: bool = False, capacity: bool = False,
              stopped_by_suspend: frozenset[str] = frozenset(), lost: frozenset[str] = frozenset(),
              window_open: bool = False, finished: bool = False) -> tuple[list[Charge], Fault]:
    """Who pays for each new finding, in CHARGE_ORDER: one fault, one charge.

    - Once the gang has `finished` (the Job's success rule met: pods.success_met), nobody: the Job
      controller stops whatever still runs (a lost index's replacement that found a node only once a
      trainer's exit freed one), and that pod's exit is this stop.
    - While the job is suspended (by the user or a queue), or being suspended, nothing is charged: the
      Job controller deletes the pods, and their exits are that deletion; so are the exits of pods
      deleted before the Job's last resume (`stopped_by_suspend`, by uid), seen only after it.
    - Node 0 hosts the rendezvous store, so when its node is lost (or its pod fails) every other pod's
      launcher exits too, and says so (RendezvousHostLost, a PEER finding), usually before the control
      plane has marked the node NotReady. A PEER failure is charged as the disruption of a lost node of
      the gang if there is one not charged yet (that node's own finding is then not charged again);
      else, while a fault of this attempt is being recovered, it is that fault's consequence, like
      every other PEER failure of it; else it waits up to PEER_ATTRIBUTION_SECONDS for its cause to
      show, and is then charged to the job (and is the fault the later ones follow from).
    - So is a failed rendezvous (RENDEZVOUS, CONTROL_FAILED) while a node of the gang is lost and not
      charged yet: with nodeLossGraceSeconds at upstream's 300 s, a survivor's rendezvous may give up
      before the lost node's pod is evicted.
    - While a platform fault is recovered (its replacement not running yet: unschedulable for lack of
      capacity, or still starting), the survivors' failed rendezvous are its consequences too; so are
      they while a pod of the gang finds no node (`capacity`), whatever attempt the gang is at: no
      rendezvous can complete without that pod. So are a peer's exits then (its gang stopped because a
      survivor gave up on that rendezvous): with too few nodes the pods take turns on the ones there are.
    - Nodes lost in one event are one disruption: a node of `lost` (not one a health agent reports bad)
      lost while a loss of this fault is charged already, in this pass or, with `window_open`, in one
      of the last CORRELATED_LOSS_SECONDS, is charged to the platform as a restart of its pod (it is
      replaced) but not as another disruption (`correlated`).
    A job that keeps failing still ends Failed: each new fault, once the gang has recovered, is charged."""
    charges: list[Charge] = []
    nodes, faults, platform = list(fault.nodes), fault.faults, fault.platform
    charged_once: set[str] = set()  # kinds charged once per attempt, charged in this pass
    losses_now: list[str] = []  # lost nodes (of `lost`) charged in this pass

    def first_loss() -> str | None:
        """The lost node an event's later losses are counted with, if the window is open."""
        if losses_now:
            return losses_now[0]
        return next((n for n in fault.nodes if n in lost), None) if window_open else None
    for f in sorted(findings, key=lambda f: CHARGE_ORDER.get(f.kind, 1)):
        meaning = f.meaning
        if finished:
            charges.append(Charge(f, NOBODY, why=FINISHED))
            continue
        if suspended or f.uid in stopped_by_suspend:
            charges.append(Charge(f, NOBODY, why=SUSPENDED))
            continue
        if meaning.fails:
            charges.append(Charge(f, NOBODY, why=FAILS))
            continue
        if f.lost_node and f.lost_node in nodes:
            charges.append(Charge(f, NOBODY, why=DUPLICATE))  # charged already, through a pod of its gang
            continue
        if f.kind in (RENDEZVOUS, UNRESOLVED, CONTROL_FAILED) and (platform or capacity):
            # Not charged, yet a new gang all the same: the launcher that timed out closed the gang's
            # rendezvous for good (NVRx 0.6's barrier and torch's c10d alike), so no pod joins it again.
            charges.append(Charge(f, NOBODY, meaning.tier, message=f.message, why=EXCUSED,
                                  cause="" if platform else SHORT_OF_CAPACITY))
            continue
        if meaning.once_per == ATTEMPT:
            if f.kind in charged_once:
                charges.append(Charge(f, NOBODY, why=DUPLICATE))  # every pod reports the same failure
                continue
            charged_once.add(f.kind)
        payer, message = meaning.payer, f.message
        if payer == PLATFORM and f.lost_node in lost and (first := first_loss()) is not None:
            charges.append(Charge(f, PLATFORM, meaning.tier, f"{f.message} (lost in the same event as node "
                                                             f"{first}: not another disruption)", correlated=True))
            nodes.append(f.lost_node)
            continue
        if payer == PEERS or f.kind in (RENDEZVOUS, CONTROL_FAILED):
            # A rendezvous that could not complete while a node of the gang is lost (NotReady within
            # nodeLossGraceSeconds, its pod not charged yet) waited for that node: its disruption.
            if peers := [n for n in sorted(lost_nodes) if n not in nodes]:
                nodes.append(peers[0])
                if peers[0] in lost:
                    losses_now.append(peers[0])
                faults, platform = faults + 1, True
                charges.append(Charge(f, PLATFORM, meaning.tier, f"{f.message} (node {peers[0]} of its gang is "
                                                                  f"lost: {lost_nodes[peers[0]]})"))
                continue
        if payer == PEERS:
            if faults or capacity:
                # Not charged; a closed rendezvous still takes a new gang (no pod can join it again).
                charges.append(Charge(f, NOBODY, meaning.tier if meaning.tier == GANG_RESTART else None,
                                      message=f.message, why=EXCUSED, cause="" if faults else SHORT_OF_CAPACITY))
                continue
            if f.age < PEER_ATTRIBUTION_SECONDS:
                charges.append(Charge(f, NOBODY, why=HOLD, hold=max(0.5, PEER_ATTRIBUTION_SECONDS - f.age)))
                continue
            payer = JOB
        charges.append(Charge(f, payer, meaning.tier, message))
        if f.lost_node:
            nodes.append(f.lost_node)
            if f.lost_node in lost and payer == PLATFORM:
                losses_now.append(f.lost_node)
        faults, platform = faults + 1, platform or payer == PLATFORM
    return charges, Fault(fault.attempt, tuple(nodes), faults, platform)


def over_budget(counters: dict[str, int], budget: dict[str, int], last: str, step: int) -> tuple[str, str] | None:
    """The first spent budget in BUDGETS order, as (Failed reason, message). `counters`: as budget_counts
    gives them (within the window, where there is one)."""
    window = int(budget.get("windowSeconds") or 0)
    for b in BUDGETS:
        n, limit = int(counters.get(b.counter, 0)), int(budget[b.limit])
        if n > limit:
            within = f" within {window} s (restartBudget.windowSeconds)" if window and b.windowed else ""
            return b.reason, b.message.format(n=n, limit=limit, last=last, step=step, within=within)
    return None


def charges_in_window(times: list[str], now: datetime.datetime, window: int, keep: int) -> list[str]:
    """The times of a budget's charges (oldest first) that still count against it: those less than
    `window` seconds old, at most the newest `keep` (its limit + 1 is all a verdict needs, so the list in
    status stays bounded)."""
    since = now - datetime.timedelta(seconds=window)
    recent = [t for t in times if (when := parse_time(t)) is not None and when > since]
    return recent[-keep:] if keep > 0 else []


def budget_counts(lifetime: dict[str, int], times: dict[str, list[str]], budget: dict[str, int],
                  now: datetime.datetime) -> dict[str, int]:
    """What counts against each budget now: the job's lifetime counters, except that with
    restartBudget.windowSeconds the windowed budgets count only their charges within the window."""
    window = int(budget.get("windowSeconds") or 0)
    counts = dict(lifetime)
    if window:
        for b in BUDGETS:
            if b.windowed:
                counts[b.counter] = len(charges_in_window(times.get(b.counter) or [], now, window,
                                                          int(budget[b.limit]) + 1))
    return counts


def job_verdict(job: dict[str, Any]) -> tuple[Verdict, dict[str, Any]] | None:
    """The Job's FailureTarget or Failed condition and what it means, if it has one."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") in ("FailureTarget", "Failed") and cond.get("status") == "True":
            return JOB_VERDICTS.get(cond.get("reason") or "", DEFAULT_VERDICT), cond
    return None


def replacement_backoff(failed_pods: int) -> float:
    """Seconds the Job controller waits before it creates the replacement of the next failed pod, for
    a Job without per-index limits (one made by an earlier operator): it counts every failed pod."""
    if failed_pods <= 0:
        return 0.0
    return min(JOB_BACKOFF_MAX, JOB_BACKOFF_BASE * 2 ** min(failed_pods - 1, 16))


INDEX = "batch.kubernetes.io/job-completion-index"
INDEX_FAILURES = "batch.kubernetes.io/job-index-failure-count"
INDEX_IGNORED = "batch.kubernetes.io/job-index-ignored-failure-count"
JOB_TRACKING = "batch.kubernetes.io/job-tracking"


def _int(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def failure_time(pod: dict[str, Any]) -> datetime.datetime | None:
    """When the Job controller counts a pod as failed (pkg/controller/job/backoff_utils.go
    getFinishedTime): its containers' last finishedAt, else Ready=False, else the deletion request,
    else its creation."""
    meta, status = pod["metadata"], pod.get("status") or {}
    finished = [parse_time((cs.get("state") or {}).get("terminated", {}).get("finishedAt"))
                for cs in status.get("containerStatuses") or []]
    if finished and all(finished):
        return max(t for t in finished if t is not None)
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    if ready and ready.get("status") == "False" and ready.get("lastTransitionTime"):
        return parse_time(ready["lastTransitionTime"])
    if meta.get("deletionTimestamp"):
        deleted = parse_time(meta["deletionTimestamp"])
        if deleted is not None:
            return deleted - datetime.timedelta(seconds=_int(meta.get("deletionGracePeriodSeconds")))
    return parse_time(meta.get("creationTimestamp"))


def replacement_due(pods: list[dict[str, Any]], now: datetime.datetime) -> dict[int, tuple[float, float]]:
    """For each index whose pod failed and is not replaced yet: (the Job controller's back-off, seconds
    left of it). With per-index limits the delay is per index, from its last failed pod (that still
    holds the Job's tracking finalizer): 10 s x 2^(failures + ignored failures), capped at 600 s, from
    when that pod failed (pkg/controller/job/backoff_utils.go, indexed_job_utils.go)."""
    active = {_int((p["metadata"].get("annotations") or {}).get(INDEX)) for p in pods
              if (p.get("status") or {}).get("phase") in ("Pending", "Running") and not p["metadata"].get(
                  "deletionTimestamp")}
    last: dict[int, tuple[int, datetime.datetime, dict[str, Any]]] = {}
    for pod in pods:
        meta = pod["metadata"]
        annotations = meta.get("annotations") or {}
        if (pod.get("status") or {}).get("phase") != "Failed" or JOB_TRACKING not in (meta.get("finalizers") or []):
            continue
        index = _int(annotations.get(INDEX))
        if index in active:
            continue
        count = _int(annotations.get(INDEX_FAILURES)) + _int(annotations.get(INDEX_IGNORED))
        when = failure_time(pod) or now
        if index not in last or (count, when) > last[index][:2]:
            last[index] = (count, when, pod)
    due = {}
    for index, (count, when, _) in last.items():
        delay = min(JOB_BACKOFF_MAX, JOB_BACKOFF_BASE * 2 ** min(count, 16))
        due[index] = (delay, max(0.0, delay - (now - when).total_seconds()))
    return due
