"""The worker on CPU: ft_launcher + RankMonitorClient + inprocess.Wrapper + async checkpoints.

Each fault kind must be recovered by the right layer, resume from the last checkpoint and end
with the same weights as a run without faults (batches depend only on seed, step and rank).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rtj_dev import slowfs
from rtj_worker import ckpt_index, entrypoint, exit_codes, local
from rtj_worker.crashloop import GROUP_FAILED
from rtj_worker.entrypoint import ConfigError, LaunchConfig, launcher_argv, run
from rtj_worker.launch import LAUNCHER_MAIN, NO_PROGRESS_LINE, PEER_GAVE_UP_LINE, nvrx_version, training_command
from rtj_worker.report import SELF_RESTART
from testkit import free_port, wait_until

STEPS = 60
HEARTBEAT = 15  # seconds; above the ~10 s an in-process restart takes on CPU with gloo


def launch(tmp: Path, *train_args: str, **env: str) -> local.LocalRun:
    return local.launch(tmp, ["--steps", str(STEPS), "--step-seconds", "0.05", *train_args], timeout=240,
                        heartbeat=HEARTBEAT, **env)


@pytest.fixture(scope="module")
def clean(tmp_path_factory) -> local.LocalRun:
    run_ = launch(tmp_path_factory.mktemp("clean"))
    assert run_.code == exit_codes.OK, run_.log[-3000:]
    assert {k: v for k, v in run_.report.items() if k != "progress"} == {
        "exitCode": 0, "reason": "training finished", "checkpointStep": STEPS}
    assert {e["pid"] for e in run_.starts()} == {e["pid"] for e in run_.timeline}
    return run_


@pytest.fixture(scope="module")
def clean_run(clean) -> dict:
    return clean.result()


@pytest.mark.nvrx041
def test_the_pod_reports_its_progress_and_no_recovery(clean):
    progress = clean.progress
    assert progress["state"] == "Finished" and progress["step"] == STEPS and progress["ckpt"] == STEPS
    assert progress["restarts"] == {"InProcess": 0, "Launcher": 0} and progress["leader"]
    assert 0 < progress["stepSeconds"] < 1 and progress["inLoopSeconds"] > STEPS * 0.05
    conditions = clean.conditions()
    assert conditions[0]["reason"] == "Waiting" and "Training" in [c["reason"] for c in conditions]
    assert len(conditions) < 10  # coalesced: not one per step


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

    import torch
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    from rtj_worker.checkpoint import Checkpointer
    from rtj_worker.train import checksum, fresh, parse_args

    port = free_port()
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


@pytest.mark.nvrx041
def test_exception_is_recovered_in_process(tmp_path, clean_run):
    run_ = launch(tmp_path, "--fault", "1:25:exc")
    assert run_.code == 0, run_.log[-3000:]
    first, second = run_.starts()[:2], run_.starts()[2:]
    # Same processes, next Wrapper iteration: no process was restarted.
    assert {e["pid"] for e in first} == {e["pid"] for e in second}
    assert [e["iteration"] for e in second] == [1, 1]
    assert {e["step"] for e in second} == {20}  # the newest complete checkpoint before step 25
    assert run_.result() == clean_run
    # The pod's report: one in-process recovery, caused by its rank 1, 5 steps rolled back.
    progress = run_.progress
    assert progress["restarts"] == {"InProcess": 1, "Launcher": 0}
    assert progress["causes"] == {"InProcess/InjectedFault": 1}
    last = progress["last"]
    assert last["tier"] == "InProcess" and last["rolledBack"] == 5 and 0 < last["seconds"] < 60


def test_with_copies_off_the_volume_each_tier_restores_from_its_own_copy_and_training_ends_the_same(tmp_path,
                                                                                                   clean_run):
    """Issue 31: an in-process restart restores from the ranks' memory, an ft_launcher respawn from the
    node's /dev/shm; neither reads the checkpoint volume, and the weights are a clean run's."""
    run_ = launch(tmp_path, "--fault", "1:25:exc", "--fault", "0:45:sigkill")
    assert run_.code == 0, run_.log[-3000:]
    starts = run_.starts()
    assert [(e["step"], e.get("source")) for e in starts] == [(0, None)] * 2 + [(20, "memory")] * 2 + [
        (40, "node")] * 2, starts
    assert run_.result() == clean_run
    progress = run_.progress
    assert progress["restarts"] == {"InProcess": 1, "Launcher": 1}
    assert progress["last"]["restoredFrom"] == "node" and progress["last"]["restoreSeconds"] >= 0
    copies = progress["copies"]
    assert copies["memoryBytes"] > 0 and copies["nodeBytes"] > 0 and copies["skipped"] == "", copies
    assert sorted(p.name for p in (tmp_path / "shm" / "local").iterdir()) == ["own-rank-0.pt", "own-rank-1.pt"]


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


@pytest.mark.nvrx041
def test_sigkill_is_recovered_by_ft_launcher_respawn(tmp_path, clean_run):
    run_ = launch(tmp_path, "--fault", "1:25:sigkill", RTJ_STATE_COPIES="0")  # copies off: from the volume
    assert run_.code == 0, run_.log[-3000:]
    first, second = run_.starts()[:2], run_.starts()[2:]
    assert len(second) == 2 and not {e["pid"] for e in first} & {e["pid"] for e in second}
    assert {e["step"] for e in second} == {20} and {e["source"] for e in second} == {"volume"}
    assert not (tmp_path / "shm").exists()
    assert "will restart worker group" in run_.log  # the launcher of this pod did it, no new pod
    assert run_.result() == clean_run
    progress = run_.progress
    assert progress["restarts"] == {"InProcess": 0, "Launcher": 1}
    assert progress["causes"] == {"Launcher/RankKilled": 1}
    assert progress["last"]["rolledBack"] == 5 and "killed by SIGKILL" in progress["last"]["detail"]


@pytest.mark.nvrx041
def test_hang_is_detected_by_heartbeat_timeout_then_respawned(tmp_path, clean_run):
    run_ = launch(tmp_path, "--fault", "0:25:hang")
    assert run_.code == 0, run_.log[-3000:]
    fault = next(e for e in run_.timeline if e["event"] == "fault")
    second = run_.starts()[2:]
    assert len(second) == 2 and fault["pid"] not in {e["pid"] for e in second}
    assert min(e["t"] for e in second) - fault["t"] >= HEARTBEAT
    assert "Did not get subsequent heartbeat" in run_.log
    assert run_.result() == clean_run
    progress = run_.progress
    assert progress["restarts"]["Launcher"] == 1 and progress["causes"] == {"Launcher/RankHung": 1}
    assert progress["last"]["seconds"] >= HEARTBEAT and progress["last"]["rolledBack"] == 5


LLAMA = ["--model", "llama", "--model-dim", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--vocab", "256",
         "--seq-len", "32", "--batch", "4"]


# The examples' settings (issue 27.4): bf16 compute, activation checkpointing, meta-device init.
AT_SCALE = ["--precision", "bf16", "--activation-checkpointing", "--init", "meta"]


@pytest.mark.parametrize("settings", [[], AT_SCALE], ids=["fp32", "bf16-recompute-meta"])
def test_llama_recovers_an_exception_and_a_sigkill_with_the_weights_of_a_clean_run(tmp_path, settings):
    """The transformer (FSDP2 unit per block, GQA, float32 loss): an exception in process (same pids,
    iteration 1, from step 20), then a SIGKILL by ft_launcher (new pids, from step 40); the final
    weights are those of a fault-free run. Also as the examples train at scale."""
    import math

    clean = launch(tmp_path / "clean", *LLAMA, *settings)
    assert clean.code == 0, clean.log[-3000:]
    run_ = launch(tmp_path / "faults", *LLAMA, *settings, "--fault", "1:25:exc", "--fault", "0:45:sigkill")
    assert run_.code == 0, run_.log[-3000:]
    starts = run_.starts()
    assert {e["model"] for e in starts} == {"llama"}
    assert [(e["iteration"], e["step"]) for e in starts] == [(0, 0)] * 2 + [(1, 20)] * 2 + [(0, 40)] * 2
    first, in_process, respawned = ({e["pid"] for e in starts[i:i + 2]} for i in (0, 2, 4))
    assert first == in_process and not first & respawned
    assert run_.result() == clean.result()
    assert clean.result()["loss"] < math.log(256) - 1  # it learns the sequences


def test_the_process_writer_recovers_both_layers_with_the_weights_of_a_clean_run(tmp_path, clean_run):
    """RTJ_CHECKPOINT_WRITER=process: a writer process per rank, killed at the in-process restart and
    spawned again for the next world; the respawned ranks spawn their own. Its first save after each
    start also spawns it (seconds), so saves due meanwhile are skipped: where each restart resumes
    depends on timing, the final weights do not."""
    run_ = launch(tmp_path, "--fault", "1:25:exc", "--fault", "0:45:sigkill", RTJ_CHECKPOINT_WRITER="process")
    assert run_.code == 0, run_.log[-3000:]
    starts = run_.starts()
    assert [e["iteration"] for e in starts] == [0, 0, 1, 1, 0, 0]
    assert {e["pid"] for e in starts[:2]} == {e["pid"] for e in starts[2:4]}
    assert not {e["pid"] for e in starts[:2]} & {e["pid"] for e in starts[4:]}
    assert {e["step"] for e in starts[2:4]} <= {0, 10, 20} and {e["step"] for e in starts[4:]} <= {0, 10, 20, 30, 40}
    spawned = [e for e in run_.timeline if e["event"] == "writer_process_spawned"]
    assert {e["rank"] for e in spawned} == {0, 1}  # at the first save of a start (seconds here: saves skipped)
    assert ckpt_index.complete_steps(tmp_path / "ckpt")[0] == STEPS
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


def test_unresolvable_rendezvous_host_exits_as_such(tmp_path):
    env = {"NODE_RANK": "1", "NNODES": "2", "RTJ_RDZV_ENDPOINT": "train-0.train.nowhere.invalid:29400",
           "RTJ_RDZV_TIMEOUT": "1", "RTJ_TERMINATION_LOG": str(tmp_path / "t")}
    assert run(["python", "-c", "pass"], env) == exit_codes.RENDEZVOUS_HOST_UNRESOLVED
    assert "did not resolve within 1s" in json.loads((tmp_path / "t").read_text())["reason"]


OPERATOR_ENV = {
    "RTJ_NNODES": "8", "NPROC_PER_NODE": "8", "NODE_RANK": "3", "RTJ_RDZV_ENDPOINT": "j-0.j.ns.svc:29400",
    "RTJ_RDZV_ID": "uid-2", "RTJ_FT_MAX_RESTARTS": "4", "RTJ_FT_HEARTBEAT_TIMEOUT": "900",
    "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT": "1200", "RTJ_FT_MONITOR_INTERVAL": "5", "RTJ_CHECKPOINT_DIR": "/ckpt/j",
    "RTJ_FT_MAX_NO_PROGRESS_CYCLES": "3"}
COMMON_FLAGS = [
    "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=j-0.j.ns.svc:29400",
    "--rdzv-id=uid-2", "--rdzv-conf=is_host=0,join_timeout=600", "--max-restarts=4", "--monitor-interval=5",
    "--ft-rank-heartbeat-timeout=900", "--ft-initial-rank-heartbeat-timeout=1200",
    "--ft-workload-check-interval=5", "--ft-enable-nic-monitor=False", "--term-timeout=100",
    "--workers-stop-timeout=15"]


@pytest.mark.parametrize("version, nnodes, extra", [
    ((0, 4), "8", []),
    # The barrier's MAX has room for as many replaced unhealthy nodes as the job trains on (barrier_nnodes).
    ((0, 6), "8:16", ["--ft-rdzv-impl=barrier", "--ft-rank-section-timeouts=setup:1200,step:900,checkpointing:900",
              "--ft-rank-out-of-section-timeout=900",
              "--ft-checkpoint-iteration-file=/ckpt/j/latest_checkpointed_iteration.txt",
              "--ft-max-no-progress-cycles=3"]),
], ids=["nvrx-0.4", "nvrx-0.6"])
def test_launcher_flags_follow_the_operator_env_and_the_nvrx_version(version, nnodes, extra):
    cfg = LaunchConfig.from_env(OPERATOR_ENV)
    argv = launcher_argv(cfg, ["/bin/train", "--steps", "9"], version)
    assert argv[:3] == [sys.executable, "-c", LAUNCHER_MAIN]
    assert argv[3:] == [f"--nnodes={nnodes}", *COMMON_FLAGS, *extra, "--no-python", "/bin/train", "--steps", "9"]
    child = entrypoint.launcher_env(cfg, {}, version)
    assert child == ({} if version < (0, 6) else {"RTJ_FT_SECTIONS": "1", "GROUP_RANK": "3"})


def test_spares_widen_the_node_range_only_where_the_barrier_keeps_them_standing_by():
    """nodes.spares=2 of 6 reaches ft_launcher as --nnodes=6:8 on 0.6; 0.4's rendezvous would train on all 8,
    so the entrypoint refuses it as a configuration error instead of silently changing the world size."""
    cfg = LaunchConfig.from_env({**OPERATOR_ENV, "RTJ_NNODES": "6:8"})
    assert cfg.spares == 2
    # The barrier's MAX also gets MIN more: room for the unhealthy nodes the operator replaces (barrier_nnodes).
    assert "--nnodes=6:14" in launcher_argv(cfg, ["/bin/train"], (0, 6))
    with pytest.raises(ConfigError, match=r"needs NVRx 0\.6"):
        launcher_argv(cfg, ["/bin/train"], (0, 4))


@pytest.mark.parametrize("grace, term, workers_stop", [("120", 100, 15), ("45", 25, 15), ("30", 10, 10)])
def test_stop_timeouts_fit_in_the_pods_grace_period(grace, term, workers_stop):
    """ft_launcher's own --term-timeout is 1800 s: the kubelet would SIGKILL the pod (grace period
    120 s) long before the ranks were stopped."""
    cfg = LaunchConfig.from_env({**OPERATOR_ENV, "RTJ_GRACE_SECONDS": grace})
    argv = launcher_argv(cfg, ["/bin/train"], (0, 6))
    assert f"--term-timeout={term}" in argv and f"--workers-stop-timeout={workers_stop}" in argv
    assert cfg.rank_stop_seconds < cfg.term_timeout < cfg.hard_stop_seconds < float(grace)


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


def test_the_entrypoint_records_its_gang_attempt_before_the_launcher_starts(tmp_path):
    """The attempt fence (ckpt_index): from a pod's start, ranks of older attempts commit nothing."""
    env = {**local.local_env(tmp_path, ranks=1), "RTJ_FT_MAX_RESTARTS": "0", "RTJ_ATTEMPT": "3", "RTJ_UID": "u1"}
    from rtj_worker import ckpt_index
    ckpt_index.claim_attempt(tmp_path / "ckpt", "u1", 2)
    assert run(["python", "-c", "raise SystemExit(3)"], env) == exit_codes.LAUNCHER_BUDGET_EXHAUSTED
    assert ckpt_index.recorded_attempt(tmp_path / "ckpt", "u1") == 3


