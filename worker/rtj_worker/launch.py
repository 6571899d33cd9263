"""ft_launcher's command line for the installed NVRx version, and how to read what it did.

Kept free of torch and NVRx imports: the entrypoint runs at every pod start (importing torch costs
about 6 s) and only needs the version (importlib.metadata) and flag names checked against NVRx's
sources for 0.4.1 and 0.6.0 (fault_tolerance/launcher.py).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import os
import re
import shutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

NVRX = "nvidia-resiliency-ext"
# Logged by NVRx 0.6 when its progress tracker refuses further restarts (the launcher then exits 1).
NO_PROGRESS_LINE = "Progress tracker detected no progress across restarts"
# Logged by the torch elastic agent when the c10d store (node 0's launcher) stops answering.
STORE_LOST_LINES = ("RendezvousConnectionError", "The connection to the C10d store has failed")
# Logged by the torch elastic agent once the rendezvous has completed and ranks are being started.
RENDEZVOUS_DONE_LINES = ("Rendezvous complete for workers", "has joined round", "Event: rendezvous_completed",
                         "exited with non-zero exit code")
_PYTHON = re.compile(r"^python(3(\.\d+)?)?$")
# Python options that take the next token as their value.
_PYTHON_OPTS_WITH_VALUE = {"-W", "-X", "--check-hash-based-pycs"}


class ConfigError(Exception):
    pass


def nvrx_version() -> tuple[int, int]:
    """(major, minor) of the installed NVRx; PYTHONPATH copies (e.g. .nvrx06/) count."""
    version = importlib.metadata.version(NVRX)
    major, minor = (int(x) for x in re.findall(r"\d+", version)[:2])
    return major, minor


@dataclass(frozen=True)
class LaunchConfig:
    nnodes: str
    nproc_per_node: int
    node_rank: int
    rdzv_endpoint: str
    rdzv_id: str
    rdzv_timeout: int
    max_restarts: int
    heartbeat_timeout: float
    initial_heartbeat_timeout: float
    monitor_interval: float
    checkpoint_dir: str
    max_no_progress_cycles: int
    uid: str

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> LaunchConfig:
        def need(name: str) -> str:
            value = env.get(name)
            if not value:
                raise ConfigError(f"environment variable {name} is not set (is this pod made by rtj-operator?)")
            return value

        try:
            cfg = cls(
                nnodes=env.get("RTJ_NNODES") or need("NNODES"),
                nproc_per_node=int(env.get("NPROC_PER_NODE", "1")),
                node_rank=int(need("NODE_RANK")),
                rdzv_endpoint=need("RTJ_RDZV_ENDPOINT"),
                rdzv_id=env.get("RTJ_RDZV_ID", "rtj"),
                rdzv_timeout=int(env.get("RTJ_RDZV_TIMEOUT", "600")),
                max_restarts=int(env.get("RTJ_FT_MAX_RESTARTS", "20")),
                heartbeat_timeout=float(env.get("RTJ_FT_HEARTBEAT_TIMEOUT", "900")),
                initial_heartbeat_timeout=float(env.get("RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT", "1200")),
                monitor_interval=float(env.get("RTJ_FT_MONITOR_INTERVAL", "5")),
                checkpoint_dir=env.get("RTJ_CHECKPOINT_DIR", "/checkpoints"),
                max_no_progress_cycles=int(env.get("RTJ_FT_MAX_NO_PROGRESS_CYCLES", "3")),
                uid=env.get("RTJ_UID", ""),
            )
        except ValueError as exc:
            raise ConfigError(f"bad numeric setting: {exc}") from None
        if ":" not in cfg.rdzv_endpoint:
            raise ConfigError(f"RTJ_RDZV_ENDPOINT must be host:port, got {cfg.rdzv_endpoint!r}")
        port = int(cfg.rdzv_endpoint.rsplit(":", 1)[1]) if cfg.rdzv_endpoint.rsplit(":", 1)[1].isdigit() else -1
        if not 0 < port <= 65535 - 2:
            raise ConfigError(f"the rendezvous port must leave room for port+1 and port+2 (got {port})")
        if cfg.heartbeat_timeout <= cfg.monitor_interval:
            raise ConfigError("RTJ_FT_HEARTBEAT_TIMEOUT must exceed RTJ_FT_MONITOR_INTERVAL")
        return cfg

    @property
    def rdzv_host(self) -> str:
        return self.rdzv_endpoint.rsplit(":", 1)[0]

    @property
    def iteration_file(self) -> str:
        return str(Path(self.checkpoint_dir) / "latest_checkpointed_iteration.txt")


def training_command(command: list[str]) -> list[str]:
    """The command each rank runs, checked: a missing script or module is a configuration error.

    A bare `python` becomes this interpreter (the ranks' environment may lack a venv's PATH)."""
    if not command:
        raise ConfigError("no training command after '--'")
    if _PYTHON.match(command[0]):
        command = [sys.executable, *command[1:]]
        _check_python_target(command[1:])
    elif not (shutil.which(command[0]) or Path(command[0]).is_file()):
        raise ConfigError(f"training command {command[0]!r} not found")
    return command


def _top_level_exists(name: str) -> bool:
    """Whether `python -m name...` would find the top-level package, importing nothing (a package's
    __init__ may import torch). Path entries first (with the working directory, as `-m` has it), then
    the meta-path finders, which is where an editable install (setuptools' finder) is found."""
    if importlib.machinery.PathFinder.find_spec(name, [os.getcwd(), *sys.path]) is not None:
        return True
    for finder in sys.meta_path:
        if finder is importlib.machinery.PathFinder or not hasattr(finder, "find_spec"):
            continue
        try:
            if finder.find_spec(name, None) is not None:
                return True
        except (ImportError, ValueError):
            continue
    return False


def _check_python_target(args: list[str]) -> None:
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-c":
            return
        if arg == "-m" or (arg.startswith("-m") and len(arg) > 2):
            module = args[i + 1] if arg == "-m" and i + 1 < len(args) else arg[2:]
            top = module.split(".")[0]
            if not module or not _top_level_exists(top):
                raise ConfigError(f"training module {module!r} not found")
            return
        if arg in _PYTHON_OPTS_WITH_VALUE:
            i += 2
            continue
        if arg.startswith("-"):
            i += 1
            continue
        if not Path(arg).is_file():
            raise ConfigError(f"training script {arg!r} not found (working directory {os.getcwd()})")
        return
    raise ConfigError("the python command names no script or module")


def launcher_argv(cfg: LaunchConfig, command: list[str], version: tuple[int, int] | None = None) -> list[str]:
    """ft_launcher flags for `version`, then `--no-python` and the user's command: every token of the
    command lands in ft_launcher's positional training script and its REMAINDER arguments, so a
    user's `--max-restarts` or `--rdzv-endpoint` reaches the script, never the launcher."""
    version = version or nvrx_version()
    argv = [
        sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher",
        f"--nnodes={cfg.nnodes}",
        f"--nproc-per-node={cfg.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={cfg.rdzv_endpoint}",
        f"--rdzv-id={cfg.rdzv_id}",
        # Node 0 hosts the c10d store; naming it avoids relying on hostname matching in pods.
        f"--rdzv-conf=is_host={1 if cfg.node_rank == 0 else 0},join_timeout={cfg.rdzv_timeout}",
        f"--max-restarts={cfg.max_restarts}",
        f"--monitor-interval={cfg.monitor_interval:g}",
        f"--ft-rank-heartbeat-timeout={cfg.heartbeat_timeout:g}",
        f"--ft-initial-rank-heartbeat-timeout={cfg.initial_heartbeat_timeout:g}",
        f"--ft-workload-check-interval={cfg.monitor_interval:g}",
        # The NIC monitor watches InfiniBand link counters; p5 uses EFA, and CPU runs have neither.
        "--ft-enable-nic-monitor=False",
    ]
    if version >= (0, 6):
        argv += [
            # 0.6's default rendezvous: an atomic barrier instead of compare-and-set rounds.
            "--ft-rdzv-impl=barrier",
            # 0.6 leaves heartbeat timeouts unset by default and times sections instead. Setup
            # (process group, model, checkpoint load) gets the initial timeout, a step or a save the
            # steady one; code outside any section too.
            f"--ft-rank-section-timeouts=setup:{cfg.initial_heartbeat_timeout:g},"
            f"step:{cfg.heartbeat_timeout:g},checkpointing:{cfg.heartbeat_timeout:g}",
            f"--ft-rank-out-of-section-timeout={cfg.heartbeat_timeout:g}",
            # Restarts that never move the committed checkpoint forward stop the launcher.
            f"--ft-checkpoint-iteration-file={cfg.iteration_file}",
            f"--ft-max-no-progress-cycles={cfg.max_no_progress_cycles}",
        ]
    return [*argv, "--no-python", *command]


def launcher_env(cfg: LaunchConfig, env: Mapping[str, str], version: tuple[int, int] | None = None) -> dict[str, str]:
    version = version or nvrx_version()
    child = dict(env)
    if version >= (0, 6):
        child["RTJ_FT_SECTIONS"] = "1"  # train.py wraps setup/steps/saves in the sections above
        # The barrier rendezvous orders nodes by this infrastructure rank instead of host names.
        child["GROUP_RANK"] = str(cfg.node_rank)
    return child
