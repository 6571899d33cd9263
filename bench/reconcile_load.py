"""Operator load benchmark (`make bench-operator`) on the local control plane.

The real kube-apiserver, etcd, controller-manager, scheduler and kwok nodes (hack/rtj_dev); the
operator runs as its own process (`python -m rtj_operator`) with the chart's ServiceAccount token,
so its CPU time and memory are its own and every request it sends (kopf's watches included) is in
the API server's audit log. The harness watches (one RTJ watch, one pod watch) instead of polling,
and prints its own CPU beside the operator's: on 2 cores, what the harness burns is taken from both.

For each N, in one run and each phase on a quiet cluster (the previous phase's pods gone):
1. the floor: N bare Indexed Jobs (2 pods each) and headless Services created directly, timed to all
   pods Running: what the control plane itself costs. They are the operator's own builders' Job and
   Service without the operator's scheduling gate (nothing would release it) and under another
   managed-by label (the operator's label-selected watches never see them);
2. N RTJs x 2 nodes through the operator, timed from each create to Created=True and to both pods
   Running (as the floor is timed; the RTJ's own Running status follows);
3. steady state: a minute with all N Running, API requests and CPU of the operator per RTJ;
4. pod failures one at a time (kwok's exit stage), timed from the pod Failed to jobRestarts moving
   in the RTJ's status, with N RTJs present.
A second table says where the time to Running went, for the floor and the operator: from each create
to both pods made by the Job controller, free of the operator's scheduling gate, bound, Running.

`--operator-src DIR` runs another checkout's operator (e.g. a git worktree of an older commit, with its
own CRD) in the same run after this one's, so before and after sit side by side.

`--targets` checks issue 9's load targets instead: with R Running and P Pending RTJs, how long a
pod failure takes to be counted in status; and how long until A freshly applied RTJs all have status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from rtj_dev.localcluster import ROOT, LocalCluster
from rtj_operator import api
from rtj_operator.builders import build_job, build_service
from rtj_operator.kube import Kube, configure
from rtj_operator.spec import RTJ, with_defaults

TOOLS = ROOT / ".tools" / "bin"
SA_USER = "system:serviceaccount:rtj-system:rtj-operator"
# CPU pods (many fit a node); they tolerate the p5 nodes' GPU taint, as examples/rtj-local.yaml does.
# No coordinator pod: like for like with the floor's bare Job and Service (a coordinator is one more pod
# per RTJ, on the CPU node).
SPEC = {"image": "worker:1", "nodes": {"count": 2}, "gpusPerNode": 0, "efaPerNode": 0,
        "storage": {"existingClaim": "shared"}, "coordinator": {"enabled": False},
        "placement": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}
Key = tuple[str, str]
FLOOR_MANAGER = "rtj-bench-floor"  # the floor's managed-by label: not the operator's


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] if ordered else float("nan")


class OperatorProcess:
    def __init__(self, cluster: LocalCluster, src: Path = ROOT):
        kubeconfig = cluster.kubeconfig_for("rtj-system", "rtj-operator", Path(tempfile.mkdtemp()) / "operator")
        self.log = open(Path(tempfile.gettempdir()) / "rtj-bench-operator.log", "ab")
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "PYTHONPATH": f"{src / 'operator'}:{src / 'worker'}"}
        self.proc = subprocess.Popen([sys.executable, "-m", "rtj_operator", "--metrics-port", "0", "--liveness", ""],
                                     env=env, stdout=self.log, stderr=subprocess.STDOUT)

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def memory_mb(self, key: str = "VmHWM") -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            print("the operator did not stop within 120 s of SIGTERM: killed", file=sys.stderr)
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def operator_of(cluster: LocalCluster, src: Path) -> OperatorProcess:
    """The operator of checkout `src`, started; another checkout's with its own CRD first (its status schema:
    an older operator's status fields would otherwise be pruned by this one's); the chart's RBAC stays."""
    if src != ROOT:
        subprocess.run([str(TOOLS / "kubectl"), "apply", "--server-side", "--force-conflicts", "-f",
                        str(src / "crds")], env=cluster.env(), check=True, capture_output=True)
    return OperatorProcess(cluster, src)


