"""Operator load benchmark (`make bench-operator`) on the local control plane.

The real kube-apiserver, etcd, controller-manager, scheduler and kwok nodes (hack/rtj_dev); the
operator runs as its own process (`python -m rtj_operator`) with the chart's ServiceAccount token,
so its CPU time and memory are its own and every request it sends (kopf's watches included) is in
the API server's audit log.

For each N: N RTJs x 2 nodes are applied; per RTJ, the time from its create to all children created
(condition Created=True) and to all its pods Running (phase Running). In the same run, the floor:
N bare Indexed Jobs (2 pods each) and headless Services created directly by a client, timed to
all pods Running, so the operator's overhead is a ratio to what the control plane itself costs.

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
from collections.abc import Iterator
from pathlib import Path

from rtj_dev.localcluster import ROOT, LocalCluster
from rtj_operator import api
from rtj_operator.builders import build_job, build_service
from rtj_operator.kube import Kube, configure
from rtj_operator.spec import RTJ

TOOLS = ROOT / ".tools" / "bin"
SA_USER = "system:serviceaccount:rtj-system:rtj-operator"
# CPU pods (many fit a node); they tolerate the p5 nodes' GPU taint, as examples/rtj-local.yaml does.
SPEC = {"image": "worker:1", "nodes": {"count": 2}, "gpusPerNode": 0, "efaPerNode": 0,
        "storage": {"existingClaim": "shared"},
        "placement": {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]}}


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] if ordered else float("nan")


class OperatorProcess:
    def __init__(self, cluster: LocalCluster):
        kubeconfig = cluster.kubeconfig_for("rtj-system", "rtj-operator", Path(tempfile.mkdtemp()) / "operator")
        self.log = open(Path(tempfile.gettempdir()) / "rtj-bench-operator.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-m", "rtj_operator", "--metrics-port", "0", "--liveness", ""],
                                     env={**os.environ, "KUBECONFIG": str(kubeconfig)}, stdout=self.log,
                                     stderr=subprocess.STDOUT)

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
            self.proc.wait(120)  # 2000 daemons finish their passes first
        except subprocess.TimeoutExpired:
            print("the operator did not stop within 120 s of SIGTERM: killed", file=sys.stderr)
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def operator_requests(cluster: LocalCluster, since: float) -> int:
    count = 0
    for line in cluster.audit_log.read_text().splitlines():
        event = json.loads(line)
        if event.get("user", {}).get("username") == SA_USER and event.get("stage") == "ResponseComplete":
            stamp = time.mktime(time.strptime(event["stageTimestamp"][:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone
            if stamp >= since:
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


def watch_rtjs(kube: Kube, names: dict[tuple[str, str], float], until: str, timeout: float) -> dict[str, list[float]]:
    """Polls all RTJs (one LIST) until every one reached `until`; per-RTJ seconds to Created and Running."""
    created: dict[tuple[str, str], float] = {}
    running: dict[tuple[str, str], float] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = time.monotonic()
        for obj in kube.list(api.KIND):
            key = (obj["metadata"]["namespace"], obj["metadata"]["name"])
            if key not in names:
                continue
            status = obj.get("status") or {}
            if key not in created and any(c["type"] == "Created" and c["status"] == "True"
                                          for c in status.get("conditions") or []):
                created[key] = now - names[key]
            if key not in running and status.get("phase") == until:
                running[key] = now - names[key]
        if len(running) == len(names):
            break
        time.sleep(0.5)
    return {"created": list(created.values()), "running": list(running.values())}


def floor(kube: Kube, ns_names: list[str], n: int, timeout: float) -> list[float]:
    """The control plane's own cost: bare Indexed Jobs + headless Services, timed to pods Running."""
    started: dict[str, float] = {}
    for i in range(n):
        ns = ns_names[i % len(ns_names)]
        rtj = RTJ.from_body({"apiVersion": api.API_VERSION, "kind": api.KIND,
                             "metadata": {"name": f"bare-{i:04d}", "namespace": ns, "uid": f"bare-{i}"},
                             "spec": _defaults(SPEC)})
        kube.create(build_service(rtj))
        job = build_job(rtj)
        job["metadata"]["labels"]["bench"] = "floor"
        kube.create(job)
        started[f"{ns}/bare-{i:04d}"] = time.monotonic()
    done: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(done) < n and time.monotonic() < deadline:
        now = time.monotonic()
        per_job: dict[str, int] = {}
        for pod in kube.list("Pod", labels={api.LABEL_MANAGED_BY: api.MANAGER}):
            key = f"{pod['metadata']['namespace']}/{pod['metadata']['labels'].get(api.LABEL_NAME)}"
            if key in started and pod["status"].get("phase") == "Running":
                per_job[key] = per_job.get(key, 0) + 1
        for key, count in per_job.items():
            if count >= 2 and key not in done:
                done[key] = now - started[key]
        time.sleep(0.5)
    return list(done.values())


