"""Node health, node exclusions, the operator's scheduling gate, topology and Kueue, as pure functions:
health.unhealthy and NodeHealth.parse, the builder's shape, and reconcile() on hand-built worlds (the
helpers of test_reconcile_table). On real components: tests/cluster/test_node_health_and_topology.py and
tests/cluster/test_kueue.py."""

from __future__ import annotations

import copy
import datetime
from typing import Any

import pytest
from test_reconcile_table import NOW, RESUME, SUSPEND, W, node, pod, reasons, ts, verbs

from rtj_operator import api, health, ladder
from rtj_operator.actions import EVICT, PATCH, UNGATE
from rtj_operator.builders import build_job
from rtj_operator.builders.job import template_hash
from rtj_operator.builders.names import selector_labels
from rtj_operator.policies import placement
from rtj_operator.reconcile import Config, reconcile
from rtj_operator.spec import RTJ, _affinity_errors, semantic_errors
from rtj_operator.world import published
from rtj_worker import exit_codes
from testkit import rtj_body

XID = {"type": "AcceleratedHardwareReady", "status": "False", "reason": "NvidiaXID79Error",
       "message": "GPU has fallen off the bus"}


def sick(name: str, cond: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> dict[str, Any]:
    n = node(name)
    n["status"]["conditions"].append(cond or XID)
    n["metadata"]["labels"] = labels or {}
    return n


# --- health.unhealthy ----------------------------------------------------------------------------------
@pytest.mark.parametrize("conds, labels, rules, want", [
    ([XID], {}, health.DEFAULT, "AcceleratedHardwareReady=False (NvidiaXID79Error): GPU has fallen off the bus"),
    ([{**XID, "status": "True", "reason": "Healthy"}], {}, health.DEFAULT, ""),
    ([{"type": "NetworkingReady", "status": "False"}], {}, health.DEFAULT, "NetworkingReady=False (False)"),
    ([], {health.HYPERPOD_LABEL: "UnschedulablePendingReplacement"}, health.DEFAULT,
     f"{health.HYPERPOD_LABEL}=UnschedulablePendingReplacement"),
    ([], {health.HYPERPOD_LABEL: "Schedulable"}, health.DEFAULT, ""),
    ([XID], {}, health.NONE, ""),  # node health off
    ([{"type": "MemoryPressure", "status": "True"}], {}, health.DEFAULT, ""),  # the kubelet's own: not ours
    ([{"type": "Custom", "status": "True"}], {}, health.NodeHealth.parse(["Custom=True"], []), "Custom=True (True)"),
    # Issue 29.8: verdicts the workload causes are not node faults (the job's own bug, not the machine's).
    ([{"type": "KernelReady", "status": "False", "reason": "ForkFailedOutOfPIDs"}], {}, health.DEFAULT, ""),
    ([{"type": "ContainerRuntimeReady", "status": "False", "reason": "PodStuckTerminating"}], {}, health.DEFAULT, ""),
    ([{"type": "KernelReady", "status": "False", "reason": "ForkFailedOutOfPIDs"}], {},
     health.NodeHealth.parse(None, None, []), "KernelReady=False (ForkFailedOutOfPIDs)"),
])
def test_which_nodes_cannot_train(conds, labels, rules, want):
    n = {"metadata": {"name": "n", "labels": labels}, "status": {"conditions": conds}}
    assert health.unhealthy(n, rules) == want


def test_rules_from_flags():
    rules = health.NodeHealth.parse(["A=False", " B = Unknown "], ["k=x,y"])
    assert rules.conditions == (("A", "False"), ("B", "Unknown"))
    assert rules.labels == (("k", frozenset({"x", "y"})),)
    assert health.NodeHealth.parse(None, None) == health.DEFAULT
    assert health.NodeHealth.parse([], [], []) == health.NONE
    assert health.NodeHealth.parse(None, None, [" Custom "]).workload_reasons == {"Custom"}
    with pytest.raises(ValueError, match="KEY=VALUE"):
        health.NodeHealth.parse(["AcceleratedHardwareReady"], None)


# --- the ladder ----------------------------------------------------------------------------------------
def test_a_running_pod_on_an_unhealthy_node_is_evicted_at_once_and_charged_to_the_platform():
    p = pod(1)
    plan = ladder.plan([p], {"n1": sick("n1")}, set(), NOW, ladder.Timing())
    (f,) = plan.findings
    assert (f.kind, f.reason, f.action, f.node, f.lost_node) == (ladder.PLATFORM_FAULT, ladder.UNHEALTHY, ladder.EVICT,
                                                                 "n1", "n1")
    assert "NvidiaXID79Error" in f.message and plan.unhealthy == {"n1": health.unhealthy(sick("n1"))}
    assert not plan.lost_nodes and not plan.brake


def test_most_of_the_gang_reported_unhealthy_at_once_evicts_none_for_it():
    """Issue 29.8: the mass-loss brake's rule for health verdicts (two or more nodes, and 55 % of the
    gang's): a bad agent rollout must not take the job down one eviction per node."""
    nodes = {"n0": sick("n0"), "n1": sick("n1"), "n2": node("n2")}
    pods = [pod(0, node_name="n0"), pod(1, node_name="n1"), pod(2, node_name="n2")]
    plan = ladder.plan(pods, nodes, set(), NOW, ladder.Timing())
    assert plan.health_brake.startswith("2 of the gang's 3 nodes reported unhealthy at once (n0, n1)")
    assert plan.findings == [] and plan.actions == []
    # A pod that failed on such a node is still a finding (its failure is real, whatever the verdict).
    failed = [pod(0, "Failed", code=exit_codes.LAUNCHER_BUDGET_EXHAUSTED, node_name="n0"), *pods[1:]]
    assert [f.reason for f in ladder.plan(failed, nodes, set(), NOW, ladder.Timing()).findings] == [ladder.UNHEALTHY]
    # One of three: that node's pod is evicted at once, as before.
    one = ladder.plan(pods, {**nodes, "n1": node("n1")}, set(), NOW, ladder.Timing())
    assert not one.health_brake and [(f.pod, f.action) for f in one.actions] == [("train-0-x1", ladder.EVICT)]


def test_the_health_brake_is_a_condition_and_one_event():
    w = W(pods=3, nodes={"count": 3})  # and the coordinator's node: 3 of 4 reported unhealthy
    for name in ("n0", "n1", "n2"):
        w.world.nodes[name] = sick(name)
    intent = w.run()
    cond = next(c for c in intent.status.conditions if c["type"] == "NodeHealthBrake")
    assert (cond["status"], cond["reason"]) == ("True", "MassNodeUnhealthy") and "check the agent" in cond["message"]
    assert reasons(intent).count("MassNodeUnhealthy") == 1 and not intent.actions
    assert intent.status.disruptions == 0
    w.body["status"] = intent.status.to_dict()
    assert "MassNodeUnhealthy" not in reasons(w.run())  # said once
    w.world.nodes["n1"], w.world.nodes["n2"] = node("n1"), node("n2")  # fewer now: n0's pod goes, as a lone one's
    w.body["status"] = intent.status.to_dict()
    after = w.run()
    assert next(c for c in after.status.conditions if c["type"] == "NodeHealthBrake")["status"] == "False"
    assert after.status.disruptions == 1


def test_a_pod_that_failed_on_an_unhealthy_node_is_the_platforms_fault():
    f = ladder.classify(pod(1, "Failed", code=exit_codes.LAUNCHER_BUDGET_EXHAUSTED), sick("n1"), NOW,
                        ladder.Timing(), sick="AcceleratedHardwareReady=False (NvidiaXID79Error)")
    assert (f.kind, f.reason) == (ladder.PLATFORM_FAULT, ladder.UNHEALTHY)


def test_a_lost_node_stays_lost_not_unhealthy():
    n = sick("n1")
    n["status"]["conditions"][0].update(status="Unknown", lastTransitionTime=ts(5))
    plan = ladder.plan([pod(1)], {"n1": n}, set(), NOW, ladder.Timing())
    assert plan.lost_nodes and not plan.unhealthy and not plan.findings  # within the node-loss grace period


# --- reconcile: eviction, exclusion, gates -------------------------------------------------------------
def gated(p: dict[str, Any], **spec: Any) -> dict[str, Any]:
    p["spec"].pop("nodeName", None)
    p["spec"].update(schedulingGates=[{"name": "kueue.x-k8s.io/topology"}, {"name": api.SCHEDULING_GATE}], **spec)
    p["status"] = {"phase": "Pending"}
    p["metadata"]["resourceVersion"] = "77"
    return p


def test_unhealthy_node_charges_a_disruption_excludes_the_node_then_evicts():
    w = W()
    w.world.nodes["n1"] = sick("n1")
    first = w.run()
    status = first.status
    assert (status.disruptions, status.job_restarts) == (1, 0)
    assert status.last_failure_reason == ladder.UNHEALTHY
    assert [e["node"] for e in status.excluded_nodes] == ["n1"]
    assert status.excluded_nodes[0]["until"] == (NOW + datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert "NodeExcluded" in reasons(first) and first.requeue.act
    assert (EVICT, "Pod") not in verbs(first)  # recorded first; the next pass carries it out
    w.body["status"] = status.to_dict()
    second = w.run()
    assert [(a.verb, a.name) for a in second.actions if a.verb == EVICT] == [(EVICT, "train-1-x1")]
    assert second.status.disruptions == 1 and second.status.excluded_nodes == status.excluded_nodes


def test_a_new_pod_is_ungated_with_the_excluded_nodes_in_its_affinity_and_other_gates_kept():
    w = W()
    terms = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]}]}
    w.world.pods[1] = gated(w.world.pods[1],
                            affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": terms}})
    w.status(excludedNodes=[{"node": "n9", "reason": "x", "until": ts(-60)},
                            {"node": "n8", "reason": "old", "until": ts(60)}])  # n8's exclusion is over
    intent = w.run()
    (ungate,) = [a for a in intent.actions if a.verb == UNGATE]
    assert ungate.name == "train-1-x1" and ungate.uid == "pod-1-1"
    body = ungate.body
    assert body["metadata"] == {"uid": "pod-1-1", "resourceVersion": "77"}
    assert body["spec"]["schedulingGates"] == [{"name": "kueue.x-k8s.io/topology"}]
    (term,) = body["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "a", "operator": "In", "values": ["b"]}]  # only narrowed
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]
    assert [e["node"] for e in intent.status.excluded_nodes] == ["n9"]


def test_without_exclusions_the_gate_alone_is_removed():
    w = W()
    w.world.pods[0] = gated(w.world.pods[0])
    (ungate,) = [a for a in w.run().actions if a.verb == UNGATE]
    assert "affinity" not in ungate.body["spec"]


def node_terms(*terms: dict[str, Any]) -> dict[str, Any]:
    return {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": list(terms)}}}} if terms else {}


ZONE_A = {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
POOL_B = {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}],
          "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["n0"]}]}


@pytest.mark.parametrize("count", [1, 2, 20])
@pytest.mark.parametrize("existing", [(), (ZONE_A,), (ZONE_A, POOL_B)], ids=["no-terms", "one-term", "two-terms"])
def test_each_excluded_node_is_its_own_requirement_in_every_term(count, existing):
    """Issue 29: all the excluded nodes in one matchFields requirement was refused (422, "must be only one
    value") on every pass once two nodes were excluded: the replacements stayed gated."""
    nodes = [f"n{i}" for i in range(count)]
    spec = copy.deepcopy(node_terms(*existing))
    terms = placement.exclusion_terms(spec, nodes)
    assert spec == node_terms(*existing)  # the pod's own spec is untouched
    assert len(terms) == max(1, len(existing))  # terms are ORed: one more would widen the placement
    for term, old in zip(terms, existing or ({},), strict=True):
        assert term.get("matchExpressions") == old.get("matchExpressions")  # only narrowed (KEP-3838)
        fields = term["matchFields"]
        assert fields[:len(old.get("matchFields") or [])] == (old.get("matchFields") or [])
        assert all(len(f["values"]) == 1 for f in fields)
        assert {f["values"][0] for f in fields if f["operator"] == "NotIn"} >= set(nodes)
        assert len(fields) == len({f["values"][0] for f in fields})  # n0, excluded twice, said once
    pod = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    assert _affinity_errors(pod) == []  # the API server's rule, as spec.py checks it


def test_two_excluded_nodes_lift_the_gate_with_a_pod_the_api_server_accepts():
    w = W()
    w.world.pods[1] = gated(w.world.pods[1])
    w.status(excludedNodes=[{"node": "n9", "reason": "x", "until": ts(-60)},
                            {"node": "n7", "reason": "y", "until": ts(-60)}])
    (ungate,) = [a for a in w.run().actions if a.verb == UNGATE]
    affinity = ungate.body["spec"]["affinity"]
    (term,) = affinity["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": ["n7"]},
                                   {"key": "metadata.name", "operator": "NotIn", "values": ["n9"]}]
    assert _affinity_errors(affinity) == []


@pytest.mark.parametrize("coordinator,job_age,released", [
    ("Running", 5, True),  # it has an address: its name resolves
    ("Pending", 5, False),  # not started yet: the workers' 60 s DNS wait would begin too early
    ("Pending", 61, True),  # bounded by rendezvousTimeoutSeconds: the workers' own wait says why
    ("gone", 5, False),  # created in this pass or being replaced
])
def test_a_new_gangs_pods_wait_for_the_coordinators_address_at_most_the_rendezvous_timeout(
        coordinator, job_age, released):
    """CI: a coordinator slow to start on a busy node; the workers, ungated at once, failed to resolve its
    name within the rendezvous timeout (71, charged). The gate is lifted once it has an IP."""
    w = W(resiliency={"rendezvousTimeoutSeconds": 60})
    if coordinator == "gone":
        w.world.coordinator = None
    else:
        w.coordinator(1, phase=coordinator)
    w.world.job["metadata"]["creationTimestamp"] = ts(job_age)
    w.world.pods = [gated(p) for p in w.world.pods]
    intent = w.run()
    assert bool([a for a in intent.actions if a.verb == UNGATE]) is released
    if not released:
        assert intent.requeue.seconds <= 60 - job_age


@pytest.mark.parametrize("published,job_age,released,recheck", [
    (None, 5, True, None),  # not read (no grant): the address alone
    (True, 5, True, None),
    # An address, not yet a name (CI: the EndpointSlice controller backing off on a busy control plane):
    # held, looked at again each second, as no watch says when it is published.
    (False, 5, False, 1.0),
    (False, 61, True, None),  # bounded as for the address: the workers' own 76 then says why
])
def test_a_new_gangs_pods_wait_for_the_coordinators_name_to_be_published(published, job_age, released, recheck):
    w = W(resiliency={"rendezvousTimeoutSeconds": 60}).coordinator(1)
    w.world.coordinator_published = published
    w.world.job["metadata"]["creationTimestamp"] = ts(job_age)
    w.world.pods = [gated(p) for p in w.world.pods]
    intent = w.run()
    assert bool([a for a in intent.actions if a.verb == UNGATE]) is released
    if recheck is not None:
        assert intent.requeue.seconds == pytest.approx(recheck, abs=0.01)


def test_an_endpoint_is_the_coordinators_by_uid_and_address():
    coord = {"metadata": {"uid": "u1"}, "status": {"podIP": "10.0.0.9"}}
    endpoint = {"addresses": ["10.0.0.9"], "hostname": "train-a1-rdzv", "targetRef": {"kind": "Pod", "uid": "u1"}}
    assert published([{"endpoints": [endpoint]}], coord)
    assert not published([{"endpoints": [{**endpoint, "targetRef": {"uid": "u0"}}]}], coord)  # an older pod's
    assert not published([{"endpoints": [{**endpoint, "addresses": ["10.0.0.8"]}]}], coord)  # its old address
    assert not published([{"endpoints": None}, {}], coord)


def unplaced_coordinator(w: W, bound_ago: float | None = None) -> W:
    """The coordinator Pending without an address: unschedulable, or bound `bound_ago` seconds ago."""
    coord = w.world.coordinator
    coord["status"] = {"phase": "Pending"}
    if bound_ago is None:
        del coord["spec"]["nodeName"]
        coord["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                          "message": "0/9 nodes are available: 9 Insufficient cpu."}]
    else:
        coord["status"]["conditions"] = [{"type": "PodScheduled", "status": "True",
                                          "lastTransitionTime": ts(bound_ago)}]
    return w


@pytest.mark.parametrize("bound_ago,waited,want", [
    # No node for the coordinator: its gang stays gated past the rendezvous bound (its workers would
    # fail their DNS wait, charged), and the wait is said, never charged.
    (None, 0, "CoordinatorUnschedulable"),
    (None, 3000, "CoordinatorUnschedulable"),
    # ... and bounded by capacityTimeoutSeconds: Failed with the platform's reason.
    (None, 3601, "Failed"),
    # Bound to a node late (the Job is 10 minutes old): the bound counts from its binding.
    (5, 0, "gated"),
    (61, 0, "released"),
])
def test_a_coordinator_that_finds_no_node_keeps_its_gang_gated_waiting_for_capacity_not_charged(
        bound_ago, waited, want):
    w = unplaced_coordinator(W(resiliency={"rendezvousTimeoutSeconds": 60},
                               restartBudget={"capacityTimeoutSeconds": 3600, "capacitySuspendSeconds": 300}),
                             bound_ago)
    if waited:
        w.body["status"]["conditions"] = [{"type": "WaitingForCapacity", "status": "True",
                                           "reason": "CoordinatorUnschedulable", "message": "",
                                           "lastTransitionTime": ts(waited), "observedGeneration": 1}]
    w.world.job["metadata"]["creationTimestamp"] = ts(600)
    w.world.pods = [gated(p) for p in w.world.pods]
    intent = w.run()
    st = intent.status
    ungated = [a for a in intent.actions if a.verb == UNGATE]
    assert st.job_restarts == 0 and st.disruptions == 0
    capacity = next((c for c in st.conditions if c["type"] == "WaitingForCapacity"), {})
    if want == "CoordinatorUnschedulable":
        assert not ungated and capacity["status"] == "True" and capacity["reason"] == want
        assert "the coordinator pod train-a1-rdzv: 0/9 nodes are available" in capacity["message"]
        assert not w.world.job["spec"].get("suspend") and not st.recovery.suspended_for_capacity
        assert intent.requeue.seconds <= 3600 - waited
    elif want == "Failed":
        assert st.phase == "Failed" and st.last_failure_reason == "InsufficientCapacity"
        assert "the job's coordinator" in st.last_failure_message
    else:
        assert bool(ungated) is (want == "released") and capacity.get("status") != "True"


def test_two_job_failures_on_one_node_exclude_it():
    w = W(pods=3)
    w.status(recovery={"nodeFailures": {"n1": 1}})
    w.world.pods[1] = pod(1, "Failed", code=exit_codes.LAUNCHER_BUDGET_EXHAUSTED)
    intent = w.run()
    assert intent.status.job_restarts == 1
    assert [e["node"] for e in intent.status.excluded_nodes] == ["n1"]
    assert "2 failures of the job's pods in a row" in intent.status.excluded_nodes[0]["reason"]
    assert "n1" not in intent.status.recovery.node_failures


def test_job_failures_that_move_from_node_to_node_exclude_none():
    """The job's own code fails wherever it runs (every fault fails its pod with in-job recovery off): a
    failure on another node ends the count, so only two in a row on one node exclude it."""
    w = W(pods=3, restartBudget={"maxRestarts": 10, "maxRestartsWithoutProgress": 10})
    intent = None
    for n, index in enumerate((1, 2, 1, 2)):  # n1, n2, n1, n2: each node twice, never twice in a row
        w.world.pods = [pod(i) for i in range(3)]
        w.world.pods[index] = pod(index, "Failed", code=exit_codes.LAUNCHER_BUDGET_EXHAUSTED)
        w.world.pods[index]["metadata"]["uid"] = f"failed-{n}"
        intent = w.run()
        w.body["status"] = intent.status.to_dict()
    assert intent.status.job_restarts == 4 and not intent.status.excluded_nodes, reasons(intent)
    assert intent.status.recovery.node_failures == {"n2": 1}
    # Two in a row on n1 exclude it; the same failures going on in a row on the node the job moved to are the
    # job's code: n2 is not excluded too.
    for n, index in enumerate((1, 1, 2, 2), start=4):
        w.world.pods = [pod(i) for i in range(3)]
        w.world.pods[index] = pod(index, "Failed", code=exit_codes.LAUNCHER_BUDGET_EXHAUSTED)
        w.world.pods[index]["metadata"]["uid"] = f"failed-{n}"
        intent = w.run()
        w.body["status"] = intent.status.to_dict()
    assert [e["node"] for e in intent.status.excluded_nodes] == ["n1"], reasons(intent)


def test_one_job_failure_is_only_counted():
    w = W(pods=3)
    w.world.pods[1] = pod(1, "Failed", code=exit_codes.LAUNCHER_BUDGET_EXHAUSTED)
    intent = w.run()
    assert intent.status.recovery.node_failures == {"n1": 1} and not intent.status.excluded_nodes


def test_exclusion_off_and_bounded():
    w = W(restartBudget={"nodeExclusionSeconds": 0})
    w.world.nodes["n1"] = sick("n1")
    assert not w.run().status.excluded_nodes
    w = W()
    w.world.nodes["n1"] = sick("n1")
    w.status(excludedNodes=[{"node": f"old{i}", "reason": "x", "until": ts(-60)} for i in range(16)])
    kept = w.run().status.excluded_nodes
    assert len(kept) == 16 and kept[-1]["node"] == "n1" and kept[0]["node"] == "old1"


def test_the_gate_is_not_part_of_the_template_identity():
    rtj = RTJ.from_body(rtj_body())
    job = build_job(rtj)
    assert job["spec"]["template"]["spec"]["schedulingGates"] == [{"name": api.SCHEDULING_GATE}]
    old = copy.deepcopy(job)
    del old["spec"]["template"]["spec"]["schedulingGates"]  # a Job made before the gate existed
    assert template_hash(old) == template_hash(job) == job["metadata"]["annotations"][api.ANNOTATION_TEMPLATE_HASH]


# --- topology --------------------------------------------------------------------------------------------
L3 = "topology.k8s.aws/network-node-layer-3"


@pytest.mark.parametrize("mode", ["Required", "Preferred"])
def test_topology_without_a_queue_is_pod_affinity_to_the_gang_of_this_attempt(mode):
    rtj = RTJ.from_body(rtj_body(placement={"topology": {"key": L3, "mode": mode}}))
    job = build_job(rtj, attempt=3)
    affinity = job["spec"]["template"]["spec"]["affinity"]["podAffinity"]
    want = {"labelSelector": {"matchLabels": {**selector_labels(rtj), api.LABEL_COMPONENT: "workers",
                                              api.LABEL_ATTEMPT: "3"}},
            "topologyKey": L3}
    if mode == "Required":
        assert affinity == {"requiredDuringSchedulingIgnoredDuringExecution": [want]}
    else:
        assert affinity == {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100,
                                                                                 "podAffinityTerm": want}]}
    assert "annotations" not in job["spec"]["template"]["metadata"]


