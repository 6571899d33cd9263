"""The metrics endpoint's guard (metrics_server.py): each scrape's token reviewed by a stand-in API server
here; the real API server's TokenReview and SubjectAccessReview, with the chart's RBAC, are
tests/cluster/test_metrics_auth.py's."""

from __future__ import annotations

import http.client
import os
import socket
import ssl
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Gauge

from rtj_operator import metrics_server
from rtj_operator.kube import KubeError
from testkit import Clock, free_port

READER, OUTSIDER = "reader-token", "outsider-token"


class FakeApiServer:
    """Answers the two reviews: READER is allowed, OUTSIDER is authenticated but not granted, anything else
    is no token the server knows. `down` makes every call fail as an unreachable server would."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.down = False

    def create(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        self.calls.append((obj["kind"], obj["spec"]))
        if self.down:
            raise KubeError(503, "the server is currently unable to handle the request", "create", obj["kind"])
        if obj["kind"] == "TokenReview":
            users = {READER: "system:serviceaccount:monitoring:prometheus", OUTSIDER: "system:serviceaccount:x:y"}
            name = users.get(obj["spec"]["token"])
            if not name:
                return {**obj, "status": {"authenticated": False, "error": "invalid bearer token"}}
            return {**obj, "status": {"authenticated": True, "user": {
                "username": name, "uid": "u-1", "groups": ["system:serviceaccounts", "system:authenticated"],
                "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]}}}}
        allowed = obj["spec"]["user"].endswith(":prometheus") and obj["spec"]["nonResourceAttributes"] == {
            "path": "/metrics", "verb": "get"}
        return {**obj, "status": {"allowed": allowed, **({"reason": "RBAC: allowed by ClusterRoleBinding"}
                                                         if allowed else {})}}

    def kinds(self) -> list[str]:
        return [kind for kind, _ in self.calls]


@pytest.fixture
def served():
    api, clock = FakeApiServer(), Clock()
    registry = CollectorRegistry()
    Gauge("rtj_leader", "1 while this replica leads.", registry=registry).set(1)
    port = free_port()
    server, thread = metrics_server.serve(port, metrics_server.Reviewer(api, clock=clock),  # type: ignore[arg-type]
                                          metrics_server.Certificates(), addr="127.0.0.1", registry=registry)
    yield port, api, clock
    server.shutdown()
    thread.join(5)


def scrape(port: int, token: str | None = None, path: str = "/metrics",
           headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], str]:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=ssl._create_unverified_context())
    conn.request("GET", path, headers={**({"Authorization": f"Bearer {token}"} if token is not None else {}),
                                       **(headers or {})})
    answer = conn.getresponse()
    out = answer.status, {k.lower(): v for k, v in answer.getheaders()}, answer.read().decode()
    conn.close()
    return out


@pytest.mark.parametrize("token, status, body", [
    (READER, 200, "rtj_leader 1.0"),
    (OUTSIDER, 403, "get /metrics not granted"),
    ("forged", 401, "invalid bearer token"),
    (None, 401, "no bearer token"),
    ("", 401, "no bearer token"),
])
def test_a_scrape_is_answered_by_what_the_api_server_says_of_its_token(served, token, status, body):
    port, api, _ = served
    code, headers, text = scrape(port, token)
    assert (code, body in text) == (status, True), (code, text)
    assert ("www-authenticate" in headers) == (status == 401)
    assert "rtj_leader" not in text or status == 200
    asks = {READER: ["TokenReview", "SubjectAccessReview"], OUTSIDER: ["TokenReview", "SubjectAccessReview"],
            "forged": ["TokenReview"]}.get(token or "", [])
    assert api.kinds() == asks


def test_the_access_review_asks_for_get_on_metrics_as_the_reviewed_user(served):
    port, api, _ = served
    scrape(port, READER)
    [(_, spec)] = [c for c in api.calls if c[0] == "SubjectAccessReview"]
    assert spec == {"user": "system:serviceaccount:monitoring:prometheus", "uid": "u-1",
                    "groups": ["system:serviceaccounts", "system:authenticated"],
                    "extra": {"authentication.kubernetes.io/pod-name": ["prometheus-0"]},
                    "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}


def test_decisions_are_kept_per_token_a_refusal_briefly_and_a_failed_review_never(served):
    port, api, clock = served
    for _ in range(3):
        assert scrape(port, READER)[0] == 200
    assert api.kinds().count("TokenReview") == 1  # one review per ALLOW_TTL, not per scrape
    clock.now += metrics_server.ALLOW_TTL + 1
    assert scrape(port, READER)[0] == 200 and api.kinds().count("TokenReview") == 2

    api.calls.clear()
    assert scrape(port, OUTSIDER)[0] == 403 and scrape(port, OUTSIDER)[0] == 403
    assert api.kinds().count("TokenReview") == 1
    clock.now += metrics_server.DENY_TTL + 1  # a binding made since then takes effect now
    scrape(port, OUTSIDER)
    assert api.kinds().count("TokenReview") == 2

    api.calls.clear()
    api.down = True
    code, _, text = scrape(port, "another-token")
    assert code == 503 and "did not answer" in text
    api.down = False
    assert scrape(port, "another-token")[0] == 401 and api.kinds() == ["TokenReview", "TokenReview"]


def test_the_cache_is_bounded():
    api, clock = FakeApiServer(), Clock()
    reviewer = metrics_server.Reviewer(api, clock=clock, max_cached=3)  # type: ignore[arg-type]
    for i in range(10):
        reviewer.review(f"t{i}")
    assert len(reviewer._cache) == 3


def test_only_the_metrics_path_is_served_and_openmetrics_is_negotiated(served):
    port, _, _ = served
    assert scrape(port, READER, path="/")[0] == 404
    assert scrape(port, READER, path="/metrics?name[]=rtj_leader")[0] == 200
    code, headers, text = scrape(port, READER, headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    assert code == 200 and headers["content-type"].startswith("application/openmetrics-text") and "# EOF" in text


def test_plain_http_gets_no_answer_and_the_server_keeps_serving(served):
    port, _, _ = served
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b"rtj_leader" not in sock.recv(4096)
    with socket.create_connection(("127.0.0.1", port), timeout=10):
        pass  # a port probe that never starts a handshake
    assert scrape(port, READER)[0] == 200


def _peer_certificate(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
            ssl._create_unverified_context().wrap_socket(raw) as tls:
        return tls.getpeercert(binary_form=True) or b""


def test_a_certificate_from_its_folder_is_verified_and_a_renewal_serves_the_next_scrape(tmp_path):
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    def write(name: str) -> bytes:
        cert, key = metrics_server.self_signed(hosts=("127.0.0.1", "rtj-operator-metrics.rtj-system.svc"))
        (tmp_path / "tls.crt").write_bytes(cert)
        (tmp_path / "tls.key").write_bytes(key)
        (tmp_path / f"{name}.crt").write_bytes(cert)
        return cert

    first = write("first")
    port = free_port()
    server, thread = metrics_server.serve(port, metrics_server.Reviewer(FakeApiServer()),  # type: ignore[arg-type]
                                          metrics_server.Certificates(str(tmp_path)), addr="127.0.0.1")
    try:
        verified = ssl.create_default_context(cafile=str(tmp_path / "first.crt"))  # checks the name (an IP SAN)
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=verified)
        conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {READER}"})
        assert conn.getresponse().status == 200
        conn.close()
        def der(pem: bytes) -> bytes:
            return x509.load_pem_x509_certificate(pem).public_bytes(serialization.Encoding.DER)
        assert _peer_certificate(port) == der(first)

        second = write("second")
        stamp = os.stat(tmp_path / "tls.crt").st_mtime + 5  # a renewal, as the kubelet's atomic swap shows it
        os.utime(tmp_path / "tls.crt", (stamp, stamp))
        assert _peer_certificate(port) == der(second)

        (tmp_path / "tls.key").write_bytes(b"half-written")  # mid-rotation: the previous pair keeps serving
        os.utime(tmp_path / "tls.key", (stamp + 5, stamp + 5))
        assert _peer_certificate(port) == der(second)
    finally:
        server.shutdown()
        thread.join(5)


def test_a_missing_certificate_fails_the_start(tmp_path):
    with pytest.raises(OSError):
        metrics_server.Certificates(str(tmp_path))
