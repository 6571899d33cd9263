"""Issue 17 on the local control plane: the events real clusters produce (deletes, suspends, node-0
loss in a large gang, a pod that never stops, no capacity for a replacement) are never charged to
the job, and every wait says why. kwok plays the kubelets; a deleted pod's container exits 1 here
(`kwok.rtj.dev/exit-on-delete`), as ft_launcher does on SIGTERM, where kwok's default 143 would hide
the difference. tests/e2e/test_e2e.py runs the same with real ft_launcher processes."""

from __future__ import annotations

import datetime
import time

from clusterkit import Job, wait_passes
from rtj_operator import api
from rtj_operator.conditions import parse_time
from rtj_worker import exit_codes
from testkit import wait_until

INDEX = "batch.kubernetes.io/job-completion-index"
FAST = {"nodeLossGraceSeconds": 2, "terminatingTimeoutSeconds": 3}


def exit_on_delete(rtj: Job, code: int = 1) -> None:
    for pod in rtj.running_pods():
        rtj.kube.patch("Pod", pod["metadata"]["name"], rtj.ns, {"metadata": {"annotations": {
            "kwok.rtj.dev/exit-on-delete": str(code)}}})


def counters(st: dict) -> tuple[int, int, int]:
    return st.get("jobRestarts", 0), st.get("disruptions", 0), st.get("restartsWithoutProgress", 0)


def test_a_deleted_pod_is_a_disruption_whatever_its_exit_code(rtj, kube, ns, operator):
    """`kubectl delete pod`: the container ends of the deletion (exit 1, as ft_launcher on SIGTERM)."""
    rtj.create()
    rtj.wait_running()
    exit_on_delete(rtj)
    victim = rtj.running_pods()[0]
    kube.delete("Pod", victim["metadata"]["name"], ns)
    wait_until(lambda: rtj.status().get("disruptions") == 1, timeout=30, what="one disruption")
    st = rtj.wait_running(nodes=2, timeout=60)
    assert counters(st) == (0, 1, 0) and st["lastFailureReason"] == "PodDeleted", st


def test_suspend_and_resume_charge_nothing_and_keep_every_counter(rtj, kube, ns, operator):
    rtj.create(restartBudget={"maxRestarts": 5, "maxRestartsWithoutProgress": 5})
    rtj.wait_running()
    rtj.exit_pod(rtj.running_pods()[0], 1, step=10)
    wait_until(lambda: rtj.status().get("jobRestarts") == 1, what="a failure charged")
    rtj.wait_running(nodes=2, timeout=60)
    before = counters(rtj.status())
    exit_on_delete(rtj)
    rtj.patch({"suspend": True})
    rtj.wait_phase("Suspended", timeout=30)
    wait_until(lambda: not [p for p in rtj.pods() if p["status"].get("phase") in ("Pending", "Running")],
               timeout=30, what="the pods gone")
    wait_passes(3, "passes of the suspended job")
    assert counters(rtj.status()) == before, rtj.status()
    rtj.patch({"suspend": False})
    st = rtj.wait_running(nodes=2, timeout=60)
    assert counters(st) == before and st["restarts"] == 1 and st["attempt"] == 1, st


def test_node0_loss_in_a_six_node_gang_is_one_disruption_and_the_job_never_fails_itself(
        rtj, kube, ns, operator, lost_nodes, cluster):
    """Issue 17.2: node 0 hosts the rendezvous store; losing it ends all five other pods (exit 72). With
    backoffLimit = maxRestarts + 1 the Job controller counted those five and failed the Job
    (BackoffLimitExceeded), charged as a job failure; now: one disruption, no verdict of the Job."""
    rtj.create(nodes={"count": 6}, restartBudget={**FAST, "maxRestarts": 3})
    rtj.wait_running(nodes=6, timeout=90)
    pods = {p["metadata"]["annotations"][INDEX]: p for p in rtj.running_pods()}
    node0 = pods["0"]["spec"]["nodeName"]
    lost_nodes(node0)
    wait_until(lambda: rtj.status().get("disruptions") == 1 or any(
        c["type"] == "Ready" and c["status"] != "True" for c in kube.get("Node", node0)["status"]["conditions"]),
        timeout=30, what="node 0 seen lost")
    for index in "12345":
        rtj.exit_pod(pods[index], exit_codes.RENDEZVOUS_HOST_LOST)
    cluster.fence_node(node0)
    st = rtj.wait_running(nodes=6, timeout=180)
    assert counters(st)[:2] == (0, 1) and st["attempt"] == 1, st
    conds = {c["type"] for c in rtj.job()["status"].get("conditions") or [] if c["status"] == "True"}
    assert not conds & {"FailureTarget", "Failed"}, conds
    # One charge (node 0's loss: its pod's eviction, or the first peer's exit, whichever came first), and
    # the other peers' exits reported as its consequences.
    assert rtj.reasons().count("ReplacePod") == 1 and rtj.reasons().count("NotCharged") in (4, 5)


