"""The reference's recovery comparison at CPU scale (`python bench/goodput.py`; root).

One seeded fault schedule (exceptions in random ranks at random steps) is run as a 2-node RTJ on
local agent nodes (hack/rtj_dev/nodeagent.py), driven by the real operator, in these modes:

- in-process:   inprocess.Wrapper restarts the loop in the same processes;
- ft_launcher:  in-process restart off: the rank dies and ft_launcher respawns the worker group;
- kubernetes:   in-job recovery off (no in-process restart, maxLauncherRestarts 0): every fault
                fails the pod, and the operator and the Job controller replace it;
- no faults;
- ft_launcher 0.6: the ft_launcher mode on NVRx 0.6 (the modes above run the venv's 0.4.1, as the
                reference did), the like-for-like base of the node-loss modes' ratio;

and, instead of the exceptions, one node lost mid-run (its processes killed and its Node deleted, as
on EKS), on NVRx 0.6 (its barrier rendezvous keeps spares standing by):

- node-loss spare:     nodes.spares=1 on the three nodes: the standby takes the lost node's ranks;
- node-loss no-spare:  the third node is cordoned and becomes schedulable only --provision-seconds
                        after the loss (EKS provisioning a node, modelled); the lost index waits for it;
- node-0 loss:          index 0's node, a free node ready: replaced like any other (the coordinator
                        pod, not node 0, holds the stores).

Per fault: detection, recovery and steps lost; per mode: wall time (RTJ applied -> Succeeded),
training and infrastructure goodput (all as rtj_dev.timeline defines them, from the worker's own
timeline; the training goodput with the fault-free mode's step time) and each mode's ratio to the
kubernetes mode. The pods run as the chart's rtj-worker ServiceAccount and publish their live reports,
so each mode also prints the RTJ's status.goodput beside the timeline's over the same wall time.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "hack"), str(ROOT / "operator"), str(ROOT / "worker")]

import yaml  # noqa: E402

from rtj_dev.cpu_rtj import RESILIENCY, cpu_rtj, shared_dir  # noqa: E402
from rtj_dev.localcluster import LocalCluster  # noqa: E402
from rtj_dev.nodeagent import AgentNodes  # noqa: E402
from rtj_dev.operator_thread import OperatorThread  # noqa: E402
from rtj_dev.timeline import goodput, per_fault, step_time  # noqa: E402
from rtj_operator import api  # noqa: E402
from rtj_worker import events  # noqa: E402

TOOLS = ROOT / ".tools" / "bin"
NVRX06 = Path(os.environ.get("RTJ_AGENT_NVRX") or ROOT / ".nvrx06")  # `make nvrx06`
RANKS = 4
# status.goodput against the workers' own timeline over the same wall time: each of training and
# infrastructure goodput within this (issue 30.8); the run exits 1 otherwise.
AGREEMENT = 0.02
MODES = {
    "in-process": {},
    "ft_launcher": {"resiliency": {**RESILIENCY, "inProcessRestart": {"enabled": False},
                                   "maxLauncherRestarts": 10}},
    "kubernetes": {"resiliency": {**RESILIENCY, "inProcessRestart": {"enabled": False}, "maxLauncherRestarts": 0},
                   "restartBudget": {"maxRestarts": 20, "maxRestartsWithoutProgress": 20,
                                     "nodeLossGraceSeconds": 2, "terminatingTimeoutSeconds": 3}},
    "no faults": {},
    # The ft_launcher tier on NVRx 0.6, as the node-loss modes run: their recovery's like-for-like ratio.
    "ft_launcher 0.6": {"resiliency": {**RESILIENCY, "inProcessRestart": {"enabled": False},
                                       "maxLauncherRestarts": 10}, "nvrx06": True},
}
# Node-loss modes: (RTJ fields, whose node is lost, the free node only after --provision-seconds).
NODE_LOSS = {
    "node-loss spare": ({"nodes": {"count": 2, "spares": 1}}, "active", False),
    "node-loss no-spare": ({}, "index 1", True),
    "node-0 loss": ({}, "index 0", False),
}
REFERENCE = {"in-process": "31 %", "ft_launcher": "25.5 %", "kubernetes": "11.5 %"}


def schedule(seed: int, faults: int, steps: int) -> list[str]:
    """`--fault RANK:STEP:exc` flags: distinct steps, away from the start and the end."""
    rng = random.Random(seed)
    chosen = sorted(rng.sample(range(steps // 10, steps - steps // 10), faults))
    return [f"{rng.randrange(RANKS)}:{step}:exc" for step in chosen]


class Mode:
    def __init__(self, cluster: LocalCluster, name: str, ns: str):
        self.cluster, self.name, self.ns = cluster, name, ns
        self.pod_failed: dict[str, float] = {}  # pod uid -> when first seen Failed
        self.status: dict[str, Any] = {}  # the RTJ's status once Succeeded

    def run(self, manifest: dict[str, Any], timeout: float) -> float:
        self.cluster.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                        "metadata": {"name": self.ns}})
        worker_rbac(self.cluster, self.ns)
        started = time.time()
        subprocess.run([str(TOOLS / "kubectl"), "apply", "-f", "-"], input=yaml.safe_dump(manifest), text=True,
                       env=self.cluster.env(), check=True, capture_output=True)
        path = f"/apis/training.rtj.dev/v1alpha1/namespaces/{self.ns}/resilienttrainingjobs/{self.name}"
        while time.time() - started < timeout:
            phase = (self.cluster.api("GET", path).get("status") or {}).get("phase")
            for pod in self.cluster.api("GET", f"/api/v1/namespaces/{self.ns}/pods")["items"]:
                if pod["status"].get("phase") == "Failed":
                    self.pod_failed.setdefault(pod["metadata"]["uid"], time.time())
            if phase == "Succeeded":
                self.status = self.cluster.api("GET", path)["status"]
                return time.time() - started
            if phase == "Failed":
                raise RuntimeError(f"{self.ns}: the RTJ failed: {self.cluster.api('GET', path)['status']}")
            time.sleep(0.5)
        raise TimeoutError(f"{self.ns}: not Succeeded within {timeout}s")

    def timeline(self) -> list[dict[str, Any]]:
        path = shared_dir(self.cluster, self.ns, self.name)
        return events.read(path / "events.jsonl") if path else []


def worker_rbac(cluster: LocalCluster, ns: str) -> None:
    """The chart's rtj-worker ServiceAccount and its Role in `ns`: the pods publish their live reports, from
    which the operator computes status.goodput (printed beside the timeline's)."""
    out = subprocess.run([str(TOOLS / "helm"), "template", "rtj-operator", str(ROOT / "charts" / "rtj-operator"),
                          "-n", "rtj-system", "--set", f"workerRBAC.namespaces={{{ns}}}", "--show-only",
                          "templates/worker-rbac.yaml"], check=True, capture_output=True, text=True).stdout
    subprocess.run([str(TOOLS / "kubectl"), "apply", "-f", "-"], input=out, text=True, env=cluster.env(),
                   check=True, capture_output=True)


def lose_node(cluster: LocalCluster, agents: AgentNodes, runner: Mode, which: str, at_step: int,
              provision: float, cordoned: str, losses: list[dict[str, Any]]) -> None:
    """Kill the chosen pod's node once rank 0 reached `at_step`; for a cordoned spare node, uncordon it
    `provision` seconds later. The loss goes into `losses` as a fault record for per_fault()."""
    while max((e["step"] for e in runner.timeline() if e["event"] == "step"), default=0) < at_step:
        time.sleep(0.2)
    pods = [p for p in cluster.api("GET", f"/api/v1/namespaces/{runner.ns}/pods")["items"]
            if p["status"].get("phase") == "Running"
            and (p["metadata"].get("labels") or {}).get(api.LABEL_COMPONENT) == "workers"]
    index = {p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index"): p for p in pods}
    if which == "active":  # a node whose ranks train (not node 0: node-0 loss is its own mode)
        active = {e.get("host") for e in runner.timeline() if e["event"] == "start"}
        pod = next(p for i, p in sorted(index.items()) if i != "0" and p["spec"]["hostname"] in active)
    else:
        pod = index[which.split()[1]]
    agent = agents.by_name(pod["spec"]["nodeName"])
    losses.append({"t": time.time(), "event": "fault", "step": at_step, "rank": -1, "node": agent.name})
    agent.terminate()
    if cordoned:
        time.sleep(provision)
        cluster.api("PATCH", f"/api/v1/nodes/{cordoned}", {"spec": {"unschedulable": False}},
                    content_type="application/merge-patch+json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="reference: 2000")
    parser.add_argument("--interval", type=int, default=50, help="checkpoint interval; reference: 500")
    parser.add_argument("--faults", type=int, default=5, help="reference: 5")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--modes", default=",".join([*MODES, *NODE_LOSS]))
    parser.add_argument("--loss-step", type=int, default=75, help="node-loss modes: lose the node at this step")
    parser.add_argument("--provision-seconds", type=float, default=120,
                        help="node loss, no spare: the free node appears this long after the loss")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root: the node agents use network and mount namespaces")
    flags = [f for spec in schedule(args.seed, args.faults, args.steps) for f in ("--fault", spec)]
    print(f"schedule (seed {args.seed}): {' '.join(flags[1::2])}; {args.steps} steps, checkpoint every "
          f"{args.interval}", flush=True)
    cluster = LocalCluster(nodes=0, workdir=Path(tempfile.mkdtemp(prefix="rtj-goodput-"))).start()
    subprocess.run([str(TOOLS / "kubectl"), "apply", "-f", str(ROOT / "crds")], env=cluster.env(), check=True,
                   capture_output=True)
    agents = AgentNodes(cluster, 3).start()
    results: dict[str, dict[str, Any]] = {}
    try:
        for i, mode in enumerate(m for m in args.modes.split(",") if m):
            ns = f"goodput-{i}"
            operator = OperatorThread(cluster.server, cluster.admin_token, str(cluster.ca_file),
                                      namespaces=[ns]).start()
            losses: list[dict[str, Any]] = []
            cordoned = ""
            try:
                runner = Mode(cluster, "bench", ns)
                if mode in NODE_LOSS:
                    fields, which, delayed = NODE_LOSS[mode]
                    os.environ["RTJ_AGENT_NVRX"] = str(NVRX06)
                    if delayed:  # two nodes for the gang, the third "not provisioned yet"
                        cordoned = agents.agents[2].name
                        cluster.api("PATCH", f"/api/v1/nodes/{cordoned}", {"spec": {"unschedulable": True}},
                                    content_type="application/merge-patch+json")
                    manifest = cpu_rtj(ns, "bench", [], args.steps, args.interval, args.step_seconds,
                                       serviceAccountName="rtj-worker", **fields)
                    threading.Thread(target=lose_node, daemon=True, args=(
                        cluster, agents, runner, which, args.loss_step, args.provision_seconds, cordoned,
                        losses)).start()
                else:
                    os.environ.pop("RTJ_AGENT_NVRX", None)  # the reference modes: the venv's NVRx 0.4.1 ...
                    spec = MODES[mode]
                    if spec.get("nvrx06"):  # ... unless the mode names 0.6
                        os.environ["RTJ_AGENT_NVRX"] = str(NVRX06)
                    manifest = cpu_rtj(ns, "bench", [] if mode.startswith("no faults") else flags, args.steps,
                                       args.interval, args.step_seconds, serviceAccountName="rtj-worker",
                                       **{k: v for k, v in spec.items() if k != "nvrx06"})
                wall = runner.run(manifest, timeout=1800)
            finally:
                operator.stop()
                for agent in agents.agents:  # every node back for the next mode
                    if agent.name in {loss["node"] for loss in losses}:
                        agent.start()
                if cordoned:
                    cluster.api("PATCH", f"/api/v1/nodes/{cordoned}", {"spec": {"unschedulable": False}},
                                content_type="application/merge-patch+json")
                agents.kill_namespace(ns)
            timeline = sorted([*runner.timeline(), *losses], key=lambda e: e["t"])
            faults = per_fault(timeline, list(runner.pod_failed.values()), RANKS)
            starts = [e["t"] for e in timeline if e["event"] == "start"]
            results[mode] = {"wall": wall, "faults": faults, "timeline": timeline, "status": runner.status,
                             "startup": min(starts) - min(e["t"] for e in timeline) if starts else 0}
            print(f"{mode}: {wall:.1f}s", flush=True)
    finally:
        agents.stop()
        cluster.stop()
        shutil.rmtree(cluster.workdir, ignore_errors=True)  # type: ignore[arg-type]
    report(results, args.steps)


def report(results: dict[str, dict[str, Any]], steps: int) -> None:
    clean = results.get("no faults")
    t_step = step_time((clean or next(iter(results.values())))["timeline"])
    print("\nper fault (seconds from the fault):")
    print(f"{'mode':<20} {'step':>5} {'rank':>4} {'detect':>7} {'recover':>8} {'lost':>5}")
    for mode, res in results.items():
        for f in res["faults"]:
            print(f"{mode:<20} {f['step']:>5} {f['rank']:>4} {f['detect']:>7.1f} {f['recover']:>8.1f} "
                  f"{f['lost']:>5}")
    print(f"\nper mode (fault-free step time {t_step * 1000:.0f} ms):")
    print(f"{'mode':<20} {'wall s':>7} {'faults':>6} {'mean recover':>13} {'train goodput':>14} "
          f"{'infra goodput':>14} {'ratio vs k8s':>13} {'reference':>10}")
    goodputs = {}
    for mode, res in results.items():
        train, infra = goodput(res["timeline"], res["faults"], res["wall"], steps, t_step)
        goodputs[mode] = (train, infra, res)
    base = goodputs.get("kubernetes", (None, None, None))[0]
    for mode, (train, infra, res) in goodputs.items():
        recover = statistics.mean(f["recover"] for f in res["faults"]) if res["faults"] else 0.0
        ratio = f"{train / base:.2f}x" if base else "-"
        print(f"{mode:<20} {res['wall']:>7.1f} {len(res['faults']):>6} {recover:>13.1f} {train:>13.1%} "
              f"{infra:>13.1%} {ratio:>13} {REFERENCE.get(mode, '-'):>10}")
    # What the operator reported (status.goodput, from the pods' live reports) beside the timeline's, over
    # the status's own wall time (the Job's creation to its completion), so only the measure differs.
    print("\nstatus.goodput vs the worker's timeline over the status's wall time:")
    print(f"{'mode':<20} {'status wall s':>13} {'train: status':>14} {'timeline':>9} {'infra: status':>14} "
          f"{'timeline':>9}")
    disagree = []
    for mode, res in results.items():
        reported = (res.get("status") or {}).get("goodput") or {}
        wall = float(reported.get("wallSeconds") or 0)
        if not wall:
            print(f"{mode:<20} {'-':>13}")
            disagree.append(f"{mode}: no status.goodput")
            continue
        train, infra = goodput(res["timeline"], res["faults"], wall, steps, t_step)
        cells = [f"{reported[k]:.1%}" if reported.get(k) is not None else "-" for k in ("training", "infrastructure")]
        print(f"{mode:<20} {wall:>13.1f} {cells[0]:>14} {train:>9.1%} {cells[1]:>14} {infra:>9.1%}")
        for key, theirs in (("training", train), ("infrastructure", infra)):
            if reported.get(key) is None or abs(reported[key] - theirs) > AGREEMENT:
                disagree.append(f"{mode}: {key} {reported.get(key)} in status against {theirs:.4f} on the timeline")
    recoveries = {m: statistics.mean(f["recover"] for f in r["faults"]) for m, r in results.items() if r["faults"]}
    tier = next((m for m in ("ft_launcher 0.6", "ft_launcher") if m in recoveries), None)
    if "node-loss spare" in recoveries and tier:
        print(f"\nnode loss with a spare: {recoveries['node-loss spare'] / recoveries[tier]:.2f}x the "
              f"{tier} tier's recovery (target <= 1.5x)")
    if {"node-loss spare", "node-loss no-spare"} <= set(recoveries):
        print(f"node loss without a spare: {recoveries['node-loss no-spare'] / recoveries['node-loss spare']:.1f}x "
              f"slower than with one (target >= 5x)")
    if disagree:
        print(f"\nstatus.goodput disagrees with the timeline by more than {AGREEMENT:.0%}:\n  " + "\n  ".join(disagree))
        sys.exit(1)
    print(f"\nstatus.goodput agrees with the workers' timeline within {AGREEMENT:.0%} in every mode")


if __name__ == "__main__":
    main()