@pytest.mark.parametrize("mode, key", [("Required", api.KUEUE_REQUIRED_TOPOLOGY),
                                       ("Preferred", api.KUEUE_PREFERRED_TOPOLOGY)])
def test_topology_with_a_queue_is_kueue_tas(mode, key):
    job = build_job(RTJ.from_body(rtj_body(queueName="gpu", placement={"topology": {"key": L3, "mode": mode}})))
    assert job["spec"]["template"]["metadata"]["annotations"] == {key: L3}
    assert "podAffinity" not in job["spec"]["template"]["spec"]["affinity"]


# --- Kueue -------------------------------------------------------------------------------------------------
def test_a_queued_job_is_created_suspended_with_the_queue_and_priority_labels():
    body = rtj_body(queueName="team-a")
    body["metadata"]["labels"] = {api.KUEUE_PRIORITY_LABEL: "high", "other": "x"}
    job = build_job(RTJ.from_body(body))
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"][api.KUEUE_QUEUE_LABEL] == "team-a"
    assert job["metadata"]["labels"][api.KUEUE_PRIORITY_LABEL] == "high"
    body = rtj_body()
    body["metadata"]["labels"] = {api.KUEUE_QUEUE_LABEL: "team-b"}  # the label on the RTJ works too
    assert build_job(RTJ.from_body(body))["metadata"]["labels"][api.KUEUE_QUEUE_LABEL] == "team-b"
    assert build_job(RTJ.from_body(rtj_body()))["spec"]["suspend"] is False


