"""Sharded checkpoints on the shared volume: torch.distributed.checkpoint (DCP), saved asynchronously.

Each rank writes only its own shard of the FSDP2 (DTensor) state; rank 0 adds DCP's .metadata. A
save goes into a temporary directory (ckpt_index) and is committed only when every rank's write
succeeded, agreed by all ranks; resume agrees on the newest step that every rank can load.

Why DCP and not NVRx's TorchAsyncCheckpoint: TorchAsyncCheckpoint is an asynchronous torch.save of
one object per rank. It has no global metadata, so DTensor shards saved that way load back only on
the same mesh (an elastic job resumed on fewer nodes could not load them), and NVRx 0.4.1 and 0.6
both call CUDA unconditionally while scheduling a save. NVRx's DCP-compatible writer
(FileSystemWriterAsync + state_dict_saver) hard-codes CUDA tensors in its agreement collectives, and
its API differs between 0.4.1 and 0.6. DCP's async_save gives the same overlap (the state is staged
to host memory synchronously, then written in the background), reshards on load, fsyncs every file
and reports a failed write through its future, which the commit protocol below relies on.

Two background writers (RTJ_CHECKPOINT_WRITER): "thread", a thread of the training process, and
"process", torch's process-based async save: one writer process per rank, spawned at its first save
and reused, that receives the staged state through shared memory and writes it with a gloo world of
its own. The thread holds the GIL for DCP's Python work (planning, serializing) while the training
thread needs it to launch kernels; the process does not. Its world is built once from the group of
its first save, so every regroup (an in-process restart: abandon()) and close() kills it, and the
next save spawns a new one; waits for it are bounded here (its own timeouts are 30 minutes).

With `tiers` (rtj_worker.memstate), every save also keeps this rank's part of the step off the volume
(in memory, in the node's /dev/shm, and in a peer node's), and a load restores from those copies when
every rank has one (its own, or one a peer holds and sends it), reading nothing from the volume.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import datetime
import logging
import multiprocessing.process
import os
import shutil
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.distributed.checkpoint._async_process_executor as process_writer  # no public way to stop it
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

from . import ckpt_index, events, memstate, waits
from .ckpt_index import step_dir

log = logging.getLogger(__name__)
# DCP raises CheckpointException (a BaseException) on every rank when any rank's write or read failed.
FAILURES = (Exception, CheckpointException)
WRITERS = ("thread", "process")
# A load's outcome on one rank, agreed as the minimum: a timed-out read is slow storage, not a damaged step.
TIMED_OUT, UNREADABLE, LOADED = -1, 0, 1
# The first save of a new writer process also spawns it (a new interpreter imports torch): seconds.
PROCESS_SPAWN_SECONDS = 60.0


class ShardWriter(dcp.FileSystemWriter):
    """DCP's file system writer, fsync on. Unpickled in a writer process (each save's request carries
    it), it makes that process end with the rank that spawned it: a rank killed by SIGKILL (a fault,
    the launcher) would otherwise leave it running its save, holding the staged state in shared
    memory, for as long as its collectives wait for peers (up to 30 minutes)."""

    def __init__(self, path: str | os.PathLike, **kwargs: Any):
        super().__init__(path, sync_files=True, **kwargs)
        self.parent_pid = os.getpid()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if os.getpid() != self.parent_pid:
            _exit_with_parent(self.parent_pid)


_parent_watch: threading.Thread | None = None


def _exit_with_parent(parent: int) -> None:
    """In a writer process: exit as soon as `parent` is gone (this process is then re-parented)."""
    global _parent_watch

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    if _parent_watch is None:
        _parent_watch = threading.Thread(target=watch, name="rtj-writer-parent-watch", daemon=True)
        _parent_watch.start()


class _WriterProcess(process_writer._AsyncCheckpointProcess):
    """torch's writer process, made known to stop_writer_process() as soon as it is started: torch
    records it (process_writer._CHECKPOINT_PROCESS) only once its world is up, which takes every
    rank's writer; after a fault a peer's may never come, and this one would wait 30 minutes."""

    started: ClassVar[weakref.WeakSet[multiprocessing.process.BaseProcess]] = weakref.WeakSet()

    def _wait_for_response(self, timeout: float | None = None) -> Any:  # first called right after start()
        _WriterProcess.started.add(self._save_process)
        return super()._wait_for_response(timeout)


def _track_writer_processes() -> None:
    """torch's process save creates its writer by this module-global name at its first save."""
    process_writer._AsyncCheckpointProcess = _WriterProcess  # type: ignore[misc]


