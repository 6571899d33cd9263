"""`python -m rtj_operator.demo`: the operator end to end on the embedded emulated API.

Starts the emulated API server, the real kopf operator and a simulated Job controller/kubelets
(no containers run), applies an example RTJ, then shows what a user would see: the children,
the status conditions, a node loss recovered by replacing one pod, and a spec rejected as
InvalidSpec while the running job keeps running.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from . import api
from .devcluster import EmbeddedCluster, JobSimulator, OperatorThread
from .kube import Kube

DEFAULT_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "rtj-local.yaml"


def wait_for(what: str, sim: JobSimulator, check: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sim.step()
        if check():
            return
        time.sleep(0.2)
    raise TimeoutError(f"timed out waiting for {what}")


def show_status(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    rtj = kube.get(api.KIND, name, ns) or {}
    status = rtj.get("status") or {}
    print(f"\n$ kubectl get rtj -n {ns} {name}")
    print(f"{'NAME':<12}{'PHASE':<12}{'READY':<7}{'DESIRED':<9}{'RESTARTS':<10}CKPT-STEP")
    print(f"{name:<12}{status.get('phase', ''):<12}{status.get('nodesReady', 0)!s:<7}"
          f"{status.get('nodesDesired', 0)!s:<9}{status.get('restarts', 0)!s:<10}"
          f"{status.get('lastCheckpointStep', '<none>')}")
    print(f"\n$ kubectl get rtj -n {ns} {name} -o jsonpath='{{.status.conditions}}'")
    for cond in status.get("conditions", []):
        print(f"  {cond['type']:<12} {cond['status']:<6} {cond['reason']:<24} {cond.get('message', '')}")
    return status


def show_children(kube: Kube, ns: str) -> None:
    for kind in ("Service", "Job", "PersistentVolumeClaim", "Pod"):
        for obj in kube.list(kind, ns):
            print(f"\n--- {kind} {obj['metadata']['name']}")
            if kind == "Job":
                pod = obj["spec"]["template"]["spec"]
                env = {e["name"]: e.get("value", "<downward API>") for e in pod["containers"][0]["env"]}
                summary = {"completionMode": obj["spec"]["completionMode"],
                           "parallelism": obj["spec"]["parallelism"], "subdomain": pod["subdomain"],
                           "nodeSelector": pod["nodeSelector"], "command": pod["containers"][0]["command"],
                           "env": {k: env[k] for k in ("MASTER_ADDR", "RTJ_RDZV_ENDPOINT", "RTJ_NNODES",
                                                       "NODE_RANK", "RTJ_FT_HEARTBEAT_TIMEOUT")}}
                print(yaml.safe_dump(summary, sort_keys=False).rstrip())
            elif kind == "Pod":
                print(f"node={obj['spec']['nodeName']} phase={obj['status']['phase']} "
                      f"hostname={obj['spec']['hostname']}.{obj['spec']['subdomain']}")
            else:
                print(yaml.safe_dump(obj["spec"], sort_keys=False).rstrip())


def run(example: Path) -> int:
    body = yaml.safe_load(example.read_text())
    ns, name = body["metadata"].get("namespace", "default"), body["metadata"]["name"]
    cluster = EmbeddedCluster().start()
    operator = OperatorThread(cluster.url).start()
    try:
        kube = cluster.kube()
        sim = JobSimulator(kube, ["ip-10-0-1-11", "ip-10-0-1-12", "ip-10-0-1-13"])
        sim.add_nodes()
        print(f"Embedded API server at {cluster.url}; operator running; 3 simulated p5.48xlarge nodes.")
        print(f"\n$ kubectl apply -f {example}")
        kube.create(body)
        print(f"{api.SINGULAR}.{api.GROUP}/{name} created")

        def phase() -> str:
            return ((kube.get(api.KIND, name, ns) or {}).get("status") or {}).get("phase", "")

        wait_for("Running", sim, lambda: phase() == "Running")
        show_children(kube, ns)
        show_status(kube, ns, name)

        lost = next(p for p in kube.list("Pod", ns))["spec"]["nodeName"]
        print(f"\n### Node {lost} stops responding (NotReady): the operator replaces only its pod.")
        kube.patch("Node", lost, None, {"status": {"conditions": [
            {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown"}]}})
        wait_for("recovery", sim, timeout=60, check=lambda: phase() == "Running" and
                 ((kube.get(api.KIND, name, ns) or {}).get("status") or {}).get("restarts", 0) >= 1)
        status = show_status(kube, ns, name)
        print(f"\nrestarts by tier: {status.get('restartsByTier')}, disruptions: {status.get('disruptions')}, "
              f"job failures: {status.get('jobRestarts')}, recovery: {status.get('lastRecoverySeconds')}s")

        print("\n### An edit that passes the schema but is wrong: heartbeat timeout below the monitor interval.")
        print(f"$ kubectl patch rtj {name} --type merge -p "
              "'{\"spec\":{\"resiliency\":{\"heartbeatTimeoutSeconds\":2,\"monitorIntervalSeconds\":5}}}'")
        kube.patch(api.KIND, name, ns, {"spec": {"resiliency": {"heartbeatTimeoutSeconds": 2,
                                                                "monitorIntervalSeconds": 5}}})

        def invalid() -> bool:
            conds = ((kube.get(api.KIND, name, ns) or {}).get("status") or {}).get("conditions", [])
            return any(c["type"] == "InvalidSpec" and c["status"] == "True" for c in conds)

        wait_for("InvalidSpec", sim, invalid)
        show_status(kube, ns, name)
        pods = [p for p in kube.list("Pod", ns) if p["status"]["phase"] == "Running"]
        print(f"\n{len(pods)} pods still running: the invalid edit changed nothing that was running.")

        print(f"\n$ kubectl get events -n {ns}")
        for event in kube.list("Event", ns):
            print(f"  {event['type']:<8} {event['reason']:<18} {event['message']}")
        return 0
    finally:
        operator.stop()
        cluster.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="rtj-demo", description=__doc__)
    parser.add_argument("example", nargs="?", type=Path, default=DEFAULT_EXAMPLE)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("aiohttp.access", "kopf", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    sys.exit(run(args.example))


if __name__ == "__main__":
    main()
