"""Two operator replicas on one Lease (leader.py) against the real API server, as the chart's
ServiceAccount (so the chart's Lease RBAC is what allows it): one acts, the other only LISTs; a
stopped leader hands over at once; a leader cut off from the Lease stops writing before the
follower's first write, and a fault it was recovering from is counted once."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

from clusterkit import Job, start_operator, wait_passes
from rtj_dev.operator_thread import OperatorThread
from rtj_operator import api
from rtj_operator.kube import Kube, KubeError, configure
from rtj_operator.leader import LeaderElector, Timing
from testkit import RELEASE, RELEASE_NS, wait_until

TIMING = Timing(lease=4, renew_deadline=2.5, retry=0.5)
READS = ("get", "list")


class Calls:
    """Every API call of one replica's runtime, with when it was made."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, str, str]] = []
        self._lock = threading.Lock()

    def record(self, verb: str, kind: str) -> None:
        with self._lock:
            self.calls.append((time.monotonic(), verb, kind))

    def writes(self) -> list[float]:
        with self._lock:
            return [t for t, verb, _ in self.calls if verb not in READS]

    def verbs(self) -> set[str]:
        with self._lock:
            return {verb for _, verb, _ in self.calls}


class Stall:
    """A replica's API-call hook that, once `armed`, holds its first `verb` of `kind` (as a process paused by
    the kernel or a GC would, the call not yet sent) until `release`, up to 60 s; `stalled` once holding."""

    def __init__(self, verb: str, kind: str):
        self.call = (verb, kind)
        self.armed, self.stalled, self.release = threading.Event(), threading.Event(), threading.Event()

    def __call__(self, verb: str, kind: str) -> None:
        if self.armed.is_set() and (verb, kind) == self.call and not self.stalled.is_set():
            self.stalled.set()
            self.release.wait(60)


class Unreachable:
    """The API server as a partitioned replica sees it, for its Lease calls."""

    def __getattr__(self, name: str):
        def fail(*args, **kwargs):
            raise KubeError(503, "unreachable")
        return fail


@pytest.fixture
def lease(cluster, kube):
    def holder() -> str:
        got = kube.get("Lease", RELEASE, RELEASE_NS)
        return ((got or {}).get("spec") or {}).get("holderIdentity") or ""

    kube.delete("Lease", RELEASE, RELEASE_NS)
    yield holder
    kube.delete("Lease", RELEASE, RELEASE_NS)


def replica(cluster, token: str, ns: str, identity: str,
            hook: Callable[[str, str], None] | None = None) -> tuple[OperatorThread, LeaderElector, Calls]:
    """An operator replica with its elector; its API calls are recorded, then passed to `hook`."""
    calls = Calls()

    def on_call(verb: str, kind: str) -> None:
        calls.record(verb, kind)
        if hook is not None:
            hook(verb, kind)

    elector = LeaderElector(Kube(configure(cluster.server, token=token, ca_file=str(cluster.ca_file))),
                            RELEASE_NS, RELEASE, identity, TIMING)
    return start_operator(cluster, token, ns, elector=elector, on_call=on_call), elector, calls


def leader_and_follower(cluster, token: str, ns: str, hook: Callable[[str, str], None] | None = None):
    """Replica a, leading, then replica b: (a, a's elector, a's calls, b, b's calls)."""
    a, a_elector, a_calls = replica(cluster, token, ns, "a", hook)
    wait_until(a.runtime.leading, timeout=10, what="a leads")
    b, _, b_calls = replica(cluster, token, ns, "b")
    return a, a_elector, a_calls, b, b_calls


def running_rtj(kube, ns: str) -> Job:
    rtj = Job(kube, ns)
    rtj.create()
    rtj.wait_running()
    return rtj


def stop(*threads: OperatorThread) -> None:
    for thread in threads:
        thread.stop()
    for thread in threads:
        assert thread.error is None, thread.error


def test_one_replica_acts_and_a_stopped_leader_hands_over_at_once(cluster, kube, ns, operator_token, lease):
    a, _, a_calls, b, b_calls = leader_and_follower(cluster, operator_token, ns)
    try:
        rtj = running_rtj(kube, ns)
        assert lease() == "a" and not b.runtime.leading()
        # The follower's stores are filled and kept (LISTs, and watches that are not API calls of
        # its client), but it made no other call: no pass ran there.
        assert a_calls.writes() and b_calls.verbs() == {"list"}
        a.stop()  # releases the Lease
        stopped = time.monotonic()
        wait_until(b.runtime.leading, timeout=5, what="b leads")
        assert time.monotonic() - stopped < 2 * TIMING.retry + 1 and lease() == "b"
        # b acts: a failure is recovered by it.
        rtj.exit_pod(rtj.running_pods()[0], 1)
        wait_until(lambda: rtj.status().get("jobRestarts") == 1, what="failure charged by b")
        rtj.wait_running(nodes=2)
        assert b_calls.writes()
    finally:
        stop(a, b)