def test_two_queues_named_is_invalid():
    body = rtj_body(queueName="a")
    body["metadata"]["labels"] = {api.KUEUE_QUEUE_LABEL: "b"}
    assert any("name different queues" in e for e in semantic_errors(RTJ.from_body(body)))


def workload(admitted: bool = False, active: bool = True, evicted: str = "", message: str = "") -> dict[str, Any]:
    conds = [{"type": "QuotaReserved", "status": str(admitted), "reason": "QuotaReserved" if admitted else "Pending",
              "message": message or "couldn't assign flavors to pod set main: insufficient quota"}]
    if admitted:
        conds.append({"type": "Admitted", "status": "True", "reason": "Admitted",
                      "message": "The workload is admitted"})
    if evicted:
        conds.append({"type": "Evicted", "status": "True", "reason": evicted, "message": "Preempted to accommodate a "
                                                                                         "higher priority Workload"})
    return {"metadata": {"name": "job-train-abc12", "namespace": "default", "creationTimestamp": ts(60)},
            "spec": {"active": active, "queueName": "team-a"},
            "status": {"conditions": conds, **({"admission": {"clusterQueue": "cq"}} if admitted else {})}}


def queued_world(suspended: bool = True, **spec: Any) -> W:
    w = W(queueName="team-a", **spec)
    w.job(1)
    w.world.job["spec"]["suspend"] = suspended
    w.world.workload_read = True  # as world.read_workload reads it for a gang not yet seen admitted
    if suspended:
        w.world.pods, w.world.coordinator = [], None
    return w


