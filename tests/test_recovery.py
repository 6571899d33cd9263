"""The recovery ladder: scenarios driven against the emulated API with the real operator."""

from __future__ import annotations

import datetime
import json
import socket
import urllib.request

import prometheus_client
import pytest

from conftest import rtj_body, wait_until
from rtj_operator import api, recovery
from rtj_operator.devcluster import OperatorThread
from rtj_worker import exit_codes

NS = "default"
REGISTRY = prometheus_client.REGISTRY


def metric(metric_name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(metric_name, labels) or 0.0


def create(kube, **spec) -> None:
    body = rtj_body(**{"restartBudget": {"terminatingTimeoutSeconds": 10}, **spec})
    body["metadata"] = {"name": "train", "namespace": NS}
    kube.create(body)


def status(kube) -> dict:
    return ((kube.get(api.KIND, "train", NS) or {}).get("status")) or {}


def condition(kube, type_: str) -> dict:
    return next((c for c in status(kube).get("conditions", []) if c["type"] == type_), {})


def running(kube, sim) -> None:
    wait_until(lambda: status(kube).get("phase") == "Running", step=sim.step, what="Running")


def live_pods(kube) -> list[dict]:
    return [p for p in kube.list("Pod", NS) if p["status"]["phase"] == "Running"
            and not p["metadata"].get("deletionTimestamp")]


def fail_pod(kube, pod: dict, code: int, reason: str = "Error", step: int | None = None) -> None:
    report = {"exitCode": code, "reason": f"exit {code}"}
    if step is not None:
        report["checkpointStep"] = step
    kube.patch("Pod", pod["metadata"]["name"], NS, {"status": {
        "phase": "Failed", "conditions": [{"type": "Ready", "status": "False"}],
        "containerStatuses": [{"name": "worker", "state": {"terminated": {
            "exitCode": code, "reason": reason, "message": json.dumps(report)}}}]}})


def test_lost_node_replaces_only_its_pod_and_counts_a_disruption(kube, sim, operator):
    create(kube, nodes={"count": 3})
    running(kube, sim)
    before = metric("rtj_restarts_total", tier="ReplacePod", reason="NodeDeleted")
    recoveries = metric("rtj_recovery_seconds_count")
    victim, *others = live_pods(kube)
    kube.delete("Node", victim["spec"]["nodeName"], None)
    wait_until(lambda: status(kube).get("phase") == "Restarting", step=sim.step, what="Restarting")
    cond = condition(kube, "Restarting")
    assert cond["status"] == "True" and cond["reason"] == "ReplacePod" and "NodeDeleted" not in cond["reason"]
    # A dead kubelet never confirms deletion: the pod is force-deleted after the timeout, then replaced.
    wait_until(lambda: status(kube).get("phase") == "Running", step=sim.step, timeout=30, what="recovered")
    st = status(kube)
    assert (st["disruptions"], st["jobRestarts"], st["restarts"]) == (1, 0, 1)
    assert st["restartsByTier"] == {"ReplacePod": 1, "GangRestart": 0}
    assert st["lastFailureReason"] == "NodeDeleted" and st["lastRecoverySeconds"] >= 10
    assert condition(kube, "Restarting")["status"] == "False"
    # The other pods were never touched; the Job is the same Job.
    assert {p["metadata"]["uid"] for p in others} <= {p["metadata"]["uid"] for p in live_pods(kube)}
    assert victim["spec"]["nodeName"] not in {p["spec"]["nodeName"] for p in live_pods(kube)}
    reasons = [e["reason"] for e in kube.list("Event", NS)]
    for reason in ("ReplacingPod", "ReplacePod", "ForceDeletedPod", "Recovered"):
        assert reason in reasons
    assert metric("rtj_restarts_total", tier="ReplacePod", reason="NodeDeleted") == before + 1
    assert metric("rtj_recovery_seconds_count") == recoveries + 1


def test_eviction_counts_against_disruptions_not_job_failures(kube, sim, operator):
    create(kube)
    running(kube, sim)
    pod = live_pods(kube)[0]
    kube.patch("Pod", pod["metadata"]["name"], NS, {"status": {"phase": "Failed", "conditions": [
        {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
         "message": "Eviction API: evicting"}]}})
    wait_until(lambda: status(kube).get("disruptions") == 1, step=sim.step, what="disruption counted")
    running(kube, sim)
    st = status(kube)
    assert st["jobRestarts"] == 0 and st["lastFailureReason"] == "EvictionByEvictionAPI"


def test_pod_stuck_terminating_on_unreachable_node_is_force_deleted(kube, sim, operator):
    create(kube)
    running(kube, sim)
    pod = live_pods(kube)[0]
    node = pod["spec"]["nodeName"]
    kube.patch("Node", node, None, {"spec": {"taints": [{"key": "node.kubernetes.io/unreachable",
                                                         "effect": "NoExecute"}]},
                                    "status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})
    stuck = wait_until(lambda: (kube.get("Pod", pod["metadata"]["name"], NS) or {}).get("metadata", {}).get(
        "deletionTimestamp"), step=sim.step, what="pod Terminating")
    assert stuck
    wait_until(lambda: kube.get("Pod", pod["metadata"]["name"], NS) is None, step=sim.step, timeout=30,
               what="force delete")
    running(kube, sim)
    assert status(kube)["lastFailureReason"] == "NodeUnreachable"
    assert "ForceDeletedPod" in [e["reason"] for e in kube.list("Event", NS)]


@pytest.mark.parametrize("code, reason", [(exit_codes.CONFIG_ERROR, "ConfigError"),
                                          (exit_codes.PERMANENT_FAILURE, "PermanentFailure")])
def test_permanent_failure_fails_fast_without_restarts(kube, sim, operator, code, reason):
    create(kube)
    running(kube, sim)
    fail_pod(kube, live_pods(kube)[0], code)
    wait_until(lambda: status(kube).get("phase") == "Failed", step=sim.step, what="Failed")
    st = status(kube)
    assert st["restarts"] == 0 and st["lastFailureReason"] == reason
    cond = condition(kube, "Failed")
    assert cond["status"] == "True" and cond["reason"] == reason and f"exited with code {code}" in cond["message"]
    # The Job is kept for inspection, suspended so that no pod holds GPUs.
    assert kube.get("Job", "train", NS)["spec"]["suspend"] is True
    wait_until(lambda: not live_pods(kube), step=sim.step, what="pods gone")


def test_bad_image_is_permanent(kube, sim, operator):
    create(kube)
    running(kube, sim)
    pod = live_pods(kube)[0]
    kube.patch("Pod", pod["metadata"]["name"], NS, {"status": {"phase": "Pending", "containerStatuses": [
        {"name": "worker", "state": {"waiting": {"reason": "InvalidImageName", "message": "bad ref"}}}]}})
    wait_until(lambda: status(kube).get("phase") == "Failed", step=sim.step)
    assert condition(kube, "Failed")["reason"] == "InvalidImageName"


def test_restart_budget_exhaustion_ends_failed_instead_of_looping(kube, sim, operator):
    create(kube, restartBudget={"maxRestarts": 1, "maxRestartsWithoutProgress": 10,
                                "terminatingTimeoutSeconds": 10})
    running(kube, sim)
    fail_pod(kube, live_pods(kube)[0], exit_codes.LAUNCHER_BUDGET_EXHAUSTED, step=10)
    wait_until(lambda: status(kube).get("jobRestarts") == 1, step=sim.step)
    running(kube, sim)
    assert status(kube)["lastRecoverySeconds"] >= 0
    fail_pod(kube, live_pods(kube)[0], exit_codes.LAUNCHER_BUDGET_EXHAUSTED, step=20)
    wait_until(lambda: status(kube).get("phase") == "Failed", step=sim.step, what="Failed")
    cond = condition(kube, "Failed")
    assert cond["reason"] == "RestartBudgetExhausted"
    assert "2 job failures exceed restartBudget.maxRestarts=1" in cond["message"]
    assert status(kube)["lastCheckpointStep"] == 20
    assert kube.get("Job", "train", NS)["spec"]["suspend"] is True
    # Terminal: later passes change nothing and restart nothing.
    before = status(kube)
    for _ in range(10):
        sim.step()
    assert status(kube)["restarts"] == before["restarts"] and status(kube)["phase"] == "Failed"


def test_restarts_without_checkpoint_progress_end_failed(kube, sim, operator):
    create(kube, restartBudget={"maxRestarts": 10, "maxRestartsWithoutProgress": 1,
                                "terminatingTimeoutSeconds": 10})
    running(kube, sim)
    fail_pod(kube, live_pods(kube)[0], 1, step=30)
    wait_until(lambda: status(kube).get("jobRestarts") == 1, step=sim.step)
    running(kube, sim)
    fail_pod(kube, live_pods(kube)[0], 1, step=30)  # the same step again: no progress
    wait_until(lambda: status(kube).get("phase") == "Failed", step=sim.step)
    assert condition(kube, "Failed")["reason"] == "NoProgress"
    assert "past 30" in condition(kube, "Failed")["message"]


def test_progress_between_failures_keeps_the_job_alive(kube, sim, operator):
    create(kube, restartBudget={"maxRestarts": 10, "maxRestartsWithoutProgress": 1,
                                "terminatingTimeoutSeconds": 10})
    running(kube, sim)
    for step in (30, 60, 90):
        fail_pod(kube, live_pods(kube)[0], 1, step=step)
        wait_until(lambda s=step: status(kube).get("lastCheckpointStep") == s, step=sim.step)
        running(kube, sim)
    st = status(kube)
    assert st["jobRestarts"] == 3 and st["restartsWithoutProgress"] == 1 and st["phase"] == "Running"


def test_checkpoint_progress_from_pod_annotations(kube, sim, operator):
    create(kube)
    running(kube, sim)
    pod = live_pods(kube)[0]
    kube.patch("Pod", pod["metadata"]["name"], NS, {"metadata": {"annotations": {
        api.ANNOTATION_CHECKPOINT_STEP: "400"}}})
    wait_until(lambda: status(kube).get("lastCheckpointStep") == 400, step=sim.step)
    assert status(kube)["lastCheckpointTime"].endswith("Z")
    assert metric("rtj_checkpoint_age_seconds", namespace=NS, name="train") >= 0


def test_failed_rendezvous_recreates_the_whole_gang_once(kube, sim, operator):
    create(kube)
    running(kube, sim)
    old_job = kube.get("Job", "train", NS)
    for pod in live_pods(kube):  # every node reports the same failed rendezvous
        fail_pod(kube, pod, exit_codes.RENDEZVOUS_FAILED)
    wait_until(lambda: (kube.get("Job", "train", NS) or {}).get("metadata", {}).get("uid") not in
               (None, old_job["metadata"]["uid"]), step=sim.step, what="new Job")
    job = kube.get("Job", "train", NS)
    assert job["metadata"]["annotations"][api.LABEL_ATTEMPT] == "2"
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RTJ_RDZV_ID"].endswith("-2")
    running(kube, sim)
    st = status(kube)
    assert st["restartsByTier"] == {"ReplacePod": 0, "GangRestart": 1}
    assert st["jobRestarts"] == 1 and st["attempt"] == 2
    assert "GangRestart" in [e["reason"] for e in kube.list("Event", NS)]


def test_a_job_that_gives_up_by_itself_gets_a_new_gang_within_budget(kube, sim, operator):
    create(kube)
    running(kube, sim)
    kube.patch("Job", "train", NS, {"status": {"conditions": [
        {"type": "Failed", "status": "True", "reason": "DeadlineExceeded", "message": "Job was active too long"}]}})
    wait_until(lambda: status(kube).get("attempt") == 2, step=sim.step, what="attempt 2")
    running(kube, sim)
    st = status(kube)
    assert st["restartsByTier"]["GangRestart"] == 1 and st["jobRestarts"] == 1
    assert st["lastFailureReason"] == "DeadlineExceeded"


def test_budgets_survive_an_operator_restart_mid_recovery_and_deleted_children(cluster, kube, sim):
    first = OperatorThread(cluster.url, max_requeue=0.3).start()
    try:
        create(kube, restartBudget={"maxRestarts": 5, "terminatingTimeoutSeconds": 10})
        running(kube, sim)
        fail_pod(kube, live_pods(kube)[0], 1, step=10)
        wait_until(lambda: status(kube).get("jobRestarts") == 1, what="failure charged")
    finally:
        first.stop()
    assert status(kube)["phase"] == "Restarting"  # stopped mid-recovery, replacement not yet running
    second = OperatorThread(cluster.url, max_requeue=0.3).start()
    try:
        running(kube, sim)
        st = status(kube)
        assert st["jobRestarts"] == 1 and st["restarts"] == 1  # the same failed pod is not charged twice
        assert st["lastRecoverySeconds"] > 0
        # Deleting the children resets nothing: the budget lives in the RTJ's status.
        kube.delete("Job", "train", NS)
        wait_until(lambda: kube.get("Job", "train", NS) is not None, step=sim.step, what="Job recreated")
        running(kube, sim)
        assert status(kube)["jobRestarts"] == 1
    finally:
        second.stop()


def test_metrics_are_served_over_http(kube, sim, operator):
    create(kube)
    running(kube, sim)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server, thread = prometheus_client.start_http_server(port, addr="127.0.0.1")
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
        thread.join(5)
    assert 'rtj_jobs{phase="Running"}' in text
    for name in ("rtj_restarts_total", "rtj_recovery_seconds_bucket", "rtj_reconcile_seconds_bucket",
                 "rtj_reconcile_errors_total", "rtj_checkpoint_age_seconds"):
        assert name in text, name


# --- classification, as pure functions -----------------------------------------------------------

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
READY = {"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}}
NOT_READY = {"metadata": {"name": "n"}, "status": {"conditions": [{"type": "Ready", "status": "False"}]}}


def pod(phase="Running", deleting_since=None, **status) -> dict:
    meta = {"name": "p", "uid": "u", "creationTimestamp": "2026-01-01T11:00:00Z"}
    if deleting_since is not None:
        meta["deletionTimestamp"] = (NOW - datetime.timedelta(seconds=deleting_since)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": meta, "spec": {"nodeName": "n"}, "status": {"phase": phase, **status}}


def terminated(code, reason="Error"):
    return {"containerStatuses": [{"state": {"terminated": {"exitCode": code, "reason": reason}}}]}


@pytest.mark.parametrize("the_pod, node, kind, reason, action", [
    (pod(), READY, None, None, None),  # alive and healthy: in-job layers own it
    (pod(), None, recovery.PLATFORM, "NodeDeleted", "delete"),
    (pod(), NOT_READY, recovery.PLATFORM, "NodeNotReady", "delete"),
    (pod(deleting_since=5), NOT_READY, recovery.PLATFORM, "NodeNotReady", ""),
    (pod(deleting_since=300), NOT_READY, recovery.PLATFORM, "NodeNotReady", "force-delete"),
    (pod(deleting_since=300), READY, None, None, None),  # a live kubelet finishes it
    (pod("Failed", **terminated(137, "OOMKilled")), READY, recovery.JOB_FAILURE, "OOMKilled", ""),
    (pod("Failed", **terminated(1)), READY, recovery.JOB_FAILURE, "ExitCode1", ""),
    (pod("Failed", **terminated(70)), READY, recovery.JOB_FAILURE, "LauncherRestartsExhausted", ""),
    (pod("Failed", **terminated(71)), READY, recovery.RENDEZVOUS, "RendezvousFailed", ""),
    (pod("Failed", **terminated(64)), READY, recovery.PERMANENT, "ConfigError", ""),
    (pod("Failed", reason="Evicted", message="low memory"), READY, recovery.PLATFORM, "Evicted", ""),
    (pod("Failed", conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]),
     READY, recovery.PLATFORM, "PreemptionByScheduler", ""),
    (pod("Pending", containerStatuses=[{"state": {"waiting": {"reason": "ImagePullBackOff"}}}]), READY,
     recovery.PERMANENT, "ImagePullBackOff", ""),  # an hour in back-off: past the grace
    (pod("Pending", containerStatuses=[{"state": {"waiting": {"reason": "ContainerCreating"}}}]), READY,
     None, None, None),
])
def test_classify(the_pod, node, kind, reason, action):
    finding = recovery.classify(the_pod, node, NOW, datetime.timedelta(seconds=300))
    if kind is None:
        assert finding is None
    else:
        assert (finding.kind, finding.reason, finding.action) == (kind, reason, action)


def test_plan_charges_each_pod_once():
    failed = pod("Failed", **terminated(1))
    first = recovery.plan([failed], {"n": READY}, set(), NOW, datetime.timedelta(seconds=300))
    assert [f.reason for f in first.findings] == ["ExitCode1"]
    again = recovery.plan([failed], {"n": READY}, {"u"}, NOW, datetime.timedelta(seconds=300))
    assert again.findings == []
