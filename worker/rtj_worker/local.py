"""Run the worker entrypoint locally, as one pod would: one ft_launcher, N CPU ranks, loopback
rendezvous. Used by tests/test_worker.py and bench/recovery.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import events


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


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
