"""The pods' grace period from measurements (issue 27.2): what a stop (a drain, a spot reclaim, a suspend, a
deletion) leaves the ranks to save the step they reached.

A stop leaves the ranks the grace period less 30 s (rtj_worker.launch.stop_bounds: ft_launcher's and the
entrypoint's own margins). 96 GB at 300 MB/s takes about 320 s to write, so the 120 s the field used to
default to lost every step since the last checkpoint at each drain. When the spec does not set
resiliency.terminationGracePeriodSeconds, a new gang gets the grace its pods' newest checkpoint needs: the
write time and a step (status.progress.checkpointWriteSeconds, stepSeconds), with a quarter more as margin,
plus the 30 s; never below DEFAULT_SECONDS (what a spot reclaim gives anyway) nor above the field's
maximum. A value the spec sets is used as it is.

The grace is part of the pod template, so a new value reaches only a new gang, as the measured checkpoint
interval does (policies/interval.py): the value a gang was built with is recorded on its Job (an
annotation), and every later pass builds that gang's template with it, so it is never seen as a spec change.
status.stopGrace shows it. A Job without the annotation was built with the spec's value or the default.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from rtj_worker.launch import stop_bounds

from .. import api
from ..builders.job import grace_seconds
from ..spec import RTJ

if TYPE_CHECKING:  # world.py imports this module, and draft.py imports world.py
    from ..draft import Draft

DEFAULT_SECONDS = api.DEFAULT_GRACE_SECONDS
MAX_SECONDS = 86400  # the field's maximum
MARGIN = 1.25
SPEC, MEASURED, DEFAULT = "Spec", "Measured", "Default"


def needed_seconds(progress: dict[str, Any] | None) -> float:
    """What a stop-save needs: the newest checkpoint's write time and a step (0: nothing measured)."""
    p = progress or {}
    return float(p.get("checkpointWriteSeconds") or 0) + float(p.get("stepSeconds") or 0)


def grace_for(save_seconds: float) -> int:
    """The shortest grace period whose stop leaves the ranks `save_seconds` x MARGIN, within the field's
    bounds: stop_bounds(grace_for(s))[0] >= s x MARGIN (tested) unless that exceeds MAX_SECONDS."""
    want = save_seconds * MARGIN
    grace = DEFAULT_SECONDS
    while stop_bounds(grace)[0] < want and grace < MAX_SECONDS:
        grace = min(MAX_SECONDS, max(grace + 1, math.ceil(grace + want - stop_bounds(grace)[0])))
    return grace


def configured(rtj: RTJ) -> int | None:
    value = rtj.spec["resiliency"].get("terminationGracePeriodSeconds")
    return int(value) if value is not None else None


def applied(rtj: RTJ, job: dict[str, Any] | None) -> int | None:
    """The measured grace `job`'s pods were built with (None: the spec's, or the default), from the Job
    itself (its annotation), so its template is rebuilt alike whatever the status says."""
    value = ((job or {}).get("metadata", {}).get("annotations") or {}).get(api.ANNOTATION_GRACE)
    try:
        seconds = int(value) if value is not None else None
    except ValueError:
        return None
    if configured(rtj) is not None or seconds is None or not DEFAULT_SECONDS < seconds <= MAX_SECONDS:
        return None
    return seconds


def effective(rtj: RTJ, job: dict[str, Any] | None) -> int:
    """The grace period `job`'s pods have (or a new gang's would have, for job=None: the default)."""
    return grace_seconds(rtj, applied(rtj, job))


def for_new_gang(d: Draft) -> int | None:
    """The measured grace a gang about to be created gets (None: the spec's, or the default); its Job
    carries it (applied), status.stopGrace shows it."""
    seconds = None
    if configured(d.rtj) is None and (need := needed_seconds(d.status.progress)):
        seconds = grace_for(need)
    seconds = seconds if seconds and seconds > DEFAULT_SECONDS else None
    d.status.stop_grace = describe(d.rtj, seconds, d.status.progress)
    return seconds


def describe(rtj: RTJ, measured: int | None, progress: dict[str, Any] | None) -> dict[str, Any]:
    """status.stopGrace: the running gang's grace, where it comes from, and what the measurements ask for."""
    spec = configured(rtj)
    out: dict[str, Any] = {"appliedSeconds": grace_seconds(rtj, measured),
                           "source": SPEC if spec is not None else MEASURED if measured else DEFAULT}
    if need := needed_seconds(progress):
        out["saveSeconds"] = round(need, 1)
        out["suggestedSeconds"] = grace_for(need)
    return out


def update(d: Draft) -> None:
    """status.stopGrace from this pass's measurements, for the gang that runs."""
    if d.world.job is not None:
        d.status.stop_grace = describe(d.rtj, applied(d.rtj, d.world.job), d.status.progress)
    elif d.status.stop_grace:
        d.status.stop_grace = {**describe(d.rtj, None, d.status.progress),
                               **{k: d.status.stop_grace[k] for k in ("appliedSeconds", "source")
                                  if k in d.status.stop_grace}}
