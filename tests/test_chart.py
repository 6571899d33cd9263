"""The Helm chart with the real helm binary: lint, render, validate, least privilege, RBAC coverage."""

from __future__ import annotations

import re
import subprocess

import kubernetes_validate
import pytest
import yaml

from conftest import ROOT, wait_until
from rtj_operator import api

CHART = ROOT / "charts" / "rtj-operator"
HELM = ROOT / ".tools" / "bin" / "helm"
K8S_VERSION = "1.33.0"

pytestmark = pytest.mark.skipif(not HELM.exists(), reason="run `make tools` (helm from PyPI)")

VALUE_SETS = {
    "default": [],
    "namespaced": ["--set", "watch.clusterWide=false", "--set", "watch.namespaces={team-a,team-b}"],
    "everything": ["--set", "metrics.serviceMonitor.enabled=true", "--set", "networkPolicy.enabled=true",
                   "--set", "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus",
                   "--set", "fsxCheck.enabled=true",
                   "--set", "fsxCheck.region=us-west-2", "--set", "workerRBAC.namespaces={team-a}",
                   "--set", "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/r"],
}


def helm(*args: str) -> str:
    return subprocess.run([str(HELM), *args], check=True, capture_output=True, text=True).stdout


def render(*values: str) -> list[dict]:
    out = helm("template", "rtj", str(CHART), "--namespace", "rtj-system", *values)
    return [doc for doc in yaml.safe_load_all(out) if doc]


def test_helm_lint():
    for values in VALUE_SETS.values():
        helm("lint", "--strict", str(CHART), *values)


@pytest.mark.parametrize("name", VALUE_SETS)
def test_rendered_manifests_validate_against_kubernetes_schemas(name):
    docs = render(*VALUE_SETS[name])
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition"} <= kinds
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com"):
            assert doc["spec"]["endpoints"][0]["port"] == "metrics"
            continue  # a prometheus-operator CRD: not in the core schemas
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_no_wildcards_anywhere_in_rbac():
    for values in VALUE_SETS.values():
        for doc in render(*values):
            for rule in doc.get("rules", []):
                for key in ("verbs", "resources", "apiGroups"):
                    assert "*" not in rule.get(key, []), (doc["kind"], rule)


def test_namespaced_mode_grants_roles_only_in_watched_namespaces():
    docs = render(*VALUE_SETS["namespaced"])
    roles = [d for d in docs if d["kind"] == "Role"]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert [r["resources"] for r in cluster_role["rules"]] == [["nodes"]]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][:2] == [
        "--namespace=team-a", "--namespace=team-b"]
    with pytest.raises(subprocess.CalledProcessError):
        render("--set", "watch.clusterWide=false")


def test_deployment_is_hardened_and_probed():
    docs = render(*VALUE_SETS["everything"])
    pod = next(d for d in docs if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--check-fsx" in container["args"] and {"name": "AWS_REGION", "value": "us-west-2"} in container["env"]
    assert container["resources"]["limits"]["memory"]
    sa = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] != "rtj-worker")
    assert sa["metadata"]["annotations"]["eks.amazonaws.com/role-arn"] == "arn:aws:iam::1:role/r"


def test_chart_crd_matches_the_generated_crd_and_can_be_kept_on_uninstall():
    import sys
    sys.path.insert(0, str(ROOT / "hack"))
    import chart_crd

    assert (CHART / "templates" / "crd.yaml").read_text() == chart_crd.render(), "run `make crds`"
    crd = next(d for d in render() if d["kind"] == "CustomResourceDefinition")
    assert crd["metadata"]["annotations"] == {"helm.sh/resource-policy": "keep"}
    assert crd["spec"] == api.crd_manifest()["spec"]
    assert not [d for d in render("--set", "crds.install=false") if d["kind"] == "CustomResourceDefinition"]


