"""Timeline of what a rank did (start, step, fault, checkpoint), as JSON lines in $RTJ_EVENT_LOG.

Tests and bench/ read it to tell which layer recovered a fault and how long it took.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any


def emit(event: str, **fields: Any) -> None:
    path = os.environ.get("RTJ_EVENT_LOG")
    if not path:
        return
    record = {"t": time.time(), "event": event, "pid": os.getpid(), **fields}
    with open(path, "a") as out:  # one short write per line: appends from many ranks stay whole
        out.write(json.dumps(record) + "\n")


def read(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    try:
        with open(path) as src:
            return [json.loads(line) for line in src if line.strip()]
    except FileNotFoundError:
        return []


def mark(name: str, text: str = "") -> None:
    """Leave a marker for the entrypoint in $RTJ_STATE_DIR (see entrypoint.run)."""
    state_dir = os.environ.get("RTJ_STATE_DIR")
    if state_dir:
        with open(os.path.join(state_dir, name), "w") as out:
            out.write(text)