def test_a_users_megatron_style_script_reports_its_checkpoint_step(tmp_path):
    """Issue 28: a script the project does not own (plain DDP, NVRx's heartbeat API, Megatron-style
    checkpoints) shows its newest checkpoint step from latest_checkpointed_iteration.txt, live and at exit,
    where the pod's report used to say 0."""
    script = Path(__file__).parent / "user_scripts" / "megatron_style.py"
    run_ = local.start(tmp_path, ["--iters", "40"], command=["python", str(script)]).wait(240)
    assert run_.code == exit_codes.OK, run_.log[-3000:]
    assert run_.report["checkpointStep"] == 40 and run_.progress["ckpt"] == 40, run_.report
    assert (tmp_path / "ckpt" / "iter_0000040" / "mp_rank_01.pt").exists()


RANK_CAUSES = {"Launcher/RankExited", "Launcher/RankKilled"}


def respawns_in(log: str) -> int:
    """How many times the pod's ft_launcher restarted its worker group, by the launcher's own records: what
    the pod's report must count, whatever torch did in between."""
    return len(SELF_RESTART.findall(log))

@pytest.mark.nvrx041
def test_a_plain_ddp_script_is_respawned_and_its_launcher_restart_shows(tmp_path):
    """Issue 28: a script with nothing but PyTorch (no rtj_worker.progress, no NVRx): ft_launcher respawns it
    past its bug and it resumes from its own torch.save checkpoint; its restart is counted and named from
    the launcher's records, where the pod's report used to stay `recovering` with LAUNCHER 0."""
    script = Path(__file__).parent / "user_scripts" / "plain_ddp.py"
    run_ = local.start(tmp_path, [], command=["python", str(script), "--steps", "30", "--crash-at", "12"]).wait(240)
    assert run_.code == exit_codes.OK, run_.log[-3000:]
    progress = run_.report["progress"]
    respawns = respawns_in(run_.log)  # 1; 2 where the respawned gloo group aborted in its setup (loaded machine)
    assert respawns >= 1 and progress["restarts"] == {"InProcess": 0, "Launcher": respawns}, progress
    assert "recovering" not in progress, progress
    # Each named from the launcher's record of the exit: rank 1's own (3), or rank 0's, whose collective lost
    # rank 1 (1, or SIGABRT where gloo aborts).
    assert sum(progress["causes"].values()) == respawns and set(progress["causes"]) <= RANK_CAUSES, progress
    assert "rolledBack" not in progress["last"]  # its steps are its own: none is claimed
    resumed = (tmp_path / "ckpt" / "plain" / "resumed-from").read_text().split()
    assert resumed[:2] == ["0", "10"] and len(resumed) == respawns + 1, resumed


