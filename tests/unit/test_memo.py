"""memo.per_version: a pure function's answer for an API object, kept by uid and resourceVersion."""

from __future__ import annotations

import datetime
from typing import Any

from rtj_operator import health, ladder, progress
from rtj_operator.memo import PerVersion


def obj(uid: str | None, version: str | None, **fields: Any) -> dict[str, Any]:
    meta = {k: v for k, v in (("name", f"pod-{uid}"), ("uid", uid), ("resourceVersion", version)) if v}
    return {"metadata": meta, **fields}


def counted() -> tuple[PerVersion, list[Any]]:
    calls: list[Any] = []

    def seen(o: dict[str, Any] | None, *args: Any) -> tuple[Any, ...]:
        calls.append((o, args))
        return ((o or {}).get("status"), *args)

    return PerVersion(seen, limit=4), calls


def test_an_object_version_is_worked_out_once_and_a_new_version_again():
    fn, calls = counted()
    first = fn(obj("a", "1", status="x"))
    assert fn(obj("a", "1", status="x")) is first and len(calls) == 1  # another copy of the same version
    assert fn(obj("a", "2", status="y")) == ("y",) and len(calls) == 2
    assert fn(obj("a", "1", status="x")) == ("x",) and len(calls) == 3  # one answer per object: the newest asked
    assert fn(obj("a", "1", status="x"), "other rules") == ("x", "other rules") and len(calls) == 4


def test_an_object_without_uid_or_version_is_never_kept():
    """Built by hand (a table test's pod, changed in place between passes): worked out at every call."""
    fn, calls = counted()
    for o in (obj(None, "1"), obj("a", None), None, obj(None, "1")):
        fn(o)
    fn(obj("a", None))
    assert len(calls) == 5 and not fn.kept


def test_memory_is_bounded_by_objects_dropping_the_least_recently_changed():
    fn, calls = counted()
    for i in range(4):
        fn(obj(f"u{i}", "1"))
    fn(obj("u0", "2"))  # u0 changed last: u1 is now the least recently changed
    fn(obj("u9", "1"))  # a fifth object: over the limit
    assert len(fn.kept) <= 4 and "u1" not in fn.kept and {"u0", "u9"} <= set(fn.kept)
    before = len(calls)
    fn(obj("u0", "2"))
    assert len(calls) == before  # kept


def test_a_deleted_objects_answers_go_with_its_tombstone():
    """stores.py drops a tombstone TOMBSTONE_SECONDS after the deletion (past 64 of them): what passes
    worked out of the object goes then, not only when a function's limit is reached."""
    from rtj_operator.stores import SWEEP_SECONDS, TOMBSTONE_SECONDS, Store

    now = [0.0]
    store = Store("Pod", clock=lambda: now[0])
    pods = [pod(str(i + 1), f'{{"checkpointStep": {i}}}') for i in range(70)]
    for i, p in enumerate(pods):
        p["metadata"]["uid"], p["metadata"]["name"] = f"u{i}", f"p{i}"
        store.put(p)
        ladder.termination_report(store.get("", f"p{i}"))
    kept = ladder.termination_report.kept  # type: ignore[attr-defined]
    assert {f"u{i}" for i in range(70)} <= set(kept)
    for p in pods:
        store.delete(p)
    now[0] += TOMBSTONE_SECONDS + SWEEP_SECONDS + 1
    store.delete({"metadata": {"name": "other", "uid": "other", "resourceVersion": "1"}})  # sweeps
    assert not {f"u{i}" for i in range(70)} & set(kept)


def pod(version: str, message: str) -> dict[str, Any]:
    return {"metadata": {"name": "p", "uid": "p-uid", "resourceVersion": version},
            "status": {"phase": "Failed", "containerStatuses": [{"state": {"terminated": {
                "exitCode": 1, "message": message}}}]}}


def test_the_readers_a_pass_repeats_per_pod_follow_a_new_version():
    """termination_report and pod_report (JSON a pass reads from every pod), and a node's loss and health."""
    assert ladder.termination_report(pod("1", '{"checkpointStep": 5}'))["checkpointStep"] == 5
    assert ladder.termination_report(pod("2", '{"checkpointStep": 7}'))["checkpointStep"] == 7
    report = '{"progress": {"v": 1, "state": "Training", "step": %d}}'
    assert progress.pod_report(pod("3", report % 10)).step == 10
    assert progress.pod_report(pod("4", report % 11)).step == 11
    now = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)

    def node(version: str, ready: str, **labels: str) -> dict[str, Any]:
        return {"metadata": {"name": "n", "uid": "n-uid", "resourceVersion": version, "labels": labels},
                "status": {"conditions": [{"type": "Ready", "status": ready,
                                           "lastTransitionTime": "2026-12-06T23:59:00Z"}]}}

    assert ladder.node_loss(node("1", "True"), now) == ("", datetime.timedelta(0))
    assert ladder.node_loss(node("2", "Unknown"), now) == (ladder.NODE_UNREACHABLE, datetime.timedelta(minutes=1))
    later = now + datetime.timedelta(minutes=4)  # the same version, later: its outage is longer
    assert ladder.node_loss(node("2", "Unknown"), later)[1] == datetime.timedelta(minutes=5)
    assert health.unhealthy(node("3", "True")) == ""
    sick = node("4", "True", **{health.HYPERPOD_LABEL: sorted(health.HYPERPOD_UNHEALTHY)[0]})
    assert health.unhealthy(sick) and health.unhealthy(sick, health.NONE) == ""


def test_plan_passes_over_steady_pods_as_classify_would():
    """plan() skips classify for a pending or running pod on a node neither lost nor unhealthy: for each
    such pod classify finds nothing and sets no wait (the shortcut may not hide a finding)."""
    now = datetime.datetime(2026, 12, 7, tzinfo=datetime.UTC)
    timing = ladder.Timing()
    node = {"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    for status in ({"phase": "Running"}, {"phase": "Pending"},
                   {"phase": "Running", "containerStatuses": [{"state": {"running": {}}}]},
                   {"phase": "Running", "conditions": [{"type": "DisruptionTarget", "status": "True"}]}):
        p = {"metadata": {"name": "p", "uid": "u"}, "spec": {"nodeName": "n"}, "status": status}
        assert ladder._steady(p)
        plan = ladder.Plan()
        assert ladder.classify(p, node, now, timing, plan) is None and plan.recheck is None
    for status in ({"phase": "Failed"}, {"phase": "Succeeded"}, {},
                   {"phase": "Pending", "containerStatuses": [{"state": {"waiting": {"reason": "ErrImagePull"}}}]},
                   {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                        "reason": "Unschedulable"}]}):
        assert not ladder._steady({"metadata": {"name": "p"}, "spec": {}, "status": status})
    assert not ladder._steady({"metadata": {"name": "p", "deletionTimestamp": "2026-12-07T00:00:00Z"},
                               "status": {"phase": "Running"}})
