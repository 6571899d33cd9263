"""The metrics endpoint: prometheus-client's exposition over HTTPS, each scrape authenticated and
authorized by the API server, as controller-runtime's metrics filter
(`filters.WithAuthenticationAndAuthorization`) and kube-rbac-proxy serve theirs.

- **Authentication:** the scraper's bearer token (a Prometheus pod's ServiceAccount token) goes to a
  TokenReview. No token, or one the API server does not accept: 401.
- **Authorization:** the user the review names goes to a SubjectAccessReview for `get` on the
  non-resource URL `/metrics`; the chart's ClusterRole `<release>-metrics-reader` grants exactly that.
  Not allowed: 403.
- **Cache:** a decision is kept for `ALLOW_TTL` (allowed) or `DENY_TTL` (refused) seconds per token
  (its SHA-256), so a scrape every 30 s costs the API server two reviews a minute per scraper, and a
  binding added after a refusal takes effect within `DENY_TTL`. A review the API server did not answer
  (down, throttled) is 503 and never cached.
- **Certificate:** `tls.crt`/`tls.key` from a folder (a mounted kubernetes.io/tls Secret, e.g.
  cert-manager's), read again when either file changes (a renewal needs no restart); without one, a
  self-signed certificate made at start, which scrapers do not verify (`insecureSkipVerify`, as Kueue's
  and kubebuilder's ServiceMonitors do): the token, not the certificate, is the guard.

`--no-metrics-secure` serves plain HTTP with prometheus-client's own server (the chart's
`metrics.secure=false`): anyone who reaches the port reads every job's series.
"""

from __future__ import annotations

import datetime
import hashlib
import ipaddress
import logging
import os
import ssl
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from prometheus_client import REGISTRY
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from .kube import Kube, KubeError

log = logging.getLogger(__name__)

PATH = "/metrics"
ALLOW_TTL = 60.0
DENY_TTL = 10.0
MAX_CACHED = 1024  # tokens; the oldest decisions go first beyond it


@dataclass(frozen=True)
class Decision:
    """The HTTP status a scrape gets (200, 401, 403, 503), who it was and why (logged, and sent on a refusal)."""

    status: int
    user: str = ""
    reason: str = ""


class Reviewer:
    """TokenReview then SubjectAccessReview, through the operator's own client (its chart grants `create` on
    both), with the decisions cached per token."""

    def __init__(self, kube: Kube, clock: Callable[[], float] = time.monotonic,
                 allow_ttl: float = ALLOW_TTL, deny_ttl: float = DENY_TTL, max_cached: int = MAX_CACHED):
        self._kube, self._clock = kube, clock
        self._allow_ttl, self._deny_ttl, self._max = allow_ttl, deny_ttl, max_cached
        self._cache: dict[str, tuple[float, Decision]] = {}
        self._lock = threading.Lock()

    def review(self, token: str) -> Decision:
        if not token:
            return Decision(401, reason="no bearer token")
        key = hashlib.sha256(token.encode()).hexdigest()
        now = self._clock()
        with self._lock:
            hit = self._cache.get(key)
            if hit and hit[0] > now:
                return hit[1]
        try:
            decision = self._ask(token)
        except (KubeError, OSError) as exc:  # not the scraper's fault, and not a decision to keep
            log.warning("metrics: a review failed: %s", exc)
            return Decision(503, reason="the API server did not answer the review")
        ttl = self._allow_ttl if decision.status == 200 else self._deny_ttl
        with self._lock:
            self._cache[key] = (now + ttl, decision)
            while len(self._cache) > self._max:
                self._cache.pop(next(iter(self._cache)))
        return decision

    def _ask(self, token: str) -> Decision:
        review = self._kube.create({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                                    "metadata": {}, "spec": {"token": token}})
        status = review.get("status") or {}
        if not status.get("authenticated"):
            return Decision(401, reason=status.get("error") or "token not authenticated")
        user = status.get("user") or {}
        name = user.get("username", "")
        spec: dict[str, Any] = {"user": name, "groups": user.get("groups") or [],
                                "nonResourceAttributes": {"path": PATH, "verb": "get"}}
        if user.get("uid"):
            spec["uid"] = user["uid"]
        if user.get("extra"):
            spec["extra"] = user["extra"]
        access = self._kube.create({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
                                    "metadata": {}, "spec": spec})
        allowed = (access.get("status") or {}).get("allowed") is True
        reason = (access.get("status") or {}).get("reason") or ("" if allowed else f"get {PATH} not granted")
        return Decision(200 if allowed else 403, name, reason)