def test_a_script_with_the_progress_library_shows_its_steps_and_what_a_restart_rolled_back(tmp_path):
    """Issue 28: the level between a plain script and the reference trainer: a plain DDP script that reports
    with rtj_worker.progress.for_this_rank only. Its pod shows STEP and CKPT-STEP, and its launcher restart
    is counted at its next run's first step, with the steps it rolled back (what a plain script cannot
    show)."""
    script = Path(__file__).parent / "user_scripts" / "with_progress.py"
    run_ = local.start(tmp_path, [], command=["python", str(script), "--steps", "30", "--crash-at", "12"]).wait(240)
    assert run_.code == exit_codes.OK, run_.log[-3000:]
    progress = run_.report["progress"]
    assert progress["step"] == 30 and run_.report["checkpointStep"] == 30, run_.report
    respawns = respawns_in(run_.log)  # see the plain script's test
    assert progress["restarts"] == {"InProcess": 0, "Launcher": respawns} and "recovering" not in progress, progress
    # Rank 1 died before step 12; rank 0 had made step 11; the run resumed from the checkpoint of step 10
    # (and, if its respawn failed before its first step, from it again).
    assert progress["last"]["rolledBack"] == 1 and f"Launcher/{progress['last']['cause']}" in RANK_CAUSES, progress
    assert progress["stepSeconds"] > 0


# A stand-in for ft_launcher: prints lines (its own log records carry its pid), optionally runs the
# training command, exits with the given code.
FAKE_LAUNCHER = ("import os, subprocess, sys; code, lines, command = int(sys.argv[1]), sys.argv[2], sys.argv[3:]; "
                 "print(lines.replace('PID', str(os.getpid())), flush=True); "
                 "command and subprocess.run(command); sys.exit(code)")
# ft_launcher's log records: NVRx 0.4.1's, and 0.6's.
R04 = "[2026-01-01 00:00:00,000] [ERROR] [ftPID@host] ".replace("ft", "ft_launcher")
R06 = "2026-01-01 00:00:00,000 [ERROR] [host] [workload:?(?) infra:?(?)] launcher.py:1618 "
STORE_LOST_04 = ("Agent .run() raised exception, e=RendezvousConnectionError('The connection to the C10d store has "
                 "failed. See inner exception for details.')")
STORE_LOST_06 = "Agent .run() raised exception, e=DistNetworkError('Failed to recv, got 0 bytes.')"
RDZV_TIMEOUT_06 = ("Agent .run() raised exception, e=RendezvousTimeoutError(\"The node 'n1' rendezvous has timed out "
                   "after 20.04 seconds (timeout: 20.0s).\")")
USER_SCRIPT = ["python", "-c", "import time; time.sleep(0.5)"]
# NVRx 0.7.0's record (fault_tolerance/launcher.py, FaultToleranceAgent.run).
PEER_GAVE_UP_07 = ("Rendezvous closed because another launcher reported a terminal worker-group failure. Original "
                   "rendezvous message: The rendezvous 'job' has been closed.")


