"""The operator's runtime: watch-fed stores, a work queue of RTJ keys, and worker threads that run
one pass per key (controller-runtime's shape). kopf's watch handlers (handlers.py) only feed it.

- observe(): a watch event updates its store; if the store took it (a newer version), the RTJ it
  concerns is queued: urgently for a failure (a pod ended or is going, a Job failed or completed, a
  node turned lost or came back), otherwise spaced (at most one pass a second per job). The echo of
  our own status write is older than or equal to what the write put in the store: it wakes no one.
- Workers take a key (never one key on two workers), build the World from the stores, run the
  pass (passes.carry_out) with writes going through the stores, and requeue as the pass asks: at
  once and urgently when a decision waits to be carried out, else after its seconds, stretched
  while passes keep changing nothing, jittered so that jobs created together do not wake together.
  How a pass ended is classified once (`_pass`: an Outcome) and acted on in one switch (`_handle`:
  requeue, retry with back-off, hand over to the next leader, forget), which counts every pass by
  outcome (rtj_reconcile_passes_total).
- A pass the API server refuses with an error no retry fixes (`unfixable`), on the same call twice in a
  row, is said on the RTJ (condition ReconcileError, APIRejected, and one Warning event) by a status
  patch of that condition alone (the failed pass wrote nothing), and retried every max_requeue
  seconds, not with the back-off's hammering. The next pass that goes through clears it in its own
  status write (reconcile.settle).
- Start-up: one LIST per kind fills the stores before any pass runs (the synced guard). Every
  RESYNC_SECONDS the LISTs run again and correct what a watch may have missed.
- With a LeaderElector (leader.py), every replica keeps its stores and queue, but workers take keys
  only while it leads, and each write checks that it still does (NotLeader otherwise): a replica that
  lost the Lease stops acting at once. One that takes it over re-LISTs and queues every RTJ.
"""

from __future__ import annotations

import datetime
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from . import api, conditions, ladder, metrics, progress
from .draft import Config, Requeue
from .kube import Kube, KubeError
from .leader import LeaderElector, NotLeader
from .passes import carry_out
from .policies.pods import gated
from .stores import Stores, ref, rtj_key
from .workqueue import RELEASE, WorkQueue
from .world import ZONE_LABEL, CloudFencing, StorageCheck, World

log = logging.getLogger(__name__)

# How a pass ended (Runtime._pass), each counted in rtj_reconcile_passes_total{outcome}.
OK = "ok"  # requeued as the pass asks
GONE = "gone"  # the RTJ is deleted: forgotten
DELETING = "deleting"  # the RTJ is being deleted: nothing to converge
NOT_LEADER = "not_leader"  # the Lease was lost mid-pass: queued for the next leader
CONFLICT = "conflict"  # a write met a newer object (409): the RTJ read afresh, retried
API_ERROR = "api_error"  # the API server refused or failed a call: retried with back-off
REJECTED = "rejected"  # refused for a reason a retry cannot fix (`unfixable`): said on the RTJ once repeated
ERROR = "error"  # any other failure of the pass: retried with back-off
CRASHED = "crashed"  # the worker caught what the pass let through (a bug): retried, kept in Runtime.error
OUTCOMES = (OK, GONE, DELETING, NOT_LEADER, CONFLICT, API_ERROR, REJECTED, ERROR, CRASHED)
# Passes refused the same way (status, verb, kind, name) this many times in a row set ReconcileError.
REJECTED_STREAK = 2


@dataclass(frozen=True)
class Outcome:
    kind: str  # one of OUTCOMES
    requeue: Requeue = field(default_factory=Requeue)  # OK: when to look again
    changed: bool = False  # OK: the pass wrote status or acted
    error: BaseException | None = None

