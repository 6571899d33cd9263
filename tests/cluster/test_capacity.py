"""Issue 29.2 on the local control plane: a gang suspended for capacity resumes once room appears, on
an autoscaled cluster and on a shared fleet, and while it waits it reserves nothing.

Before capacity probes, a suspended gang resumed only when the *set* of nodes fitting it by allocatable
GPUs changed. Under an autoscaler (Karpenter, Cluster Autoscaler, EKS Auto Mode) a suspended gang has
no pending pod, so nothing was provisioned; on a fleet shared with other jobs, GPUs another job freed
changed no node set. Either way it waited out capacityTimeoutSeconds and failed with capacity there.

The autoscaler is a stand-in (a real one cannot run here, say so): like Karpenter, it adds a node that
fits a pod that stays pending unschedulable, and nothing for a pod that is not pending. The scheduler,
its preemption and the PriorityClass are the real kube-scheduler's and API server's.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import pytest

from clusterkit import Job, start_operator
from rtj_operator import api, ladder
from rtj_operator.builders.probe import COMPONENT
from testkit import wait_until

BUDGET = {"capacitySuspendSeconds": 3}


class AutoscalerStandIn:
    """Adds a node (own_nodes) for each pod of the namespace that the scheduler keeps pending as
    unschedulable for `pending_for` polls, once `capacity` is set (until then the cloud has none, as
    with an InsufficientInstanceCapacity). Only pods that select the test's nodes, as Karpenter only
    provisions for pods its NodePools can take."""

    def __init__(self, kube, ns: str, add: Callable[..., list[str]], label: str, pending_for: int = 2):
        self.kube, self.ns, self.add, self.label, self.pending_for = kube, ns, add, label, pending_for
        self.capacity, self.stop = threading.Event(), threading.Event()
        self.provisioned: dict[str, str] = {}  # node -> the pod it was made for
        self.seen: dict[str, int] = {}
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        while not self.stop.wait(0.5):
            pods = self.kube.list("Pod", self.ns)
            for pod in pods:
                uid = pod["metadata"]["uid"]
                if ((pod["spec"].get("nodeSelector") or {}).get("rtj.dev/test-node") != self.label
                        or not ladder.unschedulable(pod) or uid in self.provisioned.values()):
                    continue
                self.seen[uid] = self.seen.get(uid, 0) + 1
                if self.capacity.is_set() and self.seen[uid] >= self.pending_for:
                    (node,) = self.add(1)
                    self.provisioned[node] = uid


@pytest.fixture
def autoscaler(kube, ns, own_nodes) -> Iterator[AutoscalerStandIn]:
    scaler = AutoscalerStandIn(kube, ns, own_nodes, own_nodes.label)
    scaler.thread.start()
    yield scaler
    scaler.stop.set()
    scaler.thread.join(timeout=5)


def probes(rtj: Job) -> list[dict]:
    return rtj.kube.list("Pod", rtj.ns, {api.LABEL_NAME: rtj.name, api.LABEL_COMPONENT: COMPONENT})


def suspended(rtj: Job) -> None:
    """The gang suspended for capacity, its workers gone, its probes made: one placed, one pending."""
    wait_until(lambda: (rtj.job() or {}).get("spec", {}).get("suspend") is True, timeout=60,
               what="the gang suspended for capacity")
    assert rtj.condition("WaitingForCapacity")["reason"] == "SuspendedForCapacity", rtj.explain()
    wait_until(lambda: not [p for p in rtj.pods() if p["status"].get("phase") in ("Pending", "Running")],
               timeout=30, what="the gang's nodes released")
    wait_until(lambda: sorted(bool(p["spec"].get("nodeName")) for p in probes(rtj)) == [False, True]
               and any(ladder.unschedulable(p) for p in probes(rtj)), timeout=30,
               what="one probe placed on the node the gang released, one pending")


def gpu_pod(name: str, ns: str, label: str, node: str | None = None, priority_class: str = "") -> dict:
    """Another team's pod that takes a whole node's GPUs."""
    spec = {"nodeSelector": {"rtj.dev/test-node": label, **({"kubernetes.io/hostname": node} if node else {})},
            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "containers": [{"name": "main", "image": "other:1", "resources": {
                "requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}}]}
    if priority_class:
        spec["priorityClassName"] = priority_class
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec}


def test_an_autoscaler_provisions_for_a_suspended_gang_which_resumes_on_the_new_node(
        rtj, kube, ns, operator, own_nodes, autoscaler):
    (first,) = own_nodes(1)
    rtj.create(placement={"nodeSelector": {"rtj.dev/test-node": own_nodes.label}}, restartBudget=BUDGET)
    suspended(rtj)
    assert autoscaler.provisioned == {}  # no capacity in the cloud until now
    autoscaler.capacity.set()  # instances again: it provisions for what is pending
    st = rtj.wait_running(nodes=2, timeout=90)
    (node,) = autoscaler.provisioned  # one node, made for the pending probe
    assert {p["spec"]["nodeName"] for p in rtj.running_pods()} == {first, node}
    assert (st.get("jobRestarts", 0), st.get("disruptions", 0)) == (0, 0), st
    assert {"SuspendingForCapacity", "ResumingForCapacity"} <= set(rtj.reasons())
    wait_until(lambda: not probes(rtj), timeout=30, what="the probes gone once the gang resumed")


def test_gpus_another_job_frees_on_a_shared_fleet_resume_the_gang(rtj, kube, ns, operator, own_nodes):
    first, second = own_nodes(2)
    kube.create(gpu_pod("other-team", ns, own_nodes.label, node=second))
    wait_until(lambda: (kube.get("Pod", "other-team", ns) or {}).get("spec", {}).get("nodeName"), timeout=30,
               what="the other team's pod placed")
    rtj.create(placement={"nodeSelector": {"rtj.dev/test-node": own_nodes.label}}, restartBudget=BUDGET)
    suspended(rtj)
    kube.delete("Pod", "other-team", ns, grace_seconds=0)  # its job ends: the node's GPUs are free
    rtj.wait_running(nodes=2, timeout=90)
    assert {p["spec"]["nodeName"] for p in rtj.running_pods()} == {first, second}
    assert rtj.status().get("jobRestarts", 0) == 0


def test_a_probe_reserves_nothing_any_ordinary_pod_preempts_it(rtj, kube, ns, cluster, operator_token, own_nodes):
    """With the chart's PriorityClass (-1, preemptionPolicy Never) a probe holding a freed node gives it up to
    another team's pod of ordinary priority: a suspended gang keeps no node from anyone."""
    name = f"rtj-capacity-probe-{os.urandom(3).hex()}"
    classes = "/apis/scheduling.k8s.io/v1/priorityclasses"
    cluster.api("POST", classes, {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
                                  "metadata": {"name": name}, "value": -1, "preemptionPolicy": "Never",
                                  "globalDefault": False})
    thread = start_operator(cluster, operator_token, ns, capacity_probe_priority_class=name)
    try:
        (first,) = own_nodes(1)
        rtj.create(placement={"nodeSelector": {"rtj.dev/test-node": own_nodes.label}}, restartBudget=BUDGET)
        suspended(rtj)
        assert {p["spec"].get("priorityClassName") for p in probes(rtj)} == {name}
        kube.create(gpu_pod("other-team", ns, own_nodes.label, node=first))
        wait_until(lambda: (kube.get("Pod", "other-team", ns) or {}).get("spec", {}).get("nodeName") == first,
                   timeout=60, what="the other team's pod placed, the probe preempted")
        # The operator makes the preempted probe again: both pending now, the gang still suspended.
        wait_until(lambda: len(probes(rtj)) == 2 and all(ladder.unschedulable(p) for p in probes(rtj)), timeout=30,
                   what="both probes pending")
        assert (rtj.job() or {})["spec"]["suspend"] is True and rtj.status().get("jobRestarts", 0) == 0
    finally:
        thread.stop()
        cluster.api("DELETE", f"{classes}/{name}", missing_ok=True)
    assert thread.error is None, thread.error
