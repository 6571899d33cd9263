"""A crash loop inside the pod: ft_launcher restarting ranks that fail the same way every time.

Any training command, the user's own included: read from what the ranks print (ft_launcher prefixes
each line with its local rank, `[default0]:`) and from the launcher's own records, never from the
trainer. A worker group that failed twice in a row with the same last exception, and neither the step
nor the newest checkpoint moved in between, will fail so again: a typo, a missing dependency, a bad
argument, a script that raises at the same step after every respawn. The entrypoint then stops the
launcher instead of letting it spend its restarts (20 by default, each importing torch and
initialising CUDA on a p5), and exits CRASH_LOOP with the exception and the last lines of its
traceback, which the operator shows in the RTJ's condition and event.

Faults a rank only saw (a peer's: its connection reset, its collective timed out) never count: they
are the platform's or another pod's, and restarting is what recovers them.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, field

# How many failures of the same kind in a row make a loop: the first may be bad luck, the second is not.
REPEATS = 2
MAX_LINES = 12  # of the traceback, kept for the report
MAX_CHARS = 200  # per line
# `[default3]:...`: a line a rank printed, as ft_launcher (torchrun's --tee) forwards it.
RANK_LINE = re.compile(r"^\[(?P<role>[A-Za-z_]+)(?P<rank>\d+)\]:(?P<text>.*)$")
# `[default3]:...` where the launcher tags the ranks' lines (torchrun's --tee); NVRx 0.6 does not.
TRACEBACK = "Traceback (most recent call last):"
# A log record (the launcher's own: NVRx 0.6 `2026-12-05 11:05:20,885 [INFO] ...`, 0.4.1 `[2026-12-05
# 11:06:25,424] [ERROR] ...`; the entrypoint's): a timestamp first. Never part of a traceback, even when
# it lands between two of its lines.
LOG_RECORD = re.compile(r"^\[?\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}")
# The launcher's record of a failed worker group (NVRx 0.6/0.7 launcher.py: "[%s] Worker group FAILED. ...").
GROUP_FAILED = re.compile(r"Worker group (FAILED|UNHEALTHY)")
# A worker group joined its rendezvous, so its ranks start now: NVRx 0.4.1's c10d rendezvous ("has joined
# round 3 of the rendezvous 'x' as rank 0"), 0.6's barrier ("has joined the rendezvous 'x' as rank 0").
GROUP_JOINED = re.compile(r"has joined (round \d+ of )?the rendezvous")
# What a rank sees when a peer failed, not a fault of its own (rtj_worker.train.caused_by_peer's markers).
PEER_MARKERS = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "timed out", "Timed out",
                "DistNetworkError", "DistStoreError", "aborted", "Socket Timeout", "RankShouldRestart")
NO_TRACEBACK = "its ranks exited without a traceback"


@dataclass(frozen=True)
class Failure:
    """One failed worker group: its last exception (the signature), the lines that led to it, and the
    progress (step, checkpoint) seen when it failed."""

    signature: str
    lines: tuple[str, ...]
    progress: tuple[int, ...]

    @property
    def own(self) -> bool:
        return not any(marker in line for line in (self.signature, *self.lines) for marker in PEER_MARKERS)


@dataclass
class _Rank:
    lines: deque[str] = field(default_factory=lambda: deque(maxlen=MAX_LINES))  # the newest output
    traceback: list[str] | None = None  # being read
    last: tuple[str, ...] = ()  # the last complete traceback


class CrashLoop:
    """Fed every line of the launcher's output (line()) and, at each failed worker group, the progress
    (group_failed()); `loop` is set once the same failure came REPEATS times in a row without progress."""

    def __init__(self, repeats: int = REPEATS):
        self.repeats = repeats
        self.ranks: dict[str, _Rank] = {}
        self.failures: list[Failure] = []
        self.loop: Failure | None = None
        self._late = False  # the last failure was read before any traceback of its ranks came

    def line(self, line: str) -> bool:
        """Read one line of output; True if it says the worker group failed (the caller then calls
        group_failed with the progress it knows)."""
        line = line.rstrip("\n")
        match = RANK_LINE.match(line)
        if match is None:
            if GROUP_FAILED.search(line) is not None:
                return True
            if GROUP_JOINED.search(line) is not None:
                self.group_started()
                return False
            if LOG_RECORD.match(line):
                return False  # the launcher's (or a logger's) record, not what a rank printed
            # NVRx 0.6's launcher forwards the ranks' output unprefixed: theirs, rank unknown.
            key, text = "?", line[:MAX_CHARS]
        else:
            key, text = match["role"] + match["rank"], match["text"][:MAX_CHARS]
        rank = self.ranks.setdefault(key, _Rank())
        rank.lines.append(text)
        if text.startswith(TRACEBACK):
            rank.traceback = [text]
        elif rank.traceback is not None:
            rank.traceback.append(text)
            if text and not text[0].isspace() and len(rank.traceback) > 2:  # the exception line ends it
                rank.last = tuple(rank.traceback[-MAX_LINES:])
                rank.traceback = None
        return False

    def group_failed(self, progress: tuple[int, ...]) -> Failure:
        """A worker group failed: record it (its ranks' output starts anew) and decide whether it loops."""
        failure = self._failure(progress)
        self.ranks.clear()
        self._late = failure.signature == NO_TRACEBACK
        self.failures = [*self.failures[-(self.repeats - 1):], failure] if self.repeats > 1 else [failure]
        self._decide()
        return failure

    def group_started(self) -> None:
        """A new worker group joined its rendezvous. What its ranks printed after the last failure's record
        is that failure's: NVRx 0.4.1 (torch's log tailing) forwards the ranks' output a moment after the
        launcher has logged the group's failure, flushing it when it stops them, before the next
        rendezvous; on a loaded machine the traceback came after the record, and each failure read as
        one without a traceback, so a typo looped four times instead of two (CI). Read again with it."""
        if self._late and self.failures and any(r.lines for r in self.ranks.values()):
            earlier = self.failures[-1]
            self.failures[-1] = self._failure(earlier.progress, earlier.lines)
            self.ranks.clear()
            self._decide()
        self._late = False

    def _failure(self, progress: tuple[int, ...], earlier: tuple[str, ...] = ()) -> Failure:
        tracebacks = [r.last for r in self.ranks.values() if r.last]
        own = [t for t in tracebacks if Failure(t[-1], t, progress).own]
        if own:
            return Failure(own[0][-1], own[0], progress)
        if tracebacks:
            return Failure(tracebacks[0][-1], tracebacks[0], progress)
        tail = tuple(line for r in self.ranks.values() for line in list(r.lines)[-3:])
        return Failure(NO_TRACEBACK, (*earlier, *tail)[-MAX_LINES:], progress)

    def _decide(self) -> None:
        recent = self.failures[-self.repeats:]
        if (len(recent) == self.repeats and all(f.own for f in recent)
                and len({(f.signature, f.progress) for f in recent}) == 1):
            self.loop = recent[-1]

    def reason(self) -> str:
        """What the pod's termination report says of the loop (the operator compares it across pods)."""
        assert self.loop is not None
        return (f"its ranks failed the same way {self.repeats} times in a row with no step or checkpoint "
                f"progress: {self.loop.signature}")
