"""Run the worker entrypoint locally, as one pod would: one ft_launcher, N CPU ranks, loopback
rendezvous. Used by tests/test_worker.py and bench/recovery.py."""

from __future__ import annotations

import contextlib
import json
import os
import random
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import events
from .ranks import WRAPPER_STORE_OFFSET


def free_port(span: int = WRAPPER_STORE_OFFSET + 1) -> int:
    """A rendezvous port whose derived ports (port + ranks.*_OFFSET) are free too. Chosen below the
    ephemeral range, as a pod's rendezvousPort is: a port the kernel hands out for outgoing
    connections (the local control plane's, other tests') could otherwise take a derived port
    between this check and the stores' bind (seen in CI: EADDRINUSE on port + 1)."""
    low = _ephemeral_low()
    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(max(1024, low - 12000), low - span)
        try:
            with contextlib.ExitStack() as stack:
                for port in range(base, base + span):
                    sock = stack.enter_context(socket.socket())
                    sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError(f"no {span} consecutive free ports below {low}")


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def local_env(workdir: Path, ranks: int = 2, heartbeat: float = 15, **extra: str) -> dict[str, str]:
    """The environment builders/job.py gives a pod, for a single node on this machine."""
    env = {
        **os.environ,
        "NNODES": "1", "RTJ_NNODES": "1:1", "NPROC_PER_NODE": str(ranks), "NODE_RANK": "0",
        "RTJ_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}", "RTJ_RDZV_ID": workdir.name, "RTJ_RDZV_TIMEOUT": "60",
        "RTJ_FT_MAX_RESTARTS": "3", "RTJ_FT_HEARTBEAT_TIMEOUT": f"{heartbeat:g}",
        "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT": "60", "RTJ_FT_MONITOR_INTERVAL": "1",
        "RTJ_CHECKPOINT_DIR": str(workdir / "ckpt"), "RTJ_CHECKPOINT_INTERVAL": "10",
        "RTJ_INPROCESS_SOFT_TIMEOUT": "30", "RTJ_INPROCESS_HARD_TIMEOUT": "45",
        "RTJ_EVENT_LOG": str(workdir / "events.jsonl"), "RTJ_TERMINATION_LOG": str(workdir / "termination-log"),
        "TORCH_CPP_LOG_LEVEL": "ERROR",
    }
    env.update(extra)
    return env


@dataclass
class LocalRun:
    workdir: Path
    code: int
    timeline: list[dict[str, Any]]
    report: dict[str, Any]

    @property
    def log(self) -> str:
        return (self.workdir / "worker.log").read_text()

    def result(self) -> dict[str, Any]:
        return json.loads((self.workdir / "ckpt" / "result.json").read_text())

    def starts(self) -> list[dict[str, Any]]:
        return [e for e in self.timeline if e["event"] == "start"]


def launch(workdir: Path, train_args: list[str], timeout: float = 300, **env: Any) -> LocalRun:
    """`rtj-worker -- python -m rtj_worker.train ...` in `workdir`; blocks until it exits."""
    workdir.mkdir(parents=True, exist_ok=True)
    entry = Path(sys.executable).with_name("rtj-worker")
    with open(workdir / "worker.log", "w") as log:
        proc = subprocess.run([str(entry), "--", "python", "-m", "rtj_worker.train", *train_args],
                              env=local_env(workdir, **env), stdout=log, stderr=subprocess.STDOUT, timeout=timeout)
    report_file = workdir / "termination-log"
    report = json.loads(report_file.read_text()) if report_file.exists() else {}
    return LocalRun(workdir, proc.returncode, events.read(workdir / "events.jsonl"), report)
