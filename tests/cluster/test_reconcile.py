"""reconcile() without kopf: idempotency, one status write per pass, events after it."""

from __future__ import annotations

import datetime

from clusterkit import Job
from rtj_operator import api
from rtj_operator.kube import Kube, configure
from rtj_operator.passes import run_pass
from rtj_operator.reconcile import reconcile
from rtj_operator.world import World
from rtj_worker import exit_codes
from testkit import rtj_body, wait_until

WRITES = {"create", "patch", "patch/status", "delete", "create/eviction"}


def converge(kube, ns, name="train"):
    """Passes until the real controllers and kwok have settled the job into Running."""
    def running() -> bool:
        run_pass(kube, ns, name)
        return (kube.get(api.KIND, name, ns) or {}).get("status", {}).get("phase") == "Running"
    wait_until(running, what="Running", interval=0.3)


def recording(cluster, operator_token) -> tuple[Kube, list[tuple[str, str]]]:
    calls: list[tuple[str, str]] = []
    client = configure(cluster.server, token=operator_token, ca_file=str(cluster.ca_file))
    return Kube(client, on_call=lambda verb, kind: calls.append((verb, kind))), calls


def test_a_converged_pass_writes_nothing(cluster, kube, ns, operator_token):
    kube.create(rtj_body(namespace=ns))
    client, calls = recording(cluster, operator_token)
    converge(client, ns)
    calls.clear()
    run_pass(client, ns, "train")
    run_pass(client, ns, "train")
    assert not [c for c in calls if c[0] in WRITES], calls


def test_first_pass_writes_status_once_then_events(cluster, kube, ns, operator_token):
    kube.create(rtj_body(namespace=ns))
    client, calls = recording(cluster, operator_token)
    run_pass(client, ns, "train")
    writes = [c for c in calls if c[0] in WRITES]
    assert writes.count(("patch/status", api.KIND)) == 1
    status_at = writes.index(("patch/status", api.KIND))
    assert writes[:status_at] == [("create", "Service"), ("create", "NetworkPolicy"),
                                  ("create", "PersistentVolumeClaim"), ("create", "Pod"),
                                  ("create", "Job")]  # the Pod: the gang's coordinator
    assert set(writes[status_at + 1:]) == {("create", "Event")}


def test_reconcile_is_a_function_of_the_world(cluster, kube, ns, operator_token):
    kube.create(rtj_body(namespace=ns))
    client, _ = recording(cluster, operator_token)
    converge(client, ns)
    rtj = kube.get(api.KIND, "train", ns)
    now = datetime.datetime(2026, 12, 2, tzinfo=datetime.UTC)
    first, second = reconcile(World.read(kube, rtj), now), reconcile(World.read(kube, rtj), now)
    assert first.status == second.status and first.events == second.events == []
    assert first.actions == second.actions == []  # converged: nothing to do


def test_a_peer_failure_with_no_cause_in_sight_is_charged_to_the_job_after_a_while(cluster, kube, ns,
                                                                                 operator_token):
    """RendezvousHostLost waits for a lost node or a charged failure to explain it; when neither shows
    within PEER_ATTRIBUTION_SECONDS, the job pays (else a job whose node 0 keeps crashing in some way
    the operator cannot see would restart for free)."""
    kube.create(rtj_body(namespace=ns))
    client, _ = recording(cluster, operator_token)
    converge(client, ns)
    job = Job(kube, ns)
    survivor = job.running_pods()[1]
    job.exit_pod(survivor, exit_codes.RENDEZVOUS_HOST_LOST)
    wait_until(lambda: any(p["status"].get("phase") == "Failed" for p in job.pods()), what="the pod Failed")
    run_pass(client, ns, "train")
    rtj = kube.get(api.KIND, "train", ns)
    assert rtj["status"].get("jobRestarts", 0) == 0 and rtj["status"].get("disruptions", 0) == 0
    later = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=61)
    assert reconcile(World.read(kube, rtj), later).status.job_restarts == 1
