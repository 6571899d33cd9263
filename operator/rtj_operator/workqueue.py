"""The reconcile work queue, after client-go's workqueue (controller-runtime's): keys, not events.

- A key is queued at most once (events for a job coalesce into one pass), and never handed to two
  workers at once: a key added while it is processed is marked dirty and queued again when done().
- Three lanes, served in order: urgent keys (a failure to count, a decision just recorded), release
  keys (new pods wait for a pass to lift the operator's scheduling gate: served before other jobs'
  first passes, so the control plane places one job's pods while the operator creates the next
  job's children), then normal ones. An add to a better lane moves a key already waiting, so a
  failure never waits behind timer passes.
- Delayed adds (requeues): the earliest due time wins; an immediate add cancels a pending delay,
  since the pass it causes sets its own requeue.
- Per-key rate-limited retries (exponential back-off on errors); forget() resets them.
- add_spaced(): a non-urgent event runs the key no sooner than `spacing` after its last pass began,
  so a burst of watch events (Job created, pods created, scheduled, started) costs one pass.

Thread-safe: kopf's event loop adds keys, worker threads get() and done() them.
"""

from __future__ import annotations

import heapq
import itertools
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable

Key = Hashable
URGENT, RELEASE, NORMAL = 0, 1, 2  # lanes, served in this order
LANE_NAMES = {URGENT: "urgent", RELEASE: "release", NORMAL: "queued"}


class WorkQueue:
    def __init__(self, clock: Callable[[], float] = time.monotonic, retry_base: float = 0.2,
                 retry_max: float = 60.0, rand: Callable[[], float] = random.random):
        self._clock, self._rand = clock, rand
        self._retry_base, self._retry_max = retry_base, retry_max
        self._cond = threading.Condition()
        self._lanes: dict[int, deque[Key]] = {lane: deque() for lane in LANE_NAMES}  # lane -> keys in order
        self._queued: dict[Key, int] = {}  # key -> its lane
        self._processing: set[Key] = set()
        self._dirty: dict[Key, int] = {}  # added while processing -> the best lane asked
        self._delayed: list[tuple[float, int, Key]] = []  # heap of (due, tiebreak, key); stale entries skipped
        self._due: dict[Key, float] = {}  # the live due time of each delayed key
        self._seq = itertools.count()
        self._failures: dict[Key, int] = {}
        self._started: dict[Key, float] = {}  # when each key was last handed to a worker
        self._closed = False

    # --- adding ----------------------------------------------------------------------------------
    def add(self, key: Key, urgent: bool = False, lane: int | None = None) -> None:
        """Queue `key` now: in `lane`, else URGENT or NORMAL."""
        with self._cond:
            self._add(key, lane if lane is not None else URGENT if urgent else NORMAL)

    def add_after(self, key: Key, delay: float, jitter: float = 0.0) -> None:
        """Queue `key` in `delay` seconds (less up to `jitter` of it: keys created together would
        otherwise come due together, for ever). An earlier due time already set wins."""
        if jitter:
            delay *= 1.0 - jitter * self._rand()
        with self._cond:
            self._add_at(key, self._clock() + max(0.0, delay))

    def add_spaced(self, key: Key, spacing: float) -> None:
        """A non-urgent wake-up: at once, or `spacing` after the key's last pass began."""
        with self._cond:
            if key in self._queued or key in self._dirty:
                return  # a pass is coming anyway
            self._add_at(key, self._started.get(key, float("-inf")) + spacing)

    def retry(self, key: Key, at_least: float = 0.0) -> float:
        """After a failed pass: queue it again with exponential back-off, never sooner than `at_least`
        seconds (a throttled call's Retry-After); returns the delay."""
        with self._cond:
            failures = self._failures.get(key, 0)
            self._failures[key] = failures + 1
            delay = max(at_least, min(self._retry_max, self._retry_base * 2.0 ** failures))
            self._add_at(key, self._clock() + delay)
            return delay

    def forget(self, key: Key) -> None:
        """After a pass that succeeded: the next failure starts the back-off afresh."""
        with self._cond:
            self._failures.pop(key, None)

    def remove(self, key: Key) -> None:
        """The object is gone: drop its pending delay and bookkeeping (a queued key still runs once)."""
        with self._cond:
            self._due.pop(key, None)
            self._failures.pop(key, None)
            if key not in self._processing and key not in self._queued:
                self._started.pop(key, None)

    # --- working ---------------------------------------------------------------------------------
    def get(self, timeout: float | None = None) -> Key | None:
        """The next key (urgent first), marked as processing; None on timeout or shutdown."""
        deadline = None if timeout is None else self._clock() + timeout
        with self._cond:
            while True:
                if self._closed:
                    return None
                self._promote_due()
                for lane, keys in self._lanes.items():
                    while keys:
                        key = keys.popleft()
                        if self._queued.get(key) != lane:
                            continue  # moved to a better lane, or already taken
                        del self._queued[key]
                        self._processing.add(key)
                        self._started[key] = self._clock()
                        return key
                wait = self._next_due_in()
                if deadline is not None:
                    left = deadline - self._clock()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)

    def done(self, key: Key) -> None:
        with self._cond:
            self._processing.discard(key)
            if key in self._dirty:
                self._add(key, self._dirty.pop(key))

    def shutdown(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # --- reading (metrics, tests) ------------------------------------------------------------------
    def depth(self) -> int:
        with self._cond:
            return len(self._queued)

    def pending(self, key: Key) -> str:
        """'urgent', 'release', 'queued', 'processing', 'delayed' or '' (tests and debugging)."""
        with self._cond:
            if key in self._queued:
                return LANE_NAMES[self._queued[key]]
            if key in self._processing:
                return "processing"
            return "delayed" if key in self._due else ""

    # --- under the lock ------------------------------------------------------------------------
    def _add(self, key: Key, lane: int) -> None:
        self._due.pop(key, None)  # the pass this add causes sets its own requeue
        if key in self._processing:
            self._dirty[key] = min(self._dirty.get(key, NORMAL), lane)
            return
        have = self._queued.get(key)
        if have is None or lane < have:
            self._queued[key] = lane
            self._lanes[lane].append(key)
            self._cond.notify()

    def _add_at(self, key: Key, due: float) -> None:
        if due <= self._clock():
            self._add(key, NORMAL)
            return
        if key in self._queued or (key in self._due and self._due[key] <= due):
            return
        self._due[key] = due
        heapq.heappush(self._delayed, (due, next(self._seq), key))
        self._cond.notify()

    def _promote_due(self) -> None:
        now = self._clock()
        while self._delayed and self._delayed[0][0] <= now:
            due, _, key = heapq.heappop(self._delayed)
            if self._due.get(key) == due:
                del self._due[key]
                self._add(key, NORMAL)

    def _next_due_in(self) -> float | None:
        while self._delayed and self._due.get(self._delayed[0][2]) != self._delayed[0][0]:
            heapq.heappop(self._delayed)  # stale: cancelled or moved earlier
        return max(0.0, self._delayed[0][0] - self._clock()) if self._delayed else None
