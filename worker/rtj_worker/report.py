"""The pod's report to the operator: one writer per pod (the entrypoint), coalesced.

`Tracker` follows what the pod's ranks wrote (rtj_worker.progress) and what ft_launcher and its rank
monitors logged, and keeps the pod's report: the step and its time, seconds per step, the newest
committed checkpoint, whether the pod's ranks train (or wait: a standby, a rendezvous), which runs
hosted global rank 0 and for how long they were in the training loop, and every recovery this pod's
own ranks caused, by layer:

- InProcess: a rank raised (not a peer's fault it saw) and inprocess.Wrapper restarted the loop in
  the same processes;
- Launcher: ft_launcher restarted this node's worker group because one of its ranks died, hung
  (heartbeat or section timeout) or kept failing in process.

A recovery counts once, when the first step after it is done: its cause, its seconds (from the fault
to that step) and the steps it rolled back (the step reached minus the step resumed from). A pod whose
ranks only followed a peer's fault counts nothing: the peer's pod does, or the operator for a lost or
deleted peer. Following is: a peer restarted the rendezvous, or every rank of this pod stopped for its
peers (left the world, or failed only with a peer's fault and was then restarted by its launcher).
The in-loop seconds are those of runs that hosted global rank 0 (one pod per run), so summed over pods
they are the job's (bench/goodput.py's infrastructure goodput).

`PodReporter` publishes the report as the condition `rtj.dev/Progress` of the pod's own status, with
the pod's bound service-account token (a ValidatingAdmissionPolicy in the chart lets that token change
only its own pod's `rtj.dev/` conditions): at once (2 s apart at most) when a recovery starts or ends
or the pod starts or stops training, otherwise every 15 s while the step moves on the pod that hosts
rank 0, and every 5 minutes on the others. Outside a pod (no token) it writes nothing, or appends each
report to $RTJ_REPORT_FILE (tests). The last report also goes into the termination message, so a pod
without a token still reports when it ends.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import logging
import os
import re
import signal
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .ckpt_index import ITERATION_FILE, latest_iteration
from .crashloop import GROUP_JOINED
from .progress import SOURCES, EventTail, read_progress, slowest

log = logging.getLogger("rtj_worker.report")

CONDITION = "rtj.dev/Progress"
INPROCESS, LAUNCHER = "InProcess", "Launcher"
# Condition reasons: what this pod's ranks do. Waiting: none started yet (the rendezvous, or a hot spare
# standing by); Started: a script that has made no step here has had its worker group up STARTED_SECONDS
# without a failure (what a script that reports no steps can show of training); Recovering: a fault is being
# recovered (this pod's or a peer's). The operator shows the RTJ Running only once a pod of its gang says
# Training or Started (policies/phase.ranks_started).
TRAINING, RECOVERING, WAITING, FINISHED, STARTED = "Training", "Recovering", "Waiting", "Finished", "Started"
# Longer than a command that fails at start takes to fail (a typo, a missing module: the imports and the
# process group setup, tens of seconds on a p5), shorter than a user waits to see a healthy job Running.
STARTED_SECONDS = 30.0
INTERVAL_SECONDS = 15.0  # the rank-0 pod's refresh while the step moves
FOLLOWER_SECONDS = 300.0  # the other pods' (the step is the same on every pod)
MIN_SPACING = 2.0  # between two writes, urgent ones included
MAX_CAUSES = 8
SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")

# What ft_launcher (its elastic agent) and its rank monitors log about a restart of the worker group.
SELF_RESTART = re.compile(r"Worker group (FAILED|UNHEALTHY)\. .*will restart worker group")
PEER_RESTART = ("new nodes from group_rank", "Joining cluster restart")  # 0.4.1, 0.6: a peer restarted
RANK_EXIT = re.compile(r"failed \(exitcode: (-?\d+)\) local_rank: (\d+) \(pid: (\d+)\)")
HUNG = ("Did not get initial heartbeat", "Did not get subsequent heartbeat", "has been open for",
        "Was out of section for")
FINISHED_LINE = "worker group successfully finished"



def _cause(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "", name)[:40] or "Unknown"


@dataclass
class Recovery:
    """A fault of this pod's ranks, from when it was seen until the first step after it."""

    tier: str
    cause: str
    detail: str
    at: float  # when the fault happened (or, not known: the last step before it)
    step: int  # the step reached when it happened
    run: tuple[str, int]  # the run it ended
    resumed: int | None = None


