"""The worker on CPU: ft_launcher + RankMonitorClient + inprocess.Wrapper + async checkpoints.

Each fault kind must be recovered by the right layer, resume from the last checkpoint and end
with the same weights as a run without faults (batches depend only on seed, step and rank).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rtj_worker import entrypoint, exit_codes, local
from rtj_worker.entrypoint import ConfigError, LaunchConfig, launcher_argv, run
from rtj_worker.launch import NO_PROGRESS_LINE, training_command

STEPS = 60
HEARTBEAT = 15  # seconds; above the ~10 s an in-process restart takes on CPU with gloo


def launch(tmp: Path, *train_args: str, **env: str) -> local.LocalRun:
    return local.launch(tmp, ["--steps", str(STEPS), "--step-seconds", "0.05", *train_args], timeout=240,
                        heartbeat=HEARTBEAT, **env)


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> local.LocalRun:
    run_ = launch(tmp_path_factory.mktemp("clean"))
    assert run_.code == exit_codes.OK, run_.log[-3000:]
    assert run_.report == {"exitCode": 0, "reason": "training finished", "checkpointStep": STEPS}
    assert {e["pid"] for e in run_.starts()} == {e["pid"] for e in run_.timeline}
    return run_


@pytest.fixture(scope="module")
def clean_run(clean) -> dict:
    return clean.result()


def test_each_rank_writes_only_its_own_shard(clean):
    step = clean.workdir / "ckpt" / f"step-{STEPS:09d}"
    files = {p.name: p.stat().st_size for p in step.iterdir()}
    assert set(files) == {"__0_0.distcp", "__1_0.distcp", ".metadata", "COMPLETE"}
    # FSDP2 shards every weight in two: each rank's file holds about half of the model and optimizer.
    assert 0.8 < files["__0_0.distcp"] / files["__1_0.distcp"] < 1.25
    assert json.loads((step / "COMPLETE").read_text())["world_size"] == 2


def test_sharded_checkpoint_resumes_on_another_world_size(clean, clean_run):
    """DCP reshards on load: two ranks' shards load into one rank (an elastic job on fewer nodes)."""
    import datetime
    import socket

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from rtj_worker.checkpoint import Checkpointer
    from rtj_worker.train import checksum, fresh, parse_args

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, world_size=1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        ckpt = Checkpointer(clean.workdir / "ckpt", 0, 1, use_async=False)
        ckpt.attach()
        model, opt = fresh(parse_args([]), torch.device("cpu"), 1)
        model_sd, optim_sd = get_state_dict(model, opt)
        state = {"model": model_sd, "optim": optim_sd}
        assert ckpt.load_latest(state) == STEPS
        set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
        assert checksum(model) == pytest.approx(clean_run["checksum"], rel=1e-12)
    finally:
        dist.destroy_process_group()


def test_exception_is_recovered_in_process(tmp_path, clean_run):
    run_ = launch(tmp_path, "--fault", "1:25:exc")
    assert run_.code == 0, run_.log[-3000:]
    first, second = run_.starts()[:2], run_.starts()[2:]
    # Same processes, next Wrapper iteration: no process was restarted.
    assert {e["pid"] for e in first} == {e["pid"] for e in second}
    assert [e["iteration"] for e in second] == [1, 1]
    assert {e["step"] for e in second} == {20}  # the newest complete checkpoint before step 25
    assert run_.result() == clean_run


def test_in_process_restart_before_the_first_checkpoint_starts_from_the_initial_weights(tmp_path, clean_run):
    run_ = launch(tmp_path, "--fault", "1:5:exc")  # checkpoints every 10 steps: none exists yet
    assert run_.code == 0, run_.log[-3000:]
    second = run_.starts()[2:]
    assert [e["iteration"] for e in second] == [1, 1] and {e["step"] for e in second} == {0}
    assert run_.result() == clean_run  # not the weights trained during steps 0-4 again from step 0


