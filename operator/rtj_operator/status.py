"""The RTJ's status as types: what a pass reads and writes, with the recovery ledger (what the
operator must remember between passes to count each fault once). The CRD's status schema
(api.STATUS_SCHEMA) describes the same fields; tests/unit/test_status.py keeps the two in step.

Everything the operator remembers lives here, in the RTJ's status, so an operator restart or a
deleted child cannot reset a budget or count a failure twice.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any

from . import ladder
from .copies import clone


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _snake(name: str) -> str:
    return re.sub(r"([A-Z])", lambda m: "_" + m[1].lower(), name)


@dataclass
class Ledger:
    """status.recovery: the bookkeeping of the recovery in progress."""

    # Pods (uids) whose findings were settled: charged, or deliberately not. Bounded by the pods listed.
    seen_pods: list[str] = field(default_factory=list)
    # The fault being recovered in this attempt (see ladder.attribute), and once the gang's pods run
    # again, until when what follows is still its consequence (then it is forgotten).
    charged: ladder.Fault | None = None
    fault_settles_at: str = ""
    # A new gang attempt was decided and its Job not created yet: why.
    pending_gang_restart: str = ""
    gang_restart_time: str = ""
    # What the Job controller delays the next replacement pod by, as last reported in an event.
    replacement_backoff_seconds: float | None = None
    # The gang is suspended because a pod of it stayed unschedulable (since when): it resumes once the
    # scheduler placed every capacity probe (builders/probe.py).
    suspended_for_capacity: str = ""
    # When the gang first lacked capacity, kept across suspend and resume cycles until every index has a node:
    # what restartBudget.capacityTimeoutSeconds counts from (a gang resumed for room that another workload
    # took before its pods were placed is still waiting).
    capacity_wait_since: str = ""
    # The operator suspended the Job (for spec.suspend or for capacity): only then does it un-suspend it;
    # a Job suspended by anyone else (a queue) is left suspended.
    suspended_job: bool = False
    # Pods (uids) whose eviction a PodDisruptionBudget refused, reported once (retried all the same).
    evictions_refused: list[str] = field(default_factory=list)
    # Failures charged to the job, by node: a node that fails the job's pods again is excluded.
    node_failures: dict[str, int] = field(default_factory=dict)
    # What each pod's progress report (progress.py) said and is already counted in status: pod uid ->
    # {inProcess, launcher, inLoopSeconds, causes}; only pods with something to count, only pods listed.
    reports: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The in-job recoveries an event was posted for, by tier: {count, time} (events are rate-limited).
    events: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The step the job had reached when the operator charged the fault it is recovering.
    step_at_fault: int | None = None
    # With restartBudget.windowSeconds: the times of the charges that still count, per budget counter
    # (jobRestarts, disruptions), oldest first, at most the budget's limit + 1 (ladder.charges_in_window).
    charge_times: dict[str, list[str]] = field(default_factory=dict)
    # The lost leader's run: the step time (Unix seconds) its counted in-loop time ends at, until the other
    # pods' reports say where that run ended (progress.close_lost_leader).
    leader_gap: float | None = None
    # The newest attempt whose ranks were seen started (a pod reported Training or Started, or no pod of it
    # reports at all): from then on that gang is Running whenever its pods are (policies/phase.ranks_started).
    trained_attempt: int | None = None

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Ledger:
        data = data or {}
        charged = data.get("charged")
        return cls(
            seen_pods=list(data.get("seenPods") or []),
            charged=ladder.Fault(int(charged.get("attempt", 0)), tuple(charged.get("nodes") or ()),
                                 int(charged.get("faults", 0)), bool(charged.get("platform")))
            if isinstance(charged, dict) else None,
            fault_settles_at=data.get("faultSettlesAt") or "",
            pending_gang_restart=data.get("pendingGangRestart") or "",
            gang_restart_time=data.get("gangRestartTime") or "",
            replacement_backoff_seconds=data.get("replacementBackoffSeconds"),
            suspended_for_capacity=data.get("suspendedForCapacity") or "",
            capacity_wait_since=data.get("capacityWaitSince") or "",
            suspended_job=bool(data.get("suspendedJob")),
            evictions_refused=list(data.get("evictionsRefused") or []),
            node_failures={str(k): int(v) for k, v in (data.get("nodeFailures") or {}).items()},
            reports=clone(dict(data.get("reports") or {})),
            events=clone(dict(data.get("events") or {})),
            step_at_fault=data.get("stepAtFault"),
            charge_times={str(k): [str(t) for t in v or []] for k, v in (data.get("chargeTimes") or {}).items()},
            leader_gap=data.get("leaderGap"),
            trained_attempt=data.get("trainedAttempt"),
        )

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.seen_pods:
            out["seenPods"] = list(self.seen_pods)
        if self.charged is not None and (self.charged.nodes or self.charged.faults):
            out["charged"] = {"attempt": self.charged.attempt, "nodes": list(self.charged.nodes),
                              "faults": self.charged.faults, "platform": self.charged.platform}
        if self.charged is not None and self.fault_settles_at:
            out["faultSettlesAt"] = self.fault_settles_at
        if self.pending_gang_restart:
            out["pendingGangRestart"] = self.pending_gang_restart
        if self.gang_restart_time:
            out["gangRestartTime"] = self.gang_restart_time
        if self.replacement_backoff_seconds is not None:
            out["replacementBackoffSeconds"] = self.replacement_backoff_seconds
        if self.suspended_for_capacity:
            out["suspendedForCapacity"] = self.suspended_for_capacity
        if self.capacity_wait_since:
            out["capacityWaitSince"] = self.capacity_wait_since
        if self.evictions_refused:
            out["evictionsRefused"] = list(self.evictions_refused)
        if self.suspended_job:
            out["suspendedJob"] = True
        if self.node_failures:
            out["nodeFailures"] = dict(self.node_failures)
        if self.reports:
            out["reports"] = clone(self.reports)
        if self.events:
            out["events"] = clone(self.events)
        if self.step_at_fault is not None:
            out["stepAtFault"] = self.step_at_fault
        if self.leader_gap:
            out["leaderGap"] = self.leader_gap
        if self.trained_attempt is not None:
            out["trainedAttempt"] = self.trained_attempt
        if any(self.charge_times.values()):
            out["chargeTimes"] = {k: list(v) for k, v in self.charge_times.items() if v}
        return out


@dataclass
class Status:
    """status of a ResilientTrainingJob. Unset optional fields are left out of the written status."""

    phase: str = ""
    observed_generation: int | None = None
    conditions: list[dict[str, Any]] = field(default_factory=list)
    nodes_desired: int | None = None  # training nodes
    nodes_ready: int | None = None  # training nodes whose pod runs and is ready (at most nodes_desired)
    standbys: int | None = None  # ready pods beyond the training nodes: hot spares waiting
    attempt: int = 1  # the gang (Job) that should run now
    restarts: int = 0  # every restart, all tiers: the pods' own (InProcess, Launcher) and the operator's
    restarts_by_tier: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ladder.ALL_TIERS, 0))
    # Restarts by (tier, reason, who was charged): [{tier, reason, charged, count}], bounded (metrics).
    restart_counts: list[dict[str, Any]] = field(default_factory=list)
    job_restarts: int = 0  # charged to the job (restartBudget.maxRestarts)
    disruptions: int = 0  # charged to the platform (restartBudget.maxDisruptions)
    restarts_without_progress: int = 0
    step_at_last_restart: int | None = None
    last_failure_reason: str | None = None
    last_failure_message: str | None = None
    last_checkpoint_step: int | None = None
    last_checkpoint_time: str | None = None
    restart_started_time: str | None = None  # set while recovering
    last_recovery_seconds: float | None = None
    # Nodes kept out of the job's placement until a time: [{node, reason, until}] (policies/placement.exclude).
    excluded_nodes: list[dict[str, str]] = field(default_factory=list)
    # Kueue: {name, workload, admitted, clusterQueue} while the gang is submitted to a queue.
    queue: dict[str, Any] | None = None
    # The newest recovery of any tier: {tier, reason, message, seconds, stepsRolledBack, time, pod}.
    last_recovery: dict[str, Any] | None = None
    # Live progress from the pods' reports (progress.py) and goodput so far.
    progress: dict[str, Any] | None = None
    goodput: dict[str, Any] | None = None
    # The checkpoint interval, measured and applied (policies/interval.py).
    checkpoint_interval: dict[str, Any] | None = None
    # The pods' grace period for a stop, applied and measured (policies/grace.py).
    stop_grace: dict[str, Any] | None = None
    start_time: str | None = None
    completion_time: str | None = None
    recovery: Ledger = field(default_factory=Ledger)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> Status:
        data = clone(data or {})
        names = {f.name for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in data.items():
            name = _snake(key)
            if name in names and value is not None:
                values[name] = value
        values["recovery"] = Ledger.from_dict(data.get("recovery"))
        status = cls(**values)
        for tier in ladder.ALL_TIERS:
            status.restarts_by_tier.setdefault(tier, 0)
        return status

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "recovery":
                value = value.to_dict()
            if value is None or (f.name in ("phase", "recovery", "excluded_nodes", "restart_counts") and not value):
                continue
            out[_camel(f.name)] = clone(value)
        return out


def status_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """A JSON merge patch (RFC 7386) from old to new status (None when equal): nested objects are
    merged by the server, so a key gone from one (status.recovery.pendingGangRestart) must be null."""
    patch: dict[str, Any] = {}
    for key, value in new.items():
        before = old.get(key)
        if before == value:
            continue
        if isinstance(value, dict) and isinstance(before, dict):
            patch[key] = status_patch(before, value) or {}
        else:
            patch[key] = value
    patch.update({k: None for k in old if k not in new})
    return patch or None
