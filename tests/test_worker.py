"""The worker on CPU: ft_launcher + RankMonitorClient + inprocess.Wrapper + async checkpoints.

Each fault kind must be recovered by the right layer, resume from the last checkpoint and end
with the same weights as a run without faults (batches depend only on seed, step and rank).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rtj_worker import exit_codes, local
from rtj_worker.entrypoint import ConfigError, LaunchConfig, launcher_argv, run

STEPS = 60
HEARTBEAT = 15  # seconds; above the ~10 s an in-process restart takes on CPU with gloo


def launch(tmp: Path, *train_args: str, **env: str) -> local.LocalRun:
    return local.launch(tmp, ["--steps", str(STEPS), "--step-seconds", "0.05", *train_args], timeout=240,
                        heartbeat=HEARTBEAT, **env)


@pytest.fixture(scope="module")
def clean_run(tmp_path_factory) -> dict:
    run_ = launch(tmp_path_factory.mktemp("clean"))
    assert run_.code == exit_codes.OK, run_.log[-3000:]
    assert run_.report == {"exitCode": 0, "reason": "training finished", "checkpointStep": STEPS}
    assert {e["pid"] for e in run_.starts()} == {e["pid"] for e in run_.timeline}
    return run_.result()


def test_exception_is_recovered_in_process(tmp_path, clean_run):
    run_ = launch(tmp_path, "--fault", "1:25:exc")
    assert run_.code == 0, run_.log[-3000:]
    first, second = run_.starts()[:2], run_.starts()[2:]
    # Same processes, next Wrapper iteration: no process was restarted.
    assert {e["pid"] for e in first} == {e["pid"] for e in second}
    assert [e["iteration"] for e in second] == [1, 1]
    assert {e["step"] for e in second} == {20}  # the newest complete checkpoint before step 25
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


def test_launcher_flags_follow_the_operator_env():
    cfg = LaunchConfig.from_env({
        "RTJ_NNODES": "6:8", "NPROC_PER_NODE": "8", "NODE_RANK": "3", "RTJ_RDZV_ENDPOINT": "j-0.j.ns.svc:29400",
        "RTJ_RDZV_ID": "uid-2", "RTJ_FT_MAX_RESTARTS": "4", "RTJ_FT_HEARTBEAT_TIMEOUT": "900",
        "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT": "1200", "RTJ_FT_MONITOR_INTERVAL": "5"})
    argv = launcher_argv(cfg, ["python", "-m", "rtj_worker.train", "--steps", "9"])
    assert argv[0].endswith("ft_launcher")
    assert argv[1:] == [
        "--nnodes=6:8", "--nproc-per-node=8", "--rdzv-backend=c10d", "--rdzv-endpoint=j-0.j.ns.svc:29400",
        "--rdzv-id=uid-2", "--rdzv-conf=is_host=0,join_timeout=600", "--max-restarts=4", "--monitor-interval=5",
        "--ft-rank-heartbeat-timeout=900", "--ft-initial-rank-heartbeat-timeout=1200",
        "--ft-workload-check-interval=5", "--ft-enable-nic-monitor=False",
        "--module", "rtj_worker.train", "--steps", "9"]
    assert launcher_argv(cfg, ["python3", "train.py"])[-1] == "train.py"
    assert launcher_argv(cfg, ["/bin/train"])[-2:] == ["--no-python", "/bin/train"]


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
    assert run(["python", "x.py"], env) == exit_codes.RENDEZVOUS_FAILED
    assert "did not resolve within 1s" in json.loads((tmp_path / "t").read_text())["reason"]