def test_exception_while_a_save_is_in_flight_resumes_from_the_last_committed_step(tmp_path, clean_run):
    """Step 30's save is still being written when rank 1 fails: it is never committed, and no rank
    waits for its writer (blocked in a collective with the failed peer) before the next iteration."""
    run_ = launch(tmp_path, "--fault", "1:30:exc")
    assert run_.code == 0, run_.log[-3000:]
    second = run_.starts()[2:]
    assert [e["iteration"] for e in second] == [1, 1] and {e["step"] for e in second} == {20}
    assert run_.result() == clean_run


def test_sigkill_is_recovered_by_ft_launcher_respawn(tmp_path, clean_run):
    run_ = launch(tmp_path, "--fault", "1:25:sigkill")
    assert run_.code == 0, run_.log[-3000:]
    first, second = run_.starts()[:2], run_.starts()[2:]
    assert len(second) == 2 and not {e["pid"] for e in first} & {e["pid"] for e in second}
    assert {e["step"] for e in second} == {20}
    assert "will restart worker group" in run_.log  # the launcher of this pod did it, no new pod
    assert run_.result() == clean_run


def test_hang_is_detected_by_heartbeat_timeout_then_respawned(tmp_path, clean_run):
    run_ = launch(tmp_path, "--fault", "0:25:hang")
    assert run_.code == 0, run_.log[-3000:]
    fault = next(e for e in run_.timeline if e["event"] == "fault")
    second = run_.starts()[2:]
    assert len(second) == 2 and fault["pid"] not in {e["pid"] for e in second}
    assert min(e["t"] for e in second) - fault["t"] >= HEARTBEAT
    assert "Did not get subsequent heartbeat" in run_.log
    assert run_.result() == clean_run


def test_spent_launcher_budget_exits_with_a_clear_code(tmp_path):
    run_ = launch(tmp_path, "--fault", "1:15:sigkill", "--fault", "0:35:sigkill", RTJ_FT_MAX_RESTARTS="1")
    assert run_.code == exit_codes.LAUNCHER_BUDGET_EXHAUSTED
    assert run_.report["exitCode"] == exit_codes.LAUNCHER_BUDGET_EXHAUSTED
    assert "spending its 1 restarts" in run_.report["reason"]
    assert run_.report["checkpointStep"] == 30


def test_permanent_failure_stops_without_spending_restarts(tmp_path):
    run_ = launch(tmp_path, "--fault", "1:25:nan")
    assert run_.code == exit_codes.PERMANENT_FAILURE
    assert run_.report["reason"] == "loss is nan at step 25" and run_.report["checkpointStep"] == 20
    assert len(run_.starts()) == 2  # no restart of any kind


@pytest.mark.parametrize("env, fragment", [
    ({}, "NNODES is not set"),
    ({"NNODES": "2"}, "NODE_RANK is not set"),
    ({"NODE_RANK": "x", "NNODES": "2", "RTJ_RDZV_ENDPOINT": "h:1"}, "bad numeric setting"),
    ({"NODE_RANK": "0", "NNODES": "2", "RTJ_RDZV_ENDPOINT": "h"}, "must be host:port"),
    ({"NODE_RANK": "0", "NNODES": "2", "RTJ_RDZV_ENDPOINT": "h:1", "RTJ_FT_HEARTBEAT_TIMEOUT": "5"},
     "must exceed RTJ_FT_MONITOR_INTERVAL"),
])
def test_config_errors_exit_as_permanent(tmp_path, env, fragment):
    with pytest.raises(ConfigError, match=fragment):
        LaunchConfig.from_env(env)
    code = run(["python", "x.py"], {**env, "RTJ_TERMINATION_LOG": str(tmp_path / "t")})
    assert code == exit_codes.CONFIG_ERROR
    assert fragment in json.loads((tmp_path / "t").read_text())["reason"]