def test_a_waiting_gang_is_queued_with_kueues_reason_and_never_resumed_by_the_operator():
    w = queued_world()
    w.world.workload = workload()
    intent = w.run()
    assert intent.status.phase == "Queued"
    conds = {c["type"]: c for c in intent.status.conditions}
    assert conds["Queued"]["status"] == "True" and conds["Queued"]["reason"] == "Pending"
    assert "insufficient quota" in conds["Queued"]["message"] and conds["Admitted"]["status"] == "False"
    assert intent.status.queue == {"name": "team-a", "workload": "job-train-abc12", "admitted": False,
                                   "clusterQueue": "", "activeRequested": True}
    assert not [a for a in intent.actions if a.kind in ("Job", "Workload")]  # no un-suspend, no fight
    assert not [a for a in intent.actions if a.kind == "Pod"]  # no coordinator while queued
    assert "Queued" in reasons(intent)


def test_an_admitted_gang_runs_and_says_by_which_cluster_queue():
    w = queued_world(suspended=False)
    w.world.workload = workload(admitted=True)
    intent = w.run()
    conds = {c["type"]: c for c in intent.status.conditions}
    assert intent.status.phase == "Running" and conds["Admitted"]["status"] == "True"
    assert conds["Queued"]["status"] == "False" and intent.status.queue["clusterQueue"] == "cq"


