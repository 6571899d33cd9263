"""Issue 18.1 with the real Kueue (v0.17, built from its Go module by hack/kube/kueue.sh) and its webhooks
on the local control plane: an RTJ with a queue is admitted by Kueue only when its ClusterQueue has
quota for the whole gang, waits Queued (with Kueue's reason) otherwise, is preempted by a higher
priority RTJ without a charge to any budget and runs again once the quota is back; spec.suspend goes
through Kueue (the Workload deactivated), never against it. kwok plays the kubelets."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest

from clusterkit import Job
from rtj_dev.kueue import LocalKueue
from testkit import rtj_body, wait_until

KUEUE = "/apis/kueue.x-k8s.io/v1beta2"
# One gang of two p5 pods (the builder's requests: 20 CPUs and 200 GiB per GPU, 8 GPUs, 32 EFA).
ONE_GANG = {"cpu": "320", "memory": "3200Gi", "nvidia.com/gpu": "16", "vpc.amazonaws.com/efa": "64"}
TWO_GANGS = {"cpu": "640", "memory": "6400Gi", "nvidia.com/gpu": "32", "vpc.amazonaws.com/efa": "128"}


@pytest.fixture(scope="module")
def kueue(cluster) -> Iterator[LocalKueue]:
    with LocalKueue(cluster).start() as k:
        yield k


@pytest.fixture
def queue(cluster, kueue, ns) -> Iterator[str]:
    """A ClusterQueue with quota for one gang (preempting lower priorities within it), its LocalQueue in
    the test namespace, and two WorkloadPriorityClasses."""
    cq = f"cq-{ns}"[:63]
    resources = sorted(ONE_GANG)
    for name, value in (("low", 100), ("high", 1000)):
        cluster.api("POST", f"{KUEUE}/workloadpriorityclasses", {
            "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "WorkloadPriorityClass",
            "metadata": {"name": f"{name}-{ns}"[:63]}, "value": value})
    cluster.api("POST", f"{KUEUE}/resourceflavors", {"apiVersion": "kueue.x-k8s.io/v1beta2",
                                                      "kind": "ResourceFlavor", "metadata": {"name": cq}})
    cluster.api("POST", f"{KUEUE}/clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": cq},
        "spec": {"namespaceSelector": {}, "preemption": {"withinClusterQueue": "LowerPriority"},
                 "resourceGroups": [{"coveredResources": resources, "flavors": [{"name": cq, "resources": [
                     {"name": r, "nominalQuota": ONE_GANG[r]} for r in resources]}]}]}})
    cluster.api("POST", f"{KUEUE}/namespaces/{ns}/localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "gpus", "namespace": ns},
        "spec": {"clusterQueue": cq}})
    yield "gpus"
    delete(cluster, f"{KUEUE}/namespaces/{ns}/localqueues/gpus", f"{KUEUE}/clusterqueues/{cq}",
           f"{KUEUE}/resourceflavors/{cq}", f"{KUEUE}/workloadpriorityclasses/low-{ns}"[:200],
           f"{KUEUE}/workloadpriorityclasses/high-{ns}"[:200])


def delete(cluster, *paths: str) -> None:
    """A fixture's objects, those still there (in order: a queue before what it refers to)."""
    for path in paths:
        with contextlib.suppress(RuntimeError):
            cluster.api("DELETE", path)


def make(kube, ns: str, name: str, queue: str, priority: str = "", **spec) -> Job:
    """An RTJ with no budget to spare: a single charge would fail it."""
    budget = {"maxRestarts": 0, "maxDisruptions": 0, **spec.pop("restartBudget", {})}
    body = rtj_body(name, ns, queueName=queue, restartBudget=budget, **spec)
    if priority:
        body["metadata"]["labels"] = {"kueue.x-k8s.io/priority-class": f"{priority}-{ns}"[:63]}
    kube.create(body)
    return Job(kube, ns, name)