def self_signed(hosts: tuple[str, ...] = ("localhost", "127.0.0.1"), days: int = 365) -> tuple[bytes, bytes]:
    """A P-256 key and a certificate for `hosts` (DNS names or IPs), PEM: (certificate, key)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "rtj-operator-metrics")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .sign(key, hashes.SHA256()))
    return (cert.public_bytes(serialization.Encoding.PEM),
            key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                              serialization.NoEncryption()))


class Certificates:
    """The server's TLS context: from `cert_dir` (tls.crt, tls.key; rebuilt when either file changes), or a
    self-signed certificate made once."""

    def __init__(self, cert_dir: str | None = None):
        self._dir = Path(cert_dir) if cert_dir else None
        self._stamp: tuple[float, float] | None = None
        self._context: ssl.SSLContext | None = None
        self._lock = threading.Lock()
        if self._dir is None:
            cert, key = self_signed()
            with tempfile.TemporaryDirectory() as tmp:  # load_cert_chain reads files only
                (Path(tmp) / "tls.crt").write_bytes(cert)
                (Path(tmp) / "tls.key").write_bytes(key)
                self._context = self._load(Path(tmp))
        else:
            self.context()  # a missing or bad pair fails the start, not the first scrape

    @staticmethod
    def _load(folder: Path) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(folder / "tls.crt", folder / "tls.key")
        return context

    def context(self) -> ssl.SSLContext:
        if self._dir is None:
            assert self._context is not None
            return self._context
        stamp = (os.stat(self._dir / "tls.crt").st_mtime, os.stat(self._dir / "tls.key").st_mtime)
        with self._lock:
            if stamp != self._stamp or self._context is None:
                try:
                    self._context = self._load(self._dir)
                    self._stamp = stamp
                except (OSError, ssl.SSLError) as exc:  # mid-rotation: keep serving the previous pair
                    if self._context is None:
                        raise
                    log.warning("metrics: keeping the previous certificate: %s", exc)
            return self._context


class _Handler(BaseHTTPRequestHandler):
    server: SecureMetricsServer

    def do_GET(self) -> None:
        if self.path.split("?", 1)[0] != PATH:
            self._answer(404, b"not found\n")
            return
        header = self.headers.get("Authorization", "")
        token = header[7:].strip() if header[:7].lower() == "bearer " else ""
        decision = self.server.reviewer.review(token)
        if decision.status != 200:
            log.info("metrics: scrape refused (%d) %s: %s", decision.status, decision.user or "-", decision.reason)
            extra = {"WWW-Authenticate": 'Bearer realm="rtj-operator metrics"'} if decision.status == 401 else {}
            self._answer(decision.status, f"{decision.reason}\n".encode(), extra)
            return
        encoder, content_type = choose_encoder(self.headers.get("Accept"))
        self._answer(200, encoder(self.server.registry), {"Content-Type": content_type})

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in {"Content-Type": "text/plain; charset=utf-8", **(headers or {})}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass  # refusals are logged above; a scrape every 30 s is not news


class SecureMetricsServer(ThreadingHTTPServer):
    """TLS is set up per connection (`get_request`), so a renewed certificate serves the next scrape, and
    a client that never finishes its handshake holds only its own thread."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], reviewer: Reviewer, certificates: Certificates,
                 registry: Collector = REGISTRY):
        self.reviewer, self.certificates, self.registry = reviewer, certificates, registry
        super().__init__(address, _Handler)

    def get_request(self) -> tuple[Any, Any]:
        sock, address = super().get_request()
        try:
            return self.certificates.context().wrap_socket(sock, server_side=True,
                                                           do_handshake_on_connect=False), address
        except (OSError, ssl.SSLError):
            sock.close()
            raise

    def finish_request(self, request: Any, client_address: Any) -> None:
        request.settimeout(10)
        try:
            request.do_handshake()
        except (OSError, ssl.SSLError):
            return  # a port probe, or a client speaking plain HTTP
        super().finish_request(request, client_address)


def serve(port: int, reviewer: Reviewer, certificates: Certificates, addr: str = "0.0.0.0",
          registry: Collector = REGISTRY) -> tuple[SecureMetricsServer, threading.Thread]:
    """Serve in a daemon thread; `server.shutdown()` stops it."""
    server = SecureMetricsServer((addr, port), reviewer, certificates, registry)
    thread = threading.Thread(target=server.serve_forever, name="metrics", daemon=True)
    thread.start()
    return server, thread