def _defaults(spec: dict) -> dict:
    from rtj_operator.spec import with_defaults

    return with_defaults(json.loads(json.dumps(spec)))


def create_rtjs(kube: Kube, ns_names: list[str], n: int, prefix: str, spec: dict | None = None,
                threads: int = 8) -> dict[tuple[str, str], float]:
    names: dict[tuple[str, str], float] = {}
    lock = threading.Lock()

    def work(indices: range) -> None:
        for i in indices:
            ns, name = ns_names[i % len(ns_names)], f"{prefix}-{i:04d}"
            kube.create({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name, "namespace": ns},
                         "spec": spec or SPEC})
            with lock:
                names[(ns, name)] = time.monotonic()

    chunks = [range(t, n, threads) for t in range(threads)]
    workers = [threading.Thread(target=work, args=(c,)) for c in chunks]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return names


@contextlib.contextmanager
def operator_on_local_cluster(nodes: int) -> Iterator[tuple[LocalCluster, Kube, OperatorProcess]]:
    """A local control plane with the chart installed and the operator running as its own process."""
    with LocalCluster(nodes=nodes) as cluster:
        kube = Kube(configure(cluster.server, token=cluster.admin_token, ca_file=str(cluster.ca_file)))
        subprocess.run([str(TOOLS / "helm"), "install", "rtj-operator", str(ROOT / "charts" / "rtj-operator"), "-n",
                        "rtj-system", "--create-namespace", "--set", "replicaCount=0", "--wait"], env=cluster.env(),
                       check=True, capture_output=True)
        operator = OperatorProcess(cluster)
        try:
            yield cluster, kube, operator
        finally:
            operator.stop()


