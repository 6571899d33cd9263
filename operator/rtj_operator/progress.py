"""What the pods say about themselves (rtj_worker.report), folded into the RTJ's status. Pure.

Each pod of the current Job may carry the condition `rtj.dev/Progress` (its entrypoint writes it with
the pod's bound token; the chart's ValidatingAdmissionPolicy lets a token change only its own pod's
`rtj.dev/` conditions) and, once ended, the same report in its termination message. A report is the
job's claim about itself: it feeds display, metrics and goodput, and the checkpoint step the
NoProgress budget compares, never anything about another job (only the current Job's pods are read).

- Recoveries inside the pods (InProcess, Launcher) are counted by the pod whose rank caused them;
  the ledger (status.recovery.reports) keeps what each listed pod's report was already counted at,
  so every recovery is added once, across passes, operator restarts and replaced pods.
- Progress (step, seconds per step, the newest committed checkpoint) comes from the newest report;
  it is rewritten at most every PROGRESS_SECONDS unless something else changed, so that steps moving
  on cost one status write per job every few seconds, not one per report.
- Goodput so far, as bench/goodput.py defines it: training = steps done since the job started x the
  fault-free step time / wall time; infrastructure = time the ranks were in the training loop / wall
  time (the in-loop seconds of the runs that hosted global rank 0, summed over the pods).
- In-job recoveries become events (InProcessRestart, LauncherRestart) at most one per tier every
  EVENT_SECONDS: a flapping job cannot flood the API; each event says how many it stands for.
"""

from __future__ import annotations

import datetime
import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from rtj_worker import progress as worker_progress

from . import api, ladder
from .conditions import parse_time, timestamp
from .memo import per_version
from .status import Status

CONDITION = "rtj.dev/Progress"
PROGRESS_SECONDS = 10.0
EVENT_SECONDS = 30.0
MAX_RESTART_COUNTS = 32  # (tier, reason, charged) entries kept in status; more fold into reason "Other"
MAX_CAUSES = 8
_MAX_INT = 2**53
IN_JOB_EVENT = {ladder.IN_PROCESS: "InProcessRestart", ladder.LAUNCHER: "LauncherRestart"}
TIER_WORDS = {ladder.IN_PROCESS: "in-process restart", ladder.LAUNCHER: "ft_launcher restart"}


@dataclass(frozen=True)
class Report:
    """One pod's report, type-checked (a malformed field counts as absent)."""

    pod: str
    uid: str
    at: float
    state: str = ""
    step: int | None = None
    step_at: float | None = None
    step_seconds: float | None = None
    ckpt: int | None = None
    ckpt_at: float | None = None
    ckpt_seconds: float | None = None  # how long that checkpoint took to write (save to commit)
    leader: bool = False
    resumed: int | None = None  # the checkpoint step the pod's current run resumed from
    run_since: float | None = None  # when that run began
    in_loop_seconds: float = 0.0
    restarts: dict[str, int] = field(default_factory=dict)
    causes: dict[str, int] = field(default_factory=dict)
    last: dict[str, Any] | None = None
    restored_from: str | None = None  # where its current run's state came from (api.STATE_SOURCES)
    restore_seconds: float | None = None
    copies: dict[str, Any] | None = None  # what a rank of it holds off the volume (status.progress.stateCopies)
    save_stall: float | None = None  # how long its newest save held the training loop up


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _MAX_INT else None


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        return None
    return float(value)


def _word(value: Any, limit: int = 40) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", value)[:limit] if isinstance(value, str) else ""