def test_a_running_admitted_gang_keeps_its_queue_status_without_reading_the_workload():
    """Before: the pass that skipped the read (world.read_workload) wrote admitted False and no Workload
    name, so the next pass read it again, and status flapped between the two."""
    w = queued_world(suspended=False)
    w.world.workload = workload(admitted=True)
    first = w.run()
    w.body["status"] = first.status.to_dict()
    w.world.workload, w.world.workload_read = None, False  # admitted and running: not read
    again = w.run()
    assert again.status.queue == first.status.queue == {"name": "team-a", "workload": "job-train-abc12",
                                                         "admitted": True, "clusterQueue": "cq",
                                                         "activeRequested": True}
    conds = {c["type"]: c for c in again.status.conditions}
    assert conds["Admitted"]["status"] == "True" and conds["Queued"]["status"] == "False"


def test_preemption_by_kueue_is_charged_to_nobody():
    w = queued_world(suspended=True)
    w.world.workload = workload(admitted=True, evicted="Preempted")
    w.world.pods = [pod(0, "Failed", code=exit_codes.SIGTERM), pod(1, "Failed", code=1)]
    w.world.nodes = {"n0": node("n0"), "n1": node("n1")}
    intent = w.run()
    assert (intent.status.job_restarts, intent.status.disruptions, intent.status.restarts) == (0, 0, 0)
    conds = {c["type"]: c for c in intent.status.conditions}
    assert conds["Queued"]["reason"] == "Preempted" and intent.status.phase == "Queued"
    assert sorted(intent.status.recovery.seen_pods) == ["pod-0-1", "pod-1-1"]


