"""Leader election on a coordination.k8s.io/v1 Lease (client-go's leaderelection, in its shape).

Every replica runs its watches and stores (a follower's caches are warm when it takes over); only
the holder of the Lease runs passes and writes. The rules, timed on each replica's own monotonic
clock (never on another machine's timestamps):

- A follower takes the Lease only once the record it sees (holder, renew time, transitions) has not
  changed for the record's leaseDurationSeconds, or the holder released it (empty holder).
- The leader renews every `retry` seconds. It is the leader only until `renew_deadline` after the
  start of its last successful renewal: past that it stops acting at once (every write is checked,
  runtime.StoreKube), whether or not it could reach the API server to learn that it lost.
- renew_deadline < lease_duration: a follower that waits lease_duration after it last saw the record
  change never acts while the old leader still believes it leads (the gap also covers a write already
  on the wire). Updates carry the Lease's resourceVersion, so two candidates never both win.
- A replica that stops gracefully releases the Lease (empty holder): the follower takes over at its
  next try, not a lease duration later.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from . import metrics
from .kube import KubeError

log = logging.getLogger(__name__)

LEASE_SECONDS = 15.0
RENEW_DEADLINE = 10.0
RETRY_SECONDS = 2.0


class NotLeader(Exception):
    """A write refused because this replica does not (or no longer) hold the Lease."""


class LeaseClient(Protocol):
    def get(self, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None: ...
    def create(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]: ...
    def patch(self, kind: str, name: str, namespace: str | None, patch: dict[str, Any],
              subresource: str | None = None, strategic: bool = False) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Timing:
    lease: float = LEASE_SECONDS
    renew_deadline: float = RENEW_DEADLINE
    retry: float = RETRY_SECONDS

    def __post_init__(self) -> None:
        if not 0 < self.retry < self.renew_deadline < self.lease:
            raise ValueError(f"need 0 < retry ({self.retry}) < renew deadline ({self.renew_deadline}) "
                             f"< lease duration ({self.lease})")


def default_identity() -> str:
    """The pod's name (unique among replicas) and a suffix, so a restarted container is a new holder."""
    return f"{os.environ.get('HOSTNAME') or socket.gethostname()}_{os.urandom(4).hex()}"


def _micro(now: datetime.datetime) -> str:
    return now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # MicroTime


def record_of(lease: dict[str, Any] | None) -> tuple[str, str, int, int]:
    """What changes when the holder renews or the Lease changes hands: (holder, renewTime,
    leaseTransitions, leaseDurationSeconds)."""
    spec = (lease or {}).get("spec") or {}
    return (spec.get("holderIdentity") or "", spec.get("renewTime") or "", int(spec.get("leaseTransitions") or 0),
            int(spec.get("leaseDurationSeconds") or 0))


def may_take(lease: dict[str, Any] | None, identity: str, unchanged_for: float) -> bool:
    """Whether `identity` may write itself into the Lease: it holds it, nobody does, or the record has
    not changed for the holder's lease duration (`unchanged_for`: seconds since this replica saw it change)."""
    holder, _, _, duration = record_of(lease)
    return lease is None or not holder or holder == identity or unchanged_for >= duration


def lease_spec(lease: dict[str, Any] | None, identity: str, now: datetime.datetime, duration: float,
               release: bool = False) -> dict[str, Any]:
    """The spec that renews, takes or (release) gives up the Lease."""
    spec = (lease or {}).get("spec") or {}
    holder = spec.get("holderIdentity") or ""
    transitions = int(spec.get("leaseTransitions") or 0)
    if release:
        # An empty holder and a 1 s duration: any follower takes it at once (client-go's ReleaseOnCancel).
        return {"holderIdentity": "", "leaseDurationSeconds": 1, "renewTime": _micro(now),
                "acquireTime": spec.get("acquireTime") or _micro(now), "leaseTransitions": transitions}
    taking = holder != identity
    return {"holderIdentity": identity, "leaseDurationSeconds": max(1, round(duration)),
            "acquireTime": _micro(now) if taking or not spec.get("acquireTime") else spec["acquireTime"],
            "renewTime": _micro(now),
            "leaseTransitions": transitions + 1 if taking and lease is not None else transitions}


