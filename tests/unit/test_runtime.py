"""The runtime's wiring (runtime.py) without an API server: what a watch event queues, the synced guard
at start-up, and how requeues stretch while passes change nothing. A fake clock and a fake Kube that
answers LISTs from memory; no worker threads unless a test starts them."""

from __future__ import annotations

import copy
import json
import threading
import time
from typing import Any

import pytest
from test_reconcile_table import NOW, W, ts

from rtj_operator import api, progress
from rtj_operator.actions import Result
from rtj_operator.conditions import get_condition
from rtj_operator.kube import KubeError
from rtj_operator.reconcile import Requeue, settle
from rtj_operator.runtime import EVENT_SPACING, WAITING_MAX, Runtime
from rtj_operator.stores import Stores
from testkit import Clock, wait_until

OURS = {api.LABEL_MANAGED_BY: api.MANAGER}


class FakeKube:
    """LISTs from `objects` (kind -> items); records the order of calls."""

    def __init__(self, objects: dict[str, list[dict[str, Any]]]):
        self.objects, self.calls = objects, []
        self.patches: list[dict[str, Any]] = []
        self.events: list[tuple[str, str, str, str]] = []
        self.on_list: Any = None

    def list_versioned(self, kind: str, namespace: str | None, selector: dict[str, str] | None = None):
        self.calls.append(("list", kind))
        if self.on_list:
            self.on_list(kind)
        return copy.deepcopy(self.objects.get(kind, [])), 100

    def get(self, kind: str, name: str, namespace: str | None = None) -> None:
        self.calls.append(("get", kind))
        return None

    def patch(self, kind: str, name: str, namespace: str | None, patch: dict[str, Any],
              subresource: str | None = None, strategic: bool = False) -> dict[str, Any]:
        """Status patches of the RTJs in `objects`, kept (the resourceVersion moves on)."""
        self.calls.append(("patch", kind))
        self.patches.append(copy.deepcopy(patch))
        (obj,) = [o for o in self.objects[kind] if o["metadata"]["name"] == name]
        obj.setdefault("status", {}).update(copy.deepcopy(patch.get("status") or {}))
        obj["metadata"]["resourceVersion"] = str(int(obj["metadata"]["resourceVersion"]) + 1)
        return copy.deepcopy(obj)

    def event(self, involved: dict[str, Any], type_: str, reason: str, message: str) -> None:
        self.events.append((involved["metadata"]["name"], type_, reason, message))


def rtj(name: str, rv: int = 1) -> dict[str, Any]:
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": name, "namespace": "ns", "uid": f"u-{name}", "resourceVersion": str(rv)},
            "spec": {}}


def pod(job: str, rv: int, phase: str = "Running", node: str = "n1", index: str = "0") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"{job}-{index}", "namespace": "ns", "uid": f"p-{job}-{index}",
                         "resourceVersion": str(rv), "labels": {**OURS, api.LABEL_NAME: job}},
            "spec": {"nodeName": node}, "status": {"phase": phase}}


