"""Waits that inprocess.Wrapper's progress watchdog can tell from a hang.

The watchdog (NVRx's inprocess.progress_watchdog) stamps progress from a callback that only the main
thread runs, and only between two of its bytecodes (Py_AddPendingCall). One native wait longer than
the Wrapper's soft timeout (45 s by default) therefore reads as a hang, and the rank is killed at the
hard timeout: a Future's result, a collective waiting for the slowest rank's write, a synchronous
save whose fsync blocks for the whole flush, a load. A checkpoint of 96 GB on a 300 MB/s volume
takes about 5 minutes to write or read. So every long wait of a checkpoint goes through here: it
returns to Python at least every POLL_MAX seconds (a stamp each time), and is bounded by its caller
(the spec's heartbeatTimeoutSeconds, which is also ft_launcher's timeout of the checkpointing
section): past its bound it raises TimeoutError, which the caller reports. Hang detection stays on
for everything else, and works on NVRx 0.4.1 as on 0.6 (whose CallWrapper.disable_hang_protection
would switch it off with no bound at all). Outside the Wrapper these cost what the plain waits cost.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
# The first poll comes at once, then 1 ms, doubling up to POLL_MAX: an agreement that takes a
# millisecond costs about one more, and a five-minute save wakes the main thread twice a second.
POLL_MIN, POLL_MAX = 0.001, 0.5


class Work(Protocol):
    """torch.distributed's handle of a collective started with async_op=True."""

    def is_completed(self) -> bool: ...

    def wait(self) -> Any: ...


def polls(timeout: float | None, what: str) -> Iterator[float]:
    """Seconds to sleep between polls, until `timeout` has passed: then TimeoutError names `what`."""
    deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
    step = POLL_MIN
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError(f"{what} did not finish within {timeout:g} s")
        yield step if left is None else min(step, left)
        step = min(step * 2, POLL_MAX)


def result(future: Future[T], timeout: float | None, what: str) -> T:
    """future.result(), waited for in polls (see the module doc); TimeoutError past `timeout`. A
    future that failed raises its own exception, even a TimeoutError of its own."""
    for step in polls(timeout, what):
        done, _ = concurrent.futures.wait([future], timeout=step)
        if done:
            return future.result()
    raise AssertionError("unreachable")  # polls() ends only by raising


def call(fn: Callable[[], T], timeout: float | None, what: str) -> T:
    """fn(), run in a helper thread and waited for as result() does: a blocking call (a synchronous
    write, a load) that would otherwise be one long native wait of the main thread. Past `timeout`
    the call is left running (a thread cannot be stopped; it is a daemon, so it never keeps the process
    alive) and TimeoutError is raised: the caller commits nothing of it."""
    future: Future[T] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            future.set_result(fn())
        except BaseException as exc:  # handed to the waiting thread, which raises it
            future.set_exception(exc)

    threading.Thread(target=run, name=f"rtj-{what.replace(' ', '-')}", daemon=True).start()
    return result(future, timeout, what)


def work(handle: Work, timeout: float | None, what: str) -> None:
    """A collective's completion, waited for in polls; its own error (a peer gone, the group's
    timeout) is raised by its wait()."""
    for step in polls(timeout, what):
        if handle.is_completed():
            handle.wait()
            return
        time.sleep(step)