@pytest.mark.parametrize("suspend, active, want", [(True, True, False), (False, False, True)])
def test_spec_suspend_deactivates_the_workload_and_resume_activates_it(suspend, active, want):
    w = queued_world(suspended=True, suspend=suspend)
    w.world.workload = workload(admitted=not active, active=active)
    intent = w.run()
    (patch,) = [a for a in intent.actions if a.kind == "Workload"]
    assert (patch.verb, patch.name, patch.body) == (PATCH, "job-train-abc12", {"spec": {"active": want}})
    assert not [a for a in intent.actions if a.kind == "Job"]


def test_a_workload_kueue_or_an_admin_deactivated_stays_so_until_spec_suspend_is_toggled():
    """Issue 29.11: the operator re-activated at its next pass a Workload Kueue deactivated (its requeue
    limit) or an admin did (kueuectl stop)."""
    w = queued_world(suspended=True)
    w.status(queue={"name": "team-a", "workload": "job-train-abc12", "admitted": False, "clusterQueue": "",
                    "activeRequested": True})
    w.world.workload = workload(admitted=False, active=False)
    intent = w.run()
    assert not [a for a in intent.actions if a.kind == "Workload"]
    queued_cond = next(c for c in intent.status.conditions if c["type"] == "Queued")
    assert queued_cond["reason"] == "Deactivated" and "set spec.suspend to true, then false" in queued_cond["message"]
    # The user toggles spec.suspend: each change is acted on once.
    w.body["spec"]["suspend"] = True
    w.body["status"] = intent.status.to_dict()
    off = w.run()
    assert not [a for a in off.actions if a.kind == "Workload"]  # already inactive: nothing to patch
    assert off.status.queue["activeRequested"] is False
    w.body["spec"]["suspend"] = False
    w.body["status"] = off.status.to_dict()
    on = w.run()
    assert [(a.kind, a.body) for a in on.actions if a.kind == "Workload"] == [("Workload", {"spec": {"active": True}})]


