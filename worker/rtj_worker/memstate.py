"""Committed checkpoint state kept off the shared volume, so that a recovery need not read it.

A rank's copy is its own part of a committed step: the local shards of its FSDP (DTensor) state and
the rest of its state dict (optimizer step counts, param groups), on the CPU. It loads back only into
the same rank of a world of the same size (the same shards), which is what every in-job recovery
restarts: an in-process restart keeps every rank (train.FullWorld), an ft_launcher respawn gives each
node its ranks again, and a spare takes the slots of the node it replaces (ranks.node_slots). Tiers,
each a fallback of the one before, the shared volume last:

- "memory": this process's memory. Kept from the save (a copy taken as DCP stages its own) until the
  step commits, then it is the copy; an in-process restart restores from it.
- "node": a file per rank on this node's /dev/shm (the pod's memory-backed emptyDir, sized by
  spec.resources.shmSize), written in the background after the commit; it outlives the process, so an
  ft_launcher respawn restores from it.
- "peer": the same file sent to the rank that holds the same local rank on the next node slot (a ring
  of nodes), kept in that node's /dev/shm; a spare (or a replaced pod) that takes a lost node's slot
  fetches its ranks' copies from there (checkpoint.Checkpointer.load_latest).

Every copy carries a CRC-32 of its bytes, taken while the step was being written and checked before
it is loaded: a copy that does not match (a bit flipped in memory, a torn file) is skipped, and the
ranks load from the next tier. A copy of another job (uid), step, rank or world size is never loaded.
A copy is held only when it fits: the process's copies (at most two: the committed step's and the one
being saved) within their share of RTJ_STATE_COPIES_BYTES_PER_NODE, the node's and the peer's within the free space
of /dev/shm; a copy that does not fit is not made, which the pod reports (`skipped`).
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import threading
import zlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from .progress import DEFAULT_COPIES_BYTES_PER_NODE, MEMORY, NODE, PEER, SOURCES, VOLUME  # noqa: F401 (SOURCES re-exported: where a restore came from)

log = logging.getLogger(__name__)

OWN, HELD = "own", "peer"  # a node file: this rank's copy, or a copy held for another node's rank
CRC_CHUNK = 64 << 20
DEFAULT_NODE_DIR = "/dev/shm/rtj-copies"


class Unsupported(ValueError):
    """A state dict this module cannot copy (a tensor inside a list): the tiers are off for the job."""


def _walk(obj: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    if isinstance(obj, dict):
        for key in obj:
            yield from _walk(obj[key], (*path, key))
    else:
        yield path, obj


def _local(value: Any) -> Any:
    """A DTensor's local shard; anything else as it is."""
    return value.to_local() if hasattr(value, "to_local") and hasattr(value, "placements") else value


def _has_tensor(value: Any) -> bool:
    if isinstance(value, torch.Tensor):
        return True
    if isinstance(value, (list, tuple)):
        return any(_has_tensor(v) for v in value)
    return False


def crc_of(tensors: dict[str, torch.Tensor], rest: dict[str, Any]) -> int:
    """CRC-32 of the tensors' bytes (in key order) and of the rest's JSON."""
    crc = zlib.crc32(json.dumps(rest, sort_keys=True, default=repr).encode())
    for key in sorted(tensors):
        flat = tensors[key].contiguous().reshape(-1).view(torch.uint8).numpy()
        for start in range(0, len(flat), CRC_CHUNK):
            crc = zlib.crc32(flat[start:start + CRC_CHUNK], crc)
    return crc


def local_bytes(state: dict[str, Any]) -> int:
    """What a copy of this rank's part of `state` takes."""
    shards = (_local(v) for _, v in _walk(state) if isinstance(v, torch.Tensor))
    return sum(t.numel() * t.element_size() for t in shards)