def queued(job: Job) -> dict | None:
    cond = job.condition("Queued")
    return cond if cond.get("status") == "True" and job.status().get("phase") == "Queued" else None


def finish(job: Job) -> None:
    for pod in job.running_pods():
        job.exit_pod(pod, 0, reason="Completed")
    job.wait_phase("Succeeded", timeout=60)


def test_the_second_gang_waits_queued_and_starts_when_the_first_finishes(kube, ns, operator, queue):
    first = make(kube, ns, "first", queue)
    st = first.wait_running(nodes=2, timeout=90)
    assert st["queue"]["admitted"] and st["queue"]["clusterQueue"].startswith("cq-"), st
    assert first.condition("Admitted")["status"] == "True"
    second = make(kube, ns, "second", queue)
    cond = wait_until(lambda: queued(second), timeout=60, what="the second gang Queued")
    assert "insufficient" in cond["message"].lower() or "quota" in cond["message"].lower(), cond
    assert second.job()["spec"]["suspend"] is True and not second.pods()
    assert second.coordinator() is None  # nothing of a queued gang runs
    finish(first)
    st = second.wait_running(nodes=2, timeout=90)
    assert (st.get("jobRestarts"), st.get("disruptions"), st.get("restarts")) == (0, 0, 0), st
    assert second.condition("Queued")["status"] == "False"


def test_a_higher_priority_gang_preempts_a_lower_one_which_is_charged_nothing_and_resumes(
        kube, ns, operator, queue, cluster):
    low = make(kube, ns, "low", queue, priority="low")
    low.wait_running(nodes=2, timeout=90)
    for pod in low.running_pods():  # the workers' last checkpoint, as their termination report says it
        kube.patch("Pod", pod["metadata"]["name"], ns, {"metadata": {"annotations": {
            "kwok.rtj.dev/exit-on-delete": "1",
            "kwok.rtj.dev/exit-message": '{"exitCode": 1, "reason": "stopped", "checkpointStep": 40}'}}})
    workload, job_uid = low.status()["queue"]["workload"], low.job()["metadata"]["uid"]
    high = make(kube, ns, "high", queue, priority="high")
    wait_until(lambda: queued(low), timeout=90, what="the low gang preempted")
    # Kueue evicted the low gang's Workload for the high one (not a lost quota or an admission check).
    evicted = next(c for c in cluster.api("GET", f"{KUEUE}/namespaces/{ns}/workloads/{workload}")["status"]
                   ["conditions"] if c["type"] == "Evicted")
    assert (evicted["status"], evicted["reason"]) == ("True", "Preempted"), evicted
    high.wait_running(nodes=2, timeout=90)
    wait_until(lambda: not [p for p in low.pods() if p["status"].get("phase") in ("Pending", "Running")],
               timeout=60, what="the low gang's pods gone")
    st = low.status()
    assert (st.get("jobRestarts"), st.get("disruptions"), st.get("restarts")) == (0, 0, 0), st
    assert st["attempt"] == 1 and "Queued" in low.reasons(), st
    # The checkpoint the stopped workers committed is the one the gang resumes from (the same Job and PVC:
    # its pods load the newest checkpoint, as the e2e suspend test shows with real training).
    assert st.get("lastCheckpointStep") == 40, st
    finish(high)
    st = low.wait_running(nodes=2, timeout=120)
    assert (st.get("jobRestarts"), st.get("disruptions"), st["attempt"]) == (0, 0, 1), st
    assert st.get("lastCheckpointStep") == 40 and low.job()["metadata"]["uid"] == job_uid, st  # same gang