@pytest.mark.parametrize("lines, runs_ranks, exit_code, command, code", [
    ("rendezvous timed out", False, 1, USER_SCRIPT, exit_codes.RENDEZVOUS_FAILED),
    ("a rank failed", True, 1, USER_SCRIPT, exit_codes.LAUNCHER_BUDGET_EXHAUSTED),
    (R04 + STORE_LOST_04, True, 1, USER_SCRIPT, exit_codes.RENDEZVOUS_HOST_LOST),
    (R06 + STORE_LOST_06, True, 1, USER_SCRIPT, exit_codes.RENDEZVOUS_HOST_LOST),
    # Ranks ran, then a later round timed out (peers lost, no replacement in time): not the ranks' failure.
    (R06 + RDZV_TIMEOUT_06, True, 1, USER_SCRIPT, exit_codes.RENDEZVOUS_FAILED),
    (R04 + RDZV_TIMEOUT_06, True, 1, USER_SCRIPT, exit_codes.RENDEZVOUS_FAILED),
    # NVRx 0.6's barrier closed the rendezvous for good (too many unhealthy nodes over the attempt).
    (R06 + "Agent .run() raised exception, e=RendezvousClosedError('Rendezvous cannot complete')", True, 1,
     USER_SCRIPT, exit_codes.RENDEZVOUS_CLOSED),
    ("[default0]:" + RDZV_TIMEOUT_06, True, 1, USER_SCRIPT, exit_codes.LAUNCHER_BUDGET_EXHAUSTED),  # a rank's line
    # A rank's traceback names the same error (its own store connection): not the launcher's store.
    ("torch.distributed.DistNetworkError: Failed to recv, got 0 bytes.\n[default0]:" + STORE_LOST_06, True, 1,
     USER_SCRIPT, exit_codes.LAUNCHER_BUDGET_EXHAUSTED),
    # Another process's record in 0.4.1's format (a rank importing the launcher module).
    (R04.replace("PID", "1") + STORE_LOST_04, True, 1, USER_SCRIPT, exit_codes.LAUNCHER_BUDGET_EXHAUSTED),
    (f"{R06}[default] {NO_PROGRESS_LINE}. No more restarts will be attempted.", True, 1, USER_SCRIPT,
     exit_codes.NO_PROGRESS),
    # NVRx 0.7's "do not requeue", even with 0.6's no-progress line before it.
    (f"{R06}[default] {NO_PROGRESS_LINE}.", True, exit_codes.NVRX_DO_NOT_RESTART, USER_SCRIPT,
     exit_codes.LAUNCHER_DECLINED),
    # NVRx 0.7: another node's launcher spent its restarts and closed the rendezvous while this one waited for
    # the next round (it exits 1 where 0.6 exited 0): the gang stopped, whether or not its ranks had run.
    (R06 + PEER_GAVE_UP_07, True, 1, USER_SCRIPT, exit_codes.GANG_STOPPED),
    (R06 + PEER_GAVE_UP_07, False, 1, USER_SCRIPT, exit_codes.GANG_STOPPED),
    (R06 + "Agent .run() raised UnhealthyNodeException: Node n0 is unhealthy.", True, 0, USER_SCRIPT,
     exit_codes.NODE_UNHEALTHY),
    (R04 + "Agent .run() raised exception, e=UnhealthyNodeException('Node n0 is excluded')", True, 1, USER_SCRIPT,
     exit_codes.NODE_UNHEALTHY),
    # Exit 0: the user's script is taken at its ranks' word; rtj_worker.train must leave its marker.
    (R06 + "[default] worker group successfully finished.", True, 0, USER_SCRIPT, exit_codes.OK),
    ("", False, 0, USER_SCRIPT, exit_codes.GANG_STOPPED),
    (R04 + "[default] worker group successfully finished.", False, 0, ["python", "-m", "rtj_worker.train"],
     exit_codes.GANG_STOPPED),
], ids=["no-rank", "rank-failed", "store-lost-0.4", "store-lost-0.6", "rdzv-timeout-0.6", "rdzv-timeout-0.4",
        "rdzv-closed-0.6", "rdzv-timeout-in-a-rank", "store-lost-in-a-rank",
        "store-lost-other-pid", "no-progress", "exit-93", "peer-gave-up-0.7", "peer-gave-up-0.7-standby",
        "unhealthy-exit-0", "unhealthy-exit-1",
        "user-script-finished", "exit-0-no-marker", "exit-0-trainer-no-marker"])
def test_the_launchers_outcome_is_classified_on_the_launcher_side(tmp_path, monkeypatch, lines, runs_ranks,
                                                                   exit_code, command, code):
    monkeypatch.setattr(entrypoint, "launcher_argv", lambda cfg, command: [
        sys.executable, "-c", FAKE_LAUNCHER, str(exit_code), lines, *(command if runs_ranks else [])])
    # Node 1: node 0 hosts the store itself, so only other nodes can lose it.
    env = {**local.local_env(tmp_path), "RTJ_TERMINATION_LOG": str(tmp_path / "t"), "NODE_RANK": "1"}
    assert run(command, env) == code
    assert json.loads((tmp_path / "t").read_text())["exitCode"] == code


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


@pytest.mark.nvrx041
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


# --- stops, exit 0 only when finished, the launcher's outcomes: real ft_launcher processes ---------

def _steps(node: local.LocalNode) -> int:
    return max((e["step"] for e in node.timeline() if e["event"] == "step"), default=0)


def _sigterm(node: local.LocalNode, timeout: float = 150) -> tuple[local.LocalRun, float]:
    sent = time.monotonic()
    node.proc.send_signal(signal.SIGTERM)
    run_ = node.wait(timeout)
    return run_, time.monotonic() - sent


def test_sigterm_while_waiting_for_node_0s_name_exits_143_at_once(tmp_path):
    node = local.start(tmp_path, [], NODE_RANK="1", NNODES="2", RTJ_NNODES="2:2",
                       RTJ_RDZV_ENDPOINT="train-0.train.nowhere.invalid:29400", RTJ_RDZV_TIMEOUT="600")
    wait_until(lambda: "to resolve" in (tmp_path / "worker.log").read_text(), 30, what="the DNS wait")
    run_, seconds = _sigterm(node)
    assert run_.code == exit_codes.SIGTERM, run_.log[-3000:]
    assert run_.report["exitCode"] == exit_codes.SIGTERM
    assert "received SIGTERM while waiting for train-0.train.nowhere.invalid" in run_.report["reason"]
    assert seconds < 10  # not the 600 s DNS wait, nor a blocked resolver call


@pytest.mark.nvrx041
def test_sigterm_during_the_rendezvous_exits_143(tmp_path):
    node = local.start(tmp_path, ["--steps", "5"], NNODES="2", RTJ_NNODES="2:2")  # node 1 never comes
    wait_until(lambda: "attempts to join" in (tmp_path / "worker.log").read_text(), 60, what="the rendezvous")
    time.sleep(1)
    run_, _ = _sigterm(node)
    assert run_.code == exit_codes.SIGTERM, run_.log[-3000:]
    assert "received SIGTERM during the rendezvous: no rank had started" in run_.report["reason"]
    assert not run_.starts()