@dataclass
class Copy:
    """A rank's part of a committed (or being saved) step, on the CPU."""

    step: int
    rank: int
    world: int
    uid: str
    tensors: dict[str, torch.Tensor]  # by repr(path): local shards, plain tensors
    rest: dict[str, Any]  # by repr(path): every other leaf
    crc: int | None = None  # set once taken (in the background): a copy without one is never loaded
    nbytes: int = 0

    def matches(self, step: int, rank: int, world: int, uid: str) -> bool:
        return (self.step, self.rank, self.world, self.uid) == (step, rank, world, uid)

    def intact(self) -> bool:
        return self.crc is not None and crc_of(self.tensors, self.rest) == self.crc

    @classmethod
    def take(cls, step: int, rank: int, world: int, uid: str, state: dict[str, Any]) -> Copy:
        """A CPU copy of this rank's part of `state` (no checksum yet: seal() it)."""
        tensors, rest = {}, {}
        for path, value in _walk(state):
            key = repr(path)
            if isinstance(value, torch.Tensor):
                tensors[key] = _local(value).detach().to("cpu", copy=True)
            elif _has_tensor(value):
                raise Unsupported(f"state {'/'.join(map(str, path))} holds tensors inside a {type(value).__name__}")
            else:
                rest[key] = value
        return cls(step, rank, world, uid, tensors, rest,
                   nbytes=sum(t.numel() * t.element_size() for t in tensors.values()))

    def seal(self) -> Copy:
        self.crc = crc_of(self.tensors, self.rest)
        return self

    def restore_into(self, state: dict[str, Any]) -> None:
        """Copy into `state` (this rank's fresh state dict, the same structure) in place; ValueError,
        with nothing promised about `state`, when the structure differs (another model or optimizer)."""
        paths = {repr(p) for p, _ in _walk(state)}
        if paths != set(self.tensors) | set(self.rest):
            raise ValueError(f"the copy of step {self.step} has another structure than this rank's state "
                             f"({len(paths ^ (set(self.tensors) | set(self.rest)))} paths differ)")
        for path, value in _walk(state):
            key = repr(path)
            if isinstance(value, torch.Tensor):
                src, dest = self.tensors.get(key), _local(value)
                if src is None or src.shape != dest.shape or src.dtype != dest.dtype:
                    raise ValueError(f"the copy of step {self.step} does not fit {'/'.join(map(str, path))}")
                with torch.no_grad():
                    dest.copy_(src)
            else:
                parent = state
                for part in path[:-1]:
                    parent = parent[part]
                parent[path[-1]] = self.rest[key]

    def header(self) -> dict[str, Any]:
        return {"step": self.step, "rank": self.rank, "world": self.world, "uid": self.uid, "crc": self.crc,
                "bytes": self.nbytes}


