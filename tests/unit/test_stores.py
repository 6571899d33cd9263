"""The watch-fed stores passes read instead of GETs and LISTs (stores.py), and the write-through of
the operator's own writes (runtime.StoreKube). Plain unit tests; test_operator.py checks the wiring
on the local control plane."""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest

from rtj_operator import api
from rtj_operator.runtime import StoreKube
from rtj_operator.stores import Store, Stores, rtj_key
from testkit import Clock


def pod(name: str, rv: int, uid: str | None = None, job: str = "train", phase: str = "Running",
        ns: str = "ns", ours: bool = True, node: str = "") -> dict[str, Any]:
    labels = {api.LABEL_NAME: job, **({api.LABEL_MANAGED_BY: api.MANAGER} if ours else {})}
    return {"kind": "Pod", "metadata": {"name": name, "namespace": ns, "uid": uid or f"uid-{name}",
                                        "resourceVersion": str(rv), "labels": labels,
                                        "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": node} if node else {}, "status": {"phase": phase}}


@pytest.fixture
def pods() -> Store:
    return Stores(clock=Clock(0.0)).pods


def names(items: list[dict[str, Any]]) -> list[str]:
    return sorted(p["metadata"]["name"] for p in items)


def of_job(store: Store, job: str = "train") -> list[str]:
    return names(store.indexed("rtj", ("ns", job)))


def test_a_list_is_the_truth_except_for_what_the_watch_delivered_since(pods: Store) -> None:
    pods.put(pod("a", 10))
    pods.put(pod("b", 11))
    pods.put(pod("late", 101))  # created after the LIST's resourceVersion 100
    changed = pods.replace([pod("a", 10)], 100)
    assert of_job(pods) == ["a", "late"]  # b (rv 11 <= 100) is gone: the watch missed its deletion
    assert names(changed) == ["b"]


def test_only_newer_versions_replace_an_object(pods: Store) -> None:
    assert pods.put(pod("a", 20, phase="Failed"))
    assert not pods.put(pod("a", 19, phase="Running"))  # a LIST or a write's reply that raced the watch
    assert not pods.put(pod("a", 20, phase="Running"))  # the echo of our own write
    assert pods.get("ns", "a")["status"]["phase"] == "Failed"


def test_a_deleted_object_never_comes_back_from_an_older_copy(pods: Store) -> None:
    pods.put(pod("a", 30))
    assert pods.delete(pod("a", 60))
    assert not pods.put(pod("a", 30))  # a LIST taken before the deletion
    pods.replace([pod("a", 50)], 50)
    assert pods.get("ns", "a") is None
    assert pods.put(pod("a", 70, uid="new-uid"))  # a new pod of that name is another object


def test_a_new_object_of_the_same_name_replaces_the_old_one(pods: Store) -> None:
    pods.put(pod("a", 30, uid="old"))
    assert pods.put(pod("a", 40, uid="new"))
    assert not pods.delete(pod("a", 31, uid="old"))  # the old one's late deletion leaves the new one
    assert pods.get("ns", "a")["metadata"]["uid"] == "new"


def test_an_object_moves_with_its_labels_and_only_ours_are_indexed(pods: Store) -> None:
    pods.put(pod("a", 1))
    pods.put(pod("a", 2, job="other"))
    pods.put(pod("x", 3, ours=False))  # labelled like the job by hand: not from a Job of ours
    assert of_job(pods) == [] and of_job(pods, "other") == ["a"]
    assert rtj_key(pod("x", 3, ours=False)) == []


def test_copies_are_detached_and_lean(pods: Store) -> None:
    source = pod("a", 1)
    pods.put(source)
    source["status"]["phase"] = "Failed"
    stored = pods.get("ns", "a")
    assert stored["status"]["phase"] == "Running" and "managedFields" not in stored["metadata"]


