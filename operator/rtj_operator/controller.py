"""One reconcile pass against the API: read the RTJ, reconcile, write status once, then events
and metrics (only once the status write succeeded, so a failed write never counts twice)."""

from __future__ import annotations

import logging
from typing import Any

from . import api, metrics
from .kube import Kube
from .reconcile import Event, NodeSource, StorageCheck, reconcile

log = logging.getLogger(__name__)


def status_patch(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any] | None:
    """A merge patch from old to new status (None when equal); kopf's own key is left alone."""
    patch: dict[str, Any] = {k: v for k, v in new.items() if old.get(k) != v}
    patch.update({k: None for k in old if k not in new and k != "kopf"})
    return patch or None


def run_pass(kube: Kube, namespace: str, name: str, storage_check: StorageCheck | None = None,
             nodes: NodeSource | None = None, allowed_service_accounts: frozenset[str] | None = None,
             body: dict[str, Any] | None = None) -> tuple[float | None, dict[str, Any] | None]:
    """Returns seconds until the next pass (None when the RTJ is gone or going) and the RTJ as
    written by this pass (None if nothing was written).

    `body` is the RTJ as last seen (watch or previous write); without it the pass GETs the RTJ.
    """
    if body is None:
        body = kube.get(api.KIND, name, namespace)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None, None
    try:
        outcome = reconcile(kube, body, storage_check=storage_check, nodes=nodes,
                            allowed_service_accounts=allowed_service_accounts)
    except Exception as exc:
        metrics.RECONCILE_ERRORS.labels(type(exc).__name__).inc()
        raise
    patch = status_patch(body.get("status") or {}, outcome.status)
    written = None
    try:
        if patch:
            # resourceVersion makes the write conditional: a pass that read a stale RTJ (another writer,
            # or a watch that lagged) fails with 409 and the next pass starts from the fresh object.
            rv = body["metadata"].get("resourceVersion")
            written = kube.patch(api.KIND, name, namespace, {"metadata": {"resourceVersion": rv}, "status": patch}
                                 if rv else {"status": patch}, subresource="status")
    except Exception:
        _post(kube, body, [e for e in outcome.events if e.done])  # what was done stays done
        raise
    for record in outcome.metrics:
        record()
    _post(kube, body, outcome.events)
    return outcome.requeue, written


def _post(kube: Kube, body: dict[str, Any], events: list[Event]) -> None:
    for event in events:
        try:
            kube.event(body, event.type, event.reason, event.message)
        except Exception:  # an event lost is not worth a failed pass
            log.exception("could not post event %s for %s", event.reason, body["metadata"].get("name"))


def newer(a: dict[str, Any] | None, b: dict[str, Any] | None) -> dict[str, Any] | None:
    """The later of two versions of one object (resourceVersions are etcd revisions here)."""
    if a is None or b is None:
        return a or b
    try:
        return a if int(a["metadata"]["resourceVersion"]) >= int(b["metadata"]["resourceVersion"]) else b
    except (KeyError, TypeError, ValueError):
        return None  # unknown order: read it again
