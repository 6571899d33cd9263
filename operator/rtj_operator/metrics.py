"""Prometheus metrics, served by `prometheus_client` on --metrics-port."""

from __future__ import annotations

import datetime
import threading

from prometheus_client import Counter, Gauge, Histogram

JOBS = Gauge("rtj_jobs", "ResilientTrainingJobs by phase.", ["phase"])
RESTARTS = Counter("rtj_restarts_total", "Restarts done by the operator.", ["tier", "reason"])
RECOVERY_SECONDS = Histogram(
    "rtj_recovery_seconds", "From the first failure seen to all nodes running again.",
    buckets=(5, 10, 20, 30, 60, 120, 300, 600, 1200, 3600),
)
RECONCILE_SECONDS = Histogram(
    "rtj_reconcile_seconds", "Duration of one reconcile pass.",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5),
)
RECONCILE_ERRORS = Counter("rtj_reconcile_errors_total", "Reconcile passes that raised.", ["error"])
CHECKPOINT_AGE = Gauge("rtj_checkpoint_age_seconds", "Seconds since the newest complete checkpoint.",
                       ["namespace", "name"])
API_CALLS = Counter("rtj_api_calls_total", "Kubernetes API calls by verb and kind.", ["verb", "kind"])

_phases: dict[tuple[str, str], str] = {}
_ages: set[tuple[str, str]] = set()
_lock = threading.Lock()
PHASES = ("Pending", "Running", "Restarting", "Suspended", "Succeeded", "Failed", "Invalid")


def _publish_phases() -> None:
    counts = dict.fromkeys(PHASES, 0)
    for phase in _phases.values():
        counts[phase] = counts.get(phase, 0) + 1
    for phase, count in counts.items():
        JOBS.labels(phase).set(count)


def record_phase(namespace: str, name: str, phase: str) -> None:
    with _lock:
        _phases[(namespace, name)] = phase
        _publish_phases()


def forget(namespace: str, name: str) -> None:
    """A deleted job leaves no series behind."""
    with _lock:
        _phases.pop((namespace, name), None)
        if (namespace, name) in _ages:
            _ages.discard((namespace, name))
            CHECKPOINT_AGE.remove(namespace, name)
        _publish_phases()


def record_checkpoint(namespace: str, name: str, when: datetime.datetime | None,
                      now: datetime.datetime) -> None:
    if when is None:
        return
    with _lock:
        _ages.add((namespace, name))
        CHECKPOINT_AGE.labels(namespace, name).set(max(0.0, (now - when).total_seconds()))
