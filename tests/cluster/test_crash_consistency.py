"""Issue 9.7: an operator that dies right after any side effect converges to exactly one action
and one count. Passes run against the local control plane with a client that raises right after
its k-th write succeeded (the side effect happened, the pass did not finish); then clean passes
(a restarted operator) converge, and the world and the counters are checked."""

from __future__ import annotations

import prometheus_client
import pytest

from clusterkit import Job
from rtj_operator import api
from rtj_operator.kube import Kube, KubeError, configure
from rtj_operator.passes import run_pass
from testkit import rtj_body, wait_until


class Crash(Exception):
    pass


class CrashingKube(Kube):
    """Raises right after the k-th write (create, patch, delete, eviction) has been done."""

    def __init__(self, client, crash_at: int):
        super().__init__(client)
        self.crash_at, self.writes = crash_at, 0

    def _after_write(self) -> None:
        self.writes += 1
        if self.writes == self.crash_at:
            raise Crash(f"operator died after write {self.writes}")

    def create(self, obj, dry_run=False):
        result = super().create(obj, dry_run=dry_run)
        if not dry_run and obj["kind"] != "Event":
            self._after_write()
        return result

    def patch(self, *args, **kwargs):
        result = super().patch(*args, **kwargs)
        self._after_write()
        return result

    def delete(self, *args, **kwargs):
        result = super().delete(*args, **kwargs)
        self._after_write()
        return result

    def evict(self, *args, **kwargs):
        result = super().evict(*args, **kwargs)
        self._after_write()
        return result


@pytest.fixture
def client(cluster, operator_token):
    def make() -> object:
        return configure(cluster.server, token=operator_token, ca_file=str(cluster.ca_file))
    return make


def converge(kube: Kube, ns: str, done, what: str) -> None:
    def step() -> bool:
        try:
            run_pass(kube, ns, "train")
        except KubeError as exc:
            if exc.status != 409:  # a stale read: the next pass reads again
                raise
        return bool(done())
    wait_until(step, timeout=90, what=what, interval=0.3)


def crash_then_converge(client, ns: str, crash_at: int, done, what: str) -> int:
    """Passes with a client that dies after write `crash_at`, then clean passes; returns the writes done."""
    crashing = CrashingKube(client(), crash_at)
    for _ in range(20):
        try:
            run_pass(crashing, ns, "train")
        except Crash:
            break
        except KubeError as exc:
            if exc.status != 409:
                raise
        if done():
            break
    converge(Kube(client()), ns, done, what)
    return crashing.writes


@pytest.mark.parametrize("crash_at", [1, 2, 3, 4])
def test_a_spec_change_makes_exactly_one_new_gang_whatever_the_crash_point(cluster, kube, ns, client, crash_at):
    rtj = Job(kube, ns)
    kube.create(rtj_body(namespace=ns))
    converge(Kube(client()), ns, lambda: rtj.status().get("phase") == "Running", "Running")
    rtj.patch({"image": "worker:2"})

    def new_gang_running() -> bool:
        job = rtj.job() or {}
        return (rtj.status().get("phase") == "Running" and not job["metadata"].get("deletionTimestamp")
                and job["spec"]["template"]["spec"]["containers"][0]["image"] == "worker:2")

    crash_then_converge(client, ns, crash_at, new_gang_running, "the new gang Running")
    job, st = rtj.job(), rtj.status()
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert job["metadata"]["annotations"][api.LABEL_ATTEMPT] == "2" and st["attempt"] == 2
    assert env["RTJ_RDZV_ID"].endswith("-2")  # never the old rendezvous id
    assert st["jobRestarts"] == 0 and st["restarts"] == 0


@pytest.mark.parametrize("crash_at", [1, 2])
def test_a_pod_failure_is_counted_once_whatever_the_crash_point(cluster, kube, ns, client, crash_at):
    rtj = Job(kube, ns)
    kube.create(rtj_body(namespace=ns))
    converge(Kube(client()), ns, lambda: rtj.status().get("phase") == "Running", "Running")
    before = prometheus_client.REGISTRY.get_sample_value(
        "rtj_restarts_total", {"tier": "ReplacePod", "reason": "ExitCode1"}) or 0.0
    rtj.exit_pod(rtj.running_pods()[0], 1, step=10)
    wait_until(lambda: any(p["status"].get("phase") == "Failed" for p in rtj.pods()), what="pod Failed")
    crash_then_converge(client, ns, crash_at, lambda: rtj.status().get("jobRestarts", 0) >= 1,
                        "the failure counted")
    converge(Kube(client()), ns, lambda: rtj.status().get("phase") == "Running", "Running again")
    st = rtj.status()
    assert st["jobRestarts"] == 1 and st["restarts"] == 1
    after = prometheus_client.REGISTRY.get_sample_value(
        "rtj_restarts_total", {"tier": "ReplacePod", "reason": "ExitCode1"}) or 0.0
    # The metric moves only after a status write that succeeded, so it never counts more than status
    # (a real crash right after the write loses the process's counters altogether).
    assert after - before == (0 if crash_at == 1 else 1)


class FlakyStatusKube(Kube):
    """Every other status write fails (HTTP 500) after nothing was written."""

    def __init__(self, client):
        super().__init__(client)
        self.calls = 0

    def patch(self, kind, name, namespace, patch, subresource=None, strategic=False):
        if subresource == "status" and kind == api.KIND:
            self.calls += 1
            if self.calls % 2:
                raise KubeError(500, "injected: etcd leader changed")
        return super().patch(kind, name, namespace, patch, subresource=subresource, strategic=strategic)


def test_metrics_count_only_what_status_recorded(cluster, kube, ns, client):
    rtj = Job(kube, ns)
    kube.create(rtj_body(namespace=ns, restartBudget={"maxRestarts": 10, "maxRestartsWithoutProgress": 10}))
    converge(Kube(client()), ns, lambda: rtj.status().get("phase") == "Running", "Running")
    flaky = FlakyStatusKube(client())

    def count() -> float:
        return sum(prometheus_client.REGISTRY.get_sample_value("rtj_restarts_total", {"tier": t, "reason": r}) or 0.0
                   for t in ("ReplacePod", "GangRestart") for r in ("ExitCode1",))

    before = count()
    for i, pod in enumerate(rtj.running_pods()):
        rtj.exit_pod(pod, 1, step=10 * (i + 1))

    def passes() -> bool:
        try:
            run_pass(flaky, ns, "train")
        except KubeError:
            pass
        return rtj.status().get("jobRestarts") == 2

    wait_until(passes, timeout=60, what="both failures counted", interval=0.2)
    assert count() - before == rtj.status()["restarts"] == 2
