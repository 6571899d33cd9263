"""What a pass reads out of each pod and node, worked out once per version of the object (issue 29.8).

A pass reads every pod of its job: at 1000 nodes the termination message and progress report of each are
JSON to parse, and each node's conditions and taints are scanned, on every pass, though a steady gang's
pods change a few at a time. `per_version` keeps a pure function's answer for an object by its uid and
resourceVersion, so a pass pays that work only for the objects that changed since it was last asked; an
unchanged object costs a lookup. The stores replace an object on every change (a new resourceVersion)
and never edit one in place; an object without a uid or resourceVersion (built by hand, e.g. in a table
test) is never kept.

Each function keeps one answer per object (the newest version asked for) and at most `limit` objects,
the least recently changed dropped first, so memory is bounded by the objects a pass reads, not by how
often they change; a deleted object's answers go when the stores drop its tombstone (`forget`), long
after any pass read its last copy. The answers are shared: callers must not modify them (they are frozen dataclasses,
strings, tuples, or mappings the callers only read).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable
from typing import Any, ParamSpec, TypeVar

P = ParamSpec("P")
T = TypeVar("T")

# Objects kept per function: the pods (or nodes) of every RTJ the operator reconciles, with room (8,000 of each
# measured in bench/pass_cost.py: 8 jobs of 1000 nodes). Past it, answers are worked out again (right, slower).
LIMIT = 16384


_ALL: list[PerVersion] = []


def forget(uid: str) -> None:
    """Drop every function's answer for the object `uid` (deleted: stores.py's tombstone sweep)."""
    for fn in _ALL:
        with fn.lock:
            fn.kept.pop(uid, None)


def reset() -> None:
    """Forget every answer (tests that reuse an object's uid and resourceVersion with other contents)."""
    for fn in _ALL:
        with fn.lock:
            fn.kept.clear()


class PerVersion:
    """A pure function of one API object (and hashable further arguments), kept per object version."""

    def __init__(self, fn: Callable[..., Any], limit: int = LIMIT) -> None:
        self.fn, self.limit = fn, limit
        self.kept: dict[str, tuple[str, tuple[Hashable, ...], Any]] = {}
        self.lock = threading.Lock()
        functools.update_wrapper(self, fn)
        _ALL.append(self)

    def __call__(self, obj: dict[str, Any] | None, *args: Hashable) -> Any:
        meta = (obj or {}).get("metadata") or {}
        uid, version = meta.get("uid"), meta.get("resourceVersion")
        if not uid or not version:
            return self.fn(obj, *args)
        entry = self.kept.get(uid)
        if entry is not None and entry[0] == version and entry[1] == args:
            return entry[2]
        answer = self.fn(obj, *args)
        with self.lock:
            self.kept.pop(uid, None)  # re-inserted last: the dict's order is the order of change
            self.kept[uid] = (version, args, answer)
            if len(self.kept) > self.limit:
                for old in list(self.kept)[:len(self.kept) - self.limit + self.limit // 8]:
                    del self.kept[old]
        return answer


def per_version(fn: Callable[P, T]) -> Callable[P, T]:
    """Decorate a pure function of an API object (first argument) and hashable others: module docstring."""
    return PerVersion(fn)  # type: ignore[return-value]