def test_unresolvable_peer_dns_times_out_as_rendezvous_failure(tmp_path):
    env = {"NODE_RANK": "1", "NNODES": "2", "RTJ_RDZV_ENDPOINT": "train-0.train.nowhere.invalid:29400",
           "RTJ_RDZV_TIMEOUT": "1", "RTJ_TERMINATION_LOG": str(tmp_path / "t")}
    assert run(["python", "-c", "pass"], env) == exit_codes.RENDEZVOUS_FAILED
    assert "did not resolve within 1s" in json.loads((tmp_path / "t").read_text())["reason"]


OPERATOR_ENV = {
    "RTJ_NNODES": "6:8", "NPROC_PER_NODE": "8", "NODE_RANK": "3", "RTJ_RDZV_ENDPOINT": "j-0.j.ns.svc:29400",
    "RTJ_RDZV_ID": "uid-2", "RTJ_FT_MAX_RESTARTS": "4", "RTJ_FT_HEARTBEAT_TIMEOUT": "900",
    "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT": "1200", "RTJ_FT_MONITOR_INTERVAL": "5", "RTJ_CHECKPOINT_DIR": "/ckpt/j",
    "RTJ_FT_MAX_NO_PROGRESS_CYCLES": "3"}
COMMON_FLAGS = [
    "--nnodes=6:8", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=j-0.j.ns.svc:29400",
    "--rdzv-id=uid-2", "--rdzv-conf=is_host=0,join_timeout=600", "--max-restarts=4", "--monitor-interval=5",
    "--ft-rank-heartbeat-timeout=900", "--ft-initial-rank-heartbeat-timeout=1200",
    "--ft-workload-check-interval=5", "--ft-enable-nic-monitor=False"]


@pytest.mark.parametrize("version, extra", [
    ((0, 4), []),
    ((0, 6), ["--ft-rdzv-impl=barrier", "--ft-rank-section-timeouts=setup:1200,step:900,checkpointing:900",
              "--ft-rank-out-of-section-timeout=900",
              "--ft-checkpoint-iteration-file=/ckpt/j/latest_checkpointed_iteration.txt",
              "--ft-max-no-progress-cycles=3"]),
], ids=["nvrx-0.4", "nvrx-0.6"])
def test_launcher_flags_follow_the_operator_env_and_the_nvrx_version(version, extra):
    cfg = LaunchConfig.from_env(OPERATOR_ENV)
    argv = launcher_argv(cfg, ["/bin/train", "--steps", "9"], version)
    assert argv[:3] == [sys.executable, "-m", "nvidia_resiliency_ext.fault_tolerance.launcher"]
    assert argv[3:] == [*COMMON_FLAGS, *extra, "--no-python", "/bin/train", "--steps", "9"]
    child = entrypoint.launcher_env(cfg, {}, version)
    assert child == ({} if version < (0, 6) else {"RTJ_FT_SECTIONS": "1", "GROUP_RANK": "3"})


def test_user_arguments_never_become_launcher_flags():
    """Every token of the user's command reaches the script, none is parsed by ft_launcher."""
    from nvidia_resiliency_ext.fault_tolerance.launcher import get_args_parser

    user = ["python", "-u", "-m", "rtj_worker.train", "--max-restarts", "99", "--rdzv-endpoint=evil:1"]
    cfg = LaunchConfig.from_env(OPERATOR_ENV)
    args = get_args_parser().parse_args(launcher_argv(cfg, training_command(user))[3:])
    assert args.max_restarts == 4 and args.rdzv_endpoint == "j-0.j.ns.svc:29400" and args.no_python
    assert [args.training_script, *args.training_script_args] == [sys.executable, *user[1:]]


@pytest.mark.parametrize("command, fragment", [
    (["python", "no_such_train.py"], "training script 'no_such_train.py' not found"),
    (["python", "-u", "-m", "no_such_module.train"], "training module 'no_such_module.train' not found"),
    (["/no/such/trainer"], "training command '/no/such/trainer' not found"),
    (["python", "-u"], "names no script or module"),
])
def test_a_missing_script_is_a_configuration_error(tmp_path, command, fragment):
    env = {**local.local_env(tmp_path), "RTJ_TERMINATION_LOG": str(tmp_path / "t")}
    assert run(command, env) == exit_codes.CONFIG_ERROR
    assert fragment in json.loads((tmp_path / "t").read_text())["reason"]


