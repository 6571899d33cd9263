"""Recovery and goodput measured from the worker's own timeline (rtj_worker.events: every rank's
start, step, fault and checkpoint, with wall-clock times), independent of anything the operator
reports. bench/goodput.py and `make demo` (which prints it beside the RTJ's status.goodput) use it.

- per fault: detection (fault -> first sign any layer acted: a rank restarted or the pod failed),
  recovery (fault -> first training step after every rank restarted), steps lost (fault step - step
  resumed from), down (fault -> every rank restarted);
- training goodput: steps x the fault-free step time / wall;
- infrastructure goodput: time all ranks were in the training loop / wall (first start to last step,
  less the time down).
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any


def per_fault(timeline: list[dict[str, Any]], pod_failed: list[float], ranks: int) -> list[dict[str, float]]:
    """One row per fault that every one of `ranks` ranks restarted after."""
    faults = sorted((e for e in timeline if e["event"] == "fault"), key=lambda e: e["t"])
    starts = sorted((e for e in timeline if e["event"] == "start"), key=lambda e: e["t"])
    steps = sorted((e for e in timeline if e["event"] == "step"), key=lambda e: e["t"])
    rows = []
    for fault in faults:
        after = [s for s in starts if s["t"] > fault["t"]][:ranks]
        if len(after) < ranks:
            continue
        restarted = max(s["t"] for s in after)
        first_step = next((s["t"] for s in steps if s["t"] > restarted), restarted)
        reacted = min([after[0]["t"], *[t for t in pod_failed if t > fault["t"]]])
        rows.append({"step": fault["step"], "rank": fault["rank"], "detect": reacted - fault["t"],
                     "recover": first_step - fault["t"], "lost": fault["step"] - min(s["step"] for s in after),
                     "down": restarted - fault["t"]})
    return rows


def step_time(timeline: list[dict[str, Any]]) -> float:
    """Rank 0's median seconds per step: the fault-free step time (a recovery is a few long gaps)."""
    rank0 = sorted(e["t"] for e in timeline if e["event"] == "step" and e["rank"] == 0)
    return statistics.median(b - a for a, b in itertools.pairwise(rank0))


def goodput(timeline: list[dict[str, Any]], faults: list[dict[str, float]], wall: float, steps: int,
            t_step: float) -> tuple[float, float]:
    """(training, infrastructure) goodput of a run of `steps` steps that took `wall` seconds."""
    first_start = min((e["t"] for e in timeline if e["event"] == "start"), default=0)
    last_step = max((e["t"] for e in timeline if e["event"] == "step"), default=0)
    down = sum(f["down"] for f in faults)
    return steps * t_step / wall, max(0.0, last_step - first_start - down) / wall