def stop_writer_process(pending: Future | None = None, timeout: float = 10.0) -> None:
    """Kill this process's checkpoint writer process, if any: torch has no public close (it sends its
    own TERMINATE only at garbage collection, and a process busy writing would not read it). A save in
    flight then fails at once (its pipe reaches EOF) and is never committed; the next process save
    spawns a new writer, whose world is built from the group that save is given.

    `pending`, the save in flight: torch may still be about to spawn its writer (in the save's thread),
    so the save is waited for, killing every writer process it starts, until it has failed (bounded
    by `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        done = pending is None or pending.done()  # before the kill: a writer it set up is killed below
        handle, process_writer._CHECKPOINT_PROCESS = process_writer._CHECKPOINT_PROCESS, None
        procs = set(_WriterProcess.started) | ({handle._save_process} if handle is not None else set())
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
                proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
            _WriterProcess.started.discard(proc)
        if handle is not None:
            handle._process_pipe.close()
        if done:
            return
        if time.monotonic() > deadline:
            log.warning("the checkpoint writer process's save has not ended %.0f s after the process was killed",
                        timeout)
            return
        with contextlib.suppress(*FAILURES, concurrent.futures.TimeoutError):
            pending.result(timeout=0.1)


@contextlib.contextmanager
def _master_addr(address: str) -> Iterator[None]:
    """torch's process writer builds its world from MASTER_ADDR on rank 0 (the rank that spawns the
    store): under ft_launcher that is the host ft_launcher picked at the rendezvous, which need not be
    where rank 0 runs (numeric ranks, an in-process restart shifting ranks). Each rank offers its own
    address; rank 0's is used."""
    saved = os.environ.get("MASTER_ADDR")
    os.environ["MASTER_ADDR"] = address
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("MASTER_ADDR", None)
        else:
            os.environ["MASTER_ADDR"] = saved


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Where a tensor must live for a collective on `group`: CPU only if the group has a CPU
    backend (gloo); with NCCL alone a CPU tensor fails ("No backend type associated with device
    type cpu")."""
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    types = [d.type for d in pg._device_types]
    if "cpu" in types or not types:
        return torch.device("cpu")
    if "cuda" in types:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device(types[0])


def agree_min(value: int, group: dist.ProcessGroup | None = None) -> int:
    """The minimum of `value` over all ranks (collective). Waited for in polls (waits.py): a rank whose
    write finished first waits here for the slowest one, minutes on a slow volume; the group's own
    timeout bounds it."""
    tensor = torch.tensor([value], dtype=torch.int64, device=collective_device(group))
    waits.work(dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=group, async_op=True), None, "an agreement")
    return int(tensor.item())