def test_sigterm_with_ranks_training_saves_the_step_reached_and_exits_143(tmp_path, clean_run):
    """The ranks finish their step, agree to stop, save that step (the next checkpoint is due only at
    step 1000) and exit; a new pod resumes from it and ends with the fault-free weights."""
    args = ["--steps", str(STEPS), "--step-seconds", "0.3"]
    node = local.start(tmp_path, args, heartbeat=HEARTBEAT, RTJ_CHECKPOINT_INTERVAL="1000")
    at_signal = wait_until(lambda: (s := _steps(node)) >= 15 and s, 120, what="step 15")
    run_, _ = _sigterm(node)
    assert run_.code == exit_codes.SIGTERM, run_.log[-3000:]
    assert run_.report["reason"].startswith("received SIGTERM with ranks running: they were asked to save")
    newest = run_.report["checkpointStep"]
    assert at_signal <= newest <= at_signal + 10 and ckpt_index.complete_steps(tmp_path / "ckpt")[0] == newest
    stops = [e for e in run_.timeline if e["event"] == "stopped"]
    assert [e["code"] for e in stops] == [0, 0]  # saved and exited by themselves, not SIGKILLed by the launcher
    resumed = launch(tmp_path, RTJ_CHECKPOINT_INTERVAL="1000")
    assert resumed.code == 0, resumed.log[-3000:]
    assert {e["step"] for e in resumed.starts()[2:]} == {newest}
    assert resumed.result() == clean_run


def test_sigterm_during_an_in_process_restart_exits_143_at_once(tmp_path):
    """Mid-restart no rank can save: each ends at once rather than waiting for the launcher's SIGKILL."""
    node = local.start(tmp_path, ["--steps", str(STEPS), "--step-seconds", "0.05", "--fault", "1:25:exc"],
                       heartbeat=HEARTBEAT)
    wait_until(lambda: any(e["event"] == "fault" for e in node.timeline()), 120, what="the fault")
    time.sleep(1)  # rank 1 is in the wrapper's restart, rank 0 in its failing collective
    run_, _ = _sigterm(node)
    assert run_.code == exit_codes.SIGTERM, run_.log[-3000:]
    assert run_.report["reason"].startswith("received SIGTERM")
    # Ended by themselves (not by the launcher's SIGKILL after --term-timeout, 100 s), without saving. By
    # pid: a rank whose write the Wrapper's asynchronous exception interrupted writes it again.
    stopped = {e["pid"]: e["code"] for e in run_.timeline if e["event"] == "stopped"}
    assert sorted(stopped.values()) == [143, 143], run_.log[-3000:]
    assert len(run_.starts()) == 2  # the interrupted restart never began its iteration


def test_training_leaves_a_completion_marker_for_this_job(clean):
    assert ckpt_index.finished(clean.workdir / "ckpt", "") == STEPS
    assert ckpt_index.finished(clean.workdir / "ckpt", "another-job") is None


def _two_nodes(tmp_path: Path, nnodes: str, first: dict[str, Any], second: dict[str, Any],
               **env: Any) -> tuple[local.LocalNode, local.LocalNode]:
    """Two pods on this machine (one rank each), sharing the checkpoint directory; node 0 hosts the
    rendezvous store. `first`/`second`: local.start's train_args and command."""
    env = {"ranks": 1, "NNODES": nnodes.split(":")[0], "RTJ_NNODES": nnodes, "RTJ_RDZV_TIMEOUT": "60",
           "RTJ_RDZV_ENDPOINT": f"127.0.0.1:{local.free_port()}", "heartbeat": HEARTBEAT, **env}
    node0 = local.start(tmp_path, name="-0", NODE_RANK="0", **first, **env)
    wait_until(lambda: "starting workers" in (tmp_path / "worker-0.log").read_text(), 60, what="node 0's launcher")
    return node0, local.start(tmp_path, name="-1", NODE_RANK="1", **second, **env)


TRAINER = {"train_args": ["--steps", "20", "--step-seconds", "0.05"]}


@pytest.mark.parametrize("training", ["finishes", "fails"])
def test_a_standby_exits_0_only_when_the_job_finished(tmp_path, training):
    """Node 1 joins a full 1-node gang: ft_launcher keeps it as a standby and exits 0 when the gang
    ends, whether training finished or not; the completion marker tells which."""
    failing = {"train_args": [], "command": ["python", "-c", "import time; time.sleep(4); raise SystemExit(3)"]}
    node0, standby = _two_nodes(tmp_path, "1:1", TRAINER if training == "finishes" else failing, TRAINER,
                                RTJ_FT_MAX_RESTARTS="0")
    first, second = node0.wait(240), standby.wait(240)
    # NVRx 0.7: a standby whose gang ended for a failure exits 1, having logged that another launcher closed
    # the rendezvous for it; 0.4.1 and 0.6 exit 0 either way.
    peer_failed_07 = training == "fails" and nvrx_version() >= (0, 7)
    if peer_failed_07:
        assert PEER_GAVE_UP_LINE in second.log and "Agent's exit code = 1" in second.log, second.log[-3000:]
    else:
        assert "Rendezvous gracefully exited" in second.log  # it was a standby, and ft_launcher exited 0
        assert "Agent exits with exit code = 0" in second.log
    if training == "finishes":
        assert (first.code, second.code) == (0, 0), second.log[-3000:]
        assert second.report["reason"] == "training finished"
    else:
        assert first.code == exit_codes.LAUNCHER_BUDGET_EXHAUSTED
        assert second.code == exit_codes.GANG_STOPPED, second.log[-3000:]
        assert ("another node's launcher spent its restarts" if peer_failed_07 else "training has not finished") \
            in second.report["reason"]


@pytest.mark.nvrx041
def test_losing_node_0_is_reported_as_rendezvous_host_lost(tmp_path):
    """NVRx 0.4.1's launcher reports RendezvousConnectionError, 0.6's DistNetworkError."""
    args = {"train_args": ["--steps", "400", "--step-seconds", "0.05"]}
    node0, node1 = _two_nodes(tmp_path, "2:2", args, args, RTJ_FT_MAX_RESTARTS="1")
    wait_until(lambda: _steps(node1) >= 15, 180, what="training")
    node0.kill()  # the node is lost: the entrypoint, its launcher (the store) and its rank
    run_ = node1.wait(240)
    assert run_.code == exit_codes.RENDEZVOUS_HOST_LOST, run_.log[-3000:]
    assert "stopped answering" in run_.report["reason"]


EXCLUDE_THIS_NODE = """
import sys
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
from nvidia_resiliency_ext.fault_tolerance.data import WorkloadAction, WorkloadControlRequest
client = RankMonitorClient()
client.init_workload_monitoring()
client.send_workload_control_request(WorkloadControlRequest(WorkloadAction.ExcludeThisNode, "bad node"))
sys.exit(1)
"""