@dataclass
class Run:
    key: tuple[str, int]  # (worker group on this node, in-process iteration)
    starts: dict[int, float] = field(default_factory=dict)  # local rank -> when it entered the loop
    pids: set[int] = field(default_factory=set)
    leader: bool = False  # one of its ranks is global rank 0
    resumed: int = 0
    last_step_at: float = 0.0
    source: str | None = None  # where its state came from (rtj_worker.memstate.SOURCES): its slowest rank's
    restore_seconds: float | None = None

    def in_loop(self) -> float:
        return max(0.0, self.last_step_at - max(self.starts.values())) if self.leader and self.starts else 0.0


class Tracker:
    def __init__(self, state_dir: Path, clock: Callable[[], float] = time.time, checkpoint_dir: Path | None = None):
        self.state_dir, self.clock = state_dir, clock
        # Where a script that does not use rtj_worker.progress says its newest checkpoint: Megatron-LM,
        # NeMo and NVRx write <save dir>/latest_checkpointed_iteration.txt (the reference trainer too).
        self._iteration_file = checkpoint_dir / ITERATION_FILE if checkpoint_dir is not None else None
        self._iteration_seen: float | None = None
        self._tail = EventTail(state_dir)
        self.state = WAITING
        self.run: Run | None = None
        self.pending: Recovery | None = None
        self.step = 0
        self.step_at: float | None = None
        self.step_seconds: float | None = None
        self.ckpt: int | None = None
        self.ckpt_at: float | None = None
        self.ckpt_seconds: float | None = None  # how long that checkpoint took to write
        self.copies: dict[str, Any] | None = None  # what a rank holds off the volume (rtj_worker.memstate)
        self.save_stall: float | None = None  # how long the newest save held the training loop up
        self.closed_in_loop = 0.0  # in-loop seconds of the runs that ended
        self.restarts = {INPROCESS: 0, LAUNCHER: 0}
        self.causes: dict[str, int] = {}
        self.last: dict[str, Any] | None = None
        self.urgent = True  # the first report goes out at once: the operator learns the channel works
        self._hung: str = ""
        self._exit: tuple[int, int, int] | None = None
        self._left = False  # this run's ranks left for peers that left (train.FullWorld)
        self._peer_faults: set[int] = set()  # local ranks of this run that failed with a peer's fault
        self._joined_at: float | None = None  # when this node's worker group joined its rendezvous (None: none up)
        self._lock = threading.Lock()
        self._poll_lock = threading.Lock()  # one reader of the ranks' files at a time

    # --- inputs ----------------------------------------------------------------------------------
    def launcher_line(self, message: str, at: float | None = None) -> None:
        """One of ft_launcher's (or its rank monitors') own log records."""
        at = self.clock() if at is None else at
        if SELF_RESTART.search(message):
            self.poll()  # what the ranks wrote before they ended (a `left`) decides whose restart it is
        with self._lock:
            if any(marker in message for marker in HUNG):
                self._hung = message.strip()[:200]
            elif match := RANK_EXIT.search(message):
                self._exit = (int(match[1]), int(match[2]), int(match[3]))
            elif SELF_RESTART.search(message):
                self._joined_at = None
                self._self_restart(at)
            elif any(marker in message for marker in PEER_RESTART):
                self._joined_at = None
                self._end_run()
                self._set_state(RECOVERING)
            elif FINISHED_LINE in message:
                self._set_state(FINISHED)
            elif GROUP_JOINED.search(message):
                self._group_started(at)

    def poll(self) -> None:
        """Read what the ranks wrote since the last poll."""
        with self._poll_lock:
            events = self._tail.read()
            progress = read_progress(self.state_dir)
            iteration = self._read_iteration()
            with self._lock:
                self._fold(events, progress)
                if iteration is not None and iteration[0] > (self.ckpt or 0):
                    self.ckpt, self.ckpt_at = iteration
                joined = self._joined_at
                if self.state == WAITING and joined is not None and self.clock() - joined >= STARTED_SECONDS:
                    self._set_state(STARTED)

    def _read_iteration(self) -> tuple[int, float] | None:
        """The step in latest_checkpointed_iteration.txt and when it was written, when it changed since the
        last read (one stat per poll); None otherwise, or when it holds no step ("release", empty)."""
        if self._iteration_file is None:
            return None
        try:
            mtime = self._iteration_file.stat().st_mtime
        except OSError:
            return None
        if mtime == self._iteration_seen:
            return None
        self._iteration_seen = mtime
        step = latest_iteration(self._iteration_file.parent)
        return (step, mtime) if step > 0 else None

    def _fold(self, events: list[dict[str, Any]], progress: dict[str, Any] | None) -> None:
        """Under the lock: the ranks' events and their newest progress record."""
        for event in events:
            if event.get("e") == "start":
                self._start(event)
            elif event.get("e") == "left":
                self._left = True
            elif event.get("e") == "failed" and not event.get("own"):
                self._peer_faults.add(int(event.get("local") or 0))
            elif event.get("e") == "failed" and event.get("own") and self.pending is None:
                step = int(event.get("step") or self.step)
                self.pending = Recovery(INPROCESS, _cause(str(event.get("cause"))), str(event.get("message") or "")
                                        [:200], float(event.get("t") or self.clock()), step, self._run_key())
                self._set_state(RECOVERING)
        if progress is not None:
            self._progress(progress)

    def _run_key(self) -> tuple[str, int]:
        return self.run.key if self.run else ("", -1)

    def _start(self, event: dict[str, Any]) -> None:
        key = (str(event.get("group") or ""), int(event.get("iteration") or 0))
        local, pid = int(event.get("local") or 0), int(event.get("pid") or 0)
        run = self.run
        # A new run: another (group, iteration), or the same key from new processes (a port picked again).
        if run is None or run.key != key or (pid not in run.pids and local in run.starts):
            self._end_run()
            self._left, self._peer_faults = False, set()
            run = self.run = Run(key, resumed=int(event.get("step") or 0))
            if self.pending is not None:
                self.pending.resumed = run.resumed
        run.starts[local] = float(event.get("t") or self.clock())
        run.pids.add(pid)
        if event.get("source") in SOURCES:
            run.source = slowest(event["source"], run.source)
            with contextlib.suppress(TypeError, ValueError):
                run.restore_seconds = max(run.restore_seconds or 0.0, float(event.get("restoreSeconds") or 0.0))
        if int(event.get("rank", -1)) == 0 and not run.leader:
            run.leader = True
            self.urgent = True

    def _progress(self, p: dict[str, Any]) -> None:
        with contextlib.suppress(TypeError, ValueError):
            if p.get("ckptAt") and int(p.get("ckpt") or 0) > (self.ckpt or 0):
                self.ckpt, self.ckpt_at = int(p["ckpt"]), float(p["ckptAt"])
                self.ckpt_seconds = float(p["ckptSeconds"]) if p.get("ckptSeconds") is not None else None
            if p.get("stepSeconds"):
                self.step_seconds = float(p["stepSeconds"])
            if isinstance(p.get("copies"), dict):
                self.copies = p["copies"]
            if p.get("saveStallSeconds") is not None:
                self.save_stall = float(p["saveStallSeconds"])
            run, pid, at = self.run, int(p.get("pid") or 0), float(p.get("stepAt") or 0)
            if run is None or pid not in run.pids or at <= run.last_step_at or at < max(run.starts.values()):
                return  # an earlier run's, or no step of this run yet
            self.step, self.step_at, run.last_step_at = int(p.get("step") or 0), at, at
            if self.pending is not None and run.key != self.pending.run:
                self._recovered(self.pending, run, float(p.get("firstStepAt") or at))
            self._set_state(TRAINING)

    def _followed_peers(self) -> bool:
        """Whether every rank of this pod's run stopped for its peers: it left the world (FullWorld), or
        its only fault was a peer's (a collective that lost its peer) and it got no further. A lost
        node's survivors wait in the in-process restart for ranks that never come until their launcher
        restarts them (a heartbeat or section timeout); a rank that hangs by itself records no fault."""
        run = self.run
        return self._left or (run is not None and bool(run.starts) and set(run.starts) <= self._peer_faults)

    def _self_restart(self, at: float) -> None:
        """This node's launcher restarts its worker group for a fault of its own ranks, or because they
        stopped for peers that failed or left (then the peers' pods, or the operator, count it)."""
        pending = self.pending
        if self._followed_peers() and (pending is None or pending.tier != INPROCESS):
            self._hung, self._exit, self._left = "", None, False
            self._end_run()
            self._set_state(RECOVERING)
            return
        if pending is not None and pending.tier == LAUNCHER:
            # The previous respawn failed again before its first step: it was a respawn all the same (the
            # launcher spent a restart on it), counted here with no steps rolled back claimed.
            self._count(pending, LAUNCHER, at, rolled_back=None)
            pending = None
        if self._hung:
            cause, detail = "RankHung", self._hung
        elif pending is not None and pending.tier == INPROCESS:
            cause, detail = pending.cause, f"not recovered in process: {pending.detail}"[:200]
        elif self._exit is not None:
            code, local, pid = self._exit
            if code < 0:
                name = signal.Signals(-code).name if -code in signal.valid_signals() else f"signal {-code}"
                cause, detail = "RankKilled", f"local rank {local} (pid {pid}) killed by {name}"
            else:
                cause, detail = "RankExited", f"local rank {local} (pid {pid}) exited with code {code}"
        else:
            cause, detail = "RankFailed", "a rank of this node failed"
        fault_at = pending.at if pending else (self.run.last_step_at if self.run and self.run.last_step_at else at)
        step = pending.step if pending else self.step
        self.pending = Recovery(LAUNCHER, cause, detail, fault_at, step, self._run_key())
        self._hung, self._exit = "", None
        self._end_run()
        self._set_state(RECOVERING)

    def _group_started(self, at: float) -> None:
        """A script that reports no steps (neither rtj_worker.progress nor a step this pod can read) never
        shows its next run's first step, so its launcher's restart would stay pending for ever: it is
        counted when the new worker group has joined its rendezvous, its seconds the fault's to that
        start, with no steps rolled back claimed (none are known). A script that reports steps is counted
        at its first step (_progress), which is when its recovery really ends."""
        self._joined_at = at
        pending = self.pending
        if pending is None or pending.tier != LAUNCHER or self.step_at is not None:
            return
        self._count(pending, LAUNCHER, at, rolled_back=None)
        self._set_state(WAITING)

    def _recovered(self, rec: Recovery, run: Run, at: float) -> None:
        # Recovered in the same processes only if the same worker group went on to the next iteration.
        tier = rec.tier if rec.tier == LAUNCHER or run.key[0] == rec.run[0] else LAUNCHER
        resumed = rec.resumed if rec.resumed is not None else run.resumed
        self._count(rec, tier, at, rolled_back=max(0, rec.step - resumed))
        if run.source:
            self.last.update(restoredFrom=run.source, restoreSeconds=_round(run.restore_seconds))

    def _count(self, rec: Recovery, tier: str, at: float, rolled_back: int | None) -> None:
        self.restarts[tier] += 1
        key = f"{tier}/{rec.cause}"
        if key not in self.causes and len(self.causes) >= MAX_CAUSES:
            key = f"{tier}/Other"
        self.causes[key] = self.causes.get(key, 0) + 1
        self.last = {"tier": tier, "cause": rec.cause, "detail": rec.detail, "at": round(rec.at, 2),
                     "seconds": round(at - rec.at, 2)}
        if rolled_back is not None:
            self.last["rolledBack"] = rolled_back
        self.pending = None
        self.urgent = True

    def _end_run(self) -> None:
        if self.run is not None:
            self.closed_in_loop += self.run.in_loop()
            if self.run.leader:
                self.urgent = True  # leadership ends with the run
        self.run = None

    def _set_state(self, state: str) -> None:
        if state != self.state and not (self.state == FINISHED and state != FINISHED):
            self.state = state
            self.urgent = True

    # --- output ----------------------------------------------------------------------------------
    def report(self) -> dict[str, Any]:
        with self._lock:
            run = self.run
            out: dict[str, Any] = {
                "v": 1, "state": self.state, "step": self.step, "stepAt": _round(self.step_at),
                "stepSeconds": _round(self.step_seconds, 4), "ckpt": self.ckpt, "ckptAt": _round(self.ckpt_at),
                "ckptSeconds": _round(self.ckpt_seconds), "saveStallSeconds": _round(self.save_stall, 3),
                "leader": bool(run and run.leader), "resumed": run.resumed if run else None,
                "runSince": round(min(run.starts.values()), 2) if run and run.starts else None,
                "inLoopSeconds": round(self.closed_in_loop + (run.in_loop() if run else 0.0), 2),
                "restarts": dict(self.restarts), "causes": dict(self.causes), "last": self.last,
                "copies": self.copies,
            }
            if run is not None and run.source:
                out["restoredFrom"], out["restoreSeconds"] = run.source, _round(run.restore_seconds)
            if self.pending is not None:
                out["recovering"] = {"tier": self.pending.tier, "cause": self.pending.cause,
                                     "at": round(self.pending.at, 2)}
            return {k: v for k, v in out.items() if v is not None}

    def take_urgent(self) -> bool:
        with self._lock:
            urgent, self.urgent = self.urgent, False
            return urgent

    @property
    def leader(self) -> bool:
        return bool(self.run and self.run.leader)


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