def test_a_user_script_failing_after_start_is_not_a_rendezvous_failure(tmp_path):
    env = {**local.local_env(tmp_path, ranks=1), "RTJ_FT_MAX_RESTARTS": "0"}
    code = run(["python", "-c", "import time; time.sleep(1); raise SystemExit(3)"], env)
    assert code == exit_codes.LAUNCHER_BUDGET_EXHAUSTED
    assert "after spending its 0 restarts" in json.loads((tmp_path / "termination-log").read_text())["reason"]


# A stand-in for ft_launcher: prints a line, optionally runs the training command, exits 1.
FAKE_LAUNCHER = ("import subprocess, sys; print(sys.argv[1], flush=True); "
                 "sys.argv[2:] and subprocess.run(sys.argv[2:]); sys.exit(1)")


@pytest.mark.parametrize("line, runs_ranks, code", [
    ("rendezvous timed out", False, exit_codes.RENDEZVOUS_FAILED),
    ("a rank failed", True, exit_codes.LAUNCHER_BUDGET_EXHAUSTED),
    ("Agent .run() raised exception, e=RendezvousConnectionError('The connection to the C10d store has failed.')",
     True, exit_codes.RENDEZVOUS_HOST_LOST),
    (f"[default] {NO_PROGRESS_LINE}. No more restarts will be attempted.", True, exit_codes.PERMANENT_FAILURE),
])
def test_the_launchers_outcome_is_classified_on_the_launcher_side(tmp_path, monkeypatch, line, runs_ranks, code):
    monkeypatch.setattr(entrypoint, "launcher_argv", lambda cfg, command: [
        sys.executable, "-c", FAKE_LAUNCHER, line, *(command if runs_ranks else [])])
    # Node 1: node 0 hosts the store itself, so only other nodes can lose it.
    env = {**local.local_env(tmp_path), "RTJ_TERMINATION_LOG": str(tmp_path / "t"), "NODE_RANK": "1"}
    assert run(["python", "-c", "import time; time.sleep(0.5)"], env) == code


def test_ranks_follow_numeric_node_ranks_not_host_names():
    """c10d orders nodes by host name: "train-10" comes before "train-2"."""
    import torch.distributed as dist

    from rtj_worker.ranks import numeric_rank

    nodes, procs = 12, 2
    by_hostname = sorted(range(nodes), key=lambda n: f"train-{n}.train")  # 0, 1, 10, 11, 2, ...
    launcher = {(node, lr): i * procs + lr for i, node in enumerate(by_hostname) for lr in range(procs)}
    store = dist.HashStore()
    for (node, lr), rank in launcher.items():
        store.set(f"g/{rank}", f"{node}:{lr}")
    got = {pair: numeric_rank(store, rank, nodes * procs, *pair, prefix="g") for pair, rank in launcher.items()}
    assert got == {(node, lr): node * procs + lr for node, lr in launcher}


def test_the_fault_counter_charges_only_the_rank_that_failed():
    import types

    import torch.distributed as dist
    from nvidia_resiliency_ext.inprocess.health_check import FaultCounterExceeded

    from rtj_worker.train import RankFaultCounter

    counter = RankFaultCounter(max_rank_faults=1)
    peer_errors = [RuntimeError("[gloo/transport/tcp/unbound_buffer.cc:129] Timed out waiting 10000ms for send"),
                   RuntimeError("[gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.2]:1234"),
                   dist.DistBackendError("NCCL communicator was aborted on rank 3")]
    for exc in [*peer_errors, *peer_errors]:
        counter(types.SimpleNamespace(fn_exception=exc))  # a healthy rank, five times over: not charged
    counter(types.SimpleNamespace(fn_exception=ValueError("my own bug")))
    with pytest.raises(FaultCounterExceeded):
        counter(types.SimpleNamespace(fn_exception=ValueError("my own bug again")))


