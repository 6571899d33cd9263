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

from .crashloop import REPEATS

NVRX = "nvidia-resiliency-ext"
# What ft_launcher logs about itself (launcher_message() picks its own records out of the output it
# shares with the ranks: a rank's traceback may name the same exceptions).
# NVRx 0.6, when its progress tracker refuses further restarts (the launcher then exits 1).
NO_PROGRESS_LINE = "Progress tracker detected no progress across restarts"
# When the c10d store (node 0's launcher) stops answering: torch's error with 0.4.1 (and when the
# first connection fails); with 0.6 the store client's own error.
STORE_LOST_LINES = ("RendezvousConnectionError", "The connection to the C10d store has failed",
                    "Agent .run() raised exception, e=DistNetworkError(")
# A rendezvous round that did not complete within join_timeout (0.4.1 and 0.6 log the agent's exception so):
# after its ranks had run, this node's peers were lost and not replaced in time.
RENDEZVOUS_TIMEOUT_LINE = "Agent .run() raised exception, e=RendezvousTimeoutError("
# The rendezvous closed for good (NVRx 0.6's barrier: "Rendezvous cannot complete: N unhealthy nodes
# detected ... Permanently closing rendezvous"), as the launcher logs the agent's exception.
RENDEZVOUS_CLOSED_LINE = "Agent .run() raised exception, e=RendezvousClosedError("
# NVRx 0.7: another node's launcher spent its restarts and closed the rendezvous for a failure; a node that
# waited for the next round (a standby, or a survivor waiting for the failed node's restart) logs this and
# exits 1, where 0.6 exited 0 ("Rendezvous gracefully exited"): the gang stopped, the other node's pod is
# charged (launcher.py, FaultToleranceAgent.run's RendezvousGracefulExitError handler).
PEER_GAVE_UP_LINE = "Rendezvous closed because another launcher reported a terminal worker-group failure"
# A failed GPU/NIC health check or a rank's ExcludeThisNode request. NVRx logs "Agent .run() raised
# UnhealthyNodeException" and exits 0 when it catches it, but the rendezvous raises the class of
# the module nvidia_resiliency_ext.fault_tolerance.launcher while `-m` runs that file as __main__: the
# launcher then logs "raised exception, e=UnhealthyNodeException(" and exits 1 (0.4.1 and 0.6).
UNHEALTHY_LINE = "UnhealthyNodeException"
# This node's ranks all exited 0.
GROUP_FINISHED_LINE = "worker group successfully finished"
# The launcher's log records: 0.4.1 "[time] [LEVEL] [ft_launcher<pid>@host] msg" (the pid is the
# launcher's, or a process it forked), 0.6 "time [LEVEL] [host] [workload:.. infra:..] launcher.py:N msg".
_LAUNCHER_RECORD = (re.compile(r"^\[[^\]]+\] \[[A-Z]+\] \[ft_launcher(?P<pid>\d+)@[^\]]*\] (?P<msg>.*)"),
                    re.compile(r"^\S+ \S+ \[[A-Z]+\] \[[^\]]*\] \[workload:[^\]]*\] launcher\.py:\d+ (?P<msg>.*)"))
# Any record of the launcher's process tree (its elastic agent, torch's multiprocessing, the rank monitors),
# for the pod's report (rtj_worker.report): 0.4.1 "[time] [LEVEL] [ft_launcher<pid>@host] msg" and
# "[...] [RankMonServer<pid>@host:<local rank>] msg"; 0.6 "time [LEVEL] [host] [workload:..] <file>.py:N msg";
# torch's glog lines "E1203 15:36:39.362000 <pid> <file>.py:N] msg" of the launcher's own pid.
_NVRX_RECORD = (re.compile(r"^\[[^\]]+\] \[[A-Z]+\] \[(?:ft_launcher|RankMonServer)\d+@[^\]]*\] (?P<msg>.*)"),
                re.compile(r"^\S+ \S+ \[[A-Z]+\] \[[^\]]*\] \[workload:[^\]]*\] \S+\.py:\d+ (?P<msg>.*)"),
                re.compile(r"^[IWEF]\d{4} \S+ +(?P<pid>\d+) \S+\.py:\d+\] (?P<msg>.*)"))
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


