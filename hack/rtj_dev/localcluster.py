"""A local Kubernetes control plane from upstream binaries (see hack/kube/build.sh) with kwok nodes.

etcd (data on tmpfs), kube-apiserver (TLS, static-token authentication, RBAC, service-account
keys), kube-controller-manager (the controllers the operator relies on, with a short node-monitor
grace period so a lost node shows in seconds), kube-scheduler and kwok, which plays the kubelets of
p5.48xlarge-shaped fake nodes (kwok-stages.yaml beside this file says how pods behave).

Usable from pytest (tests/conftest.py starts one per test run) and from the command line:

    python -m rtj_dev.localcluster up [--nodes 4] [--dir DIR]   # prints the kubeconfig path, keeps running
    python -m rtj_dev.localcluster down --dir DIR                # stops what a previous `up` started

Everything started is stopped by pid on exit or failure; the pids are also written to DIR/pids
so that `down` can clean up after a crashed run.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .nodes import KWOK_LABEL, cpu_node, p5_node

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
BUILD = ROOT / "hack" / "kube" / "build.sh"
STAGES = HERE / "kwok-stages.yaml"

OUT_OF_SERVICE = "node.kubernetes.io/out-of-service"
ADMIN_TOKEN_USER = "rtj-local-admin"
SERVICE_CIDR = "10.96.0.0/16"
# Controllers the operator's behaviour depends on (kube-controller-manager --controllers).
CONTROLLERS = (
    "job-controller", "garbage-collector-controller", "pod-garbage-collector-controller",
    "node-lifecycle-controller", "taint-eviction-controller", "endpointslice-controller",
    "endpoints-controller", "namespace-controller", "serviceaccount-controller",
    "serviceaccount-token-controller", "root-ca-certificate-publisher-controller",
    "ttl-after-finished-controller", "disruption-controller",
    # helm install --wait reads Deployment status; no pod runs with replicaCount=0.
    "deployment-controller", "replicaset-controller",
    # Claims are provisioned and bound by kwok's volume stages; these let a deleted claim go.
    "persistentvolumeclaim-protection-controller", "persistentvolume-protection-controller",
)


# The class the examples name; kwok's volume stages provision its claims (see kwok-stages.yaml).
FSX_STORAGE_CLASS = {
    "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": "fsx-sc"},
    "provisioner": "fsx.csi.aws.com", "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate",
    "parameters": {"deploymentType": "PERSISTENT_2", "perUnitStorageThroughput": "250"},
}


def kube_bin_dir(build: bool = True) -> Path:
    """The versioned cache of upstream binaries; builds them (with progress on stderr) if missing."""
    env_dir = os.environ.get("RTJ_KUBE_BIN")
    if env_dir:
        return Path(env_dir)
    if not build:
        raise RuntimeError("RTJ_KUBE_BIN is not set")
    out = subprocess.run(["bash", str(BUILD)], check=True, stdout=subprocess.PIPE, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class LocalCluster:
    """One local control plane; `start()` returns once the API is ready and the nodes are Ready."""

    workdir: Path | None = None
    nodes: int = 4
    bin_dir: Path | None = None
    node_monitor_grace_seconds: int = 6
    # DefaultTolerationSeconds for not-ready/unreachable taints (EKS: 300). Short, so the real
    # taint-eviction controller evicts within a test; the operator acts on its own grace period.
    toleration_seconds: int = 300
    # How long kwok's node leases last (it renews them at a quarter of this). Short for the tests' node
    # losses; a benchmark of hundreds of nodes uses the kubelet's 40 s, or kwok's renewals alone fill the cores.
    node_lease_seconds: int = 4
    # API Priority and Fairness: off by default (benchmarks send thousands of requests from few clients). On,
    # the server's concurrency (--max-requests-inflight, --max-mutating-requests-inflight) is what its priority
    # levels share (tests/cluster/test_api_priority.py gives a small one, so a level of one seat is reachable).
    priority_and_fairness: bool = False
    max_requests_inflight: tuple[int, int] = (2000, 1000)
    quiet: bool = True
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    admin_token: str = ""
    api_port: int = 0
    _owns_workdir: bool = False

    # --- paths ---------------------------------------------------------------------------------
    @property
    def kubeconfig(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "kubeconfig"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca_file(self) -> Path:
        assert self.workdir is not None
        return self.workdir / "pki" / "ca.crt"

    def log(self, name: str) -> Path:
        assert self.workdir is not None
        return self.workdir / "logs" / f"{name}.log"

    # --- lifecycle -------------------------------------------------------------------------------
    def start(self) -> LocalCluster:
        if self.workdir is None:
            self.workdir = Path(tempfile.mkdtemp(prefix="rtj-cluster-"))
            self._owns_workdir = True
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        self.bin_dir = self.bin_dir or kube_bin_dir()
        atexit.register(self.stop)
        # atexit does not run on SIGTERM's default action: turn it into an exit, so the processes go too.
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
        try:
            self._pki()
            self._etcd()
            self._apiserver()
            self._write_kubeconfig(self.kubeconfig, token=self.admin_token)
            self._controller_manager()
            self._scheduler()
            self._kwok()
            self.add_nodes([f"p5-{i}" for i in range(self.nodes)])
            # A CPU node, as EKS clusters have for system pods: RTJ coordinators prefer it.
            self.api("POST", "/api/v1/nodes", cpu_node("cpu-0"))
            self.api("POST", "/apis/storage.k8s.io/v1/storageclasses", FSX_STORAGE_CLASS)
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for proc in reversed(list(self.procs.values())):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        self.procs.clear()
        etcd_data = self._etcd_dir()
        if etcd_data.exists():
            shutil.rmtree(etcd_data, ignore_errors=True)
        if self._owns_workdir and self.workdir is not None and not os.environ.get("RTJ_KEEP_CLUSTER"):
            shutil.rmtree(self.workdir, ignore_errors=True)

    @classmethod
    def attach(cls, workdir: Path) -> LocalCluster:
        """A cluster a `localcluster up` keeps running (faster edit-test loops); stop() leaves it be."""
        config = json.loads((workdir / "kubeconfig").read_text())
        cluster = cls(workdir=workdir)
        cluster.api_port = int(config["clusters"][0]["cluster"]["server"].rsplit(":", 1)[1])
        cluster.admin_token = config["users"][0]["user"]["token"]
        cluster.nodes = len(cluster.api("GET", "/api/v1/nodes")["items"])
        return cluster

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()

    # --- components ----------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str]) -> None:
        assert self.bin_dir is not None
        log = self.log(name).open("ab")
        proc = subprocess.Popen([str(self.bin_dir / args[0]), *args[1:]], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs[name] = proc
        with (self.workdir / "pids").open("a") as f:  # type: ignore[operator]
            f.write(f"{proc.pid} {name}\n")

    def _check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                tail = self.log(name).read_text(errors="replace")[-3000:]
                raise RuntimeError(f"{name} exited with {proc.returncode}; log {self.log(name)}:\n{tail}")

    def _pki(self) -> None:
        pki = self.workdir / "pki"  # type: ignore[operator]
        pki.mkdir(exist_ok=True)

        def ssl_(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, cwd=pki, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)

        ssl_("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "ca.key", "-out", "ca.crt", "-days", "30", "-subj", "/CN=rtj-local-ca")
        (pki / "san.cnf").write_text(
            # 10.77.0.1: the node agents' bridge, where pods reach the API (nodeagent.ApiRelay).
            "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,IP:10.77.0.1,DNS:localhost,DNS:kubernetes,"
            "DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local\n"
            "extendedKeyUsage=serverAuth\n")
        ssl_("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "apiserver.key", "-out", "apiserver.csr", "-subj", "/CN=kube-apiserver")
        ssl_("x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
             "-out", "apiserver.crt", "-days", "30", "-extfile", "san.cnf")
        ssl_("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key")
        ssl_("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub")
        self.admin_token = base64.urlsafe_b64encode(os.urandom(24)).decode().rstrip("=")
        (pki / "tokens.csv").write_text(f'{self.admin_token},{ADMIN_TOKEN_USER},1,"system:masters"\n')

    def _etcd_dir(self) -> Path:
        # tmpfs: etcd's fsyncs would dominate a test run on disk.
        base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
        if not hasattr(self, "_etcd_path"):
            self._etcd_path = base / f"rtj-etcd-{self.workdir.name}-{os.getpid()}"  # type: ignore[union-attr]
        return self._etcd_path

    def _etcd(self) -> None:
        self.etcd_port, peer = free_port(), free_port()
        self._spawn("etcd", [
            "etcd", "--name", "rtj-local", "--data-dir", str(self._etcd_dir()),
            "--listen-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{self.etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"rtj-local=http://127.0.0.1:{peer}",
            "--unsafe-no-fsync", "--quota-backend-bytes", str(4 << 30), "--log-level", "warn",
        ])
        self._wait(lambda: _http_ok(f"http://127.0.0.1:{self.etcd_port}/health"), "etcd", 30)

    def _apiserver(self) -> None:
        pki = self.workdir / "pki"  # type: ignore[operator]
        self.api_port = free_port()
        self._spawn("kube-apiserver", [
            "kube-apiserver", f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.api_port}",
            # A loopback address cannot back the `kubernetes` Service endpoints: nothing here needs them.
            "--endpoint-reconciler-type=none",
            f"--tls-cert-file={pki / 'apiserver.crt'}", f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}", f"--token-auth-file={pki / 'tokens.csv'}",
            "--authorization-mode=RBAC", "--anonymous-auth=false",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}", "--allow-privileged=true",
            f"--default-not-ready-toleration-seconds={self.toleration_seconds}",
            f"--default-unreachable-toleration-seconds={self.toleration_seconds}",
            # Benchmarks create thousands of objects from few clients.
            f"--max-requests-inflight={self.max_requests_inflight[0]}",
            f"--max-mutating-requests-inflight={self.max_requests_inflight[1]}",
            f"--enable-priority-and-fairness={str(self.priority_and_fairness).lower()}", "--v=1",
            # Requests of ServiceAccounts (the operator's, in tests) at Metadata level: tests read
            # which calls the chart's RBAC allowed or denied.
            f"--audit-policy-file={self._audit_policy()}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json", "--audit-log-maxsize=200",
        ])
        self._wait(lambda: self._api_ok("/readyz"), "kube-apiserver /readyz", 90)

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.log"  # type: ignore[operator]

    def _audit_policy(self) -> Path:
        path = self.workdir / "pki" / "audit-policy.json"  # type: ignore[operator]
        path.write_text(json.dumps({
            "apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
            "rules": [{"level": "Metadata", "userGroups": ["system:serviceaccounts"]}, {"level": "None"}]}))
        return path

    def audit_events(self) -> list[dict[str, Any]]:
        """The audit log's events so far; a last line the server is still writing is left for the next read."""
        text = self.audit_log.read_text() if self.audit_log.exists() else ""
        complete = text[:text.rfind("\n") + 1]
        return [json.loads(line) for line in complete.splitlines() if line.strip()]

    def _write_kubeconfig(self, path: Path, token: str, namespace: str = "default") -> None:
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "rtj-local",
            "clusters": [{"name": "rtj-local", "cluster": {
                "server": self.server, "certificate-authority": str(self.ca_file)}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "rtj-local", "context": {
                "cluster": "rtj-local", "user": "user", "namespace": namespace}}],
        }, indent=1))
        path.chmod(0o600)

    def _controller_manager(self) -> None:
        pki = self.workdir / "pki"  # type: ignore[operator]
        grace = self.node_monitor_grace_seconds
        self._spawn("kube-controller-manager", [
            "kube-controller-manager", f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            f"--controllers={','.join(CONTROLLERS)}", "--bind-address=127.0.0.1", f"--secure-port={free_port()}",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--node-monitor-period=1s", f"--node-monitor-grace-period={grace}s",
            "--concurrent-job-syncs=20", "--concurrent-gc-syncs=40", "--kube-api-qps=500",
            "--kube-api-burst=1000", "--v=1",
        ])

    def _scheduler(self) -> None:
        self._spawn("kube-scheduler", [
            "kube-scheduler", f"--kubeconfig={self.kubeconfig}", "--leader-elect=false",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--kube-api-qps=500",
            "--kube-api-burst=1000", f"--v={os.environ.get('RTJ_SCHEDULER_V', '1')}",
        ])

    def _kwok(self) -> None:
        self._spawn("kwok", [
            "kwok", f"--kubeconfig={self.kubeconfig}", f"--config={STAGES}",
            f"--manage-nodes-with-label-selector={KWOK_LABEL}=true",
            f"--node-lease-duration-seconds={self.node_lease_seconds}", "--cidr=10.244.0.1/16", "--node-ip=10.0.0.1",
            f"--server-address=127.0.0.1:{free_port()}",
        ])

    def _wait_ready(self) -> None:
        def ready() -> bool:
            nodes = self.api("GET", "/api/v1/nodes")["items"]
            ok = sum(1 for n in nodes for c in n.get("status", {}).get("conditions") or []
                     if c["type"] == "Ready" and c["status"] == "True")
            sa = self.api("GET", "/api/v1/namespaces/default/serviceaccounts/default", missing_ok=True)
            return ok >= self.nodes and sa is not None
        self._wait(ready, "nodes Ready and the default ServiceAccount", 90)

    def _wait(self, check: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            self._check_alive()
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                if check():
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"local cluster: timed out after {timeout}s waiting for {what} "
                                   f"(logs under {self.workdir}/logs)")
            time.sleep(0.2)

    # --- API access for the harness (the operator uses its own client) ------------------------------
    def _ssl(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.ca_file))

    def _api_ok(self, path: str) -> bool:
        try:
            return self.api("GET", path, raw=True) == b"ok"
        except (OSError, RuntimeError):
            return False

    def api(self, method: str, path: str, body: Any = None, *, token: str | None = None,
            content_type: str = "application/json", missing_ok: bool = False, raw: bool = False) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(self.server + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token or self.admin_token}", "Content-Type": content_type,
            "Accept": "application/json"})
        try:
            with urllib.request.urlopen(request, context=self._ssl(), timeout=30) as response:
                payload = response.read()
        except urllib.error.HTTPError as exc:
            if exc.code == 404 and missing_ok:
                return None
            raise RuntimeError(f"{method} {path}: HTTP {exc.code}: {exc.read()[:500]!r}") from None
        if raw:
            return payload
        return json.loads(payload) if payload else None

    def watch(self, path: str, resource_version: str, timeout: int = 240) -> Iterator[dict[str, Any]]:
        """One watch request's events (the API server's JSON lines, BOOKMARKs included) until the server
        ends it; raises RuntimeError on an HTTP error (410: relist)."""
        host, port = self.server.removeprefix("https://").rsplit(":", 1)
        conn = http.client.HTTPSConnection(host, int(port), context=self._ssl(), timeout=timeout + 30)
        sep = "&" if "?" in path else "?"
        conn.request("GET", f"{path}{sep}watch=1&allowWatchBookmarks=true&resourceVersion={resource_version}"
                            f"&timeoutSeconds={timeout}",
                     headers={"Authorization": f"Bearer {self.admin_token}", "Accept": "application/json"})
        try:
            response = conn.getresponse()
            if response.status != 200:
                raise RuntimeError(f"watch {path}: HTTP {response.status}: {response.read()[:300]!r}")
            while line := response.readline():
                event = json.loads(line)
                if event.get("type") == "ERROR":
                    raise RuntimeError(f"watch {path}: {event.get('object')}")
                yield event
        finally:
            conn.close()

    # --- nodes -------------------------------------------------------------------------------------
    def add_nodes(self, names: Iterable[str], zone: str = "us-west-2a") -> None:
        for name in names:
            try:
                self.api("POST", "/api/v1/nodes", p5_node(name, zone))
            except RuntimeError as exc:
                if "HTTP 409" not in str(exc):
                    raise

    def lose_node(self, name: str) -> None:
        """Node loss as the control plane sees it: its 'kubelet' (kwok) stops renewing the lease and
        stops acting on its pods; the real node-lifecycle controller notices within the grace period."""
        self._label_node(name, "false")

    def restore_node(self, name: str) -> None:
        node = self.api("GET", f"/api/v1/nodes/{name}")
        taints = [t for t in node["spec"].get("taints") or [] if t.get("key") != OUT_OF_SERVICE]
        if taints != (node["spec"].get("taints") or []):
            self.api("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": taints}},
                     content_type="application/merge-patch+json")
        self._label_node(name, "true")

    def fence_node(self, name: str) -> None:
        """What an administrator (or an automation) does once a lost node is known to be shut down:
        the out-of-service taint (non-graceful node shutdown); PodGC then force-deletes its pods."""
        node = self.api("GET", f"/api/v1/nodes/{name}")
        taints = [*(node["spec"].get("taints") or []),
                  {"key": OUT_OF_SERVICE, "value": "nodeshutdown", "effect": "NoExecute"}]
        self.api("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": taints}},
                 content_type="application/merge-patch+json")

    def _label_node(self, name: str, managed: str) -> None:
        self.api("PATCH", f"/api/v1/nodes/{name}", {"metadata": {"labels": {KWOK_LABEL: managed}}},
                 content_type="application/merge-patch+json")

    # --- identities -------------------------------------------------------------------------------
    def service_account_token(self, namespace: str, name: str, seconds: int = 86400) -> str:
        """A bound token of a ServiceAccount (TokenRequest API), as a pod of it would get."""
        review = self.api("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                          {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                           "spec": {"expirationSeconds": seconds}})
        return review["status"]["token"]

    def kubeconfig_for(self, namespace: str, name: str, path: Path) -> Path:
        self._write_kubeconfig(path, self.service_account_token(namespace, name), namespace=namespace)
        return path

    def env(self) -> dict[str, str]:
        """Environment for kubectl/helm/kubernetes-client processes that should use this cluster."""
        return {**os.environ, "KUBECONFIG": str(self.kubeconfig)}


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except (OSError, urllib.error.URLError):
        return False


def _down(workdir: Path) -> None:
    pids = workdir / "pids"
    if not pids.exists():
        return
    for line in pids.read_text().splitlines():
        pid = int(line.split()[0])
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
    pids.unlink()
    time.sleep(2)  # let them go (their own cleanup) before the data of dead ones is removed
    for stale in Path("/dev/shm").glob(f"rtj-etcd-{workdir.name}-*"):
        shutil.rmtree(stale, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rtj_dev.localcluster", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="start a cluster and keep it running until interrupted")
    up.add_argument("--nodes", type=int, default=4)
    up.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "rtj-cluster")
    down = sub.add_parser("down", help="stop the cluster a previous `up` started in --dir")
    down.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()) / "rtj-cluster")
    sub.add_parser("build", help="build (or find) the binaries and print their directory")
    args = parser.parse_args(argv)
    if args.cmd == "build":
        print(kube_bin_dir())
        return
    if args.cmd == "down":
        _down(args.dir)
        return
    _down(args.dir)
    cluster = LocalCluster(workdir=args.dir, nodes=args.nodes)
    started = time.monotonic()
    cluster.start()
    print(f"local cluster ready in {time.monotonic() - started:.1f}s; export KUBECONFIG={cluster.kubeconfig}",
          flush=True)
    serve_until_stopped(cluster.stop)


def serve_until_stopped(stop: Callable[[], None]) -> None:
    """The `up` commands: keep running until Ctrl-C or SIGTERM, then `stop`."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while True:
            time.sleep(3600)
    except (KeyboardInterrupt, SystemExit):
        pass
    finally:
        stop()


if __name__ == "__main__":
    main()
