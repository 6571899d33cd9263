"""Issue 16.1 on the real API server: a worker pod publishes its progress as an `rtj.dev/` condition on
its own status with its bound ServiceAccount token, and the chart's ValidatingAdmissionPolicy (installed
by the session's helm install) keeps that token to exactly that: not another pod, not another condition,
not another field, not an oversized message, not a token bound to no pod. The chart's rtj-worker
ServiceAccount, Role and RoleBinding are rendered for the test's namespace and applied as they are."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from clusterkit import worker_rbac
from rtj_worker.report import CONDITION, ApiSink
from testkit import wait_until


def worker_pod(cluster, ns: str, name: str) -> dict[str, Any]:
    # Never scheduled (no node has the label): no kubelet writes its status, the scheduler's
    # PodScheduled=False condition is the foreign one that must survive the worker's writes.
    return cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", {
        "metadata": {"name": name, "labels": {"app": "w"}},
        "spec": {"serviceAccountName": "rtj-worker", "nodeSelector": {"rtj.dev/test": "nowhere"},
                 "containers": [{"name": "worker", "image": "rtj-worker:test"}]}})


def bound_token(cluster, ns: str, pod: dict[str, Any] | None) -> str:
    spec: dict[str, Any] = {"expirationSeconds": 3600}
    if pod is not None:
        spec["boundObjectRef"] = {"kind": "Pod", "apiVersion": "v1", "name": pod["metadata"]["name"],
                                  "uid": pod["metadata"]["uid"]}
    review = cluster.api("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/rtj-worker/token",
                         {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec})
    return review["status"]["token"]


def patch_status(cluster, ns: str, pod: str, token: str, body: dict[str, Any], subresource: str = "/status") -> str:
    """'' if accepted, else the API server's refusal."""
    try:
        cluster.api("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod}{subresource}", body, token=token,
                    content_type="application/strategic-merge-patch+json")
    except RuntimeError as exc:
        return str(exc)
    return ""


def report(message: str = '{"v":1,"step":10}', type_: str = CONDITION) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": type_, "status": "True", "reason": "Training", "message": message}]}}


@pytest.fixture
def pods(cluster, ns):
    worker_rbac(cluster, ns)
    mine, other = worker_pod(cluster, ns, "mine"), worker_pod(cluster, ns, "other")
    token = bound_token(cluster, ns, mine)
    # The policy is enforced once the API server's policy informer has it; the RBAC once its cache has the binding.
    wait_until(lambda: "Forbidden" in patch_status(cluster, ns, "other", token, report()) or None, timeout=30,
               what="the worker-reports policy to be enforced", interval=0.5)
    # The scheduler's verdict on the pod (PodScheduled) lands once: before a test compares the pod's
    # conditions across a refused write, not between its two reads (seen once in CI).
    wait_until(lambda: "PodScheduled" in conditions(cluster, ns, "mine"), timeout=30,
               what="the scheduler's PodScheduled condition on the pod")
    return mine, other, token


def conditions(cluster, ns: str, name: str) -> dict[str, dict[str, Any]]:
    pod = cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    return {c["type"]: c for c in pod["status"].get("conditions") or []}


def test_a_worker_publishes_on_its_own_pod_with_the_real_client(cluster, ns, pods, tmp_path: Path):
    _, _, token = pods
    (tmp_path / "token").write_text(token)
    (tmp_path / "ca.crt").write_bytes(Path(cluster.ca_file).read_bytes())
    host, port = cluster.server.removeprefix("https://").rsplit(":", 1)
    sink = ApiSink.from_env({"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}, tmp_path)
    assert sink is not None and (sink.namespace, sink.pod) == (ns, "mine")  # from the token's own claims
    for step in (10, 20):
        sink.write({"type": CONDITION, "status": "True", "reason": "Training",
                    "message": json.dumps({"v": 1, "step": step}), "lastTransitionTime": "2026-12-03T10:00:00Z"})
    found = conditions(cluster, ns, "mine")
    assert json.loads(found[CONDITION]["message"])["step"] == 20
    assert found["PodScheduled"]["status"] == "False"  # the scheduler's condition is kept
    assert sink.bytes_sent < 2 * 400
    # Accepted at all proves every expression of the policy compiles against the pod schema: the policy
    # fails closed, so one that did not would refuse this write too.


@pytest.mark.parametrize("what, pod, body, refused", [
    ("another pod", "other", report(), "only the pod it is bound to"),
    ("a condition that is not rtj.dev/", "mine", report(type_="Ready"), "only conditions of type rtj.dev/"),
    ("the scheduler's condition", "mine", report(type_="PodScheduled"), "only conditions of type rtj.dev/"),
    ("status.phase", "mine", {"status": {"phase": "Succeeded"}}, "status.phase"),
    ("status.message", "mine", {"status": {"message": "forged"}}, "status.message"),
    ("labels through the status", "mine", {"metadata": {"labels": {"app": "forged"}}}, "metadata.labels"),
    ("annotations through the status", "mine", {"metadata": {"annotations": {"a": "b"}}}, "metadata.annotations"),
    # A finalizer would hold the pod Terminating for ever: a gang restart's Foreground delete with it.
    ("a finalizer through the status", "mine", {"metadata": {"finalizers": ["x.dev/hold"]}}, "metadata.finalizers"),
    ("status.resize", "mine", {"status": {"resize": "Proposed"}}, "status.resize"),
    ("an oversized report", "mine", report("x" * 5000), "at most 4096 characters"),
    ("too many conditions", "mine", {"status": {"conditions": [
        {"type": f"rtj.dev/C{i}", "status": "True"} for i in range(5)]}}, "at most 4"),
])
def test_the_token_cannot_reach_beyond_its_own_report(cluster, ns, pods, what, pod, body, refused):
    _, _, token = pods
    before = conditions(cluster, ns, pod)
    answer = patch_status(cluster, ns, pod, token, body)
    assert refused in answer, (what, answer)
    assert conditions(cluster, ns, pod) == before


def test_the_pod_itself_and_unbound_tokens_are_refused(cluster, ns, pods):
    _, _, token = pods
    # RBAC: pods/status only, never the pod object (its labels select the job's pods).
    assert "HTTP 403" in patch_status(cluster, ns, "mine", token, {"metadata": {"labels": {"app": "x"}}},
                                      subresource="")
    # A token of the same ServiceAccount bound to no pod has no pod claims: it may write no report.
    assert "only the pod it is bound to" in patch_status(cluster, ns, "mine", bound_token(cluster, ns, None),
                                                         report())
    # The token of a deleted pod cannot write to its successor of the same name: the API server rejects
    # the token once it sees the pod gone (401), and until then the policy compares the uid.
    cluster.api("DELETE", f"/api/v1/namespaces/{ns}/pods/mine?gracePeriodSeconds=0")
    wait_until(lambda: cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/mine", missing_ok=True) is None,
               what="the pod to be gone")
    worker_pod(cluster, ns, "mine")  # same name, new uid
    answer = patch_status(cluster, ns, "mine", token, report())
    assert "HTTP 401" in answer or "only the pod it is bound to" in answer, answer
