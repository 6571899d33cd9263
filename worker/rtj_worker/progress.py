"""What a rank tells its pod's entrypoint (rtj_worker.report), through files in $RTJ_STATE_DIR.

- `progress.json`, replaced whole (write, then rename) by local rank 0 at every step and after a
  commit (a ~300-byte write: microseconds next to a step): the step reached and when, the seconds a
  step takes (median of the last intervals), the newest committed checkpoint step and when, the run.
  At every step, so that the step a fault interrupted is exact (ranks block in the next collective).
- `ranks.jsonl`, one line appended per event by every rank: `start` (a run begins: its worker group,
  in-process iteration, global rank and the step it resumed from) and `failed` (an exception left the
  training loop: its class, and whether this rank raised it or only saw a peer's fault) and `left`
  (the rank leaves its worker group because peers left the world: a restart it does not cause).

A run is one (worker group, in-process iteration): ft_launcher starts a new worker group after a
rendezvous, inprocess.Wrapper a new iteration in the same processes. Events are rare (a handful per
fault, one line per rank per start) and steps only replace a small file, so nothing grows with the
steps. No torch here; nothing is written without RTJ_STATE_DIR (a script run outside rtj-worker).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

# Where a restored step's state came from (rtj_worker.memstate), fastest first.
SOURCES = MEMORY, NODE, PEER, VOLUME = ("memory", "node", "peer", "volume")


def slowest(*sources: str | None) -> str | None:
    """The slowest of `sources` (SOURCES; anything else ignored): a restore is as slow as its slowest rank."""
    known = [s for s in sources if s in SOURCES]
    return max(known, key=SOURCES.index) if known else None


# A node's budget for its ranks' copies in process memory (two per rank at most: the committed step's and
# the one being saved): a quarter of a p5's 2 TiB; an 8B model with Adam on 16 GPUs needs about 2 x 48 GB.
DEFAULT_COPIES_BYTES_PER_NODE = 512 << 30
PROGRESS = "progress.json"
EVENTS = "ranks.jsonl"

WINDOW = 32  # step intervals the median is taken over
MESSAGE_CHARS = 200


class RankProgress:
    def __init__(self, state_dir: str | os.PathLike[str] | None, local_rank: int, group: str,
                 clock: Any = time.time):
        self.dir = Path(state_dir) if state_dir else None
        self.local_rank, self.group, self.clock = local_rank, group, clock
        self.rank = -1
        self.iteration = 0
        self.step = 0
        self.step_at = 0.0
        self.committed = 0
        self.committed_at = 0.0
        self.commit_seconds: float | None = None  # how long the newest committed save took to write
        self.save_stall: float | None = None  # how long the newest save held the training loop up
        self._intervals: deque[float] = deque(maxlen=WINDOW)
        self._first = True  # no step yet in this run
        self.first_step_at = 0.0  # when this run's first step was done (a recovery ends there)
        self.tiers: Any = None  # rtj_worker.memstate.Tiers: what this rank holds off the volume

    @property
    def writes_progress(self) -> bool:
        return self.dir is not None and self.local_rank == 0

    def started(self, rank: int, iteration: int, step: int, source: str | None = None,
                restore_seconds: float | None = None) -> None:
        """A run begins (after its checkpoint was loaded): `step` is where it resumes; `source`: where
        that step's state came from (rtj_worker.memstate.SOURCES), in `restore_seconds`."""
        self.rank, self.iteration, self.step, self._first = rank, iteration, step, True
        self.step_at = self.clock()
        record: dict[str, Any] = {"e": "start", "rank": rank, "iteration": iteration, "step": step}
        if source:
            record.update(source=source, restoreSeconds=restore_seconds)
        self._append(record)

    def stepped(self, step: int) -> None:
        now = self.clock()
        if not self._first:
            self._intervals.append(now - self.step_at)
        else:
            self.first_step_at = now
        self.step, self.step_at, self._first = step, now, False
        self._write()

    def commit(self, step: int, seconds: float | None = None) -> None:
        """The checkpoint of `step` committed; `seconds`: from the save's start to its commit."""
        self.committed, self.committed_at = step, self.clock()
        self.commit_seconds = seconds if seconds is not None else self.commit_seconds
        self._write()

    def stalled(self, seconds: float) -> None:
        """A save held the training loop up for `seconds` (its state gathered, staged or written): the
        stall of the Young-Daly interval (the operator's status.checkpointInterval). Written with the
        next step."""
        self.save_stall = round(seconds, 4)

    def loaded(self, step: int) -> None:
        """The run resumed from the committed checkpoint `step`: the newest committed one."""
        if step > self.committed:
            self.committed, self.committed_at = step, self.committed_at or self.clock()

    def left(self, message: str) -> None:
        """This rank leaves its worker group because peers left it (train.FullWorld): the restart of
        the group that follows is theirs, not this pod's."""
        self._append({"e": "left", "rank": self.rank, "iteration": self.iteration, "message": message[:MESSAGE_CHARS]})

    def failed(self, exc: BaseException, step: int, own: bool) -> None:
        """An exception left the training loop; `own`: this rank's fault, not a peer's it saw."""
        self._append({"e": "failed", "rank": self.rank, "iteration": self.iteration, "step": step, "own": own,
                      "cause": type(exc).__name__, "message": str(exc)[:MESSAGE_CHARS]})

    @property
    def step_seconds(self) -> float | None:
        return statistics.median(self._intervals) if self._intervals else None

    def _write(self) -> None:
        if not self.writes_progress:
            return
        assert self.dir is not None
        record = {"t": self.clock(), "pid": os.getpid(), "rank": self.rank, "group": self.group,
                  "iteration": self.iteration, "step": self.step, "stepAt": self.step_at,
                  "firstStepAt": self.first_step_at,
                  "stepSeconds": self.step_seconds, "ckpt": self.committed, "ckptAt": self.committed_at or None,
                  "ckptSeconds": self.commit_seconds, "saveStallSeconds": self.save_stall}
        if self.tiers is not None:  # this rank's; every rank of a node holds about as much (FSDP)
            record["copies"] = {"memoryBytes": self.tiers.memory_bytes, "nodeBytes": self.tiers.node_bytes,
                                "peerBytes": self.tiers.peer_bytes, "skipped": self.tiers.skipped[:MESSAGE_CHARS]}
        tmp = self.dir / f".{PROGRESS}.{os.getpid()}"
        with contextlib.suppress(OSError):  # a full or gone state dir must never stop training
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self.dir / PROGRESS)

    def _append(self, record: dict[str, Any]) -> None:
        if self.dir is None:
            return
        line = json.dumps({"t": self.clock(), "pid": os.getpid(), "local": self.local_rank, "group": self.group,
                           **record})
        with contextlib.suppress(OSError), open(self.dir / EVENTS, "a") as out:
            out.write(line + "\n")  # one short write: appends of several ranks stay whole


