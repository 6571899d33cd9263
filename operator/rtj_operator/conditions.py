"""metav1.Condition helpers: a transition time that only moves when the status flips."""

from __future__ import annotations

import datetime
from typing import Any

CREATED = "Created"
RUNNING = "Running"
RESTARTING = "Restarting"
SUCCEEDED = "Succeeded"
FAILED = "Failed"
SUSPENDED = "Suspended"
INVALID_SPEC = "InvalidSpec"
STORAGE_READY = "StorageReady"
# Kueue: the gang waits in its queue (True) / its quota is reserved and it may run (True).
QUEUED = "Queued"
ADMITTED = "Admitted"
# The API server keeps refusing the operator's passes for this job with an error a retry cannot fix (True,
# APIRejected: which call, and the server's message); False (Resolved) once a pass goes through again.
RECONCILE_ERROR = "ReconcileError"
API_REJECTED = "APIRejected"


def timestamp(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime.datetime | None:
    if not value:
        return None
    return datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))


def set_condition(conditions: list[dict[str, Any]], type_: str, status: bool, reason: str, message: str,
                  generation: int, now: datetime.datetime, restart: bool = False) -> list[dict[str, Any]]:
    """Return conditions with `type_` set; lastTransitionTime is kept unless the status changes (or
    `restart`: what the condition times begins now)."""
    value = "True" if status else "False"
    old = next((c for c in conditions if c.get("type") == type_), None)
    transition = old["lastTransitionTime"] if old and old.get("status") == value and not restart else timestamp(now)
    new = {"type": type_, "status": value, "reason": reason, "message": message,
           "lastTransitionTime": transition, "observedGeneration": generation}
    if old is None:
        return [*conditions, new]
    return [new if c is old else c for c in conditions]


def get_condition(conditions: list[dict[str, Any]], type_: str) -> dict[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def is_true(conditions: list[dict[str, Any]], type_: str) -> bool:
    cond = get_condition(conditions, type_)
    return bool(cond and cond.get("status") == "True")