def test_a_node_excluded_by_nvrx_exits_node_unhealthy(tmp_path):
    """A rank asks NVRx to exclude its node (what a failed health check does too): ft_launcher
    leaves at its next rendezvous."""
    env = {**local.local_env(tmp_path, ranks=1), "RTJ_FT_MAX_RESTARTS": "2"}
    assert run(["python", "-c", EXCLUDE_THIS_NODE], env) == exit_codes.NODE_UNHEALTHY
    assert "unhealthy" in json.loads((tmp_path / "termination-log").read_text())["reason"]


def test_no_checkpoint_progress_is_not_a_permanent_failure(tmp_path):
    if nvrx_version() < (0, 6):
        pytest.skip("NVRx 0.4.1 has no progress tracker")
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / ckpt_index.ITERATION_FILE).write_text("10\n")  # and no restart moves it on
    # NVRx's own rule decides here: the pod's crash-loop rule (the same failure twice) is set out of reach.
    env = {**local.local_env(tmp_path, ranks=1), "RTJ_FT_MAX_RESTARTS": "5", "RTJ_FT_MAX_NO_PROGRESS_CYCLES": "2",
           "RTJ_CRASH_LOOP_REPEATS": "10"}
    code = run(["python", "-c", "import time; time.sleep(1); raise SystemExit(3)"], env)
    reason = json.loads((tmp_path / "termination-log").read_text())["reason"]
    if nvrx_version() >= (0, 7):  # 0.7 says "do not restart" itself (exit 93): the job fails, as NVRx decided
        assert code == exit_codes.LAUNCHER_DECLINED and "must not be restarted" in reason, reason
        return
    assert code == exit_codes.NO_PROGRESS and code not in exit_codes.PERMANENT
    assert "no checkpoint progress" in reason


SLOW_WRITES = """
import sys, time
from rtj_worker import checkpoint, train

class SlowWriter(checkpoint.dcp.FileSystemWriter):
    def write_data(self, plan, planner):
        time.sleep(3)  # a volume slower than the checkpoint interval (10 steps, well under 3 s here)
        return super().write_data(plan, planner)

checkpoint.Checkpointer._writer = lambda self, path: SlowWriter(path, sync_files=True)
if __name__ == "__main__":  # the process writer's spawn imports this file again
    sys.exit(train.main())
"""


def test_a_save_slower_than_the_interval_is_skipped_not_waited_for(tmp_path, clean_run):
    script = tmp_path / "slow_train.py"
    script.write_text(SLOW_WRITES)
    run_ = local.start(tmp_path, ["--steps", str(STEPS), "--step-seconds", "0.05"], command=["python", str(script)],
                       heartbeat=HEARTBEAT).wait(240)
    assert run_.code == 0, run_.log[-3000:]
    skipped = [e for e in run_.timeline if e["event"] == "checkpoint_skipped"]
    assert skipped and {e["rank"] for e in skipped} == {0, 1}
    assert all(e["in_flight"] < e["step"] < STEPS for e in skipped)  # never the final save
    assert len(run_.starts()) == 2  # no rank was stalled into a restart
    assert ckpt_index.complete_steps(tmp_path / "ckpt")[0] == STEPS and "skipped" in run_.log
    assert run_.result() == clean_run


# --- issue 28: a user's own script -----------------------------------------------------------------------
TYPO = """
import os
import torch.distributed as dist

if __name__ == "__main__":
    print("rank", os.environ["RANK"], "starting", flush=True)
    import flash_attn_typo  # a dependency missing from the image, as a user's script would have it
"""


@pytest.mark.nvrx041
def test_a_script_that_fails_the_same_way_at_every_restart_stops_at_the_second_with_its_traceback(tmp_path):
    """Issue 28.2: ft_launcher restarted such a script 20 times per pod (each a torch import and, on a p5,
    a CUDA init) while the RTJ showed Running, and the error was only in the pod's log."""
    script = tmp_path / "train.py"
    script.write_text(TYPO)
    started = time.monotonic()
    run_ = local.start(tmp_path, [], command=["python", str(script)], heartbeat=HEARTBEAT,
                       RTJ_FT_MAX_RESTARTS="20").wait(180)
    assert run_.code == exit_codes.CRASH_LOOP, run_.log[-3000:]
    error = "ModuleNotFoundError: No module named 'flash_attn_typo'"
    assert run_.report["reason"].endswith(f"no step or checkpoint progress: {error}")
    assert run_.report["lines"][0] == "Traceback (most recent call last):" and run_.report["lines"][-1] == error
    # Not the 20 restarts it was given: decided at the second failure, or, when NVRx 0.4.1 forwards the
    # second one's traceback only after its record (a loaded machine), at the next group's rendezvous,
    # which may fail once more before it is stopped.
    assert len(GROUP_FAILED.findall(run_.log)) in (2, 3)
    assert time.monotonic() - started < 90


# --- issue 27: real-size state --------------------------------------------------------------------------
SOFT, HARD = 5, 8  # the in-process Wrapper's timeouts, short so that a save can outlast them three times


@pytest.mark.skipif(not slowfs.usable(), reason="slowfs mounts FUSE: needs root and /dev/fuse")
def test_a_final_save_three_times_longer_than_the_hard_timeout_commits(tmp_path):
    """Issue 27.1: the Wrapper's watchdog sees only the main thread's bytecode, and the final save and
    finalize() were one native wait each: every attempt reached the last step, was killed in its final
    save, and committed nothing. Here the checkpoint volume (hack/slowfs: a simulation of FSx for Lustre,
    which cannot run here) makes the reference trainer's 3 MB state write as a 9.6 GB one would at
    300 MB/s (~30 s), at the volume, where a user's script would feel it the same way."""
    ckpt = tmp_path / "ckpt"
    with slowfs.SlowVolume(tmp_path / "backing", ckpt, write_bps=slowfs.FSX_BPS, read_bps=slowfs.FSX_BPS,
                           scale=9.6e9 / 3.3e6):
        run_ = local.start(tmp_path, ["--steps", "40", "--step-seconds", "0.05"], heartbeat=120,
                           RTJ_CHECKPOINT_INTERVAL="1000", RTJ_INPROCESS_SOFT_TIMEOUT=str(SOFT),
                           RTJ_INPROCESS_HARD_TIMEOUT=str(HARD)).wait(300)
        assert run_.code == exit_codes.OK, run_.log[-3000:]
        assert ckpt_index.complete_steps(ckpt)[0] == 40 and run_.report["checkpointStep"] == 40
    assert len(run_.starts()) == 2  # no restart of any kind
    last_step = max(e["t"] for e in run_.timeline if e["event"] == "step")
    saved = min(e["t"] for e in run_.timeline if e["event"] == "done") - last_step
    assert saved > 3 * HARD, f"the final save took {saved:.1f} s: the volume no longer makes it outlast the timeout"