def run_sizes(sizes: list[int], nodes: int) -> None:
    rows = []
    with operator_on_local_cluster(nodes) as (cluster, kube, operator):
        for n in sizes:
            ns_names = namespaces(cluster, kube, f"op{n}", 10)
            since, cpu0 = time.time(), operator.cpu_seconds()
            started = time.monotonic()
            names = create_rtjs(kube, ns_names, n, "job")
            times = watch_rtjs(kube, names, "Running", timeout=60 + n)
            wall = time.monotonic() - started
            cpu = operator.cpu_seconds() - cpu0
            requests = operator_requests(cluster, since)
            bare_ns = namespaces(cluster, kube, f"floor{n}", 10)
            floor_started = time.monotonic()
            bare = floor(kube, bare_ns, n, timeout=60 + n)
            floor_wall = time.monotonic() - floor_started
            rows.append((n, times, wall, cpu, requests, operator.memory_mb(), bare, floor_wall))
            for ns in ns_names + bare_ns:  # the next size starts from a quiet cluster
                cluster.api("DELETE", f"/api/v1/namespaces/{ns}", missing_ok=True)
            time.sleep(10)
    print(f"rtj-operator on the local control plane (kube-apiserver/etcd/controller-manager/scheduler v1.37.2, "
          f"{nodes} kwok nodes), operator as its own process, 2-core machine; times per RTJ from its create")
    print("| RTJs x 2 nodes | children created p50 / p99 | all pods Running p50 / p99 | bare Job+Service Running "
          "p50 / p99 | ratio p50 | all Running (operator / bare) | operator CPU s per RTJ | API requests per RTJ "
          "| operator peak RSS |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n, times, wall, cpu, requests, rss, bare, floor_wall in rows:
        c, r = times["created"], times["running"]
        print(f"| {n} ({len(r)} Running) | {pct(c, 50):.1f} / {pct(c, 99):.1f} s "
              f"| {pct(r, 50):.1f} / {pct(r, 99):.1f} s "
              f"| {pct(bare, 50):.1f} / {pct(bare, 99):.1f} s | {pct(r, 50) / max(pct(bare, 50), 1e-9):.2f} "
              f"| {wall:.0f} / {floor_wall:.0f} s | {cpu / n:.3f} | {requests / n:.1f} | {rss:.0f} MB |")


def run_targets(running: int, pending: int, fresh: int, nodes: int, samples: int = 5) -> None:
    """Issue 9.10: a pod failure among running+pending RTJs counted within 2 s; `fresh` RTJs all with
    status within 2 minutes."""
    with operator_on_local_cluster(nodes) as (cluster, kube, _operator):
        ns_names = namespaces(cluster, kube, "load", 10)
        run_names = create_rtjs(kube, ns_names, running, "run")
        # Pending for good: no node of this instance type exists.
        pend_spec = {**SPEC, "placement": {**SPEC["placement"], "instanceType": "p4d.24xlarge"}}
        create_rtjs(kube, ns_names, pending, "pend", spec=pend_spec)
        watch_rtjs(kube, run_names, "Running", timeout=120 + running)
        counted, kwok_part = [], []
        for ns, name in list(run_names)[:samples]:  # one pod failure at a time, in different RTJs
            pod = kube.list("Pod", ns, {api.LABEL_NAME: name})[0]
            asked_at = time.monotonic()
            kube.patch("Pod", pod["metadata"]["name"], ns, {"metadata": {"annotations": {
                "kwok.rtj.dev/exit-code": "1"}}})
            failed_at = None  # when the API server has the pod Failed (kwok's part is done)
            while (kube.get(api.KIND, name, ns).get("status") or {}).get("jobRestarts", 0) < 1:
                if failed_at is None and (kube.get("Pod", pod["metadata"]["name"], ns) or {}).get(
                        "status", {}).get("phase") == "Failed":
                    failed_at = time.monotonic()
                time.sleep(0.05)
            counted_at = time.monotonic()
            counted.append(counted_at - (failed_at or asked_at))
            kwok_part.append((failed_at or counted_at) - asked_at)
        fresh_ns = namespaces(cluster, kube, "fresh", 10)
        started = time.monotonic()
        fresh_names = create_rtjs(kube, fresh_ns, fresh, "new", spec=pend_spec)
        seen: set[tuple[str, str]] = set()
        while len(seen) < fresh and time.monotonic() - started < 600:
            seen = {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in kube.list(api.KIND)
                    if (o.get("status") or {}).get("phase")} & set(fresh_names)
            time.sleep(1)
        all_status = time.monotonic() - started
    print("| target | measured |\n|---|---|")
    print(f"| pod failure counted after the pod is Failed, {running} Running + {pending} Pending RTJs "
          f"(target < 2 s), {len(counted)} failures | median {pct(counted, 50):.2f} s, max {max(counted):.2f} s "
          f"(kwok took a median {pct(kwok_part, 50):.2f} s before that) |")
    print(f"| {fresh} new RTJs all with status, {running + pending} already there (target < 120 s) "
          f"| {all_status:.0f} s ({len(seen)}/{fresh}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,500", help="comma-separated N (RTJs x 2 nodes)")
    parser.add_argument("--nodes", type=int, default=24, help="kwok nodes (110 pods each)")
    parser.add_argument("--targets", action="store_true", help="issue 9's load targets instead of sizes")
    parser.add_argument("--running", type=int, default=500)
    parser.add_argument("--pending", type=int, default=500)
    parser.add_argument("--fresh", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=5, help="pod failures timed (--targets)")
    args = parser.parse_args()
    if args.targets:
        run_targets(args.running, args.pending, args.fresh, args.nodes, args.samples)
    else:
        run_sizes([int(s) for s in args.sizes.split(",")], args.nodes)


if __name__ == "__main__":
    main()