def test_a_failed_queued_job_deactivates_its_workload():
    w = queued_world(suspended=False)
    w.status(phase="Failed")
    w.world.workload = workload(admitted=True)
    intent = w.run()
    assert [(a.verb, a.kind, a.body) for a in intent.actions if a.kind in ("Job", "Workload")] == [
        (PATCH, "Workload", {"spec": {"active": False}})]


def test_no_workload_yet_says_so():
    w = queued_world()
    w.world.workload_error = "Kueue's Workload API cannot be read (HTTP 404)"
    cond = {c["type"]: c for c in w.run().status.conditions}["Queued"]
    assert cond["reason"] == "WaitingForWorkload" and "HTTP 404" in cond["message"]


def test_a_job_suspended_by_someone_else_is_not_fought_over():
    w = W()
    w.world.job["spec"]["suspend"] = True  # not by the operator: status.recovery.suspendedJob is unset
    w.world.pods = []
    intent = w.run()
    assert not [a for a in intent.actions if a.kind == "Job"]
    assert intent.status.phase == "Queued"
    assert {c["type"]: c for c in intent.status.conditions}["Running"]["reason"] == "SuspendedExternally"


@pytest.mark.parametrize("status_says, job_says", [
    (True, False),  # status recorded the suspend (a Job an earlier version suspended carries no mark)
    (False, True),  # the Job's mark: the status write after the suspend was lost (an old leader's, a crash)
    (True, True),
])
def test_a_job_the_operator_suspended_is_resumed_by_it(status_says: bool, job_says: bool):
    w = W()
    w.world.job["spec"]["suspend"] = True
    if job_says:
        w.world.job["metadata"].setdefault("annotations", {})[api.ANNOTATION_SUSPENDED_BY] = api.MANAGER
    w.status(recovery={"suspendedJob": status_says})
    intent = w.run()
    assert [(a.verb, a.body) for a in intent.actions if a.kind == "Job"] == [(PATCH, RESUME)]
    assert not intent.status.recovery.suspended_job
    # Not someone else's in the pass that resumes it (before: SuspendedExternally for that pass, where
    # status alone said it, as with a Job an earlier operator suspended).
    running = {c["type"]: c for c in intent.status.conditions}["Running"]
    assert running["reason"] != "SuspendedExternally" and intent.status.phase != "Queued", running


