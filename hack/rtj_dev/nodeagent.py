"""Local nodes that run pods as real processes: a small "kubelet" per node, plus cluster DNS.

Each NodeAgent registers a p5-shaped Node (labels, capacity, the nvidia.com/gpu taint of EKS GPU
nodes) with the local control plane (localcluster.py), renews its Lease in kube-node-lease every
second and runs the pods the real scheduler binds to it:

- in the node's own network namespace (rtj-<node>), with its own IP on the bridge rtjbr0 that all
  nodes share (10.77.0.1 on the host side, node i at 10.77.0.(10+i));
- in a per-pod mount, UTS and PID namespace (as a container would be): the PVC's hostPath (one
  shared directory standing in for FSx for Lustre), a fresh /dev/shm, /dev/termination-log,
  /etc/hosts and an /etc/resolv.conf that points at CoreDNS with the pod namespace's search path;
  when the container's first process ends, the kernel ends the rest (PID namespace).

It reports pod status as a kubelet does (phase, Ready, containerStatuses, podIP) and honours
deletion (SIGTERM, grace period, SIGKILL, then delete with grace 0). Its status writes are strategic
merge patches keyed by condition type, so conditions others write on the pod (the scheduler's, the
worker's own `rtj.dev/Progress`) are kept, as a kubelet keeps them. A pod's service-account token is
mounted as the kubelet mounts it (the projected `kube-api-access-*` volume the ServiceAccount admission
plugin adds: a TokenRequest bound to the pod, kube-root-ca.crt, the namespace), and
KUBERNETES_SERVICE_HOST/PORT point at a relay on the bridge to the loopback-only API server, so a pod
can call the API as on EKS (a partitioned node's pods cannot). `stop(lose=True)` is a node
loss: processes are killed and the Lease stops, which the real node-lifecycle controller sees.

    python -m rtj_dev.nodeagent up --cluster DIR [--nodes 3]   # agents + CoreDNS on a `localcluster up`

Needs root (network namespaces, mounts).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .localcluster import LocalCluster, kube_bin_dir, serve_until_stopped
from .nodes import KWOK_LABEL, cpu_node, p5_node
from .slowfs import SlowVolume

if TYPE_CHECKING:
    from .netpol import Enforcer

BRIDGE, BRIDGE_IP, PREFIX = "rtjbr0", "10.77.0.1", 24
API_RELAY_PORT = 6443  # on BRIDGE_IP: the pods' KUBERNETES_SERVICE_HOST/PORT (the API certificate names it)
LOCK_PATH = "/run/rtj-nodeagents.lock"
AGENT_LABEL = "rtj.dev/node-agent"  # RTJs select these nodes (kwok nodes run no processes)
CLUSTER_DOMAIN = "cluster.local"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
ROOT = Path(__file__).resolve().parents[2]
MAX_MESSAGE = 4096  # kubelet's limit on a termination message


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _micro_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _sh(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, check=check, capture_output=True, text=True)


# --- network -----------------------------------------------------------------------------------------

class Network:
    """The bridge all nodes share and one network namespace (with a veth into the bridge) per node."""

    @staticmethod
    def up() -> None:
        if _sh("ip", "link", "show", BRIDGE, check=False).returncode != 0:
            _sh("ip", "link", "add", BRIDGE, "type", "bridge")
            _sh("ip", "addr", "add", f"{BRIDGE_IP}/{PREFIX}", "dev", BRIDGE)
        _sh("ip", "link", "set", BRIDGE, "up")

    @staticmethod
    def add_node(netns: str, ip: str, index: int) -> None:
        Network.remove_node(netns, index)
        host_if = f"rtjv{index}"
        _sh("ip", "netns", "add", netns)
        _sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", "eth0", "netns", netns)
        _sh("ip", "link", "set", host_if, "master", BRIDGE, "up")
        for cmd in (("ip", "addr", "add", f"{ip}/{PREFIX}", "dev", "eth0"), ("ip", "link", "set", "eth0", "up"),
                    ("ip", "link", "set", "lo", "up"), ("ip", "route", "add", "default", "via", BRIDGE_IP)):
            _sh("ip", "netns", "exec", netns, *cmd)

    @staticmethod
    def set_link(index: int, up: bool) -> None:
        """Cut (or restore) a node's link: its pods can no longer reach their peers."""
        _sh("ip", "link", "set", f"rtjv{index}", "up" if up else "down")

    @staticmethod
    def remove_node(netns: str, index: int) -> None:
        _sh("ip", "link", "del", f"rtjv{index}", check=False)
        _sh("ip", "netns", "del", netns, check=False)

    @staticmethod
    def down() -> None:
        _sh("ip", "link", "del", BRIDGE, check=False)