def test_a_pod_keeps_only_the_spec_a_pass_reads_from_a_watch_or_a_list(pods: Store) -> None:
    """Containers, volumes and tolerations are most of a pod's bytes and the Job's template has them: a store
    of thousands of pods keeps where each runs, the operator's gate and the node affinity the gate lift
    extends. A LIST's items carry no kind: the store's kind decides."""
    spec = {"nodeName": "n1", "schedulingGates": [{"name": api.SCHEDULING_GATE}], "affinity": {"nodeAffinity": {}},
            "containers": [{"name": "worker", "env": [{"name": "X", "value": "1" * 1000}]}],
            "volumes": [{"name": "ckpt"}], "tolerations": [{"key": "nvidia.com/gpu"}]}
    pods.put({**pod("a", 1), "spec": copy.deepcopy(spec)})
    listed = {**pod("b", 2), "spec": copy.deepcopy(spec)}
    del listed["kind"]
    pods.replace([listed], 0)  # a LIST older than "a": "a" stays
    for name in "ab":
        assert pods.get("ns", name)["spec"] == {k: spec[k] for k in ("nodeName", "schedulingGates", "affinity")}
    jobs = Stores(clock=Clock(0.0)).jobs
    jobs.put({"kind": "Job", "metadata": {"name": "j", "namespace": "ns", "uid": "j", "resourceVersion": "1"},
              "spec": {"template": {"spec": spec}}})
    assert jobs.get("ns", "j")["spec"]["template"]["spec"] == spec  # only pods are trimmed


def test_pods_are_found_by_node(pods: Store) -> None:
    stores = Stores()
    stores.pods.put(pod("a", 1, node="n1"))
    stores.pods.put(pod("b", 2, job="other", node="n2"))
    stores.pods.put(pod("a", 3, node="n2"))  # rescheduled (a new pod of that name, in practice)
    assert stores.jobs_on("n2") == {("ns", "train"), ("ns", "other")} and stores.jobs_on("n1") == set()


def test_a_namespaced_list_leaves_other_namespaces_alone(pods: Store) -> None:
    pods.put(pod("a", 1, ns="one"))
    pods.put(pod("b", 2, ns="two"))
    pods.replace([], 100, namespace="one")
    assert pods.get("one", "a") is None and pods.get("two", "b") is not None


def test_concurrent_writers_and_readers_stay_consistent(pods: Store) -> None:
    def write(start: int) -> None:
        for i in range(start, start + 2000):
            pods.put(pod(f"p{i % 50}", i))
            if i % 7 == 0:
                pods.delete(pod(f"p{i % 50}", i + 1))

    writers = [threading.Thread(target=write, args=(k * 2000,)) for k in range(3)]
    for w in writers:
        w.start()
    while any(w.is_alive() for w in writers):
        for p in pods.indexed("rtj", ("ns", "train")):
            assert p["metadata"]["labels"][api.LABEL_NAME] == "train"
    for w in writers:
        w.join()
    assert len(pods.indexed("rtj", ("ns", "train"))) == len(pods)