def test_suspend_deactivates_the_workload_and_resume_requeues_it(kube, ns, operator, queue, cluster):
    job = make(kube, ns, "train", queue)
    job.wait_running(nodes=2, timeout=90)
    workload = job.status()["queue"]["workload"]
    job.patch({"suspend": True})
    job.wait_phase("Suspended", timeout=60)
    wl = cluster.api("GET", f"{KUEUE}/namespaces/{ns}/workloads/{workload}")
    assert wl["spec"]["active"] is False
    wait_until(lambda: job.job()["spec"]["suspend"] is True, timeout=60, what="Kueue suspended the Job")
    assert "WorkloadDeactivated" in job.reasons()
    job.patch({"suspend": False})
    st = job.wait_running(nodes=2, timeout=90)
    assert cluster.api("GET", f"{KUEUE}/namespaces/{ns}/workloads/{workload}")["spec"]["active"] is True
    assert (st.get("jobRestarts"), st.get("disruptions"), st["attempt"]) == (0, 0, 1), st


def test_a_queued_gang_short_of_capacity_releases_its_quota_through_kueue_and_runs_once_room_appears(
        kube, ns, operator, queue, cluster, own_nodes):
    """Issue 29.2: Kueue owns Job.spec.suspend, so a queued gang short of nodes used to wait admitted,
    holding its quota and its nodes for up to capacityTimeoutSeconds. Now its Workload is deactivated
    (Kueue evicts it, suspends the Job and releases the quota) while its capacity probes ask for room,
    and it is re-activated once they are all placed: Kueue admits it again and it runs. Charged nothing."""
    (first,) = own_nodes(1)
    job = make(kube, ns, "train", queue, placement={"nodeSelector": {"rtj.dev/test-node": own_nodes.label}},
               restartBudget={"capacitySuspendSeconds": 3})
    workload = wait_until(lambda: (job.status().get("queue") or {}).get("workload"), timeout=60,
                          what="the gang's Workload")
    wait_until(lambda: cluster.api("GET", f"{KUEUE}/namespaces/{ns}/workloads/{workload}")["spec"].get(
        "active") is False, timeout=60, what="the Workload deactivated for capacity")
    wait_until(lambda: job.job()["spec"]["suspend"] is True, timeout=60, what="Kueue suspended the Job")
    cq = cluster.api("GET", f"{KUEUE}/namespaces/{ns}/localqueues/{queue}")["spec"]["clusterQueue"]
    wait_until(lambda: not cluster.api("GET", f"{KUEUE}/clusterqueues/{cq}").get("status", {}).get(
        "reservingWorkloads"), timeout=60, what="the ClusterQueue's quota released")
    # Said where a queued gang's wait is (Queued), and where a capacity wait is (WaitingForCapacity).
    wait_until(lambda: job.condition("Queued").get("reason") == "SuspendedForCapacity", timeout=30,
               what="Queued, SuspendedForCapacity")
    assert job.condition("WaitingForCapacity")["reason"] == "SuspendedForCapacity", job.explain()
    wait_until(lambda: any(p["spec"].get("nodeName") == first for p in kube.list("Pod", ns, {
        "app.kubernetes.io/component": "capacity-probe"})), timeout=60, what="a probe on the released node")
    own_nodes(1)  # room for the whole gang
    st = job.wait_running(nodes=2, timeout=120)
    assert cluster.api("GET", f"{KUEUE}/namespaces/{ns}/workloads/{workload}")["spec"]["active"] is True
    assert (st.get("jobRestarts"), st.get("disruptions"), st["attempt"]) == (0, 0, 1), st
    assert {"SuspendingForCapacity", "WorkloadDeactivated", "ResumingForCapacity", "WorkloadActivated"} <= set(
        job.reasons()), job.reasons()


L3 = "topology.k8s.aws/network-node-layer-3"
HOSTNAME = "kubernetes.io/hostname"