def add_operator_src(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--operator-src", type=Path, default=None,
                        help="another checkout whose operator runs after this one's (before/after in one run)")


def sources_of(args: argparse.Namespace) -> list[tuple[str, Path]]:
    """This checkout's operator, then --operator-src's."""
    return [("this", ROOT)] + ([("other", args.operator_src.resolve())] if args.operator_src else [])


class Watch:
    """The objects behind one API path, kept current by a watch (relisting when it expires); every
    event is handed to `on_event(type, obj, seen_at)` on the watch's thread."""

    def __init__(self, cluster: LocalCluster, path: str, on_event: Callable[[str, dict[str, Any], float], None]):
        self.cluster, self.path, self.on_event = cluster, path, on_event
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        known: dict[str, dict[str, Any]] = {}  # uid -> last copy
        while not self._stop.is_set():
            try:
                listed = self.cluster.api("GET", self.path)
            except (RuntimeError, OSError):
                time.sleep(1)  # e.g. 429 while a just-installed CRD's storage initializes
                continue
            now = time.monotonic()
            # What went while no watch was open shows only as missing from the LIST.
            present = {obj["metadata"]["uid"] for obj in listed["items"]}
            for uid in [u for u in known if u not in present]:
                self.on_event("DELETED", known.pop(uid), now)
            for obj in listed["items"]:
                known[obj["metadata"]["uid"]] = obj
                self.on_event("ADDED", obj, now)
            version = listed["metadata"]["resourceVersion"]
            try:
                for event in self.cluster.watch(self.path, version):
                    obj = event["object"]
                    if event["type"] == "DELETED":
                        known.pop(obj["metadata"].get("uid", ""), None)
                    elif event["type"] != "BOOKMARK":
                        known[obj["metadata"]["uid"]] = obj
                    if event["type"] != "BOOKMARK":
                        self.on_event(event["type"], obj, time.monotonic())
                    version = obj["metadata"].get("resourceVersion") or version
                    if self._stop.is_set():
                        return
            except (RuntimeError, OSError):
                continue  # expired (410) or dropped: relist

    def stop(self) -> None:
        self._stop.set()


class Observer:
    """What the benchmark times, from the two watches."""

    def __init__(self, cluster: LocalCluster):
        self.lock = threading.Lock()
        self.created: dict[Key, float] = {}  # RTJ -> first seen with Created=True
        self.running: dict[Key, float] = {}  # RTJ -> first seen Running
        self.restarts: dict[Key, tuple[int, float]] = {}  # RTJ -> (jobRestarts, when it was seen)
        self.pods: dict[str, dict[str, Any]] = {}  # uid -> pod
        self.pods_running: dict[Key, float] = {}  # RTJ or bare Job -> first seen with 2 pods Running
        self.failed: dict[str, float] = {}  # pod uid -> first seen Failed
        self._running: dict[Key, set[str]] = {}  # RTJ or bare Job -> uids of its Running pods
        # Where the time to Running goes, per RTJ or bare Job: first seen with 2 pods made (by the Job
        # controller), with 2 pods free of the operator's scheduling gate, with 2 pods bound to nodes.
        self.stages: dict[str, dict[Key, float]] = {"made": {}, "ungated": {}, "bound": {}}
        self._stage_pods: dict[str, dict[Key, set[str]]] = {s: {} for s in self.stages}
        self.changed = threading.Condition(self.lock)
        self._watches = [
            Watch(cluster, f"/apis/{api.GROUP}/{api.VERSION}/{api.PLURAL}", self._rtj),
            Watch(cluster, "/api/v1/pods?labelSelector=" + urllib.parse.quote(
                f"{api.LABEL_MANAGED_BY} in ({api.MANAGER},{FLOOR_MANAGER})"), self._pod)]

    def _rtj(self, kind: str, obj: dict[str, Any], now: float) -> None:
        key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
        status = obj.get("status") or {}
        with self.lock:
            if key not in self.created and any(c["type"] == "Created" and c["status"] == "True"
                                              for c in status.get("conditions") or []):
                self.created[key] = now
            if key not in self.running and status.get("phase") == "Running":
                self.running[key] = now
            restarts = int(status.get("jobRestarts") or 0)
            if restarts != self.restarts.get(key, (0, 0.0))[0]:
                self.restarts[key] = (restarts, now)
            self.changed.notify_all()

    def _pod(self, kind: str, obj: dict[str, Any], now: float) -> None:
        meta = obj["metadata"]
        uid, key = meta["uid"], (meta["namespace"], (meta.get("labels") or {}).get(api.LABEL_NAME, ""))
        live = obj["status"].get("phase") == "Running" and not meta.get("deletionTimestamp")
        with self.lock:
            if kind == "DELETED":
                self.pods.pop(uid, None)
            else:
                self.pods[uid] = obj
                if obj["status"].get("phase") == "Failed":
                    self.failed.setdefault(uid, now)
            running = self._running.setdefault(key, set())
            if live and kind != "DELETED":
                running.add(uid)
            else:
                running.discard(uid)
            if key not in self.pods_running and len(running) >= 2:
                self.pods_running[key] = now
            if kind != "DELETED" and not meta.get("deletionTimestamp"):
                spec = obj.get("spec") or {}
                gated = any(g.get("name") == api.SCHEDULING_GATE for g in spec.get("schedulingGates") or [])
                for stage, reached in (("made", True), ("ungated", not gated), ("bound", bool(spec.get("nodeName")))):
                    pods = self._stage_pods[stage].setdefault(key, set())
                    if reached:
                        pods.add(uid)
                    if key not in self.stages[stage] and len(pods) >= 2:
                        self.stages[stage][key] = now
            self.changed.notify_all()

    def wait(self, done: Callable[[], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.lock:
            while not done():
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 1.0))
            return True

    def pods_in(self, namespaces: set[str]) -> int:
        return sum(1 for p in self.pods.values() if p["metadata"]["namespace"] in namespaces)

    def stop(self) -> None:
        for w in self._watches:
            w.stop()


