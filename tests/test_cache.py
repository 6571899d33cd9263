"""The pod cache that serves passes instead of a LIST per pass, and how passes are queued
(handlers._run). Plain unit tests: what the API server does here is one LIST and one GET, given by
a fake; test_operator.py checks the wiring on the local control plane."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any

import pytest

from rtj_operator import api, cache, handlers
from rtj_operator.cache import CachedKube, PodCache


def pod(name: str, rv: int, uid: str | None = None, job: str = "train", phase: str = "Running",
        ns: str = "ns", ours: bool = True) -> dict[str, Any]:
    labels = {api.LABEL_NAME: job, **({api.LABEL_MANAGED_BY: api.MANAGER} if ours else {})}
    return {"kind": "Pod", "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}",
                                        "resourceVersion": str(rv), "labels": labels},
            "status": {"phase": phase}}


class FakeKube:
    """What the API server holds, and the calls made to it."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 100
        self.calls: list[str] = []

    def list_versioned(self, kind: str, namespace: str | None = None,
                       labels: dict[str, str] | None = None) -> tuple[list[dict[str, Any]], int]:
        self.calls.append("list")
        items = [p for p in self.objects.values() if p["metadata"]["namespace"] == namespace
                 and all(p["metadata"]["labels"].get(k) == v for k, v in (labels or {}).items())]
        return items, self.version

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        self.calls.append("get")
        return self.objects.get(name)

    def patch(self, kind: str, name: str, namespace: str | None, patch: dict[str, Any], **_: Any) -> dict[str, Any]:
        self.calls.append("patch")
        self.version += 1
        obj = self.objects[name]
        obj["status"].update(patch.get("status", {}))
        obj["metadata"]["resourceVersion"] = str(self.version)
        return obj

    def delete(self, kind: str, name: str, namespace: str | None, **_: Any) -> bool:
        self.calls.append("delete")
        return self.objects.pop(name, None) is not None

    def evict(self, name: str, namespace: str) -> bool:
        self.calls.append("evict")
        return name in self.objects


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def pods(clock: Clock) -> PodCache:
    return PodCache(clock=clock)


def names(items: list[dict[str, Any]]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in items)


def test_the_first_read_lists_then_the_watch_serves_until_the_resync(pods: PodCache, clock: Clock) -> None:
    kube = FakeKube()
    kube.objects["a"] = pod("a", 10)
    assert names(pods.pods(kube, "ns", "train")) == ["a"]
    pods.put(pod("b", 11))  # the watch delivers a new pod; the server's LIST is not asked again
    clock.now += cache.RESYNC_SECONDS - 1
    assert names(pods.pods(kube, "ns", "train")) == ["a", "b"]
    assert kube.calls == ["list"]
    clock.now += 1
    assert names(pods.pods(kube, "ns", "train")) == ["a"]  # the LIST is the truth: b (rv 11 <= 100) is gone
    assert kube.calls == ["list", "list"]


def test_a_resync_keeps_what_the_watch_delivered_after_the_list(pods: PodCache, clock: Clock) -> None:
    kube = FakeKube()
    pods.put(pod("new", 101))  # created after the LIST's resourceVersion 100
    assert names(pods.pods(kube, "ns", "train")) == ["new"]


def test_only_newer_versions_replace_a_pod(pods: PodCache) -> None:
    kube = FakeKube()
    pods.pods(kube, "ns", "train")
    pods.put(pod("a", 20, phase="Failed"))
    pods.put(pod("a", 19, phase="Running"))  # a LIST or a write's reply that raced the watch
    assert [p["status"]["phase"] for p in pods.pods(kube, "ns", "train")] == ["Failed"]


def test_a_deleted_pod_never_comes_back_from_an_older_copy(pods: PodCache, clock: Clock) -> None:
    kube = FakeKube()
    kube.objects["a"] = pod("a", 30)
    pods.pods(kube, "ns", "train")
    kube.version = 50  # a LIST taken before the deletion ...
    pods.drop(pod("a", 60))
    clock.now += cache.RESYNC_SECONDS
    assert pods.pods(kube, "ns", "train") == []  # ... does not bring it back
    pods.put(pod("a", 30))
    assert pods.pods(kube, "ns", "train") == []


def test_a_pod_moves_with_its_labels_and_only_ours_are_kept(pods: PodCache) -> None:
    kube = FakeKube()
    pods.pods(kube, "ns", "train")
    pods.pods(kube, "ns", "other")
    pods.put(pod("a", 1))
    pods.put(pod("a", 2, job="other"))
    pods.put(pod("x", 3, ours=False))  # labelled like the job by hand: not from a Job of ours
    assert names(pods.pods(kube, "ns", "train")) == []
    assert names(pods.pods(kube, "ns", "other")) == ["a"]


