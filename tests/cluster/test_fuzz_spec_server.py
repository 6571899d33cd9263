"""The fuzz generator (tests/specgen.py) against a real API server: accepted specs' children pass
`kubectl create --dry-run=server` on the local control plane, and the CRD agrees with schema_errors.
The property without a cluster: tests/unit/test_fuzz_spec.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from pod_examples import FULL_POD

from rtj_operator.spec import RTJ, schema_errors, semantic_errors
from specgen import bodies, children_for_spec, issue_example, pod_bodies, with_issue_examples
from testkit import ROOT


def kubectl() -> str:
    found = os.environ.get("RTJ_KUBECTL") or shutil.which("kubectl") or str(ROOT / ".tools" / "bin" / "kubectl")
    if not os.path.exists(found):
        pytest.skip("no kubectl (set RTJ_KUBECTL)")
    return found


def dry_run(kubeconfig: str, verb: str, manifest: dict[str, Any]) -> subprocess.CompletedProcess:
    return subprocess.run([kubectl(), "--kubeconfig", kubeconfig, verb, "--dry-run=server",
                           "-o", "name", "-f", "-"], input=json.dumps(manifest), capture_output=True, text=True,
                          timeout=60)


@pytest.mark.cluster
def test_children_pass_server_side_dry_run(cluster, ns):
    """Accepted specs: every child passes `kubectl create --dry-run=server` on the local control plane
    (the real kube-apiserver, with the chart's CRD). And the CRD agrees with schema_errors: the server
    accepts the RTJ whenever spec.py does, and rejects it when the schema does."""
    namespace, kubeconfig = ns, str(cluster.kubeconfig)

    @settings(max_examples=int(os.environ.get("RTJ_FUZZ_EXAMPLES", "15")), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @with_issue_examples
    @given(bodies)
    def run(body: dict[str, Any]) -> None:
        server_agrees(kubeconfig, namespace, body)

    run()

    @settings(max_examples=int(os.environ.get("RTJ_FUZZ_POD_EXAMPLES", "10")), deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @example(issue_example(pod=FULL_POD))
    @given(pod_bodies)
    def run_pods(body: dict[str, Any]) -> None:
        server_agrees(kubeconfig, namespace, body)

    run_pods()


def referenced(kubeconfig: str, namespace: str, spec: dict[str, Any]) -> None:
    """The objects a spec names and the pod admission plugins look up (Priority, ServiceAccount): a pod
    naming one that does not exist is refused, a Job's template is not. That case is the operator's
    to report (tests/cluster/test_operator.py); here the children themselves are on trial."""
    names = {"PriorityClass": spec.get("priorityClassName"), "ServiceAccount": spec.get("serviceAccountName")}
    for kind, name in names.items():
        if isinstance(name, str) and name:
            obj = ({"apiVersion": "scheduling.k8s.io/v1", "kind": kind, "metadata": {"name": name}, "value": 1000}
                   if kind == "PriorityClass" else
                   {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": namespace}})
            subprocess.run([kubectl(), "--kubeconfig", kubeconfig, "apply", "-f", "-"], input=json.dumps(obj),
                           capture_output=True, text=True, timeout=60, check=True)


def server_agrees(kubeconfig: str, namespace: str, body: dict[str, Any]) -> None:
    body["metadata"] = {"name": body["metadata"]["name"], "namespace": namespace}
    rtj = dry_run(kubeconfig, "apply", body)
    if schema_errors(body):
        assert rtj.returncode != 0, f"the API server accepted what schema_errors rejects: {body}"
        return
    if semantic_errors(RTJ.from_body(body)):
        return  # the operator reports InvalidSpec; the CRD may or may not have caught it
    assert rtj.returncode == 0, rtj.stderr
    referenced(kubeconfig, namespace, body["spec"])
    for manifest in children_for_spec(body):
        result = dry_run(kubeconfig, "create", manifest)
        assert result.returncode == 0, (manifest["kind"], result.stderr, json.dumps(body["spec"]))
