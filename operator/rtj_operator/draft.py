"""The pass being computed (Draft) and what it yields (Intent: status, actions, events, metrics, and
when to look again: Requeue). Every policy (policies/) writes into the Draft; reconcile.py orders them.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from dataclasses import dataclass, field

from . import conditions, health, ladder, metrics
from .actions import Action
from .policies.pods import attempt_job_name
from .status import Status
from .world import World

# Seconds until the next look while something is in flight; a quiet job is looked at less often.
# Watch events (the RTJ, its children, its pods, their nodes) wake a job earlier.
BUSY_SECONDS = 2.0
IDLE_SECONDS = 60.0


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
    # The PriorityClass of capacity probes (--capacity-probe-priority-class; builders/probe.py): "" leaves
    # them the namespace's default priority.
    capacity_probe_priority_class: str = ""


class Draft:
    """The pass being computed: the new status, actions, events, and when to look again."""

    def __init__(self, world: World, now: datetime.datetime, config: Config | None = None):
        self.world, self.now = world, now
        self.config = config or Config()
        self.rtj = world.typed()
        self.old = world.rtj.get("status") or {}
        self.status = Status.from_dict(self.old)
        self.actions: list[Action] = []
        self.events: list[Event] = []
        self.metrics: list[Callable[[], None]] = []
        self.recheck: float | None = None
        self.busy = False  # something is in flight: look again soon
        self.act = False  # a decision was recorded that the next pass carries out
        budget = self.rtj.spec["restartBudget"]
        self.timing = ladder.Timing(
            node_grace=datetime.timedelta(seconds=budget["nodeLossGraceSeconds"]),
            terminating_timeout=datetime.timedelta(seconds=budget["terminatingTimeoutSeconds"]))

    @property
    def job_name(self) -> str:
        """The name of status.attempt's Job (status.attempt may be ahead of the World's: a gang restart
        decided in this pass)."""
        return attempt_job_name(self.world.job, self.rtj, self.status.attempt)

    def event(self, type_: str, reason: str, message: str) -> None:
        self.events.append(Event(type_, reason, message))

    def cond(self, type_: str, status: bool, reason: str, message: str = "", restart: bool = False) -> None:
        self.status.conditions = conditions.set_condition(self.status.conditions, type_, status, reason, message,
                                                          self.rtj.generation, self.now, restart)

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
