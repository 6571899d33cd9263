"""`rtj-worker -- python -m rtj_worker.train ...`: what each pod of a ResilientTrainingJob runs.

Reads the environment the operator sets (builders/job.py), waits (bounded) until node 0's DNS
name resolves, then runs ft_launcher with the flags of the installed NVRx (rtj_worker.launch). The
exit code and /dev/termination-log ({"exitCode", "reason", "checkpointStep"}) tell the operator what
happened (rtj_worker.exit_codes); what ft_launcher says is read only from its own log records,
never from a rank's output:

- 0: training finished for this job: the reference trainer's completion marker for this RTJ uid
  names the newest committed step (any other training command: this node's ranks all exited 0);
  a standby whose gang finished exits 0 too;
- 64 CONFIG_ERROR: bad settings, the training script/module does not exist, or the node's NVIDIA
  driver or the image's NCCL does not fit (rtj_worker.requirements);
- 65 PERMANENT_FAILURE: the script asked to stop for good (a rank left a 'permanent' marker);
- 66 CRASH_LOOP: the ranks failed the same way twice in a row (RTJ_CRASH_LOOP_REPEATS) with no progress:
  the launcher was stopped before spending its restarts; the report carries the traceback's last lines;
- 70 LAUNCHER_BUDGET_EXHAUSTED: ranks ran and kept failing; ft_launcher spent its restarts here;
- 71 RENDEZVOUS_FAILED: peers never joined: no rank was ever started, or a later rendezvous round
  timed out (the peers this node trained with were lost and not replaced in time);
- 72 RENDEZVOUS_HOST_LOST: ranks ran, then the rendezvous store on node 0 stopped answering (node 0
  was lost or its pod ended; NVRx 0.4.1's RendezvousConnectionError or 0.6's DistNetworkError): a
  peer's failure, which the operator does not charge to this pod;
- 73 NODE_UNHEALTHY: NVRx found this node unhealthy (health check, or a rank's ExcludeThisNode) and
  its launcher left (0.4.1 and 0.6 then exit 0, 0.7 exits 1);
- 74 GANG_STOPPED: ft_launcher exited 0 without training having finished: it left because the
  gang stopped (the rendezvous was closed, or this node was a standby when the others stopped); or, with
  NVRx 0.7, exited 1 because another node's launcher spent its restarts and closed the rendezvous while
  this one waited for the next round;
- 75 NO_PROGRESS: NVRx 0.6's progress tracker refused further restarts (no checkpoint progress in
  --ft-max-no-progress-cycles restarts);
- 76 RENDEZVOUS_HOST_UNRESOLVED: the rendezvous host's name (the coordinator's, or node 0's) did not
  resolve within the rendezvous timeout: ft_launcher was not started (cluster DNS, not the script);
- 78 RENDEZVOUS_CLOSED: ranks ran, then the rendezvous was closed for good (NVRx's barrier counted more
  unhealthy nodes than the spares allow, or a peer closed it): a new gang, charged once;
- 79 LAUNCHER_DECLINED: NVRx 0.7's launcher exited 93, "do not requeue" (no progress across restarts,
  or its attribution said stop): the job fails;
- 128 + signal (143 SIGTERM, 130 SIGINT): the pod was told to stop. Whatever ft_launcher returned:
  the entrypoint asks the ranks to save and stop (rtj_worker.stop) and forwards the signal to
  ft_launcher (which forwards it to the ranks and SIGKILLs them after --term-timeout), and exits
  once the launcher has, or at once while it waits for DNS. Everything fits in RTJ_GRACE_SECONDS
  (the pod's terminationGracePeriodSeconds, 120 by default).

No torch import here (about 6 s at every pod start): checkpoint steps come from ckpt_index.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import exit_codes, progress, requirements, stop
from .ckpt_index import claim_attempt, finished, latest_iteration, latest_step
from .crashloop import CrashLoop
from .launch import (
    GROUP_FINISHED_LINE,
    NO_PROGRESS_LINE,
    PEER_GAVE_UP_LINE,
    RENDEZVOUS_CLOSED_LINE,
    RENDEZVOUS_DONE_LINES,
    RENDEZVOUS_TIMEOUT_LINE,
    STORE_LOST_LINES,
    UNHEALTHY_LINE,
    ConfigError,
    LaunchConfig,
    launcher_argv,
    launcher_env,
    launcher_message,
    nvrx_message,
    runs_reference_trainer,
    training_command,
)
from .report import PodReporter, Tracker, sink_from_env

__all__ = ["ConfigError", "LaunchConfig", "launcher_argv", "main", "run"]
log = logging.getLogger("rtj_worker.entrypoint")
TERMINATION_LOG = "/dev/termination-log"
# Bounds of the exit report's text, so that it fits the 4096 bytes of a termination message with the
# pod's last progress report (about 800 bytes).
MAX_REASON_CHARS, MAX_LINES_CHARS = 600, 1800


def wait_for_dns(host: str, timeout: float, interval: float = 2.0, cancel: threading.Event | None = None) -> bool:
    """Headless Service records appear only once pods exist: wait for node 0's name. Resolved in a
    thread so that `cancel` (a signal) ends the wait at once: getaddrinfo may block for seconds."""
    resolved, give_up = threading.Event(), threading.Event()

    def resolve() -> None:
        while not give_up.is_set():
            try:
                socket.getaddrinfo(host, None)
                resolved.set()
                return
            except OSError:
                give_up.wait(interval)

    threading.Thread(target=resolve, name="rtj-dns", daemon=True).start()
    deadline = time.monotonic() + timeout
    try:
        while not resolved.wait(0.1):
            if (cancel is not None and cancel.is_set()) or time.monotonic() >= deadline:
                return False
        return True
    finally:
        give_up.set()


def write_termination(code: int, reason: str, checkpoint_dir: str, path: str = TERMINATION_LOG,
                      uid: str | None = None, progress: dict[str, Any] | None = None,
                      lines: tuple[str, ...] = ()) -> None:
    """The exit report; with `progress`, the pod's last progress report (rtj_worker.report), which the
    rate limit may not have published yet; with `lines`, the last lines of a rank's traceback, newest
    kept (the termination message holds 4096 bytes: all fit)."""
    # The newest committed step any of the three ways a script can say it: the reference trainer's layout,
    # a latest_checkpointed_iteration.txt (Megatron-LM, NeMo, NVRx), the ranks' own commit reports
    # (rtj_worker.progress: the reference trainer and scripts on the progress library).
    reported = (progress or {}).get("ckpt")
    report: dict[str, Any] = {"exitCode": code, "reason": reason[:MAX_REASON_CHARS],
                              "checkpointStep": max(latest_step(Path(checkpoint_dir), uid),
                                                    latest_iteration(Path(checkpoint_dir)),
                                                    reported if isinstance(reported, int) else 0)}
    if progress is not None:
        report["progress"] = progress
    kept: list[str] = []
    for line in reversed(lines):
        if sum(len(k) for k in kept) + len(line) > MAX_LINES_CHARS:
            break
        kept.insert(0, line)
    if kept:
        report["lines"] = kept
    try:
        Path(path).write_text(json.dumps(report))
    except OSError:
        pass  # not in a pod
    log.info("exit %d: %s", code, reason)


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], list(children.get(pid, []))
    while todo:
        child = todo.pop()
        found.append(child)
        todo += children.get(child, [])
    return found


def ranks_running(launcher_pid: int, command: list[str]) -> bool:
    """Whether a descendant of the launcher runs the training command: ft_launcher starts ranks only
    once the rendezvous has completed, so this tells "started" from "never joined"."""
    wanted = "\0".join(command).encode()
    for pid in descendants(launcher_pid):
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0") == wanted:
                return True
        except OSError:
            pass
    return False


def kill_all(pgid: int, pids: list[int], sig: int = signal.SIGKILL) -> None:
    """The launcher's process group (itself, its rank monitors) and `pids` (ranks run in sessions of
    their own, out of that group)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


