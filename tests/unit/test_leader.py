"""Leader election (leader.py): the Lease rules as tables, and two electors on one in-memory Lease."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest

from rtj_operator.kube import KubeError
from rtj_operator.leader import LeaderElector, NotLeader, Timing, lease_spec, may_take
from rtj_operator.runtime import StoreKube
from rtj_operator.stores import Stores
from testkit import Clock

T0 = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def lease(holder: str = "a", duration: int = 15, transitions: int = 0, renew: str = "r") -> dict[str, Any]:
    return {"metadata": {"name": "l", "namespace": "n", "resourceVersion": "1"},
            "spec": {"holderIdentity": holder, "leaseDurationSeconds": duration, "renewTime": renew,
                     "acquireTime": "t", "leaseTransitions": transitions}}


@pytest.mark.parametrize("current, me, unchanged_for, expected", [
    (None, "a", 0, True),                # no Lease yet: create it
    (lease(holder=""), "b", 0, True),    # released
    (lease(), "a", 0, True),             # mine: renew
    (lease(), "b", 14.9, False),         # another's, changed within its duration
    (lease(), "b", 15, True),            # another's, unchanged for its duration: expired
    (lease(duration=1), "b", 1, True),
])
def test_who_may_take_the_lease(current, me, unchanged_for, expected):
    assert may_take(current, me, unchanged_for) is expected


def test_lease_spec_takes_renews_and_releases():
    taken = lease_spec(lease(holder="a", transitions=2), "b", T0, 15)
    assert taken["holderIdentity"] == "b" and taken["leaseTransitions"] == 3
    assert taken["acquireTime"] == taken["renewTime"] == "2026-01-01T00:00:00.000000Z"
    renewed = lease_spec(lease(holder="b", transitions=3), "b", T0, 15)
    assert renewed["acquireTime"] == "t" and renewed["leaseTransitions"] == 3
    assert lease_spec(None, "a", T0, 15)["leaseTransitions"] == 0  # the first holder is no transition
    released = lease_spec(lease(holder="b", transitions=3), "b", T0, 15, release=True)
    assert released["holderIdentity"] == "" and released["leaseDurationSeconds"] == 1
    assert released["leaseTransitions"] == 3


@pytest.mark.parametrize("timing", [(15, 15, 2), (15, 10, 10), (10, 15, 2), (15, 10, 0)])
def test_timing_keeps_retry_below_the_deadline_below_the_lease(timing):
    with pytest.raises(ValueError):
        Timing(*timing)


class Leases:
    """An API server's Lease semantics: create fails if it exists, a patch with a stale
    resourceVersion fails with 409."""

    def __init__(self) -> None:
        self.obj: dict[str, Any] | None = None
        self.version = 0
        self.down = False

    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
        self._check()
        return copy.deepcopy(self.obj)

    def create(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        self._check()
        if self.obj is not None:
            raise KubeError(409, "exists")
        return self._store(copy.deepcopy(obj))

    def patch(self, kind: str, name: str, namespace: str | None, patch: dict[str, Any],
              subresource: str | None = None, strategic: bool = False) -> dict[str, Any]:
        self._check()
        assert self.obj is not None
        if patch["metadata"]["resourceVersion"] != self.obj["metadata"]["resourceVersion"]:
            raise KubeError(409, "conflict")
        return self._store({**self.obj, "spec": {**self.obj["spec"], **patch["spec"]}})

    def _store(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.version += 1
        obj["metadata"] = {**obj["metadata"], "resourceVersion": str(self.version)}
        self.obj = obj
        return copy.deepcopy(obj)

    def _check(self) -> None:
        if self.down:
            raise KubeError(503, "unavailable")


def electors(leases: Leases, clock: Clock) -> tuple[LeaderElector, LeaderElector]:
    timing = Timing(lease=15, renew_deadline=10, retry=2)
    wall = lambda: T0 + datetime.timedelta(seconds=clock.now)  # noqa: E731
    return (LeaderElector(leases, "n", "l", "a", timing, clock, wall),
            LeaderElector(leases, "n", "l", "b", timing, clock, wall))


def test_one_leader_and_a_follower_that_takes_over_only_once_the_lease_expired():
    leases, clock = Leases(), Clock()
    a, b = electors(leases, clock)
    a.step()
    b.step()
    assert a.leading() and not b.leading()
    assert leases.obj["spec"]["holderIdentity"] == "a"
    # a keeps renewing: b never takes it.
    for _ in range(20):
        clock.now += 2
        a.step()
        b.step()
        assert a.leading() and not b.leading()
    # a crashes (no release, no renewals): sampled every 0.5 s, never two leaders, and b leads within
    # a lease duration and one retry of a's last renewal.
    crashed = clock.now
    while not b.leading():
        clock.now += 0.5
        if clock.now % 2 == 0:
            b.step()
        assert not (a.leading() and b.leading()), clock.now - crashed
        assert clock.now - crashed <= 15 + 2
    assert not a.leading() and leases.obj["spec"]["holderIdentity"] == "b"
    assert leases.obj["spec"]["leaseTransitions"] == 1


def test_a_leader_stops_acting_at_its_renew_deadline_when_it_cannot_reach_the_api_server():
    leases, clock = Leases(), Clock()
    a, _ = electors(leases, clock)
    a.step()
    leases.down = True
    clock.now += 9.9
    a.step()
    assert a.leading()
    clock.now += 0.1
    assert not a.leading()  # without waiting for any try: leading() reads the clock
    leases.down = False
    a.step()
    assert a.leading()  # it still held the Lease, so it renews it


def test_a_released_lease_is_taken_at_the_next_try():
    leases, clock = Leases(), Clock()
    a, b = electors(leases, clock)
    a.step()
    b.step()
    a.stop(release=True)
    assert not a.leading() and leases.obj["spec"]["holderIdentity"] == ""
    clock.now += 2
    b.step()
    assert b.leading()


def test_of_two_candidates_on_one_version_one_wins():
    leases, clock = Leases(), Clock()
    a, b = electors(leases, clock)
    leases.create({"metadata": {"name": "l", "namespace": "n"}, "spec": {"holderIdentity": ""}})
    stale = leases.get("Lease", "l", "n")
    assert a.try_acquire_or_renew()
    # b read the same (released) version before a wrote: its conditional patch fails.
    leases_get = leases.get
    leases.get = lambda *args: copy.deepcopy(stale)  # type: ignore[method-assign]
    assert not b.try_acquire_or_renew()
    leases.get = leases_get  # type: ignore[method-assign]
    assert a.leading() and not b.leading()


def test_a_started_leading_callback_runs_once_per_acquisition():
    leases, clock = Leases(), Clock()
    a, _ = electors(leases, clock)
    calls: list[float] = []
    a.on_started_leading(lambda: calls.append(clock.now))
    a.step()
    clock.now += 2
    a.step()
    assert len(calls) == 1
    leases.down = True
    clock.now += 11
    a.step()
    leases.down = False
    a.step()
    assert len(calls) == 2


class Recorder:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            self.calls.append(name)
            return None
        return call


def test_the_runtimes_writes_are_refused_once_the_lease_is_lost():
    kube, leading = Recorder(), [True]
    writer = StoreKube(kube, Stores(), lambda: leading[0])  # type: ignore[arg-type]
    writer.patch("Job", "j", "n", {})
    leading[0] = False
    for write in (lambda: writer.patch("Job", "j", "n", {}), lambda: writer.create({"kind": "Job"}),
                  lambda: writer.delete("Job", "j", "n"), lambda: writer.evict("p", "n"),
                  lambda: writer.event({}, "Normal", "R", "m")):
        with pytest.raises(NotLeader):
            write()
    # Reads and server-side dry runs are not acting.
    writer.get("Job", "j", "n")
    writer.create({"kind": "Job"}, dry_run=True)
    assert kube.calls == ["patch", "get", "create"]


def test_the_command_line_makes_an_elector_only_when_asked(monkeypatch):
    from rtj_operator.__main__ import elector_from_args, parse_args

    monkeypatch.delenv("POD_NAMESPACE", raising=False)
    assert elector_from_args(parse_args([]), Leases()) is None
    with pytest.raises(SystemExit, match="namespace"):
        elector_from_args(parse_args(["--leader-elect"]), Leases())
    with pytest.raises(SystemExit, match="renew deadline"):
        elector_from_args(parse_args(["--leader-elect", "--leader-election-namespace=ops", "--renew-deadline=20"]),
                          Leases())
    elector = elector_from_args(parse_args(["--leader-elect", "--leader-election-namespace=ops",
                                            "--leader-election-id=rtj", "--lease-duration=6",
                                            "--renew-deadline=4", "--retry-period=1"]), Leases())
    assert (elector.namespace, elector.name, elector.timing) == ("ops", "rtj", Timing(6, 4, 1))
    monkeypatch.setenv("POD_NAMESPACE", "from-env")
    assert elector_from_args(parse_args(["--leader-elect"]), Leases()).namespace == "from-env"


def test_a_replica_that_stops_leading_exports_no_jobs_series():
    """Its snapshots would go stale beside the new leader's: a step that never moves (RTJNoStepProgress)
    and jobs deleted after the handover."""
    from prometheus_client import REGISTRY, generate_latest

    from rtj_operator import metrics

    leases, clock = Leases(), Clock()
    elector = LeaderElector(leases, "n", "l", "a", Timing(lease=15, renew_deadline=10, retry=2), clock,
                            lambda: T0 + datetime.timedelta(seconds=clock.now))
    elector.step()
    assert elector.leading()
    metrics.record_job("team-a", "led", {"phase": "Running", "progress": {"step": 420}}, {})
    assert REGISTRY.get_sample_value("rtj_job_step", {"namespace": "team-a", "name": "led"}) == 420.0
    leases.down = True
    clock.now += 11  # past the renew deadline: the next try finds it no longer leads
    elector.step()
    assert not elector.leading() and REGISTRY.get_sample_value("rtj_leader") == 0
    assert 'name="led"' not in generate_latest(REGISTRY).decode()
    assert REGISTRY.get_sample_value("rtj_jobs", {"phase": "Running"}) == 0


def test_a_leaders_writes_must_land_before_a_follower_may_take_over():
    """Issue 29.7: a write stalled in flight (a paused process, a slow network) must not land long after a
    follower took over. The runtime's client bounds each write's timeout by what is left of the lease
    duration since the leader's last renewal began; reads keep the full timeout."""
    import kubernetes

    from rtj_operator.kube import Kube
    from rtj_operator.runtime import Runtime

    leases, clock = Leases(), Clock()
    a, _ = electors(leases, clock)
    assert a.acting_for() == 0.0  # not leading: nothing may be sent
    a.step()
    clock.now += 4.0
    assert a.acting_for() == pytest.approx(11.0)  # 15 s of lease, 4 s since the renewal began
    clock.now += 6.0
    assert a.acting_for() == 0.0  # past the renew deadline: not leading any more

    timeouts: list[tuple[str, float]] = []

    class Client:
        def call_api(self, path: str, method: str, **kwargs: Any) -> Any:
            timeouts.append((method, kwargs["_request_timeout"]))
            return kubernetes.client.rest.RESTResponse(type("R", (), {"status": 200, "reason": "OK", "data": b"{}",
                                                                        "headers": {}})())

    kube = Kube(Client())  # type: ignore[arg-type]
    Runtime(kube, workers=0, clock=clock, elector=a)
    a.step()  # renewed now
    clock.now += 3.0
    kube.get("Pod", "p", "ns")
    kube.patch("Pod", "p", "ns", {})
    assert timeouts == [("GET", 30.0), ("PATCH", pytest.approx(12.0))]