def _parse(text: Any, pod: dict[str, Any]) -> Report | None:
    try:
        data = json.loads(text) if isinstance(text, str) else text
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("v") != 1:
        return None
    meta = pod["metadata"]
    restarts = data.get("restarts") if isinstance(data.get("restarts"), dict) else {}
    causes: dict[str, int] = {}
    for key, count in (data.get("causes") if isinstance(data.get("causes"), dict) else {}).items():
        tier, _, cause = str(key).partition("/")
        if tier in ladder.IN_JOB_TIERS and _word(cause) and _int(count) and len(causes) < MAX_CAUSES:
            causes[f"{tier}/{_word(cause)}"] = _int(count) or 0
    last = data.get("last") if isinstance(data.get("last"), dict) else None
    if last is not None:
        last = {"tier": last.get("tier") if last.get("tier") in ladder.IN_JOB_TIERS else None,
                "cause": _word(last.get("cause")) or "Unknown",
                "detail": last.get("detail")[:200] if isinstance(last.get("detail"), str) else "",
                "at": _num(last.get("at")), "seconds": _num(last.get("seconds")),
                "rolledBack": _int(last.get("rolledBack")), **_restore(last)}
        if last["tier"] is None or last["at"] is None:
            last = None
    restore = _restore(data)
    return Report(
        pod=meta["name"], uid=meta.get("uid", meta["name"]), at=_num(data.get("at")) or 0.0,
        state=_word(data.get("state"), 16), step=_int(data.get("step")), step_at=_num(data.get("stepAt")),
        step_seconds=_num(data.get("stepSeconds")), ckpt=_int(data.get("ckpt")), ckpt_at=_num(data.get("ckptAt")),
        ckpt_seconds=_num(data.get("ckptSeconds")),
        leader=data.get("leader") is True, resumed=_int(data.get("resumed")), run_since=_num(data.get("runSince")),
        in_loop_seconds=_num(data.get("inLoopSeconds")) or 0.0,
        restarts={t: _int(restarts.get(t)) or 0 for t in ladder.IN_JOB_TIERS}, causes=causes, last=last,
        restored_from=restore.get("restoredFrom"), restore_seconds=restore.get("restoreSeconds"),
        copies=_copies(data.get("copies")), save_stall=_num(data.get("saveStallSeconds")))


def _restore(data: dict[str, Any]) -> dict[str, Any]:
    """restoredFrom and restoreSeconds of a report (or its last recovery), where valid."""
    source = data.get("restoredFrom")
    if source not in api.STATE_SOURCES:
        return {}
    return {"restoredFrom": source, "restoreSeconds": _num(data.get("restoreSeconds"))}


def _copies(data: Any) -> dict[str, Any] | None:
    """A report's copies (rtj_worker.progress: one rank's figures) as status.progress.stateCopies."""
    if not isinstance(data, dict):
        return None
    out: dict[str, Any] = {key: _int(data.get(theirs)) for key, theirs in (
        ("memoryBytesPerRank", "memoryBytes"), ("nodeBytesPerRank", "nodeBytes"), ("peerBytesPerRank", "peerBytes"))}
    out["skipped"] = data["skipped"][:200] if isinstance(data.get("skipped"), str) else ""
    return {k: v for k, v in out.items() if v is not None}


@per_version
def pod_report(pod: dict[str, Any]) -> Report | None:
    """The pod's newest report: its termination message's (written at exit) or its condition's. Shared per
    pod version (memo.py): read it, never modify it."""
    final = ladder.termination_report(pod).get("progress")
    if isinstance(final, dict) and (report := _parse(final, pod)) is not None:
        return report
    for cond in (pod.get("status") or {}).get("conditions") or []:
        if cond.get("type") == CONDITION:
            return _parse(cond.get("message"), pod)
    return None


# The fields of a report that move on while a pod trains: a report that changed only these (and its time) is
# a refresh, which status.progress takes in at most every PROGRESS_SECONDS anyway (update_progress).
REFRESH_FIELDS = frozenset({"at", "step", "stepAt", "stepSeconds", "ckpt", "ckptAt", "ckptSeconds",
                            "saveStallSeconds", "inLoopSeconds", "copies"})