@pytest.fixture
def tas_queue(cluster, kueue, ns, own_nodes) -> Iterator[str]:
    """Topology Aware Scheduling (beta, on by default in Kueue 0.17): a Topology (network layer 3, then
    the host), a ResourceFlavor of this test's own nodes using it, and a ClusterQueue with quota for
    two gangs, so that only the topology decides where a gang goes."""
    name = f"tas-{ns}"[:63]
    cluster.api("POST", f"{KUEUE}/topologies", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Topology", "metadata": {"name": name},
        "spec": {"levels": [{"nodeLabel": L3}, {"nodeLabel": HOSTNAME}]}})
    cluster.api("POST", f"{KUEUE}/resourceflavors", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": name},
        "spec": {"nodeLabels": {"rtj.dev/test-node": own_nodes.label}, "topologyName": name}})
    resources = sorted(ONE_GANG)
    cluster.api("POST", f"{KUEUE}/clusterqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": name},
        "spec": {"namespaceSelector": {}, "resourceGroups": [{"coveredResources": resources, "flavors": [
            {"name": name, "resources": [{"name": r, "nominalQuota": TWO_GANGS[r]} for r in resources]}]}]}})
    cluster.api("POST", f"{KUEUE}/namespaces/{ns}/localqueues", {
        "apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "tas", "namespace": ns},
        "spec": {"clusterQueue": name}})
    yield "tas"
    delete(cluster, f"{KUEUE}/namespaces/{ns}/localqueues/tas", f"{KUEUE}/clusterqueues/{name}",
           f"{KUEUE}/resourceflavors/{name}", f"{KUEUE}/topologies/{name}")


def test_kueue_topology_aware_scheduling_places_the_gang_in_one_domain_with_room(
        kube, ns, operator, tas_queue, own_nodes, cluster):
    """placement.topology with a queue: the Job's pod template asks Kueue for one layer-3 domain
    (podset-required-topology); Kueue's TAS picks the domain with room for the whole gang at admission
    and ungates each pod onto its node with a gate of its own, beside the operator's (which the
    operator lifts, keeping Kueue's). nn-a has one node, nn-b two: the gang of two can only go to nn-b."""
    own_nodes(1, **{L3: "nn-a"})
    b = own_nodes(2, **{L3: "nn-b"})
    job = make(kube, ns, "train", tas_queue, placement={
        "nodeSelector": {"rtj.dev/test-node": own_nodes.label}, "topology": {"key": L3}})
    st = job.wait_running(nodes=2, timeout=120)
    assert {p["spec"]["nodeName"] for p in job.running_pods()} == set(b), job.running_pods()
    # Kueue's ungater put each pod on its host (a nodeSelector), not the scheduler's choice among three.
    assert all(p["spec"]["nodeSelector"].get(HOSTNAME) == p["spec"]["nodeName"] for p in job.running_pods())
    wl = cluster.api("GET", f"{KUEUE}/namespaces/{ns}/workloads/{st['queue']['workload']}")
    (assignment,) = wl["status"]["admission"]["podSetAssignments"]
    # Kueue records the assignment at the topology's lowest level: the hosts it chose (v1beta2's compact
    # form, a common prefix and the rest of each name).
    topology = assignment["topologyAssignment"]
    (hosts,) = [v["individual"] for sl in topology["slices"] for v in sl["valuesPerLevel"]]
    assert topology["levels"] == [HOSTNAME], topology
    assert {hosts.get("prefix", "") + root + hosts.get("suffix", "") for root in hosts["roots"]} == set(b), topology
    assert job.job()["spec"]["template"]["metadata"]["annotations"][
        "kueue.x-k8s.io/podset-required-topology"] == L3
    assert (st.get("jobRestarts"), st.get("disruptions"), st.get("restarts")) == (0, 0, 0), st
    # A second gang finds no domain with room for two (one node left, in nn-a): Kueue keeps it queued
    # (the quota would admit it), and the RTJ says so in Kueue's words.
    second = make(kube, ns, "second", tas_queue, placement={
        "nodeSelector": {"rtj.dev/test-node": own_nodes.label}, "topology": {"key": L3}})
    # Kueue's own verdict (not the operator's WaitingForWorkload before Kueue has looked at it).
    cond = wait_until(lambda: c if (c := queued(second)) and c["reason"] != "WaitingForWorkload" else None,
                      timeout=60, what="Kueue's verdict on the second gang")
    assert "topology" in cond["message"].lower(), cond
    assert not second.pods() and second.job()["spec"]["suspend"] is True, cond