class LauncherWatch:
    """Copies the launcher's output to ours and notes what it says about rendezvous and restarts."""

    def __init__(self, proc: subprocess.Popen[bytes], tracker: Tracker | None = None,
                 progress: Callable[[], tuple[int, ...]] | None = None, repeats: int = 2):
        self.tracker = tracker
        # Each failed worker group, with the progress then (step, checkpoints): a crash loop stops the pod.
        self.crash = CrashLoop(repeats)
        self._progress = progress or (lambda: ())
        self.started = False
        self.no_progress = False
        self.store_lost = False
        self.rendezvous_timed_out = False
        self.rendezvous_closed = False
        self.unhealthy = False
        self.peer_gave_up = False  # NVRx 0.7: another launcher closed the rendezvous for its failure
        self.group_finished = False
        self._pid = proc.pid
        self._thread = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        self._thread.start()

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        out = sys.stdout.buffer
        for raw in iter(proc.stdout.readline, b""):
            out.write(raw)
            out.flush()
            line = raw.decode(errors="replace")
            if any(marker in line for marker in RENDEZVOUS_DONE_LINES):
                self.started = True
            if self.tracker is not None and (record := nvrx_message(line, self._pid)) is not None:
                self.tracker.launcher_line(record)
            if self.crash.line(line):
                self.crash.group_failed(self._progress())
            message = launcher_message(line, self._pid)
            if message is None:
                continue
            self.no_progress = self.no_progress or NO_PROGRESS_LINE in message
            self.store_lost = self.store_lost or any(marker in message for marker in STORE_LOST_LINES)
            self.rendezvous_timed_out = self.rendezvous_timed_out or RENDEZVOUS_TIMEOUT_LINE in message
            self.rendezvous_closed = self.rendezvous_closed or RENDEZVOUS_CLOSED_LINE in message
            self.unhealthy = self.unhealthy or UNHEALTHY_LINE in message
            self.peer_gave_up = self.peer_gave_up or PEER_GAVE_UP_LINE in message
            self.group_finished = self.group_finished or GROUP_FINISHED_LINE in message

    def join(self, timeout: float = 10) -> None:
        self._thread.join(timeout)