class FakeKube:
    """What the API server holds, and the calls made to it."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.version = 100
        self.calls: list[str] = []

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

    def delete(self, kind: str, name: str, namespace: str | None, **_: Any) -> dict[str, Any] | None:
        self.calls.append("delete")
        return self.objects.pop(name, None)

    def evict(self, name: str, namespace: str, uid: str | None = None) -> str:
        self.calls.append("evict")
        return "evicted" if name in self.objects else "gone"


def test_the_operators_own_writes_are_seen_by_the_next_pass() -> None:
    stores, kube = Stores(), FakeKube()
    for p in (pod("a", 10), pod("b", 11)):
        kube.objects[p["metadata"]["name"]] = p
        stores.pods.put(p)
    writer = StoreKube(kube, stores)  # type: ignore[arg-type]
    writer.patch("Pod", "a", "ns", {"status": {"phase": "Failed"}}, subresource="status")
    writer.delete("Pod", "b", "ns", grace_seconds=0)  # gone at once: the watch has not said so yet
    assert [(p["metadata"]["name"], p["status"]["phase"]) for p in stores.pods.indexed("rtj", ("ns", "train"))] \
        == [("a", "Failed")]
    assert kube.calls == ["patch", "delete", "get"]


def ended(name: str, rv: int, message: str = "", job: str = "train") -> dict[str, Any]:
    p = pod(name, rv, job=job, phase="Failed")
    p["status"]["containerStatuses"] = [{"state": {"terminated": {"exitCode": 1, "message": message}}}]
    return p


def test_a_deleted_pods_last_words_outlive_it_for_a_while() -> None:
    """The Job controller removes a pod a moment after its container ended (a suspend, a preemption):
    its termination message (the worker's final checkpoint step) must still reach the next pass."""
    clock = Clock(0.0)
    pods = Stores(clock=clock).pods
    pods.put(ended("a", 10, '{"checkpointStep": 40}'))
    pods.put(ended("b", 11))  # nothing said: nothing kept
    pods.delete(ended("a", 12, '{"checkpointStep": 40}'))
    pods.delete(ended("b", 13))
    assert of_job(pods) == [] and names(pods.departed("rtj", ("ns", "train"))) == ["a"]
    assert pods.departed("rtj", ("ns", "other")) == []
    pods.put(ended("c", 20, "x"))
    pods.replace([], 30)  # gone by a LIST: its last copy kept too
    assert names(pods.departed("rtj", ("ns", "train"))) == ["a", "c"]
    clock.now += 121
    assert pods.departed("rtj", ("ns", "train")) == []  # older than DEPARTED_SECONDS: not read, deletion or not
    pods.delete(ended("d", 40, "y"))
    assert names(pods.departed("rtj", ("ns", "train"))) == ["d"]


def test_deleting_a_thousand_pods_sweeps_old_tombstones_not_at_every_deletion() -> None:
    """A 1000-node job deleted (or suspended) sends a deletion per pod: sweeping every tombstone at each of
    them was quadratic. The sweep runs at most every SWEEP_SECONDS; what it sweeps is still only what is
    older than TOMBSTONE_SECONDS, and a tombstone still refuses an older copy until then."""
    from rtj_operator import stores as stores_module
    clock = Clock(0.0)
    store = Stores(clock=clock).pods
    sweeps = []
    gone = store._gone

    class Counting(dict):
        def items(self):  # the sweep's scan
            sweeps.append(clock.now)
            return super().items()

    store._gone = Counting(gone)
    for i in range(1000):
        store.put(pod(f"p{i}", 10 + i))
        store.delete(pod(f"p{i}", 5000 + i))
    assert len(sweeps) <= 1
    assert not store.put(pod("p0", 20))  # an older copy of a deleted pod stays buried
    clock.now += stores_module.TOMBSTONE_SECONDS + stores_module.SWEEP_SECONDS
    store.delete(pod("q", 9000))
    assert len(sweeps) == 2 and set(store._gone) == {"uid-q"}


def test_a_pass_reads_the_last_words_of_its_current_jobs_pods_only() -> None:
    from rtj_operator.world import World
    from testkit import rtj_body
    stores = Stores()
    body = rtj_body()
    name, ns = body["metadata"]["name"], body["metadata"]["namespace"]
    owner = [{"uid": body["metadata"]["uid"], "kind": api.KIND, "name": name}]
    stores.jobs.put({"kind": "Job", "metadata": {"name": name, "namespace": ns, "uid": "job-2", "resourceVersion": "5",
                                                 "labels": {api.LABEL_NAME: name, api.LABEL_MANAGED_BY: api.MANAGER},
                                                 "ownerReferences": owner}})
    for uid, job_uid in (("p-old", "job-1"), ("p-new", "job-2")):
        p = ended(uid, 10, '{"checkpointStep": 1}', job=name)
        p["metadata"].update(namespace=ns, uid=uid, ownerReferences=[{"uid": job_uid, "kind": "Job", "name": name}])
        stores.pods.put(p)
        stores.pods.delete(p)
    world = World.from_stores(stores, body)
    assert [p["metadata"]["uid"] for p in world.departed] == ["p-new"] and world.pods == []


def test_a_pass_sees_the_job_of_the_newest_attempt_and_the_older_gangs_apart() -> None:
    """Each gang attempt has its own Job and coordinator (builders/names.py): the pass converges the newest
    Job and its pods; an older attempt's Job (here an earlier operator's, named '<name>'), its pods and its
    coordinator are the old gang, still going away; a Job or pod labelled like ours but not owned by the RTJ
    (or its Jobs) is nobody's to count."""
    from rtj_operator.builders import build_coordinator, build_job
    from rtj_operator.spec import RTJ
    from rtj_operator.world import World
    from testkit import rtj_body
    stores = Stores()
    body = rtj_body()
    body["status"] = {"attempt": 2}
    rtj = RTJ.from_body(body)
    ns, owner = rtj.namespace, [{"uid": rtj.uid, "kind": api.KIND, "name": rtj.name}]

    def put(obj: dict[str, Any], uid: str, owners: list[dict[str, Any]]) -> dict[str, Any]:
        obj["metadata"].update(uid=uid, resourceVersion="1", ownerReferences=owners)
        (stores.jobs if obj["kind"] == "Job" else stores.pods).put(obj)
        return obj

    legacy = build_job(rtj, 1, name="train")
    legacy["metadata"]["deletionTimestamp"] = "2026-12-07T00:00:00Z"
    put(legacy, "job-1", owner)
    put(build_job(rtj, 2), "job-2", owner)
    put(build_job(rtj, 3, name="train-a9"), "job-x", [{"uid": "someone", "kind": "Deployment", "name": "x"}])
    for name, job_uid in (("train-0-old", "job-1"), ("train-a2-0-new", "job-2"), ("stray", "job-x")):
        put({"kind": "Pod", "metadata": {"name": name, "namespace": ns, "labels": {
            api.LABEL_NAME: rtj.name, api.LABEL_MANAGED_BY: api.MANAGER}}, "spec": {"nodeName": "n1"}},
            f"uid-{name}", [{"uid": job_uid, "kind": "Job", "name": "j"}])
    put(build_coordinator(rtj, 1, "train"), "coord-1", owner)
    put(build_coordinator(rtj, 2), "coord-2", owner)
    world = World.from_stores(stores, body)
    assert world.job["metadata"]["name"] == "train-a2" and [j["metadata"]["name"] for j in world.old_jobs] == ["train"]
    assert [p["metadata"]["name"] for p in world.pods] == ["train-a2-0-new"]
    assert [p["metadata"]["name"] for p in world.old_pods] == ["train-0-old"]
    assert world.coordinator["metadata"]["name"] == "train-a2-rdzv"
    assert [p["metadata"]["name"] for p in world.old_coordinators] == ["train-rdzv"]
    # Before attempt 2's Job exists, the newest is attempt 1's (being deleted): its pods are the pass's.
    stores.jobs.delete(stores.jobs.get(ns, "train-a2"))
    world = World.from_stores(stores, body)
    assert world.job["metadata"]["name"] == "train" and world.old_jobs == []
    assert [p["metadata"]["name"] for p in world.pods] == ["train-0-old"]
    # A Job of someone else's holding the name this attempt needs is the pass's Job: a ChildConflict says so.
    put(build_job(rtj, 2), "theirs", [{"uid": "someone", "kind": "Deployment", "name": "x"}])
    assert World.from_stores(stores, body).job["metadata"]["uid"] == "theirs"
    # Unless this attempt's Job is ours under an earlier operator's name: then that stranger is in nobody's way.
    body["status"] = {"attempt": 1}
    world = World.from_stores(stores, body)
    assert world.job["metadata"]["uid"] == "job-1"
    # A coordinator of this attempt but named for another Job (made by an earlier operator before it made the
    # Job) is not this gang's: its pods look for '<job>-rdzv'.
    assert world.coordinator["metadata"]["name"] == "train-rdzv"
    body["status"] = {"attempt": 2}
    stores.jobs.delete(stores.jobs.get(ns, "train-a2"))
    put(build_coordinator(rtj, 2, "train"), "coord-2-legacy", owner)
    stores.pods.delete(stores.pods.get(ns, "train-a2-rdzv"))
    world = World.from_stores(stores, body)
    assert world.coordinator is None and {p["metadata"]["uid"] for p in world.old_coordinators} == {"coord-2-legacy"}
