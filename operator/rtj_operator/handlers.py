"""kopf wiring: watches feed the runtime's stores and queue (runtime.py); nothing else happens here.

kopf does what it does well: the watches (with re-listing after a watch expires), login, the
liveness endpoint. Each event handler hands the object to `Runtime.observe`, which updates its store
and queues the RTJ it concerns. There are no daemons, timers or change handlers, so kopf puts no
finalizer on an RTJ (and removes the one earlier versions of this operator put there): deleting an
RTJ never waits for the operator. Children carry owner references, so the garbage collector removes
them (a retained PVC, which has none, stays).

Watches of pods, Jobs, Services and PVCs are filtered by the API server (our managed-by label).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, cast

import kopf

from . import api
from .runtime import Runtime


class NoDiffBase(kopf.DiffBaseStorage):
    """kopf keeps a diff base for change handlers: on every event it deep-copies the object to compare
    it with the last handled one, a sixth of the operator's CPU while 100 RTJs start (py-spy, see
    docs/benchmarks.md). There are no change handlers here (the stores and the pass do the comparing):
    an empty essence, never stored."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> kopf.BodyEssence:
        return cast(kopf.BodyEssence, {})

    def fetch(self, *, body: kopf.Body) -> kopf.BodyEssence | None:
        return cast(kopf.BodyEssence, {})

    def store(self, *, body: kopf.Body, patch: kopf.Patch, essence: kopf.BodyEssence) -> None:
        return None


def register(registry: kopf.OperatorRegistry, runtime: Callable[[], Runtime] | Runtime,
             login: Any = None) -> kopf.OperatorRegistry:
    """Register the watches on `registry`; `runtime` (or a factory for it, called at start-up)
    receives their events. `login` overrides how kopf reaches the API."""
    holder: dict[str, Runtime] = {}

    def current() -> Runtime | None:
        return holder.get("runtime")

    if login is not None:
        kopf.on.login(registry=registry)(login)

    @kopf.on.startup(registry=registry)
    def configure(settings: kopf.OperatorSettings, **_: Any) -> None:
        # The finalizer earlier versions put on every RTJ (for their per-RTJ daemon): kopf removes it now
        # that no handler needs it, so RTJs made by an older operator delete without waiting.
        settings.persistence.finalizer = f"{api.GROUP}/finalizer"
        settings.persistence.diffbase_storage = NoDiffBase()
        settings.posting.level = logging.WARNING
        # No runtime watching of CRDs and namespaces: fewer RBAC grants (see the chart).
        settings.scanning.disabled = True
        settings.watching.server_timeout = 300
        settings.watching.client_timeout = 330
        ours = f"{api.LABEL_MANAGED_BY}={api.MANAGER}"
        for resource in (("v1", "pods"), ("batch", "v1", "jobs"), ("v1", "services"),
                         ("v1", "persistentvolumeclaims"), ("networking.k8s.io", "v1", "networkpolicies")):
            settings.watching.label_selectors[resource] = ours
        # start() returns at once (kopf serves the liveness endpoint only after this handler returns);
        # it fills the stores (one LIST per kind, retried) before any pass runs.
        holder["runtime"] = (runtime if isinstance(runtime, Runtime) else runtime()).start()

    def feed(kind: str) -> Callable[..., Awaitable[None]]:
        # Async: run in kopf's event loop. A sync handler is handed to a thread pool on every event, a
        # thread hop that costs more than observe() itself (a store update and a queue add, under
        # locks held only for that).
        async def handler(type: str | None, body: kopf.Body, **_: Any) -> None:
            rt = current()
            if rt is not None:
                rt.observe(kind, type, body)
        handler.__name__ = f"observe_{kind.lower()}"
        return handler

    kopf.on.event(api.GROUP, api.VERSION, api.PLURAL, registry=registry)(feed(api.KIND))
    kopf.on.event("batch/v1", "jobs", registry=registry)(feed("Job"))
    kopf.on.event("v1", "pods", registry=registry)(feed("Pod"))
    kopf.on.event("v1", "services", registry=registry)(feed("Service"))
    kopf.on.event("v1", "persistentvolumeclaims", registry=registry)(feed("PersistentVolumeClaim"))
    kopf.on.event("networking.k8s.io/v1", "networkpolicies", registry=registry)(feed("NetworkPolicy"))
    kopf.on.event("v1", "nodes", registry=registry)(feed("Node"))

    @kopf.on.cleanup(registry=registry)
    def shutdown(**_: Any) -> None:
        rt = current()
        if rt is not None:
            rt.stop()

    return registry
