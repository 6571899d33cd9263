"""`rtj-worker -- python -m rtj_worker.train ...`: what each pod of a ResilientTrainingJob runs.

Reads the environment the operator sets (builders/job.py), waits (bounded) until node 0's DNS
name resolves, then runs ft_launcher with the flags of the installed NVRx (rtj_worker.launch).
Signals are passed through. The exit code and /dev/termination-log tell the operator what
happened (rtj_worker.exit_codes):

- 0: training finished;
- 64 CONFIG_ERROR: bad settings, or the training script/module does not exist;
- 65 PERMANENT_FAILURE: the script asked to stop for good, or NVRx 0.6's progress tracker refused
  further restarts (no checkpoint progress over --ft-max-no-progress-cycles restarts);
- 70 LAUNCHER_BUDGET_EXHAUSTED: ranks ran and kept failing; ft_launcher spent its restarts here;
- 71 RENDEZVOUS_FAILED: peers never resolved or never joined: no rank was ever started;
- 72 RENDEZVOUS_HOST_LOST: ranks ran, then the rendezvous store on node 0 stopped answering (node 0
  was lost or its pod ended): a peer's failure, which the operator does not charge to this pod.

No torch import here (about 6 s at every pod start): checkpoint steps come from ckpt_index.
"""

from __future__ import annotations

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
from pathlib import Path

from . import exit_codes
from .ckpt_index import latest_step
from .launch import (
    NO_PROGRESS_LINE,
    RENDEZVOUS_DONE_LINES,
    STORE_LOST_LINES,
    ConfigError,
    LaunchConfig,
    launcher_argv,
    launcher_env,
    training_command,
)

__all__ = ["ConfigError", "LaunchConfig", "launcher_argv", "main", "run"]
log = logging.getLogger("rtj_worker.entrypoint")
TERMINATION_LOG = "/dev/termination-log"


def wait_for_dns(host: str, timeout: float, interval: float = 2.0) -> bool:
    """Headless Service records appear only once pods exist: wait for node 0's name."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.getaddrinfo(host, None)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)


def write_termination(code: int, reason: str, checkpoint_dir: str, path: str = TERMINATION_LOG,
                      uid: str | None = None) -> None:
    report = {"exitCode": code, "reason": reason, "checkpointStep": latest_step(Path(checkpoint_dir), uid)}
    try:
        Path(path).write_text(json.dumps(report))
    except OSError:
        pass  # not in a pod
    log.info("exit %d: %s", code, reason)


def ranks_running(launcher_pid: int, command: list[str]) -> bool:
    """Whether a descendant of the launcher runs the training command: ft_launcher starts ranks only
    once the rendezvous has completed, so this tells "started" from "never joined"."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    wanted = "\0".join(command).encode()
    todo = list(children.get(launcher_pid, []))
    while todo:
        pid = todo.pop()
        try:
            if Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0") == wanted:
                return True
        except OSError:
            pass
        todo += children.get(pid, [])
    return False


class LauncherWatch:
    """Copies the launcher's output to ours and notes what it says about rendezvous and restarts."""

    def __init__(self, proc: subprocess.Popen[bytes]):
        self.started = False
        self.no_progress = False
        self.store_lost = False
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
            if NO_PROGRESS_LINE in line:
                self.no_progress = True
            if any(marker in line for marker in STORE_LOST_LINES):
                self.store_lost = True

    def join(self, timeout: float = 10) -> None:
        self._thread.join(timeout)


def run(command: list[str], env: dict[str, str]) -> int:
    termination = env.get("RTJ_TERMINATION_LOG", TERMINATION_LOG)
    uid = env.get("RTJ_UID") or None

    def finish(code: int, reason: str, checkpoint_dir: str) -> int:
        write_termination(code, reason, checkpoint_dir, termination, uid)
        return code

    try:
        cfg = LaunchConfig.from_env(env)
        command = training_command(command)
        argv = launcher_argv(cfg, command)
        child_env = launcher_env(cfg, env)
    except ConfigError as exc:
        return finish(exit_codes.CONFIG_ERROR, str(exc), env.get("RTJ_CHECKPOINT_DIR", "/checkpoints"))
    if not wait_for_dns(cfg.rdzv_host, cfg.rdzv_timeout):
        return finish(exit_codes.RENDEZVOUS_FAILED, f"{cfg.rdzv_host} did not resolve within "
                      f"{cfg.rdzv_timeout}s", cfg.checkpoint_dir)

    # Ranks leave a 'permanent' marker here to stop for good (rtj_worker.events.mark).
    state_dir = Path(env.get("RTJ_STATE_DIR") or tempfile.mkdtemp(prefix="rtj-state-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    child_env["RTJ_STATE_DIR"] = str(state_dir)
    log.info("starting: %s", " ".join(argv))
    proc = subprocess.Popen(argv, env=child_env, start_new_session=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT)
    watch = LauncherWatch(proc)

    def forward(signum: int, _frame: object) -> None:
        # ft_launcher stops its workers and rank monitors on SIGTERM.
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    permanent = state_dir / "permanent"
    started = False
    while proc.poll() is None:
        if permanent.exists():
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
    if permanent.exists():
        return finish(exit_codes.PERMANENT_FAILURE, permanent.read_text().strip() or "permanent failure",
                      cfg.checkpoint_dir)
    if code == 0:
        return finish(exit_codes.OK, "training finished", cfg.checkpoint_dir)
    if watch.no_progress:
        return finish(exit_codes.PERMANENT_FAILURE, f"ft_launcher stopped restarting: no checkpoint progress in "
                      f"{cfg.max_no_progress_cycles} consecutive restart cycles", cfg.checkpoint_dir)
    if not started:
        return finish(exit_codes.RENDEZVOUS_FAILED, f"ft_launcher exited {code} before any rank started "
                      "(rendezvous did not complete)", cfg.checkpoint_dir)
    if watch.store_lost and cfg.node_rank != 0:
        return finish(exit_codes.RENDEZVOUS_HOST_LOST, f"ft_launcher exited {code}: the rendezvous store on "
                      f"{cfg.rdzv_host} (node 0) stopped answering", cfg.checkpoint_dir)
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