def test_a_pod_whose_deletion_never_completes_is_reported_and_not_forced(rtj, kube, ns, operator):
    """Issue 17.5: a container that does not stop keeps its pod Terminating on a Ready node; the Job
    controller keeps the index until it is Failed. The wait is bounded by a report, not a force."""
    rtj.create(restartBudget={"terminatingTimeoutSeconds": 2})
    rtj.wait_running()
    victim = rtj.running_pods()[0]
    name, node = victim["metadata"]["name"], victim["spec"]["nodeName"]
    kube.patch("Pod", name, ns, {"metadata": {"annotations": {"kwok.rtj.dev/stuck": "true"}}})
    kube.delete("Pod", name, ns, grace_seconds=1)
    cond = wait_until(lambda: rtj.condition("WaitingForPodTermination") if rtj.condition(
        "WaitingForPodTermination").get("status") == "True" else None, timeout=30, what="WaitingForPodTermination")
    assert name in cond["message"] and node in cond["message"] and cond["reason"] == "PodStuckTerminating"
    # The condition says terminatingTimeoutSeconds has passed: later passes still force nothing.
    wait_passes(3, "passes past the terminating timeout")
    index = victim["metadata"]["annotations"][INDEX]
    assert [p["metadata"]["uid"] for p in rtj.pods() if p["metadata"]["annotations"][INDEX] == index] == [
        victim["metadata"]["uid"]]
    assert rtj.reasons().count("PodStuckTerminating") == 1 and "ForceDeletedPod" not in rtj.reasons()
    kube.delete("Pod", name, ns, grace_seconds=0)  # what an administrator does once the node is repaired
    wait_until(lambda: rtj.condition("WaitingForPodTermination").get("status") == "False", timeout=30,
               what="the wait resolved")


def test_no_node_for_a_replacement_is_waited_on_visibly_charged_to_nobody_and_resumes(rtj, kube, ns, operator,
                                                                                      cluster, own_nodes):
    """Issue 17.4: with no third node, a lost node left the RTJ Restarting for minutes with nothing
    saying why, the healthy node held, and the survivors' failed rendezvous charged to the job."""
    first = own_nodes(2)
    rtj.create(placement={"nodeSelector": {"rtj.dev/test-node": own_nodes.label}},
               restartBudget={**FAST, "capacitySuspendSeconds": 8})
    rtj.wait_running(nodes=2, timeout=60)
    pods = {p["metadata"]["annotations"][INDEX]: p for p in rtj.running_pods()}
    lost = pods["1"]["spec"]["nodeName"]
    cluster.lose_node(lost)
    kube.delete("Node", lost, None)  # the instance is gone (fenced): its pod is replaced at once
    cond = wait_until(lambda: rtj.condition("WaitingForCapacity") if rtj.condition("WaitingForCapacity").get(
        "status") == "True" else None, timeout=40, what="WaitingForCapacity")
    assert "nodes are available" in cond["message"], cond
    rtj.exit_pod(pods["0"], exit_codes.RENDEZVOUS_FAILED)  # the survivor gives up waiting for its peer
    # (the excused 71 takes a new gang: between the old Job and the new one there is none)
    wait_until(lambda: (rtj.job() or {}).get("spec", {}).get("suspend") is True, timeout=40, what="the gang suspended")
    assert rtj.condition("WaitingForCapacity")["reason"] == "SuspendedForCapacity"
    wait_until(lambda: not [p for p in rtj.pods() if p["spec"].get("nodeName") and p["status"].get("phase") in (
        "Pending", "Running")], timeout=30, what="the healthy node released")
    assert counters(rtj.status())[0] == 0, rtj.status()
    own_nodes(1)  # a node arrives (the autoscaler, a capacity block)
    st = rtj.wait_running(nodes=2, timeout=90)
    assert counters(st)[:2] == (0, 1) and rtj.job()["spec"].get("suspend") is False, st
    assert rtj.condition("WaitingForCapacity")["status"] == "False"
    assert {"Unschedulable", "SuspendedForCapacity", "ResumingForCapacity"} <= set(rtj.reasons())
    assert set(first) - {lost} <= {p["spec"]["nodeName"] for p in rtj.running_pods()}