def test_every_value_is_documented():
    """helm-docs style: each value, or a mapping above it, has a `# --` comment."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    stack: list[tuple[int, bool]] = []  # (indent, documented) of the enclosing keys
    undocumented = []
    for i, line in enumerate(lines):
        match = re.match(r"^(\s*)([A-Za-z][\w.-]*):\s*(\S.*)?$", line)
        if not match:
            continue
        indent = len(match.group(1))
        while stack and stack[-1][0] >= indent:
            stack.pop()
        comments = []
        for prev in reversed(lines[:i]):
            if not prev.strip().startswith("#"):
                break
            comments.append(prev.strip())
        documented = any(c.startswith("# --") for c in comments)
        leaf = match.group(3) is not None or not _has_children(lines, i)
        if leaf and not (documented or any(doc for _, doc in stack)):
            undocumented.append(line.strip())
        stack.append((indent, documented))
    assert not undocumented, undocumented


def _has_children(lines: list[str], i: int) -> bool:
    indent = len(lines[i]) - len(lines[i].lstrip())
    for nxt in lines[i + 1:]:
        if nxt.strip() and not nxt.strip().startswith("#"):
            return len(nxt) - len(nxt.lstrip()) > indent
    return False


def test_helm_install_and_kubectl_show_the_job(cluster, kube, ns, operator):
    """The user's path: the chart installed the CRD (kubectl knows `rtj`), `kubectl apply` of an
    example, `kubectl wait` for the Running condition, printer columns, `kubectl describe`."""
    from conftest import kubectl

    releases = helm("list", "-A", "-o", "json", "--kubeconfig", str(cluster.kubeconfig))
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


def test_the_operator_needs_no_permission_beyond_the_chart(cluster, kube, ns, operator, lost_nodes):
    """Every test's operator authenticates as the chart's ServiceAccount. Here a full scenario
    (create, node loss with eviction and forced failure, invalid edit, suspend, delete) runs, then
    the API server's audit log must show no request of that ServiceAccount denied (403)."""
    from conftest import RELEASE, RELEASE_NS, Job

    rtj = Job(kube, ns)
    rtj.create(storage={"storageClassName": "fsx-sc", "retention": "Delete"},
               restartBudget={"nodeLossGraceSeconds": 1, "terminatingTimeoutSeconds": 1})
    rtj.wait_running()
    lost_nodes(rtj.running_pods()[0]["spec"]["nodeName"])
    wait_until(lambda: rtj.status().get("disruptions") == 1, timeout=60, what="disruption")
    wait_until(lambda: "ForceDeletedPod" in rtj.reasons(), timeout=60, what="forced failure")
    rtj.patch({"nodes": {"count": 3, "max": 2}})
    wait_until(lambda: rtj.condition("InvalidSpec").get("status") == "True", what="InvalidSpec")
    rtj.patch({"nodes": {"count": 2, "max": None}, "suspend": True})
    rtj.wait_phase("Suspended", timeout=60)
    kube.delete(api.KIND, "train", ns)
    wait_until(lambda: kube.get(api.KIND, "train", ns) is None, what="RTJ deleted")

    user = f"system:serviceaccount:{RELEASE_NS}:{RELEASE}"
    entries = [e for e in cluster.audit_events() if e.get("user", {}).get("username") == user]
    denied = sorted({(e["verb"], e.get("objectRef", {}).get("resource"), e.get("objectRef", {}).get("subresource"))
                     for e in entries if e.get("responseStatus", {}).get("code") == 403})
    assert not denied, f"requests the chart's RBAC denies: {denied}"
    done = {(e["verb"], e.get("objectRef", {}).get("resource"), e.get("objectRef", {}).get("subresource"))
            for e in entries if e.get("stage") == "ResponseComplete"}
    # Issue 8.i: pods and Jobs reach the operator filtered by the API server, not by the operator.
    reads = [e for e in entries if e["verb"] in ("list", "watch") and e.get("objectRef", {}).get("resource")
             in ("pods", "jobs")]
    assert reads and all("labelSelector=" in e["requestURI"]
                         for e in reads), sorted({e["requestURI"] for e in reads})
    for call in [("create", "jobs", None), ("patch", "resilienttrainingjobs", "status"), ("create", "pods", "eviction"),
                 ("patch", "pods", "status"), ("delete", "pods", None), ("create", "events", None),
                 ("watch", "nodes", None), ("watch", "pods", None), ("create", "services", None)]:
        assert call in done, (call, sorted(done))


def test_worker_pods_get_an_identity_without_api_permissions():
    """Issue 9.5: a worker that may patch pods could forge another job's progress or labels."""
    docs = render(*VALUE_SETS["everything"])
    account = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "rtj-worker")
    assert account["automountServiceAccountToken"] is False
    grants = [d for d in docs if d["kind"] in ("Role", "RoleBinding") and d["metadata"]["name"] == "rtj-worker"]
    assert grants == []