def for_this_rank(env: Mapping[str, str] = os.environ) -> RankProgress:
    """This rank's reporter, for a training script of your own that rtj-worker runs (the worker image's
    entrypoint, which every RTJ pod runs): the pod's state dir, the local rank and the worker group, from
    the environment ft_launcher and the operator set, as the reference trainer builds its own. Outside
    rtj-worker (no RTJ_STATE_DIR) it writes nothing. Standard library only: no torch, no NVRx.

        progress = for_this_rank()
        progress.loaded(resumed)  # the committed step this run resumed from (0: none)
        progress.started(dist.get_rank(), 0, resumed)
        for step in range(resumed + 1, steps + 1):
            ...  # train one step
            progress.stepped(step)
            if checkpoint_committed:
                progress.commit(step)

    What the pod then shows: STEP, the step time and goodput, restarts counted when the next run makes
    its first step with the steps they rolled back, and CKPT-STEP (docs/your-script.md)."""
    from .ranks import group_key

    return RankProgress(env.get("RTJ_STATE_DIR"), int(env.get("LOCAL_RANK") or 0),
                        f"{group_key(env)}/r{env.get('TORCHELASTIC_RESTART_COUNT', '0')}")


def read_progress(state_dir: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((state_dir / PROGRESS).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class EventTail:
    """New lines of ranks.jsonl since the last read (a line being written is left for the next)."""

    def __init__(self, state_dir: Path):
        self.path, self.offset = state_dir / EVENTS, 0

    def read(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as src:
                src.seek(self.offset)
                data = src.read()
        except OSError:
            return []
        end = data.rfind(b"\n") + 1
        self.offset += end
        out = []
        for line in data[:end].splitlines():
            with contextlib.suppress(ValueError):
                record = json.loads(line)
                if isinstance(record, dict):
                    out.append(record)
        return out