# --- cluster DNS -------------------------------------------------------------------------------------

@dataclass
class ClusterDNS:
    """CoreDNS with the kubernetes plugin on the bridge address, as kube-dns is on EKS."""

    cluster: LocalCluster
    workdir: Path
    ttl: int = 1
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> ClusterDNS:
        self.workdir.mkdir(parents=True, exist_ok=True)
        corefile = self.workdir / "Corefile"
        # No cache plugin and a short TTL: a new pod's record shows as soon as its EndpointSlice does.
        corefile.write_text(f""".:53 {{
    bind {BRIDGE_IP}
    errors
    kubernetes {CLUSTER_DOMAIN} {{
        kubeconfig {self.cluster.kubeconfig}
        pods insecure
        ttl {self.ttl}
    }}
}}
""")
        log = (self.workdir / "coredns.log").open("ab")
        self.proc = subprocess.Popen([str(kube_bin_dir() / "coredns"), "-conf", str(corefile)], stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 30
        while "plugin/ready" not in (text := (self.workdir / "coredns.log").read_text()) and "CoreDNS-" not in text:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"coredns did not start: {text[-2000:]}")
            time.sleep(0.2)
        return self

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def resolve(name: str, server: str = BRIDGE_IP, timeout: float = 1.0) -> str | None:
    """The first A record CoreDNS gives for `name` (a fully qualified name), or None."""
    query = os.urandom(2) + b"\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00"
    query += b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\x00\x00\x01\x00\x01"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.sendto(query, (server, 53))
            reply = sock.recv(4096)
        except OSError:
            return None
    if reply[:2] != query[:2] or reply[3] & 0x0F or not int.from_bytes(reply[6:8], "big"):
        return None  # another query's reply, an error (NXDOMAIN) or no answer
    # The answers follow the question; each A answer ends with 4 address bytes.
    pos = len(query)
    while pos < len(reply):
        pos += 2 if reply[pos] & 0xC0 == 0xC0 else reply.index(0, pos) + 1 - pos  # name: pointer or labels
        rtype, length = int.from_bytes(reply[pos:pos + 2], "big"), int.from_bytes(reply[pos + 8:pos + 10], "big")
        if rtype == 1 and length == 4:
            return ".".join(str(b) for b in reply[pos + 10:pos + 14])
        pos += 10 + length
    return None


# --- the API server, as pods reach it -------------------------------------------------------------------

class ApiRelay:
    """TCP from BRIDGE_IP:API_RELAY_PORT to the loopback API server (TLS passes through; the server's
    certificate names BRIDGE_IP): what the `kubernetes` Service and kube-proxy give pods on EKS.
    Connections from a `blocked` node IP are refused (a partitioned node has no API server)."""

    def __init__(self, target_port: int):
        self.target_port = target_port
        self.blocked: set[str] = set()
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> ApiRelay:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((BRIDGE_IP, API_RELAY_PORT))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, name="api-relay", daemon=True).start()
        return self

    def stop(self) -> None:
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)
            self._listener.close()
            self._listener = None
        with self._lock:
            for conn in list(self._open):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
                conn.close()
            self._open.clear()

    def _accept(self) -> None:
        while (listener := self._listener) is not None:
            try:
                client, (peer, _) = listener.accept()
            except OSError:
                return
            if peer in self.blocked:
                client.close()
                continue
            try:
                server = socket.create_connection(("127.0.0.1", self.target_port), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            with self._lock:
                self._open.update((client, server))
            threading.Thread(target=self._serve, args=(client, server), daemon=True).start()

    def _serve(self, client: socket.socket, server: socket.socket) -> None:
        back = threading.Thread(target=self._pump, args=(server, client), daemon=True)
        back.start()
        self._pump(client, server)
        back.join()
        with self._lock:
            self._open.difference_update((client, server))
        client.close()
        server.close()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_WR)


# --- the node object and its lease -------------------------------------------------------------------

