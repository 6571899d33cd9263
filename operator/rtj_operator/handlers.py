"""kopf wiring. Handlers stay thin: each RTJ gets one daemon that runs `controller.run_pass`
in a loop, woken early by events on the RTJ, its Job and pods, and lost nodes.

One daemon per RTJ means passes for one job never overlap, so restart budgets in status are
read and written by one writer at a time.

Load: watches of pods and Jobs are filtered by the API server (our managed-by label); passes read
nodes from the node watch and pods from the pod watch (cache.py), not a GET or LIST each; passes
run on sized thread pools, and one that a failure woke (a pod ended or is going, a Job failed, a
node was lost) runs on a pool of its own, never behind timer passes; the echo of our own status
write wakes no one; a job that waits (Pending, Restarting) backs off unless an event wakes it.

Deletion: children carry owner references, so the garbage collector removes them (and a retained
PVC, which has none, stays). No delete handler: the operator deletes nothing it did not make.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import logging
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

from . import api, recovery
from .cache import CachedKube, PodCache
from .controller import newer, run_pass
from .kube import Kube, KubeError
from .reconcile import ACT_REQUEUE, StorageCheck

ERROR_BACKOFF_MAX = 60.0
# Consecutive passes that changed nothing stretch a busy job's requeue up to this: whatever it waits
# for (pods scheduled or started, a node back) arrives as a watch event that wakes it at once.
WAITING_BACKOFF_MAX = 60.0
# Watch events that are not failures wake a job at most this often after its last pass began: a new
# job's events come in bursts (Job created, pods created, scheduled, started), one pass answers all.
EVENT_PASS_SPACING = 1.0
PASS_THREADS = int(os.environ.get("RTJ_PASS_THREADS", "32"))
EVENT_PASS_THREADS = int(os.environ.get("RTJ_EVENT_PASS_THREADS", "8"))


@dataclass
class Context:
    """What the handlers share; passed to kopf as its memo."""

    kube: Kube
    storage_check: StorageCheck | None = None
    max_requeue: float = 60.0
    allowed_service_accounts: frozenset[str] | None = None
    wakeups: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    # Set when a failure woke the job: its next pass runs on the event pool.
    alarms: dict[tuple[str, str], asyncio.Event] = field(default_factory=dict)
    written: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)  # the RTJ as our last pass wrote it
    nodes: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: PodCache = field(default_factory=PodCache)  # fed by the pod watch, read by passes
    pool: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(PASS_THREADS, thread_name_prefix="rtj-pass"))
    # Passes a failure woke (a pod ended or is going, a Job failed, a node was lost): with 1000 jobs,
    # timer passes and new jobs' passes would otherwise queue ahead of them.
    event_pool: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(EVENT_PASS_THREADS,
                                                                      thread_name_prefix="rtj-event-pass"))

    def wake(self, namespace: str | None, name: str | None, urgent: bool = False) -> None:
        key = (namespace or "", name or "")
        event = self.wakeups.get(key)
        if event is not None:
            if urgent:
                self.alarms.setdefault(key, asyncio.Event()).set()
            event.set()

    def node(self, name: str) -> dict[str, Any] | None:
        """From the node watch; a GET only for a node it has not delivered (yet, or any more)."""
        return self.nodes.get(name) or self.kube.get("Node", name)


def register(registry: kopf.OperatorRegistry, login: Any = None) -> kopf.OperatorRegistry:
    """Register all handlers on `registry`; `login` overrides how kopf reaches the API."""
    rtj = dict(group=api.GROUP, version=api.VERSION, plural=api.PLURAL, registry=registry)

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
        # Server-side filtering: only our pods and Jobs reach the operator.
        ours = f"{api.LABEL_MANAGED_BY}={api.MANAGER}"
        settings.watching.label_selectors["v1", "pods"] = ours
        settings.watching.label_selectors["batch", "v1", "jobs"] = ours

    # A pass in flight finishes (up to the backoff) before the daemon exits, rather than being cancelled.
    @kopf.daemon(**rtj, cancellation_backoff=10.0, cancellation_timeout=5.0)
    async def reconcile_loop(stopped: kopf.DaemonStopped, namespace: str, name: str, body: kopf.Body,
                             memo: Context, logger: logging.Logger, **_: Any) -> None:
        wake = memo.wakeups.setdefault((namespace, name), asyncio.Event())
        alarm = memo.alarms.setdefault((namespace, name), asyncio.Event())
        loop = asyncio.get_running_loop()
        errors, quiet, fresh = 0, 0, False
        try:
            while not stopped:
                began = loop.time()
                woken = wake.is_set()
                wake.clear()
                urgent = alarm.is_set()
                alarm.clear()
                # kopf's watch keeps the daemon's body current; our own last write may be newer still.
                # After a conflict (a stale read), the pass GETs the RTJ.
                current = None if fresh else newer(_plain(body), memo.written.get((namespace, name)))
                fresh = False
                try:
                    outcome = await _run(memo, alarm, urgent, lambda b=current: run_pass(
                        CachedKube(memo.kube, memo.pods), namespace, name, memo.storage_check, memo.node,
                        memo.allowed_service_accounts, body=b))
                    if outcome is None:
                        continue  # a failure woke it while its pass still queued: run it on the event pool
                    delay, mine = outcome
                    if mine:
                        memo.written[namespace, name] = mine
                    errors = 0
                except KubeError as exc:
                    if exc.status != 409:
                        errors += 1
                        logger.warning("reconcile failed, retrying: %s", exc)
                    fresh = True  # stale read: the next pass GETs the RTJ
                    delay = min(ERROR_BACKOFF_MAX, 0.2 * 2.0 ** errors)
                except Exception as exc:
                    errors += 1
                    delay = min(ERROR_BACKOFF_MAX, 2.0 ** errors)
                    logger.warning("reconcile failed (%s), retrying in %.0fs: %s", type(exc).__name__, delay, exc)
                if delay is None:
                    return
                # A job that waits (pods starting, a gang being replaced) backs off while nothing wakes it.
                quiet = 0 if woken or delay <= ACT_REQUEUE else quiet + 1
                delay = min(delay * (1.5 ** min(quiet, 8)), max(delay, WAITING_BACKOFF_MAX), memo.max_requeue)
                if delay > ACT_REQUEUE:
                    # Jobs created together would otherwise wake together, for ever: 500 passes at once.
                    delay *= random.uniform(0.8, 1.0)
                if delay > 0:
                    await _wait(wake, stopped, delay)
                # A watch event that is not a failure waits out the spacing (a failure, or a decision
                # just written, never waits).
                spacing = began + EVENT_PASS_SPACING - loop.time()
                if wake.is_set() and not alarm.is_set() and delay > ACT_REQUEUE and spacing > 0 and not stopped:
                    await _wait(alarm, stopped, spacing)
        finally:
            memo.wakeups.pop((namespace, name), None)
            memo.alarms.pop((namespace, name), None)
            memo.written.pop((namespace, name), None)
            memo.pods.forget(namespace, name)

    @kopf.on.event(**rtj)
    def rtj_changed(namespace: str, name: str, body: kopf.Body, memo: Context, **_: Any) -> None:
        # The echo of our own status write: the pass that wrote it had seen everything it says.
        ours = memo.written.get((namespace, name)) or {}
        if body.get("metadata", {}).get("resourceVersion") != ours.get("metadata", {}).get("resourceVersion"):
            memo.wake(namespace, name)

    @kopf.on.event("batch/v1", "jobs", registry=registry)
    def job_changed(namespace: str, labels: dict[str, str], body: kopf.Body, memo: Context, **_: Any) -> None:
        memo.wake(namespace, labels.get(api.LABEL_NAME), urgent=_failing(body))

    @kopf.on.event("v1", "pods", registry=registry)
    def pod_changed(type: str | None, namespace: str, labels: dict[str, str], body: kopf.Body, memo: Context,
                    **_: Any) -> None:
        # The cache first: the pass this wakes must see this very event.
        if type == "DELETED":
            memo.pods.drop(body)
        else:
            memo.pods.put(_plain(body))
        memo.wake(namespace, labels.get(api.LABEL_NAME), urgent=_failing(body))

    @kopf.on.event("v1", "nodes", registry=registry)
    def node_changed(type: str | None, body: kopf.Body, name: str, memo: Context, **_: Any) -> None:
        was_lost = recovery.node_lost(memo.nodes.get(name)) if name in memo.nodes else ""
        if type == "DELETED":
            memo.nodes.pop(name, None)
            now_lost = "NodeDeleted"
        else:
            memo.nodes[name] = _plain(body)
            now_lost = recovery.node_lost(memo.nodes[name])
        if now_lost != was_lost:
            # Only the jobs with pods on it: with 1000 jobs, waking all of them (on the event pool) for
            # one node would queue a pod failure elsewhere behind 1000 passes.
            for key in memo.pods.jobs_on(name):
                memo.wake(*key, urgent=True)

    @kopf.on.cleanup(registry=registry)
    def shutdown(memo: Context, **_: Any) -> None:
        memo.pool.shutdown(wait=False, cancel_futures=True)
        memo.event_pool.shutdown(wait=False, cancel_futures=True)

    return registry


async def _wait(event: asyncio.Event, stopped: kopf.DaemonStopped, timeout: float) -> None:
    waiters = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


async def _run(memo: Context, alarm: asyncio.Event, urgent: bool,
               work: Callable[[], tuple[float | None, dict[str, Any] | None]],
               ) -> tuple[float | None, dict[str, Any] | None] | None:
    """Run one pass on a worker thread. A pass woken by a failure runs on the event pool. A pass
    still queued on the main pool when a failure wakes the job (`alarm`) is withdrawn (None), so
    the failure is counted by a pass on the event pool, not behind other jobs' timer passes."""
    if urgent:
        return await asyncio.wrap_future(memo.event_pool.submit(work))
    queued = memo.pool.submit(work)
    task = asyncio.wrap_future(queued)
    waiter = asyncio.ensure_future(alarm.wait())
    try:
        await asyncio.wait([task, waiter], return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        queued.cancel()  # the daemon is stopping: a pass not started yet never runs
        raise
    finally:
        waiter.cancel()
    if not task.done() and queued.cancel():
        return None
    # Done, or running already: it may count the failure itself, and the pass the alarm asks for follows.
    return await task


def _failing(body: kopf.Body) -> bool:
    """Whether a pod or Job event may be a failure the operator must count and answer."""
    status = body.get("status") or {}
    if body.get("metadata", {}).get("deletionTimestamp") or status.get("phase") in ("Failed", "Succeeded"):
        return True
    alarms = ("Failed", "FailureTarget", "Complete", "DisruptionTarget")
    return any(c.get("type") in alarms and c.get("status") == "True" for c in status.get("conditions") or [])


def _plain(body: kopf.Body) -> dict[str, Any]:
    """A detached copy of kopf's live body, safe to read from a worker thread. managedFields (half
    of an RTJ's bytes) is left out: nothing reads it, and this copy is made on the event loop."""
    plain = {k: v for k, v in body.items() if k != "metadata"}
    plain["metadata"] = {k: v for k, v in body.get("metadata", {}).items() if k != "managedFields"}
    return copy.deepcopy(plain)
