"""The on-disk layout of checkpoints, without torch (the entrypoint reads steps at every pod start).

    <root>/step-<N>/               a committed step: DCP shards (__<rank>_0.distcp), .metadata, COMPLETE
    <root>/.tmp-<uid>-<token>-step-<N>/   a save in progress (never loaded)
    <root>/latest_checkpointed_iteration.txt   newest committed step, for NVRx 0.6's progress tracker
    <root>/FINISHED-<uid>.json     training finished for this job, at that step (the entrypoint's exit 0)
    <root>/ATTEMPT-<uid>-<n>       gang attempt n of this job has started (the attempt fence)

A step is committed by writing COMPLETE inside its temporary directory (after every rank's write
succeeded) and renaming the directory: a crash leaves either the old step or the new one, never a
half-written step under a marker. COMPLETE records the RTJ's uid and every file's size, so a step of
another job sharing the directory, a truncated shard or a corrupt marker is skipped, never loaded.

The attempt fence: every pod of a gang records that its attempt (RTJ_ATTEMPT) started, one file per
attempt (claim_attempt: created, never rewritten, so the record only grows), and a rank of an older
attempt commits, prunes and finishes nothing once a newer one is recorded (Superseded). The operator
starts a new gang without waiting for an old pod on a lost, unfenced node (its instance may still run
it); this keeps such a rank from committing a step beside the new gang or pruning the step it loads. A
commit checks before and after writing its marker: only one already past the second check when the new
gang starts can still land (it is a whole step, and the new gang's next commit of that step replaces it).
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
MARKER = "COMPLETE"
# Left by rank 0 when every rank agreed that a committed step does not load: never tried or kept again.
BAD = "UNLOADABLE"
ITERATION_FILE = "latest_checkpointed_iteration.txt"
FINISHED = "FINISHED-{uid}.json"
ATTEMPT = "ATTEMPT-{uid}-"
_STEP_RE = re.compile(r"^step-(\d+)$")


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:09d}"


def tmp_dir(root: Path, uid: str, token: str, step: int) -> Path:
    return root / f".tmp-{uid or 'local'}-{token}-step-{step:09d}"


def step_of(tmp: Path) -> int:
    """The step of a temporary save directory (tmp_dir)."""
    return int(tmp.name.rsplit("-", 1)[1])


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durable(path: Path, data: str) -> None:
    """Write, fsync, rename into place, fsync the directory: the file is whole or absent."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
    with open(tmp, "w") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def read_marker(path: Path, uid: str | None = None) -> dict[str, Any] | None:
    """The marker of a committed step directory if it is whole, ours and matches the files on disk."""
    match = _STEP_RE.match(path.name)
    if not match:
        return None
    if (path / BAD).exists():
        return None
    try:
        meta = json.loads((path / MARKER).read_text())
        step, files = int(meta["step"]), dict(meta["files"])
        owner = str(meta.get("uid", ""))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:  # empty, truncated or corrupt marker
        log.warning("skipping %s: unreadable %s marker: %s", path, MARKER, exc)
        return None
    if step != int(match.group(1)):
        log.warning("skipping %s: its marker is for step %d", path, step)
        return None
    if uid is not None and owner != uid:
        log.warning("skipping %s: written by another job (uid %r, this job is %r)", path, owner, uid)
        return None
    for name, size in files.items():
        try:
            if (path / name).stat().st_size != int(size):
                log.warning("skipping %s: %s is truncated", path, name)
                return None
        except (OSError, ValueError, TypeError):
            log.warning("skipping %s: %s is missing", path, name)
            return None
    return meta


def complete_steps(root: Path, uid: str | None = None) -> list[int]:
    """Committed steps that are whole (and ours, when uid is given), newest first."""
    if not root.is_dir():
        return []
    steps = []
    for path in root.iterdir():
        meta = read_marker(path, uid)
        if meta is not None:
            steps.append(int(meta["step"]))
    return sorted(steps, reverse=True)


def latest_step(root: Path, uid: str | None = None) -> int:
    steps = complete_steps(root, uid)
    return steps[0] if steps else 0


def latest_iteration(root: Path) -> int:
    """The step in <root>/latest_checkpointed_iteration.txt: what Megatron-LM, NeMo and NVRx write, and
    so a user's script that saves under $RTJ_CHECKPOINT_DIR; 0 when absent or not a step ("release")."""
    try:
        return max(0, int((root / ITERATION_FILE).read_text().strip()))
    except (OSError, ValueError):
        return 0


class Superseded(OSError):
    """A newer gang attempt of this job has started: this one's ranks commit nothing any more."""


