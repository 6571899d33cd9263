"""Issue 18.2-18.3 on the local control plane: a node its health agent reports bad (a condition as the
EKS node monitoring agent sets it, a label as SageMaker HyperPod sets it) loses its pod at once,
charged to nobody but the platform, and no pod of the job lands there again while it is excluded;
nor on a node where the job's pods keep failing. The exclusion rides on the operator's scheduling
gate: the real scheduler keeps a gated pod Pending, and the real API server takes only a narrowing of
its node affinity. Topology: required pod affinity on a topology key puts a gang in one domain, and
one that fits none waits with the scheduler's reason. kwok plays the kubelets (a node's conditions
are patched as an agent would)."""

from __future__ import annotations

import pytest

from clusterkit import Job
from rtj_operator import api
from rtj_worker import exit_codes
from testkit import wait_until

INDEX = "batch.kubernetes.io/job-completion-index"
XID = {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error",
       "message": "GPU 3 has fallen off the bus"}


def mark_unhealthy(kube, node: str, signal: str) -> None:
    if signal == "condition":
        kube.patch("Node", node, None, {"status": {"conditions": [
            {**XID, "lastHeartbeatTime": None, "lastTransitionTime": None}]}}, subresource="status", strategic=True)
    else:
        kube.patch("Node", node, None, {"metadata": {"labels": {
            "sagemaker.amazonaws.com/node-health-status": "UnschedulablePendingReplacement"}}})


def exclusion(pod: dict) -> list[str]:
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    return [v for t in terms for f in t.get("matchFields") or [] if f["operator"] == "NotIn" for v in f["values"]]


def pod_of(rtj: Job, index: str) -> dict | None:
    live = [p for p in rtj.pods() if p["metadata"]["annotations"][INDEX] == index
            and not p["metadata"].get("deletionTimestamp") and p["status"].get("phase") in ("Pending", "Running")]
    return live[0] if live else None


@pytest.mark.parametrize("signal", ["condition", "label"])
def test_an_unhealthy_node_loses_its_pod_at_once_and_the_replacement_never_lands_there(
        rtj, kube, ns, operator, own_nodes, signal):
    """Two nodes only: after the eviction the sick node is the one free node a p5 pod fits, so without the
    exclusion the scheduler would put the replacement straight back on it."""
    own_nodes(2)
    rtj.create(placement={"nodeSelector": {"rtj.dev/test-node": own_nodes.label}},
               restartBudget={"capacitySuspendSeconds": 600})
    rtj.wait_running(nodes=2, timeout=60)
    pods = {p["metadata"]["annotations"][INDEX]: p for p in rtj.running_pods()}
    assert not any(g["name"] == api.SCHEDULING_GATE for p in pods.values()
                   for g in p["spec"].get("schedulingGates") or [])  # released by the operator
    sick = pods["1"]["spec"]["nodeName"]
    mark_unhealthy(kube, sick, signal)
    st = wait_until(lambda: rtj.status() if rtj.status().get("disruptions") == 1 else None, timeout=30,
                    what="one disruption")
    assert (st.get("jobRestarts"), st["lastFailureReason"]) == (0, "NodeUnhealthy"), st
    assert (("NvidiaXID79Error" in st["lastFailureMessage"]) if signal == "condition" else
            ("UnschedulablePendingReplacement" in st["lastFailureMessage"])), st
    assert [e["node"] for e in st["excludedNodes"]] == [sick]
    replacement = wait_until(lambda: (p := pod_of(rtj, "1")) and p["metadata"]["uid"] != pods["1"]["metadata"][
        "uid"] and not p["spec"].get("schedulingGates") and p, timeout=60, what="the replacement, ungated")
    assert exclusion(replacement) == [sick]
    cond = wait_until(lambda: rtj.condition("WaitingForCapacity") if rtj.condition("WaitingForCapacity").get(
        "status") == "True" else None, timeout=30, what="WaitingForCapacity")
    assert "node affinity" in cond["message"] or "didn't match" in cond["message"], cond
    assert not pod_of(rtj, "1")["spec"].get("nodeName")
    fresh = own_nodes(1)[0]  # a healthy node arrives
    st = rtj.wait_running(nodes=2, timeout=60)
    assert pod_of(rtj, "1")["spec"]["nodeName"] == fresh
    assert (st.get("jobRestarts"), st["disruptions"]) == (0, 1), st
    assert rtj.reasons().count("NodeExcluded") == 1


def test_a_node_where_the_jobs_pods_keep_failing_is_excluded(rtj, kube, ns, operator, own_nodes):
    own_nodes(2)
    rtj.create(placement={"nodeSelector": {"rtj.dev/test-node": own_nodes.label}},
               restartBudget={"maxRestarts": 5, "maxRestartsWithoutProgress": 5})
    rtj.wait_running(nodes=2, timeout=60)
    first = pod_of(rtj, "1")
    storm = first["spec"]["nodeName"]
    rtj.exit_pod(first, exit_codes.LAUNCHER_BUDGET_EXHAUSTED)
    wait_until(lambda: rtj.status().get("jobRestarts") == 1, timeout=30, what="the first failure charged")
    assert not rtj.status().get("excludedNodes") and rtj.status()["recovery"]["nodeFailures"] == {storm: 1}
    # The one free node is the same one: the replacement lands there (after the Job's 10 s back-off).
    second = wait_until(lambda: (p := pod_of(rtj, "1")) and p["status"].get("phase") == "Running"
                        and p["metadata"]["uid"] != first["metadata"]["uid"] and p, timeout=60,
                        what="the replacement running")
    assert second["spec"]["nodeName"] == storm
    rtj.exit_pod(second, exit_codes.LAUNCHER_BUDGET_EXHAUSTED)
    st = wait_until(lambda: rtj.status() if rtj.status().get("excludedNodes") else None, timeout=30,
                    what="the node excluded")
    assert st["jobRestarts"] == 2 and [e["node"] for e in st["excludedNodes"]] == [storm]
    assert "2 failures of the job's pods in a row" in st["excludedNodes"][0]["reason"]
    fresh = own_nodes(1)[0]
    rtj.wait_running(nodes=2, timeout=90)
    assert pod_of(rtj, "1")["spec"]["nodeName"] == fresh


L3 = "topology.k8s.aws/network-node-layer-3"


def test_a_required_topology_puts_the_gang_in_one_domain_or_waits_saying_why(rtj, kube, ns, operator, own_nodes):
    own_nodes(2, **{L3: "nn-a"})
    own_nodes(2, **{L3: "nn-b"})
    selector = {"nodeSelector": {"rtj.dev/test-node": own_nodes.label}, "topology": {"key": L3}}
    rtj.create(placement=selector)
    rtj.wait_running(nodes=2, timeout=60)
    domains = {kube.get("Node", p["spec"]["nodeName"])["metadata"]["labels"][L3] for p in rtj.running_pods()}
    assert len(domains) == 1, domains
    # Every node free again, so that the only thing a third pod lacks is a domain with room.
    kube.delete(api.KIND, rtj.name, ns)
    wait_until(lambda: not rtj.pods(), timeout=60, what="the first gang's pods gone")
    big = Job(kube, ns, "big")  # three pods: no domain has three nodes
    big.create(nodes={"count": 3}, placement=selector)
    cond = wait_until(lambda: big.condition("WaitingForCapacity") if big.condition("WaitingForCapacity").get(
        "status") == "True" else None, timeout=60, what="WaitingForCapacity")
    assert "pod affinity" in cond["message"], cond