class NodeRegistration:
    """The Node (registered as the kubelet does) and its Lease, renewed every `lease_interval`."""

    def __init__(self, cluster: LocalCluster, name: str, ip: str, zone: str, lease_interval: float = 1.0,
                 cpu: bool = False):
        self.cluster, self.name, self.ip, self.zone = cluster, name, ip, zone
        self.lease_interval, self.cpu = lease_interval, cpu

    def shape(self) -> dict[str, Any]:
        return cpu_node(self.name, self.zone) if self.cpu else p5_node(self.name, self.zone)

    def register(self) -> None:
        node = self.shape()
        labels = node["metadata"]["labels"]
        for key in (KWOK_LABEL, "type"):  # kwok must leave this node alone
            labels.pop(key, None)
        labels[AGENT_LABEL] = "true"
        node["metadata"]["annotations"] = {}
        # Only pods meant for real processes land here: other tests' RTJs (steered through kwok)
        # tolerate the GPU taint and select p5.48xlarge too.
        node["spec"]["taints"].append({"key": AGENT_LABEL, "value": "true", "effect": "NoSchedule"})
        self.cluster.api("DELETE", f"/api/v1/nodes/{self.name}", missing_ok=True)
        self.cluster.api("POST", "/api/v1/nodes", node)
        self.report_status()

    def report_status(self) -> None:
        now = _now()
        conditions = [{"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": "ok",
                       "lastHeartbeatTime": now, "lastTransitionTime": now}
                      for t, r in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"),
                                   ("PIDPressure", "SufficientPID"))]
        conditions.append({"type": "Ready", "status": "True", "reason": "KubeletReady",
                           "message": "rtj node agent is posting ready status",
                           "lastHeartbeatTime": now, "lastTransitionTime": now})
        capacity = self.shape()["status"]["capacity"]
        self.cluster.api("PATCH", f"/api/v1/nodes/{self.name}/status", {"status": {
            "conditions": conditions, "capacity": capacity, "allocatable": capacity,
            "addresses": [{"type": "InternalIP", "address": self.ip}, {"type": "Hostname", "address": self.name}],
            "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "rtj-nodeagent",
                         "containerRuntimeVersion": "rtj-nodeagent://processes", "kernelVersion": os.uname().release,
                         "kubeProxyVersion": "", "osImage": "local", "machineID": "", "systemUUID": "",
                         "bootID": ""},
        }}, content_type="application/strategic-merge-patch+json")

    def renew_lease(self) -> None:
        """Renew the node's Lease, or create it, as the kubelet's lease controller does: also when the
        garbage collector removed it (it is owned by the Node, and a Node deleted and registered again
        has a new uid), between a read and the renewal (CI: a restarted agent's renewal got 404)."""
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{self.name}"
        spec = {"holderIdentity": self.name, "leaseDurationSeconds": 40, "renewTime": _micro_now()}
        if self.cluster.api("PATCH", path, {"spec": spec}, content_type="application/merge-patch+json",
                            missing_ok=True) is not None:
            return
        node = self.cluster.api("GET", f"/api/v1/nodes/{self.name}")
        try:
            self.cluster.api("POST", "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases", {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": self.name, "ownerReferences": [{
                    "apiVersion": "v1", "kind": "Node", "name": self.name, "uid": node["metadata"]["uid"]}]},
                "spec": spec})
        except RuntimeError as exc:
            if "HTTP 409" not in str(exc):  # made meanwhile (the agent's other thread): renewed next time
                raise


# --- one pod's processes -----------------------------------------------------------------------------

