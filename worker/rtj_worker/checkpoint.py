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
to host memory synchronously, written by a background thread), reshards on load, fsyncs every file
and reports a failed write through its future, which the commit protocol below relies on.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from . import ckpt_index
from .ckpt_index import step_dir

log = logging.getLogger(__name__)
# DCP raises CheckpointException (a BaseException) on every rank when any rank's write or read failed.
FAILURES = (Exception, CheckpointException)


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
    """The minimum of `value` over all ranks (collective)."""
    tensor = torch.tensor([value], dtype=torch.int64, device=collective_device(group))
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN, group=group)
    return int(tensor.item())


class Checkpointer:
    """Collective save/load of sharded state. All ranks call save(), poll(), finalize(), load_latest().

    attach() binds it to the process group of the current (in-process restart) iteration.
    """

    def __init__(self, root: str | Path, rank: int, world_size: int, use_async: bool = True, keep: int = 3,
                 uid: str = "", on_commit: Callable[[int], None] | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.rank, self.world_size, self.keep, self.uid = rank, world_size, keep, uid
        self.use_async, self.on_commit = use_async, on_commit
        self.group: dist.ProcessGroup | None = None
        self.io_group: dist.ProcessGroup | None = None
        self._token = "0"
        self._pending: tuple[int, Path, Future] | None = None
        self._stager: DefaultStager | None = None
        self.save_seconds = 0.0  # time the training loop spent blocked in save()
        self.load_failed = False  # a load was attempted and failed: the state may be partly overwritten

    def attach(self, group: dist.ProcessGroup | None = None, timeout: datetime.timedelta | None = None) -> None:
        """Collective, once per process group: DCP needs a CPU (gloo) group; its background thread
        gets a group of its own so that its collectives never interleave with the training loop's.
        `timeout` bounds how long a rank that finished writing waits for the slowest one."""
        self.group = group
        self.rank, self.world_size = dist.get_rank(group), dist.get_world_size(group)
        self.io_group = dist.new_group(backend="gloo", timeout=timeout)
        token = [uuid.uuid4().hex[:8] if self.rank == 0 else None]
        dist.broadcast_object_list(token, src=0, group=self.io_group)
        self._token = str(token[0])  # fresh temporary directories for every attachment

    def _writer(self, path: Path) -> dcp.FileSystemWriter:
        return dcp.FileSystemWriter(path, sync_files=True)

    def save(self, step: int, state: dict[str, Any]) -> None:
        started = time.perf_counter()
        self.finalize()  # the previous save must be committed (or dropped) before the next one starts
        tmp = ckpt_index.tmp_dir(self.root, self.uid, self._token, step)
        if self.use_async:
            if self._stager is None:
                # One stager for the job: it keeps its host copies (pinned on GPU nodes) between saves
                # instead of allocating the whole state again at every save.
                cuda = torch.cuda.is_available()
                self._stager = DefaultStager(StagingOptions(use_pinned_memory=cuda, use_shared_memory=False,
                                                            use_async_staging=False, use_non_blocking_copy=cuda))
            future = dcp.async_save(state, storage_writer=self._writer(tmp), process_group=self.io_group,
                                    async_stager=self._stager)
            self._pending = (step, tmp, future)
        else:
            ok = True
            try:
                dcp.save(state, storage_writer=self._writer(tmp), process_group=self.io_group)
            except FAILURES as exc:
                log.error("rank %d: checkpoint step %d failed to write: %s", self.rank, step, exc)
                ok = False
            self._commit(step, tmp, ok)
        self.save_seconds += time.perf_counter() - started

    def poll(self) -> None:
        """Commit the in-flight save once every rank's write has finished (collective, each step)."""
        if self._pending is not None and agree_min(int(self._pending[2].done()), self.group):
            self._finish()

    def finalize(self) -> None:
        """Wait for the in-flight save and commit it if it succeeded everywhere (collective)."""
        if self._pending is not None:
            self._finish()

    def _finish(self) -> None:
        assert self._pending is not None
        step, tmp, future = self._pending
        self._pending = None
        ok = True
        try:
            future.result()
        except FAILURES as exc:  # the write failed (I/O error, a peer gone): never commit it
            log.error("rank %d: checkpoint step %d failed to write: %s", self.rank, step, exc)
            ok = False
        self._commit(step, tmp, ok)

    def abandon(self, timeout: float = 0.0) -> None:
        """After a fault: commit nothing (peers may not have written theirs) and do not wait for the
        writer either: it may be blocked in a collective with a failed peer, and waiting would keep
        this rank from the next iteration's rendezvous. It writes into a temporary directory that
        nothing will commit (attach() gives every iteration new ones) and fails once its process
        group is destroyed."""
        if self._pending is not None:
            if timeout > 0:
                with contextlib.suppress(*FAILURES):
                    self._pending[2].result(timeout=timeout)
            self._pending = None

    def close(self) -> None:
        self.abandon(timeout=60.0)
        if self._stager is not None:
            self._stager.close()
            self._stager = None

    def _commit(self, step: int, tmp: Path, ok: bool) -> None:
        if not agree_min(int(ok), self.group):
            if self.rank == 0:
                log.error("checkpoint step %d was not written by every rank: not committed", step)
                shutil.rmtree(tmp, ignore_errors=True)
            return
        committed = 1
        if self.rank == 0:
            try:
                ckpt_index.commit(self.root, tmp, step, self.uid, self.world_size)
                ckpt_index.prune(self.root, self.keep, self.uid)
            except OSError as exc:
                log.error("checkpoint step %d could not be committed: %s", step, exc)
                committed = 0
        if agree_min(committed, self.group) and self.on_commit is not None:
            self.on_commit(step)

    def load_latest(self, state: dict[str, Any]) -> int:
        """Load, in place, the newest step every rank can load; 0 (state untouched) if none.

        Every rank runs the same number of collectives whatever it sees on disk: each round agrees
        on a candidate (the oldest of the ranks' newest steps), then on whether all ranks have it,
        then on whether all ranks loaded it."""
        self.load_failed = False
        bound: int | None = None
        while True:
            mine = [s for s in ckpt_index.complete_steps(self.root, self.uid) if bound is None or s < bound]
            candidate = agree_min(mine[0] if mine else 0, self.group)
            if candidate == 0:
                return 0
            if agree_min(int(candidate in mine), self.group):
                ok = 1
                try:
                    dcp.load(state, checkpoint_id=step_dir(self.root, candidate), process_group=self.io_group)
                except FAILURES as exc:  # unreadable shard: DCP raises on every rank
                    log.warning("rank %d: checkpoint step %d does not load: %s", self.rank, candidate, exc)
                    ok = 0
                if agree_min(ok, self.group):
                    return candidate
                self.load_failed = True
                if self.rank == 0:  # so that pruning never keeps it in place of a step that loads
                    try:
                        ckpt_index.mark_unloadable(self.root, candidate)
                    except OSError as exc:
                        log.warning("could not mark step %d unloadable: %s", candidate, exc)
            log.warning("checkpoint step %d is not loadable on every rank; trying an older one", candidate)
            bound = candidate
