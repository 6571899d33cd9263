"""API Priority and Fairness with its filter on (issue 29.8), on a control plane of this module's own: the
shared one runs with the filter off (benchmarks send thousands of requests from few clients), and here
the server's concurrency is small (90 seats), so that a priority level of one seat exists.

- The chart's FlowSchemas classify the operator's requests (as its ServiceAccount) into workload-high and
  its Lease calls into leader-election, while a worker pod's ServiceAccount stays in workload-low: what
  the API server says it chose, in the headers it adds to every response.
- A throttled operator: its requests moved (by the chart's own value) to a level of one seat that rejects,
  the seat held by a neighbour. The server answers 429 with Retry-After; the operator's client waits that
  long and sends again, at most TOO_BUSY_RETRIES times, counted in the API server's audit log: answered
  once the neighbour lets go, or failing with the 429 and its Retry-After (the pass's back-off honours it)
  if it does not. The server's Retry-After grows while the level keeps dropping requests: each wait is
  the one its answer asked for. Before, urllib3's own retries resent each GET three more times inside each of those.
"""

from __future__ import annotations

import contextlib
import http.client
import ssl
import threading
import time
from collections.abc import Iterator

import kubernetes
import pytest

from clusterkit import helm
from rtj_dev.localcluster import LocalCluster
from rtj_operator.kube import TOO_BUSY_MAX_WAIT, TOO_BUSY_RETRIES, Kube, KubeError, configure
from testkit import RELEASE, RELEASE_NS, ROOT, wait_until

FLOW = "/apis/flowcontrol.apiserver.k8s.io/v1"
CHART = str(ROOT / "charts" / "rtj-operator")
TIGHT = "rtj-test-one-seat"
NEIGHBOUR_NS = "neighbour"


@pytest.fixture(scope="module")
def apf() -> Iterator[LocalCluster]:
    local = LocalCluster(nodes=0, priority_and_fairness=True, max_requests_inflight=(60, 30)).start()
    try:
        helm(local, "install", RELEASE, CHART, "-n", RELEASE_NS, "--create-namespace", "--wait", "--timeout", "60s",
             "--set", "replicaCount=0")
        yield local
    finally:
        local.stop()


