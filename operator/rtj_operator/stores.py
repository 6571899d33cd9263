"""Watch-fed stores: what a pass reads instead of GETs and LISTs (an informer's cache, in short).

One Store per kind (RTJs, Jobs, Services, PVCs, pods, nodes), fed by kopf's watches and by the
operator's own writes (their responses), and primed by one LIST per kind at start-up: `synced`
is set only then, so no pass ever acts on a partial list (a pod missing from a half-filled store
would look deleted; a node missing, lost).

Consistency rules, the same for every kind:
- an object is replaced only by a newer resourceVersion, never by an older one (a LIST that raced
  a watch event, a watch event that lags our own write);
- a deletion leaves a tombstone (uid -> resourceVersion), so an older copy cannot bring it back;
- a store may keep an object's last copy for a while after its deletion (`departed`), for what only
  that copy says: a pod the Job controller removes a moment after its container ended takes its
  termination message (the worker's final checkpoint step) with it, possibly before any pass ran;
- `replace()` applies a LIST: it is the truth at its resourceVersion, except for what the watch
  delivered since. Periodic re-LISTs bound anything a watch missed (kopf re-lists after a watch
  expires and reports no deletions in between).

Stored objects are detached dicts that are replaced, never changed in place: readers must not
mutate them (World copies the few objects a pass may patch; a pass reads the pods and nodes, the bulk of it,
as the stores hold them). One lock per store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Iterable
from typing import Any

from . import api, memo
from .copies import clone

TOMBSTONE_SECONDS = 600.0
SWEEP_SECONDS = 30.0
DEPARTED_SECONDS = 120.0  # long past the next pass of its RTJ, which reads it
Ref = tuple[str, str]  # (namespace, name); namespace "" for cluster-scoped kinds
# What a pass reads of a pod's spec: where it runs, the operator's scheduling gate, and the node affinity the
# gate lift extends with the exclusions. The rest (containers with their environment, volumes, tolerations:
# most of a pod's bytes) is the Job's template, which the pass reads from the Job. A store of 8,000 pods
# otherwise outgrows the chart's memory limit (issue 29).
POD_SPEC_KEPT = frozenset({"nodeName", "schedulingGates", "affinity"})
Indexer = Callable[[dict[str, Any]], Iterable[Hashable]]


def resource_version(obj: dict[str, Any] | None) -> int:
    """resourceVersions are opaque by contract and etcd revisions on every real API server."""
    try:
        return int(((obj or {}).get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def ref(obj: dict[str, Any]) -> Ref:
    meta = obj.get("metadata") or {}
    return meta.get("namespace") or "", meta.get("name") or ""


def detached(obj: dict[str, Any], kind: str = "") -> dict[str, Any]:
    """A store's copy: managedFields (half an object's bytes) left out, nothing shared with the source.
    A pod keeps only the part of its spec a pass reads (POD_SPEC_KEPT), a node not its image list."""
    plain = {k: v for k, v in obj.items() if k != "metadata"}
    plain["metadata"] = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "managedFields"}
    if kind == "Pod" and isinstance(obj.get("spec"), dict):  # a LIST's items carry no kind: the store's
        plain["spec"] = {k: v for k, v in obj["spec"].items() if k in POD_SPEC_KEPT}
    if kind == "Node" and isinstance(obj.get("status"), dict) and "images" in obj["status"]:
        # The images a node holds (often most of a GPU node's bytes): no pass reads them.
        plain["status"] = {k: v for k, v in obj["status"].items() if k != "images"}
    return clone(plain)


def rtj_key(obj: dict[str, Any]) -> list[tuple[str, str]]:
    """The RTJ a child belongs to, from the labels the operator puts on its children."""
    meta = obj.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(api.LABEL_MANAGED_BY) != api.MANAGER or not labels.get(api.LABEL_NAME):
        return []
    return [(meta.get("namespace") or "", labels[api.LABEL_NAME])]


def node_of(pod: dict[str, Any]) -> list[str]:
    node = (pod.get("spec") or {}).get("nodeName")
    return [node] if node else []


def left_a_message(pod: dict[str, Any]) -> bool:
    """A pod one of whose containers ended with a termination message (the worker's report)."""
    return any(((cs.get("state") or {}).get("terminated") or {}).get("message")
               for cs in (pod.get("status") or {}).get("containerStatuses") or [])


class Store:
    def __init__(self, kind: str, indexers: dict[str, Indexer] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 keep_departed: Callable[[dict[str, Any]], bool] | None = None):
        self.kind = kind
        self._keep_departed = keep_departed
        self._departed: dict[str, tuple[float, dict[str, Any]]] = {}  # uid -> (when, last copy)
        self.synced = threading.Event()
        self._clock = clock
        self._lock = threading.Lock()
        self._objects: dict[Ref, dict[str, Any]] = {}
        self._gone: dict[str, tuple[int, float]] = {}  # uid -> (resourceVersion, when) of a deleted object
        self._next_sweep = float("-inf")  # when _sweep next drops old tombstones and last copies
        self._indexers = indexers or {}
        self._indexes: dict[str, dict[Hashable, set[Ref]]] = {name: {} for name in self._indexers}

    # --- writes (watch, LIST, our own writes) ------------------------------------------------------
    def put(self, obj: dict[str, Any], detach: bool = True) -> bool:
        """Store `obj` unless an equal or newer version (or its tombstone) is there; True if stored.
        `detach=False` for an object the caller made and will not touch again."""
        with self._lock:
            return self._put(detached(obj, self.kind) if detach else obj)

    def delete(self, obj: dict[str, Any]) -> bool:
        """The object is gone; True if the store held it."""
        with self._lock:
            have = self._objects.get(ref(obj))
            uid = (obj.get("metadata") or {}).get("uid")
            if have is not None and uid and (have.get("metadata") or {}).get("uid") != uid:
                return False  # a newer object of that name replaced it already
            last = obj if have is None or resource_version(obj) >= resource_version(have) else have
            self._remember(detached(last, self.kind) if last is obj else last)
            self._bury(obj)
            if have is not None:
                self._unlink(ref(obj))
                return True
            return False

    def replace(self, items: list[dict[str, Any]], version: int,
                namespace: str | None = None) -> list[dict[str, Any]]:
        """A LIST (of `namespace`, or of every namespace) at `version`; returns what changed (the new
        copies, and the last copies of what the LIST shows is gone)."""
        changed: list[dict[str, Any]] = []
        listed = {ref(i) for i in items}
        with self._lock:
            for key, have in list(self._objects.items()):
                if namespace is not None and key[0] != namespace:
                    continue
                if key not in listed and resource_version(have) <= version:
                    self._remember(have)
                    self._bury(have)
                    self._unlink(key)
                    changed.append(have)
            for item in items:
                copy_ = detached(item, self.kind)
                if self._put(copy_):
                    changed.append(copy_)
        return changed

    # --- reads -----------------------------------------------------------------------------------
    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            return self._objects.get((namespace, name))

    def indexed(self, index: str, value: Hashable) -> list[dict[str, Any]]:
        with self._lock:
            return [self._objects[r] for r in sorted(self._indexes[index].get(value, ()))]

    def index_values(self, index: str) -> list[Hashable]:
        with self._lock:
            return list(self._indexes[index])

    def all(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._objects.values())

    def departed(self, index: str, value: Hashable) -> list[dict[str, Any]]:
        """Last copies of objects of `index` == `value` deleted in the last DEPARTED_SECONDS (kept only
        where `keep_departed` says so)."""
        horizon = self._clock() - DEPARTED_SECONDS
        with self._lock:
            return [obj for when, obj in self._departed.values()
                    if when >= horizon and value in self._indexers[index](obj)]

    def __len__(self) -> int:
        with self._lock:
            return len(self._objects)

    # --- under the lock ------------------------------------------------------------------------
    def _put(self, obj: dict[str, Any]) -> bool:
        key, uid, version = ref(obj), (obj.get("metadata") or {}).get("uid"), resource_version(obj)
        if uid and uid in self._gone and self._gone[uid][0] >= version:
            return False  # an older copy of a deleted object
        have = self._objects.get(key)
        if have is not None:
            same = (have.get("metadata") or {}).get("uid") == uid
            if same and resource_version(have) >= version:
                return False
            if not same and resource_version(have) > version:
                return False  # an older object of that name, deleted and re-created since
            self._unlink(key)
        self._objects[key] = obj
        for name, indexer in self._indexers.items():
            for value in indexer(obj):
                self._indexes[name].setdefault(value, set()).add(key)
        return True

    def _unlink(self, key: Ref) -> None:
        have = self._objects.pop(key, None)
        if have is None:
            return
        for name, indexer in self._indexers.items():
            for value in indexer(have):
                refs = self._indexes[name].get(value)
                if refs is not None:
                    refs.discard(key)
                    if not refs:
                        del self._indexes[name][value]

    def _remember(self, obj: dict[str, Any]) -> None:
        now = self._clock()
        self._sweep(now)
        uid = (obj.get("metadata") or {}).get("uid")
        if uid and self._keep_departed is not None and self._keep_departed(obj):
            self._departed[uid] = (now, obj)

    def _bury(self, obj: dict[str, Any]) -> None:
        uid = (obj.get("metadata") or {}).get("uid")
        now = self._clock()
        if uid:
            self._gone[uid] = (resource_version(obj), now)
        self._sweep(now)

    def _sweep(self, now: float) -> None:
        """Drop last copies older than DEPARTED_SECONDS and (past 64 of them) tombstones older than
        TOMBSTONE_SECONDS, at most once per SWEEP_SECONDS: sweeping at every deletion made a 1000-pod job's
        deletion quadratic (each of its pods' events scanned every earlier one's)."""
        if now < self._next_sweep or not (self._departed or len(self._gone) > 64):
            return
        self._next_sweep = now + SWEEP_SECONDS
        for old in [u for u, (when, _) in self._departed.items() if when < now - DEPARTED_SECONDS]:
            del self._departed[old]
        if len(self._gone) > 64:
            for old in [u for u, (_, when) in self._gone.items() if when < now - TOMBSTONE_SECONDS]:
                del self._gone[old]
                memo.forget(old)  # what passes worked out of it (memo.py): long unread


class Stores:
    """The stores of every kind a pass reads."""

    KINDS = (api.KIND, "Job", "Service", "PersistentVolumeClaim", "NetworkPolicy", "Pod", "Node")

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self.rtjs = Store(api.KIND, clock=clock)
        self.jobs = Store("Job", {"rtj": rtj_key}, clock=clock)
        self.services = Store("Service", {"rtj": rtj_key}, clock=clock)
        self.pvcs = Store("PersistentVolumeClaim", {"rtj": rtj_key}, clock=clock)
        self.network_policies = Store("NetworkPolicy", {"rtj": rtj_key}, clock=clock)
        self.pods = Store("Pod", {"rtj": rtj_key, "node": node_of}, clock=clock, keep_departed=left_a_message)
        self.nodes = Store("Node", clock=clock)

    def of(self, kind: str) -> Store:
        return {api.KIND: self.rtjs, "Job": self.jobs, "Service": self.services,
                "PersistentVolumeClaim": self.pvcs, "NetworkPolicy": self.network_policies, "Pod": self.pods,
                "Node": self.nodes}[kind]

    @property
    def synced(self) -> bool:
        return all(self.of(kind).synced.is_set() for kind in self.KINDS)

    def jobs_on(self, node: str) -> set[tuple[str, str]]:
        """The RTJs with a pod bound to `node`."""
        return {key for pod in self.pods.indexed("node", node) for key in rtj_key(pod)}