Key = tuple[str, str]
WORKERS = int(os.environ.get("RTJ_WORKERS", "16"))
RESYNC_SECONDS = 300.0
SETTLE_SECONDS = 15.0
PRIME_RETRY_FIRST, PRIME_RETRY_MAX = 1.0, 30.0  # the start-up LIST, while the API server is unreachable
# Watch events that are not failures wake a job at most this often after its last pass began: a new
# job's events come in bursts (Job created, pods created, scheduled, started), one pass answers all.
EVENT_SPACING = 1.0
# Consecutive passes that changed nothing stretch a waiting job's requeue (x1.5 each) up to this:
# whatever it waits for (pods scheduled or started, a node back) arrives as a watch event anyway.
WAITING_MAX = 60.0
REQUEUE_JITTER = 0.2
NODE_MISS_SECONDS = 30.0  # how long a GET that found no node is believed
# Label selectors of the watches and LISTs: only the children the operator made reach it.
OURS = {api.LABEL_MANAGED_BY: api.MANAGER}
SELECTED = {"Job": OURS, "Service": OURS, "PersistentVolumeClaim": OURS, "NetworkPolicy": OURS, "Pod": OURS}


def failing(obj: dict[str, Any]) -> bool:
    """Whether a pod or Job event may be a failure the operator must count and answer at once."""
    status = obj.get("status") or {}
    if (obj.get("metadata") or {}).get("deletionTimestamp") or status.get("phase") in ("Failed", "Succeeded"):
        return True
    alarms = ("Failed", "FailureTarget", "Complete", "DisruptionTarget")
    return any(c.get("type") in alarms and c.get("status") == "True" for c in status.get("conditions") or [])


def unfixable(exc: KubeError) -> bool:
    """Whether the API server refused a call for a reason that retrying it unchanged cannot fix: invalid
    (400, 422), forbidden (403: RBAC, an admission policy), or a child that is not there (404; the RTJ's
    own 404 means it is gone, which the next pass finds). Not 409 (a newer object: read afresh), 429 or
    5xx (the server busy or failing: back-off)."""
    return exc.status in (400, 403, 422) or (exc.status == 404 and exc.kind not in ("", api.KIND))


def _verdict(node: dict[str, Any] | None) -> tuple[str, str]:
    """What the ladder reads of a node: lost (why), and fenced (evidence)."""
    return ladder.node_lost(node, datetime.datetime.now(datetime.UTC)), ladder.fencing(node)