class Checkpointer:
    """Collective save/load of sharded state. All ranks call save(), poll(), finalize(), load_latest().

    attach() binds it to the process group of the current (in-process restart) iteration. `writer`
    (WRITERS) writes asynchronous saves; with "process", `address` is this host's address as peers
    reach it (ranks.own_address), for the writers' world when this rank is rank 0.
    """

    def __init__(self, root: str | Path, rank: int, world_size: int, use_async: bool = True, keep: int = 3,
                 uid: str = "", on_commit: Callable[[int, float], None] | None = None, writer: str = "thread",
                 address: str | None = None, tiers: memstate.Tiers | None = None, local_world: int = 1,
                 attempt: int = 0):
        if writer not in WRITERS:
            raise ValueError(f"checkpoint writer must be one of {', '.join(WRITERS)}, got {writer!r}")
        if writer == "process":
            _track_writer_processes()
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.rank, self.world_size, self.keep, self.uid = rank, world_size, keep, uid
        self.attempt = attempt  # the gang attempt (RTJ_ATTEMPT): the attempt fence of ckpt_index; 0: none
        self.use_async, self.on_commit = use_async, on_commit
        self.writer, self.address = writer, address
        self.group: dist.ProcessGroup | None = None
        self.io_group: dist.ProcessGroup | None = None
        self.io_timeout = 1800.0  # torch's default for gloo groups
        self._token = "0"
        self._pending: tuple[int, Path, Future] | None = None
        self._stager: DefaultStager | None = None
        self.save_seconds = 0.0  # time the training loop spent blocked in save()
        self.load_failed = False  # a load was attempted and failed: the state may be partly overwritten
        self.committed_step = 0  # the newest step every rank knows committed (saved or loaded)
        # When each uncommitted save began, for how long a save takes (save() to commit: what a stop
        # must fit in its grace period), passed to on_commit with the step.
        self._save_started: dict[int, float] = {}
        self.write_seconds: float | None = None  # the newest committed save's
        self.tiers, self.local_world = tiers, local_world
        if tiers is not None:
            tiers.local_world = local_world
        self.peer_group: dist.ProcessGroup | None = None  # the peer copies' exchange (its own thread)
        self._exchange: threading.Thread | None = None  # the newest exchange (each waits for the one before)
        self.restored_from = memstate.VOLUME  # where the newest load's state came from
        self.restore_seconds = 0.0

    def attach(self, group: dist.ProcessGroup | None = None, timeout: datetime.timedelta | None = None) -> None:
        """Collective, once per process group: DCP needs a CPU (gloo) group; its background thread
        gets a group of its own so that its collectives never interleave with the training loop's.
        `timeout` bounds how long a rank that finished writing waits for the slowest one."""
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        if self.writer == "process":  # a writer process of an earlier group would write in its old world
            self.abandon()
        self.io_group = dist.new_group(backend="gloo", timeout=timeout)
        if timeout is not None:
            self.io_timeout = timeout.total_seconds()
        token = [uuid.uuid4().hex[:8] if self.rank == 0 else None]
        dist.broadcast_object_list(token, src=0, group=self.io_group)
        self._token = str(token[0])  # fresh temporary directories for every attachment
        if self.tiers is not None:
            self.tiers.rank, self.tiers.world = self.rank, self.world_size
            self._stop_exchange()
            if self.tiers.node_dir is not None and self._partner() is not None:
                self.peer_group = dist.new_group(backend="gloo", timeout=timeout)

    def _partner(self) -> int | None:
        return memstate.partner(self.rank, self.world_size, self.local_world) if self.tiers is not None else None

    def _stop_exchange(self) -> None:
        """The previous group's exchange threads: left to fail with their group (daemons, never waited for)."""
        self._exchange, self.peer_group = None, None

    def _writer(self, path: Path) -> dcp.FileSystemWriter:
        return ShardWriter(path)

    def _async_save(self, state: dict[str, Any], tmp: Path) -> Future:
        if self._stager is None:
            # One stager for the job: it keeps its host copies (pinned on GPU nodes; in shared memory for
            # the writer process, which maps them instead of receiving a copy) between saves instead of
            # allocating the whole state again at every save.
            cuda = torch.cuda.is_available()
            self._stager = DefaultStager(StagingOptions(use_pinned_memory=cuda,
                                                        use_shared_memory=self.writer == "process",
                                                        use_async_staging=False, use_non_blocking_copy=cuda))
        if self.writer == "thread":
            return dcp.async_save(state, storage_writer=self._writer(tmp), process_group=self.io_group,
                                  async_stager=self._stager)
        # A new writer process starts with a collective on io_group (rank 0 broadcasts its store's
        # address): every rank has one, or none, at every save (they are only ever killed together).
        spawning, started = process_writer._CHECKPOINT_PROCESS is None, time.monotonic()
        with _master_addr(self.address or os.environ.get("MASTER_ADDR") or "127.0.0.1"):
            future = dcp.async_save(state, storage_writer=self._writer(tmp), process_group=self.io_group,
                                    async_stager=self._stager, async_checkpointer_type=AsyncCheckpointerType.PROCESS)
        if spawning:  # what a (re)start costs this writer: its first save includes the spawn

            def spawned(done: Future) -> None:
                if not done.cancelled() and done.exception() is None:
                    events.emit("writer_process_spawned", rank=self.rank, step=ckpt_index.step_of(tmp),
                                seconds=round(time.monotonic() - started, 2))

            future.add_done_callback(spawned)
        return future

    @property
    def in_flight(self) -> int | None:
        """The step whose asynchronous save is still uncommitted. The same on every rank: it changes
        only in save() and after agreements."""
        return self._pending[0] if self._pending is not None else None

    def save(self, step: int, state: dict[str, Any], *, skip_if_busy: bool = False, sync: bool = False) -> bool:
        """Save `step` (collective); False if it was skipped.

        The save in flight, if any, is committed first. With `skip_if_busy` the ranks first agree
        (one all-reduce) whether its writes have finished everywhere, and skip this save if not
        instead of waiting: a save slower than the checkpoint interval would otherwise stall every
        rank inside the in-process wrapper's atomic section, until its hard timeout kills them.
        `sync` writes in the loop even when saves are asynchronous (a stop: the process exits next)."""
        started = time.perf_counter()
        if self._pending is not None:
            if skip_if_busy and not agree_min(int(self._pending[2].done()), self.group):
                if self.rank == 0:
                    log.warning("checkpoint step %d skipped: step %d's save is still being written (slower "
                                "than the checkpoint interval)", step, self._pending[0])
                events.emit("checkpoint_skipped", rank=self.rank, step=step, in_flight=self._pending[0])
                self.save_seconds += time.perf_counter() - started
                return False
            self._finish()
        tmp = ckpt_index.tmp_dir(self.root, self.uid, self._token, step)
        self._save_started = {step: time.monotonic()}  # one save in flight at most
        if self.tiers is not None:  # this rank's copy of the step, taken as DCP stages its own
            self.tiers.capture(step, state)
        if self.use_async and not sync:
            self._pending = (step, tmp, self._async_save(state, tmp))
        else:
            ok = True
            try:  # fsync blocks for the whole flush: in a thread, waited for in polls (waits.py)
                waits.call(lambda: dcp.save(state, storage_writer=self._writer(tmp), process_group=self.io_group),
                           self.io_timeout, f"checkpoint step {step}'s write")
            except FAILURES as exc:  # a TimeoutError too: the write is left behind, never committed
                log.error("rank %d: checkpoint step %d failed to write: %s", self.rank, step, exc)
                ok = False
            self._commit(step, tmp, ok)
        self.save_seconds += time.perf_counter() - started
        return True

    def poll(self) -> None:
        """Commit the in-flight save once every rank's write has finished (collective, each step)."""
        if self._pending is not None and agree_min(int(self._pending[2].done()), self.group):
            self._finish()

    def finalize(self, timeout: float | None = None) -> bool:
        """Wait for the in-flight save and commit it if it succeeded everywhere (collective). With a
        `timeout` (the same on every rank), each rank waits at most that long, then all agree: a save
        not written everywhere by then is dropped, not waited for. False if it was dropped."""
        if self._pending is None:
            return True
        if timeout is not None:
            with contextlib.suppress(*FAILURES, TimeoutError):  # a failed write is _finish()'s to report
                waits.result(self._pending[2], max(0.0, timeout), f"checkpoint step {self._pending[0]}'s write")
            if not agree_min(int(self._pending[2].done()), self.group):
                log.error("rank %d: checkpoint step %d still being written after %.0f s: not committed",
                          self.rank, self._pending[0], timeout)
                self.abandon()
                return False
        self._finish()
        return True

    def _finish(self) -> None:
        assert self._pending is not None
        step, tmp, future = self._pending
        self._pending = None
        ok = True
        # A write gets as long as a collective (io_group's timeout, the checkpointing section's), plus
        # its spawn for a writer process, waited for in polls (waits.py). Past that a writer process is
        # killed; a thread cannot be stopped, and is left to fail (its collectives time out).
        bound = self.io_timeout + (PROCESS_SPAWN_SECONDS if self.writer == "process" else 0.0)
        try:
            waits.result(future, bound, f"checkpoint step {step}'s write")
        except concurrent.futures.TimeoutError:
            log.error("rank %d: checkpoint step %d still being written after %.0f s: %s", self.rank, step, bound,
                      "writer process killed" if self.writer == "process" else "not committed")
            if self.writer == "process":
                stop_writer_process(future)
            ok = False
        except FAILURES as exc:  # the write failed (I/O error, a peer gone): never commit it
            log.error("rank %d: checkpoint step %d failed to write: %s", self.rank, step, exc)
            ok = False
        if not self._commit(step, tmp, ok) and self.writer == "process":
            # Some rank's writer failed (it may be dead): every rank starts the next save with a new one.
            stop_writer_process()

    def abandon(self, timeout: float = 0.0) -> None:
        """After a fault: commit nothing (peers may not have written theirs) and do not wait for the
        writer either: it may be blocked in a collective with a failed peer, and waiting would keep
        this rank from the next iteration's rendezvous. It writes into a temporary directory that
        nothing will commit (attach() gives every iteration new ones) and fails once its process
        group is destroyed."""
        pending = self._pending[2] if self._pending is not None else None
        if pending is not None and timeout > 0:
            with contextlib.suppress(*FAILURES, concurrent.futures.TimeoutError):
                waits.result(pending, timeout, "an abandoned checkpoint write")
        self._pending = None
        if self.tiers is not None:
            self.tiers.drop_pending()
        if self.writer == "process":  # its world is this group's: the next group needs a new one
            stop_writer_process(pending)

    def close(self) -> None:
        self.abandon(timeout=60.0)
        self._stop_exchange()
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def _commit(self, step: int, tmp: Path, ok: bool) -> bool:
        """Collective: commit `tmp` as `step` if every rank wrote its part. False if some rank did not."""
        if not agree_min(int(ok), self.group):
            if self.rank == 0:
                log.error("checkpoint step %d was not written by every rank: not committed", step)
                shutil.rmtree(tmp, ignore_errors=True)
            if self.tiers is not None:
                self.tiers.drop_pending()
            return False
        committed = 1
        if self.rank == 0:
            try:
                ckpt_index.commit(self.root, tmp, step, self.uid, self.world_size, self.attempt)
                ckpt_index.prune(self.root, self.keep, self.uid, self.attempt)
            except OSError as exc:
                log.error("checkpoint step %d could not be committed: %s", step, exc)
                committed = 0
        if agree_min(committed, self.group):
            self.committed_step = step
            if self.tiers is not None:
                self.tiers.committed_step(step)
                if self.peer_group is not None:  # every rank, in commit order: each waits for the one before
                    before = self._exchange
                    self._exchange = threading.Thread(target=self._send_to_peer, args=(step, self.peer_group, before),
                                                      name="rtj-peer-copy", daemon=True)
                    self._exchange.start()
            started = self._save_started.pop(step, None)
            self.write_seconds = round(time.monotonic() - started, 3) if started is not None else None
            if self.on_commit is not None:
                self.on_commit(step, self.write_seconds or 0.0)
        return True

    def load_latest(self, state: dict[str, Any]) -> int:
        """Load, in place, the newest step every rank can load; 0 (state untouched) if none.

        Every rank runs the same number of collectives whatever it sees on disk: each round agrees
        on a candidate (the oldest of the ranks' newest steps), then on whether all ranks have it,
        then on whether all ranks loaded it."""
        self.load_failed = False
        self.restored_from, self.restore_seconds = memstate.VOLUME, 0.0
        bound: int | None = None
        while True:
            mine = [s for s in ckpt_index.complete_steps(self.root, self.uid) if bound is None or s < bound]
            candidate = agree_min(mine[0] if mine else 0, self.group)
            if candidate == 0:
                self.committed_step = 0
                return 0
            everywhere = agree_min(int(candidate in mine), self.group)
            if everywhere and self._restore_copies(candidate, state):
                return candidate
            if everywhere:
                started = time.monotonic()
                ok = LOADED
                try:  # minutes for real-size state: in a thread, waited for in polls (waits.py)
                    waits.call(lambda c=candidate: dcp.load(state, checkpoint_id=step_dir(self.root, c),
                                                            process_group=self.io_group),
                               self.io_timeout, f"checkpoint step {candidate}'s load")
                except concurrent.futures.TimeoutError as exc:
                    log.warning("rank %d: checkpoint step %d: %s", self.rank, candidate, exc)
                    ok = TIMED_OUT
                except FAILURES as exc:  # unreadable shard: DCP raises on every rank
                    log.warning("rank %d: checkpoint step %d does not load: %s", self.rank, candidate, exc)
                    ok = UNREADABLE
                outcome = agree_min(ok, self.group)
                if outcome == LOADED:
                    self.committed_step = candidate
                    self.restore_seconds = round(time.monotonic() - started, 3)
                    return candidate
                if outcome == TIMED_OUT:
                    # Slow storage, not a damaged step: marking it unloadable would lose it for good (seen
                    # on the slow volume: a committed step given up for a far older one). Retried whole.
                    self.load_failed = True
                    raise TimeoutError(f"checkpoint step {candidate} was not read within {self.io_timeout:g} s on "
                                       "every rank (heartbeatTimeoutSeconds): kept, and tried again")
                self.load_failed = True
                if self.rank == 0:  # so that pruning never keeps it in place of a step that loads
                    try:
                        ckpt_index.mark_unloadable(self.root, candidate)
                    except OSError as exc:
                        log.warning("could not mark step %d unloadable: %s", candidate, exc)
            log.warning("checkpoint step %d is not loadable on every rank; trying an older one", candidate)
            bound = candidate

    # --- copies off the volume (memstate) ---------------------------------------------------------------
    def _send_to_peer(self, step: int, group: dist.ProcessGroup | None, before: threading.Thread | None) -> None:
        """In an exchange thread, after `step` committed (every rank, in commit order): send this rank's
        node file to its partner, and keep the one its predecessor sends. Sizes first (0: no copy). Every
        rank swaps whatever happens to its own file: a rank that skipped its turn would leave its partner
        waiting for the group's timeout."""
        tiers, partner = self.tiers, self._partner()
        if tiers is None or partner is None or group is None:
            return
        if before is not None:
            before.join()
        source = memstate.predecessor(self.rank, self.world_size, self.local_world)
        data = b""
        try:
            path = tiers.own_file()  # the newest committed step's (a later commit may have replaced it)
            data = path.read_bytes() if path is not None else b""
        except OSError as exc:
            log.warning("rank %d: step %d's node copy does not read (%s): its peer gets none", self.rank, step, exc)
        try:
            received = _swap(data, partner, source, group)
            tiers.hold(source, received or None)
        except Exception as exc:  # a peer gone, the group destroyed: the next commit tries again
            log.warning("rank %d: step %d's copy not exchanged with its peers: %s", self.rank, step, exc)

    def _restore_copies(self, step: int, state: dict[str, Any]) -> bool:
        """Collective: restore `step` into `state` from the copies off the volume if every rank has one
        (its own, or its peer's, sent to it now). False: every rank loads from the volume instead (any
        rank's copy failing its checksum, or not fitting, included)."""
        if self.tiers is None:
            return False
        started = time.monotonic()
        own = self.tiers.own(step)
        flags = torch.tensor([int(own is not None), self.tiers.held_rank()], dtype=torch.int64)
        gathered = [torch.zeros(2, dtype=torch.int64) for _ in range(self.world_size)]
        waits.work(dist.all_gather(gathered, flags, group=self.io_group, async_op=True), self.io_timeout,
                   "the copies' census")
        plan = memstate.plan_restore([bool(g[0]) for g in gathered], [int(g[1]) for g in gathered])
        if plan is None:
            return False
        source, copy = own if own is not None else (memstate.PEER, None)
        ok = 1
        try:
            send_to = [r for r, s in plan.items() if s == self.rank]
            outgoing = b""
            with contextlib.suppress(OSError):  # sent empty: its receiver fails, and every rank reads the volume
                path = self.tiers.held_file() if send_to else None
                outgoing = path.read_bytes() if path is not None else b""
            if send_to or self.rank in plan:
                received = waits.call(lambda: _swap(outgoing, send_to[0] if send_to else None, plan.get(self.rank),
                                                    self.io_group), self.io_timeout, "a copy from a peer")
                if self.rank in plan:
                    copy = memstate.read_copy(received) if received else None
            if copy is None or not copy.matches(step, self.rank, self.world_size, self.uid):
                raise ValueError(f"no copy of step {step} for rank {self.rank}")
            copy.restore_into(state)
        except Exception as exc:  # the state may be partly overwritten: the volume's load overwrites it all
            log.warning("rank %d: step %d not restored from its copies: %s", self.rank, step, exc)
            ok = 0
        if not agree_min(ok, self.group):
            return False
        if source == memstate.PEER and copy is not None:  # now this rank's own: a respawn restores locally
            self.tiers.adopt(copy)
        self.committed_step = step
        self.restored_from, self.restore_seconds = source, round(time.monotonic() - started, 3)
        return True


def _swap(data: bytes, to: int | None, source: int | None, group: dist.ProcessGroup | None) -> bytes:
    """Send `data` to rank `to` and receive from rank `source` (either may be None), over `group`'s
    point-to-point links: the size, then the bytes. Gloo completes a send or a receive only inside its
    wait() (bounded by the group's timeout), so this blocks: the main thread calls it through waits.call."""

    def both(send: torch.Tensor | None, recv: torch.Tensor | None) -> None:
        ops = [dist.P2POp(dist.isend, send, to, group)] if send is not None else []
        ops += [dist.P2POp(dist.irecv, recv, source, group)] if recv is not None else []
        for handle in dist.batch_isend_irecv(ops) if ops else []:
            handle.wait()

    size = torch.zeros(1, dtype=torch.int64)
    both(torch.tensor([len(data)], dtype=torch.int64) if to is not None else None,
         size if source is not None else None)
    payload = torch.empty(int(size.item()) if source is not None else 0, dtype=torch.uint8)
    both(torch.frombuffer(bytearray(data), dtype=torch.uint8) if to is not None and data else None,
         payload if payload.numel() else None)
    return payload.numpy().tobytes()