def recorded_attempt(root: Path, uid: str) -> int:
    """The newest gang attempt of job `uid` that started here (0: none recorded)."""
    prefix = ATTEMPT.format(uid=uid or "local")
    try:
        names = [p.name[len(prefix):] for p in root.glob(f"{prefix}*")]
    except OSError:
        return 0
    return max((int(n) for n in names if n.isdigit()), default=0)


def claim_attempt(root: Path, uid: str, attempt: int) -> None:
    """Record that gang `attempt` of job `uid` starts (every pod of it, at its start, before its ranks load):
    from now on, ranks of older attempts commit nothing (fence). One file per attempt, so a late claim of an
    older attempt never hides a newer one."""
    if attempt > 0:
        root.mkdir(parents=True, exist_ok=True)  # before the ranks make it
        path = root / f"{ATTEMPT.format(uid=uid or 'local')}{attempt}"
        if not path.exists():
            write_durable(path, f"{attempt}\n")


def fence(root: Path, uid: str, attempt: int, what: str) -> None:
    """Raise Superseded if a newer gang attempt than `attempt` (0: not fenced) of job `uid` has started."""
    newer = recorded_attempt(root, uid) if attempt else 0
    if newer > attempt:
        raise Superseded(f"{what}: gang attempt {newer} of this job has started, and this rank is of attempt "
                         f"{attempt} (its pod outlived its gang, e.g. on a lost node)")


def commit(root: Path, tmp: Path, step: int, uid: str, world_size: int, attempt: int = 0) -> Path:
    """Seal the fully written `tmp` as step `step`: marker in it, then one rename. `attempt`: the gang attempt
    of the committing rank (fence; 0: none)."""
    fence(root, uid, attempt, f"checkpoint step {step} not committed")
    files = {}
    for path in sorted(tmp.iterdir()):
        if path.is_file():
            with open(path, "rb") as src:  # shards were fsynced by their writers; make sure of it
                os.fsync(src.fileno())
            files[path.name] = path.stat().st_size
    marker = {"step": step, "uid": uid, "world_size": world_size, "time": time.time(), "files": files}
    write_durable(tmp / MARKER, json.dumps(marker))
    fence(root, uid, attempt, f"checkpoint step {step} not committed")  # again, after the slow part
    final = step_dir(root, step)
    if final.exists():  # the same step saved again (after a restart): replace it whole
        old = root / f".old-{uuid.uuid4().hex[:8]}-{final.name}"
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
    fsync_dir(root)
    write_durable(root / ITERATION_FILE, f"{step}\n")
    return final


def mark_unloadable(root: Path, step: int) -> None:
    write_durable(step_dir(root, step) / BAD, "")


def prune(root: Path, keep: int, uid: str, attempt: int = 0) -> None:
    """Keep this job's `keep` newest whole steps, not counting any marked unloadable (those go too);
    never touch another job's files, nor anything once a newer gang attempt started (fence)."""
    fence(root, uid, attempt, "old checkpoints not pruned")
    ours = complete_steps(root, uid)
    kept = set(ours[:keep])
    for step in ours:
        if step not in kept:
            shutil.rmtree(step_dir(root, step), ignore_errors=True)
    # Temporary directories of our saves that were abandoned (a fault or a failed write).
    prefix = f".tmp-{uid or 'local'}-"
    for path in root.glob(f"{prefix}*-step-*"):
        try:
            step = int(path.name.rsplit("-", 1)[1])
        except ValueError:
            continue
        if kept and step <= max(kept):
            shutil.rmtree(path, ignore_errors=True)
    for path in root.glob(".old-*"):
        shutil.rmtree(path, ignore_errors=True)
    for path in root.glob(f"step-*/{BAD}"):
        meta = path.parent / MARKER
        try:
            owner = json.loads(meta.read_text()).get("uid", "")
        except (OSError, ValueError, AttributeError):
            owner = None
        if owner == uid:
            shutil.rmtree(path.parent, ignore_errors=True)


def write_finished(root: Path, uid: str, step: int, attempt: int = 0) -> None:
    """Rank 0, after the final step was committed: training finished for job `uid` at `step`. One
    file per uid, not result.json: jobs may share the directory."""
    fence(root, uid, attempt, "training not marked finished")
    write_durable(root / FINISHED.format(uid=uid or "local"),
                  json.dumps({"uid": uid, "step": step, "time": time.time()}))


def finished(root: Path, uid: str) -> int | None:
    """The step at which training finished for job `uid`, if it has: the marker must be this job's
    and name the newest committed step (a later run that trained further, e.g. with more steps,
    makes an older marker stale)."""
    try:
        meta = json.loads((root / FINISHED.format(uid=uid or "local")).read_text())
        owner, step = str(meta["uid"]), int(meta["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return step if owner == uid and step == latest_step(root, uid) else None