@dataclass
class PodSandbox:
    """A pod's container as a process tree in its own mount/UTS/PID namespaces inside the node's netns."""

    pod: dict[str, Any]
    node_ip: str
    netns: str
    dir: Path
    proc: subprocess.Popen[bytes] | None = None
    started_at: str = ""
    finished_at: str = ""
    killed: bool = False
    terminated_at: float = 0.0  # when SIGTERM was sent (monotonic)
    extra_env: dict[str, str] = field(default_factory=dict)

    @property
    def container(self) -> dict[str, Any]:
        return self.pod["spec"]["containers"][0]

    def _env(self) -> dict[str, str]:
        meta = self.pod["metadata"]
        fields = {"metadata.name": meta["name"], "metadata.namespace": meta["namespace"],
                  "metadata.uid": meta["uid"], "spec.nodeName": self.pod["spec"].get("nodeName", ""),
                  "status.podIP": self.node_ip, "status.hostIP": self.node_ip,
                  f"metadata.annotations['{COMPLETION_INDEX}']": meta.get("annotations", {}).get(COMPLETION_INDEX, "")}
        # rtj-worker, ft_launcher and python of the venv the agent runs in (the image's PATH).
        bin_dir = Path(sys.executable).parent
        # This checkout's worker code, not whichever the venv was installed from; NVRx 0.6 (the production
        # image's version, `make nvrx06`) first when RTJ_AGENT_NVRX names its folder.
        paths = [os.environ.get("RTJ_AGENT_NVRX", ""), str(ROOT / "worker"), str(ROOT / "operator")]
        env = {"PATH": f"{bin_dir}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "HOSTNAME": self.hostname, "HOME": "/root", "TMPDIR": str(self.dir / "tmp"),
               # The kubelet's service environment for the API server: here the bridge's relay (ApiRelay).
               "KUBERNETES_SERVICE_HOST": BRIDGE_IP, "KUBERNETES_SERVICE_PORT": str(API_RELAY_PORT),
               "PYTHONPATH": ":".join(p for p in paths if p), **self.extra_env}
        for var in self.container.get("env", []):
            if "value" in var:
                env[var["name"]] = var["value"]
            elif ref := var.get("valueFrom", {}).get("fieldRef"):
                env[var["name"]] = fields.get(ref["fieldPath"], "")
        return env

    @property
    def hostname(self) -> str:
        return self.pod["spec"].get("hostname") or self.pod["metadata"]["name"]

    def _files(self) -> None:
        spec, ns = self.pod["spec"], self.pod["metadata"]["namespace"]
        (self.dir / "tmp").mkdir(parents=True, exist_ok=True)
        (self.dir / "termination-log").write_text("")
        search = f"{ns}.svc.{CLUSTER_DOMAIN} svc.{CLUSTER_DOMAIN} {CLUSTER_DOMAIN}"
        (self.dir / "resolv.conf").write_text(f"nameserver {BRIDGE_IP}\nsearch {search}\noptions ndots:5\n")
        fqdn = f"{self.hostname}.{spec['subdomain']}.{ns}.svc.{CLUSTER_DOMAIN}" if spec.get("subdomain") else ""
        (self.dir / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost\n"
                                        f"{self.node_ip}\t{fqdn} {self.hostname}\n")

    def _mounts(self, volumes: dict[str, str]) -> list[str]:
        """Shell lines run inside the new mount namespace before the container's command."""
        lines = [f"hostname {shlex.quote(self.hostname)}"]
        for name in ("resolv.conf", "hosts"):
            lines.append(f"mount --bind {self.dir / name} /etc/{name}")
        lines.append(f"touch /dev/termination-log && mount --bind {self.dir / 'termination-log'} /dev/termination-log")
        for mount in self.container.get("volumeMounts", []):
            target = shlex.quote(mount["mountPath"])
            source = volumes.get(mount["name"])
            if source == "tmpfs":
                lines.append(f"mkdir -p {target} && mount -t tmpfs tmpfs {target}")
            elif source:
                lines.append(f"mkdir -p {target} && mount --bind {shlex.quote(source)} {target}")
        # No tmpfs over /tmp: the checkout and its venv may live there (a CI clone does). The pod gets its
        # own TMPDIR instead (ft_launcher's sockets, torch's files).
        return lines

    def start(self, volumes: dict[str, str]) -> None:
        self._files()
        argv = [*self.container.get("command", []), *self.container.get("args", [])]
        script = " && ".join(self._mounts(volumes)) + ' && exec "$@"'
        log = (self.dir / "container.log").open("ab")
        self.proc = subprocess.Popen(
            ["nsenter", f"--net=/var/run/netns/{self.netns}", "--", "unshare", "--mount", "--uts", "--pid",
             "--fork", "--kill-child", "--mount-proc", "--propagation", "private", "--",
             "/bin/sh", "-c", script, "sh", *argv],
            env=self._env(), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd="/")
        self.started_at = _now()

    def _init_pid(self) -> int | None:
        """The container's first process (PID 1 of its namespace): unshare's child."""
        assert self.proc is not None
        try:
            children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children").read_text().split()
        except OSError:
            return None
        return int(children[0]) if children else None

    def signal(self, sig: int) -> None:
        pid = self._init_pid()
        with contextlib.suppress(ProcessLookupError):
            if pid is not None:
                os.kill(pid, sig)  # SIGKILL of PID 1 ends every process of the pod
            elif self.proc is not None and sig == signal.SIGKILL:
                os.killpg(self.proc.pid, sig)

    def exit_code(self) -> int | None:
        if self.proc is None or (code := self.proc.poll()) is None:
            return None
        if not self.finished_at:
            self.finished_at = _now()
        return 128 - code if code < 0 else code  # a signal death reads 128 + signal, as runtimes report

    def message(self, code: int) -> str:
        text = (self.dir / "termination-log").read_text(errors="replace")[:MAX_MESSAGE]
        if not text and code != 0 and self.container.get("terminationMessagePolicy") == "FallbackToLogsOnError":
            lines = (self.dir / "container.log").read_text(errors="replace").splitlines()[-80:]
            text = "\n".join(lines)[-2048:]
        return text


# --- the agent -----------------------------------------------------------------------------------------