# --- issue 19: the coordinator, hot spares ---------------------------------------------------------------
def _coordinator(tmp_path: Path, nnodes: str, port: int) -> subprocess.Popen[bytes]:
    """`python -m rtj_worker.coordinator` as its pod runs it: the rendezvous and the ranks' stores."""
    env = {**os.environ, "RTJ_RDZV_PORT": str(port), "RTJ_NNODES": nnodes, "RTJ_RDZV_ID": tmp_path.name,
           "RTJ_RDZV_TIMEOUT": "60", **local.ONE_HOST}
    with open(tmp_path / "coordinator.log", "w") as log:
        return subprocess.Popen([sys.executable, "-m", "rtj_worker.coordinator"], env=env, stdout=log,
                                stderr=subprocess.STDOUT)


def _gang(tmp_path: Path, nnodes: str, count: int, steps: int = 400, ranks: int = 1,
          step_seconds: float = 0.05, rdzv_timeout: int = 60,
          extra: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], list[local.LocalNode]]:
    """A coordinator and `count` nodes. Tests that stop a node mid-run pass slower steps: at 0.05 s a step
    the 45 steps left after step 15 can end before the node is stopped on 2 loaded cores (the weights do
    not depend on the step time)."""
    port = local.free_port()
    coordinator = _coordinator(tmp_path, nnodes, port)
    env = {"ranks": ranks, "NNODES": nnodes.split(":")[0], "RTJ_NNODES": nnodes, "RTJ_RDZV_TIMEOUT": str(rdzv_timeout),
           "RTJ_RDZV_ENDPOINT": f"127.0.0.1:{port}", "RTJ_COORDINATOR": "1", "heartbeat": HEARTBEAT,
           "RTJ_FT_MAX_RESTARTS": "3"}
    wait_until(lambda: "serving the rendezvous" in (tmp_path / "coordinator.log").read_text(), 60,
               what="the coordinator")
    nodes = [local.start(tmp_path, ["--steps", str(steps), "--step-seconds", str(step_seconds), *extra], name=f"-{i}",
                         NODE_RANK=str(i), **env) for i in range(count)]
    return coordinator, nodes


def _trains(node: local.LocalNode) -> bool:
    """Whether a rank of this pod runs the training script (a standby's launcher has none). The launcher's
    own command line (and its rank monitors') ends with the script's, so only a process whose program is
    the script counts."""
    from rtj_worker.entrypoint import descendants

    for pid in descendants(node.proc.pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"rtj_worker.train"]:
                return True
    return False


def test_with_the_coordinator_losing_node_0_is_like_losing_any_node(tmp_path):
    """Node 0 hosts nothing: when it is lost the other node's launcher restarts its ranks and waits in
    the rendezvous (no exit 72), and a new node 0 joins it; training ends with the fault-free weights."""
    coordinator, (node0, node1) = _gang(tmp_path, "2:2", 2, steps=STEPS, ranks=2, step_seconds=0.15)
    try:
        wait_until(lambda: _steps(node1) >= 15, 180, what="training")
        node0.kill()
        time.sleep(3)
        assert node1.proc.poll() is None, node1.wait(1).log[-3000:]  # still there: it lost a peer, not the store
        replacement = local.start(tmp_path, ["--steps", str(STEPS), "--step-seconds", "0.05"], name="-0b",
                                  NODE_RANK="0", **{**gang_env(node1), "ranks": 2})
        first, second = node1.wait(240), replacement.wait(240)
        assert (first.code, second.code) == (0, 0), first.log[-3000:]
        # Node 1's ranks only left for their lost peer: its pod reports no recovery of its own.
        assert first.progress["restarts"] == {"InProcess": 0, "Launcher": 0}, (first.progress, first.log[-6000:])
    finally:
        coordinator.terminate()
        coordinator.wait(60)


@pytest.mark.nvrx041
def test_a_survivor_whose_lost_peer_is_not_replaced_exits_rendezvous_failed(tmp_path):
    """Issue 17.4: a node lost and no replacement within the rendezvous timeout (no capacity). The
    survivor's ranks had trained, so it exited 70 (its launcher's budget, charged to the job); its round
    timed out for want of peers: 71, which the operator excuses while the lost node's fault is recovered."""
    coordinator, (node0, node1) = _gang(tmp_path, "2:2", 2, steps=400, rdzv_timeout=20)
    try:
        wait_until(lambda: _steps(node1) >= 5, 180, what="training")
        node0.kill()
        run_ = node1.wait(150)
        assert run_.code == exit_codes.RENDEZVOUS_FAILED, run_.log[-3000:]
        assert "rendezvous round did not complete within 20s" in run_.report["reason"], run_.report
    finally:
        coordinator.terminate()
        coordinator.wait(60)


def test_a_stopped_pod_never_leaves_its_peers_training_in_a_smaller_world(tmp_path, clean_run):
    """`kubectl delete pod` of node 1: its ranks save and stop (143) and, on NVRx 0.6, are recorded as
    terminated ranks; NVRx's ShiftRanks then restarted node 0's rank in process in a world of 1, which
    trained to the end alone on other batches (the e2e test saw other weights). With FullWorld it leaves
    to ft_launcher, whose next round waits for the replacement: the fault-free weights."""
    coordinator, (node0, node1) = _gang(tmp_path, "2:2", 2, steps=STEPS, step_seconds=0.15)
    try:
        wait_until(lambda: _steps(node0) >= 15 and _steps(node1) >= 15, 180, what="training")
        stopped_at = time.time()
        node1.proc.send_signal(signal.SIGTERM)
        assert node1.wait(60).code == exit_codes.SIGTERM
        replacement = local.start(tmp_path, ["--steps", str(STEPS), "--step-seconds", "0.05"], name="-1b",
                                  NODE_RANK="1", **gang_env(node0))
        first, second = node0.wait(240), replacement.wait(240)
        assert (first.code, second.code) == (0, 0), first.log[-3000:]
        resumed = [e for e in first.starts() if e["t"] > stopped_at]
        assert resumed and {e["world_size"] for e in resumed} == {2}, resumed
        result = json.loads((tmp_path / "ckpt" / "result.json").read_text())
        assert result["steps"] == STEPS and result["checksum"] == pytest.approx(clean_run["checksum"], rel=1e-9)
        # Node 0's ranks only left for their peer: its pod reports no recovery of its own (the operator
        # counts the deletion, once).
        assert first.progress["restarts"] == {"InProcess": 0, "Launcher": 0}, (first.progress, first.log[-3000:])
    finally:
        coordinator.terminate()
        coordinator.wait(60)


def gang_env(node: local.LocalNode) -> dict[str, Any]:
    """The settings a node of this gang was started with (for its replacement)."""
    env = Path(f"/proc/{node.proc.pid}/environ").read_bytes().split(b"\0")
    wanted = ("NNODES", "RTJ_NNODES", "RTJ_RDZV_TIMEOUT", "RTJ_RDZV_ENDPOINT", "RTJ_COORDINATOR",
              "RTJ_FT_MAX_RESTARTS")
    found = dict(item.decode().split("=", 1) for item in env if b"=" in item)
    return {"ranks": 1, "heartbeat": HEARTBEAT, **{k: found[k] for k in wanted if k in found}}