def get(cluster: LocalCluster, token: str, path: str) -> tuple[int, http.client.HTTPMessage]:
    """A GET with `token`, sent as is (no retry): its status and headers."""
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    conn = http.client.HTTPSConnection("127.0.0.1", cluster.api_port, context=context, timeout=30)
    try:
        conn.request("GET", path, headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
        response = conn.getresponse()
        response.read()
        return response.status, response.headers
    finally:
        conn.close()


def classified(cluster: LocalCluster, token: str, path: str) -> tuple[str, str]:
    """The FlowSchema and priority level APF chose for a GET with `token` (by name; it sends their uids)."""
    _, headers = get(cluster, token, path)
    names = {item["metadata"]["uid"]: item["metadata"]["name"]
             for kind in ("flowschemas", "prioritylevelconfigurations")
             for item in cluster.api("GET", f"{FLOW}/{kind}")["items"]}
    schema, level = (headers.get(f"X-Kubernetes-PF-{what}-UID") or "" for what in ("FlowSchema", "PriorityLevel"))
    return names.get(schema, schema), names.get(level, level)


def test_the_charts_flowschemas_classify_the_operators_requests_apart_from_the_workers(apf):
    operator = apf.service_account_token(RELEASE_NS, RELEASE)
    apf.api("POST", "/api/v1/namespaces", {"metadata": {"name": "workers"}})
    apf.api("POST", "/api/v1/namespaces/workers/serviceaccounts", {"metadata": {"name": "default-worker"}})
    worker = apf.service_account_token("workers", "default-worker")
    assert classified(apf, operator, "/api/v1/pods?limit=1") == (f"{RELEASE}-workload", "workload-high")
    lease = f"/apis/coordination.k8s.io/v1/namespaces/{RELEASE_NS}/leases/{RELEASE}"
    assert classified(apf, operator, lease) == (f"{RELEASE}-leader-election", "leader-election")
    assert classified(apf, worker, "/api/v1/namespaces/workers/pods") == ("service-accounts", "workload-low")


def test_a_throttled_operator_waits_for_retry_after_and_every_call_is_answered(apf):
    # A level of one seat (nominal share 1 of the server's 90) that rejects instead of queueing, and the
    # operator's requests moved to it through the chart's value; a neighbour's ServiceAccount shares it.
    apf.api("POST", f"{FLOW}/prioritylevelconfigurations", {
        "metadata": {"name": TIGHT}, "spec": {"type": "Limited", "limited": {
            "nominalConcurrencyShares": 1, "lendablePercent": 0, "borrowingLimitPercent": 0,
            "limitResponse": {"type": "Reject"}}}})
    helm(apf, "upgrade", RELEASE, CHART, "-n", RELEASE_NS, "--reuse-values", "--set",
         f"apiPriority.workload.priorityLevel={TIGHT}")
    apf.api("POST", "/api/v1/namespaces", {"metadata": {"name": NEIGHBOUR_NS}})
    apf.api("POST", f"/api/v1/namespaces/{NEIGHBOUR_NS}/serviceaccounts", {"metadata": {"name": "busy"}})
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NEIGHBOUR_NS}"
    apf.api("POST", f"{rbac}/roles", {"metadata": {"name": "list-configmaps"}, "rules": [
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["list"]}]})
    apf.api("POST", f"{rbac}/rolebindings", {
        "metadata": {"name": "busy"}, "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                                  "name": "list-configmaps"},
        "subjects": [{"kind": "ServiceAccount", "name": "busy", "namespace": NEIGHBOUR_NS}]})
    apf.api("POST", f"{FLOW}/flowschemas", {
        "metadata": {"name": "busy-neighbour"}, "spec": {
            "matchingPrecedence": 900, "priorityLevelConfiguration": {"name": TIGHT},
            "distinguisherMethod": {"type": "ByUser"},
            "rules": [{"subjects": [{"kind": "ServiceAccount", "serviceAccount": {
                "name": "busy", "namespace": NEIGHBOUR_NS}}],
                "resourceRules": [{"verbs": ["list"], "apiGroups": [""], "resources": ["configmaps"],
                                   "namespaces": ["*"]}]}]}})
    # A LIST answer far larger than loopback's socket buffers (24 x 700 KB): a neighbour that does not read
    # it keeps its request in the handler, and so holds the level's one seat, for as long as it likes.
    for i in range(24):
        apf.api("POST", f"/api/v1/namespaces/{NEIGHBOUR_NS}/configmaps",
                {"metadata": {"name": f"c{i}"}, "data": {"v": "x" * 700_000}})
    operator = apf.service_account_token(RELEASE_NS, RELEASE)
    busy = apf.service_account_token(NEIGHBOUR_NS, "busy")
    assert classified(apf, operator, "/api/v1/pods?limit=1")[1] == TIGHT

    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        time.sleep(seconds)

    kube = Kube(configure(apf.server, token=operator, ca_file=str(apf.ca_file)), sleep=sleep)
    path = f"/api/v1/namespaces/{NEIGHBOUR_NS}/pods"
    # What each refusal asked for: APF's Retry-After grows while a level keeps dropping requests
    # (1 s, then 2 s, ...), so each wait is checked against the answer before it.
    asked_for: list[float] = []
    call_api = kube._client.call_api

    def recording(*args, **kwargs):
        try:
            return call_api(*args, **kwargs)
        except kubernetes.client.exceptions.ApiException as exc:
            asked_for.append(float((exc.headers or {}).get("Retry-After", "nan")))
            raise

    kube._client.call_api = recording

    def sends() -> int:
        """The operator's LISTs of `path` the API server answered, from its audit log."""
        return sum(1 for e in apf.audit_events() if e.get("stage") == "ResponseComplete"
                   and e.get("user", {}).get("username") == f"system:serviceaccount:{RELEASE_NS}:{RELEASE}"
                   and e["requestURI"].split("?")[0] == path and e["verb"] == "list")

    def sent_since(before: int, expected: int) -> int:
        """sends() - before once at least `expected` (or 10 s passed): the server writes a request's
        ResponseComplete event after its client has the answer, so the last one may not be in the log yet."""
        try:
            wait_until(lambda: sends() - before >= expected, timeout=10, what=f"{expected} sends in the audit log",
                       interval=0.1)
        except AssertionError:
            pass
        return sends() - before

    # The seat held for longer than the client's retries last: the call fails with the 429 and its
    # Retry-After (the pass's back-off then waits at least that), after 1 + TOO_BUSY_RETRIES sends.
    with holding_the_seat(apf, busy, seconds=8.0):
        before = sends()
        status, headers = get(apf, operator, path)  # one send
        assert status == 429 and (headers.get("Retry-After") or "").isdigit(), (status, dict(headers))
        with pytest.raises(KubeError) as refused:
            kube.list("Pod", NEIGHBOUR_NS)
        assert len(asked_for) == 1 + TOO_BUSY_RETRIES, asked_for
        assert (refused.value.status, refused.value.retry_after) == (429, asked_for[-1])
        assert waits == asked_for[:-1] and all(1 <= w <= TOO_BUSY_MAX_WAIT for w in waits), (waits, asked_for)
        assert sent_since(before, 2 + TOO_BUSY_RETRIES) == 2 + TOO_BUSY_RETRIES
    # Held for 1.5 s: answered, after waiting as the server asked, each wait one more send.
    waits.clear()
    asked_for.clear()
    with holding_the_seat(apf, busy, seconds=1.5):
        before = sends()
        started = time.monotonic()
        try:
            listed = kube.list("Pod", NEIGHBOUR_NS)
        except KubeError as exc:
            raise AssertionError(f"not answered within {TOO_BUSY_RETRIES} waits ({waits}) of a 1.5 s hold, "
                                 f"{time.monotonic() - started:.1f} s: {exc}") from exc
        assert listed == []
    assert waits and waits == asked_for and len(waits) < TOO_BUSY_RETRIES, (waits, asked_for)
    assert sent_since(before, len(waits) + 1) == len(waits) + 1


@contextlib.contextmanager
def holding_the_seat(cluster: LocalCluster, token: str, seconds: float) -> Iterator[None]:
    """A neighbour's LIST of the big configmaps whose answer it does not read for `seconds`: its handler
    stays in the server, writing, and holds the one seat of the level it is in until the connection closes.
    The seat is taken once free: a previous holder's handler leaves it only once the server has seen its
    connection closed (CI once saw the next hold answered 429 a moment after the last one ended)."""
    context = ssl.create_default_context(cafile=str(cluster.ca_file))
    deadline = time.monotonic() + 15
    while True:
        held = http.client.HTTPSConnection("127.0.0.1", cluster.api_port, context=context, timeout=30)
        held.request("GET", f"/api/v1/namespaces/{NEIGHBOUR_NS}/configmaps",
                     headers={"Authorization": f"Bearer {token}", "Accept": "application/json"})
        status = held.getresponse().status
        if status != 429 or time.monotonic() > deadline:
            break
        held.close()
        time.sleep(0.2)
    releaser = threading.Timer(seconds, held.close)
    try:
        assert status == 200  # its handler runs
        releaser.start()
        yield
    finally:
        releaser.cancel()
        held.close()
