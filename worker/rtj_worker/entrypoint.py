"""`rtj-worker -- python -m rtj_worker.train ...`: what each pod of a ResilientTrainingJob runs.

Reads the environment the operator sets (builders/job.py), waits (bounded) until node 0's DNS
name resolves, then runs ft_launcher with the matching flags. Signals are passed through. The
exit code and /dev/termination-log tell the operator what happened (rtj_worker.exit_codes):

- 0: training finished;
- 64 CONFIG_ERROR / 65 PERMANENT_FAILURE: no restart can help (fails the RTJ fast);
- 70 LAUNCHER_BUDGET_EXHAUSTED: ranks kept failing and ft_launcher spent its restarts here;
- 71 RENDEZVOUS_FAILED: peers never resolved or never joined (the operator restarts the gang).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from . import exit_codes
from .checkpoint import complete_steps

log = logging.getLogger("rtj_worker.entrypoint")
TERMINATION_LOG = "/dev/termination-log"


class ConfigError(Exception):
    pass


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

    @classmethod
    def from_env(cls, env: dict[str, str]) -> LaunchConfig:
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
                max_restarts=int(env.get("RTJ_FT_MAX_RESTARTS", "3")),
                heartbeat_timeout=float(env.get("RTJ_FT_HEARTBEAT_TIMEOUT", "900")),
                initial_heartbeat_timeout=float(env.get("RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT", "1200")),
                monitor_interval=float(env.get("RTJ_FT_MONITOR_INTERVAL", "5")),
                checkpoint_dir=env.get("RTJ_CHECKPOINT_DIR", "/checkpoints"),
            )
        except ValueError as exc:
            raise ConfigError(f"bad numeric setting: {exc}") from None
        if ":" not in cfg.rdzv_endpoint:
            raise ConfigError(f"RTJ_RDZV_ENDPOINT must be host:port, got {cfg.rdzv_endpoint!r}")
        if cfg.heartbeat_timeout <= cfg.monitor_interval:
            raise ConfigError("RTJ_FT_HEARTBEAT_TIMEOUT must exceed RTJ_FT_MONITOR_INTERVAL")
        return cfg

    @property
    def rdzv_host(self) -> str:
        return self.rdzv_endpoint.rsplit(":", 1)[0]


def launcher_argv(cfg: LaunchConfig, command: list[str]) -> list[str]:
    """ft_launcher (NVRx 0.4.1 flag names) running `command` once per local rank."""
    if not command:
        raise ConfigError("no training command after '--'")
    argv = [
        shutil.which("ft_launcher") or str(Path(sys.executable).with_name("ft_launcher")),
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
        # The NIC monitor watches InfiniBand links; p5 uses EFA, and CPU runs have neither.
        "--ft-enable-nic-monitor=False",
    ]
    python = os.path.basename(command[0]).startswith("python")
    if python and len(command) > 2 and command[1] == "-m":
        return [*argv, "--module", command[2], *command[3:]]
    if python and len(command) > 1:
        return [*argv, *command[1:]]
    return [*argv, "--no-python", *command]


def wait_for_dns(host: str, timeout: float, interval: float = 2.0) -> bool:
    """Headless Service records appear only once pods exist: wait for node 0's name."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            socket.getaddrinfo(host, None)
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(interval)


def write_termination(code: int, reason: str, checkpoint_dir: str, path: str = TERMINATION_LOG) -> None:
    steps = complete_steps(Path(checkpoint_dir)) if Path(checkpoint_dir).is_dir() else []
    report = {"exitCode": code, "reason": reason, "checkpointStep": steps[0] if steps else 0}
    try:
        Path(path).write_text(json.dumps(report))
    except OSError:
        pass  # not in a pod
    log.info("exit %d: %s", code, reason)


def run(command: list[str], env: dict[str, str]) -> int:
    termination = env.get("RTJ_TERMINATION_LOG", TERMINATION_LOG)
    try:
        cfg = LaunchConfig.from_env(env)
        argv = launcher_argv(cfg, command)
    except ConfigError as exc:
        write_termination(exit_codes.CONFIG_ERROR, str(exc), env.get("RTJ_CHECKPOINT_DIR", "/checkpoints"),
                          termination)
        return exit_codes.CONFIG_ERROR
    if not wait_for_dns(cfg.rdzv_host, cfg.rdzv_timeout):
        write_termination(exit_codes.RENDEZVOUS_FAILED, f"{cfg.rdzv_host} did not resolve within "
                          f"{cfg.rdzv_timeout}s", cfg.checkpoint_dir, termination)
        return exit_codes.RENDEZVOUS_FAILED

    # Ranks leave markers here: 'started' once training runs, 'permanent' to stop for good.
    state_dir = Path(env.get("RTJ_STATE_DIR") or tempfile.mkdtemp(prefix="rtj-state-"))
    state_dir.mkdir(parents=True, exist_ok=True)
    child_env = {**env, "RTJ_STATE_DIR": str(state_dir)}
    log.info("starting: %s", " ".join(argv))
    proc = subprocess.Popen(argv, env=child_env, start_new_session=True)

    def forward(signum: int, _frame: object) -> None:
        # ft_launcher stops its workers and rank monitors on SIGTERM.
        proc.send_signal(signum)

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, forward)
    permanent = state_dir / "permanent"
    while proc.poll() is None:
        if permanent.exists():
            # Restarting would fail the same way: stop the launcher instead of spending its budget.
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            break
        time.sleep(0.5)
    code = proc.wait()
    if permanent.exists():
        write_termination(exit_codes.PERMANENT_FAILURE, permanent.read_text().strip() or "permanent failure",
                          cfg.checkpoint_dir, termination)
        return exit_codes.PERMANENT_FAILURE
    if code == 0:
        write_termination(exit_codes.OK, "training finished", cfg.checkpoint_dir, termination)
        return exit_codes.OK
    if not (state_dir / "started").exists():
        write_termination(exit_codes.RENDEZVOUS_FAILED, f"ft_launcher exited {code} before any rank started "
                          "training (rendezvous did not complete)", cfg.checkpoint_dir, termination)
        return exit_codes.RENDEZVOUS_FAILED
    write_termination(exit_codes.LAUNCHER_BUDGET_EXHAUSTED, f"ft_launcher exited {code} after spending its "
                      f"{cfg.max_restarts} restarts", cfg.checkpoint_dir, termination)
    return exit_codes.LAUNCHER_BUDGET_EXHAUSTED


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s rtj-worker %(levelname)s %(message)s")
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[args.index("--") + 1:] if "--" in args else args
    sys.exit(run(command, dict(os.environ)))


if __name__ == "__main__":
    main()