class SlowClaims:
    """Checkpoint volumes with real-size timing (hack/slowfs: a simulation of FSx for Lustre, which cannot
    run here). A test names a claim before its pods start (want()); the first agent to mount that claim
    for a pod serves its hostPath through slowfs (backed by a sibling directory), so every pod of the job
    shares one slow volume, and whatever runs in them feels it alike. stop() unmounts them all."""

    def __init__(self, created_dirs: set[str]):
        self.wanted: dict[tuple[str, str], dict[str, float]] = {}
        self.mounted: dict[str, SlowVolume] = {}
        self.created_dirs = created_dirs
        self._lock = threading.Lock()

    def want(self, namespace: str, claim: str, **timing: float) -> None:
        """SlowVolume's `write_bps`, `read_bps`, `scale` for the claim's volume."""
        self.wanted[(namespace, claim)] = timing

    def serve(self, namespace: str, claim: str, path: str) -> None:
        """Before `path` (the claim's hostPath) is bound into a pod: mount slowfs there if wanted."""
        timing = self.wanted.get((namespace, claim))
        if timing is None:
            return
        with self._lock:
            if path in self.mounted:
                return
            backing = Path(f"{path}.slowfs")
            backing.mkdir(parents=True, exist_ok=True)
            self.created_dirs.add(str(backing))
            for child in Path(path).iterdir():  # what is already there stays visible through the mount
                child.rename(backing / child.name)
            self.mounted[path] = SlowVolume(backing, Path(path), **timing).start()

    def stop(self) -> None:
        with self._lock:
            for volume in self.mounted.values():
                with contextlib.suppress(Exception):
                    volume.stop()
            self.mounted.clear()
            self.wanted.clear()


