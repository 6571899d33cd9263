"""The pods of the operator's jobs, as its pod watch delivers them, so that a pass reads memory
instead of LISTing pods (with 1000 jobs, that LIST was most of what a pass cost the API server and
the operator; a pass woken by a failure then waited behind it).

Consistency: an entry is replaced only by a newer resourceVersion, and a deleted pod leaves a
tombstone, so an older copy (a LIST that raced a watch event) never brings it back. Each job's pods
are LISTed on its first pass and again every RESYNC_SECONDS: the server's word bounds anything the
watch missed (kopf re-lists after a watch expires and reports no deletion in between). The watch
writes from kopf's event loop and passes read from worker threads, so one lock guards it all.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Callable
from typing import Any

from . import api
from .kube import Kube

RESYNC_SECONDS = 60.0
TOMBSTONE_SECONDS = 600.0

Key = tuple[str, str]  # (namespace, RTJ name)


def _rv(obj: dict[str, Any]) -> int:
    try:
        return int(obj["metadata"].get("resourceVersion") or 0)
    except ValueError:  # opaque by contract; numeric on every API server backed by etcd
        return 0


def _key(pod: dict[str, Any]) -> Key | None:
    meta = pod.get("metadata") or {}
    labels = meta.get("labels") or {}
    if labels.get(api.LABEL_MANAGED_BY) != api.MANAGER or not labels.get(api.LABEL_NAME):
        return None  # not made by a Job of ours: the watch never delivers it either
    return meta.get("namespace", ""), labels[api.LABEL_NAME]


class PodCache:
    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._pods: dict[str, dict[str, Any]] = {}  # uid -> pod
        self._jobs: dict[Key, set[str]] = {}  # (namespace, RTJ name) -> uids
        self._gone: dict[str, tuple[int, float]] = {}  # uid -> (resourceVersion, when) of a deleted pod
        self._listed: dict[Key, float] = {}  # when each job's pods were last LISTed

    # --- fed by the watch ----------------------------------------------------------------------
    def put(self, pod: dict[str, Any]) -> None:
        with self._lock:
            self._put(pod)

    def drop(self, pod: dict[str, Any]) -> None:
        uid = pod.get("metadata", {}).get("uid")
        if not uid:
            return
        with self._lock:
            self._bury(uid, _rv(pod))

    # --- read by passes ------------------------------------------------------------------------
    def pods(self, kube: Kube, namespace: str, name: str) -> list[dict[str, Any]]:
        """The job's pods (copies): from memory, or from a LIST when it is due."""
        key = (namespace, name)
        with self._lock:
            due = self._clock() - self._listed.get(key, float("-inf")) >= RESYNC_SECONDS
            if not due:
                found = [self._pods[uid] for uid in sorted(self._jobs.get(key, ()))]
        if due:
            items, version = kube.list_versioned("Pod", namespace, {api.LABEL_NAME: name})
            with self._lock:
                self._replace(key, items, version)
                self._listed[key] = self._clock()
                found = [self._pods[uid] for uid in sorted(self._jobs.get(key, ()))]
        # Stored pods are replaced, never changed in place: copying outside the lock is safe (and
        # keeps 40 threads from queueing on it while one copies with the GIL switching under it).
        return [copy.deepcopy(p) for p in found]

    def jobs_on(self, node: str) -> set[Key]:
        """The jobs with a pod bound to `node`."""
        with self._lock:
            return {key for key, uids in self._jobs.items()
                    if any(self._pods[uid].get("spec", {}).get("nodeName") == node for uid in uids)}

    def refresh(self, kube: Kube, namespace: str, name: str) -> None:
        """After the operator itself changed a pod: its own write is seen by the very next pass."""
        pod = kube.get("Pod", name, namespace)
        if pod is not None:
            self.put(pod)
            return
        with self._lock:  # gone already
            for uid, have in list(self._pods.items()):
                if have["metadata"].get("namespace") == namespace and have["metadata"].get("name") == name:
                    self._bury(uid, _rv(have))

    def forget(self, namespace: str, name: str) -> None:
        """The RTJ is gone: its next daemon (same name, new job) starts with a LIST."""
        with self._lock:
            self._listed.pop((namespace, name), None)

    # --- under the lock ------------------------------------------------------------------------
    def _put(self, pod: dict[str, Any]) -> None:
        uid, key = pod.get("metadata", {}).get("uid"), _key(pod)
        if not uid:
            return
        if uid in self._gone and self._gone[uid][0] >= _rv(pod):
            return  # an older copy of a deleted pod
        have = self._pods.get(uid)
        if have is not None and _rv(have) > _rv(pod):
            return
        self._unlink(uid)
        if key is None:
            return
        self._pods[uid] = pod
        self._jobs.setdefault(key, set()).add(uid)

    def _unlink(self, uid: str) -> None:
        have = self._pods.pop(uid, None)
        if have is not None:
            key = _key(have)
            uids = self._jobs.get(key) if key else None
            if uids is not None:
                uids.discard(uid)
                if not uids:
                    del self._jobs[key]

    def _bury(self, uid: str, version: int) -> None:
        """Gone: a tombstone keeps older copies out for a while."""
        self._unlink(uid)
        self._gone[uid] = (version, self._clock())
        horizon = self._clock() - TOMBSTONE_SECONDS
        for old in [u for u, (_, when) in self._gone.items() if when < horizon]:
            del self._gone[old]

    def _replace(self, key: Key, items: list[dict[str, Any]], version: int) -> None:
        """A LIST at `version` is the truth for this job's pods, except for what the watch
        delivered since (newer)."""
        listed = {p["metadata"].get("uid") for p in items}
        for uid in list(self._jobs.get(key, ())):
            if uid not in listed and _rv(self._pods[uid]) <= version:
                self._unlink(uid)
        for pod in items:
            self._put(pod)


class CachedKube:
    """A Kube for one pass whose pod LIST is served by a PodCache; every other call goes through."""

    def __init__(self, kube: Kube, cache: PodCache):
        self._kube, self._cache = kube, cache

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kube, name)

    def list(self, kind: str, namespace: str | None = None,
             labels: dict[str, str] | None = None) -> list[dict[str, Any]]:
        if kind != "Pod" or not namespace or set(labels or {}) != {api.LABEL_NAME}:
            return self._kube.list(kind, namespace, labels)
        return self._cache.pods(self._kube, namespace, (labels or {})[api.LABEL_NAME])

    def patch(self, kind: str, name: str, namespace: str | None, patch: dict[str, Any],
              subresource: str | None = None, strategic: bool = False) -> dict[str, Any]:
        result = self._kube.patch(kind, name, namespace, patch, subresource=subresource, strategic=strategic)
        if kind == "Pod" and result:
            self._cache.put(result)
        return result

    def delete(self, kind: str, name: str, namespace: str | None, **options: Any) -> bool:
        deleted = self._kube.delete(kind, name, namespace, **options)
        if kind == "Pod" and namespace:
            self._cache.refresh(self._kube, namespace, name)
        return deleted

    def evict(self, name: str, namespace: str) -> bool:
        evicted = self._kube.evict(name, namespace)
        self._cache.refresh(self._kube, namespace, name)
        return evicted
