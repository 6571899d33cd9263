"""Deep copies of Kubernetes objects as the API returns them (dicts, lists, strings, numbers, bools,
None): what the stores keep is copied on every event, and the few objects a pass may patch on every
pass (world.World.assemble).

marshal round-trips such trees about 4x faster than copy.deepcopy (26 against 103 us for a Job);
anything marshal cannot write (an object that is not plain JSON data) falls back to deepcopy."""

from __future__ import annotations

import copy
import marshal
from typing import TypeVar

T = TypeVar("T")


def clone(obj: T) -> T:
    """A deep copy of `obj` that shares nothing with it."""
    try:
        return marshal.loads(marshal.dumps(obj))  # type: ignore[no-any-return]
    except ValueError:
        return copy.deepcopy(obj)