class NodeAgent:
    """One node: registration, lease, and the pods bound to it (polled, as a kubelet's watch would see)."""

    def __init__(self, cluster: LocalCluster, name: str, index: int, workdir: Path, zone: str = "us-west-2a",
                 poll: float = 0.3, extra_env: dict[str, str] | None = None, created_dirs: set[str] | None = None,
                 cpu: bool = False):
        self.cluster, self.name, self.index = cluster, name, index
        self.ip = f"10.77.0.{10 + index}"
        self.netns = f"rtj-{name}"
        self.workdir = workdir / name
        self.registration = NodeRegistration(cluster, name, self.ip, zone, cpu=cpu)
        self.poll, self.extra_env = poll, extra_env or {}
        self.sandboxes: dict[str, PodSandbox] = {}  # by pod uid
        self.reported: dict[str, str] = {}  # uid -> last status we wrote (json), to skip no-op patches
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.errors: list[str] = []
        self.created_dirs = created_dirs if created_dirs is not None else set()  # volumes made here
        self.relay: ApiRelay | None = None  # AgentNodes' relay to the API server
        self.slow: SlowClaims | None = None  # AgentNodes' slow checkpoint volumes

    def start(self) -> NodeAgent:
        self.workdir.mkdir(parents=True, exist_ok=True)
        Network.add_node(self.netns, self.ip, self.index)
        self.registration.register()
        self.registration.renew_lease()
        self._stop.clear()
        self._threads = [threading.Thread(target=self._loop, args=(self.registration.renew_lease, 1.0),
                                          name=f"{self.name}-lease", daemon=True),
                         threading.Thread(target=self._loop, args=(self.registration.report_status, 10.0),
                                          name=f"{self.name}-status", daemon=True),
                         threading.Thread(target=self._loop, args=(self.sync, self.poll),
                                          name=f"{self.name}-pods", daemon=True)]
        for thread in self._threads:
            thread.start()
        return self

    def stop(self, lose: bool = False) -> None:
        """Stop the node. lose=True: as if the machine died (SIGKILL, no status, the Node stays)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(10)
        for box in self.sandboxes.values():
            box.signal(signal.SIGKILL)
            if box.proc is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    box.proc.wait(10)
        self.sandboxes.clear()
        Network.remove_node(self.netns, self.index)
        if not lose:
            self.cluster.api("DELETE", f"/api/v1/nodes/{self.name}", missing_ok=True)

    @property
    def up(self) -> bool:
        """Registered and syncing (not stopped, lost or partitioned)."""
        return bool(self._threads) and not self._stop.is_set()

    def terminate(self) -> None:
        """The machine is gone for good (an EC2 instance terminated): its processes die and, as the cloud
        node lifecycle controller does on EKS, its Node object is deleted."""
        self.stop(lose=True)
        self.cluster.api("DELETE", f"/api/v1/nodes/{self.name}", missing_ok=True)

    def partition(self) -> None:
        """The node loses the API server but keeps its processes and its network to the other nodes: no
        lease, no status, no pod updates (it neither starts nor stops pods), ranks keep training; its
        pods' own API calls fail too."""
        if self.relay is not None:
            self.relay.blocked.add(self.ip)
        self._stop.set()
        for thread in self._threads:
            thread.join(10)

    def heal(self) -> None:
        """The partition ends: lease, status and pod sync resume (pods deleted meanwhile are stopped)."""
        if self.relay is not None:
            self.relay.blocked.discard(self.ip)
        self._stop.clear()
        self._threads = [threading.Thread(target=self._loop, args=(fn, interval), name=f"{self.name}-{what}",
                                          daemon=True)
                         for fn, interval, what in ((self.registration.renew_lease, 1.0, "lease"),
                                                    (self.registration.report_status, 10.0, "status"),
                                                    (self.sync, self.poll, "pods"))]
        for thread in self._threads:
            thread.start()

    def processes(self) -> dict[str, int]:
        """pod uid -> the pid of its live init process, for the pods this node runs."""
        return {uid: pid for uid, box in self.sandboxes.items() if (pid := box._init_pid()) is not None}

    def _loop(self, fn: Any, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                fn()
            except Exception as exc:  # the API server may blip; a kubelet keeps going
                self.errors.append(f"{fn.__name__}: {exc}")

    # --- pods --------------------------------------------------------------------------------------
    def sync(self) -> None:
        pods = self.cluster.api("GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.name}")["items"]
        seen = set()
        for pod in pods:
            uid = pod["metadata"]["uid"]
            seen.add(uid)
            self._sync_pod(pod)
        for uid in set(self.sandboxes) - seen:  # removed behind our back (force delete)
            box = self.sandboxes.pop(uid)
            box.signal(signal.SIGKILL)
        for uid in set(self.reported) - seen:
            del self.reported[uid]

    def _sync_pod(self, pod: dict[str, Any]) -> None:
        meta, uid = pod["metadata"], pod["metadata"]["uid"]
        box = self.sandboxes.get(uid)
        terminal = pod.get("status", {}).get("phase") in ("Succeeded", "Failed")
        if meta.get("deletionTimestamp"):
            self._delete(pod, box)
            return
        if box is None and not terminal:
            box = self._start(pod)
        if box is None:
            return
        code = box.exit_code()
        if code is None:
            self._report(pod, box, "Running")
        else:
            self._report(pod, box, "Succeeded" if code == 0 else "Failed", code)

    def _volumes(self, pod: dict[str, Any], pod_dir: Path) -> dict[str, str]:
        ns, volumes = pod["metadata"]["namespace"], {}
        for volume in pod["spec"].get("volumes", []):
            if projected := volume.get("projected"):
                volumes[volume["name"]] = str(self._projected(pod, projected, pod_dir / "volumes" / volume["name"]))
            elif "emptyDir" in volume:
                volumes[volume["name"]] = "tmpfs"
            elif claim := volume.get("persistentVolumeClaim"):
                pvc = self.cluster.api("GET", f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{claim['claimName']}")
                pv = self.cluster.api("GET", f"/api/v1/persistentvolumes/{pvc['spec']['volumeName']}")
                path = pv["spec"]["hostPath"]["path"]
                if not Path(path).exists():  # DirectoryOrCreate
                    self.created_dirs.add(path)
                Path(path).mkdir(parents=True, exist_ok=True)
                if self.slow is not None:
                    self.slow.serve(ns, claim["claimName"], path)
                volumes[volume["name"]] = path
            elif host := volume.get("hostPath"):
                volumes[volume["name"]] = host["path"]
        return volumes

    def _projected(self, pod: dict[str, Any], projected: dict[str, Any], target: Path) -> Path:
        """A projected volume's files, as the kubelet writes them: a service-account token bound to this
        pod (TokenRequest), ConfigMap keys, downward API fields. Written once: the tokens live an hour
        and more (the API server extends kube-api-access tokens), longer than any run here."""
        meta, spec = pod["metadata"], pod["spec"]
        ns = meta["namespace"]
        files: dict[str, str] = {}
        for source in projected.get("sources", []):
            if token := source.get("serviceAccountToken"):
                request: dict[str, Any] = {"expirationSeconds": token.get("expirationSeconds", 3600),
                                           "boundObjectRef": {"kind": "Pod", "apiVersion": "v1",
                                                              "name": meta["name"], "uid": meta["uid"]}}
                if token.get("audience"):
                    request["audiences"] = [token["audience"]]
                sa = spec.get("serviceAccountName") or "default"
                review = self.cluster.api("POST", f"/api/v1/namespaces/{ns}/serviceaccounts/{sa}/token", {
                    "apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": request})
                files[token["path"]] = review["status"]["token"]
            elif ref := source.get("configMap"):
                data = self.cluster.api("GET", f"/api/v1/namespaces/{ns}/configmaps/{ref['name']}").get("data") or {}
                for item in ref.get("items") or [{"key": k, "path": k} for k in data]:
                    files[item["path"]] = data[item["key"]]  # KeyError: not published yet, retry
            elif downward := source.get("downwardAPI"):
                fields = {"metadata.namespace": ns, "metadata.name": meta["name"], "metadata.uid": meta["uid"]}
                for item in downward.get("items", []):
                    files[item["path"]] = fields[item["fieldRef"]["fieldPath"]]
        target.mkdir(parents=True, exist_ok=True)
        for path, content in files.items():
            (target / path).parent.mkdir(parents=True, exist_ok=True)
            (target / path).write_text(content)
        return target

    def _start(self, pod: dict[str, Any]) -> PodSandbox | None:
        meta = pod["metadata"]
        pod_dir = self.workdir / f"{meta['name']}-{meta['uid'][:8]}"
        try:
            # A claim not yet bound, a root CA not yet published: retry on the next sync, as kubelet does.
            volumes = self._volumes(pod, pod_dir)
        except (KeyError, RuntimeError, TypeError):
            self._report(pod, None, "Pending")
            return None
        box = PodSandbox(pod, self.ip, self.netns, pod_dir, extra_env=self.extra_env)
        box.start(volumes)
        self.sandboxes[pod["metadata"]["uid"]] = box
        return box

    def _delete(self, pod: dict[str, Any], box: PodSandbox | None) -> None:
        meta = pod["metadata"]
        if box is not None and box.exit_code() is None:
            if not box.killed:
                box.killed = True
                box.signal(signal.SIGTERM)
                box.terminated_at = time.monotonic()
            # Read at every sync: a second delete may shorten the grace period (as kubelet honours).
            if time.monotonic() < box.terminated_at + meta.get("deletionGracePeriodSeconds", 30):
                return
            box.signal(signal.SIGKILL)
            assert box.proc is not None
            with contextlib.suppress(subprocess.TimeoutExpired):
                box.proc.wait(10)
        if box is not None and (code := box.exit_code()) is not None:
            self._report(pod, box, "Succeeded" if code == 0 else "Failed", code)
        elif pod.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            self._report(pod, None, "Failed", 137)
        self.sandboxes.pop(meta["uid"], None)
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}"
        with contextlib.suppress(RuntimeError):  # gone already, or uid changed
            self.cluster.api("DELETE", path, {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0,
                                              "preconditions": {"uid": meta["uid"]}})

    def _report(self, pod: dict[str, Any], box: PodSandbox | None, phase: str, code: int | None = None) -> None:
        meta, now = pod["metadata"], _now()
        name = pod["spec"]["containers"][0]["name"]
        ready = "True" if phase == "Running" else "False"
        if code is not None:
            state: dict[str, Any] = {"terminated": {
                "exitCode": code, "reason": "Completed" if code == 0 else "Error",
                "message": box.message(code) if box else "", "startedAt": box.started_at if box else now,
                "finishedAt": (box.finished_at if box else "") or now}}
        elif phase == "Running":
            state = {"running": {"startedAt": box.started_at if box else now}}
        else:
            state = {"waiting": {"reason": "ContainerCreating"}}
        status: dict[str, Any] = {
            "phase": phase, "hostIP": self.ip, "hostIPs": [{"ip": self.ip}], "podIP": self.ip,
            "podIPs": [{"ip": self.ip}], "startTime": (box.started_at if box else "") or now,
            "conditions": [{"type": t, "status": s, "lastTransitionTime": now} for t, s in (
                ("PodReadyToStartContainers", "True"), ("Initialized", "True"), ("Ready", ready),
                ("ContainersReady", ready))],
            "containerStatuses": [{"name": name, "image": pod["spec"]["containers"][0].get("image", ""),
                                   "imageID": "", "ready": ready == "True", "restartCount": 0,
                                   "started": phase == "Running", "state": state}],
        }
        # Compare without timestamps, so an unchanged pod costs no write.
        key = json.dumps([phase, code, ready, state.get("terminated", {}).get("message")])
        if self.reported.get(meta["uid"]) == key:
            return
        path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status"
        try:
            self.cluster.api("PATCH", path, {"metadata": {"uid": meta["uid"]}, "status": status},
                             content_type="application/strategic-merge-patch+json")
            self.reported[meta["uid"]] = key
        except RuntimeError as exc:
            self.errors.append(f"status of {meta['name']}: {exc}")


# --- a set of nodes with DNS -----------------------------------------------------------------------

class AgentNodes:
    """N agent nodes and CoreDNS on one cluster; `stop()` removes everything (processes, netns, bridge)."""

    def __init__(self, cluster: LocalCluster, count: int = 3, workdir: Path | None = None, prefix: str = "p5-agent",
                 extra_env: dict[str, str] | None = None, cpu: int = 1):
        """`count` p5-shaped agents and `cpu` CPU-shaped ones (where RTJ coordinators prefer to run)."""
        self.cluster = cluster
        self.workdir = workdir or (cluster.workdir or Path("/tmp")) / "agents"  # type: ignore[operator]
        self.volumes: set[str] = set()  # hostPath volumes the agents created, removed on stop
        self.agents = [NodeAgent(cluster, f"{prefix}-{i}", i, self.workdir, extra_env=extra_env,
                                 created_dirs=self.volumes) for i in range(count)]
        self.agents += [NodeAgent(cluster, f"cpu-agent-{i}", count + i, self.workdir, extra_env=extra_env,
                                  created_dirs=self.volumes, cpu=True) for i in range(cpu)]
        self.dns = ClusterDNS(cluster, self.workdir / "coredns")
        self.relay = ApiRelay(cluster.api_port)
        # Claims a test gives real-size timing (SlowClaims.want), before its pods start.
        self.slow = SlowClaims(self.volumes)
        for agent in self.agents:
            agent.relay, agent.slow = self.relay, self.slow

    def start(self) -> AgentNodes:
        # The bridge, the namespaces and the node IPs are the host's: one set of agents at a time (a
        # second test run, in another checkout, waits here rather than tearing down this one's network).
        self._lock = open(LOCK_PATH, "w")
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        try:
            Network.up()
            self.relay.start()
            self.dns.start()
            for agent in self.agents:
                agent.start()
        except BaseException:
            self.stop()
            raise
        return self

    def enforce_network_policies(self) -> Enforcer:
        """NetworkPolicy ingress enforced in every agent's network namespace (netpol.py: a stand-in for the
        cluster's engine) until `enforcer.stop()` or the agents stop; returns once the first rules are on."""
        from .netpol import Enforcer

        self.enforcer = Enforcer(self.cluster.api, [(a.netns, a.name, a.ip) for a in self.agents], BRIDGE_IP).start()
        if not self.enforcer.synced.wait(30):
            raise TimeoutError("the NetworkPolicy enforcer did not sync in 30 s")
        return self.enforcer

    def stop(self) -> None:
        if getattr(self, "enforcer", None) is not None:
            with contextlib.suppress(Exception):
                self.enforcer.stop()
        for agent in self.agents:
            with contextlib.suppress(Exception):
                agent.stop()
        self.slow.stop()
        self.dns.stop()
        self.relay.stop()
        Network.down()
        for path in self.volumes:
            shutil.rmtree(path, ignore_errors=True)
        lock, self._lock = getattr(self, "_lock", None), None
        if lock is not None:
            lock.close()  # releases the flock

    def by_name(self, name: str) -> NodeAgent:
        return next(a for a in self.agents if a.name == name)

    def running(self, namespace: str) -> list[str]:
        """Names of the pods of `namespace` whose processes still run on some node."""
        return [box.pod["metadata"]["name"] for agent in self.agents for box in list(agent.sandboxes.values())
                if box.pod["metadata"]["namespace"] == namespace and box.exit_code() is None]

    def kill_namespace(self, namespace: str, timeout: float = 60.0) -> None:
        """Delete the namespace and its pods with no grace period, and wait until none of their processes
        runs. Pods on one node share its network namespace (as with hostNetwork), so what one test leaves
        running (up to the pods' 120 s grace period) would hold the ports of the next test's pods."""
        self.cluster.api("DELETE", f"/api/v1/namespaces/{namespace}", missing_ok=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pods = self.cluster.api("GET", f"/api/v1/namespaces/{namespace}/pods")["items"]
            for pod in pods:
                with contextlib.suppress(RuntimeError):
                    if pod["metadata"].get("finalizers"):  # the Job's tracking finalizer: its Job is going too
                        self.cluster.api("PATCH", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                                         {"metadata": {"finalizers": None}},
                                         content_type="application/merge-patch+json")
                    self.cluster.api("DELETE", f"/api/v1/namespaces/{namespace}/pods/{pod['metadata']['name']}",
                                     {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0},
                                     missing_ok=True)
            if not pods and not self.running(namespace):
                return
            time.sleep(0.5)
        raise RuntimeError(f"pods of {namespace} still running after {timeout:.0f}s: {self.running(namespace)}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rtj_dev.nodeagent", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="run agent nodes and CoreDNS on a running local cluster until interrupted")
    up.add_argument("--cluster", type=Path, required=True, help="the --dir of `localcluster up`")
    up.add_argument("--nodes", type=int, default=3)
    args = parser.parse_args(argv)
    nodes = AgentNodes(LocalCluster.attach(args.cluster), args.nodes).start()
    print(f"{args.nodes} agent nodes up: {', '.join(a.name + '=' + a.ip for a in nodes.agents)}; DNS {BRIDGE_IP}",
          flush=True)
    def stop() -> None:
        nodes.stop()
        shutil.rmtree(nodes.workdir, ignore_errors=True)

    serve_until_stopped(stop)


if __name__ == "__main__":
    main()
