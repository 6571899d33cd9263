"""The chart on the API server: installed by the session's `helm install` (tests/clusterkit.py), the
user's path with kubectl, and the operator (as the chart's ServiceAccount) needing no permission the
chart does not grant, read from the API server's audit log. What needs no cluster (render, lint,
schema, helm-unittest) is tests/unit/test_chart.py's."""

from __future__ import annotations

import yaml

from clusterkit import Job, helm, kubectl
from rtj_operator import api
from testkit import RELEASE, RELEASE_NS, ROOT, wait_until


def test_helm_install_and_kubectl_show_the_job(cluster, kube, ns, operator):
    """The user's path: the chart installed the CRD (kubectl knows `rtj`), `kubectl apply` of an
    example, `kubectl wait` for the Running condition, printer columns, `kubectl describe`."""
    releases = helm(cluster, "list", "-A", "-o", "json")
    assert '"name":"rtj-operator"' in releases.replace(" ", "")
    manifest = yaml.safe_load((ROOT / "examples" / "rtj-local.yaml").read_text())
    manifest["metadata"].pop("namespace", None)
    kubectl(cluster, "apply", "-n", ns, "-f", "-", input=yaml.safe_dump(manifest))
    name = manifest["metadata"]["name"]
    kubectl(cluster, "wait", "-n", ns, "--for=condition=Running", f"rtj/{name}", "--timeout=60s")
    table = kubectl(cluster, "get", "rtj", "-n", ns).stdout
    header, row = table.splitlines()[:2]
    for column in ("PHASE", "READY", "DESIRED", "RESTARTS", "CKPT-STEP", "AGE"):
        assert column in header, header
    assert row.split()[:2] == [name, "Running"], table
    described = kubectl(cluster, "describe", "rtj", "-n", ns, name).stdout
    assert "AllNodesRunning" in described and "Events:" in described and "Created" in described
    # `kubectl explain` has something to say of the RTJ's own fields and of the copied core/v1 types' fields.
    for field, words in (("rtj.spec.restartBudget", "budget"),
                         ("rtj.spec.placement.tolerations.effect", "Effect indicates the taint effect to match"),
                         ("rtj.status.nodesReady", "Training nodes")):
        explained = kubectl(cluster, "explain", field).stdout
        assert words in explained and "<empty>" not in explained, explained


