"""The reconcile work queue (workqueue.py): deduplicated keys, an urgent lane, delayed and spaced
adds, rate-limited retries, never one key on two workers. A fake clock; no threads unless a test
is about them."""

from __future__ import annotations

import threading
import time

import pytest

from rtj_operator.workqueue import NORMAL, RELEASE, WorkQueue
from testkit import Clock


@pytest.fixture
def clock() -> Clock:
    return Clock(100.0)


@pytest.fixture
def q(clock: Clock) -> WorkQueue:
    return WorkQueue(clock=clock, rand=lambda: 1.0)


def drain(q: WorkQueue) -> list[str]:
    keys = []
    while (key := q.get(timeout=0)) is not None:
        keys.append(key)
        q.done(key)
    return keys


def test_a_key_is_queued_once(q: WorkQueue) -> None:
    for _ in range(3):
        q.add("a")
    q.add("b")
    assert drain(q) == ["a", "b"]


def test_urgent_keys_go_first_and_an_urgent_add_moves_a_waiting_key(q: WorkQueue) -> None:
    q.add("timer-1")
    q.add("timer-2")
    q.add("failure", urgent=True)
    q.add("timer-2", urgent=True)  # a failure for a key whose timer pass still waits: it jumps the queue
    assert drain(q) == ["failure", "timer-2", "timer-1"]


def test_three_lanes_in_order_and_a_key_moves_only_to_a_better_lane(q: WorkQueue) -> None:
    q.add("first-pass")
    q.add("release", lane=RELEASE)
    q.add("failure", urgent=True)
    q.add("release", lane=NORMAL)  # a later ordinary event keeps it in the better lane
    q.add("first-pass", lane=RELEASE)  # its pods were made meanwhile: moved up
    assert [q.pending(k) for k in ("failure", "release", "first-pass")] == ["urgent", "release", "release"]
    assert drain(q) == ["failure", "release", "first-pass"]
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add("a", lane=RELEASE)
    q.add("a")  # while processed: the best lane asked is kept
    q.done("a")
    assert q.pending("a") == "release"


def test_a_key_added_while_processed_runs_again_after_and_never_twice_at_once(q: WorkQueue) -> None:
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add("a", urgent=True)
    assert q.get(timeout=0) is None  # not handed to a second worker
    assert q.pending("a") == "processing"
    q.done("a")
    assert q.pending("a") == "urgent"
    assert drain(q) == ["a"]


def test_delayed_adds_come_due_and_the_earliest_wins(q: WorkQueue, clock: Clock) -> None:
    q.add_after("a", 10)
    q.add_after("a", 5)
    q.add_after("a", 30)
    assert q.get(timeout=0) is None
    clock.now += 5
    assert drain(q) == ["a"]
    clock.now += 100
    assert drain(q) == []  # the later delays were superseded


def test_an_immediate_add_cancels_a_pending_delay(q: WorkQueue, clock: Clock) -> None:
    q.add_after("a", 10)
    q.add("a")
    assert drain(q) == ["a"]
    clock.now += 10
    assert drain(q) == []  # the pass that ran sets its own requeue


def test_jitter_only_shortens_a_delay(clock: Clock) -> None:
    q = WorkQueue(clock=clock, rand=lambda: 0.5)
    q.add_after("a", 10, jitter=0.2)
    clock.now += 8.99
    assert drain(q) == []
    clock.now += 0.02
    assert drain(q) == ["a"]


def test_spaced_adds_wait_out_the_spacing_since_the_last_pass_began(q: WorkQueue, clock: Clock) -> None:
    q.add("a")
    assert drain(q) == ["a"]  # the pass began at 100
    clock.now += 0.3
    q.add_spaced("a", 1.0)
    q.add_spaced("a", 1.0)  # a burst of events: one pass
    assert drain(q) == []
    clock.now += 0.7
    assert drain(q) == ["a"]
    clock.now += 5
    q.add_spaced("a", 1.0)  # long after: at once
    assert drain(q) == ["a"]


def test_an_urgent_add_does_not_wait_for_the_spacing(q: WorkQueue, clock: Clock) -> None:
    q.add("a")
    drain(q)
    q.add_spaced("a", 1.0)
    q.add("a", urgent=True)
    assert drain(q) == ["a"]


def test_retries_back_off_exponentially_until_forgotten(q: WorkQueue, clock: Clock) -> None:
    assert [q.retry("a") for _ in range(4)] == [0.2, 0.4, 0.8, 1.6]
    q.forget("a")
    assert q.retry("a") == 0.2
    assert max(q.retry("b") for _ in range(20)) == 60.0


def test_removed_keys_lose_their_delay(q: WorkQueue, clock: Clock) -> None:
    q.add_after("a", 5)
    q.remove("a")
    clock.now += 10
    assert drain(q) == []


def test_get_waits_for_a_delayed_key_and_shutdown_releases_workers() -> None:
    q = WorkQueue()
    q.add_after("a", 0.05)
    started = time.monotonic()
    assert q.get(timeout=5) == "a"
    assert time.monotonic() - started < 2
    got: list[object] = []
    worker = threading.Thread(target=lambda: got.append(q.get()))
    worker.start()
    q.shutdown()
    worker.join(5)
    assert got == [None]


def test_many_workers_never_share_a_key() -> None:
    q = WorkQueue()
    busy: set[str] = set()
    lock = threading.Lock()
    clashes: list[str] = []
    passes = {"n": 0}

    def work() -> None:
        while (key := q.get(timeout=0.2)) is not None:
            with lock:
                if key in busy:
                    clashes.append(key)
                busy.add(key)
                passes["n"] += 1
            time.sleep(0.001)
            with lock:
                busy.discard(key)
            q.done(key)

    workers = [threading.Thread(target=work) for _ in range(8)]
    for w in workers:
        w.start()
    for i in range(2000):
        q.add(f"k{i % 10}", urgent=i % 3 == 0)
    for w in workers:
        w.join()
    assert clashes == [] and passes["n"] >= 10
