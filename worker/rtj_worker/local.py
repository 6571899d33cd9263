"""Run the worker entrypoint locally, as one pod would: one ft_launcher, N CPU ranks, loopback
rendezvous. Used by tests/worker/test_worker.py and bench/recovery.py."""

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


# Several launchers (and nvrx-control) on one machine, one hostname: NVRx 0.7's barrier otherwise closes the
# rendezvous at its first round ("multiple participants on the same node", ft_rendezvous_barrier.py); 0.6 reads
# it only under Slurm. A pod has a hostname of its own and never sets it.
ONE_HOST = {"NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE": "1"}


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
        **ONE_HOST,
    }
    env.update(extra)
    return env


@dataclass
class LocalRun:
    workdir: Path
    code: int
    timeline: list[dict[str, Any]]
    report: dict[str, Any]
    name: str = ""

    @property
    def log(self) -> str:
        return (self.workdir / f"worker{self.name}.log").read_text()

    def result(self) -> dict[str, Any]:
        return json.loads((self.workdir / "ckpt" / "result.json").read_text())

    def starts(self) -> list[dict[str, Any]]:
        return [e for e in self.timeline if e["event"] == "start"]

    @property
    def progress(self) -> dict[str, Any]:
        """The pod's last progress report, as its termination message carries it."""
        return dict(self.report.get("progress") or {})

    def conditions(self) -> list[dict[str, Any]]:
        """The rtj.dev/Progress conditions the pod would have written, in order."""
        path = self.workdir / f"report{self.name}.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@dataclass
class LocalNode:
    """A running `rtj-worker` (one pod); `name` tells the files of several in one workdir apart."""

    workdir: Path
    proc: subprocess.Popen[bytes]
    name: str = ""

    def timeline(self) -> list[dict[str, Any]]:
        return events.read(self.workdir / "events.jsonl")

    def wait(self, timeout: float = 300) -> LocalRun:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise
        report_file = self.workdir / f"termination-log{self.name}"
        report = json.loads(report_file.read_text()) if report_file.exists() else {}
        return LocalRun(self.workdir, code, self.timeline(), report, self.name)

    def kill(self) -> None:
        """SIGKILL the pod's every process (a lost node): the entrypoint, its launcher and ranks."""
        from .entrypoint import descendants  # no torch there

        for pid in [*descendants(self.proc.pid), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, 9)
        self.proc.wait()


def start(workdir: Path, train_args: list[str], name: str = "", command: list[str] | None = None,
          **env: Any) -> LocalNode:
    """`rtj-worker -- python -m rtj_worker.train ...` (or `command`) in `workdir`, not waited for."""
    workdir.mkdir(parents=True, exist_ok=True)
    script = Path(sys.executable).with_name("rtj-worker")
    # Without the console script (the package on PYTHONPATH, not installed: the GPU check's image), the
    # same entrypoint as a module.
    entry = [str(script)] if script.exists() else [sys.executable, "-m", "rtj_worker.entrypoint"]
    command = command or ["python", "-m", "rtj_worker.train"]
    # What the pod would publish as its rtj.dev/Progress condition (rtj_worker.report), one JSON line each.
    # Its node's /dev/shm (each pod has its own): the node copies of committed state (rtj_worker.memstate).
    env = {"RTJ_TERMINATION_LOG": str(workdir / f"termination-log{name}"),
           "RTJ_REPORT_FILE": str(workdir / f"report{name}.jsonl"), "RTJ_NODE_TIER_DIR": str(workdir / f"shm{name}"),
           **env}
    with open(workdir / f"worker{name}.log", "w") as log:
        proc = subprocess.Popen([*entry, "--", *command, *train_args], env=local_env(workdir, **env),
                                stdout=log, stderr=subprocess.STDOUT)
    return LocalNode(workdir, proc, name)


def launch(workdir: Path, train_args: list[str], timeout: float = 300, **env: Any) -> LocalRun:
    """`rtj-worker -- python -m rtj_worker.train ...` in `workdir`; blocks until it exits."""
    return start(workdir, train_args, **env).wait(timeout)