def test_a_leader_cut_off_from_the_lease_stops_before_the_follower_acts(cluster, kube, ns, operator_token, lease):
    a, a_elector, a_calls, b, b_calls = leader_and_follower(cluster, operator_token, ns)
    try:
        rtj = running_rtj(kube, ns)
        # A fault, and at once the leader loses the API server for its Lease (its other calls still
        # work: the worst case, a leader that could keep writing).
        rtj.exit_pod(rtj.running_pods()[0], 1)
        a_elector.kube = Unreachable()
        cut = time.monotonic()
        wait_until(b.runtime.leading, timeout=TIMING.lease + TIMING.renew_deadline + 5, what="b leads")
        took_over = time.monotonic() - cut
        assert not a.runtime.leading() and lease() == "b"
        assert took_over <= TIMING.lease + 2 * TIMING.retry + 1, took_over
        st = rtj.wait_running(nodes=2, timeout=60)
        # Never both: a's last write came before b's first.
        assert b_calls.writes() and (not a_calls.writes() or max(a_calls.writes()) < min(b_calls.writes()))
        assert not [t for t in a_calls.writes() if t > cut + TIMING.renew_deadline]
        # The fault was counted once, whichever replica charged it.
        assert st["jobRestarts"] == 1 and st["restarts"] == 1, st
        assert kube.get("Lease", RELEASE, RELEASE_NS)["spec"]["leaseTransitions"] == 1
    finally:
        stop(a, b)


def test_a_leader_stalled_mid_recovery_hands_over_and_the_fault_is_counted_once(
        cluster, kube, ns, operator_token, lease):
    """Issue 18.5, the handover inside a recovery: the leader has recorded its decision (a new gang:
    status says attempt 2, the fault charged) and stalls at the call that carries it out (the old Job's
    delete), as a process paused by the kernel or a GC would, then loses the Lease. The follower carries
    out the recorded decision; when the stalled call goes through at last, its UID precondition makes it
    a no-op. One charge, one new gang (attempt 2), its pods running."""
    stall = Stall("delete", "Job")

    a, a_elector, _, b, b_calls = leader_and_follower(cluster, operator_token, ns, hook=stall)
    try:
        rtj = running_rtj(kube, ns)
        old_job = rtj.job()["metadata"]["uid"]
        stall.armed.set()
        rtj.exit_pod(rtj.running_pods()[0], 71)  # the rendezvous failed: only a new gang helps
        wait_until(stall.stalled.is_set, timeout=30, what="the leader at its first action of the new gang")
        assert rtj.status()["attempt"] == 2 and rtj.status()["jobRestarts"] == 1, rtj.status()  # decided
        a_elector.kube = Unreachable()
        wait_until(b.runtime.leading, timeout=TIMING.lease + TIMING.renew_deadline + 5, what="b leads")
        wait_until(lambda: (job := rtj.job()) is not None and job["metadata"]["uid"] != old_job, timeout=60,
                   what="the follower's new gang")
        st = rtj.wait_running(nodes=2, timeout=60)
        stall.release.set()  # the stalled delete goes through now: a 409 on its precondition, nothing deleted
        wait_until(lambda: a.runtime.queue.pending((ns, rtj.name)) != "processing", timeout=30,
                   what="the stalled pass of a ended")
        wait_passes(2, "passes of b after it")
        job = rtj.job()
        assert job and job["metadata"]["uid"] != old_job and not job["metadata"].get("deletionTimestamp"), job
        st = rtj.status()
        assert (st["attempt"], st["jobRestarts"], st.get("restartsByTier", {}).get("GangRestart")) == (2, 1, 1), st
        assert b_calls.writes() and not a.runtime.leading()
    finally:
        stall.release.set()
        stop(a, b)


def test_a_suspend_that_lands_after_its_leader_lost_the_lease_is_lifted_by_the_next_leader(
        cluster, kube, ns, operator_token, lease):
    """Issue 29.7, a write from a leader that lost the Lease: the user suspends the job, the leader's Job
    patch (suspend) is in flight when it stalls and loses the Lease, the user resumes the job meanwhile, and
    the stalled patch lands after the follower took over. The old leader's status write never goes out
    (NotLeader), so status does not say the operator suspended the Job. Before, the new leader took that Job
    for someone else's (SuspendedExternally) and waited for ever; the Job's own mark
    (training.rtj.dev/suspended-by, written with the suspend) now says whose it is, and the new leader
    resumes it."""
    stall = Stall("patch", "Job")

    a, a_elector, _, b, _ = leader_and_follower(cluster, operator_token, ns, hook=stall)
    try:
        rtj = running_rtj(kube, ns)
        stall.armed.set()
        rtj.patch({"suspend": True})
        wait_until(stall.stalled.is_set, timeout=30, what="the leader's suspend of the Job, in flight")
        a_elector.kube = Unreachable()
        wait_until(b.runtime.leading, timeout=TIMING.lease + TIMING.renew_deadline + 5, what="b leads")
        rtj.patch({"suspend": False})  # the user changes their mind: nothing for b to do yet
        wait_passes(2, "passes of b")
        job = rtj.job()
        assert not job["spec"].get("suspend")
        generation = job["metadata"]["generation"]
        stall.release.set()  # the stale suspend lands now: the Job's spec changes twice, suspended then resumed
        wait_until(lambda: (j := rtj.job())["metadata"]["generation"] >= generation + 2 and not j["spec"].get(
            "suspend"), timeout=30, what="the stale suspend landed and b resumed the Job")
        st = rtj.wait_running(nodes=2, timeout=60)
        assert st["phase"] == "Running" and not st.get("recovery", {}).get("suspendedJob"), st
        assert api.ANNOTATION_SUSPENDED_BY not in (rtj.job()["metadata"].get("annotations") or {})
    finally:
        stall.release.set()
        stop(a, b)