def node(name: str, rv: int, ready: str = "True") -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "resourceVersion": str(rv)},
            "status": {"conditions": [{"type": "Ready", "status": ready,
                                       "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}


@pytest.fixture
def runtime() -> Runtime:
    clock = Clock()
    objects = {api.KIND: [rtj("a"), rtj("b"), rtj("c")],
               "Pod": [pod("a", 10, node="n1"), pod("b", 11, node="n2")],
               "Node": [node("n1", 20), node("n2", 21)]}
    rt = Runtime(FakeKube(objects), workers=0, clock=clock)  # type: ignore[arg-type]
    rt.resync()
    for key in [("ns", "a"), ("ns", "b"), ("ns", "c")]:  # nothing pending: each test queues what it sees
        rt.queue.remove(key)
    return rt


def drain(rt: Runtime) -> list[tuple[str, str]]:
    keys = []
    while (key := rt.queue.get(timeout=0)) is not None:
        keys.append(key)
        rt.queue.done(key)
    return keys


def drain_when(rt: Runtime, n: int, timeout: float = 5.0) -> list[tuple[str, str]]:
    """`n` keys, as another thread (start()'s) queues them."""
    keys: list[tuple[str, str]] = []
    deadline = time.monotonic() + timeout
    while len(keys) < n and time.monotonic() < deadline:
        if (key := rt.queue.get(timeout=0.05)) is not None:
            keys.append(key)
            rt.queue.done(key)
    return keys


def test_start_lists_every_kind_before_any_key_is_queued() -> None:
    """The synced guard: one LIST per kind fills the stores, and only then is any RTJ queued."""
    kube = FakeKube({api.KIND: [rtj("a"), rtj("b")], "Pod": [pod("a", 10)]})
    rt = Runtime(kube, workers=0, clock=Clock())  # type: ignore[arg-type]
    depths = []
    kube.on_list = lambda kind: depths.append(rt.queue.depth())
    assert not rt.stores.synced
    rt.start()
    try:
        assert rt.wait_synced(5)
        assert [c for c in kube.calls if c[0] == "list"] == [("list", k) for k in Stores.KINDS]
        assert depths == [0] * len(Stores.KINDS)
        assert sorted(drain_when(rt, 2)) == [("ns", "a"), ("ns", "b")]
    finally:
        rt.stop()


def test_start_returns_while_the_api_server_is_unreachable_and_lists_once_it_answers(monkeypatch) -> None:
    """kopf serves the liveness endpoint only after its startup handler (which calls start()) returns:
    an API server that cannot be reached yet must not hold it, nor end it. The LIST is retried; no
    key is queued and no pass runs before every store is filled."""
    import rtj_operator.runtime as runtime_module
    monkeypatch.setattr(runtime_module, "PRIME_RETRY_FIRST", 0.05)
    kube = FakeKube({api.KIND: [rtj("a")]})
    refusals = []

    def refuse(kind: str) -> None:
        if len(refusals) < 3:
            refusals.append(kind)
            # unreachable, then a CRD not installed yet (helm installs it beside the operator)
            raise ConnectionRefusedError("connection refused") if len(refusals) < 3 else KubeError(404, "not found")
    kube.on_list = refuse
    rt = Runtime(kube, workers=1, clock=Clock())  # type: ignore[arg-type]
    ran: list[Any] = []
    rt.run = lambda key: ran.append((key, rt.stores.synced))  # type: ignore[method-assign]
    rt.queue.add(("ns", "early"))  # a watch event before the stores are filled
    rt.start()  # returns although the LIST fails
    try:
        assert not rt.stores.synced
        assert rt.wait_synced(5), kube.calls
        assert len(refusals) == 3
        wait_until(lambda: len(ran) == 2, timeout=5, what=f"two passes (ran: {ran})")
        # Each pass ran on filled stores, the early key's too.
        assert sorted(ran) == [(("ns", "a"), True), (("ns", "early"), True)], ran
    finally:
        rt.stop()


def test_workers_take_no_key_before_the_stores_are_synced() -> None:
    rt = Runtime(FakeKube({}), workers=0, clock=Clock())  # type: ignore[arg-type]
    ran = []
    rt.run = ran.append  # type: ignore[method-assign]
    rt.queue.add(("ns", "a"))
    worker = threading.Thread(target=rt._work, daemon=True)
    worker.start()
    worker.join(0.5)
    assert ran == [] and rt.queue.pending(("ns", "a")) == "queued"
    rt.resync()
    worker.join(1.5)
    rt._stop.set()
    worker.join(2)
    assert ran == [("ns", "a")]


def test_a_pod_held_by_the_operators_gate_is_not_coalesced_and_waits_only_behind_failures(runtime: Runtime) -> None:
    """Nothing places a gated pod until a pass lifts the gate: its event queues the key at once (not
    EVENT_SPACING after the last pass, as other events), in the release lane: after failures, before
    other jobs' passes (a new RTJ's first)."""
    runtime.observe("Pod", "MODIFIED", pod("b", 12, node="n2"))
    assert drain(runtime) == [("ns", "b")]  # b's pass began just now
    held = pod("b", 13, node="", index="1")
    held["spec"] = {"schedulingGates": [{"name": api.SCHEDULING_GATE}]}
    runtime.queue.add(("ns", "c"))  # e.g. a new RTJ: its first pass
    runtime.observe("Pod", "ADDED", held)
    runtime.observe("Pod", "MODIFIED", pod("a", 14, phase="Failed"))
    assert [runtime.queue.pending(("ns", k)) for k in "abc"] == ["urgent", "release", "queued"]
    assert drain(runtime) == [("ns", "a"), ("ns", "b"), ("ns", "c")]


def test_a_failure_jumps_the_queue_and_other_events_coalesce(runtime: Runtime) -> None:
    runtime.observe("Pod", "MODIFIED", {**pod("b", 12, node="n2"), "metadata": {
        **pod("b", 12)["metadata"], "annotations": {"x": "1"}}})  # not a failure: spaced, normal lane
    runtime.observe("Pod", "MODIFIED", pod("a", 13, phase="Failed"))  # a failure: urgent
    assert (runtime.queue.pending(("ns", "a")), runtime.queue.pending(("ns", "b"))) == ("urgent", "queued")
    assert drain(runtime) == [("ns", "a"), ("ns", "b")]  # the failure first, though it came second
    # b's pass began just now: its next non-failure event waits EVENT_SPACING after it.
    runtime.observe("Pod", "MODIFIED", pod("b", 14, node="n2"))
    runtime.observe("Pod", "MODIFIED", pod("b", 15, node="n2"))
    assert runtime.queue.pending(("ns", "b")) == "delayed" and runtime.queue.depth() == 0
    runtime._clock.now += EVENT_SPACING  # type: ignore[attr-defined]
    assert drain(runtime) == [("ns", "b")]  # two events, one pass


def reporting(p: dict[str, Any], step: int, state: str = "Training") -> dict[str, Any]:
    report = {"v": 1, "state": state, "step": step, "stepAt": 1000.0 + step, "at": 1000.0 + step,
              "restarts": {"InProcess": 0, "Launcher": 0}}
    p["status"]["conditions"] = [{"type": progress.CONDITION, "status": str(state == "Training"), "reason": state,
                                  "message": json.dumps(report)}]
    return p


def test_reports_that_only_move_the_step_on_wake_the_job_at_most_every_progress_seconds(runtime: Runtime) -> None:
    """At 1000 nodes the pods' reports arrive several a second: each one waking a pass (spaced EVENT_SPACING)
    would keep a core busy. A refresh wakes the job no sooner than PROGRESS_SECONDS after its last pass began
    (status.progress is rewritten no more often anyway); a change of state wakes it as any event does."""
    key = ("ns", "b")
    runtime.observe("Pod", "MODIFIED", reporting(pod("b", 12, node="n2"), step=10))  # the first report
    assert drain(runtime) == [key]
    runtime.observe("Pod", "MODIFIED", reporting(pod("b", 13, node="n2"), step=20))
    runtime._clock.now += EVENT_SPACING  # type: ignore[attr-defined]
    assert drain(runtime) == []  # a refresh: not at EVENT_SPACING ...
    runtime._clock.now += progress.PROGRESS_SECONDS - EVENT_SPACING  # type: ignore[attr-defined]
    assert drain(runtime) == [key]  # ... but PROGRESS_SECONDS after the last pass began
    runtime.observe("Pod", "MODIFIED", reporting(pod("b", 14, node="n2"), step=30, state="Recovering"))
    runtime._clock.now += EVENT_SPACING  # type: ignore[attr-defined]
    assert drain(runtime) == [key]  # a new state: at the events' pace


def test_the_echo_of_the_operators_own_write_wakes_no_one(runtime: Runtime) -> None:
    written = pod("a", 30, phase="Failed")
    runtime.writer._keep("Pod", written)  # the response to the operator's own write
    runtime.observe("Pod", "MODIFIED", written)  # its watch event: not newer than what the store holds
    runtime.observe("Pod", "MODIFIED", pod("a", 29, phase="Running"))  # an older copy, late
    assert runtime.queue.depth() == 0 and runtime.queue.pending(("ns", "a")) == ""
    assert runtime.stores.pods.get("ns", "a-0")["status"]["phase"] == "Failed"


def test_a_node_that_turns_lost_wakes_only_the_jobs_with_pods_on_it(runtime: Runtime) -> None:
    runtime.observe("Node", "MODIFIED", node("n1", 22))  # a heartbeat: same verdict, nobody woken
    assert runtime.queue.depth() == 0
    runtime.observe("Node", "MODIFIED", node("n1", 23, ready="Unknown"))
    assert drain(runtime) == [("ns", "a")]
    runtime.observe("Node", "DELETED", node("n2", 24))
    assert drain(runtime) == [("ns", "b")]


def test_passes_that_change_nothing_stretch_a_waiting_requeue_and_a_change_resets_it(runtime: Runtime) -> None:
    key, clock = ("ns", "a"), runtime._clock
    runtime.queue._rand = lambda: 0.0  # no jitter: the delays are exact

    def delay(requeue: Requeue, changed: bool) -> float:
        runtime._requeue(key, requeue, changed)
        due = runtime.queue._due[key] - clock()  # type: ignore[operator]
        runtime.queue._due.pop(key)
        return round(due, 3)

    waiting = Requeue(seconds=2.0, waiting=True)
    delays = [delay(waiting, changed=False) for _ in range(12)]
    assert delays[:3] == [3.0, 4.5, 6.75]  # x1.5 a quiet pass
    assert delays[-1] == delays[-2] == round(2.0 * 1.5**8, 3) <= WAITING_MAX  # bounded
    assert delay(waiting, changed=True) == 2.0  # something changed: back to the pass's own seconds
    # A deadline (a grace period ending) is never overslept, however quiet the job.
    for _ in range(5):
        delay(waiting, changed=False)
    assert delay(Requeue(seconds=2.0, waiting=True, deadline=7.0), changed=False) == 7.0
    # Not waiting on an event: the pass's seconds as they are.
    assert delay(Requeue(seconds=2.0), changed=False) == 2.0
    runtime._requeue(key, Requeue(act=True), changed=False)  # a decision to carry out: at once, urgently
    assert runtime.queue.pending(key) == "urgent"


def test_every_pass_is_counted_by_outcome_a_failed_probe_included(runtime: Runtime, monkeypatch) -> None:
    from prometheus_client import REGISTRY

    from rtj_operator.world import World

    def count(outcome: str) -> float:
        return REGISTRY.get_sample_value("rtj_reconcile_passes_total", {"outcome": outcome}) or 0.0

    def refused(status: int) -> Any:
        def probe(self: World, *args: Any, **kwargs: Any) -> World:
            raise KubeError(status, "refused")
        return probe

    before = {o: count(o) for o in ("gone", "api_error", "conflict")}
    runtime.run(("ns", "gone"))
    monkeypatch.setattr(World, "from_stores", classmethod(lambda cls, stores, body, node=None: cls(body)))
    monkeypatch.setattr(World, "probe", refused(500))
    runtime.run(("ns", "a"))
    monkeypatch.setattr(World, "probe", refused(409))
    runtime.run(("ns", "b"))
    assert {o: count(o) - n for o, n in before.items()} == {"gone": 1, "api_error": 1, "conflict": 1}
    assert runtime.queue.retry(("ns", "a")) > runtime.queue.retry(("ns", "c"))  # a's failure began its back-off


# --- a pass the API server keeps refusing (issue 29) --------------------------------------------------
ONE_VALUE = ('Pod "a-0" is invalid: spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution'
             '.nodeSelectorTerms[0].matchFields[0].values: Required value: must be only one value')


def refuse(monkeypatch, error: KubeError) -> None:
    from rtj_operator.world import World

    def probe(self: World, *args: Any, **kwargs: Any) -> World:
        raise error
    monkeypatch.setattr(World, "from_stores", classmethod(lambda cls, stores, body, node=None: cls(body)))
    monkeypatch.setattr(World, "probe", probe)


def reconcile_error(rt: Runtime, name: str = "a") -> dict[str, Any]:
    body = rt.stores.rtjs.get("ns", name) or {}
    return get_condition((body.get("status") or {}).get("conditions") or [], "ReconcileError") or {}


def test_a_pass_refused_twice_the_same_way_is_said_on_the_rtj_once_and_retried_slowly(runtime, monkeypatch):
    """Issue 29: the gate of a replacement pod lifted with an affinity the API server rejects (422), every
    pass, for an hour, and only the log said so."""
    kube, key = runtime.kube, ("ns", "a")
    refuse(monkeypatch, KubeError(422, ONE_VALUE, "patch", "Pod", "a-0"))
    runtime.run(key)
    assert kube.patches == [] and kube.events == []  # once may be a fluke: back-off
    assert runtime.queue._due[key] - runtime._clock() < 1.0  # the back-off's first step
    runtime.queue.remove(key)
    runtime.run(key)
    (patch,) = kube.patches
    assert set(patch) == {"metadata", "status"} and set(patch["status"]) == {"conditions"}  # that condition only
    assert patch["metadata"] == {"resourceVersion": "1"}  # as the pass read it
    cond = reconcile_error(runtime)
    assert (cond["status"], cond["reason"]) == ("True", "APIRejected")
    for words in ("HTTP 422", "patch Pod a-0", "must be only one value", "every 60s"):
        assert words in cond["message"], cond
    assert kube.events == [("a", "Warning", "APIRejected", cond["message"])]
    due = runtime.queue._due[key]
    assert due - runtime._clock() == pytest.approx(runtime.max_requeue)  # not the back-off's next step
    runtime.queue.remove(key)
    runtime.run(key)  # refused again: said already, nothing written or posted again
    assert len(kube.patches) == 1 and len(kube.events) == 1


@pytest.mark.parametrize("errors", [
    [KubeError(409, "conflict", "patch/status", api.KIND, "a")] * 3,
    [KubeError(429, "slow down", "patch", "Pod", "a-0")] * 3,
    [KubeError(500, "etcd", "patch", "Pod", "a-0")] * 3,
    [KubeError(404, "gone", "patch/status", api.KIND, "a")] * 3,  # the RTJ itself: the next pass finds it gone
    [KubeError(422, ONE_VALUE, "patch", "Pod", "a-0"), KubeError(422, "no", "patch", "Pod", "a-1"),
     KubeError(422, ONE_VALUE, "patch", "Pod", "a-0")],  # not the same call twice in a row
    [KubeError(422, ONE_VALUE, "patch", "Pod", "a-0"), KubeError(500, "etcd", "patch", "Pod", "a-0"),
     KubeError(422, ONE_VALUE, "patch", "Pod", "a-0")],
], ids=["conflict", "429", "5xx", "rtj-404", "other-call", "interrupted"])
def test_refusals_a_retry_may_fix_set_no_condition(runtime, monkeypatch, errors):
    for error in errors:
        refuse(monkeypatch, error)
        runtime.run(("ns", "a"))
        runtime.queue.remove(("ns", "a"))
    assert runtime.kube.patches == [] and runtime.kube.events == []


@pytest.mark.parametrize("status,kind", [(400, "Job"), (403, "Pod"), (404, "Service"), (422, api.KIND)])
def test_each_refusal_no_retry_fixes_sets_it(runtime, monkeypatch, status, kind):
    refuse(monkeypatch, KubeError(status, "refused", "create", kind, "x"))
    for _ in range(2):
        runtime.run(("ns", "a"))
    assert reconcile_error(runtime)["reason"] == "APIRejected"
    assert f"HTTP {status}" in reconcile_error(runtime)["message"]


def test_the_next_pass_that_goes_through_clears_it_in_its_own_status_write():
    w = W()
    w.status(conditions=[{"type": "ReconcileError", "status": "True", "reason": "APIRejected", "message": "x",
                          "lastTransitionTime": ts(600)}])
    intent = w.run()
    still = get_condition(intent.status.conditions, "ReconcileError")
    assert still["status"] == "True"  # decided, not done: a pass whose actions fail writes nothing
    settled = settle(intent, [Result(a) for a in intent.actions], w.world, NOW)
    cond = get_condition(settled.status.conditions, "ReconcileError")
    assert (cond["status"], cond["reason"]) == ("False", "Resolved")
    w.status(conditions=settled.status.conditions)  # and once False, it stays as it is
    again = settle(w.run(), [], w.world, NOW)
    assert get_condition(again.status.conditions, "ReconcileError") == cond


def test_a_refused_call_says_which_call_it_was():
    import json

    import kubernetes

    from rtj_operator.kube import Kube

    class Client:
        def call_api(self, *args: Any, **kwargs: Any) -> None:
            exc = kubernetes.client.exceptions.ApiException(status=422, reason="Unprocessable Entity")
            exc.body = json.dumps({"message": ONE_VALUE})
            raise exc

    with pytest.raises(KubeError) as refused:
        Kube(Client()).patch("Pod", "a-0", "ns", {"spec": {}})  # type: ignore[arg-type]
    assert (refused.value.status, refused.value.verb, refused.value.kind, refused.value.name) == (
        422, "patch", "Pod", "a-0")
    assert refused.value.message == ONE_VALUE and str(refused.value) == f"HTTP 422: {ONE_VALUE}"
