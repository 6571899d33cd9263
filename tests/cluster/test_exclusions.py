"""Issue 29 on the local control plane: the real API server takes the node exclusions the operator adds
to a gated pod's affinity, one excluded node or twenty (it takes one value per matchFields requirement:
all of them in one requirement was refused with 422 once two nodes were excluded, on every pass); a job
with excluded nodes runs on the others; and a pass the API server keeps refusing says so on the RTJ
(ReconcileError) and clears it once the refusal ends."""

from __future__ import annotations

import datetime

import pytest

from rtj_operator import api
from rtj_operator.kube import KubeError
from rtj_operator.policies.placement import exclusion_terms
from testkit import wait_until

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
TERMS = [{"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
         {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["b"]}],
          "matchFields": [{"key": "metadata.name", "operator": "NotIn", "values": ["gone-0"]}]}]


def gated_pod(ns: str, name: str, terms: list[dict] | None) -> dict:
    spec: dict = {"schedulingGates": [{"name": api.SCHEDULING_GATE}], "restartPolicy": "Never",
                  "nodeSelector": {"rtj.dev/test-node": "none"},  # never placed: only the API server's word
                  "containers": [{"name": "c", "image": "worker:1"}]}
    if terms:
        spec["affinity"] = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns}, "spec": spec}


def node_terms(pod: dict) -> list[dict]:
    return pod["spec"]["affinity"]["nodeAffinity"][REQUIRED]["nodeSelectorTerms"]


@pytest.mark.parametrize("count", [1, 2, 20])
@pytest.mark.parametrize("terms", [None, TERMS], ids=["no-terms", "two-terms"])
def test_the_api_server_takes_the_exclusions_a_gated_pod_gets(kube, ns, count, terms):
    """As release_gated lifts the gate: the affinity narrowed in the same patch, guarded by uid and
    resourceVersion (KEP-3838 lets a gated pod's node affinity only narrow); and a pod created with it."""
    nodes = [f"gone-{i}" for i in range(count)]
    pod = kube.create(gated_pod(ns, "p", terms))
    want = exclusion_terms(pod["spec"], nodes)
    ungated = gated_pod(ns, "q", want)
    ungated["spec"].pop("schedulingGates")
    kube.create(ungated, dry_run=True)  # validation alone
    meta = pod["metadata"]
    patched = kube.patch("Pod", "p", ns, {"metadata": {"uid": meta["uid"], "resourceVersion": meta["resourceVersion"]},
                                          "spec": {"schedulingGates": [],
                                                   "affinity": {"nodeAffinity": {REQUIRED: {
                                                       "nodeSelectorTerms": want}}}}})
    assert node_terms(patched) == want and not patched["spec"].get("schedulingGates")
    fields = [f for t in node_terms(patched) for f in t["matchFields"]]
    assert {f["values"][0] for f in fields} == set(nodes) | ({"gone-0"} if terms else set())


def test_all_the_exclusions_in_one_requirement_are_refused(kube, ns):
    """What the operator sent before (issue 29): the API server's own rule, not only spec.py's."""
    pod = gated_pod(ns, "p", [{"matchFields": [{"key": "metadata.name", "operator": "NotIn",
                                                "values": ["gone-0", "gone-1"]}]}])
    with pytest.raises(KubeError) as refused:
        kube.create(pod, dry_run=True)
    assert refused.value.status == 422 and "must be only one value" in refused.value.message


@pytest.mark.parametrize("fake", [0, 14], ids=["two-excluded", "sixteen-excluded"])
def test_a_job_with_excluded_nodes_runs_on_the_others(rtj, kube, ns, operator, own_nodes, fake):
    """The real lift path: exclusions in status before the gang's pods exist; the operator lifts their gate
    with every excluded node in their affinity, and the scheduler places them on the other nodes."""
    nodes = own_nodes(4)
    rtj.create(suspend=True, placement={"nodeSelector": {"rtj.dev/test-node": own_nodes.label}})
    rtj.wait_phase("Suspended")
    until = (datetime.datetime.now(datetime.UTC) + datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    excluded = nodes[:2] + [f"gone-{i}" for i in range(fake)]
    kube.patch(api.KIND, rtj.name, ns, {"status": {"excludedNodes": [
        {"node": n, "reason": "test", "until": until} for n in excluded]}}, subresource="status")
    rtj.patch({"suspend": False})
    st = rtj.wait_running(nodes=2)
    assert [e["node"] for e in st["excludedNodes"]] == excluded
    pods = rtj.running_pods()
    assert {p["spec"]["nodeName"] for p in pods} == set(nodes[2:])
    for pod in pods:
        (term,) = node_terms(pod)
        assert sorted(f["values"][0] for f in term["matchFields"]) == sorted(excluded)
    assert rtj.condition("ReconcileError") == {}  # never refused


@pytest.fixture
def frozen_gates(cluster, kube, ns):
    """A cluster admin's ValidatingAdmissionPolicy: pods of this namespace keep the operator's scheduling
    gate (the API server refuses every pass's lift of it, as it refused issue 29's affinity)."""
    name = f"frozen-{ns}"[:63]
    has_gate = ("has({0}.spec.schedulingGates) && "
                f"{{0}}.spec.schedulingGates.exists(g, g.name == '{api.SCHEDULING_GATE}')")
    cluster.api("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", {
        "metadata": {"name": name}, "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                    "operations": ["UPDATE"], "resources": ["pods"]}]},
            "validations": [{"expression": f"!({has_gate.format('oldObject')}) || ({has_gate.format('object')})",
                             "message": "placement is frozen here"}]}})
    cluster.api("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings", {
        "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}}})

    def enforced() -> bool:
        # The API server loads new policies asynchronously: probe until it denies.
        probe = kube.create(gated_pod(ns, f"probe-{len(probes)}", None))
        probes.append(probe["metadata"]["name"])
        try:
            kube.patch("Pod", probe["metadata"]["name"], ns, {"spec": {"schedulingGates": []}})
        except KubeError as exc:
            return "frozen" in str(exc)
        return False

    probes: list[str] = []
    wait_until(enforced, what="the admission policy enforced", interval=0.5)
    for probe in probes:
        kube.delete("Pod", probe, ns, grace_seconds=0)

    def lift() -> None:
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            cluster.api("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}", missing_ok=True)

    yield lift
    lift()


def test_a_pass_the_api_server_keeps_refusing_is_said_on_the_rtj_and_cleared_once_it_goes_through(
        rtj, kube, ns, operator, frozen_gates):
    rtj.create()

    def refused() -> dict:
        cond = rtj.condition("ReconcileError")
        return cond if cond.get("status") == "True" else {}
    try:
        cond = wait_until(refused, timeout=60, what="ReconcileError")
    except AssertionError as exc:
        raise AssertionError(f"{exc}{rtj.explain()}") from None
    assert cond["reason"] == "APIRejected", cond
    for words in ("the API server refuses patch Pod train-", "placement is frozen here"):
        assert words in cond["message"], cond
    assert "HTTP 422" in cond["message"] or "HTTP 403" in cond["message"], cond
    # The event is posted after the status that carries the condition (CI run 6 read the events between).
    wait_until(lambda: "APIRejected" in rtj.reasons(), timeout=30, what="the APIRejected event")
    assert not rtj.running_pods()
    frozen_gates()
    rtj.wait_running(timeout=90)
    cond = wait_until(lambda: (c := rtj.condition("ReconcileError")).get("status") == "False" and c,
                      what="ReconcileError cleared")
    assert cond["reason"] == "Resolved", cond
