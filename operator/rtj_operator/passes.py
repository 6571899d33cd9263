"""One pass, end to end: decide (reconcile), act (actions.execute), fold the results in (settle),
write the status once, then post events and record metrics (only once the status write succeeded,
so a failed write never counts twice). The runtime runs it on worker threads over the stores;
`run_pass` runs it against the API server directly (tools, tests).
"""

from __future__ import annotations

import datetime
import logging
from typing import Any

from . import api, metrics
from .actions import execute
from .draft import Config, Event, Intent, Requeue
from .kube import Kube
from .leader import NotLeader
from .reconcile import reconcile, settle
from .status import status_patch
from .world import StorageCheck, World

log = logging.getLogger(__name__)


def carry_out(kube: Kube, world: World, config: Config | None = None,
              now: datetime.datetime | None = None) -> tuple[Intent, dict[str, Any] | None]:
    """Decide, act, write: the Intent as settled, and the RTJ as written (None if status was unchanged)."""
    with metrics.RECONCILE_SECONDS.time():
        return _carry_out(kube, world, config, now)


def _carry_out(kube: Kube, world: World, config: Config | None,
               now: datetime.datetime | None) -> tuple[Intent, dict[str, Any] | None]:
    body = world.rtj
    try:
        intent = reconcile(world, now, config)
        results = execute(kube, intent.actions)
    except Exception as exc:
        metrics.RECONCILE_ERRORS.labels(type(exc).__name__).inc()
        raise
    intent = settle(intent, results, world, now or datetime.datetime.now(datetime.UTC))
    new_status = intent.status.to_dict()
    patch = status_patch(body.get("status") or {}, new_status)
    written = None
    try:
        if patch:
            # resourceVersion makes the write conditional: a pass that read a stale RTJ (another writer,
            # or a watch that lagged) fails with 409 and the next pass starts from the fresh object.
            rv = body["metadata"].get("resourceVersion")
            written = kube.patch(api.KIND, body["metadata"]["name"], body["metadata"].get("namespace"),
                                 {"metadata": {"resourceVersion": rv}, "status": patch} if rv else {"status": patch},
                                 subresource="status")
    except Exception:
        post(kube, body, [e for e in intent.events if e.done])  # what was done stays done
        raise
    for record in intent.metrics:
        record()
    metrics.record_job(body["metadata"].get("namespace", ""), body["metadata"]["name"], new_status,
                       body.get("spec") or {})
    post(kube, body, intent.events)
    return intent, written


def post(kube: Kube, body: dict[str, Any], events: list[Event]) -> None:
    for event in events:
        try:
            kube.event(body, event.type, event.reason, event.message)
        except NotLeader:
            return  # the next leader's pass posts what it decides
        except Exception:  # an event lost is not worth a failed pass
            log.exception("could not post event %s for %s", event.reason, body["metadata"].get("name"))


def run_pass(kube: Kube, namespace: str, name: str, config: Config | None = None,
             storage_check: StorageCheck | None = None, body: dict[str, Any] | None = None,
             ) -> tuple[Requeue | None, dict[str, Any] | None]:
    """One pass read from the API server: when to look again (None when the RTJ is gone or going)
    and the RTJ as written (None if nothing was written). `body`: the RTJ as last seen (else a GET)."""
    if body is None:
        body = kube.get(api.KIND, name, namespace)
    if body is None or body["metadata"].get("deletionTimestamp"):
        return None, None
    world = World.read(kube, body).probe(kube, storage_check)
    intent, written = carry_out(kube, world, config)
    return intent.requeue, written