def stop_bounds(grace_seconds: float) -> tuple[float, float, float]:
    """(rank_stop, term_timeout, hard_stop): seconds after a stop signal, from the pod's termination grace
    period (terminationGracePeriodSeconds; the kubelet SIGKILLs the pod when it ends). The ranks save
    and exit by rank_stop, ft_launcher SIGKILLs the ones left at term_timeout (its default is 1800 s),
    and the entrypoint kills what is left and reports at hard_stop. The operator reads rank_stop too:
    a stop-save must fit in it (policies/phase.warn_stop_grace)."""
    term = max(2.0, grace_seconds - 20)
    return max(1.0, term - 10), term, max(term + 1, grace_seconds - 10)


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
    grace_seconds: float = 120
    # The same failure, in a row, with no progress, that ends a crash loop (restartBudget's
    # maxRestartsWithoutProgress; at least 2: once may be bad luck).
    crash_loop_repeats: int = 2
    # The rendezvous and the ranks' stores are the coordinator pod's (every launcher a client), not node 0's.
    coordinator: bool = False

    # Bounds of a stop (stop_bounds).
    @property
    def term_timeout(self) -> float:
        return stop_bounds(self.grace_seconds)[1]

    @property
    def rank_stop_seconds(self) -> float:
        return stop_bounds(self.grace_seconds)[0]

    @property
    def hard_stop_seconds(self) -> float:
        return stop_bounds(self.grace_seconds)[2]

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
                crash_loop_repeats=max(2, int(env.get("RTJ_CRASH_LOOP_REPEATS", REPEATS))),
                uid=env.get("RTJ_UID", ""),
                grace_seconds=float(env.get("RTJ_GRACE_SECONDS", "120")),
                coordinator=env.get("RTJ_COORDINATOR") == "1",
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
    def spares(self) -> int:
        low, _, high = self.nnodes.partition(":")
        return int(high or low) - int(low)

    @property
    def hosts_store(self) -> bool:
        """Whether this node's launcher hosts the rendezvous store (and its ranks the ranks' stores)."""
        return self.node_rank == 0 and not self.coordinator

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


# ft_launcher as its console script runs it: imported, then main(). `python -m ...launcher` would run the
# module as __main__, a second copy beside the one its rendezvous imports, and its `except
# UnhealthyNodeException` (the class of the __main__ copy) would never match what the rendezvous raises:
# an unhealthy node's launcher then took the generic path, which shuts the rendezvous down for every
# node (NVRx 0.6.0's launch_agent), where the intended path leaves it open for the others.
LAUNCHER_MAIN = "import sys; from nvidia_resiliency_ext.fault_tolerance.launcher import main; sys.exit(main())"


def barrier_nnodes(nnodes: str) -> str:
    """--nnodes for NVRx >= 0.6's barrier rendezvous (the launchers' and nvrx-control's alike): MAX raised by
    MIN. The barrier counts the nodes that failed its health checks (or whose rank asked to exclude its node)
    over the rendezvous' whole life and closes it for good once they exceed MAX - MIN
    (ft_rendezvous_barrier.py, _get_unhealthy_count's caller), though the operator replaces each such node:
    with MAX = MIN + spares, the first unhealthy node of a job without spares ended its gang. The headroom
    lets an attempt outlive as many unhealthy nodes as it trains on (each replaced, and charged as a
    disruption); more than that is one gang restart (exit 78), whose new rendezvous id counts afresh. MAX
    changes nothing else that matters here: the barrier trains on MIN nodes, keeps the others standing by,
    and closes a round once MIN have joined (0.7 may wait up to its last_call_timeout, 1 s, for a returning
    active node); in 0.6.0 it also bounds who may join a round, so the headroom absorbs the slot a launcher
    killed mid-round leaves behind."""
    low, _, high = nnodes.partition(":")
    return f"{low}:{int(high or low) + int(low)}"


