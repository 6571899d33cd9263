"""What one big job costs the operator (`make bench-gang`, issue 29.8): one RTJ of N nodes on the local
control plane, every pod reporting its progress at the real rate.

The real kube-apiserver, etcd, controller-manager, scheduler and N kwok p5.48xlarge nodes (hack/rtj_dev,
with the kubelet's 40 s node lease instead of the tests' 4 s); the operator runs as its own process with
the chart's ServiceAccount token, so its CPU time and memory are its own and every request it sends is in
the API server's audit log. For each N, in one run (and for `--operator-src`, another checkout's operator
after this one's, on the same cluster, so before and after sit side by side):

1. one RTJ of N nodes (8 GPUs and 32 EFA per pod: one pod per node) and its coordinator, timed to all N
   pods Running;
2. steady state for `--seconds`: every pod's `rtj.dev/Progress` condition written as the worker's
   PodReporter writes it (rtj_worker.report: the pod hosting rank 0 every 15 s, the others every 300 s,
   each at its own phase, the step moving on), through the harness's admin credentials instead of each
   pod's bound token: the operator's CPU (cores), RSS, and API requests per second;
3. pod failures one at a time (kwok's exit stage, exit code 1, with the job Running again in between),
   timed from the pod Failed (the harness's pod watch) to the RTJ's status counting it (jobRestarts or
   disruptions moving, the harness's RTJ watch).

Simulated, and said here: the reports' writer (no ranks run on kwok nodes) and the nodes themselves.
The operator, the API server and the scheduler are the real ones. On 2 cores, the API server, etcd and
the harness share the cores with the operator: the latency column includes their queueing.

    RTJ_KUBE_BIN=$(bash hack/kube/build.sh) PYTHONPATH=operator:worker:hack:bench \\
        python bench/gang_load.py [--sizes 64,512,1000] [--seconds 120] [--samples 10] [--operator-src DIR]
"""

from __future__ import annotations

import argparse
import random
import threading
import time
from pathlib import Path
from typing import Any

from reconcile_load import (
    Observer,
    OperatorProcess,
    add_operator_src,
    local_cluster,
    namespaces,
    operator_of,
    operator_requests,
    pct,
    sources_of,
)

from rtj_dev.localcluster import LocalCluster
from rtj_operator import api
from rtj_operator.kube import Kube
from rtj_worker.report import FOLLOWER_SECONDS, INTERVAL_SECONDS, TRAINING, PodReporter

NAMESPACE = "gang-00"  # reconcile_load.namespaces' name for the first of "gang"
STEP_SECONDS = 2.0  # a step of the simulated job: what each report's step moves on by


def gang_spec(n: int) -> dict[str, Any]:
    # The budgets let every timed failure be charged (the simulated checkpoint step is not what they test).
    return {"image": "worker:1", "nodes": {"count": n}, "gpusPerNode": 8, "efaPerNode": 32,
            "storage": {"existingClaim": "shared"},
            "restartBudget": {"maxRestarts": 1000, "maxRestartsWithoutProgress": 1000}}


