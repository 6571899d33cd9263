"""The real Kueue (sigs.k8s.io/kueue's controller manager, built by hack/kube/kueue.sh) on a local
cluster: its CRDs, its webhooks (for Jobs and Kueue's own kinds; the pod, deployment and other
integrations are not enabled) and the manager as a host process with the admin kubeconfig.

The API server reaches the webhooks by URL (https://127.0.0.1:PORT, a certificate made here): the
local cluster has no kube-proxy, so a Service reference would not resolve. Kueue's internal
certificate management is off (it would issue certificates for the Service's DNS name); Kueue then
reads its metrics certificate from the fixed /etc/kueue/metrics/certs, which is bind-mounted from
this run's own folder in a private mount namespace (the host keeps only that empty folder).

    with LocalKueue(cluster).start() as kueue: ...
"""

from __future__ import annotations

import base64
import contextlib
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import yaml

from .localcluster import LocalCluster, free_port

CACHE_SCRIPT = Path(__file__).resolve().parents[1] / "kube" / "kueue.sh"
NAMESPACE = "kueue-system"
# The webhooks kept: Jobs and Kueue's own kinds.
GROUPS = {"batch", "kueue.x-k8s.io"}
METRICS_CERTS = Path("/etc/kueue/metrics/certs")
WEBHOOK_PREFIX = "rtj-test-kueue-"


