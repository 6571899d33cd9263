"""`make demo`: real training under the operator on a local control plane, one fault per recovery layer.

Upstream kube-apiserver, etcd, kube-controller-manager and kube-scheduler (localcluster.py; the first
run builds them from Go modules), three node agents that run pods as real processes with CoreDNS
(nodeagent.py; needs root), `helm install` of the chart and the operator as a process authenticated
as the chart's ServiceAccount. Then `kubectl apply` of a 2-node x 2-rank CPU ResilientTrainingJob
whose schedule injects an exception (rank 3, step 25) and a SIGKILL (rank 1, step 45); the demo then
loses node 1 once step 64 is reached. Each fault must be recovered by its own layer:

- the exception in process (inprocess.Wrapper): same processes, next iteration;
- the SIGKILL by ft_launcher inside the same pod: new processes, same pods;
- the node loss by the operator: only that pod is replaced, the other rejoins the new round.

The pods run as the chart's rtj-worker ServiceAccount, so each pod's entrypoint publishes its live
report (step, committed checkpoint, its ranks' recoveries) on its own pod status: `kubectl get rtj`
shows STEP and CKPT-STEP moving and each recovery under its own tier (IN-PROCESS, LAUNCHER, the
operator's), and `kubectl describe rtj` has an event for each. The worker's own timeline
(events.jsonl on the shared checkpoint volume) tells which layer acted, independently of the status;
a summary table ends the demo, with the goodput the status reports beside the one measured from
that timeline (rtj_dev.timeline, as bench/goodput.py measures it).
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
from typing import Any

import yaml

from rtj_worker import events

from .cpu_rtj import cpu_rtj, shared_dir
from .localcluster import ROOT, LocalCluster
from .nodeagent import AgentNodes
from .timeline import goodput, per_fault, step_time

TOOLS = ROOT / ".tools" / "bin"
NS, NAME = "demo", "train"
STEPS, INTERVAL = 100, 10
FAULTS = [("3:25:exc", "an exception in rank 3 at step 25"), ("1:45:sigkill", "SIGKILL of rank 1 at step 45")]
TIER = {"exc": "InProcess", "sigkill": "Launcher"}  # the status.restartsByTier entry each fault moves
RANKS = 4
REPORT_SECONDS = 60  # bound on a recovery's way into status (the pod's report, then the operator's pass)
LOSE_AT_STEP = 64  # past the checkpoint at step 60


class Demo:
    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster

    def sh(self, *args: str, show: bool = True, check: bool = True) -> str:
        if show:
            print(f"\n$ {' '.join(args)}", flush=True)
        result = subprocess.run([str(TOOLS / args[0]), *args[1:]], env=self.cluster.env(), text=True,
                                capture_output=True)
        out = (result.stdout + result.stderr).rstrip()
        if show and out:
            print(out, flush=True)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed: {out}")
        return result.stdout

    @staticmethod
    def wait(what: str, check: Callable[[], Any], timeout: float = 180.0) -> Any:
        deadline = time.monotonic() + timeout
        while not (result := check()):
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(0.3)
        return result

    def status(self) -> dict[str, Any]:
        out = self.sh("kubectl", "get", "rtj", "-n", NS, NAME, "-o", "yaml", show=False)
        return (yaml.safe_load(out) or {}).get("status") or {}

    def pods(self) -> dict[str, str]:
        """Running pods by completion index: uid."""
        out = self.sh("kubectl", "get", "pods", "-n", NS, "-o", "yaml", show=False)
        return {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p["metadata"]["uid"]
                for p in yaml.safe_load(out)["items"]
                if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
                and "batch.kubernetes.io/job-completion-index" in (p["metadata"].get("annotations") or {})}

    def timeline(self) -> list[dict[str, Any]]:
        path = shared_dir(self.cluster, NS, NAME)
        return events.read(path / "events.jsonl") if path else []

    def step(self) -> int:
        return max((e["step"] for e in self.timeline() if e["event"] == "step"), default=0)

    def resumed_after(self, t: float) -> list[dict[str, Any]]:
        """The four rank starts that follow time t, once all four happened."""
        starts = [e for e in self.timeline() if e["event"] == "start" and e["t"] > t]
        return starts if len({e["rank"] for e in starts}) == 4 else []

    def show(self) -> None:
        self.sh("kubectl", "get", "rtj", "-n", NS, "-o", "wide")
        self.sh("kubectl", "get", "pods", "-n", NS, "-o", "wide")

    def tier_count(self, tier: str) -> int:
        return int((self.status().get("restartsByTier") or {}).get(tier) or 0)


def layer(before: list[dict[str, Any]], after: list[dict[str, Any]], pods_before: dict[str, str],
          pods_after: dict[str, str]) -> str:
    """Which layer recovered, from what the ranks and pods did: the same processes in a new iteration
    (in process), new processes in the same pods (ft_launcher), or a new pod (the operator)."""
    if pods_before != pods_after:
        return "operator (pod replaced)"
    if sorted(e["pid"] for e in before) == sorted(e["pid"] for e in after):
        return "in-process restart (same processes)"
    return "ft_launcher respawn (same pods)"


def tiers(status: dict[str, Any]) -> str:
    counts = status.get("restartsByTier") or {}
    return ", ".join(f"{tier} {n}" for tier, n in counts.items() if n) or "none"


def compare_goodput(demo: Demo, loss: dict[str, Any]) -> None:
    """The status's goodput (from the pods' reports) beside the one measured from the ranks' timeline
    over the same wall time (the job's start to its completion, as status.goodput counts it)."""
    st = demo.status()
    reported = st.get("goodput") or {}
    timeline = sorted([*demo.timeline(), loss], key=lambda e: e["t"])
    wall = float(reported.get("wallSeconds") or 0.0)
    if not wall:
        print("\nstatus.goodput has no wall time yet: nothing to compare.")
        return
    measured = goodput(timeline, per_fault(timeline, [], RANKS), wall, STEPS, step_time(timeline))
    print(f"\n### Goodput over the job's {wall:.0f}s (its start to its completion)")
    print(f"{'':<16} {'status.goodput':>15} {'worker timeline':>16}")
    for i, key in enumerate(("training", "infrastructure")):
        value = reported.get(key)
        print(f"{key:<16} {(f'{value:.1%}' if value is not None else '-'):>15} {measured[i]:>16.1%}")


def run() -> int:
    if os.geteuid() != 0:
        print("make demo runs pods as processes in network and mount namespaces: run it as root.")
        return 2
    started = time.monotonic()
    cluster = LocalCluster(nodes=2).start()
    agents: AgentNodes | None = None
    operator: subprocess.Popen[bytes] | None = None
    try:
        agents = AgentNodes(cluster, 3).start()
        print(f"Local control plane up in {time.monotonic() - started:.1f}s: kube-apiserver, etcd, "
              "kube-controller-manager, kube-scheduler, CoreDNS; 3 node agents that run pods as processes "
              "(and 2 kwok nodes that run nothing).")
        demo = Demo(cluster)
        demo.sh("kubectl", "get", "nodes", "-L", "node.kubernetes.io/instance-type")
        demo.sh("kubectl", "create", "namespace", NS)
        demo.sh("helm", "install", "rtj-operator", str(ROOT / "charts" / "rtj-operator"), "-n", "rtj-system",
                "--create-namespace", "--set", "replicaCount=0", "--set", f"workerRBAC.namespaces={{{NS}}}", "--wait")
        print("\n(The operator runs here as a process, with a token of the chart's ServiceAccount, so the "
              f"API server enforces the chart's RBAC. The chart made the rtj-worker ServiceAccount in {NS}: "
              "its pods' tokens may change only their own pod's rtj.dev/ conditions.)")
        kubeconfig = cluster.kubeconfig_for("rtj-system", "rtj-operator", Path(tempfile.mkdtemp()) / "operator")
        log = (cluster.workdir / "logs" / "operator.log").open("wb")  # type: ignore[operator]
        operator = subprocess.Popen([sys.executable, "-m", "rtj_operator", "--metrics-port", "0", "--liveness", ""],
                                    env={**os.environ, "KUBECONFIG": str(kubeconfig)}, stdout=log,
                                    stderr=subprocess.STDOUT)

        manifest = cpu_rtj(NS, NAME, [arg for fault, _ in FAULTS for arg in ("--fault", fault)], STEPS, INTERVAL,
                           serviceAccountName="rtj-worker")
        path = cluster.workdir / "rtj-demo.yaml"  # type: ignore[operator]
        path.write_text(yaml.safe_dump(manifest, sort_keys=False))
        print(f"\n### A 2-node x 2-rank CPU job (gloo, FSDP2, a checkpoint every {INTERVAL} steps) whose "
              f"ranks inject {FAULTS[0][1]} and {FAULTS[1][1]}; the demo loses node 1 at step {LOSE_AT_STEP}.")
        demo.sh("kubectl", "apply", "-f", str(path))
        demo.sh("kubectl", "wait", "-n", NS, "--for=condition=Running", f"rtj/{NAME}", "--timeout=120s")
        demo.wait("all four ranks training", lambda: len({e["rank"] for e in demo.timeline()
                                                          if e["event"] == "step"}) == 4)
        demo.show()

        rows = []
        first = [e for e in demo.timeline() if e["event"] == "start"]
        for fault, what in FAULTS:
            pods = demo.pods()
            _, step, kind = fault.split(":")
            hit = demo.wait(what, lambda k=kind: next((e for e in demo.timeline() if e["event"] == "fault"
                                                       and e["kind"] == k), None))
            print(f"\n### Step {step}: {what}.")
            tier, before = TIER[kind], demo.tier_count(TIER[kind])
            after = demo.wait("training to resume", lambda h=hit: demo.resumed_after(h["t"]))
            by = layer(first, after, pods, demo.pods())
            print(f"Recovered by {by}: resumed from step {after[0]['step']} "
                  f"{max(e['t'] for e in after) - hit['t']:.1f}s later.")
            # The pod whose rank failed reports the recovery once its first step after it is done.
            demo.wait(f"the {tier} recovery in the RTJ's status", lambda t=tier, b=before: demo.tier_count(t) > b,
                      timeout=REPORT_SECONDS)
            st = demo.status()
            print(f"status.restartsByTier.{tier}: {before} -> {demo.tier_count(tier)} "
                  f"({time.time() - hit['t']:.1f}s after the fault); last recovery: {st.get('lastRecovery')}")
            rows.append((what, by, after[0]["step"], max(e["t"] for e in after) - hit["t"], tiers(st)))
            demo.show()
            first = after

        demo.wait(f"step {LOSE_AT_STEP}", lambda: demo.step() >= LOSE_AT_STEP)
        pods = demo.pods()
        node = next(p for p in yaml.safe_load(demo.sh("kubectl", "get", "pods", "-n", NS, "-o", "yaml",
                                                      show=False))["items"]
                    if p["metadata"]["uid"] == pods["1"])["spec"]["nodeName"]
        print(f"\n### Step {demo.step()}: node {node} (node rank 1) is lost: its processes die and its "
              "lease stops.")
        lost_at = time.time()
        loss = {"t": lost_at, "event": "fault", "step": demo.step(), "rank": -1}  # for the timeline's goodput
        agents.by_name(node).stop(lose=True)
        took = demo.wait("NotReady", lambda: "NotReady" in demo.sh("kubectl", "get", "node", node, show=False))
        print(f"The node-lifecycle controller marked {node} NotReady {took:.1f}s later. Its pod is evicted but "
              "may still be running there: no second pod of node rank 1 starts until the node is fenced.")
        demo.wait("WaitingForFencing", lambda: any(c["type"] == "WaitingForFencing" and c["status"] == "True"
                                                   for c in demo.status().get("conditions") or []))
        demo.sh("kubectl", "get", "rtj", NAME, "-n", NS, "-o",
                "jsonpath={.status.conditions[?(@.type=='WaitingForFencing')].message}{'\\n'}")
        print("The instance is gone for good: its Node is deleted (on EKS the cloud node lifecycle controller "
              "does this once the instance is terminated).")
        demo.sh("kubectl", "delete", "node", node)
        after = demo.wait("training to resume", lambda: demo.resumed_after(lost_at), timeout=240)
        st = demo.status()
        rows.append((f"loss of {node}", layer(first, after, pods, demo.pods()), after[0]["step"],
                     max(e["t"] for e in after) - lost_at, tiers(st)))
        print(f"Recovered by {rows[-1][1]}: resumed from step {rows[-1][2]} {rows[-1][3]:.1f}s after the loss; "
              f"the pod of node rank 0 kept its uid: {demo.pods().get('0') == pods['0']}.")
        demo.show()

        demo.sh("kubectl", "wait", "-n", NS, "--for=condition=Succeeded", f"rtj/{NAME}", "--timeout=240s")
        demo.sh("kubectl", "get", "rtj", "-n", NS)
        demo.sh("kubectl", "get", "events", "-n", NS, "--field-selector", f"involvedObject.name={NAME}")
        demo.sh("kubectl", "describe", "rtj", "-n", NS, NAME)
        print("\n### Summary: each fault recovered by its own layer (status: restartsByTier after it)")
        print(f"{'fault':<36} {'recovered by':<38} {'resumed from':>12} {'seconds':>8}  {'RTJ restarts by tier'}")
        for what, by, step_, seconds, counts in rows:
            print(f"{what:<36} {by:<38} {'step ' + str(step_):>12} {seconds:>8.1f}  {counts}")
        compare_goodput(demo, loss)
        print(f"\nDone in {time.monotonic() - started:.0f}s. Training ran {STEPS} steps; pods were restarted only "
              "for the node loss.")
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
        if agents is not None:
            agents.stop()
        cluster.stop()


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(prog="python -m rtj_dev.demo", description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    sys.exit(run())


if __name__ == "__main__":
    main()