def refresh_only(before: dict[str, Any], after: dict[str, Any]) -> bool:
    """Whether `after` is `before` with only its progress condition refreshed: the same state (the
    condition's status and reason), nothing else of the report changed but REFRESH_FIELDS, and nothing
    else of the pod but its resourceVersion. runtime.py wakes such a pod's job at most every
    PROGRESS_SECONDS, not at the pace of the events: at 1000 nodes the reports would otherwise run a full
    pass every second. A state change (recovering, finished), an in-job recovery counted, a failure or
    any other change of the pod wakes it as before."""
    def split(pod: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        status = dict(pod.get("status") or {})
        conds = status.get("conditions") or []
        found = next((c for c in conds if c.get("type") == CONDITION), None)
        status["conditions"] = [c for c in conds if c is not found]
        meta = {k: v for k, v in (pod.get("metadata") or {}).items() if k not in ("resourceVersion", "managedFields")}
        return found, {**pod, "metadata": meta, "status": status}

    old, old_rest = split(before)
    new, new_rest = split(after)
    if old is None or new is None or old_rest != new_rest:
        return False
    if (old.get("status"), old.get("reason")) != (new.get("status"), new.get("reason")):
        return False
    try:
        old_report, new_report = json.loads(old.get("message") or ""), json.loads(new.get("message") or "")
    except (TypeError, ValueError):
        return False
    if not isinstance(old_report, dict) or not isinstance(new_report, dict):
        return False
    keys = (old_report.keys() | new_report.keys()) - REFRESH_FIELDS
    return all(old_report.get(k) == new_report.get(k) for k in keys)


def reports(pods: list[dict[str, Any]]) -> list[Report]:
    return [r for r in map(pod_report, pods) if r is not None]


def _time(t: float | None) -> str | None:
    return timestamp(datetime.datetime.fromtimestamp(t, datetime.UTC)) if t else None


def newest_checkpoint(found: list[Report]) -> tuple[int, float | None] | None:
    best = max((r for r in found if r.ckpt), key=lambda r: r.ckpt or 0, default=None)
    return (best.ckpt or 0, best.ckpt_at) if best is not None else None


def count_restart(status: Status, tier: str, reason: str, charged: str, n: int = 1) -> None:
    """status.restartCounts[(tier, reason, charged)] += n (bounded: see MAX_RESTART_COUNTS)."""
    entries = status.restart_counts
    entry = next((e for e in entries if (e.get("tier"), e.get("reason"), e.get("charged")) == (tier, reason, charged)),
                 None)
    if entry is None:
        if len(entries) >= MAX_RESTART_COUNTS - len(ladder.ALL_TIERS) * 2:  # room left for each (tier, Other)
            reason = "Other"
            entry = next((e for e in entries if (e.get("tier"), e.get("reason"), e.get("charged"))
                          == (tier, reason, charged)), None)
        if entry is None:
            entry = {"tier": tier, "reason": reason, "charged": charged, "count": 0}
            entries.append(entry)
    entry["count"] = int(entry.get("count", 0)) + n


@dataclass
class Folded:
    """What one pass learnt from the reports (for the events it posts)."""

    new: dict[str, int] = field(default_factory=dict)  # tier -> recoveries counted in this pass
    changed: bool = False  # a count, the newest recovery or the checkpoint moved: progress is written now
    wait: float | None = None  # look again then (a progress update or an event is due)


def fold(status: Status, found: list[Report], listed: set[str], now: datetime.datetime,
         ended: frozenset[str] = frozenset()) -> Folded:
    """Counts, the newest recovery, the checkpoint, progress: everything but goodput and events. `ended`: pods
    (uids) listed that will report no more (deleted, or ended)."""
    out = Folded()
    ledger = status.recovery
    close_lost_leader(status, found, {uid for uid in ledger.reports if uid not in listed} | set(ended))
    for r in found:
        seen = ledger.reports.get(r.uid) or {}
        entry = {"inProcess": r.restarts.get(ladder.IN_PROCESS, 0), "launcher": r.restarts.get(ladder.LAUNCHER, 0),
                 "inLoopSeconds": round(r.in_loop_seconds, 2), "causes": dict(r.causes)}
        for tier, key in ((ladder.IN_PROCESS, "inProcess"), (ladder.LAUNCHER, "launcher")):
            delta = entry[key] - int(seen.get(key, 0))
            if delta > 0:
                status.restarts_by_tier[tier] = status.restarts_by_tier.get(tier, 0) + delta
                out.new[tier] = out.new.get(tier, 0) + delta
                out.changed = True
        old_causes = seen.get("causes") or {}
        for key, count in r.causes.items():
            delta = count - int(old_causes.get(key, 0))
            if delta > 0:
                tier, _, cause = key.partition("/")
                count_restart(status, tier, cause, ladder.JOB, delta)
        delta_loop = entry["inLoopSeconds"] - float(seen.get("inLoopSeconds", 0.0))
        if delta_loop > 0:  # the rank-0 pod's report (every 15 s while training): progress is written with it
            goodput = status.goodput = dict(status.goodput or {})
            goodput["inLoopSeconds"] = round(float(goodput.get("inLoopSeconds", 0.0)) + delta_loop, 2)
            out.changed = True
        # A count only ever grows: a smaller one (never, from one pod's entrypoint) is not taken back.
        kept = {k: max(v, seen.get(k, 0)) if k != "causes" else v for k, v in entry.items()}
        if r.leader and r.step_at and delta_loop > 0:
            kept["leaderStepAt"] = r.step_at  # where its counted in-loop time ends (close_lost_leader)
        elif seen.get("leaderStepAt"):
            kept["leaderStepAt"] = seen["leaderStepAt"]
        if kept["inProcess"] or kept["launcher"] or kept["inLoopSeconds"] or kept["causes"]:
            ledger.reports[r.uid] = kept
    ledger.reports = {uid: v for uid, v in ledger.reports.items() if uid in listed}
    status.restarts = sum(status.restarts_by_tier.values())

    newest_last = max((r for r in found if r.last), key=lambda r: (r.last or {}).get("at") or 0, default=None)
    if newest_last is not None and newest_last.last is not None:
        last, when = newest_last.last, _time(newest_last.last["at"])
        if note_recovery(status, {"tier": last["tier"], "reason": last["cause"], "message": last["detail"],
                                  "seconds": last["seconds"], "stepsRolledBack": last["rolledBack"], "time": when,
                                  "restoredFrom": last.get("restoredFrom"),
                                  "restoreSeconds": last.get("restoreSeconds"),
                                  "pod": newest_last.pod}):
            out.changed = True

    ckpt = newest_checkpoint(found)
    if ckpt is not None and ckpt[0] > int(status.last_checkpoint_step if status.last_checkpoint_step is not None
                                          else -1):
        status.last_checkpoint_step = ckpt[0]
        status.last_checkpoint_time = _time(ckpt[1]) or timestamp(now)
        out.changed = True
    return out


def note_recovery(status: Status, recovery: dict[str, Any]) -> bool:
    """status.lastRecovery = `recovery` unless the one there is newer (times: when each fault began)."""
    recovery = {k: v for k, v in recovery.items() if v is not None and v != ""}
    recorded = status.last_recovery or {}
    if recorded == recovery:
        return False
    epoch = datetime.datetime.min.replace(tzinfo=datetime.UTC)
    if (parse_time(recovery.get("time")) or epoch) < (parse_time(recorded.get("time")) or epoch):
        return False
    status.last_recovery = recovery
    return True


def update_progress(status: Status, found: list[Report], now: datetime.datetime, changed: bool,
                    force: bool = False) -> float | None:
    """status.progress from the newest report; at most every PROGRESS_SECONDS unless `changed` or
    `force`. Returns when it is due next if it was held back."""
    old = status.progress or {}
    # The report of the newest step, not the newest report: a hot spare that waits reports too, step 0,
    # and its report, the newest, read as the job's progress made training goodput 0 (bench/goodput.py,
    # node loss with a spare: 0.0 % against the worker's 37.9 %).
    newest = max(found, key=lambda r: (r.step_at is not None, r.step_at or 0.0, r.at), default=None)
    if newest is None and not old:
        return None
    updated = parse_time(old.get("updateTime"))
    age = (now - updated).total_seconds() if updated else None
    progress = dict(old)
    if newest is not None:
        progress.update({"step": newest.step, "stepTime": _time(newest.step_at),
                         "stepSeconds": newest.step_seconds or old.get("stepSeconds")})
        progress["reportingPods"] = len(found)
        progress["trainingPods"] = sum(1 for r in found if r.state == "Training")
    ckpt_time = parse_time(status.last_checkpoint_time)
    # How long the newest committed checkpoint took to write (its slowest pod's), for the stop grace.
    writes = [r.ckpt_seconds for r in found if r.ckpt_seconds is not None and r.ckpt == status.last_checkpoint_step]
    if writes:
        progress["checkpointWriteSeconds"] = round(max(writes), 1)
    copies = [r for r in found if r.copies]
    if copies:  # the newest report's: every rank holds about as much (FSDP shards evenly)
        progress["stateCopies"] = max(copies, key=lambda r: r.at).copies
    progress["checkpointStep"] = status.last_checkpoint_step
    progress["checkpointTime"] = status.last_checkpoint_time
    progress["checkpointAgeSeconds"] = round((now - ckpt_time).total_seconds(), 1) if ckpt_time else None
    progress = {k: v for k, v in progress.items() if v is not None and k != "updateTime"}
    same = {k: v for k, v in old.items() if k not in ("updateTime", "checkpointAgeSeconds")} == {
        k: v for k, v in progress.items() if k != "checkpointAgeSeconds"}
    if same and not force:
        return None
    if not (changed or force) and age is not None and age < PROGRESS_SECONDS:
        return PROGRESS_SECONDS - age
    progress["updateTime"] = timestamp(now)
    status.progress = progress
    return None


def close_lost_leader(status: Status, found: list[Report], gone: set[str]) -> None:
    """The in-loop time of the leader's run after its pod's last report, when the pod will report no more (its
    node lost): only the leader's pod counts in-loop time (once for the job), and it reports every 15 s, so
    the end of its run went uncounted (the goodput benchmark's node-0 loss: 23 % infrastructure goodput in
    status against 34 % on the workers' timeline). The other pods trained with it step by step until the run
    broke: the newest step of theirs in that run (after its last report, before any run of theirs that began
    later) is where it ended. Their reports of the break may come a pass later than the leader's pod is
    gone: the gap waits for them in status.recovery.leaderGap (the step time its counted time ends at) until
    a new leader's run reports."""
    ledger = status.recovery
    for uid in gone:
        last = (ledger.reports.get(uid) or {}).pop("leaderStepAt", None)
        if last and not ledger.leader_gap:
            ledger.leader_gap = float(last)
    last = ledger.leader_gap
    if not last:
        return
    ends = [r.step_at for r in found if r.uid not in gone and r.step_at and r.step_at > last
            and (r.run_since is None or r.run_since <= last or r.step_at < r.run_since)]
    if ends:
        goodput = status.goodput = dict(status.goodput or {})
        goodput["inLoopSeconds"] = round(float(goodput.get("inLoopSeconds", 0.0)) + max(ends) - last, 2)
        ledger.leader_gap = last = max(ends)
    if any(r.leader and r.run_since and r.run_since > last and r.in_loop_seconds for r in found):
        ledger.leader_gap = None  # a new leader's run counts now: what the others knew of the old one is in


def update_goodput(status: Status, found: list[Report], now: datetime.datetime) -> None:
    """Goodput so far from status.progress (call after update_progress: it moves only with it)."""
    progress, start = status.progress or {}, parse_time(status.start_time)
    goodput = dict(status.goodput or {})
    if goodput.get("startStep") is None:
        starts = [r.resumed for r in found if r.resumed is not None]
        if starts:
            goodput["startStep"] = min(starts)
    end = parse_time(status.completion_time) or parse_time(progress.get("updateTime")) or now
    if start is None or end <= start or progress.get("step") is None:
        status.goodput = goodput or None
        return
    wall = (end - start).total_seconds()
    steps = max(0, int(progress["step"]) - int(goodput.get("startStep") or 0))
    goodput["wallSeconds"] = round(wall, 1)
    if progress.get("stepSeconds"):
        goodput["training"] = round(min(1.0, steps * float(progress["stepSeconds"]) / wall), 4)
    goodput["infrastructure"] = round(min(1.0, float(goodput.get("inLoopSeconds", 0.0)) / wall), 4)
    status.goodput = goodput


def in_job_events(status: Status, found: list[Report], now: datetime.datetime) -> tuple[list[tuple[str, str]], float
                                                                                         | None]:
    """(reason, message) of the events due for in-job recoveries, and when the next one is due."""
    out, wait = [], None
    ledger = status.recovery
    for tier in ladder.IN_JOB_TIERS:
        total = status.restarts_by_tier.get(tier, 0)
        posted = ledger.events.get(tier) or {}
        if total <= int(posted.get("count", 0)):
            continue
        last_time = parse_time(posted.get("time"))
        since = (now - last_time).total_seconds() if last_time else None
        if since is not None and since < EVENT_SECONDS:
            wait = EVENT_SECONDS - since if wait is None else min(wait, EVENT_SECONDS - since)
            continue
        n = total - int(posted.get("count", 0))
        last = max((r.last for r in found if r.last and r.last["tier"] == tier),
                   key=lambda last: last["at"] or 0, default=None)
        what = f"{n} {TIER_WORDS[tier]}{'s' if n != 1 else ''}" + (f" since {posted['time']}" if posted else "")
        message = f"{what} (total {total})"
        if last is not None:
            recovered = f"recovered in {last['seconds']:.1f}s" if last["seconds"] is not None else "recovering"
            rolled = f", {last['rolledBack']} steps rolled back" if last["rolledBack"] is not None else ""
            if last.get("restoredFrom"):
                rolled += f", state from {last['restoredFrom']}" + (
                    f" in {last['restoreSeconds']:.1f}s" if last.get("restoreSeconds") is not None else "")
            pod = next((r.pod for r in found if r.last is last), "")
            message += f"; last: {last['cause']} on pod {pod}, {recovered}{rolled}: {last['detail']}"
        out.append((IN_JOB_EVENT[tier], message))
        ledger.events[tier] = {"count": total, "time": timestamp(now)}
    return out, wait


def rolled_back(status: Status, found: list[Report]) -> None:
    """The steps an operator-tier recovery rolled back, once the new pods said where they resumed."""
    last, before = status.last_recovery, status.recovery.step_at_fault
    if last is None or last.get("tier") not in ladder.TIERS or last.get("stepsRolledBack") is not None:
        return
    when = parse_time(last.get("time"))
    resumed = [r.resumed for r in found if r.resumed is not None and r.state == "Training" and when is not None
               and (r.run_since or 0) >= when.timestamp()]  # runs begun since the fault
    if before is not None and resumed:
        last["stepsRolledBack"] = max(0, before - min(resumed))
        status.recovery.step_at_fault = None
        since = when.timestamp() if when is not None else 0.0
        restored = [r for r in found if r.restored_from and r.state == "Training" and (r.run_since or 0) >= since]
        if restored:  # the slowest pod's source: a restore is all ranks from memory or none
            source = worker_progress.slowest(*(r.restored_from for r in restored))
            last["restoredFrom"] = source
            if next(r for r in restored if r.restored_from == source).restore_seconds is not None:
                last["restoreSeconds"] = round(max(r.restore_seconds or 0.0 for r in restored), 2)