# --- where a report goes ---------------------------------------------------------------------------------
class Sink(Protocol):
    def write(self, condition: dict[str, Any]) -> None: ...


class FileSink:
    """Appends each condition as a JSON line (tests: RTJ_REPORT_FILE)."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)

    def write(self, condition: dict[str, Any]) -> None:
        with open(self.path, "a") as out:
            out.write(json.dumps(condition) + "\n")


class ReportRejected(Exception):
    def __init__(self, status: int, body: str):
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status


class ApiSink:
    """A strategic-merge patch of the pod's own status (only its rtj.dev/ condition) with the pod's
    bound service-account token, as a kubelet's client would send it. The token file is read at every
    write: the kubelet rotates it."""

    def __init__(self, host: str, port: int, namespace: str, pod: str, sa_dir: Path = SA_DIR, timeout: float = 10.0):
        self.host, self.port, self.namespace, self.pod = host, port, namespace, pod
        self.sa_dir, self.timeout = sa_dir, timeout
        self.bytes_sent = 0

    @classmethod
    def from_env(cls, env: dict[str, str], sa_dir: Path = SA_DIR) -> ApiSink | None:
        host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
        if not host or not port or not (sa_dir / "token").exists():
            return None
        claims = token_claims((sa_dir / "token").read_text().strip()).get("kubernetes.io") or {}
        namespace = env.get("POD_NAMESPACE") or claims.get("namespace") or ""
        pod = env.get("POD_NAME") or (claims.get("pod") or {}).get("name") or ""
        if not namespace or not pod:
            return None
        return cls(host, int(port), namespace, pod, sa_dir)

    def write(self, condition: dict[str, Any]) -> None:
        token = (self.sa_dir / "token").read_text().strip()
        uid = ((token_claims(token).get("kubernetes.io") or {}).get("pod") or {}).get("uid")
        body: dict[str, Any] = {"status": {"conditions": [condition]}}
        if uid:
            body["metadata"] = {"uid": uid}  # a precondition: this pod, never a new one of the same name
        data = json.dumps(body, separators=(",", ":")).encode()
        context = ssl.create_default_context(cafile=str(self.sa_dir / "ca.crt"))
        conn = http.client.HTTPSConnection(self.host, self.port, context=context, timeout=self.timeout)
        try:
            conn.request("PATCH", f"/api/v1/namespaces/{self.namespace}/pods/{self.pod}/status", body=data,
                         headers={"Authorization": f"Bearer {token}", "Accept": "application/json",
                                  "Content-Type": "application/strategic-merge-patch+json"})
            response = conn.getresponse()
            text = response.read().decode(errors="replace")
        finally:
            conn.close()
        self.bytes_sent += len(data)
        if response.status >= 300:
            raise ReportRejected(response.status, text)


def token_claims(token: str) -> dict[str, Any]:
    """The claims of a service-account token (its payload, not verified: our own token, for our own
    pod's name and uid)."""
    try:
        payload = token.split(".")[1]
        return dict(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))))
    except (IndexError, ValueError, TypeError):
        return {}


