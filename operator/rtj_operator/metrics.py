"""Prometheus metrics, served by `prometheus_client` on --metrics-port.

Operator-wide: passes, errors, API calls, jobs by phase, restarts and recovery durations by tier.
Per job (labels `namespace` and `name` only: no pod, no step, so a job's series are bounded): a
snapshot of its status taken after each status write (record_job), turned into series when Prometheus
scrapes (JobCollector), so time-based ones (checkpoint age) are current; a deleted RTJ's series go
with it (forget). Everything counted per job comes from its status, so an operator restart neither
resets nor repeats a count.
"""

from __future__ import annotations

import datetime
import threading
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client import REGISTRY, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from . import api, ladder
from .conditions import parse_time

JOBS = Gauge("rtj_jobs", "ResilientTrainingJobs by phase.", ["phase"])
RESTARTS = Counter("rtj_restarts_total", "Restarts done by the operator.", ["tier", "reason"])
# The same by who was charged: every pair a tier can take (ladder.CHARGES) exists from the start at 0, so
# that increase() counts the first restart (a series counts only from its second sample).
RESTARTS_CHARGED = Counter("rtj_restarts_charged_total", "Restarts done by the operator, by tier and who was "
                           "charged (job, platform).", ["tier", "charged"])
RECOVERY_SECONDS = Histogram(
    "rtj_recovery_seconds", "From a fault to training again: the operator's tiers until all nodes run again, "
    "the pods' own (InProcess, Launcher) until the first step after it.", ["tier"],
    buckets=(5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600),
)
RECONCILE_SECONDS = Histogram(
    "rtj_reconcile_seconds", "Duration of one pass: decide, act, write status, post events.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
RECONCILE_ERRORS = Counter("rtj_reconcile_errors_total", "Reconcile passes that raised.", ["error"])
PASSES = Counter("rtj_reconcile_passes_total", "The runtime's passes by outcome: ok, gone, deleting, not_leader, "
                 "conflict, api_error, rejected, error, crashed (runtime.OUTCOMES).", ["outcome"])
LEADER = Gauge("rtj_leader", "1 while this replica holds the leader Lease and runs passes, else 0.")
API_CALLS = Counter("rtj_api_calls_total", "Kubernetes API calls by verb and kind.", ["verb", "kind"])

PHASES = api.PHASES  # every phase the CRD allows
BUDGETS = (("maxRestarts", "jobRestarts"), ("maxDisruptions", "disruptions"),
           ("maxRestartsWithoutProgress", "restartsWithoutProgress"))
LABELS = ["namespace", "name"]

_jobs: dict[tuple[str, str], dict[str, Any]] = {}
_lock = threading.Lock()


def _publish_phases() -> None:
    counts = dict.fromkeys(PHASES, 0)
    for snapshot in _jobs.values():
        counts[snapshot["phase"]] = counts.get(snapshot["phase"], 0) + 1
    for phase, count in counts.items():
        JOBS.labels(phase).set(count)


def record_phase(namespace: str, name: str, phase: str) -> None:
    with _lock:
        _jobs.setdefault((namespace, name), {"phase": phase, "status": {}, "spec": {"budget": {}}})["phase"] = phase
        _publish_phases()


def record_job(namespace: str, name: str, status: dict[str, Any], spec: dict[str, Any]) -> None:
    """The job's status as written (and the spec fields its series need)."""
    budget = spec.get("restartBudget") or {}
    with _lock:
        # The newest recovery of each tier this operator saw (status keeps only the newest of all).
        known = _jobs.get((namespace, name)) or {}
        by_tier = dict(known.get("byTier") or {})
        rolled_back = dict(known.get("rolledBack") or {})
        last = status.get("lastRecovery") or {}
        if last.get("tier") in ladder.ALL_TIERS and last.get("seconds") is not None:
            by_tier[last["tier"]] = float(last["seconds"])
        if last.get("tier") in ladder.ALL_TIERS and last.get("stepsRolledBack") is not None:
            rolled_back[last["tier"]] = float(last["stepsRolledBack"])
        _jobs[(namespace, name)] = {
            "phase": status.get("phase") or "Pending", "status": status, "byTier": by_tier,
            "rolledBack": rolled_back,
            "spec": {"budget": {k: budget.get(k) for k in (*(k for k, _ in BUDGETS), "windowSeconds")},
                     "intervalSteps": (spec.get("checkpoint") or {}).get("intervalSteps")}}
        _publish_phases()


def forget(namespace: str, name: str) -> None:
    """A deleted job leaves no series behind."""
    with _lock:
        _jobs.pop((namespace, name), None)
        _publish_phases()


def forget_all() -> None:
    """No job's series: a replica that stopped leading runs no passes, so what it kept would go stale (a
    step that never moves, a deleted job still there) beside the new leader's. It exports them again
    from the statuses once it leads (its passes write them)."""
    with _lock:
        _jobs.clear()
        _publish_phases()


def _seconds(value: str | None) -> float | None:
    when = parse_time(value)
    return when.timestamp() if when else None


class JobCollector(Collector):
    """Per-job series, computed at scrape time from the snapshots."""

    def collect(self) -> Iterator[Any]:
        with _lock:
            jobs = {key: dict(snapshot) for key, snapshot in _jobs.items()}
        now = time.time()
        fam = {
            "phase": GaugeMetricFamily("rtj_job_phase", "1 for the job's phase, 0 for the others.",
                                       labels=[*LABELS, "phase"]),
            "ready": GaugeMetricFamily("rtj_job_nodes_ready", "Training nodes whose pod runs and is ready (at most "
                                       "rtj_job_nodes_desired; ready hot spares are not counted).", labels=LABELS),
            "desired": GaugeMetricFamily("rtj_job_nodes_desired", "Training nodes.", labels=LABELS),
            "restarts": CounterMetricFamily("rtj_job_restarts", "Restarts of the job by tier (InProcess, Launcher, "
                                            "ReplacePod, GangRestart), reason and who was charged (job, platform).",
                                            labels=[*LABELS, "tier", "reason", "charged"]),
            "charged": CounterMetricFamily("rtj_job_restarts_charged", "Restarts of the job by tier and who was "
                                           "charged: every pair the tier can take, from 0.",
                                           labels=[*LABELS, "tier", "charged"]),
            "condition": GaugeMetricFamily("rtj_job_condition", "1 for each condition of the job that is True, "
                                           "labelled with its type and current reason.",
                                           labels=[*LABELS, "type", "reason"]),
            "recovery": GaugeMetricFamily("rtj_job_last_recovery_seconds", "Seconds the newest recovery took, by "
                                          "tier.", labels=[*LABELS, "tier"]),
            "rolled_back": GaugeMetricFamily("rtj_job_last_recovery_steps_rolled_back", "Steps trained again after "
                                             "the newest recovery of each tier: the step reached at the fault "
                                             "minus the step it resumed from.", labels=[*LABELS, "tier"]),
            "budget": GaugeMetricFamily("rtj_job_budget_remaining", "Restarts left in each restartBudget counter "
                                        "(within restartBudget.windowSeconds where it is set).",
                                        labels=[*LABELS, "budget"]),
            "ckpt": GaugeMetricFamily("rtj_job_checkpoint_step", "Newest committed checkpoint step.", labels=LABELS),
            "ckpt_ts": GaugeMetricFamily("rtj_job_checkpoint_timestamp_seconds", "When the newest checkpoint was "
                                         "committed (Unix time).", labels=LABELS),
            "ckpt_age": GaugeMetricFamily("rtj_checkpoint_age_seconds", "Seconds since the newest complete "
                                          "checkpoint.", labels=LABELS),
            "ckpt_interval": GaugeMetricFamily("rtj_job_checkpoint_interval_seconds", "checkpoint.intervalSteps x "
                                               "the seconds a step takes: how often a checkpoint is due.",
                                               labels=LABELS),
            "step": GaugeMetricFamily("rtj_job_step", "Training step, as the pods report it.", labels=LABELS),
            "step_ts": GaugeMetricFamily("rtj_job_step_timestamp_seconds", "When the pods reported that step "
                                         "(Unix time).", labels=LABELS),
            "step_seconds": GaugeMetricFamily("rtj_job_step_seconds", "Seconds a training step takes (median).",
                                              labels=LABELS),
            "goodput": GaugeMetricFamily("rtj_job_goodput_ratio", "Goodput so far: training (steps x fault-free step "
                                         "time / wall time) and infrastructure (time in the training loop / wall "
                                         "time).", labels=[*LABELS, "kind"]),
        }
        for (ns, name), snap in sorted(jobs.items()):
            st, spec, job = snap["status"], snap["spec"], [ns, name]
            for phase in PHASES:
                fam["phase"].add_metric([*job, phase], 1.0 if snap["phase"] == phase else 0.0)
            if st.get("nodesReady") is not None:
                fam["ready"].add_metric(job, st["nodesReady"])
            if st.get("nodesDesired") is not None:
                fam["desired"].add_metric(job, st["nodesDesired"])
            charged = {(tier, payer): 0.0 for tier, payers in ladder.CHARGES.items() for payer in payers}
            for entry in st.get("restartCounts") or []:
                tier, payer, count = str(entry.get("tier")), str(entry.get("charged")), float(entry.get("count") or 0)
                fam["restarts"].add_metric([*job, tier, str(entry.get("reason")), payer], count)
                charged[(tier, payer)] = charged.get((tier, payer), 0.0) + count
            for (tier, payer), count in sorted(charged.items()):
                fam["charged"].add_metric([*job, tier, payer], count)
            # Only the current reason of each True condition: one whose reason changed leaves no series behind.
            for cond in st.get("conditions") or []:
                if cond.get("status") == "True":
                    fam["condition"].add_metric([*job, str(cond.get("type")), str(cond.get("reason") or "")], 1.0)
            for tier, seconds in sorted((snap.get("byTier") or {}).items()):
                fam["recovery"].add_metric([*job, tier], seconds)
            for tier, steps in sorted((snap.get("rolledBack") or {}).items()):
                fam["rolled_back"].add_metric([*job, tier], steps)
            budget = spec["budget"]
            if all(budget.get(limit) is not None for limit, _ in BUDGETS):
                spent = ladder.budget_counts({c: int(st.get(c) or 0) for _, c in BUDGETS},
                                             (st.get("recovery") or {}).get("chargeTimes") or {}, budget,
                                             datetime.datetime.fromtimestamp(now, datetime.UTC))
                for limit, counter in BUDGETS:
                    fam["budget"].add_metric([*job, limit], max(0, budget[limit] - spent[counter]))
            if st.get("lastCheckpointStep") is not None:
                fam["ckpt"].add_metric(job, st["lastCheckpointStep"])
            if (ckpt_ts := _seconds(st.get("lastCheckpointTime"))) is not None:
                fam["ckpt_ts"].add_metric(job, ckpt_ts)
                fam["ckpt_age"].add_metric(job, max(0.0, now - ckpt_ts))
            progress = st.get("progress") or {}
            if progress.get("step") is not None:
                fam["step"].add_metric(job, progress["step"])
            if (step_ts := _seconds(progress.get("stepTime"))) is not None:
                fam["step_ts"].add_metric(job, step_ts)
            if progress.get("stepSeconds"):
                fam["step_seconds"].add_metric(job, progress["stepSeconds"])
                if spec.get("intervalSteps"):
                    fam["ckpt_interval"].add_metric(job, spec["intervalSteps"] * progress["stepSeconds"])
            goodput = st.get("goodput") or {}
            for kind in ("training", "infrastructure"):
                if goodput.get(kind) is not None:
                    fam["goodput"].add_metric([*job, kind], goodput[kind])
        yield from fam.values()


REGISTRY.register(JobCollector())
_publish_phases()  # every phase from the start, 0 until a pass sees a job
for _tier in ladder.TIERS:  # the operator's tiers, each charge it can take, at 0 until the first restart
    for _payer in ladder.CHARGES[_tier]:
        RESTARTS_CHARGED.labels(_tier, _payer)