def operator_requests(cluster: LocalCluster, since: float, until: float | None = None) -> int:
    count = 0
    for line in cluster.audit_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("user", {}).get("username") == SA_USER and event.get("stage") == "ResponseComplete":
            stamp = time.mktime(time.strptime(event["stageTimestamp"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
            if stamp >= since and (until is None or stamp < until):
                count += 1
    return count


def namespaces(cluster: LocalCluster, kube: Kube, prefix: str, count: int) -> list[str]:
    names = [f"{prefix}-{i:02d}" for i in range(count)]
    for name in names:
        cluster.api("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        kube.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "metadata": {"name": "shared", "namespace": name},
                     "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "fsx-sc",
                              "resources": {"requests": {"storage": "1200Gi"}}}})
    return names


def clear(cluster: LocalCluster, observer: Observer, ns_names: list[str], timeout: float = 600) -> None:
    """Delete what a phase made and wait until its pods are gone: the next phase starts on a quiet
    cluster. RTJs first (else the operator makes their Jobs again), then the Jobs (their pods go with
    them), and the namespaces only once the pods are gone: deleted with their namespace, the Jobs kept
    their Failed pods with the tracking finalizer and the namespaces stayed Terminating (seen at
    N=100; most likely the Job controller failing to replace pods in a terminating namespace)."""
    background = {"kind": "DeleteOptions", "apiVersion": "v1", "propagationPolicy": "Background"}
    for ns in ns_names:
        cluster.api("DELETE", f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{ns}/{api.PLURAL}", background)
        cluster.api("DELETE", f"/apis/batch/v1/namespaces/{ns}/jobs", background)
    if not observer.wait(lambda: observer.pods_in(set(ns_names)) == 0, timeout):
        print(f"warning: pods of {len(ns_names)} namespaces still there after {timeout:.0f} s", file=sys.stderr)
    for ns in ns_names:
        cluster.api("DELETE", f"/api/v1/namespaces/{ns}", missing_ok=True)


def in_parallel(items: list[Any], work: Callable[[Any], None], threads: int = 8) -> None:
    chunks = [items[t::threads] for t in range(threads)]
    workers = [threading.Thread(target=lambda c=c: [work(i) for i in c]) for c in chunks]
    for w in workers:
        w.start()
    for w in workers:
        w.join()


def bare(obj: dict[str, Any]) -> dict[str, Any]:
    """The floor's copy of a child the operator builds: without the operator's scheduling gate, which
    only the operator releases, and with FLOOR_MANAGER as its managed-by label, so that the operator's
    watches (selected by its own label) never see it and the floor costs the operator nothing."""
    spec = obj.get("spec") or {}
    template = spec.get("template") or {}
    for labels in (obj["metadata"].get("labels"), (template.get("metadata") or {}).get("labels"),
                   spec.get("selector") if obj["kind"] == "Service" else None):
        if labels and api.LABEL_MANAGED_BY in labels:
            labels[api.LABEL_MANAGED_BY] = FLOOR_MANAGER
    if template.get("spec"):
        gates = [g for g in template["spec"].get("schedulingGates") or [] if g.get("name") != api.SCHEDULING_GATE]
        template["spec"]["schedulingGates"] = gates
        if not gates:
            del template["spec"]["schedulingGates"]
    return obj


def create_floor(kube: Kube, ns_names: list[str], n: int) -> dict[Key, float]:
    started: dict[Key, float] = {}
    lock = threading.Lock()

    def one(i: int) -> None:
        ns = ns_names[i % len(ns_names)]
        rtj = RTJ.from_body({"apiVersion": api.API_VERSION, "kind": api.KIND,
                             "metadata": {"name": f"bare-{i:04d}", "namespace": ns, "uid": f"bare-{i}"},
                             "spec": with_defaults(json.loads(json.dumps(SPEC)))})
        kube.create(bare(build_service(rtj)))
        kube.create(bare(build_job(rtj)))
        with lock:
            started[(ns, f"bare-{i:04d}")] = time.monotonic()

    in_parallel(list(range(n)), one)
    return started


def create_rtjs(kube: Kube, ns_names: list[str], n: int, prefix: str, spec: dict | None = None) -> dict[Key, float]:
    started: dict[Key, float] = {}
    lock = threading.Lock()

    def one(i: int) -> None:
        ns, name = ns_names[i % len(ns_names)], f"{prefix}-{i:04d}"
        kube.create({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name, "namespace": ns},
                     "spec": spec or SPEC})
        with lock:
            started[(ns, name)] = time.monotonic()

    in_parallel(list(range(n)), one)
    return started


def since(start: dict[Key, float], seen: dict[Key, float]) -> list[float]:
    return [seen[k] - t for k, t in start.items() if k in seen]


def failure_latencies(kube: Kube, observer: Observer, keys: list[Key], samples: int) -> list[float]:
    """Pods failing one at a time, in different RTJs: seconds from the pod Failed to jobRestarts moving."""
    out = []
    for key in keys[:samples]:
        ns, name = key
        with observer.lock:
            pod = next(p for p in observer.pods.values() if p["metadata"]["namespace"] == ns
                       and p["metadata"]["labels"].get(api.LABEL_NAME) == name
                       and p["status"].get("phase") == "Running")
            before = observer.restarts.get(key, (0, 0.0))[0]
        uid = pod["metadata"]["uid"]
        kube.patch("Pod", pod["metadata"]["name"], ns, {"metadata": {"annotations": {"kwok.rtj.dev/exit-code": "1"}}})

        def counted(key: Key = key, before: int = before, uid: str = uid) -> bool:
            return observer.restarts.get(key, (0, 0.0))[0] > before and uid in observer.failed

        if observer.wait(counted, timeout=120):
            out.append(observer.restarts[key][1] - observer.failed[uid])
    return out


@contextlib.contextmanager
def local_cluster(nodes: int, observer_type: type[Observer] | None = None,
                  **options: Any) -> Iterator[tuple[LocalCluster, Kube, Observer]]:
    """A local control plane with the chart installed (the operator runs as its own process, below);
    `options`: LocalCluster's."""
    with LocalCluster(nodes=nodes, **options) as cluster:
        kube = Kube(configure(cluster.server, token=cluster.admin_token, ca_file=str(cluster.ca_file)))
        subprocess.run([str(TOOLS / "helm"), "install", "rtj-operator", str(ROOT / "charts" / "rtj-operator"), "-n",
                        "rtj-system", "--create-namespace", "--set", "replicaCount=0", "--wait"], env=cluster.env(),
                       check=True, capture_output=True)
        observer = (observer_type or Observer)(cluster)
        try:
            yield cluster, kube, observer
        finally:
            observer.stop()


def print_header(nodes: int) -> None:
    print(f"rtj-operator on the local control plane (kube-apiserver/etcd/controller-manager/scheduler v1.37.2, "
          f"{nodes} kwok nodes), operator as its own process, 2-core machine; times per RTJ from its create; "
          "each phase on a quiet cluster")
    print("| operator | RTJs x 2 nodes | children created p50 / p99 | all pods Running p50 / p99 | bare Job+Service "
          "Running p50 / p99 | ratio p50 / p99 | last Running (operator / bare) | operator CPU s per RTJ (rise) "
          "| API requests per RTJ (rise) | steady state per RTJ per minute: requests, CPU ms | pod failure "
          "counted p50 / p99 / max | operator peak RSS | harness CPU s (rise / all phases) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|", flush=True)


def print_row(r: dict) -> None:
    """One size's row, printed as soon as it is measured (a long run shows what it has so far)."""
    c, run, b, f, n = r["created"], r["running"], r["floor"], r["failures"], r["n"]
    print(f"| {r['label']} | {n} ({len(run)} Running) | {pct(c, 50):.1f} / {pct(c, 99):.1f} s "
          f"| {pct(run, 50):.1f} / {pct(run, 99):.1f} s | {pct(b, 50):.1f} / {pct(b, 99):.1f} s "
          f"| {pct(run, 50) / max(pct(b, 50), 1e-9):.2f} / {pct(run, 99) / max(pct(b, 99), 1e-9):.2f} "
          f"| {r['wall']:.0f} / {r['floor_wall']:.0f} s | {r['cpu'] / n:.3f} | {r['requests'] / n:.1f} "
          f"| {r['steady_requests'] / n:.2f}, {1000 * r['steady_cpu'] / n:.1f} "
          f"| {pct(f, 50):.2f} / {pct(f, 99):.2f} / {max(f, default=float('nan')):.2f} s ({len(f)}) "
          f"| {r['rss']:.0f} MB | {r['harness']:.0f} / {r['harness_all']:.0f} |", flush=True)


def stage_row(label: str, n: int, start: dict[Key, float], observer: Observer,
              created: dict[Key, float] | None) -> str:
    """Where the time to all pods Running went: p50 (p99) seconds from each create to each stage."""
    def cell(seen: dict[Key, float]) -> str:
        times = since(start, seen)
        return f"{pct(times, 50):.1f} ({pct(times, 99):.1f})" if times else "-"
    return (f"| {label} | {n} | {cell(created) if created is not None else '0 (made directly)'} "
            f"| {cell(observer.stages['made'])} | {cell(observer.stages['ungated'])} "
            f"| {cell(observer.stages['bound'])} | {cell(observer.pods_running)} |")


def run_sizes(sizes: list[int], nodes: int, samples: int, sources: list[tuple[str, Path]]) -> None:
    print_header(nodes)
    stages: list[str] = []
    with local_cluster(nodes) as (cluster, kube, observer):
        for label, src in sources:
            operator = operator_of(cluster, src)
            try:
                for n in sizes:
                    harness0 = time.process_time()
                    floor_ns = namespaces(cluster, kube, f"floor-{label}-{n}", 10)
                    floor_start = create_floor(kube, floor_ns, n)
                    observer.wait(lambda s=floor_start: all(k in observer.pods_running for k in s), 120 + 2 * n)
                    floor = since(floor_start, observer.pods_running)
                    stages.append(stage_row(f"bare Job+Service ({label}'s run)", n, floor_start, observer, None))
                    floor_wall = max(floor) if floor else float("nan")
                    clear(cluster, observer, floor_ns)

                    ns_names = namespaces(cluster, kube, f"op-{label}-{n}", 10)
                    wall0, cpu0, harness1 = time.time(), operator.cpu_seconds(), time.process_time()
                    start = create_rtjs(kube, ns_names, n, "job")
                    observer.wait(lambda s=start: all(k in observer.running and k in observer.pods_running
                                                      for k in s), 120 + 2 * n)
                    running = since(start, observer.pods_running)
                    created = since(start, observer.created)
                    cpu_rise = operator.cpu_seconds() - cpu0
                    requests_rise = operator_requests(cluster, wall0)
                    harness_rise = time.process_time() - harness1

                    steady0, cpu1 = time.time(), operator.cpu_seconds()
                    time.sleep(60)
                    steady_requests = operator_requests(cluster, steady0, time.time())
                    steady_cpu = operator.cpu_seconds() - cpu1

                    stages.append(stage_row(label, n, start, observer, observer.created))
                    latencies = failure_latencies(kube, observer, sorted(start), samples)
                    print_row({"label": label, "n": n, "created": created, "running": running, "floor": floor,
                               "wall": max(running) if running else float("nan"), "floor_wall": floor_wall,
                               "cpu": cpu_rise, "requests": requests_rise, "steady_requests": steady_requests,
                               "steady_cpu": steady_cpu, "rss": operator.memory_mb(), "failures": latencies,
                               "harness": harness_rise, "harness_all": time.process_time() - harness0})
                    clear(cluster, observer, ns_names)
            finally:
                operator.stop()
    print("\nWhere the time to Running goes: seconds from each create, p50 (p99), to the Job's Service and Job made"
          " (Created=True), its 2 pods made by the Job controller, both free of the operator's scheduling gate, both"
          " bound by the scheduler, both Running")
    print("| operator | RTJs | children made | pods made | pods ungated | pods bound | pods Running |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(stages), flush=True)
def run_targets(running: int, pending: int, fresh: int, nodes: int, samples: int) -> None:
    """Issue 9.10: a pod failure among running+pending RTJs counted within 2 s; `fresh` RTJs all with
    status within 2 minutes."""
    with local_cluster(nodes) as (cluster, kube, observer):
        operator = OperatorProcess(cluster)
        try:
            ns_names = namespaces(cluster, kube, "load", 10)
            run_start = create_rtjs(kube, ns_names, running, "run")
            # Pending for good: no node of this instance type exists.
            pend_spec = {**SPEC, "placement": {**SPEC["placement"], "instanceType": "p4d.24xlarge"}}
            create_rtjs(kube, ns_names, pending, "pend", spec=pend_spec)
            observer.wait(lambda: all(k in observer.running for k in run_start), 120 + running)
            counted = failure_latencies(kube, observer, sorted(run_start), samples)
            fresh_ns = namespaces(cluster, kube, "fresh", 10)
            started = time.monotonic()
            fresh_start = create_rtjs(kube, fresh_ns, fresh, "new", spec=pend_spec)
            observer.wait(lambda: all(k in observer.restarts or k in observer.created or k in observer.running
                                      for k in fresh_start), 600)
            with_status = {(o["metadata"]["namespace"], o["metadata"]["name"])
                           for o in kube.list(api.KIND) if (o.get("status") or {}).get("phase")}
            all_status = time.monotonic() - started
        finally:
            operator.stop()
    print("| target | measured |\n|---|---|")
    print(f"| pod failure counted after the pod is Failed, {running} Running + {pending} Pending RTJs "
          f"(target < 2 s), {len(counted)} failures | median {pct(counted, 50):.2f} s, max "
          f"{max(counted, default=float('nan')):.2f} s |")
    print(f"| {fresh} new RTJs all with status, {running + pending} already there (target < 120 s) "
          f"| {all_status:.0f} s ({len(with_status & set(fresh_start))}/{fresh}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,500,1000", help="comma-separated N (RTJs x 2 nodes)")
    parser.add_argument("--nodes", type=int, default=24, help="kwok nodes (110 pods each)")
    parser.add_argument("--samples", type=int, default=20, help="pod failures timed")
    add_operator_src(parser)
    parser.add_argument("--targets", action="store_true", help="issue 9's load targets instead of sizes")
    parser.add_argument("--running", type=int, default=500)
    parser.add_argument("--pending", type=int, default=500)
    parser.add_argument("--fresh", type=int, default=1000)
    args = parser.parse_args()
    if args.targets:
        run_targets(args.running, args.pending, args.fresh, args.nodes, args.samples)
        return
    sources = sources_of(args)
    run_sizes([int(s) for s in args.sizes.split(",")], args.nodes, args.samples, sources)


if __name__ == "__main__":
    main()
