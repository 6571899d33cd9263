"""kopf wiring. Handlers stay thin: each RTJ gets one daemon that runs `controller.run_pass`
in a loop, woken early by events on the RTJ, its Job and pods, and lost nodes.

One daemon per RTJ means passes for one job never overlap, so restart budgets in status are
read and written by one writer at a time.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf

from . import api, metrics, recovery
from .builders.names import pvc_name
from .controller import run_pass
from .kube import Kube
from .reconcile import StorageCheck
from .spec import RTJ

ERROR_BACKOFF_MAX = 60.0


@dataclass
class Context:
    """What the handlers share; passed to kopf as its memo."""

    kube: Kube
    storage_check: StorageCheck | None = None
    max_requeue: float = 30.0
    wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)

    def wake(self, namespace: str | None, name: str | None) -> None:
        event = self.wakeups.get((namespace or "", name or ""))
        if event is not None:
            event.set()


def register(registry: kopf.OperatorRegistry, login: Any = None) -> kopf.OperatorRegistry:
    """Register all handlers on `registry`; `login` overrides how kopf reaches the API."""
    rtj = dict(group=api.GROUP, version=api.VERSION, plural=api.PLURAL, registry=registry)
    ours = {api.LABEL_NAME: kopf.PRESENT}

    if login is not None:
        kopf.on.login(registry=registry)(login)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        settings.persistence.finalizer = f"{api.GROUP}/finalizer"
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=api.GROUP)
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=api.GROUP, key="last-handled-configuration")
        settings.posting.level = logging.WARNING
        # No runtime watching of CRDs and namespaces: fewer RBAC grants (see the chart).
        settings.scanning.disabled = True
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330

    # A pass in flight finishes (up to the backoff) before the daemon exits, rather than being cancelled.
    @kopf.daemon(**rtj, cancellation_backoff=10.0, cancellation_timeout=5.0)
    async def reconcile_loop(stopped: kopf.DaemonStopped, namespace: str, name: str, memo: Context,
                             logger: logging.Logger, **_: Any) -> None:
        wake = memo.wakeups.setdefault((namespace, name), asyncio.Event())
        errors = 0
        try:
            while not stopped:
                wake.clear()
                try:
                    delay = await asyncio.to_thread(run_pass, memo.kube, namespace, name, memo.storage_check)
                    errors = 0
                except Exception as exc:
                    errors += 1
                    delay = min(ERROR_BACKOFF_MAX, 2.0 ** errors)
                    logger.warning("reconcile failed (%s), retrying in %.0fs: %s", type(exc).__name__, delay, exc)
                if delay is None:
                    return
                waiters = [asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())]
                try:
                    await asyncio.wait(waiters, timeout=min(delay, memo.max_requeue),
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    for waiter in waiters:
                        waiter.cancel()
        finally:
            memo.wakeups.pop((namespace, name), None)

    @kopf.on.event(**rtj)
    def rtj_changed(namespace: str, name: str, memo: Context, **_: Any) -> None:
        memo.wake(namespace, name)

    @kopf.on.event("batch/v1", "jobs", labels=ours, registry=registry)
    @kopf.on.event("v1", "pods", labels=ours, registry=registry)
    def child_changed(namespace: str, labels: dict[str, str], memo: Context, **_: Any) -> None:
        memo.wake(namespace, labels.get(api.LABEL_NAME))

    @kopf.on.event("v1", "nodes", registry=registry)
    def node_changed(type: str, body: kopf.Body, memo: Context, **_: Any) -> None:
        if type == "DELETED" or recovery.node_lost(dict(body)):
            for event in memo.wakeups.values():
                event.set()

    @kopf.on.delete(**rtj)
    def cleanup(body: kopf.Body, namespace: str, name: str, memo: Context, logger: logging.Logger,
                **_: Any) -> None:
        """Owner references let the garbage collector do this too; deleting explicitly also
        stops the pods first and makes retention: Retain hold without relying on the GC."""
        job = RTJ.from_body(dict(body))
        memo.kube.delete("Job", name, namespace, propagation="Foreground")
        memo.kube.delete("Service", name, namespace)
        if job.spec["storage"].get("storageClassName") and job.spec["storage"]["retention"] == "Delete":
            memo.kube.delete("PersistentVolumeClaim", pvc_name(job), namespace)
        metrics.forget(namespace, name)
        logger.info("children of %s/%s deleted", namespace, name)

    return registry
