"""Per-rank checkpoints on the shared volume, saved with NVRx TorchAsyncCheckpoint.

Layout: <dir>/step-<N>/rank-<r>.pt plus <dir>/step-<N>/COMPLETE, which rank 0 writes (atomically)
only after every rank's shard of step N is on disk. A step without the marker, or with a shard
that does not load, is skipped, never loaded: ranks agree with an all-reduce on the newest step
that every rank can load.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)
MARKER = "COMPLETE"


@contextlib.contextmanager
def _without_cuda_sync() -> Iterator[None]:
    """NVRx 0.4.1 calls torch.cuda.synchronize() unconditionally when scheduling a save, which
    raises on a CPU-only torch. With no CUDA there is nothing to synchronize: make it a no-op."""
    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.synchronize
    torch.cuda.synchronize = lambda *args, **kwargs: None
    try:
        yield
    finally:
        torch.cuda.synchronize = original


def _async_checkpoint_class() -> type:
    from nvidia_resiliency_ext.checkpointing.async_ckpt.torch_ckpt import TorchAsyncCheckpoint

    class AsyncCheckpoint(TorchAsyncCheckpoint):
        def async_save(self, state_dict: Any, *args: Any, **kwargs: Any) -> None:
            with _without_cuda_sync():
                super().async_save(state_dict, *args, **kwargs)

    return AsyncCheckpoint


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:09d}"


def complete_steps(root: Path) -> list[int]:
    """Steps with a COMPLETE marker, newest first."""
    steps = []
    for path in root.glob("step-*"):
        if (path / MARKER).exists():
            try:
                steps.append(int(path.name.split("-", 1)[1]))
            except ValueError:
                continue
    return sorted(steps, reverse=True)


class Checkpointer:
    """Collective save/load of per-rank state. All ranks call save(), finalize() and load_latest()."""

    def __init__(self, root: str | Path, rank: int, world_size: int, use_async: bool = True, keep: int = 3,
                 on_commit: Callable[[int], None] | None = None):
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.rank, self.world_size, self.keep = rank, world_size, keep
        self.on_commit = on_commit
        # GPU: NVRx's persistent writer process, fed host copies of the tensors (the D2H copy is the
        # snapshot). CPU: a writer forked per save, whose copy-on-write memory is the snapshot, so
        # nothing is copied at all while training goes on.
        self._persistent = torch.cuda.is_available()
        self._async = _async_checkpoint_class()(persistent_queue=self._persistent) if use_async else None
        self._pending: int | None = None
        self.save_seconds = 0.0  # time the training loop spent blocked in save()
        self._warm = False

    def _warm_up(self) -> None:
        """NVRx spawns its persistent writer process on the first save (about a second: it imports
        torch). Do that before training, not inside the loop. Needs the process group."""
        if self._async is not None and self._persistent and not self._warm:
            self._async.async_save({}, os.devnull)
            self._drain(blocking=True)
        self._warm = True

    def save(self, step: int, state: dict[str, Any]) -> None:
        started = time.perf_counter()
        self.finalize()  # the previous save must be complete before the next one starts
        path = step_dir(self.root, step)
        path.mkdir(parents=True, exist_ok=True)
        payload = {"step": step, "rank": self.rank, "world_size": self.world_size, "state": state}
        target = path / f"rank-{self.rank:05d}.pt"
        if self._async is not None:
            self._async.async_save(payload, target)
            self._pending = step
        else:
            torch.save(payload, target)
            self._commit(step)
        self.save_seconds += time.perf_counter() - started

    def _drain(self, blocking: bool) -> bool:
        """Finish local async writes; True when none is left. Never touches the process group."""
        if self._async is None:
            return True
        queue = self._async._async_calls_queue
        with _without_cuda_sync():
            queue.maybe_finalize_async_calls(blocking=blocking, no_dist=True)
        return queue.get_num_unfinalized_calls() == 0

    def poll(self) -> None:
        """Commit the in-flight save as soon as every rank has written it (collective, each step)."""
        if self._pending is None:
            return
        done = torch.tensor([1 if self._drain(blocking=False) else 0])
        dist.all_reduce(done, op=dist.ReduceOp.MIN)
        if int(done.item()) == 1:
            step, self._pending = self._pending, None
            self._commit(step)

    def finalize(self) -> None:
        """Wait for the in-flight save and commit it (collective)."""
        if self._pending is None:
            return
        self._drain(blocking=True)
        step, self._pending = self._pending, None
        self._commit(step)

    def abandon(self) -> None:
        """After a fault: finish local writes but commit nothing; peers may not have written theirs."""
        self._drain(blocking=True)
        self._pending = None

    def close(self) -> None:
        self._drain(blocking=True)
        if self._async is not None:
            self._async._async_calls_queue.close()
            self._async = None

    def _commit(self, step: int) -> None:
        dist.barrier()
        if self.rank == 0:
            marker = step_dir(self.root, step) / MARKER
            tmp = marker.with_suffix(".tmp")
            tmp.write_text(json.dumps({"step": step, "world_size": self.world_size, "time": time.time()}))
            os.replace(tmp, marker)
            self._prune(step)
        if self.on_commit is not None:
            self.on_commit(step)

    def _prune(self, newest: int) -> None:
        kept = complete_steps(self.root)[: self.keep]
        for path in self.root.glob("step-*"):
            try:
                step = int(path.name.split("-", 1)[1])
            except ValueError:
                continue
            if step not in kept and step < newest:
                shutil.rmtree(path, ignore_errors=True)

    def load_latest(self) -> tuple[int, dict[str, Any] | None]:
        """The newest step every rank can load, and this rank's state (0, None if none)."""
        self._warm_up()
        for step in complete_steps(self.root):
            payload = self._try_load(step)
            ok = torch.tensor([1 if payload is not None else 0])
            dist.all_reduce(ok, op=dist.ReduceOp.MIN)
            if int(ok.item()) == 1:
                assert payload is not None
                return step, payload["state"]
            log.warning("checkpoint step %d is not loadable on every rank; trying an older one", step)
        return 0, None

    def _try_load(self, step: int) -> dict[str, Any] | None:
        meta = json.loads((step_dir(self.root, step) / MARKER).read_text())
        # Replicated (DDP) state: any shard serves a rank that did not exist when it was saved.
        source = self.rank if self.rank < int(meta["world_size"]) else 0
        path = step_dir(self.root, step) / f"rank-{source:05d}.pt"
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # truncated, corrupt or missing: skip, never load
            log.warning("rank %d: skipping unreadable checkpoint %s: %s", self.rank, path, exc)
            return None
        if not isinstance(payload, dict) or payload.get("step") != step:
            log.warning("rank %d: skipping checkpoint %s with unexpected content", self.rank, path)
            return None
        return payload