class StoreKube:
    """A Kube whose writes go through the stores, so the next pass sees the operator's own writes."""

    def __init__(self, kube: Kube, stores: Stores, leading: Callable[[], bool] | None = None):
        self._kube, self._stores, self._leading = kube, stores, leading

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)

    def _may_write(self) -> None:
        if self._leading is not None and not self._leading():
            raise NotLeader("this replica does not hold the leader Lease")

    def _keep(self, kind: str, obj: dict[str, Any] | None) -> None:
        if obj and obj.get("kind") == kind and kind in Stores.KINDS:
            self._stores.of(kind).put(obj)

    def create(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        if not dry_run:
            self._may_write()
        result = self._kube.create(obj, dry_run=dry_run)
        if not dry_run:
            self._keep(obj["kind"], result)
        return result

    def patch(self, kind: str, name: str, namespace: str | None, patch: dict[str, Any],
              subresource: str | None = None, strategic: bool = False) -> dict[str, Any]:
        self._may_write()
        result = self._kube.patch(kind, name, namespace, patch, subresource=subresource, strategic=strategic)
        self._keep(kind, result)
        return result

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        result = self._kube.get(kind, name, namespace)
        self._keep(kind, result)
        return result

    def delete(self, kind: str, name: str, namespace: str | None, **options: Any) -> dict[str, Any] | None:
        self._may_write()
        result = self._kube.delete(kind, name, namespace, **options)
        if kind == "Pod" and namespace:
            self._refresh(name, namespace)
        else:
            self._keep(kind, result)  # the object with its deletionTimestamp (Foreground), if it says so
        return result

    def event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self._may_write()
        self._kube.event(involved, type_, reason, message)

    def evict(self, name: str, namespace: str, uid: str | None = None) -> str:
        self._may_write()
        outcome = self._kube.evict(name, namespace, uid=uid)
        self._refresh(name, namespace)
        return outcome

    def _refresh(self, name: str, namespace: str) -> None:
        """After the operator changed a pod: its own write is seen by the very next pass."""
        pod = self._kube.get("Pod", name, namespace)
        store = self._stores.pods
        if pod is not None:
            store.put(pod)
        elif (have := store.get(namespace, name)) is not None:
            store.delete(have)


class Runtime:
    def __init__(self, kube: Kube, namespaces: list[str] | None = None, config: Config | None = None,
                 storage_check: StorageCheck | None = None, cloud_fencing: CloudFencing | None = None,
                 workers: int = WORKERS, max_requeue: float = 60.0, clock: Callable[[], float] = time.monotonic,
                 elector: LeaderElector | None = None):
        self.kube, self.namespaces = kube, list(namespaces or [])
        self.config, self.storage_check, self.cloud_fencing = config or Config(), storage_check, cloud_fencing
        self.max_requeue = max_requeue
        self.stores = Stores(clock=clock)
        self.queue = WorkQueue(clock=clock)
        self.elector = elector
        self._synced_as_leader = threading.Event()  # set once the take-over re-LIST is done
        if elector is not None and isinstance(kube, Kube):
            # A write sent while leading must land before a follower may take over, or time out trying.
            kube.write_deadline = elector.acting_for
        self.writer = StoreKube(kube, self.stores, elector.leading if elector else None)
        self._workers = workers
        self._threads: list[threading.Thread] = []
        self._stop = threading.Event()
        self._quiet: dict[Key, int] = {}  # consecutive passes that changed nothing
        self._rejections: dict[Key, tuple[tuple[Any, ...], int]] = {}  # the refused call, passes in a row
        self._node_misses: dict[str, float] = {}
        self._lock = threading.Lock()
        self._clock = clock
        self.error: BaseException | None = None

    # --- lifecycle -----------------------------------------------------------------------------
    def start(self) -> Runtime:
        """Start the workers and, off the caller's thread, fill every store with one LIST per kind
        (retried while the API server cannot be reached), queue every RTJ once, then start the
        periodic resync and the leader election. It returns at once: kopf serves the liveness
        endpoint only after its startup handler returns, and an operator that cannot reach the API
        server yet is not dead (a restart would not help; the kubelet's back-off would only delay it
        once the server is back). No pass runs before the stores are filled (the synced guard); the
        watches may feed them meanwhile, and a LIST keeps their newer versions (Store.replace)."""
        for i in range(self._workers):
            thread = threading.Thread(target=self._work, name=f"rtj-worker-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)
        prime = threading.Thread(target=self._prime, name="rtj-prime", daemon=True)
        prime.start()
        self._threads.append(prime)
        return self

    def wait_synced(self, timeout: float) -> bool:
        """True once every store is filled (the first LIST of every kind returned)."""
        deadline = time.monotonic() + timeout
        return all(self.stores.of(kind).synced.wait(max(0.0, deadline - time.monotonic()))
                   for kind in Stores.KINDS)

    def _prime(self) -> None:
        delay = PRIME_RETRY_FIRST
        while not self._stop.is_set():
            try:
                self.resync()
                break
            except Exception as exc:
                if isinstance(exc, KubeError) and exc.status in (401, 403, 404):
                    # Not a server still starting: a missing CRD or RBAC grant, which `helm upgrade` (or
                    # the admin) may still put right, so retried, but said loudly.
                    log.error("the start-up LIST is refused (%s): is the CRD installed, and does the "
                              "ServiceAccount have the chart's RBAC? again in %.0f s", exc, delay)
                else:  # the server unreachable, or answering 5xx/429 while it starts
                    log.warning("cannot LIST the objects to start from (%s); again in %.0f s", exc, delay)
            if self._stop.wait(delay):
                return
            delay = min(delay * 2, PRIME_RETRY_MAX)
        if self._stop.is_set():
            return  # stopped while listing: no election to start
        self._queue_all()
        resync = threading.Thread(target=self._resync_loop, name="rtj-resync", daemon=True)
        resync.start()
        self._threads.append(resync)
        if self.elector is not None:
            self.elector.on_started_leading(self._took_over)
            self.elector.start()
        else:
            metrics.LEADER.set(1)  # the only replica: it acts

    def leading(self) -> bool:
        return self.elector is None or self.elector.leading()

    def _queue_all(self) -> None:
        for rtj in self.stores.rtjs.all():
            self.queue.add(ref(rtj))

    def _took_over(self) -> None:
        """A new leader's passes start from a fresh LIST (its watches may lag the old leader's last
        writes by a moment; status writes are conditional anyway). The LIST runs off the election's
        thread, which must keep renewing."""
        self._synced_as_leader.clear()

        def take_over() -> None:
            try:
                self.resync()
            except Exception:
                log.exception("re-LIST on taking the lease failed; the watches still feed the stores")
            self._queue_all()
            self._synced_as_leader.set()
        threading.Thread(target=take_over, name="rtj-take-over", daemon=True).start()

    def stop(self, timeout: float = 10.0) -> None:
        """Queued passes never start; those in flight finish (up to `timeout`), or with leader
        election stop at their next write: the Lease is released first, so a follower takes over at
        its next try."""
        if self.elector is not None:
            self.elector.stop(release=True)
        self._stop.set()
        self.queue.shutdown()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads.clear()

    def resync(self) -> None:
        """LIST every kind and make it the stores' truth (the watch's newer versions kept); once the
        stores are synced, the RTJs whose objects changed are queued."""
        wake: set[Key] = set()
        for kind in Stores.KINDS:
            store = self.stores.of(kind)
            scopes: list[str | None] = [None] if kind == "Node" or not self.namespaces else list(self.namespaces)
            for ns in scopes:
                items, version = self.kube.list_versioned(kind, ns, SELECTED.get(kind))
                changed = store.replace(items, version, namespace=ns)
                if store.synced.is_set():
                    wake |= self._keys_for(kind, changed)
            store.synced.set()
        for key in wake:
            self.queue.add(key)

    def _resync_loop(self) -> None:
        # The first re-LIST comes soon: the stores were filled by a LIST of their own, apart from the
        # watches' LIST, and an object deleted in between is reported by neither.
        wait = SETTLE_SECONDS
        while not self._stop.wait(wait):
            wait = RESYNC_SECONDS
            try:
                self.resync()
            except Exception:
                log.exception("resync failed; the watches still feed the stores")

    def _keys_for(self, kind: str, changed: list[dict[str, Any]]) -> set[Key]:
        if kind == api.KIND:
            return {ref(obj) for obj in changed}
        if kind == "Node":
            return {key for obj in changed for key in self.stores.jobs_on(ref(obj)[1])}
        return {key for obj in changed for key in rtj_key(obj)}

    # --- fed by the watches (kopf's event loop) ----------------------------------------------------
    def observe(self, kind: str, event_type: str | None, body: dict[str, Any]) -> None:
        store = self.stores.of(kind)
        if kind == "Node":
            self._observe_node(event_type, body)
            return
        before = store.get(*ref(body)) if kind == "Pod" and event_type != "DELETED" else None
        if event_type == "DELETED":
            changed = store.delete(body)
        else:
            changed = store.put(body)
        if not changed:
            return  # an older copy, or the echo of our own write
        key = ref(body) if kind == api.KIND else next(iter(rtj_key(body)), None)
        if key is None:
            return
        if kind == api.KIND and event_type == "DELETED":
            self.queue.add(key)  # its pass forgets it
        elif kind in ("Pod", "Job") and failing(body):
            self.queue.add(key, urgent=True)
        elif kind == "Pod" and gated(body):
            # A new pod waits for a pass to lift the operator's scheduling gate: no coalescing, and
            # before other jobs' first passes (the release lane; docs/benchmarks.md measures it).
            self.queue.add(key, lane=RELEASE)
        elif kind == "Pod" and before is not None and progress.refresh_only(before, store.get(*ref(body)) or body):
            # A report that only moved its step on: its job's status takes progress in at most every
            # PROGRESS_SECONDS, so the pass it wakes comes no more often (one 1000-node job's reports
            # arrive several a second).
            self.queue.add_spaced(key, progress.PROGRESS_SECONDS)
        else:
            self.queue.add_spaced(key, EVENT_SPACING)

    def _observe_node(self, event_type: str | None, body: dict[str, Any]) -> None:
        store, name = self.stores.nodes, (body.get("metadata") or {}).get("name", "")
        before = store.get("", name)
        was = _verdict(before) if before is not None else ("", "")
        if event_type == "DELETED":
            if not store.delete(body):
                return
            now = ("NodeDeleted", "deleted")
        else:
            if not store.put(body):
                return
            now = _verdict(store.get("", name))
        if now != was:
            # Only the jobs with pods on it: with 1000 jobs, waking all of them for one node would
            # queue a pod failure elsewhere behind 1000 passes.
            for key in self.stores.jobs_on(name):
                self.queue.add(key, urgent=True)

    def _zone_health(self, zone: str) -> tuple[int, int]:
        """(nodes, NotReady or unreachable nodes) of a zone, from the node store."""
        nodes = [n for n in self.stores.nodes.all() if (n["metadata"].get("labels") or {}).get(ZONE_LABEL) == zone]
        now = datetime.datetime.now(datetime.UTC)
        return len(nodes), sum(1 for n in nodes if ladder.node_lost(n, now))

    # --- workers ---------------------------------------------------------------------------------
    def _work(self) -> None:
        while not self._stop.is_set():
            if not self.stores.synced:
                # The synced guard: no pass on a half-filled store (a pod missing from it would look
                # deleted, a node lost). start() begins the workers before its first LIST of every
                # kind returns (retried while the API server cannot be reached).
                self._stop.wait(0.1)
                continue
            if self.elector is not None and not (self.elector.wait_leading(1.0)
                                                 and self._synced_as_leader.wait(1.0)):
                continue  # a follower (or a leader still re-LISTing): keys wait, the stores stay warm
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            try:
                self.run(key)
            except BaseException as exc:  # a bug in a pass must not kill the worker
                self._handle(key, Outcome(CRASHED, error=exc))
            finally:
                self.queue.done(key)

    def run(self, key: Key) -> None:
        """One pass for `key`, and its requeue."""
        self._handle(key, self._pass(key))

    def _pass(self, key: Key) -> Outcome:
        """Run the pass and say how it ended; nothing else is decided here."""
        body = self.stores.rtjs.get(*key)
        if body is None:
            return Outcome(GONE)
        if body["metadata"].get("deletionTimestamp"):
            return Outcome(DELETING)
        try:
            world = World.from_stores(self.stores, body, self._node).probe(
                self.writer, self.storage_check, self.cloud_fencing, self._zone_health)
            intent, written = carry_out(self.writer, world, self.config)
        except NotLeader as exc:
            return Outcome(NOT_LEADER, error=exc)
        except KubeError as exc:
            return Outcome(CONFLICT if exc.status == 409 else REJECTED if unfixable(exc) else API_ERROR, error=exc)
        except Exception as exc:
            return Outcome(ERROR, error=exc)
        return Outcome(OK, intent.requeue, changed=bool(written or intent.actions))

    def _handle(self, key: Key, outcome: Outcome) -> None:
        """The one switch on a pass's outcome (controller-runtime's reconcileHandler): count it, then
        requeue, retry or forget the key."""
        metrics.PASSES.labels(outcome.kind).inc()
        exc = outcome.error
        if outcome.kind != REJECTED:
            self._rejections.pop(key, None)  # a streak of refusals ends with any other outcome
        if outcome.kind == OK:
            self.queue.forget(key)
            self._requeue(key, outcome.requeue, outcome.changed)
        elif outcome.kind == GONE:
            self._forget(key)
        elif outcome.kind == DELETING:
            pass  # children go with it (owner references); nothing to converge
        elif outcome.kind == NOT_LEADER:
            log.info("pass for %s/%s stopped: the leader Lease was lost", *key)
            self.queue.add(key)  # the next leader runs it (queued everything on taking over anyway)
        elif outcome.kind == CONFLICT:
            self.writer.get(api.KIND, key[1], key[0])  # a stale copy: read it afresh
            self.queue.retry(key)
        elif outcome.kind == API_ERROR:
            # Never sooner than a throttled call's Retry-After (kube.py already waited it out a few times).
            at_least = getattr(exc, "retry_after", None) or 0.0
            log.warning("pass for %s/%s failed, retrying in %.1fs: %s", *key, self.queue.retry(key, at_least), exc)
        elif outcome.kind == REJECTED:
            assert isinstance(exc, KubeError)
            self._rejected(key, exc)
        elif outcome.kind == ERROR:
            delay = self.queue.retry(key)
            log.warning("pass for %s/%s failed (%s), retrying in %.1fs: %s", *key, type(exc).__name__, delay, exc)
        else:  # CRASHED
            log.error("pass for %s/%s crashed", *key, exc_info=exc)
            self.error = exc
            self.queue.retry(key)

    def _rejected(self, key: Key, exc: KubeError) -> None:
        """A pass the API server refused (`unfixable`): retried with back-off the first time; from the second
        refusal in a row of the same call, said on the RTJ and retried every max_requeue seconds (a watch
        event still wakes it sooner: an edit of the spec, a child changed)."""
        call = (exc.status, exc.verb, exc.kind, exc.name)
        last, streak = self._rejections.get(key, ((), 0))
        streak = streak + 1 if last == call else 1
        self._rejections[key] = (call, streak)
        if streak < REJECTED_STREAK:
            log.warning("pass for %s/%s refused, retrying in %.1fs: %s", *key, self.queue.retry(key), exc)
            return
        log.warning("pass for %s/%s refused %d times in a row, retrying in %.0fs: %s", *key, streak,
                    self.max_requeue, exc)
        self._say_rejected(key, exc)
        self.queue.add_after(key, self.max_requeue)

    def _say_rejected(self, key: Key, exc: KubeError) -> None:
        """ReconcileError True (APIRejected) by a status patch of the conditions alone, guarded by the RTJ's
        resourceVersion, and one Warning event when it changes; any failure here is only logged (the next
        refused pass tries again)."""
        body = self.stores.rtjs.get(*key)
        if body is None:
            return
        what = " ".join(p for p in (exc.verb, exc.kind, exc.name) if p) or "a call"
        message = (f"the API server refuses {what} (HTTP {exc.status}): {exc.message[:1024]}; the operator's "
                   f"passes for this job stop there, retried every {self.max_requeue:.0f}s")
        old = (body.get("status") or {}).get("conditions") or []
        have = conditions.get_condition(old, conditions.RECONCILE_ERROR) or {}
        if (have.get("status"), have.get("reason"), have.get("message")) == ("True", conditions.API_REJECTED,
                                                                              message):
            return
        new = conditions.set_condition(old, conditions.RECONCILE_ERROR, True, conditions.API_REJECTED, message,
                                       body["metadata"].get("generation") or 0, datetime.datetime.now(datetime.UTC))
        meta = body["metadata"]
        try:
            self.writer.patch(api.KIND, meta["name"], meta.get("namespace"), {
                "metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": {"conditions": new}},
                subresource="status")
            self.writer.event(body, "Warning", conditions.API_REJECTED, message)
        except Exception as write_exc:
            log.warning("could not set ReconcileError on %s/%s: %s", *key, write_exc)

    def _requeue(self, key: Key, requeue: Requeue, changed: bool) -> None:
        if requeue.act:
            self.queue.add(key, urgent=True)
            self._quiet.pop(key, None)
            return
        seconds = requeue.seconds
        quiet = 0 if changed or not requeue.waiting else self._quiet.get(key, 0) + 1
        self._quiet[key] = quiet
        if quiet:
            seconds = min(seconds * 1.5 ** min(quiet, 8), max(seconds, WAITING_MAX))
            if requeue.deadline is not None:
                seconds = min(seconds, max(requeue.deadline, requeue.seconds))
        self.queue.add_after(key, min(seconds, self.max_requeue), jitter=REQUEUE_JITTER)

    def _forget(self, key: Key) -> None:
        """The RTJ is gone: no series, no requeue, no bookkeeping left behind."""
        self.queue.remove(key)
        self._quiet.pop(key, None)
        self._rejections.pop(key, None)
        metrics.forget(*key)

    def _node(self, name: str) -> dict[str, Any] | None:
        """From the node watch; a GET only for a node it has not delivered (yet, or any more)."""
        node = self.stores.nodes.get("", name)
        if node is not None:
            return node
        with self._lock:
            missed = self._node_misses.get(name)
        if missed is not None and self._clock() - missed < NODE_MISS_SECONDS:
            return None
        node = self.writer.get("Node", name)
        if node is None:
            with self._lock:
                self._node_misses[name] = self._clock()
        return node
