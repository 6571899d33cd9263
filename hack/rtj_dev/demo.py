"""`make demo`: the operator end to end on a local control plane, as a user would drive it.

Upstream kube-apiserver, etcd, kube-controller-manager and kube-scheduler with kwok playing the
kubelets of p5.48xlarge nodes (see localcluster.py; the first run builds them from Go modules).
`helm install` of the chart, the operator as a process authenticated as the chart's ServiceAccount,
`kubectl apply` of the local example, then a node loss seen by the real node-lifecycle controller
and answered by the operator, and an invalid edit reported as InvalidSpec while the pods keep running.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from .localcluster import ROOT, LocalCluster

TOOLS = ROOT / ".tools" / "bin"
EXAMPLE = ROOT / "examples" / "rtj-local.yaml"


class Demo:
    def __init__(self, cluster: LocalCluster, ns: str, name: str):
        self.cluster, self.ns, self.name = cluster, ns, name

    def sh(self, *args: str, show: bool = True, input: str | None = None, check: bool = True) -> str:
        tool = args[0]
        if show:
            print(f"\n$ {' '.join(args)}", flush=True)
        result = subprocess.run([str(TOOLS / tool), *args[1:]], env=self.cluster.env(), text=True,
                                capture_output=True, input=input)
        out = (result.stdout + result.stderr).rstrip()
        if show and out:
            print(out, flush=True)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {out}")
        return result.stdout

    def wait(self, what: str, check: Callable[[], bool], timeout: float = 120.0) -> float:
        start = time.monotonic()
        while not check():
            if time.monotonic() - start > timeout:
                raise TimeoutError(f"timed out waiting for {what}")
            time.sleep(0.5)
        return time.monotonic() - start

    def status(self) -> dict:
        out = self.sh("kubectl", "get", "rtj", "-n", self.ns, self.name, "-o", "yaml", show=False)
        return (yaml.safe_load(out) or {}).get("status") or {}

    def pods(self) -> list[dict]:
        out = self.sh("kubectl", "get", "pods", "-n", self.ns, "-o", "yaml", show=False)
        return [p for p in yaml.safe_load(out)["items"] if not p["metadata"].get("deletionTimestamp")]


def run(example: Path) -> int:
    body = yaml.safe_load(example.read_text())
    ns, name = body["metadata"].get("namespace", "default"), body["metadata"]["name"]
    started = time.monotonic()
    cluster = LocalCluster(nodes=4).start()
    operator: subprocess.Popen[bytes] | None = None
    try:
        print(f"Local control plane up in {time.monotonic() - started:.1f}s: kube-apiserver, etcd, "
              f"kube-controller-manager, kube-scheduler, kwok ({cluster.nodes} p5.48xlarge nodes).")
        demo = Demo(cluster, ns, name)
        demo.sh("kubectl", "get", "nodes", "-L", "node.kubernetes.io/instance-type")
        demo.sh("helm", "install", "rtj-operator", str(ROOT / "charts" / "rtj-operator"), "-n", "rtj-system",
                "--create-namespace", "--set", "replicaCount=0", "--wait")
        print("\n(kwok nodes run no containers: the operator runs here as a process, with a token of the "
              "chart's ServiceAccount, so the API server enforces the chart's RBAC.)")
        kubeconfig = cluster.kubeconfig_for("rtj-system", "rtj-operator", Path(tempfile.mkdtemp()) / "operator")
        log = (cluster.workdir / "logs" / "operator.log").open("wb")  # type: ignore[operator]
        operator = subprocess.Popen([sys.executable, "-m", "rtj_operator", "--metrics-port", "0", "--liveness", ""],
                                    env={**os.environ, "KUBECONFIG": str(kubeconfig)}, stdout=log,
                                    stderr=subprocess.STDOUT)
        demo.sh("kubectl", "apply", "-f", str(example))
        demo.sh("kubectl", "wait", "-n", ns, "--for=condition=Running", f"rtj/{name}", "--timeout=120s")
        demo.sh("kubectl", "get", "rtj", "-n", ns)
        demo.sh("kubectl", "get", "job,svc,pvc,pods", "-n", ns, "-o", "wide")

        victim = sorted(demo.pods(), key=lambda p: p["metadata"]["name"])[1]
        node = victim["spec"]["nodeName"]
        print(f"\n### Node {node} (pod {victim['metadata']['name']}) is lost: its kubelet stops renewing the lease.")
        cluster.lose_node(node)
        took = demo.wait("NotReady", lambda: "NotReady" in demo.sh("kubectl", "get", "node", node, show=False))
        print(f"The node-lifecycle controller marked it NotReady after {took:.1f}s.")
        demo.sh("kubectl", "get", "nodes")
        demo.wait("recovery", lambda: demo.status().get("phase") == "Running"
                  and demo.status().get("restarts", 0) >= 1, timeout=180)
        st = demo.status()
        print(f"\nRecovered in {st.get('lastRecoverySeconds')}s: restarts by tier {st.get('restartsByTier')}, "
              f"disruptions {st.get('disruptions')}, job failures {st.get('jobRestarts')}.")
        demo.sh("kubectl", "get", "rtj", "-n", ns)
        demo.sh("kubectl", "get", "pods", "-n", ns, "-o", "wide")

        print("\n### An edit the schema accepts but that cannot work: 3 nodes with nodes.max 2.")
        before = {p["metadata"]["uid"] for p in demo.pods()}
        demo.sh("kubectl", "patch", "rtj", "-n", ns, name, "--type", "merge", "-p",
                '{"spec":{"nodes":{"count":3,"max":2}}}')
        demo.sh("kubectl", "wait", "-n", ns, "--for=condition=InvalidSpec", f"rtj/{name}", "--timeout=60s")
        after = {p["metadata"]["uid"] for p in demo.pods()}
        print(f"\nSame {len(after & before)} pods still running: the invalid edit changed nothing that ran.")
        demo.sh("kubectl", "describe", "rtj", "-n", ns, name)
        return 0
    except Exception:
        log_path = cluster.workdir / "logs" / "operator.log"  # type: ignore[operator]
        if log_path.exists():
            print("\n--- operator log (last lines) ---\n" + "\n".join(log_path.read_text().splitlines()[-30:]))
        raise
    finally:
        if operator is not None:
            operator.terminate()
            operator.wait(30)
        cluster.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rtj_dev.demo", description=__doc__)
    parser.add_argument("example", nargs="?", type=Path, default=EXAMPLE)
    sys.exit(run(parser.parse_args(argv).example))


if __name__ == "__main__":
    main()