def test_a_hot_spare_takes_over_a_lost_node_before_any_new_pod_exists(tmp_path, clean_run):
    from rtj_worker.launch import nvrx_version

    if nvrx_version() < (0, 6):
        pytest.skip("hot spares need NVRx 0.6's barrier rendezvous (see the next test)")
    coordinator, nodes = _gang(tmp_path, "2:3", 3, steps=STEPS, step_seconds=0.15)
    try:
        active = wait_until(lambda: [n for n in nodes if _trains(n)] if len([n for n in nodes if _trains(n)]) == 2
                            else None, 180, what="two active nodes and a spare")
        spare = next(n for n in nodes if n not in active)
        wait_until(lambda: _steps(active[0]) >= 15, 180, what="training")
        lost_at = time.time()
        active[0].kill()
        wait_until(lambda: _trains(spare), 120, what="the spare training")
        runs = [n.wait(240) for n in nodes if n is not active[0]]
        assert [r.code for r in runs] == [0, 0], runs[0].log[-3000:]
        # The lost node's fault is the operator's to count: neither the survivor nor the spare counts one.
        assert [r.progress["restarts"] for r in runs] == [{"InProcess": 0, "Launcher": 0}] * 2, runs[0].log[-3000:]
        resumed = [e for e in runs[0].starts() if e["t"] > lost_at]
        assert resumed and {e["step"] for e in resumed} <= {10, 20}, resumed  # the newest checkpoint before
        # The survivor kept its slot and restores from its node; the spare took the lost node's slot and
        # fetches its copy from the survivor, which held it (a ring of 2). Or, when the step committed just
        # before the loss had not reached the peer yet, every rank reads the volume: all or none.
        assert {e["source"] for e in resumed} in ({"node", "peer"}, {"volume"}), resumed
        result = json.loads((tmp_path / "ckpt" / "result.json").read_text())
        assert result["steps"] == STEPS and result["checksum"] == pytest.approx(clean_run["checksum"], rel=1e-9)
    finally:
        coordinator.terminate()
        coordinator.wait(60)


def test_a_replaced_unhealthy_node_leaves_the_rendezvous_open(tmp_path, clean_run):
    """Issue 27.3: NVRx's barrier counts the unhealthy nodes over the rendezvous' life and closes it once they
    exceed MAX - MIN. With MAX = MIN (no spares), node 1's rank asking to exclude its node ended the
    survivor too (78, RendezvousClosed: a gang restart). With the headroom (launch.barrier_nnodes) the
    survivor waits in its next round for the node's replacement, as the operator makes it, and training
    ends with the fault-free weights."""
    from rtj_worker.launch import nvrx_version

    if nvrx_version() < (0, 6):
        pytest.skip("NVRx 0.4.1's c10d rendezvous keeps no count of unhealthy nodes")
    fault = ("--fault", "1:15:unhealthy")
    coordinator, (node0, node1) = _gang(tmp_path, "2:2", 2, steps=STEPS, step_seconds=0.15, extra=fault)
    try:
        excluded = node1.wait(240)
        assert excluded.code == exit_codes.NODE_UNHEALTHY, excluded.log[-3000:]
        replacement = local.start(tmp_path, ["--steps", str(STEPS), "--step-seconds", "0.05", *fault], name="-1b",
                                  NODE_RANK="1", **gang_env(node0))
        first, second = node0.wait(240), replacement.wait(240)
        assert (first.code, second.code) == (0, 0), first.log[-3000:]
        result = json.loads((tmp_path / "ckpt" / "result.json").read_text())
        assert result["steps"] == STEPS and result["checksum"] == pytest.approx(clean_run["checksum"], rel=1e-9)
    finally:
        coordinator.terminate()
        coordinator.wait(60)


@pytest.mark.nvrx041
def test_spares_need_nvrx_06(tmp_path):
    from rtj_worker.launch import nvrx_version

    if nvrx_version() >= (0, 6):
        pytest.skip("NVRx 0.6 runs spares")
    env = {**local.local_env(tmp_path, ranks=1), "NNODES": "2", "RTJ_NNODES": "2:3"}
    assert run(["python", "-c", "pass"], env) == exit_codes.CONFIG_ERROR
    assert "needs NVRx 0.6" in json.loads((tmp_path / "termination-log").read_text())["reason"]


def test_the_coordinator_runs_nvrx_control_as_the_launchers_rendezvous():
    from rtj_worker.coordinator import control_args

    args = control_args({"RTJ_NNODES": "8:9", "RTJ_RDZV_ID": "uid-3", "RTJ_RDZV_TIMEOUT": "600"}, 29400)
    # The launchers' range, with their headroom for replaced unhealthy nodes (launch.barrier_nnodes).
    assert args == ["--nnodes=8:17", "--rdzv-endpoint=0.0.0.0:29400", "--rdzv-id=uid-3", "--rdzv-backend=c10d",
                    "--rdzv-conf=join_timeout=600", "--ft-enable-log-server=false"]


def test_a_coordinator_whose_nvrx_control_raised_exits_as_failed(monkeypatch):
    """Issue 27.6: it exited 0, and the operator ignores a Succeeded coordinator until the workers lose
    their store; now it ends at once with a code of its own, which the operator restarts the gang for."""
    from nvidia_resiliency_ext.fault_tolerance import control_plane

    from rtj_worker import coordinator

    def closing_fails(args: object) -> None:
        raise RuntimeError("round 3 did not close within 600 s")

    monkeypatch.setattr(control_plane, "run", closing_fails)
    monkeypatch.setattr(coordinator, "stores", lambda port, timeout: [])
    env = {"RTJ_RDZV_PORT": "29400", "RTJ_NNODES": "2:2", "RTJ_RDZV_ID": "uid-1"}
    assert coordinator.main(env) == exit_codes.RENDEZVOUS_CONTROL_FAILED


@pytest.mark.parametrize("soft, hard, rendezvous", [
    (45, 55, 600),  # the defaults
    (4, 10, 60),  # the e2e tests' short timeouts: half the rendezvous is 30 s, the heartbeat then 15 s
    (2, 3, 10),  # the smallest the spec allows
    (3600, 7200, 7200),  # the largest: a barrier above half the rendezvous, never below the hard timeout
])
def test_wrapper_timeouts_are_ones_nvrx_accepts(soft, hard, rendezvous):
    import datetime

    from nvidia_resiliency_ext import inprocess

    from rtj_worker.train import wrapper_timeouts
    barrier, heartbeat = wrapper_timeouts(hard, rendezvous)
    assert barrier.total_seconds() >= hard + 15 and heartbeat <= datetime.timedelta(seconds=30)
    # Constructing the Wrapper runs NVRx's own checks of its bounds (it raises ValueError otherwise).
    inprocess.Wrapper(soft_timeout=datetime.timedelta(seconds=soft), hard_timeout=datetime.timedelta(seconds=hard),
                      barrier_timeout=barrier, completion_timeout=barrier, heartbeat_timeout=heartbeat)
