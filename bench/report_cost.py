"""What the pods' progress reports cost and how fast a recovery reaches the status (issue 16).

Simulated, with the real code on a fake clock: each pod's ranks (rtj_worker.progress.RankProgress, as
train.py drives it) write their files, each pod's entrypoint (rtj_worker.report.Tracker and
PodReporter, polled every 0.5 s as in a pod) publishes its condition, and every published condition is
folded into one RTJ status as the operator's pass does (rtj_operator.progress), counting the status
writes (a pass writes only when the status changed). One fault of each in-pod tier happens on one pod
mid-run. Nothing here talks to an API server: the figures are the policy's, not a network's.

    PYTHONPATH=operator:worker python bench/report_cost.py [--nodes 64] [--ranks 8] [--minutes 10]
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
from pathlib import Path
from typing import Any

from rtj_operator import progress as op_progress
from rtj_operator.status import Status
from rtj_worker.progress import RankProgress
from rtj_worker.report import PodReporter, Tracker

POLL = 0.5  # the entrypoint's poll
PASS_DELAY = 1.0  # the operator's coalescing of non-failure pod events (runtime.py), before a pass


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class Sink:
    def __init__(self) -> None:
        self.writes: list[tuple[float, dict[str, Any]]] = []
        self.bytes = 0

    def write(self, condition: dict[str, Any]) -> None:
        self.writes.append((clock.t, condition))
        self.bytes += len(json.dumps({"metadata": {"uid": "0" * 36}, "status": {"conditions": [condition]}},
                                     separators=(",", ":")))


clock = Clock(1_800_000_000.0)


class SimPod:
    def __init__(self, index: int, ranks: int, root: Path):
        self.index, self.dir = index, root / f"pod{index}"
        self.dir.mkdir()
        self.global_ranks = [index * ranks + r for r in range(ranks)]
        self.tracker = Tracker(self.dir, clock=clock)
        self.sink = Sink()
        self.reporter = PodReporter(self.tracker, self.sink, clock=clock)
        self.group, self.ranks = 0, []

    def start(self, step: int, iteration: int = 0, new_group: bool = True) -> None:
        if new_group:
            self.group += 1
            self.ranks = [RankProgress(self.dir, local, f"g{self.group}", clock=clock)
                          for local in range(len(self.global_ranks))]
        for rank, ranks in zip(self.global_ranks, self.ranks, strict=True):
            ranks.loaded(step)
            ranks.started(rank, iteration, step)

    def pod(self) -> dict[str, Any]:
        """The pod object as the operator sees it, with its newest published condition."""
        conditions = [self.sink.writes[-1][1]] if self.sink.writes else []
        return {"metadata": {"name": f"train-{self.index}", "uid": f"uid-{self.index}"},
                "status": {"phase": "Running", "conditions": conditions}}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=64)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--step-seconds", type=float, default=1.0)
    parser.add_argument("--interval-steps", type=int, default=100)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="rtj-report-cost-"))
    pods = [SimPod(i, args.ranks, root) for i in range(args.nodes)]
    start = clock.t
    status = Status.from_dict({"phase": "Running", "startTime": _ts(start)})
    for p in pods:
        p.start(0)
    end = start + args.minutes * 60
    faults = {start + args.minutes * 20: "InProcess", start + args.minutes * 40: "Launcher"}
    victim = pods[min(5, args.nodes - 1)]
    fault_at: dict[str, float] = {}
    seen_at: dict[str, float] = {}
    resumed_at: dict[str, float] = {}
    status_writes, pending_pass = 0, None
    step, next_step = 0, start + args.step_seconds
    down_until = 0.0

    while clock.t < end:
        clock.t = round(clock.t + POLL / 2, 6)
        for at, tier in list(faults.items()):
            if clock.t >= at:
                del faults[at]
                fault_at[tier] = clock.t
                if tier == "InProcess":  # a rank of the victim raises; the Wrapper restarts every rank's loop
                    victim.ranks[1].failed(RuntimeError("injected"), step, own=True)
                else:  # a rank of the victim is killed; its launcher restarts the node's worker group
                    victim.tracker.launcher_line("failed (exitcode: -9) local_rank: 1 (pid: 4243)")
                    victim.tracker.launcher_line("[default] Worker group FAILED. 2/3 attempts left; will restart "
                                                 "worker group")
                    for p in pods:  # and every other node's launcher joins the new rendezvous
                        if p is not victim:
                            p.tracker.launcher_line("[default] Detected 1 new nodes from group_rank=5; will "
                                                    "restart worker group")
                down_until = clock.t + 10.0  # every rank waits, then resumes from the last checkpoint
                resume = step - step % args.interval_steps
                pending = (tier, resume)
        if down_until and clock.t >= down_until:
            down_until = 0.0
            tier, resume = pending
            for p in pods:  # in process: the same worker groups, the next iteration; else new worker groups
                p.start(resume, iteration=1 if tier == "InProcess" else 0, new_group=tier == "Launcher")
            step = resume
            next_step = clock.t + args.step_seconds
            resumed_at[tier] = next_step  # the first step after the recovery: where the pods count it
        if not down_until and clock.t >= next_step:
            step += 1
            next_step += args.step_seconds
            for p in pods:
                for ranks in p.ranks:
                    ranks.stepped(step)
                    if step % args.interval_steps == 0:
                        ranks.commit(step)
        if abs(clock.t / POLL - round(clock.t / POLL)) < 1e-6:
            for p in pods:
                p.tracker.poll()
                if p.reporter.tick() and pending_pass is None:
                    pending_pass = clock.t + PASS_DELAY
        if pending_pass is not None and clock.t >= pending_pass:
            pending_pass = None
            before = status.to_dict()
            now = datetime.datetime.fromtimestamp(clock.t, datetime.UTC)
            listed = [p.pod() for p in pods]
            found = op_progress.reports(listed)
            folded = op_progress.fold(status, found, {p["metadata"]["uid"] for p in listed}, now)
            due = op_progress.update_progress(status, found, now, folded.changed)
            op_progress.update_goodput(status, found, now)
            if due is not None:
                pending_pass = clock.t + due
            if status.to_dict() != before:
                status_writes += 1
            for tier in fault_at:
                if tier not in seen_at and status.restarts_by_tier.get(tier):
                    seen_at[tier] = clock.t

    minutes = args.minutes
    writes = sum(len(p.sink.writes) for p in pods)
    sizes = [len(json.dumps({"metadata": {"uid": "0" * 36}, "status": {"conditions": [c]}}, separators=(",", ":")))
             for p in pods for _, c in p.sink.writes]
    leader = pods[0]
    print(f"{args.nodes} nodes x {args.ranks} ranks, {minutes:g} min, a step every {args.step_seconds:g} s")
    print(f"pod status writes per job per minute: {writes / minutes:.1f} "
          f"(rank-0 pod {len(leader.sink.writes) / minutes:.1f}, others "
          f"{(writes - len(leader.sink.writes)) / max(1, args.nodes - 1) / minutes:.2f} each)")
    print(f"bytes per write: median {sorted(sizes)[len(sizes) // 2]}, max {max(sizes)}; bytes per pod per minute: "
          f"{sum(p.sink.bytes for p in pods) / args.nodes / minutes:.0f}")
    print(f"RTJ status writes per minute from reports: {status_writes / minutes:.1f}")
    for tier, at in fault_at.items():
        seen = seen_at.get(tier)
        print(f"{tier}: in status {seen - resumed_at[tier]:.1f} s after the first step that ends the recovery "
              f"({seen - at:.1f} s after the fault; plus the API round trips)" if seen else f"{tier}: not in status")
    print(f"status: restartsByTier {status.restarts_by_tier}, progress {status.progress}, goodput {status.goodput}")
    print(f"simulated: final step {step}, {step * args.step_seconds / (clock.t - start):.3f} of the wall time")


def _ts(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


if __name__ == "__main__":
    main()