def test_the_rendezvous_port_leaves_room_for_the_derived_ports():
    with pytest.raises(ConfigError, match="port\\+1 and port\\+2"):
        LaunchConfig.from_env({**OPERATOR_ENV, "RTJ_RDZV_ENDPOINT": "h:65534"})


def test_rtj_worker_help_exits_zero():
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "rtj_worker.entrypoint", "--help"], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0
    assert "rtj-worker -- python -m rtj_worker.train" in result.stdout


def _rank_monitor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A real NVRx rank monitor server, configured as rtj_worker.launch configures ft_launcher for the
    installed NVRx (heartbeats with 0.4, sections with 0.6), and this process as rank 0 of it."""
    import multiprocessing

    from nvidia_resiliency_ext.fault_tolerance.config import FaultToleranceConfig
    from nvidia_resiliency_ext.fault_tolerance.rank_monitor_server import RankMonitorServer

    from rtj_worker.launch import nvrx_version

    cfg = FaultToleranceConfig(initial_rank_heartbeat_timeout=600, rank_heartbeat_timeout=600,
                               workload_check_interval=1)
    if sections := nvrx_version() >= (0, 6):
        cfg.rank_section_timeouts = {"setup": 600, "step": 600, "checkpointing": 600}
        cfg.rank_out_of_section_timeout = 600
    socket_path = str(tmp_path / "rmon.socket")
    for name, value in {"FT_RANK_MONITOR_IPC_SOCKET": socket_path, "RANK": "0", "LOCAL_RANK": "0",
                        "WORLD_SIZE": "1", "RTJ_FT_SECTIONS": "1" if sections else "0"}.items():
        monkeypatch.setenv(name, value)
    server = RankMonitorServer.run_in_subprocess(cfg, socket_path, mp_ctx=multiprocessing.get_context("fork"))
    return server


def test_a_worker_restart_during_an_in_process_restart_leaves_the_rank_monitor_usable(tmp_path, monkeypatch):
    """The race between the two layers, at the rank monitor: a rank reconnects for a new in-process
    iteration, and ft_launcher ends that connection (it restarts the workers because another node
    started a new round) before the rank said anything. The respawned worker's heartbeats must still
    be accepted; NVRx's monitor refuses them for good once it has seen two connection losses in a row
    without a message between them (its state ABORTED), so the rank speaks as soon as it connects."""
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    from rtj_worker.train import Sections

    server = _rank_monitor(tmp_path, monkeypatch)
    try:
        worker = RankMonitorClient()
        section = Sections(worker)
        section.connect()
        with section.setup():
            pass
        worker.send_heartbeat()  # training
        section.connect()  # an in-process restart: a new iteration reconnects...
        worker.rank_monitor_socket.close()  # ...and the launcher kills the worker before setup ends
        respawned = RankMonitorClient()
        section = Sections(respawned)
        section.connect()
        with section.setup():
            pass
        for _ in range(3):  # refused (RankMonitorClientError) when the monitor is ABORTED; NVRx 0.6 does
            respawned.send_heartbeat()  # not wait for replies: its monitor closes the connection instead
            time.sleep(0.3)
        respawned.shutdown_workload_monitoring()
    finally:
        server.terminate()
        server.join(10)


def test_local_rendezvous_ports_are_free_and_below_the_ephemeral_range():
    """CI once failed with EADDRINUSE on port + 1: the port was picked from the ephemeral range, where
    the kernel gives the local control plane's outgoing connections their ports."""
    import socket

    from rtj_worker import ranks

    base = local.free_port()
    assert base + ranks.WRAPPER_STORE_OFFSET < local._ephemeral_low()
    for port in range(base, base + ranks.WRAPPER_STORE_OFFSET + 1):
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
