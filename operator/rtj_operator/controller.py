"""One reconcile pass against the API: read the RTJ, reconcile, write status once, then events."""

from __future__ import annotations

import logging
from typing import Any

from . import api, metrics
from .kube import Kube
from .reconcile import StorageCheck, reconcile

log = logging.getLogger(__name__)


def status_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """A merge patch from old to new status (None when equal); kopf's own key is left alone."""
    patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    patch.update({k: None for k in old if k not in new and k != "kopf"})
    return patch or None


def run_pass(kube: Kube, namespace: str, name: str, storage_check: StorageCheck | None = None) -> float | None:
    """Returns seconds until the next pass, or None when the RTJ is gone or going."""
    body = kube.get(api.KIND, name, namespace)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None
    try:
        outcome = reconcile(kube, body, storage_check=storage_check)
    except Exception as exc:
        metrics.RECONCILE_ERRORS.labels(type(exc).__name__).inc()
        raise
    patch = status_patch(body.get("status") or {}, outcome.status)
    if patch:
        kube.patch(api.KIND, name, namespace, {"status": patch}, subresource="status")
    for event in outcome.events:
        try:
            kube.event(body, event.type, event.reason, event.message)
        except Exception:  # an event lost is not worth a failed pass
            log.exception("could not post event %s for %s/%s", event.reason, namespace, name)
    return outcome.requeue
