"""Operator benchmark (`make bench-operator`): the real kopf operator reconciling 500 RTJs.

The emulated API server runs in a child process, so the memory figure is the operator's process
(kopf, handlers, clients) alone. Phases: create all RTJs and wait until every one has its
children (Created=True); let the simulated Job controller start their pods and wait until every
one is Running; then measure steady-state reconcile passes. Prints a table.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

from rtj_operator import api, controller
from rtj_operator.devcluster import JobSimulator, OperatorThread
from rtj_operator.kube import Kube, configure

ROOT = Path(__file__).resolve().parents[1]


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=500)
    parser.add_argument("--namespaces", type=int, default=50)
    parser.add_argument("--steady-seconds", type=float, default=30.0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    for noisy in ("kopf", "aiohttp", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.CRITICAL)

    server = subprocess.Popen([sys.executable, "-m", "rtj_operator.devcluster"], stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip()
        client = Kube(configure(url, user_agent="bench"))
        sim = JobSimulator(client, [f"p5-{i:04d}" for i in range(args.jobs * 2)])
        sim.add_nodes()

        durations: list[float] = []
        lock = threading.Lock()
        real = controller.reconcile

        def timed(*a, **kw):
            started = time.perf_counter()
            try:
                return real(*a, **kw)
            finally:
                with lock:
                    durations.append(time.perf_counter() - started)

        controller.reconcile = timed
        calls = [0]

        def count(_verb: str, _kind: str) -> None:
            calls[0] += 1

        rss_before = rss_mb()
        operator = OperatorThread(url, max_requeue=30.0)
        operator.context.kube._on_call = count
        operator.start()

        def phases() -> list[str]:
            return [(o.get("status") or {}).get("phase", "") for o in client.list(api.KIND)]

        started = time.monotonic()
        for i in range(args.jobs):
            client.create({"apiVersion": api.API_VERSION, "kind": api.KIND,
                           "metadata": {"name": f"job-{i:03d}", "namespace": f"team-{i % args.namespaces:02d}"},
                           "spec": {"image": "worker:1", "nodes": {"count": 2},
                                    "storage": {"existingClaim": "fsx-shared"}}})
        create_seconds = time.monotonic() - started
        while sum(1 for p in phases() if p) < args.jobs:
            time.sleep(0.5)
        children_seconds = time.monotonic() - started
        while sum(1 for p in phases() if p == "Running") < args.jobs:
            sim.step()
        running_seconds = time.monotonic() - started

        with lock:
            durations.clear()
        calls[0] = 0
        time.sleep(args.steady_seconds)
        with lock:
            steady = list(durations)
        steady_calls = calls[0]
        rss_after = rss_mb()
        operator.stop()
    finally:
        server.terminate()
        server.wait(10)

    ms = [d * 1000 for d in steady]
    print(f"rtj-operator: {args.jobs} RTJs x 2 nodes in {args.namespaces} namespaces, emulated API in a child "
          f"process, 2-core machine")
    print("| measure | value |")
    print("|---|---|")
    print(f"| create {args.jobs} RTJs (client side) | {create_seconds:.1f} s |")
    print(f"| all RTJs reconciled (children + status) | {children_seconds:.1f} s |")
    print(f"| all RTJs Running (simulated pods) | {running_seconds:.1f} s |")
    print(f"| steady-state passes in {args.steady_seconds:.0f} s | {len(ms)} ({len(ms) / args.steady_seconds:.1f}/s) |")
    if ms:
        print(f"| reconcile latency p50 / p90 / p99 / max | {pct(ms, 50):.1f} / {pct(ms, 90):.1f} / "
              f"{pct(ms, 99):.1f} / {max(ms):.1f} ms |")
        print(f"| mean reconcile latency | {statistics.mean(ms):.1f} ms |")
        print(f"| API calls per pass | {steady_calls / len(ms):.1f} |")
    print(f"| operator process RSS before / after | {rss_before:.0f} / {rss_after:.0f} MB |")


if __name__ == "__main__":
    main()