def test_a_coordinator_with_no_node_keeps_its_gang_gated_waits_visibly_and_is_charged_to_nobody(
        rtj, kube, ns, operator, own_nodes):
    """A coordinator the scheduler cannot place (its node group full, or labelled later): its gang's
    pods were released after rendezvousTimeoutSeconds and failed to resolve its name (71), each try
    charged. Now they stay gated (holding no node), WaitingForCapacity says why, and the gang starts
    once a node fits the coordinator."""
    own_nodes(2)
    rtj.create(placement={"nodeSelector": {"rtj.dev/test-node": own_nodes.label}},
               coordinator={"nodeSelector": {"rtj.dev/coordinator-node": own_nodes.label}},
               resiliency={"rendezvousTimeoutSeconds": 10})
    cond = wait_until(lambda: c if (c := rtj.condition("WaitingForCapacity")).get("status") == "True" else None,
                      timeout=40, what="WaitingForCapacity")
    assert cond["reason"] == "CoordinatorUnschedulable" and "nodes are available" in cond["message"], cond
    # Past rendezvousTimeoutSeconds (10, the least allowed) from the Job's creation, when gated pods of a
    # coordinator that has a node go anyway; then passes that looked at the world after it.
    created = parse_time(rtj.job()["metadata"]["creationTimestamp"])
    time.sleep(max(0.0, (created - datetime.datetime.now(datetime.UTC)).total_seconds() + 10 + 1))
    wait_passes(2, "passes past rendezvousTimeoutSeconds")
    pods = rtj.pods()
    assert len(pods) == 2 and all(not p["spec"].get("nodeName") and any(
        g["name"] == api.SCHEDULING_GATE for g in p["spec"].get("schedulingGates") or []) for p in pods), pods
    assert counters(rtj.status()) == (0, 0, 0) and rtj.status().get("phase") != "Failed", rtj.status()
    own_nodes(1, **{"rtj.dev/coordinator-node": own_nodes.label})  # the coordinator's node group grows
    st = rtj.wait_running(nodes=2, timeout=90)
    assert counters(st) == (0, 0, 0), st
    assert rtj.condition("WaitingForCapacity")["status"] == "False"
    assert "CoordinatorUnschedulable" in rtj.reasons()


def test_a_gang_restart_after_losing_an_unfenced_node_runs_beside_the_old_pod_until_it_is_fenced(
        rtj, kube, ns, operator, cluster, own_nodes, lost_nodes):
    """Issues 29.3 and 29.5: a node lost and never fenced (a partition, an instance that stays up), then the
    survivor's rendezvous gives up. The gang restart used to delete the old Job (Foreground) and make the new
    one under the same name once it was gone, which waits for the pod on the lost node, for as long as the
    node stays unfenced, with no pods at all. Each attempt now has its own Job and coordinator: the new gang
    runs beside the old pod at once, a true condition names that pod and what ends it, and it is forced once
    the node is fenced. The survivor's failed rendezvous, while the node was lost within its grace period, is
    the node's disruption, not the job's failure."""
    own_nodes(3)
    rtj.create(placement={"nodeSelector": {"rtj.dev/test-node": own_nodes.label}},
               restartBudget={**FAST, "nodeLossGraceSeconds": 300}, resiliency={"rendezvousTimeoutSeconds": 120})
    rtj.wait_running(nodes=2, timeout=60)
    pods = {p["metadata"]["annotations"][INDEX]: p for p in rtj.running_pods()}
    lost, old_pod = pods["1"]["spec"]["nodeName"], pods["1"]["metadata"]["name"]
    assert rtj.job()["metadata"]["name"] == "train-a1"
    lost_nodes(lost)
    cond = wait_until(lambda: rtj.condition("WaitingForFencing") if rtj.condition("WaitingForFencing").get(
        "reason") == "NodeLost" else None, timeout=90, what="WaitingForFencing, NodeLost")
    assert lost in cond["message"] and "nodeLossGraceSeconds (300s)" in cond["message"]
    rtj.exit_pod(pods["0"], exit_codes.RENDEZVOUS_FAILED)  # the survivor gives up on the rendezvous
    # Within one rendezvous timeout (120 s), the node still unfenced.
    wait_until(lambda: rtj.status().get("attempt") == 2, timeout=30, what="attempt 2")
    st = rtj.wait_running(nodes=2, timeout=90)
    assert counters(st)[:2] == (0, 1), st  # the node's disruption; the job's budget untouched
    assert rtj.job()["metadata"]["name"] == "train-a2" and rtj.coordinator()["metadata"]["name"] == "train-a2-rdzv"
    assert lost not in {p["spec"]["nodeName"] for p in rtj.running_pods()}
    assert (kube.get("Pod", old_pod, ns) or {}).get("metadata", {}).get("deletionTimestamp")  # still there
    cond = rtj.condition("WaitingForFencing")
    assert cond["status"] == "True" and cond["reason"] == "OldGangNotFenced", cond
    assert old_pod in cond["message"] and lost in cond["message"] and "out-of-service" in cond["message"], cond
    cluster.fence_node(lost)  # what a person does once the instance is known down
    wait_until(lambda: kube.get("Pod", old_pod, ns) is None, timeout=60, what="the old pod forced")
    wait_until(lambda: rtj.condition("WaitingForFencing").get("status") == "False", timeout=30,
               what="WaitingForFencing resolved")
    st = rtj.status()
    assert st.get("attempt") == 2 and st["phase"] == "Running" and counters(st)[:2] == (0, 1), st