def sink_from_env(env: dict[str, str]) -> Sink | None:
    if env.get("RTJ_REPORT_FILE"):
        return FileSink(env["RTJ_REPORT_FILE"])
    return ApiSink.from_env(env)


# --- when to write ------------------------------------------------------------------------------------------
class PodReporter:
    """Writes the tracker's report when the policy above says so; a thread polls every `poll` seconds."""

    def __init__(self, tracker: Tracker, sink: Sink | None, clock: Callable[[], float] = time.time,
                 interval: float = INTERVAL_SECONDS, follower_interval: float = FOLLOWER_SECONDS,
                 min_spacing: float = MIN_SPACING, poll: float = 0.5):
        self.tracker, self.sink, self.clock = tracker, sink, clock
        self.interval, self.follower_interval = interval, follower_interval
        self.min_spacing, self.poll = min_spacing, poll
        self.writes = 0
        self._written: dict[str, Any] | None = None
        self._written_at = 0.0
        self._urgent = False
        self._since = clock()  # when the condition's status/reason last changed
        self._retry_at = 0.0
        self._failures = 0
        self._logged: set[int] = set()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> PodReporter:
        # Polled even with nowhere to write: the tracker must see the ranks' steps and runs in the order
        # they happen, between the launcher's lines, for the termination message's report to be right.
        self._thread = threading.Thread(target=self._loop, name="rtj-report", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> dict[str, Any]:
        """Stop polling; the last report (for the termination message)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        self.tracker.poll()
        return self.tracker.report()

    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            try:
                self.tracker.poll()
                self.tick()
            except Exception:  # reporting must never end the pod
                log.exception("report failed")

    def tick(self) -> bool:
        """Write now if due; True if written."""
        now = self.clock()
        self._urgent = self.tracker.take_urgent() or self._urgent
        report = self.tracker.report()
        if self.sink is None or now < self._retry_at or now - self._written_at < self.min_spacing:
            return False
        changed = self._written is None or _content(report) != _content(self._written)
        every = self.interval if self.tracker.leader else self.follower_interval
        if not (self._urgent or (changed and now - self._written_at >= every)):
            return False
        condition = self.condition(report, now)
        try:
            self.sink.write(condition)
        except Exception as exc:
            self._failures += 1
            self._retry_at = now + min(300.0, 5.0 * 2 ** min(self._failures - 1, 6))
            status = getattr(exc, "status", 0)
            if status not in self._logged:  # once per kind: a pod without the RBAC would log every 5 min
                self._logged.add(status)
                log.warning("could not publish the pod's progress (retrying in %.0fs): %s", self._retry_at - now, exc)
            return False
        self._failures, self._urgent = 0, False
        self._written, self._written_at = report, now
        self.writes += 1
        return True

    def condition(self, report: dict[str, Any], now: float) -> dict[str, Any]:
        state = report["state"]
        if self._written is None or self._written["state"] != state:
            self._since = now
        return {"type": CONDITION, "status": "True" if state == TRAINING else "False", "reason": state,
                "message": json.dumps({**report, "at": round(now, 2)}, separators=(",", ":")),
                "lastProbeTime": _rfc3339(now), "lastTransitionTime": _rfc3339(self._since)}


def _content(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if k != "at"}


def _rfc3339(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))