class LeaderElector:
    """Holds (or waits for) the Lease `namespace/name` on its own thread; `leading()` says, at any
    moment, whether this replica may act."""

    def __init__(self, kube: LeaseClient, namespace: str, name: str, identity: str | None = None,
                 timing: Timing = Timing(), clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)):
        self.kube, self.namespace, self.name = kube, namespace, name
        self.identity = identity or default_identity()
        self.timing, self._clock, self._wall = timing, clock, wall
        self._lock = threading.Lock()
        self._renewed: float | None = None  # start of the last successful acquire or renew
        self._seen: tuple[tuple[str, str, int, int], float] | None = None  # (record, when it last changed)
        self._was_leading = False
        self._callbacks: list[Callable[[], None]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._leading_event = threading.Event()

    # --- reading --------------------------------------------------------------------------------
    def leading(self) -> bool:
        ok = self.acting_for() > 0  # within renew_deadline of the last renewal's start (< the lease duration)
        if not ok and self._leading_event.is_set():
            self._leading_event.clear()
        return ok

    def acting_for(self) -> float:
        """Seconds within which a write sent now must land: until another replica may hold the Lease (the
        lease duration after this replica's last renewal began; a follower waits at least that long on its
        own clock). 0 when this replica does not lead. The runtime's client bounds each write's timeout by
        it (runtime.Runtime), so a write stalled in flight cannot land long after a follower took over."""
        with self._lock:
            if self._renewed is None:
                return 0.0
            elapsed = self._clock() - self._renewed
        return self.timing.lease - elapsed if elapsed < self.timing.renew_deadline else 0.0

    def wait_leading(self, timeout: float) -> bool:
        """Block up to `timeout` until this replica leads; whether it does."""
        return self.leading() or (self._leading_event.wait(timeout) and self.leading())

    def on_started_leading(self, callback: Callable[[], None]) -> None:
        self._callbacks.append(callback)

    # --- one try ----------------------------------------------------------------------------------
    def try_acquire_or_renew(self) -> bool:
        started = self._clock()
        try:
            lease = self.kube.get("Lease", self.name, self.namespace)
        except KubeError as exc:
            log.warning("leader election: reading lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False
        record = record_of(lease)
        if self._seen is None or self._seen[0] != record:
            self._seen = (record, started)
        if not may_take(lease, self.identity, started - self._seen[1]):
            return False
        spec = lease_spec(lease, self.identity, self._wall(), self.timing.lease)
        try:
            if lease is None:
                written = self.kube.create({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                                            "metadata": {"name": self.name, "namespace": self.namespace},
                                            "spec": spec})
            else:
                # The resourceVersion makes it conditional: of two candidates, one gets 409.
                written = self.kube.patch("Lease", self.name, self.namespace, {
                    "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]}, "spec": spec})
        except KubeError as exc:
            if exc.status not in (409, 422):  # 409: someone else wrote first (or created it)
                log.warning("leader election: writing lease %s/%s failed: %s", self.namespace, self.name, exc)
            return False
        with self._lock:
            self._renewed = started
        self._seen = (record_of(written), started)
        return True

    def release(self) -> None:
        """Stop acting now, then give the Lease up if this replica still holds it."""
        with self._lock:
            held, self._renewed = self._renewed is not None, None
        self._leading_event.clear()
        if not held:
            return
        try:
            lease = self.kube.get("Lease", self.name, self.namespace)
            if lease is not None and record_of(lease)[0] == self.identity:
                self.kube.patch("Lease", self.name, self.namespace, {
                    "metadata": {"resourceVersion": lease["metadata"]["resourceVersion"]},
                    "spec": lease_spec(lease, self.identity, self._wall(), self.timing.lease, release=True)})
                log.info("leader election: released lease %s/%s", self.namespace, self.name)
        except KubeError as exc:
            log.warning("leader election: releasing lease %s/%s failed (it expires): %s",
                        self.namespace, self.name, exc)

    # --- the loop ---------------------------------------------------------------------------------
    def step(self) -> None:
        """One try, and what follows from it (logs, the metric, the started-leading callbacks)."""
        self.try_acquire_or_renew()
        now = self.leading()
        if now and not self._was_leading:
            log.info("leader election: %s leads (lease %s/%s)", self.identity, self.namespace, self.name)
            for callback in self._callbacks:  # before waking the waiters: they may depend on it
                try:
                    callback()
                except Exception:
                    log.exception("leader election: a started-leading callback failed")
            self._leading_event.set()
        elif self._was_leading and not now:
            log.warning("leader election: %s lost lease %s/%s; no longer acting", self.identity,
                        self.namespace, self.name)
            metrics.forget_all()  # the leader exports the jobs' series
        self._was_leading = now
        metrics.LEADER.set(1 if now else 0)

    def start(self) -> LeaderElector:
        self._thread = threading.Thread(target=self._loop, name="rtj-leader-election", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = self._clock()
            try:
                self.step()
            except Exception:  # never let the elector die silently: leading() times out by itself anyway
                log.exception("leader election: a try failed")
            self._stop.wait(max(0.0, self.timing.retry - (self._clock() - began)))

    def stop(self, release: bool = True) -> None:
        """Stop trying; with `release`, give the Lease up (a follower takes over at its next try).
        Without it (a crash, in tests), the Lease expires."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.timing.renew_deadline)
        if release:
            self.release()
        else:
            with self._lock:
                self._renewed = None
        metrics.LEADER.set(0)