def test_suspending_records_that_the_operator_did_it_in_status_and_on_the_job():
    w = W(suspend=True)
    w.world.job["spec"]["suspend"] = False  # running when the user suspends
    intent = w.run()
    assert [(a.verb, a.body) for a in intent.actions if a.kind == "Job"] == [(PATCH, SUSPEND)]
    assert intent.status.recovery.suspended_job


def test_config_rules_reach_the_ladder():
    w = W()
    w.world.nodes["n1"] = sick("n1")
    intent = reconcile(copy.deepcopy(w.world), NOW, Config(node_health=health.NONE))
    assert intent.status.disruptions == 0 and not intent.status.excluded_nodes


def test_a_queued_job_gets_its_coordinator_only_once_kueue_admitted_it():
    """Before: the coordinator was made with the suspended Job and deleted on the next pass (suspended),
    then read as lost once Kueue resumed the Job: a disruption charged for an admission."""
    w = W(children=False, queueName="team-a")
    w.body["status"] = {}
    first = w.run()
    assert [(a.verb, a.kind) for a in first.actions] == [("create", "Service"), ("create", "NetworkPolicy"),
                                                         ("create", "PersistentVolumeClaim"), ("create", "Job")]
    w = queued_world(suspended=False)
    w.world.coordinator = None
    w.world.workload = workload(admitted=True)
    assert [(a.verb, a.kind) for a in w.run().actions] == [("create", "Pod")]


def test_a_coordinator_the_operator_stopped_is_never_charged_when_the_job_resumed_meanwhile():
    w = queued_world(suspended=True)
    w.world.workload = workload(admitted=True, evicted="Preempted")
    w.coordinator(1)
    stop = w.run()
    assert [(a.verb, a.kind) for a in stop.actions if a.kind == "Pod"] == [("delete", "Pod")]
    assert "coord-uid-1" in stop.status.recovery.seen_pods  # settled in status before the delete
    # Kueue admits it again before the operator's next pass; the deleted coordinator reads exit 143.
    w.body["status"] = stop.status.to_dict()
    w.world.job["spec"]["suspend"] = False
    w.world.coordinator["metadata"]["deletionTimestamp"] = ts(2)
    w.world.coordinator["status"] = {"phase": "Failed", "containerStatuses": [
        {"state": {"terminated": {"exitCode": 143, "finishedAt": ts(1)}}}]}
    again = w.run()
    assert (again.status.disruptions, again.status.job_restarts, again.status.restarts) == (0, 0, 0)
    assert again.status.recovery.pending_gang_restart == ""