class Reporters:
    """Every Running pod's progress condition, at the worker's rates (module docstring, step 2)."""

    def __init__(self, kube: Kube, observer: Observer, name: str, seed: int = 1):
        self.kube, self.observer, self.name = kube, observer, name
        self.rng = random.Random(seed)
        self.writes = 0
        self.failures = 0
        self._due: dict[str, float] = {}  # pod uid -> when it writes next
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.started = time.time()

    def start(self) -> Reporters:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _pods(self) -> list[dict[str, Any]]:
        with self.observer.lock:
            return [p for p in self.observer.pods.values()
                    if (p["metadata"].get("labels") or {}).get(api.LABEL_NAME) == self.name
                    and (p["metadata"].get("labels") or {}).get(api.LABEL_COMPONENT) == "workers"
                    and p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            now = time.time()
            for pod in self._pods():
                meta = pod["metadata"]
                leader = (meta.get("annotations") or {}).get("batch.kubernetes.io/job-completion-index") == "0"
                every = INTERVAL_SECONDS if leader else FOLLOWER_SECONDS
                due = self._due.setdefault(meta["uid"], now + self.rng.uniform(0, every))
                if now < due:
                    continue
                self._due[meta["uid"]] = now + every
                self._write(pod, leader, now)

    def _write(self, pod: dict[str, Any], leader: bool, now: float) -> None:
        step = int((now - self.started) / STEP_SECONDS)
        report = {"v": 1, "state": TRAINING, "step": step, "stepAt": round(now, 2), "stepSeconds": STEP_SECONDS,
                  "ckpt": step - step % 100, "ckptAt": round(now, 2), "ckptSeconds": 30.0, "leader": leader,
                  "resumed": False, "runSince": round(self.started, 2), "inLoopSeconds": round(now - self.started, 2),
                  "restarts": {"inprocess": 0, "launcher": 0}, "causes": {}, "last": None, "copies": None}
        condition = PodReporter(None, None).condition({k: v for k, v in report.items() if v is not None}, now)  # type: ignore[arg-type]
        meta = pod["metadata"]
        try:
            self.kube.patch("Pod", meta["name"], meta["namespace"], {"metadata": {"uid": meta["uid"]},
                            "status": {"conditions": [condition]}}, subresource="status", strategic=True)
            self.writes += 1
        except Exception:
            self.failures += 1


def gang_running(observer: Observer, name: str, n: int) -> bool:
    running = [p for p in observer.pods.values() if (p["metadata"].get("labels") or {}).get(api.LABEL_NAME) == name
               and (p["metadata"].get("labels") or {}).get(api.LABEL_COMPONENT) == "workers"
               and p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
    return len(running) >= n


def counted(observer: Observer, key: tuple[str, str]) -> int:
    return observer.restarts.get(key, (0, 0.0))[0]


class GangObserver(Observer):
    """reconcile_load's observer, counting disruptions beside jobRestarts (a pod's failure is either)."""

    def _rtj(self, kind: str, obj: dict[str, Any], now: float) -> None:
        status = obj.get("status") or {}
        total = int(status.get("jobRestarts") or 0) + int(status.get("disruptions") or 0)
        super()._rtj(kind, {**obj, "status": {**status, "jobRestarts": total}}, now)


def failure_latencies(kube: Kube, observer: Observer, name: str, n: int, samples: int) -> list[float]:
    key, out = (NAMESPACE, name), []
    for i in range(samples):
        if not observer.wait(lambda: gang_running(observer, name, n), 300):
            print(f"warning: the gang was not Running again before failure {i + 1}")
            break
        with observer.lock:
            pods = sorted((p for p in observer.pods.values()
                           if (p["metadata"].get("labels") or {}).get(api.LABEL_NAME) == name
                           and (p["metadata"].get("labels") or {}).get(api.LABEL_COMPONENT) == "workers"
                           and p["status"].get("phase") == "Running"), key=lambda p: p["metadata"]["name"])
            pod = pods[(i * 7919 + 1) % len(pods)]
            before = counted(observer, key)
        uid = pod["metadata"]["uid"]
        kube.patch("Pod", pod["metadata"]["name"], NAMESPACE,
                   {"metadata": {"annotations": {"kwok.rtj.dev/exit-code": "1"}}})

        def done(uid: str = uid, before: int = before) -> bool:
            return counted(observer, key) > before and uid in observer.failed

        if observer.wait(done, 120):
            out.append(observer.restarts[key][1] - observer.failed[uid])
        else:
            print(f"warning: failure {i + 1} was not counted within 120 s")
    return out


def run(sizes: list[int], seconds: float, samples: int, sources: list[tuple[str, Path]]) -> None:
    biggest = max(sizes)
    print(f"One RTJ of N nodes, every pod reporting (rank 0's pod every {INTERVAL_SECONDS:.0f} s, the others every "
          f"{FOLLOWER_SECONDS:.0f} s); local control plane v1.37.2 with {biggest} kwok p5.48xlarge nodes, operator "
          f"as its own process, 2-core machine; steady state over {seconds:.0f} s")
    print("| operator | nodes | all pods Running | reports/s written | operator CPU (cores) | operator RSS now / peak "
          "| operator API requests/s | pod failure counted p50 / p99 / max |")
    print("|---|---|---|---|---|---|---|---|", flush=True)
    with local_cluster(biggest, GangObserver, node_lease_seconds=40, node_monitor_grace_seconds=50) as (
            cluster, kube, observer):
        namespaces(cluster, kube, NAMESPACE.rsplit("-", 1)[0], 1)  # NAMESPACE, with the claim "shared"
        for label, src in sources:
            operator = operator_of(cluster, src)
            try:
                for n in sizes:
                    print(measure(cluster, kube, observer, operator, label, n, seconds, samples), flush=True)
            finally:
                operator.stop()


def measure(cluster: LocalCluster, kube: Kube, observer: Observer, operator: OperatorProcess, label: str, n: int,
            seconds: float, samples: int) -> str:
    name = f"{label}-{n}"
    started = time.monotonic()
    kube.create({"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name, "namespace": NAMESPACE},
                 "spec": gang_spec(n)})
    if not observer.wait(lambda: gang_running(observer, name, n), 300 + n):
        return f"| {label} | {n} | not Running within {300 + n} s | | | | | |"
    to_running = time.monotonic() - started
    reporters = Reporters(kube, observer, name).start()
    time.sleep(min(30.0, seconds / 4))  # the first wave of reports (every pod's first) settles
    wall0, cpu0, writes0 = time.time(), operator.cpu_seconds(), reporters.writes
    time.sleep(seconds)
    wall = time.time() - wall0
    cpu, writes = operator.cpu_seconds() - cpu0, reporters.writes - writes0
    requests = operator_requests(cluster, wall0, wall0 + wall)
    rss = operator.memory_mb("VmRSS")
    latencies = failure_latencies(kube, observer, name, n, samples)
    reporters.stop()
    peak = operator.memory_mb()
    kube.delete(api.KIND, name, NAMESPACE)
    observer.wait(lambda: not any((p["metadata"].get("labels") or {}).get(api.LABEL_NAME) == name
                                  for p in observer.pods.values()), 600)
    return (f"| {label} | {n} | {to_running:.0f} s | {writes / wall:.2f} | {cpu / wall:.3f} "
            f"| {rss:.0f} / {peak:.0f} MB "
            f"| {requests / wall:.2f} | {pct(latencies, 50):.2f} / {pct(latencies, 99):.2f} / "
            f"{max(latencies, default=float('nan')):.2f} s ({len(latencies)}) |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64,512,1000", help="comma-separated N (nodes of the one RTJ)")
    parser.add_argument("--seconds", type=float, default=120.0, help="steady state measured per size")
    parser.add_argument("--samples", type=int, default=10, help="pod failures timed per size")
    add_operator_src(parser)
    args = parser.parse_args()
    run([int(s) for s in args.sizes.split(",")], args.seconds, args.samples, sources_of(args))


if __name__ == "__main__":
    main()
