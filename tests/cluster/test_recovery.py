"""The recovery ladder on the local control plane: kwok kubelets that stop renewing their lease,
the real node-lifecycle and taint-eviction controllers, the real Eviction API, Job controller
(pod failure policy, FailureTarget, replacement back-off) and garbage collector."""

from __future__ import annotations

import datetime
import time
import urllib.request

import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

from clusterkit import start_operator, wait_passes
from rtj_operator import api, ladder
from rtj_operator.kube import KubeError
from rtj_worker import exit_codes
from testkit import free_port, wait_until

REGISTRY = prometheus_client.REGISTRY
FAST = {"nodeLossGraceSeconds": 2, "terminatingTimeoutSeconds": 3}


def metric(metric_name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(metric_name, labels) or 0.0


def test_lost_node_replaces_only_its_pod_and_counts_a_disruption(rtj, kube, ns, operator, lost_nodes, cluster):
    """Issue 8.a/8.d, 17.3: the real node-lifecycle controller sees the lease expire; after the grace
    period the pod is evicted (DisruptionTarget, so the Job does not count it); it stays Terminating on
    the dead node, and no second pod of its index starts until the node is fenced (here: tainted
    out-of-service, as after a non-graceful shutdown); then only that index is replaced."""
    rtj.create(nodes={"count": 3}, restartBudget=FAST)
    rtj.wait_running(nodes=3)
    recoveries = metric("rtj_recovery_seconds_count", tier="ReplacePod")
    pods = rtj.running_pods()
    victim, others = pods[1], [pods[0], pods[2]]
    node = victim["spec"]["nodeName"]
    index = victim["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]
    lost_nodes(node)
    wait_until(lambda: rtj.status().get("phase") == "Restarting", timeout=30, what="Restarting")
    assert rtj.condition("Restarting")["reason"] == "ReplacePod"
    waiting = wait_until(lambda: rtj.condition("WaitingForFencing") if rtj.condition("WaitingForFencing").get(
        "status") == "True" else None, timeout=30, what="WaitingForFencing")
    assert waiting["reason"] == "NodeNotFenced" and node in waiting["message"] and victim["metadata"]["name"] in \
        waiting["message"]
    # On a lost node nothing is timed (terminatingTimeoutSeconds counts from the deletionTimestamp, the
    # end of the pods' 120 s grace period, and only on a node that is not lost): passes that looked at
    # the unfenced node force nothing, so the Job controller has no second pod of the index to make.
    wait_passes(3, "passes that see the unfenced node")
    same_index = [p for p in rtj.pods() if p["metadata"]["annotations"].get(
        "batch.kubernetes.io/job-completion-index") == index]
    assert [p["metadata"]["uid"] for p in same_index] == [victim["metadata"]["uid"]]  # never two of one index
    assert "ForceDeletedPod" not in rtj.reasons() and "NodeNotFenced" in rtj.reasons()
    cluster.fence_node(node)
    st = rtj.wait_running(nodes=3, timeout=90)
    assert (st["disruptions"], st["jobRestarts"], st["restarts"]) == (1, 0, 1)
    assert st["restartsByTier"] == {"InProcess": 0, "Launcher": 0, "ReplacePod": 1, "GangRestart": 0}
    assert st["lastFailureReason"] in ("NodeUnreachable", "NodeNotReady") and st["lastRecoverySeconds"] > 2
    # Only the victim's index was replaced, on another node; the others kept running untouched.
    now = {p["metadata"]["uid"] for p in rtj.running_pods()}
    assert {p["metadata"]["uid"] for p in others} <= now and victim["metadata"]["uid"] not in now
    assert node not in {p["spec"]["nodeName"] for p in rtj.running_pods()}
    reasons = rtj.reasons()
    assert reasons.count("EvictingPod") == 1 and reasons.count("ForceDeletedPod") <= 1, reasons  # or PodGC
    assert "Recovered" in reasons and rtj.condition("WaitingForFencing")["status"] == "False"
    job = rtj.job()
    assert not any(c["type"] in ("Failed", "FailureTarget") for c in job["status"].get("conditions") or [])
    assert metric("rtj_recovery_seconds_count", tier="ReplacePod") == recoveries + 1


def test_a_flapping_node_replaces_nothing(rtj, kube, ns, operator, lost_nodes, cluster):
    """Issue 9.9: NotReady blips shorter than the grace period never kill a healthy rank."""
    rtj.create(restartBudget={"nodeLossGraceSeconds": 20, "maxDisruptions": 1})
    rtj.wait_running()
    pods = rtj.running_pods()
    node = pods[0]["spec"]["nodeName"]
    for _ in range(3):
        lost_nodes(node)
        wait_until(lambda: ladder.node_lost(kube.get("Node", node), datetime.datetime.now(datetime.UTC)), timeout=30,
                   what="node NotReady")
        cluster.restore_node(node)
        wait_until(lambda: not ladder.node_lost(kube.get("Node", node), datetime.datetime.now(datetime.UTC)),
                   timeout=30, what="node Ready")
    # The node-lifecycle controller marked the pod not ready during each blip; its kubelet says Ready again.
    st = rtj.wait_running(nodes=2)
    assert st["disruptions"] == 0 and st["restarts"] == 0
    assert {p["metadata"]["uid"] for p in rtj.running_pods()} == {p["metadata"]["uid"] for p in pods}


def test_an_eviction_is_counted_as_a_disruption_while_terminating(rtj, kube, ns, operator):
    """Issue 8.c: a drain through the real Eviction API is a disruption, counted once, not a job failure."""
    rtj.create()
    rtj.wait_running()
    pod = rtj.running_pods()[0]
    assert kube.evict(pod["metadata"]["name"], ns)
    wait_until(lambda: rtj.status().get("disruptions") == 1, what="disruption counted")
    st = rtj.wait_running(nodes=2, timeout=60)
    assert st["disruptions"] == 1 and st["jobRestarts"] == 0 and st["lastFailureReason"] == "EvictionByEvictionAPI"
    wait_passes(2, "passes after the recovery")
    assert rtj.status()["disruptions"] == 1


@pytest.mark.parametrize("code, reason", [(exit_codes.CONFIG_ERROR, "ConfigError"),
                                          (exit_codes.PERMANENT_FAILURE, "PermanentFailure")])
def test_permanent_failure_fails_fast_without_restarts(rtj, kube, ns, operator, code, reason):
    rtj.create()
    rtj.wait_running()
    rtj.exit_pod(rtj.running_pods()[0], code)
    st = rtj.wait_phase("Failed")
    assert st["restarts"] == 0 and st["lastFailureReason"] == reason
    cond = rtj.condition("Failed")
    assert cond["reason"] == reason and f"exited with code {code}" in cond["message"]
    # The Job is kept for inspection, suspended so that no pod holds GPUs.
    wait_until(lambda: rtj.job()["spec"]["suspend"] is True, what="Job suspended")
    wait_until(lambda: not rtj.running_pods(), what="pods gone")


def test_restart_budget_exhaustion_ends_failed_instead_of_looping(rtj, kube, ns, operator):
    rtj.create(restartBudget={"maxRestarts": 1, "maxRestartsWithoutProgress": 10})
    rtj.wait_running()
    first, second = rtj.running_pods()
    rtj.exit_pod(first, exit_codes.LAUNCHER_BUDGET_EXHAUSTED, step=10)
    wait_until(lambda: rtj.status().get("jobRestarts") == 1, what="first failure charged")
    rtj.exit_pod(second, exit_codes.LAUNCHER_BUDGET_EXHAUSTED, step=20)
    st = rtj.wait_phase("Failed")
    cond = rtj.condition("Failed")
    assert cond["reason"] == "RestartBudgetExhausted"
    assert "2 job failures exceed restartBudget.maxRestarts=1" in cond["message"]
    assert st["lastCheckpointStep"] == 20
    wait_until(lambda: rtj.job()["spec"]["suspend"] is True, what="Job suspended")
    # Terminal: later passes change nothing and restart nothing.
    wait_passes(3, "passes of the Failed job")
    assert rtj.status()["restarts"] == st["restarts"] and rtj.status()["phase"] == "Failed"


def test_restarts_without_checkpoint_progress_end_failed(rtj, kube, ns, operator):
    rtj.create(restartBudget={"maxRestarts": 10, "maxRestartsWithoutProgress": 1})
    rtj.wait_running()
    first, second = rtj.running_pods()
    rtj.exit_pod(first, 1, step=30)
    wait_until(lambda: rtj.status().get("jobRestarts") == 1, what="first failure charged")
    rtj.exit_pod(second, 1, step=30)  # the same step again: no progress
    rtj.wait_phase("Failed")
    assert rtj.condition("Failed")["reason"] == "NoProgress" and "past 30" in rtj.condition("Failed")["message"]


def test_progress_between_failures_keeps_the_job_alive(rtj, kube, ns, operator):
    rtj.create(restartBudget={"maxRestarts": 10, "maxRestartsWithoutProgress": 1})
    rtj.wait_running()
    first, second = rtj.running_pods()
    rtj.exit_pod(first, 1, step=30)
    wait_until(lambda: rtj.status().get("lastCheckpointStep") == 30, what="step 30")
    rtj.exit_pod(second, 1, step=60)
    wait_until(lambda: rtj.status().get("lastCheckpointStep") == 60, what="step 60")
    st = rtj.wait_running(nodes=2, timeout=60)
    assert st["jobRestarts"] == 2 and st["restartsWithoutProgress"] == 1


def test_progress_is_trusted_only_from_the_pods_own_report(rtj, kube, ns, operator):
    """Issue 9.5: an annotation any pod-patcher can forge does not move the checkpoint step."""
    rtj.create()
    rtj.wait_running()
    pod = rtj.running_pods()[0]
    kube.patch("Pod", pod["metadata"]["name"], ns, {"metadata": {"annotations": {
        f"{api.GROUP}/checkpoint-step": "999999999"}}})  # nothing reads it: forged
    rtj.exit_pod(rtj.running_pods()[1], 1, step=400)
    wait_until(lambda: rtj.status().get("lastCheckpointStep") == 400, what="step from the termination report")
    assert rtj.status()["lastCheckpointTime"].endswith("Z")
    wait_passes(2, "passes that see the forged annotation")
    assert rtj.status()["lastCheckpointStep"] == 400


def test_forged_pods_with_the_jobs_labels_are_not_counted(rtj, kube, ns, operator):
    """Issue 9.5: pods that carry the RTJ's labels but are not owned by its Job charge nothing."""
    rtj.create(restartBudget={"maxRestarts": 1})
    rtj.wait_running()
    labels = {k: v for k, v in rtj.running_pods()[0]["metadata"]["labels"].items()
              if not k.startswith("batch.kubernetes.io") and k not in ("controller-uid", "job-name")}
    for i in range(3):
        kube.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"forged-{i}", "namespace": ns,
                                                                    "labels": labels},
                     "spec": {"restartPolicy": "Never", "containers": [{"name": "worker", "image": "evil:1"}],
                              "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}]}})
    wait_until(lambda: sum(1 for p in kube.list("Pod", ns) if p["metadata"]["name"].startswith("forged")
                           and p["status"].get("phase") == "Running") == 3, what="forged pods running")
    for i in range(3):
        rtj.exit_pod(kube.get("Pod", f"forged-{i}", ns), 1, step=999)
    wait_until(lambda: all(kube.get("Pod", f"forged-{i}", ns)["status"]["phase"] == "Failed" for i in range(3)),
               what="forged pods failed")
    wait_passes(3, "passes that see the forged pods failed")
    st = rtj.status()
    assert st["phase"] == "Running" and st["jobRestarts"] == 0 and st["restarts"] == 0
    assert st.get("lastCheckpointStep", 0) != 999


@pytest.mark.parametrize("first", ["the survivor's failure", "the node's disruption"])
def test_a_lost_node_and_the_failure_it_causes_are_charged_once(rtj, kube, ns, operator, lost_nodes, cluster, first):
    """Issue 11: node 0 hosts the rendezvous store, so its loss ends the other pods' launchers too
    (RendezvousHostLost, measured end to end), before or after the control plane and the grace period
    have judged the node lost. One loss, one charge, whichever the operator sees first; both pods are
    replaced."""
    rtj.create(restartBudget={**FAST, "nodeLossGraceSeconds": 4 if first == "the node's disruption" else 8})
    rtj.wait_running()
    node0, survivor = sorted(rtj.running_pods(), key=lambda p: p["metadata"]["labels"][
        "batch.kubernetes.io/job-completion-index"])
    node = node0["spec"]["nodeName"]
    lost_nodes(node)
    if first == "the node's disruption":
        wait_until(lambda: rtj.status().get("disruptions") == 1, timeout=60, what="the disruption charged",
                   interval=0.05)
    else:
        wait_until(lambda: ladder.node_loss(cluster.api("GET", f"/api/v1/nodes/{node}"),
                                            datetime.datetime.now(datetime.UTC))[0] != "",
                   timeout=30, what="node NotReady", interval=0.05)
    rtj.exit_pod(survivor, exit_codes.RENDEZVOUS_HOST_LOST)
    cluster.fence_node(node)  # node 0's pod is replaced only once its node is known to run nothing
    wait_until(lambda: {p["metadata"]["uid"] for p in rtj.running_pods()}.isdisjoint(
        {node0["metadata"]["uid"], survivor["metadata"]["uid"]}) and len(rtj.running_pods()) == 2,
        timeout=90, what="both pods replaced")
    st = rtj.wait_running(nodes=2, timeout=60)
    assert (st["disruptions"], st["jobRestarts"], st["restarts"]) == (1, 0, 1), st
    assert st["restartsByTier"] == {"InProcess": 0, "Launcher": 0, "ReplacePod": 1, "GangRestart": 0}
    if first == "the node's disruption":
        assert "NotCharged" in rtj.reasons()


def test_failed_rendezvous_recreates_the_whole_gang_once(rtj, kube, ns, operator):
    """Issue 8.b: ranks exit at different moments and Foreground deletion keeps the old pods visible;
    the failure is still charged once per gang attempt."""
    rtj.create(restartBudget={"maxRestarts": 3, "maxRestartsWithoutProgress": 1})
    rtj.wait_running()
    old_uid = rtj.job()["metadata"]["uid"]
    for pod in rtj.running_pods():
        try:
            rtj.exit_pod(pod, exit_codes.RENDEZVOUS_FAILED)
        except KubeError as exc:  # the first exit already made the operator recreate the gang
            assert exc.status == 404
        # The operator sees this exit (the pod Failed, or already deleted with the old gang) before the next.
        wait_until(lambda p=pod: (kube.get("Pod", p["metadata"]["name"], ns) or {"status": {"phase": "Failed"}})[
            "status"].get("phase") == "Failed", what="the rank's exit")
        wait_passes(2, "passes that see the rank's exit")
    wait_until(lambda: (rtj.job() or {}).get("metadata", {}).get("uid") not in (None, old_uid), timeout=60,
               what="new Job")
    job = rtj.job()
    assert job["metadata"]["annotations"][api.LABEL_ATTEMPT] == "2"
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RTJ_RDZV_ID"].endswith("-2")
    st = rtj.wait_running(nodes=2, timeout=60)
    assert st["restartsByTier"] == {"InProcess": 0, "Launcher": 0, "ReplacePod": 0, "GangRestart": 1}
    assert st["jobRestarts"] == 1 and st["attempt"] == 2 and st["phase"] == "Running"
    assert rtj.reasons().count("GangRestart") == 1


def test_a_job_that_gives_up_by_itself_gets_a_new_gang_within_budget(rtj, kube, ns, operator):
    """Issue 8.f: the real Job controller sets FailureTarget first; the operator starts the new gang then."""
    rtj.create()
    rtj.wait_running()
    kube.patch("Job", rtj.job()["metadata"]["name"], ns, {"spec": {"activeDeadlineSeconds": 1}})
    wait_until(lambda: rtj.status().get("attempt") == 2, timeout=30, what="attempt 2")
    st = rtj.wait_running(nodes=2, timeout=60)
    assert st["restartsByTier"]["GangRestart"] == 1 and st["jobRestarts"] == 1
    assert st["lastFailureReason"] == "DeadlineExceeded"


def test_replacement_backoff_is_visible_and_a_new_gang_avoids_it(rtj, kube, ns, operator):
    """Issue 8.e, measured on the real Job controller: each failed pod of a Job doubles the delay
    before its replacement (10 s, 20 s, ...). The delay is reported, and once it would outlast half
    the rendezvous timeout the operator starts a new Job, which starts without back-off."""
    rtj.create(resiliency={"rendezvousTimeoutSeconds": 30}, restartBudget={"maxRestarts": 5,
                                                                         "maxRestartsWithoutProgress": 5})
    rtj.wait_running()
    victim = rtj.running_pods()[0]
    index = victim["metadata"]["labels"]["batch.kubernetes.io/job-completion-index"]
    rtj.exit_pod(victim, 1)
    failed_at = time.monotonic()
    wait_until(lambda: (rtj.status().get("recovery") or {}).get("replacementBackoffSeconds") == 10,
               what="back-off reported")

    def replacement() -> dict | None:
        return next((p for p in rtj.running_pods() if p["metadata"]["labels"][
            "batch.kubernetes.io/job-completion-index"] == index), None)

    second = wait_until(replacement, timeout=40, what="replacement")
    delay = time.monotonic() - failed_at
    assert delay >= 8, f"the Job controller replaced the pod after {delay:.1f}s"  # its documented 10 s
    assert "ReplacementBackoff" in rtj.reasons()
    rtj.exit_pod(second, 1)  # the second failure of this Job: 20 s > 30 s / 2
    wait_until(lambda: rtj.status().get("attempt") == 2, timeout=20, what="new gang")
    rtj.wait_running(nodes=2, timeout=60)
    assert rtj.status()["jobRestarts"] == 2


def test_budgets_survive_an_operator_restart_and_deleted_children(rtj, kube, ns, cluster, operator_token):
    first = start_operator(cluster, operator_token, ns)
    try:
        rtj.create(restartBudget={"maxRestarts": 5})
        rtj.wait_running()
        rtj.exit_pod(rtj.running_pods()[0], 1, step=10)
        wait_until(lambda: rtj.status().get("jobRestarts") == 1, what="failure charged")
    finally:
        first.stop()
    second = start_operator(cluster, operator_token, ns)
    try:
        st = rtj.wait_running(nodes=2, timeout=60)
        assert st["jobRestarts"] == 1 and st["restarts"] == 1  # the same failed pod is not charged twice
        # Deleting the children resets nothing: the budget lives in the RTJ's status.
        kube.delete("Job", rtj.job()["metadata"]["name"], ns, propagation="Foreground")
        wait_until(lambda: (rtj.job() or {}).get("metadata", {}).get("deletionTimestamp") is None
                   and rtj.job() is not None, timeout=60, what="Job recreated")
        rtj.wait_running(nodes=2, timeout=60)
        assert rtj.status()["jobRestarts"] == 1
    finally:
        second.stop()


def test_metrics_are_served_over_http(rtj, kube, ns, operator):
    rtj.create(restartBudget={"maxRestarts": 5})
    rtj.wait_running()
    rtj.exit_pod(rtj.running_pods()[0], 1, step=123)  # what this test's own series must show
    wait_until(lambda: rtj.status().get("lastCheckpointStep") == 123, what="step 123")
    st = rtj.wait_running(nodes=2, timeout=60)  # recovered: rtj_recovery_seconds has a series of its own
    port = free_port()
    server, thread = prometheus_client.start_http_server(port, addr="127.0.0.1")
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        server.shutdown()
        thread.join(5)
    assert 'rtj_jobs{phase="Running"}' in text
    # Series of this test's own job (its namespace is new): the served registry is the live one.
    ours = {(sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k not in ("namespace", "name")))):
            sample.value for family in text_string_to_metric_families(text) for sample in family.samples
            if sample.labels.get("namespace") == ns and sample.labels.get("name") == rtj.name}
    assert ours[("rtj_job_phase", (("phase", "Running"),))] == 1.0, ours
    assert ours[("rtj_job_checkpoint_step", ())] == 123.0, ours
    assert ours[("rtj_job_nodes_ready", ())] == st["nodesReady"] == 2, ours
    assert ours[("rtj_job_budget_remaining", (("budget", "maxRestarts"),))] == 4.0, ours
    assert ours[("rtj_job_last_recovery_seconds", (("tier", "ReplacePod"),))] == st["lastRecoverySeconds"], ours
    for name in ("rtj_restarts_total", "rtj_recovery_seconds_bucket", "rtj_reconcile_seconds_bucket",
                 "rtj_reconcile_errors_total", "rtj_checkpoint_age_seconds"):
        assert name in text, name
