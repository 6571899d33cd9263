"""The checkpoint's long waits keep inprocess.Wrapper's progress watchdog fed (rtj_worker.waits), checked
against NVRx's own ProgressWatchdog: it stamps progress only when the main thread runs bytecode, so a
native wait of minutes (a real-size save or load) would read as a hang and the rank would be killed."""

from __future__ import annotations

import datetime
import itertools
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest
import torch
import torch.distributed as dist
from nvidia_resiliency_ext.inprocess.progress_watchdog import ProgressWatchdog

from rtj_worker import checkpoint, waits
from rtj_worker.checkpoint import Checkpointer
from rtj_worker.ckpt_index import complete_steps
from testkit import free_port

WRITE_SECONDS = 2.0


class Monitor:
    """Where the watchdog sends its stamps (the Wrapper's monitor process, which times them out)."""

    def __init__(self) -> None:
        self.stamps: list[float] = []

    def send_timestamp(self, timestamp: Any) -> None:
        self.stamps.append(timestamp.auto)


def stale_seconds(wait: Callable[[], Any]) -> float:
    """The longest time the watchdog's automatic stamp stood still while `wait` ran in the main thread:
    what the Wrapper's soft and hard timeouts are compared with."""
    monitor = Monitor()
    dog = ProgressWatchdog(rank=0, monitor_process=monitor, interval=datetime.timedelta(seconds=0.05))
    dog.daemon = True
    dog.start()
    try:
        start = time.monotonic()
        wait()
        end = time.monotonic()
    finally:
        dog.should_stop.set()
        dog.interval_event.set()
        dog.join(5)
    stamps = sorted({s for s in monitor.stamps if start <= s <= end} | {start, end})
    return max(b - a for a, b in itertools.pairwise(stamps))


def finished_later(value: Any = "done", seconds: float = WRITE_SECONDS) -> Future:
    future: Future = Future()
    threading.Timer(seconds, future.set_result, (value,)).start()
    return future


def test_a_plain_wait_starves_the_watchdog_and_a_polled_one_does_not():
    # The test's own control: the watchdog really does read a plain Future.result() as no progress.
    assert stale_seconds(lambda: finished_later().result()) > WRITE_SECONDS * 0.8
    assert stale_seconds(lambda: waits.result(finished_later(), 60, "a write")) < waits.POLL_MAX + 0.3
    assert stale_seconds(lambda: waits.call(lambda: time.sleep(WRITE_SECONDS), 60, "a sync write")) \
        < waits.POLL_MAX + 0.3


def test_a_polled_wait_is_bounded_and_says_what_it_waited_for():
    with pytest.raises(TimeoutError, match=r"checkpoint step 7's write did not finish within 0\.3 s"):
        waits.result(finished_later(seconds=5), 0.3, "checkpoint step 7's write")
    failed: Future = Future()
    failed.set_exception(TimeoutError("the writer's own"))  # its own error, not the wait's
    with pytest.raises(TimeoutError, match="the writer's own"):
        waits.result(failed, 60, "a write")
    with pytest.raises(ZeroDivisionError):
        waits.call(lambda: 1 / 0, 60, "a load")
    assert waits.call(threading.get_ident, 60, "a call") != threading.get_ident()


class SleepyWriter(checkpoint.dcp.FileSystemWriter):
    """Each rank's write takes WRITE_SECONDS of native waiting (a slow volume's flush)."""

    def write_data(self, plan, planner):
        time.sleep(WRITE_SECONDS)
        return super().write_data(plan, planner)


@pytest.fixture
def group():
    store = dist.TCPStore("127.0.0.1", free_port(), world_size=1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


@pytest.mark.parametrize("use_async", [True, False])
def test_the_checkpoints_final_save_and_load_keep_the_watchdog_fed(tmp_path, group, monkeypatch, use_async):
    """Issue 27: the final save(skip_if_busy=False) and finalize() were one native wait each, as was a
    synchronous save's flush: killed as a hang at the Wrapper's hard timeout, the last checkpoint lost."""
    monkeypatch.setattr(Checkpointer, "_writer", lambda self, path: SleepyWriter(path))
    ckpt = Checkpointer(tmp_path, 0, 1, use_async=use_async, uid="job-a")
    ckpt.attach()
    state = {"w": torch.arange(4.0)}
    ckpt.save(10, state)

    def final_save() -> None:
        ckpt.save(20, state)  # waits for step 10 (async), or writes in the loop (sync)
        assert ckpt.finalize()

    assert stale_seconds(final_save) < waits.POLL_MAX + 0.3
    assert complete_steps(tmp_path, "job-a") == [20, 10] and ckpt.committed_step == 20

    class SleepyReader(checkpoint.dcp.FileSystemReader):
        def read_data(self, plan, planner):
            time.sleep(WRITE_SECONDS)
            return super().read_data(plan, planner)

    monkeypatch.setattr(checkpoint.dcp, "load", lambda state, checkpoint_id, process_group, _load=checkpoint.dcp.load:
                        _load(state, storage_reader=SleepyReader(checkpoint_id), process_group=process_group))
    loaded = {"w": torch.zeros(4)}
    assert stale_seconds(lambda: ckpt.load_latest(loaded)) < waits.POLL_MAX + 0.3
    assert loaded["w"].tolist() == [0.0, 1.0, 2.0, 3.0]


def test_a_load_slower_than_its_bound_keeps_the_step_for_the_next_try(tmp_path, group, monkeypatch):
    """Seen on the slow volume: a committed step whose read outlasted heartbeatTimeoutSeconds was marked
    unloadable, as a damaged one is, and the gang resumed from a far older step."""
    ckpt = Checkpointer(tmp_path, 0, 1, use_async=False, uid="job-a")
    ckpt.attach()
    ckpt.save(10, {"w": torch.arange(4.0)})
    ckpt.io_timeout = 0.5
    load = checkpoint.dcp.load

    def slow_load(state, checkpoint_id, process_group):
        time.sleep(2)
        return load(state, checkpoint_id=checkpoint_id, process_group=process_group)

    monkeypatch.setattr(checkpoint.dcp, "load", slow_load)
    with pytest.raises(TimeoutError, match="kept, and tried again"):
        ckpt.load_latest({"w": torch.zeros(4)})
    assert complete_steps(tmp_path, "job-a") == [10]  # not marked unloadable
    ckpt.io_timeout = 30
    loaded = {"w": torch.zeros(4)}
    assert ckpt.load_latest(loaded) == 10 and loaded["w"].tolist() == [0.0, 1.0, 2.0, 3.0]