def kueue_dir() -> Path:
    """The cache folder of hack/kube/kueue.sh ($RTJ_KUEUE_DIR, or built now)."""
    if os.environ.get("RTJ_KUEUE_DIR"):
        return Path(os.environ["RTJ_KUEUE_DIR"])
    out = subprocess.run(["bash", str(CACHE_SCRIPT)], check=True, capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


class LocalKueue:
    def __init__(self, cluster: LocalCluster, home: Path | None = None):
        self.cluster = cluster
        self.home = home or kueue_dir()
        self.workdir = (cluster.workdir or Path("/tmp")) / "kueue"  # type: ignore[operator]
        self.proc: subprocess.Popen[bytes] | None = None
        self.webhook_port, self.health_port = free_port(), free_port()

    # --- set-up -------------------------------------------------------------------------------------
    def start(self, attempts: int = 3) -> LocalKueue:
        """Kueue set up and answering. A start that fails takes its webhooks away at once (with
        failurePolicy Fail, every Job create of every test would fail while they point at nothing) and
        is tried again: the manager exits at start when its informers' REST mapping misses one of its
        kinds, which can lag the CRDs' Established condition (CI, stop 33)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._certs()
        self._crds()
        self._namespace()
        for attempt in range(1, attempts + 1):
            try:
                self._run()
                self._webhooks()
                self._wait_serving()
                return self
            except (RuntimeError, TimeoutError):
                self.stop()
                if attempt == attempts:
                    raise
        return self

    def _certs(self) -> None:
        certs = self.workdir / "certs"
        certs.mkdir(exist_ok=True)

        def ssl_(*args: str) -> None:
            subprocess.run(["openssl", *args], check=True, cwd=certs, stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        ssl_("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", "tls.key", "-out", "tls.crt", "-days", "30", "-subj", "/CN=127.0.0.1",
             "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost")
        self.ca_bundle = base64.b64encode((certs / "tls.crt").read_bytes()).decode()

    def _crds(self) -> None:
        names = []
        served: dict[str, set[str]] = {}  # /apis/<group>/<version> -> the plurals it must list
        for path in sorted((self.home / "crd").glob("*.yaml")):
            crd = yaml.safe_load(path.read_text())
            names.append(crd["metadata"]["name"])
            for version in crd["spec"]["versions"]:
                if version.get("served"):
                    gv = f"/apis/{crd['spec']['group']}/{version['name']}"
                    served.setdefault(gv, set()).add(crd["spec"]["names"]["plural"])
            with contextlib.suppress(RuntimeError):  # already there (an earlier start on this cluster)
                self.cluster.api("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)

        def established() -> bool:
            for name in names:
                crd = self.cluster.api("GET", f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}")
                if not any(c["type"] == "Established" and c["status"] == "True"
                           for c in crd.get("status", {}).get("conditions") or []):
                    return False
            return True
        self._wait(established, "Kueue's CRDs established", 60)

        def discovered() -> bool:  # what the manager's REST mapper reads, published after Established
            for gv, plurals in served.items():
                listed = {r["name"] for r in self.cluster.api("GET", gv).get("resources") or []}
                if not plurals <= listed:
                    return False
            return True
        self._wait(discovered, "Kueue's kinds in discovery", 60)

    def _namespace(self) -> None:
        with contextlib.suppress(RuntimeError):
            self.cluster.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                             "metadata": {"name": NAMESPACE}})

    def _run(self) -> None:
        config = {
            "apiVersion": "config.kueue.x-k8s.io/v1beta2", "kind": "Configuration", "namespace": NAMESPACE,
            "health": {"healthProbeBindAddress": f"127.0.0.1:{self.health_port}"},
            "metrics": {"bindAddress": "0"},
            "webhook": {"port": self.webhook_port, "host": "127.0.0.1", "certDir": str(self.workdir / "certs")},
            "leaderElection": {"leaderElect": False},
            "internalCertManagement": {"enable": False},
            "manageJobsWithoutQueueName": False,
            "integrations": {"frameworks": ["batch/job"]},
        }
        (self.workdir / "config.yaml").write_text(yaml.safe_dump(config))
        METRICS_CERTS.mkdir(parents=True, exist_ok=True)
        log = (self.workdir / "kueue.log").open("ab")
        script = (f'mount --bind "{self.workdir / "certs"}" "{METRICS_CERTS}" && exec "$@"')
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
             str(self.home / "bin" / "kueue"), f"--config={self.workdir / 'config.yaml'}",
             f"--visibility-server-port={free_port()}", "--feature-gates=VisibilityOnDemand=false",
             "--zap-log-level=2"],
            env={**os.environ, "KUBECONFIG": str(self.cluster.kubeconfig)}, stdout=log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True)

    def _webhooks(self) -> None:
        for doc in yaml.safe_load_all((self.home / "webhook" / "manifests.yaml").read_text()):
            if not doc:
                continue
            hooks = [h for h in doc.get("webhooks") or []
                     if {g for r in h.get("rules") or [] for g in r.get("apiGroups") or []} & GROUPS]
            for hook in hooks:
                path = hook["clientConfig"]["service"]["path"]
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{self.webhook_port}{path}",
                                        "caBundle": self.ca_bundle}
            kind = doc["kind"]
            body = {"apiVersion": doc["apiVersion"], "kind": kind,
                    "metadata": {"name": WEBHOOK_PREFIX + doc["metadata"]["name"]}, "webhooks": hooks}
            plural = kind.lower() + "s"
            base = f"/apis/admissionregistration.k8s.io/v1/{plural}"
            with contextlib.suppress(RuntimeError):
                self.cluster.api("DELETE", f"{base}/{body['metadata']['name']}")
            self.cluster.api("POST", base, body)

    def _wait_serving(self) -> None:
        def ready() -> bool:
            import urllib.request
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as r:
                return r.status == 200
        self._wait(ready, "Kueue ready", 120)
        probe = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor",
                 "metadata": {"name": "rtj-probe"}}

        def webhook_answers() -> bool:  # a create that goes through the mutating webhook
            self.cluster.api("POST", "/apis/kueue.x-k8s.io/v1beta2/resourceflavors?dryRun=All", probe)
            return True
        self._wait(webhook_answers, "Kueue's webhooks answering", 60)

    def _wait(self, check: Any, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"kueue exited with {self.proc.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError, RuntimeError, ValueError):
                if check():
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout}s waiting for {what}:\n{self.log_tail()}")
            time.sleep(0.3)

    def log_tail(self, chars: int = 3000) -> str:
        path = self.workdir / "kueue.log"
        return path.read_text(errors="replace")[-chars:] if path.exists() else ""

    # --- tear-down ----------------------------------------------------------------------------------
    def stop(self) -> None:
        """Kueue's webhooks go first (with failurePolicy Fail, every Job create would fail without Kueue)."""
        for plural in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            for name in ("mutating-webhook-configuration", "validating-webhook-configuration"):
                with contextlib.suppress(RuntimeError):
                    self.cluster.api("DELETE", f"/apis/admissionregistration.k8s.io/v1/{plural}/{WEBHOOK_PREFIX}{name}")
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> LocalKueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