def test_the_operator_needs_no_permission_beyond_the_chart(cluster, kube, ns, operator, lost_nodes):
    """Every test's operator authenticates as the chart's ServiceAccount. Here a full scenario
    (create, node loss with eviction and forced failure, invalid edit, suspend, delete) runs, then
    the API server's audit log must show no request of that ServiceAccount denied by the authorizer."""
    rtj = Job(kube, ns)
    rtj.create(storage={"storageClassName": "fsx-sc", "retention": "Delete"},
               restartBudget={"nodeLossGraceSeconds": 1, "terminatingTimeoutSeconds": 1})
    rtj.wait_running()
    node = rtj.running_pods()[0]["spec"]["nodeName"]
    lost_nodes(node)
    wait_until(lambda: rtj.status().get("disruptions") == 1, timeout=60, what="disruption")
    # Fenced: the Node deleted (as the cloud node lifecycle controller does once the instance is gone); the
    # operator forces the pod at once (PodGC would only after its 40 s quarantine).
    kube.delete("Node", node, None)
    wait_until(lambda: "ForceDeletedPod" in rtj.reasons(), timeout=60, what="forced failure")
    cluster.add_nodes([node])
    rtj.patch({"nodes": {"spares": 1}, "coordinator": {"enabled": False}})  # the operator's check, not the schema's
    wait_until(lambda: rtj.condition("InvalidSpec").get("status") == "True", what="InvalidSpec")
    rtj.patch({"nodes": {"spares": 0}, "coordinator": {"enabled": True}, "suspend": True})
    rtj.wait_phase("Suspended", timeout=60)
    kube.delete(api.KIND, "train", ns)
    wait_until(lambda: kube.get(api.KIND, "train", ns) is None, what="RTJ deleted")

    user = f"system:serviceaccount:{RELEASE_NS}:{RELEASE}"
    entries = [e for e in cluster.audit_events() if e.get("user", {}).get("username") == user]
    # The authorizer's decision, not the code: admission answers 403 too (a create in a namespace another
    # test is deleting, CI stop 33), and that is no missing grant. The log is the whole cluster's: every
    # test's operator is this ServiceAccount, so a grant missing anywhere shows here.
    denied = sorted({(e["verb"], e.get("objectRef", {}).get("resource"), e.get("objectRef", {}).get("subresource"),
                      e.get("annotations", {}).get("authorization.k8s.io/reason", ""))
                     for e in entries if e.get("annotations", {}).get("authorization.k8s.io/decision") == "forbid"})
    assert not denied, f"requests the chart's RBAC denies: {denied}"
    assert any(e.get("annotations", {}).get("authorization.k8s.io/decision") == "allow" for e in entries), \
        "the audit log carries no authorization decision (policy level below Metadata?)"
    # A watch is long-running: it has started (ResponseStarted), and completes only when it is closed.
    done = {(e["verb"], e.get("objectRef", {}).get("resource"), e.get("objectRef", {}).get("subresource"))
            for e in entries if e.get("stage") == "ResponseComplete"
            or (e["verb"] == "watch" and e.get("stage") == "ResponseStarted")}
    # Issue 8.i: pods, Jobs, Services and PVCs reach the operator filtered by the API server.
    reads = [e for e in entries if e["verb"] in ("list", "watch") and e.get("objectRef", {}).get("resource")
             in ("pods", "jobs", "services", "persistentvolumeclaims")]
    assert reads and all("labelSelector=" in e["requestURI"]
                         for e in reads), sorted({e["requestURI"] for e in reads})
    for call in [("create", "jobs", None), ("patch", "resilienttrainingjobs", "status"), ("create", "pods", "eviction"),
                 ("patch", "pods", "status"), ("delete", "pods", None), ("create", "events", None),
                 ("watch", "nodes", None), ("watch", "pods", None), ("create", "services", None),
                 ("create", "networkpolicies", None), ("watch", "networkpolicies", None)]:
        assert call in done, (call, sorted(done, key=str))


def test_the_operators_requests_have_a_priority_level_of_their_own(cluster):
    """API Priority and Fairness (values.apiPriority): the API server took the chart's FlowSchemas, each
    names a priority level the server has (a dangling one would classify nothing), and their subject is the
    ServiceAccount the chart's Deployment runs the operator as, so its requests no longer share workload-low
    with the worker pods' reports. The session's control plane runs with APF's filter off (benchmarks send
    thousands of requests from one client): test_api_priority.py runs one with it on."""
    flow = "/apis/flowcontrol.apiserver.k8s.io/v1"
    deployment = cluster.api("GET", f"/apis/apps/v1/namespaces/{RELEASE_NS}/deployments/{RELEASE}")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    levels = {pl["metadata"]["name"] for pl in cluster.api("GET", f"{flow}/prioritylevelconfigurations")["items"]}
    schemas = {fs["metadata"]["name"]: fs["spec"] for fs in cluster.api("GET", f"{flow}/flowschemas")["items"]}
    ours = {name: spec for name, spec in schemas.items() if name.startswith(RELEASE)}
    assert {spec["priorityLevelConfiguration"]["name"] for spec in ours.values()} == {"workload-high",
                                                                                     "leader-election"}
    assert {spec["priorityLevelConfiguration"]["name"] for spec in ours.values()} <= levels
    for spec in ours.values():
        assert spec["rules"][0]["subjects"] == [{"kind": "ServiceAccount", "serviceAccount": {
            "name": account, "namespace": RELEASE_NS}}]
        # Before the FlowSchema every other ServiceAccount's requests (the worker pods' reports) fall into.
        assert spec["matchingPrecedence"] < schemas["service-accounts"]["matchingPrecedence"]