class Shutdown:
    """SIGTERM/SIGINT: remembered (the exit code is 128 + signal whatever ft_launcher returns), the
    ranks asked to save and stop (rtj_worker.stop), then forwarded to ft_launcher.

    Forwarded to the launcher alone first: its rank monitors share its process group, and the ranks
    heartbeat to them while they save; the launcher stops them itself once the ranks have exited.
    What is left of the group when the launcher is gone (it dies of the signal before its first
    rendezvous) is killed after it. A second signal kills everything at once."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.at = 0.0
        self.cancel = threading.Event()
        self.state_dir: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.rank_stop_seconds = 0.0
        self._forwarded = False
        self._previous = {sig: signal.signal(sig, self) for sig in (signal.SIGTERM, signal.SIGINT)}

    def __call__(self, signum: int, _frame: object) -> None:
        if self.signum is not None:
            if self.proc is not None:
                kill_all(self.proc.pid, descendants(self.proc.pid))
            return
        self.signum, self.at = signum, time.monotonic()
        log.warning("received %s", self.name)
        self.cancel.set()
        self.forward()

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum else ""

    def attach(self, proc: subprocess.Popen[bytes], state_dir: Path, rank_stop_seconds: float) -> None:
        self.state_dir, self.rank_stop_seconds = state_dir, rank_stop_seconds
        self.proc = proc
        self.forward()  # a signal that came while it was starting

    def forward(self) -> None:
        if self.signum is None or self.proc is None or self._forwarded:
            return
        self._forwarded = True
        if self.state_dir is not None:
            stop.request(self.state_dir, self.signum, time.time() + self.rank_stop_seconds)
        with contextlib.suppress(ProcessLookupError):
            self.proc.send_signal(self.signum)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def run(command: list[str], env: dict[str, str]) -> int:
    termination = env.get("RTJ_TERMINATION_LOG", TERMINATION_LOG)
    uid = env.get("RTJ_UID") or None
    shutdown = Shutdown()  # first: a signal may come at any time
    try:
        return _run(command, env, shutdown, termination, uid)
    finally:
        shutdown.restore()


def _run(command: list[str], env: dict[str, str], shutdown: Shutdown, termination: str, uid: str | None) -> int:
    reporter: PodReporter | None = None

    def finish(code: int, reason: str, checkpoint_dir: str, lines: tuple[str, ...] = ()) -> int:
        write_termination(code, reason, checkpoint_dir, termination, uid,
                          reporter.stop() if reporter is not None else None, lines)
        return code

    def stopped(checkpoint_dir: str, what: str) -> int:
        assert shutdown.signum is not None
        return finish(128 + shutdown.signum, f"received {shutdown.name} {what}", checkpoint_dir)

    try:
        cfg = LaunchConfig.from_env(env)
        if lacking := requirements.image_problems():
            raise ConfigError("; ".join(lacking))
        command = training_command(command)
        argv = launcher_argv(cfg, command)
        child_env = launcher_env(cfg, env)
    except ConfigError as exc:
        return finish(exit_codes.CONFIG_ERROR, str(exc), env.get("RTJ_CHECKPOINT_DIR", "/checkpoints"))
    # The node's driver, the image's NCCL and its EFA plugin: before anything starts.
    network, no_plugin = requirements.nccl_network(env, requirements.efa_devices(),
                                                   requirements.ofi_plugin(env.get("LD_LIBRARY_PATH", "")))
    if lacking := [*requirements.check(env), *no_plugin]:
        return finish(exit_codes.CONFIG_ERROR, "; ".join(lacking), cfg.checkpoint_dir)
    child_env.update(network)
    log.info("waiting for %s to resolve", cfg.rdzv_host)
    resolved = wait_for_dns(cfg.rdzv_host, cfg.rdzv_timeout, cancel=shutdown.cancel)
    if shutdown.signum is not None:
        return stopped(cfg.checkpoint_dir, f"while waiting for {cfg.rdzv_host} (node 0) to resolve: "
                       "ft_launcher was not started")
    if not resolved:
        return finish(exit_codes.RENDEZVOUS_HOST_UNRESOLVED, f"{cfg.rdzv_host} did not resolve within "
                      f"{cfg.rdzv_timeout}s", cfg.checkpoint_dir)

    # Ranks leave a 'permanent' marker here to stop for good (rtj_worker.events.mark); the entrypoint
    # leaves a 'stopping' request for them (rtj_worker.stop).
    state_dir = Path(env.get("RTJ_STATE_DIR") or tempfile.mkdtemp(prefix="rtj-state-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    for name in (stop.STOPPING, progress.PROGRESS, progress.EVENTS):
        (state_dir / name).unlink(missing_ok=True)
    child_env["RTJ_STATE_DIR"] = str(state_dir)
    if shutdown.signum is not None:
        return stopped(cfg.checkpoint_dir, "before ft_launcher was started")
    # This gang attempt starts: ranks of older ones (a pod left on a lost node) commit nothing from now on.
    try:
        claim_attempt(Path(cfg.checkpoint_dir), cfg.uid, int(env.get("RTJ_ATTEMPT") or 0))
    except (OSError, ValueError) as exc:
        log.warning("could not record gang attempt %s in %s (the attempt fence): %s", env.get("RTJ_ATTEMPT"),
                    cfg.checkpoint_dir, exc)
    # The pod's one writer of its progress: what its ranks and its launcher say, coalesced.
    tracker = Tracker(state_dir, checkpoint_dir=Path(cfg.checkpoint_dir))
    reporter = PodReporter(tracker, sink_from_env(env)).start()
    log.info("starting: %s", " ".join(argv))
    proc = subprocess.Popen(argv, env=child_env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    watch = LauncherWatch(proc, tracker, lambda: (tracker.step, tracker.ckpt or 0,
                                                  latest_step(Path(cfg.checkpoint_dir), cfg.uid) or 0),
                          cfg.crash_loop_repeats)
    shutdown.attach(proc, state_dir, cfg.rank_stop_seconds)
    permanent = state_dir / "permanent"
    started = False
    started_at_signal: bool | None = None
    killed = False
    while proc.poll() is None:
        if shutdown.signum is not None:
            if started_at_signal is None:
                started_at_signal = started or watch.started
            if time.monotonic() - shutdown.at > cfg.hard_stop_seconds:
                # The launcher outlived its own --term-timeout: report before the kubelet's SIGKILL.
                kill_all(proc.pid, descendants(proc.pid))
                killed = True
                break
        elif permanent.exists() or watch.crash.loop is not None:
            # Restarting would fail the same way: stop the launcher instead of spending its budget.
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            break
        started = started or ranks_running(proc.pid, command)
        time.sleep(0.1 if not started else 0.5)
    code = proc.wait()
    watch.join()
    started = started or watch.started
    if shutdown.signum is not None:
        kill_all(proc.pid, [])  # what the launcher left in its group (it died of the signal)
        started_at_signal = started if started_at_signal is None else started_at_signal
        phase = ("with ranks running: they were asked to save and stop" if started_at_signal
                 else "during the rendezvous: no rank had started")
        end = (f"ft_launcher did not stop within {cfg.hard_stop_seconds:g}s and was killed" if killed
               else f"ft_launcher exited {code}")
        return stopped(cfg.checkpoint_dir, f"{phase}; {end}")
    if permanent.exists():
        return finish(exit_codes.PERMANENT_FAILURE, permanent.read_text().strip() or "permanent failure",
                      cfg.checkpoint_dir)
    if watch.crash.loop is not None:
        return finish(exit_codes.CRASH_LOOP, watch.crash.reason(), cfg.checkpoint_dir, watch.crash.loop.lines)
    if watch.unhealthy:
        return finish(exit_codes.NODE_UNHEALTHY, f"ft_launcher exited {code}: NVRx found this node unhealthy "
                      "(health check or a rank's ExcludeThisNode request)", cfg.checkpoint_dir)
    if code == 0:
        if finished(Path(cfg.checkpoint_dir), cfg.uid) is not None:
            return finish(exit_codes.OK, "training finished", cfg.checkpoint_dir)
        if watch.group_finished and not runs_reference_trainer(command):
            # A script of the user's cannot be expected to leave rtj_worker's marker: its ranks' word.
            return finish(exit_codes.OK, "training finished (every rank of this node exited 0)", cfg.checkpoint_dir)
        return finish(exit_codes.GANG_STOPPED, "ft_launcher exited 0 but training has not finished for this job "
                      f"(no completion marker for uid {cfg.uid!r} at the newest checkpoint): the gang stopped "
                      "(rendezvous closed, or this node was a standby)", cfg.checkpoint_dir)
    if code == exit_codes.NVRX_DO_NOT_RESTART:  # NVRx 0.7's "do not requeue", whatever else it logged
        return finish(exit_codes.LAUNCHER_DECLINED, f"ft_launcher exited {code}: NVRx concluded the job must not "
                      "be restarted (no checkpoint progress across restarts, or its failure attribution said "
                      "stop)", cfg.checkpoint_dir)
    if watch.peer_gave_up:
        return finish(exit_codes.GANG_STOPPED, f"ft_launcher exited {code}: another node's launcher spent its "
                      "restarts and closed the rendezvous; this node's launcher was waiting for the next round "
                      "(NVRx 0.7): the gang stopped", cfg.checkpoint_dir)
    if watch.no_progress:
        return finish(exit_codes.NO_PROGRESS, f"ft_launcher exited {code}: it stopped restarting, no checkpoint "
                      f"progress in {cfg.max_no_progress_cycles} consecutive restart cycles", cfg.checkpoint_dir)
    if not started:
        return finish(exit_codes.RENDEZVOUS_FAILED, f"ft_launcher exited {code} before any rank started "
                      "(rendezvous did not complete)", cfg.checkpoint_dir)
    if watch.store_lost and not cfg.hosts_store:
        host = "the coordinator" if cfg.coordinator else "node 0"
        return finish(exit_codes.RENDEZVOUS_HOST_LOST, f"ft_launcher exited {code}: the rendezvous store on "
                      f"{cfg.rdzv_host} ({host}) stopped answering", cfg.checkpoint_dir)
    if watch.rendezvous_closed:
        return finish(exit_codes.RENDEZVOUS_CLOSED, f"ft_launcher exited {code}: its ranks had run, then the "
                      "rendezvous was closed for good (more unhealthy nodes over this attempt than its spares "
                      "allow, or a peer closed it)", cfg.checkpoint_dir)
    if watch.rendezvous_timed_out:
        # Its ranks ran, then the peers were lost and no replacement joined within the timeout: the
        # rendezvous failed, as for a gang that never met (excused while the platform's fault that took
        # the peers is being recovered, e.g. its replacement waiting for capacity), not its ranks.
        return finish(exit_codes.RENDEZVOUS_FAILED, f"ft_launcher exited {code}: its ranks had run, then a "
                      f"rendezvous round did not complete within {cfg.rdzv_timeout}s (peers lost and not "
                      "replaced in time)", cfg.checkpoint_dir)
    return finish(exit_codes.LAUNCHER_BUDGET_EXHAUSTED, f"ft_launcher exited {code} after spending its "
                  f"{cfg.max_restarts} restarts", cfg.checkpoint_dir)


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rtj-worker %(levelname)s %(message)s")
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["--help"], ["-h"]):
        print(__doc__)
        sys.exit(0)
    command = args[args.index("--") + 1:] if "--" in args else args
    sys.exit(run(command, dict(os.environ)))


if __name__ == "__main__":
    main()
