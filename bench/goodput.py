"""The reference's recovery comparison at CPU scale (`python bench/goodput.py`; root).

One seeded fault schedule (exceptions in random ranks at random steps) is run as a 2-node RTJ on
local agent nodes (hack/rtj_dev/nodeagent.py), driven by the real operator, in four modes:

- in-process:   inprocess.Wrapper restarts the loop in the same processes;
- ft_launcher:  in-process restart off: the rank dies and ft_launcher respawns the worker group;
- kubernetes:   in-job recovery off (no in-process restart, maxLauncherRestarts 0): every fault
                fails the pod, and the operator and the Job controller replace it;
- no faults.

Per fault: detection (fault -> first sign any layer acted: a rank restarted or the pod failed),
recovery (fault -> first training step after every rank restarted), steps lost (fault step - step
resumed from). Per mode: wall time (RTJ applied -> Succeeded), training goodput (steps x the
fault-free step time / wall), infrastructure goodput (time all ranks were in the training loop /
wall) and each mode's ratio to the kubernetes mode.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
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
from rtj_worker import events  # noqa: E402

TOOLS = ROOT / ".tools" / "bin"
RANKS = 4
MODES = {
    "in-process": {},
    "ft_launcher": {"resiliency": {**RESILIENCY, "inProcessRestart": {"enabled": False},
                                   "maxLauncherRestarts": 10}},
    "kubernetes": {"resiliency": {**RESILIENCY, "inProcessRestart": {"enabled": False}, "maxLauncherRestarts": 0},
                   "restartBudget": {"maxRestarts": 20, "maxRestartsWithoutProgress": 20,
                                     "nodeLossGraceSeconds": 2, "terminatingTimeoutSeconds": 3}},
    "no faults": {},
}


def schedule(seed: int, faults: int, steps: int) -> list[str]:
    """`--fault RANK:STEP:exc` flags: distinct steps, away from the start and the end."""
    rng = random.Random(seed)
    chosen = sorted(rng.sample(range(steps // 10, steps - steps // 10), faults))
    return [f"{rng.randrange(RANKS)}:{step}:exc" for step in chosen]


class Mode:
    def __init__(self, cluster: LocalCluster, name: str, ns: str):
        self.cluster, self.name, self.ns = cluster, name, ns
        self.pod_failed: dict[str, float] = {}  # pod uid -> when first seen Failed

    def run(self, manifest: dict[str, Any], timeout: float) -> float:
        self.cluster.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                        "metadata": {"name": self.ns}})
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
                return time.time() - started
            if phase == "Failed":
                raise RuntimeError(f"{self.ns}: the RTJ failed: {self.cluster.api('GET', path)['status']}")
            time.sleep(0.5)
        raise TimeoutError(f"{self.ns}: not Succeeded within {timeout}s")

    def timeline(self) -> list[dict[str, Any]]:
        path = shared_dir(self.cluster, self.ns, self.name)
        return events.read(path / "events.jsonl") if path else []


def per_fault(timeline: list[dict[str, Any]], pod_failed: list[float]) -> list[dict[str, float]]:
    faults = sorted((e for e in timeline if e["event"] == "fault"), key=lambda e: e["t"])
    starts = sorted((e for e in timeline if e["event"] == "start"), key=lambda e: e["t"])
    steps = sorted((e for e in timeline if e["event"] == "step"), key=lambda e: e["t"])
    rows = []
    for fault in faults:
        after = [s for s in starts if s["t"] > fault["t"]][:RANKS]
        if len(after) < RANKS:
            continue
        restarted = max(s["t"] for s in after)
        first_step = next((s["t"] for s in steps if s["t"] > restarted), restarted)
        reacted = min([after[0]["t"], *[t for t in pod_failed if t > fault["t"]]])
        rows.append({"step": fault["step"], "rank": fault["rank"], "detect": reacted - fault["t"],
                     "recover": first_step - fault["t"], "lost": fault["step"] - min(s["step"] for s in after),
                     "down": restarted - fault["t"]})
    return rows


def step_time(timeline: list[dict[str, Any]]) -> float:
    rank0 = sorted(e["t"] for e in timeline if e["event"] == "step" and e["rank"] == 0)
    return statistics.median(b - a for a, b in itertools.pairwise(rank0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="reference: 2000")
    parser.add_argument("--interval", type=int, default=50, help="checkpoint interval; reference: 500")
    parser.add_argument("--faults", type=int, default=5, help="reference: 5")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--modes", default=",".join(MODES))
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
            try:
                runner = Mode(cluster, "bench", ns)
                manifest = cpu_rtj(ns, "bench", [] if mode == "no faults" else flags, args.steps, args.interval,
                                   args.step_seconds, **MODES[mode])
                wall = runner.run(manifest, timeout=1800)
            finally:
                operator.stop()
            timeline = runner.timeline()
            faults = per_fault(timeline, list(runner.pod_failed.values()))
            starts = [e["t"] for e in timeline if e["event"] == "start"]
            results[mode] = {"wall": wall, "faults": faults, "timeline": timeline,
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
    print(f"{'mode':<12} {'step':>5} {'rank':>4} {'detect':>7} {'recover':>8} {'lost':>5}")
    for mode, res in results.items():
        for f in res["faults"]:
            print(f"{mode:<12} {f['step']:>5} {f['rank']:>4} {f['detect']:>7.1f} {f['recover']:>8.1f} "
                  f"{f['lost']:>5}")
    print(f"\nper mode (fault-free step time {t_step * 1000:.0f} ms):")
    print(f"{'mode':<12} {'wall s':>7} {'faults':>6} {'mean recover':>13} {'train goodput':>14} "
          f"{'infra goodput':>14} {'ratio vs k8s':>13}")
    goodputs = {}
    for mode, res in results.items():
        down = sum(f["down"] for f in res["faults"])
        train = steps * t_step / res["wall"]
        first_start = min((e["t"] for e in res["timeline"] if e["event"] == "start"), default=0)
        last_step = max((e["t"] for e in res["timeline"] if e["event"] == "step"), default=0)
        infra = max(0.0, (last_step - first_start - down)) / res["wall"]
        goodputs[mode] = (train, infra, res)
    base = goodputs.get("kubernetes", (None, None, None))[0]
    for mode, (train, infra, res) in goodputs.items():
        recover = statistics.mean(f["recover"] for f in res["faults"]) if res["faults"] else 0.0
        ratio = f"{train / base:.2f}x" if base else "-"
        print(f"{mode:<12} {res['wall']:>7.1f} {len(res['faults']):>6} {recover:>13.1f} {train:>13.1%} "
              f"{infra:>13.1%} {ratio:>13}")


if __name__ == "__main__":
    main()