def test_readers_get_copies(pods: PodCache) -> None:
    kube = FakeKube()
    pods.pods(kube, "ns", "train")
    pods.put(pod("a", 1))
    pods.pods(kube, "ns", "train")[0]["status"]["phase"] = "Failed"
    assert pods.pods(kube, "ns", "train")[0]["status"]["phase"] == "Running"


def test_the_operators_own_pod_writes_are_seen_by_the_next_pass(pods: PodCache) -> None:
    kube = FakeKube()
    kube.objects["a"] = pod("a", 10)
    kube.objects["b"] = pod("b", 11)
    cached = CachedKube(kube, pods)  # type: ignore[arg-type]
    assert names(cached.list("Pod", "ns", {api.LABEL_NAME: "train"})) == ["a", "b"]
    cached.patch("Pod", "a", "ns", {"status": {"phase": "Failed"}}, subresource="status")
    cached.delete("Pod", "b", "ns", grace_seconds=0)  # gone at once: the watch has not said so yet
    listed = cached.list("Pod", "ns", {api.LABEL_NAME: "train"})
    assert [(p["metadata"]["name"], p["status"]["phase"]) for p in listed] == [("a", "Failed")]
    assert kube.calls == ["list", "patch", "delete", "get"]


def test_other_lists_go_to_the_server(pods: PodCache) -> None:
    kube = FakeKube()
    cached = CachedKube(kube, pods)  # type: ignore[arg-type]
    kube.list = lambda kind, namespace=None, labels=None: [kind]  # type: ignore[attr-defined]
    assert cached.list("Node") == ["Node"]
    assert cached.list("Pod", "ns", {"app": "x"}) == ["Pod"]


def test_concurrent_writers_and_readers_stay_consistent(pods: PodCache) -> None:
    kube = FakeKube()
    pods.pods(kube, "ns", "train")

    def write(start: int) -> None:
        for i in range(start, start + 2000):
            pods.put(pod(f"p{i % 50}", i))
            if i % 7 == 0:
                pods.drop(pod(f"p{i % 50}", i + 1))

    writers = [threading.Thread(target=write, args=(k * 2000,)) for k in range(3)]
    for w in writers:
        w.start()
    while any(w.is_alive() for w in writers):
        for p in pods.pods(kube, "ns", "train"):
            assert p["metadata"]["labels"][api.LABEL_NAME] == "train"
    for w in writers:
        w.join()


# --- how passes are queued ---------------------------------------------------------------------

def context(threads: int = 1) -> handlers.Context:
    return handlers.Context(kube=None,  # type: ignore[arg-type]
                            pool=concurrent.futures.ThreadPoolExecutor(threads),
                            event_pool=concurrent.futures.ThreadPoolExecutor(1))


def test_a_failure_withdraws_a_pass_still_queued_behind_other_jobs() -> None:
    memo, key = context(), ("ns", "train")
    release = threading.Event()
    memo.pool.submit(release.wait)  # another job's pass holds the only thread
    ran: list[str] = []

    async def scenario() -> Any:
        memo.wakeups[key], memo.alarms[key] = asyncio.Event(), asyncio.Event()
        run = asyncio.ensure_future(handlers._run(memo, memo.alarms[key], False,
                                                  lambda: ran.append("timer") or (1.0, None)))
        await asyncio.sleep(0.05)
        memo.wake(*key, urgent=True)
        return await asyncio.wait_for(run, 5)

    try:
        assert asyncio.run(scenario()) is None  # withdrawn: the daemon runs it on the event pool
    finally:
        release.set()
        memo.pool.shutdown(wait=True)
    assert ran == []


def test_a_pass_already_running_is_not_withdrawn() -> None:
    memo, key = context(), ("ns", "train")
    started, release = threading.Event(), threading.Event()

    def work() -> tuple[float, None]:
        started.set()
        release.wait(5)
        return 2.0, None

    async def scenario() -> Any:
        memo.wakeups[key], memo.alarms[key] = asyncio.Event(), asyncio.Event()
        run = asyncio.ensure_future(handlers._run(memo, memo.alarms[key], False, work))
        while not started.is_set():
            await asyncio.sleep(0.01)
        memo.wake(*key, urgent=True)
        await asyncio.sleep(0.05)
        release.set()
        return await asyncio.wait_for(run, 5)

    assert asyncio.run(scenario()) == (2.0, None)
    assert memo.alarms[key].is_set()  # the daemon's next pass is the urgent one


def test_a_node_names_the_jobs_with_pods_on_it(pods: PodCache) -> None:
    placed = [pod("a", 1), pod("b", 2, job="other"), pod("c", 3, job="third")]
    for p, node in zip(placed, ("n1", "n2", "n1"), strict=True):
        p["spec"] = {"nodeName": node}
        pods.put(p)
    assert pods.jobs_on("n1") == {("ns", "train"), ("ns", "third")}
    assert pods.jobs_on("n3") == set()
