"""SIGTERM/SIGINT in the pod: the entrypoint's stop request, and what a training rank does with it.

ft_launcher forwards a signal to its ranks in two cases: the pod is being deleted (the entrypoint got
SIGTERM and forwarded it) and the launcher stopping its workers to restart them. Only the first is
worth a final checkpoint, so the entrypoint first writes <RTJ_STATE_DIR>/stopping (the signal and a
deadline), then forwards. A rank that gets a signal without that file ends at once, with the code
the default action would report: restarts stay as fast as before.

With the file, a rank in the training loop votes to stop in the next step's all-reduce; every rank
(on every node) then saves the same step, and the signalled ones exit (train.py). A rank that is not
in the loop (setting up, or inside an in-process restart) has trained nothing since the checkpoint it
loaded and exits at once. Nothing outlives the deadline.

Why a thread reads the signal (signal.set_wakeup_fd) instead of the Python handler deciding: the
handler runs only when the main thread next executes Python code, and a rank blocked in a collective
or a store barrier (a failed peer, an in-process restart) may not for minutes; the launcher would
then wait for its stop timeout and SIGKILL it, and every restart would be that much slower.

No torch here: the entrypoint writes the request.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from . import events

log = logging.getLogger(__name__)
STOPPING = "stopping"
SIGNALS = (signal.SIGTERM, signal.SIGINT)
SETUP, TRAINING, DONE = "setup", "training", "done"


def request(state_dir: Path, signum: int, deadline: float) -> None:
    """Entrypoint side: ask the ranks to stop by `deadline` (time.time()). Written whole (rename)
    before the signal is forwarded, so a rank that gets the signal finds it complete."""
    tmp = state_dir / f".{STOPPING}.{os.getpid()}"
    tmp.write_text(json.dumps({"signal": signum, "deadline": deadline}))
    os.replace(tmp, state_dir / STOPPING)


def read_request(state_dir: str | None) -> dict[str, Any] | None:
    if not state_dir:
        return None
    try:
        return dict(json.loads((Path(state_dir) / STOPPING).read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _ignore(signum: int, frame: object) -> None:
    """The Python-level handler: the watcher thread has acted already."""


def _reset_in_child() -> None:
    # A forked helper (inprocess.Wrapper's monitor process) must not inherit the handler or write
    # its own signals into this process's wakeup pipe.
    try:
        signal.set_wakeup_fd(-1)
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_DFL)
    except ValueError:  # forked from a thread other than the main one: nothing was inherited there
        pass


class StopRequest:
    """One per rank process; install() from the main thread, before any other thread or fork."""

    def __init__(self, state_dir: str | None):
        self.state_dir = state_dir
        self.signum: int | None = None
        self.deadline = float("inf")
        self.phase = SETUP
        self._lock = threading.Lock()

    def install(self) -> None:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        for sig in SIGNALS:
            signal.signal(sig, _ignore)  # a Python handler, so that the C handler writes the wakeup fd
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        os.register_at_fork(after_in_child=_reset_in_child)
        threading.Thread(target=self._watch, args=(read_fd,), name="rtj-stop", daemon=True).start()

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def remaining(self) -> float:
        return self.deadline - time.time()

    def _watch(self, fd: int) -> None:
        while True:
            for signum in os.read(fd, 64):
                if signum in SIGNALS:
                    self._on_signal(signum)

    def _on_signal(self, signum: int) -> None:
        with self._lock:
            stop = read_request(self.state_dir)
            if stop is None:  # ft_launcher restarting its workers, inprocess.Wrapper's hard timeout: end
                events.emit("signalled", signal=signum, phase=self.phase)  # as SIG_DFL would
                os._exit(128 + signum)
            if self.signum is not None:
                self._exit(128 + signum, "a second signal")
            self.signum, self.deadline = signum, float(stop.get("deadline", time.time()))
            log.warning("%s: the pod is stopping; %.0f s left to save and exit", signal.Signals(signum).name,
                        self.remaining())
            events.emit("stop_requested", signal=signum, phase=self.phase)
            if self.phase == SETUP:
                self._exit(128 + signum, "not in the training loop: nothing trained since the last checkpoint")
        threading.Thread(target=self._expire, name="rtj-stop-deadline", daemon=True).start()

    def _expire(self) -> None:
        time.sleep(max(0.0, self.remaining()))
        with self._lock:
            self._exit(128 + (self.signum or signal.SIGTERM), "the stop deadline passed")

    def _exit(self, code: int, why: str) -> None:
        # On the main thread inprocess.Wrapper may raise an asynchronous exception at any bytecode (a
        # peer's fault interrupts the training loop): one landing in the log line or the event carried
        # a stopping rank into an in-process restart instead of out (CI: the rank ended 30 s later, 1,
        # not 143). The exit is in `finally`, which no such exception skips; the interpreter checks for
        # them after a call returns, and os._exit does not return.
        # The event is written again if such an exception lands in its write (CI: a rank exited 143
        # with no `stopped` event); the exit is in the innermost `finally`, whatever lands where.
        try:
            log.warning("exiting (%d): %s", code, why)
        finally:
            try:
                self._emit_stopped(code, why)
            finally:
                os._exit(code)

    @staticmethod
    def _emit_stopped(code: int, why: str) -> None:
        for _ in range(3):
            try:
                events.emit("stopped", code=code, why=why)
                return
            except BaseException:  # an asynchronous exception landed: the write is tried again
                continue

    # The training loop's side (main thread).
    def enter_training(self) -> None:
        with self._lock:
            self.phase = TRAINING

    def leave_training(self) -> None:
        """An exception left the loop: no collective can save now, so a requested stop ends the rank
        (in `finally`: see _exit)."""
        try:
            with self._lock:
                self.phase = SETUP
        finally:
            if self.signum is not None:
                self._exit(128 + self.signum, "the training loop failed while stopping")

    def finished(self) -> None:
        with self._lock:
            self.phase = DONE

    def saved_and_exit(self, step: int, committed: int) -> None:
        """After the agreed final save: this rank was signalled, so it ends here (exit 0: stopped as
        asked, the state saved). Not through inprocess.Wrapper: its barriers would wait for the ranks
        of nodes that were not signalled and keep training."""
        with self._lock:
            self._exit(0, f"stopped at step {step}, newest committed checkpoint step {committed}")