def write_copy(directory: Path, kind: str, copy: Copy) -> Path:
    """`copy` as <directory>/<kind>-rank-<r>.pt, replacing the one there whole (written, then renamed;
    the CRC inside is checked at every read)."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{kind}-rank-{copy.rank}.pt"
    tmp = directory / f".{target.name}.{os.getpid()}.{threading.get_ident()}"
    try:
        torch.save({"header": copy.header(), "tensors": copy.tensors, "rest": copy.rest}, tmp)
        os.replace(tmp, target)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return target


def read_copy(source: Path | bytes) -> Copy | None:
    """The copy in a node file (a path, or its bytes received from a peer) if it is whole and its CRC
    matches; None otherwise (logged)."""
    try:
        data = torch.load(io.BytesIO(source) if isinstance(source, bytes) else source, map_location="cpu",
                          weights_only=True)
        head = data["header"]
        copy = Copy(int(head["step"]), int(head["rank"]), int(head["world"]), str(head["uid"]), dict(data["tensors"]),
                    dict(data["rest"]), crc=int(head["crc"]), nbytes=int(head["bytes"]))
    except FileNotFoundError:
        return None
    except Exception as exc:  # truncated, corrupt, another format: never loaded
        log.warning("%s does not read: %s", "a peer's copy" if isinstance(source, bytes) else source, exc)
        return None
    if not copy.intact():
        log.warning("the copy of step %d, rank %d fails its checksum: not loaded", copy.step, copy.rank)
        return None
    return copy


def shm_free(directory: Path) -> int:
    """Bytes free where `directory` is (its nearest existing parent)."""
    path = directory
    while not path.exists() and path != path.parent:
        path = path.parent
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


@dataclass
class Tiers:
    """This rank's copies off the volume: in its memory, and its node's files (own and held for a peer).

    `budget`: bytes this rank may hold in process memory (its two copies); None: no process copies.
    `node_dir`: where node files go (None: no node or peer copies)."""

    rank: int
    world: int
    uid: str
    budget: int | None
    node_dir: Path | None
    local_world: int = 1  # ranks per node (the peer copies' ring goes node to node)
    committed: Copy | None = None  # the newest committed step's
    pending: Copy | None = None  # the step being saved
    skipped: str = ""  # why the newest copy was not made (reported by the pod)
    node_bytes: int = 0  # the size of this rank's node file, as its writer left it
    peer_bytes: int = 0
    _writer: threading.Thread | None = None
    _sealer: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_env(cls, env: Mapping[str, str], rank: int, world: int, uid: str) -> Tiers | None:
        """RTJ_STATE_COPIES ("0": no copies off the volume), RTJ_STATE_COPIES_BYTES_PER_NODE (the
        process copies' budget of a node, shared by its ranks; default DEFAULT_COPIES_BYTES_PER_NODE),
        RTJ_NODE_TIER_DIR (the node copies' directory, default DEFAULT_NODE_DIR; empty: none) and
        LOCAL_WORLD_SIZE (ranks per node, from the launcher). The operator sets the first two only when
        the spec differs from these defaults (spec.checkpoint.memory)."""
        if env.get("RTJ_STATE_COPIES", "1") == "0":
            return None
        local_world = max(1, int(env.get("LOCAL_WORLD_SIZE") or 1))
        budget = int(env.get("RTJ_STATE_COPIES_BYTES_PER_NODE") or DEFAULT_COPIES_BYTES_PER_NODE) // local_world
        node = env.get("RTJ_NODE_TIER_DIR", DEFAULT_NODE_DIR)
        tiers = cls(rank, world, uid, budget, Path(node) / (uid or "local") if node else None, local_world)
        tiers.clean()
        return tiers

    @property
    def memory_bytes(self) -> int:
        return sum(c.nbytes for c in (self.committed, self.pending) if c is not None)

    def clean(self) -> None:
        """At start: remove what a process of this rank killed in the middle of a write left behind (a
        temporary file of a full copy's size, in memory that counts against the pod), and take the size
        of the node copy an earlier process left."""
        if self.node_dir is None or not self.node_dir.is_dir():
            return
        source = predecessor(self.rank, self.world, self.local_world)
        for pattern in (f".{OWN}-rank-{self.rank}.pt.*", f".{HELD}-rank-{source}.pt.*"):
            for tmp in self.node_dir.glob(pattern):
                with contextlib.suppress(OSError):
                    tmp.unlink()
        with contextlib.suppress(OSError):  # what an earlier process of this rank left (a respawn restores it)
            self.node_bytes = self.node_dir.joinpath(f"{OWN}-rank-{self.rank}.pt").stat().st_size

    def _file(self, kind: str, rank: int) -> Path | None:
        return self.node_dir / f"{kind}-rank-{rank}.pt" if self.node_dir is not None else None

    def capture(self, step: int, state: dict[str, Any]) -> None:
        """A save of `step` starts: copy this rank's part, sealed in the background. The process holds
        the committed step's copy and this one within `budget`: the committed one is let go first (the
        node keeps it), and a step that does not fit alone is not copied (the pod reports why)."""
        self.pending = None
        if self.budget is None:
            return
        need = local_bytes(state)
        if self.committed is not None and need + self.committed.nbytes > self.budget:
            self.committed = None
        if need > self.budget:
            self.skipped = (f"step {step}: this rank's {need} bytes do not fit its {self.budget} bytes "
                            "(spec.checkpoint.memoryCopies.maxBytesPerNode / ranks per node)")
            return
        try:
            copy = Copy.take(step, self.rank, self.world, self.uid, state)
        except Unsupported as exc:
            self.skipped = str(exc)
            return
        self.pending = copy
        self._sealer = threading.Thread(target=copy.seal, name="rtj-memstate-seal", daemon=True)
        self._sealer.start()

    def committed_step(self, step: int) -> None:
        """`step` committed on every rank: its copy becomes the committed one, and goes to this node's
        /dev/shm in the background."""
        copy, self.pending = self.pending, None
        if copy is None or copy.step != step:
            return
        if self._sealer is not None:
            self._sealer.join()
        self.skipped = ""
        self.adopt(copy)

    def adopt(self, copy: Copy) -> None:
        """`copy` (sealed) is this rank's committed one: kept in memory when it fits, and written to the
        node in the background (a copy received from a peer and restored, too)."""
        if self.budget is not None and copy.nbytes <= self.budget:
            self.committed = copy
        if self.node_dir is not None:
            self.wait_written()
            writer = threading.Thread(target=self._write_node, args=(copy,), name="rtj-memstate-node", daemon=True)
            writer.start()  # started before it is published: wait_written() may join it from another thread
            self._writer = writer

    def _write_node(self, copy: Copy) -> None:
        assert self.node_dir is not None
        own = self._file(OWN, self.rank)
        held = own.stat().st_size if own is not None and own.exists() else 0
        if copy.nbytes + (64 << 10) > shm_free(self.node_dir) + held:
            self._drop_own(f"step {copy.step}: {copy.nbytes} bytes do not fit in {self.node_dir} "
                           f"({shm_free(self.node_dir)} free: raise spec.resources.shmSize)")
            return
        try:
            self.node_bytes = write_copy(self.node_dir, OWN, copy).stat().st_size
        except Exception as exc:  # torch.save reports a full volume as a RuntimeError
            self._drop_own(f"step {copy.step}: not written to {self.node_dir}: {exc}")

    def _drop_own(self, why: str) -> None:
        """This step's node copy was not made: the older one goes too (it would be refused later, or worse,
        taken for this step's if the job rolls back and commits the same step again)."""
        self.skipped, self.node_bytes = why, 0
        path = self._file(OWN, self.rank)
        with contextlib.suppress(OSError):
            if path is not None:
                path.unlink()

    def wait_written(self, timeout: float | None = None) -> None:
        if self._writer is not None:
            self._writer.join(timeout)

    def drop_pending(self) -> None:
        self.pending = None

    def own(self, step: int) -> tuple[str, Copy] | None:
        """This rank's verified copy of `step`, and its tier: process memory first, then the node."""
        copy = self.committed
        if copy is not None and copy.matches(step, self.rank, self.world, self.uid) and copy.intact():
            return MEMORY, copy
        if copy is not None and copy.matches(step, self.rank, self.world, self.uid):
            log.warning("rank %d: the in-memory copy of step %d fails its checksum: not loaded", self.rank, step)
            self.committed = None
        path = self._file(OWN, self.rank)
        if path is None:
            return None
        self.wait_written()
        found = read_copy(path)
        if found is not None and found.matches(step, self.rank, self.world, self.uid):
            return NODE, found
        return None

    def held_rank(self) -> int:
        """The rank whose copy this node holds for this rank (the peer tier: the same local rank on the
        previous node slot), -1 for none. Its step and checksum are checked by the rank it is sent to."""
        path = self.held_file()
        return int(path.stem.rsplit("-", 1)[1]) if path is not None else -1

    def own_file(self) -> Path | None:
        """This rank's node file (what its peer gets), once written."""
        self.wait_written()
        path = self._file(OWN, self.rank)
        return path if path is not None and path.exists() else None

    def held_file(self) -> Path | None:
        if self.node_dir is None or partner(self.rank, self.world, self.local_world) is None:
            return None
        path = self.node_dir / f"{HELD}-rank-{predecessor(self.rank, self.world, self.local_world)}.pt"
        return path if path.exists() else None

    def hold(self, rank: int, data: bytes | None) -> None:
        """Keep `data` (a node file of `rank`, another node's, received) on this node in place of what it
        held before; None: that rank has no copy now."""
        if self.node_dir is None:
            return
        target = self.node_dir / f"{HELD}-rank-{rank}.pt"
        self.peer_bytes = 0
        if data is None:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            return
        held = target.stat().st_size if target.exists() else 0
        if len(data) + (64 << 10) > shm_free(self.node_dir) + held:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            self.skipped = f"the peer copy of rank {rank} ({len(data)} bytes) does not fit in {self.node_dir}"
            return
        tmp = target.with_name(f".{target.name}.{os.getpid()}")
        try:
            self.node_dir.mkdir(parents=True, exist_ok=True)
            tmp.write_bytes(data)
            os.replace(tmp, target)  # replaced whole: a reader sees the old copy or the new one
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        self.peer_bytes = len(data)


def partner(rank: int, world: int, local_world: int) -> int | None:
    """The rank that holds `rank`'s peer copy: the same local rank on the next node slot (a ring of
    nodes). None with one node (there is no peer)."""
    if local_world <= 0 or world <= local_world or world % local_world:
        return None
    return (rank + local_world) % world


def predecessor(rank: int, world: int, local_world: int) -> int:
    """The rank whose peer copy `rank` holds: the one whose partner() it is."""
    return (rank - local_world) % world if world else rank


def plan_restore(own: list[bool], held: list[int]) -> dict[int, int] | None:
    """Who sends which rank its copy: {receiver: sender}, for the ranks with no copy of their own, from
    the rank that holds theirs (held[s] = the rank whose copy s holds, -1 for none). None when some rank
    has no copy anywhere: then every rank loads from the volume (a restore is all or nothing)."""
    holders = {r: s for s, r in enumerate(held) if r >= 0}
    plan = {}
    for rank, has in enumerate(own):
        if has:
            continue
        if rank not in holders:
            return None
        plan[rank] = holders[rank]
    return plan