def launcher_argv(cfg: LaunchConfig, command: list[str], version: tuple[int, int] | None = None) -> list[str]:
    """ft_launcher flags for `version`, then `--no-python` and the user's command: every token of the
    command lands in ft_launcher's positional training script and its REMAINDER arguments, so a
    user's `--max-restarts` or `--rdzv-endpoint` reaches the script, never the launcher."""
    version = version or nvrx_version()
    if cfg.spares and version < (0, 6):
        raise ConfigError(f"nodes.spares ({cfg.spares}) needs NVRx 0.6 in the image (its barrier rendezvous keeps "
                          f"spares waiting); this image has {'.'.join(map(str, version))}, whose rendezvous would "
                          "train on every node that joins")
    argv = [
        sys.executable, "-c", LAUNCHER_MAIN,
        # NVRx 0.4.1's c10d rendezvous is elastic between MIN and MAX: it gets exactly the operator's range.
        f"--nnodes={barrier_nnodes(cfg.nnodes) if version >= (0, 6) else cfg.nnodes}",
        f"--nproc-per-node={cfg.nproc_per_node}",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint={cfg.rdzv_endpoint}",
        f"--rdzv-id={cfg.rdzv_id}",
        # Who hosts the c10d store (node 0, or none: the coordinator does); named, so that no hostname
        # matching in pods decides it.
        f"--rdzv-conf=is_host={1 if cfg.hosts_store else 0},join_timeout={cfg.rdzv_timeout}",
        f"--max-restarts={cfg.max_restarts}",
        f"--monitor-interval={cfg.monitor_interval:g}",
        f"--ft-rank-heartbeat-timeout={cfg.heartbeat_timeout:g}",
        f"--ft-initial-rank-heartbeat-timeout={cfg.initial_heartbeat_timeout:g}",
        f"--ft-workload-check-interval={cfg.monitor_interval:g}",
        # The NIC monitor watches InfiniBand link counters; p5 uses EFA, and CPU runs have neither.
        "--ft-enable-nic-monitor=False",
        # A forwarded SIGTERM: the ranks get until term_timeout to save and exit, then SIGKILL, before
        # the kubelet's SIGKILL at the end of the grace period. Stopping ranks for a restart: they
        # exit at once (rtj_worker.stop), so this only bounds it, below term_timeout too.
        f"--term-timeout={cfg.term_timeout:g}",
        f"--workers-stop-timeout={min(15.0, cfg.term_timeout):g}",
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


def launcher_message(line: str, launcher_pid: int) -> str | None:
    """The message of one of ft_launcher's own log records, None for anything else (a rank's output)."""
    for pattern in _LAUNCHER_RECORD:
        match = pattern.match(line)
        if match and match.groupdict().get("pid") in (None, str(launcher_pid)):
            return match.group("msg")
    return None


def nvrx_message(line: str, launcher_pid: int) -> str | None:
    """The message of a record of ft_launcher, its rank monitors or its torch agent; None for a rank's output."""
    for pattern in _NVRX_RECORD:
        match = pattern.match(line)
        if match and match.groupdict().get("pid") in (None, str(launcher_pid)):
            return match.group("msg")
    return None


def runs_reference_trainer(command: list[str]) -> bool:
    """Whether the command runs rtj_worker.train, which proves completion with a marker."""
    return any(arg in ("rtj_worker.train", "-mrtj_worker.train") for arg in command)


def launcher_env(cfg: LaunchConfig, env: Mapping[str, str], version: tuple[int, int] | None = None) -> dict[str, str]:
    version = version or nvrx_version()
    child = dict(env)
    if version >= (0, 6):
        child["RTJ_FT_SECTIONS"] = "1"  # train.py wraps setup/steps/saves in the sections above
        # The barrier rendezvous orders nodes by this infrastructure rank instead of host names.
        child["GROUP_RANK"] = str(cfg.node_rank)
    return child
