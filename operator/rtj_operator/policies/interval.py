"""The checkpoint interval from measurements: Young-Daly, beside the configured one, applied at the next gang
when the spec asks (checkpoint.intervalPolicy: YoungDaly).

Young and Daly's first-order optimum: a checkpoint every sqrt(2 x C x M) seconds, where C is what one save
costs the training loop (its stall: the pods report each save's) and M the mean time between failures
(here: the job's wall time over its recoveries of every tier, so an in-process restart counts as a node
loss does: each one rolls back to the last committed step). Meta reports M = 7.9 h at 1,024 GPUs and
1.8 h at 16,384. The interval is never shorter than a save takes to write (checkpointWriteSeconds): a
save due while the previous one is still being written is skipped, so a shorter one saves nothing more.

The pods' checkpoint interval is part of their template, so a new value can only reach a new gang
(status.attempt): the value a gang was built with is recorded on its Job (an annotation) when it is
created, and every later pass builds that gang's template with it, so that it is never seen as a spec
change; status.checkpointInterval.appliedSteps shows it. With the Fixed policy (the default) it is
always intervalSteps, and Jobs carry no annotation.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from .. import api
from ..spec import RTJ

if TYPE_CHECKING:  # world.py imports this module, and draft.py imports world.py
    from ..draft import Draft

FIXED, YOUNG_DALY = api.CHECKPOINT_INTERVAL_POLICIES
MAX_STEPS = 10_000_000  # checkpoint.intervalSteps' maximum


def young_daly_seconds(stall: float, mtbf: float) -> float:
    return math.sqrt(2.0 * stall * mtbf)


def suggest(configured: int, stall: float | None, failures: int, wall: float | None, step_seconds: float | None,
            write_seconds: float | None) -> dict[str, Any]:
    """status.checkpointInterval's measured part: what is known, and the suggestion once every input is."""
    out: dict[str, Any] = {"configuredSteps": configured, "failures": failures}
    if stall is not None:
        out["saveStallSeconds"] = round(stall, 3)
    if failures and wall:
        out["meanSecondsBetweenFailures"] = round(wall / failures, 1)
    if stall and failures and wall and step_seconds:
        seconds = young_daly_seconds(stall, wall / failures)
        steps = max(1, round(seconds / step_seconds))
        if write_seconds:
            steps = max(steps, math.ceil(write_seconds / step_seconds))
        out["suggestedSeconds"] = round(seconds, 1)
        out["suggestedSteps"] = min(MAX_STEPS, steps)
    return out


def applied(rtj: RTJ, job: dict[str, Any] | None) -> int | None:
    """The interval `job`'s pods were built with, when it is not intervalSteps (None: it is), from the Job
    itself (its annotation), so that its template is rebuilt alike whatever the status says (a status write
    lost after the create included)."""
    value = ((job or {}).get("metadata", {}).get("annotations") or {}).get(api.ANNOTATION_CHECKPOINT_INTERVAL)
    try:
        steps = int(value) if value is not None else None
    except ValueError:
        return None
    if rtj.spec["checkpoint"]["intervalPolicy"] != YOUNG_DALY or steps is None or steps < 1:
        return None
    return steps if steps != rtj.spec["checkpoint"]["intervalSteps"] else None


def for_new_gang(d: Draft) -> int | None:
    """The interval a gang about to be created gets (None: intervalSteps); the Job carries it (applied),
    status.checkpointInterval.appliedSteps shows it."""
    configured = d.rtj.spec["checkpoint"]["intervalSteps"]
    current = dict(d.status.checkpoint_interval or {})
    steps = configured
    if d.rtj.spec["checkpoint"]["intervalPolicy"] == YOUNG_DALY and current.get("suggestedSteps"):
        steps = int(current["suggestedSteps"])
    current["appliedSteps"] = steps
    d.status.checkpoint_interval = current
    return steps if steps != configured else None


def update(d: Draft, save_stall: float | None) -> None:
    """status.checkpointInterval from this pass's measurements (`save_stall`: the slowest pod's newest)."""
    status, ckpt = d.status, d.rtj.spec["checkpoint"]
    old = dict(status.checkpoint_interval or {})
    progress, goodput = status.progress or {}, status.goodput or {}
    stall = save_stall if save_stall is not None else old.get("saveStallSeconds")
    new = suggest(ckpt["intervalSteps"], stall, int(status.restarts), goodput.get("wallSeconds"),
                  progress.get("stepSeconds"), progress.get("checkpointWriteSeconds"))
    new["policy"] = ckpt["intervalPolicy"]
    job = d.world.job
    if job is not None:  # what the running gang saves at
        new["appliedSteps"] = applied(d.rtj, job) or ckpt["intervalSteps"]
    elif "appliedSteps" in old:
        new["appliedSteps"] = old["appliedSteps"]
    status.checkpoint_interval = new
