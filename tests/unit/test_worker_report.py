"""The pod's report (rtj_worker.report) from what its ranks write (rtj_worker.progress) and what its
launcher logs, with a fake clock; the same code runs with real ft_launcher in tests/worker and in pods
in tests/e2e. The log lines are ft_launcher's own, as NVRx 0.4.1 and 0.6 print them."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rtj_worker.launch import nvrx_message
from rtj_worker.progress import RankProgress
from rtj_worker.report import (
    CONDITION,
    FOLLOWER_SECONDS,
    INTERVAL_SECONDS,
    STARTED_SECONDS,
    PodReporter,
    ReportRejected,
    Tracker,
    token_claims,
)
from testkit import Clock, wait_until

PID = 4242  # the launcher's


class Pod:
    """One pod's ranks (RankProgress, as train.py drives it) and its entrypoint's tracker."""

    def __init__(self, tmp: Path, ranks: tuple[int, ...] = (0, 1)):
        self.clock = Clock()
        self.dir = tmp
        self.global_ranks = ranks
        self.tracker = Tracker(tmp, clock=self.clock)
        self.ranks: list[RankProgress] = []
        self.group = 0

    def start(self, step: int = 0, iteration: int = 0, new_group: bool = True,
              sources: tuple[tuple[str, float], ...] = ()) -> None:
        if new_group:
            self.group += 1
            self.ranks = [RankProgress(self.dir, local, f"g{self.group}", clock=self.clock)
                          for local in range(len(self.global_ranks))]
        for i, (rank, progress) in enumerate(zip(self.global_ranks, self.ranks, strict=True)):
            progress.loaded(step)
            progress.started(rank, iteration, step, *(sources[i] if sources else (None, None)))

    def steps(self, first: int, last: int, seconds: float = 0.5) -> None:
        for step in range(first, last + 1):
            self.clock.now += seconds
            for progress in self.ranks:
                progress.stepped(step)
            if step % 10 == 0:
                for progress in self.ranks:
                    progress.commit(step, seconds=step / 10)
        self.tracker.poll()

    def line(self, text: str) -> None:
        message = nvrx_message(text, PID)
        assert message is not None, text
        self.tracker.launcher_line(message)

    def report(self) -> dict[str, Any]:
        self.tracker.poll()
        return self.tracker.report()


# Records as ft_launcher prints them (NVRx 0.4.1; 0.6 in test_nvrx_records_are_read_in_both_formats).
KILLED = f"[2026-12-03 15:29:57,492] [ERROR] [ft_launcher{PID}@vm] failed (exitcode: -9) local_rank: 1 (pid: 9456) " \
         "of binary: /venv/bin/python"
UNHEALTHY = f"[2026-12-03 15:29:57,492] [INFO] [ft_launcher{PID}@vm] [default] Worker group UNHEALTHY. 3/3 attempts " \
            "left; will restart worker group"
FAILED = f"[2026-12-03 15:30:36,889] [INFO] [ft_launcher{PID}@vm] [default] Worker group FAILED. 2/3 attempts left; " \
         "will restart worker group"
HUNG = "[2026-12-03 15:30:36,704] [WARNING] [RankMonServer9452@vm:1] Did not get subsequent heartbeat. Waited 15.00 s."
PEER = f"[2026-12-03 15:30:36,889] [INFO] [ft_launcher{PID}@vm] [default] Detected 1 new nodes from group_rank=0; " \
       "will restart worker group"


def test_an_exception_of_this_pods_rank_counts_once_the_loop_runs_again(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    pod.start()
    pod.steps(1, 25)
    assert pod.report()["state"] == "Training" and pod.report()["step"] == 25
    pod.clock.now += 0.2
    pod.ranks[1].failed(RuntimeError("injected"), 25, own=True)
    pod.ranks[0].failed(RuntimeError("Timed out waiting 10000ms"), 25, own=False)  # the peer's view
    report = pod.report()
    assert report["state"] == "Recovering" and report["restarts"]["InProcess"] == 0  # not yet recovered
    assert report["recovering"]["tier"] == "InProcess"
    pod.clock.now += 10
    pod.start(step=20, iteration=1, new_group=False)  # same processes, the Wrapper's next iteration
    pod.steps(21, 22, seconds=1.0)
    report = pod.report()
    assert report["restarts"] == {"InProcess": 1, "Launcher": 0}
    assert report["causes"] == {"InProcess/RuntimeError": 1}
    assert report["last"]["rolledBack"] == 5 and report["last"]["seconds"] == pytest.approx(11.0)
    assert report["state"] == "Training" and report["step"] == 22 and report["resumed"] == 20


def test_a_recovery_says_where_its_slowest_rank_restored_from(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    pod.start()
    pod.steps(1, 25)
    pod.ranks[1].failed(RuntimeError("injected"), 25, own=True)
    pod.tracker.poll()
    pod.start(step=20, iteration=1, new_group=False, sources=(("memory", 0.1), ("node", 0.7)))
    pod.steps(21, 22)
    report = pod.report()
    assert (report["last"]["restoredFrom"], report["last"]["restoreSeconds"]) == ("node", 0.7)
    assert (report["restoredFrom"], report["restoreSeconds"]) == ("node", 0.7)


def test_a_peers_fault_is_not_counted_here(tmp_path: Path) -> None:
    pod = Pod(tmp_path, ranks=(2, 3))
    pod.start()
    pod.steps(1, 25)
    pod.ranks[0].failed(RuntimeError("Connection reset by peer"), 25, own=False)
    pod.line(PEER)
    assert pod.report()["state"] == "Recovering"
    pod.start(step=20)
    pod.steps(21, 23)
    report = pod.report()
    assert report["restarts"] == {"InProcess": 0, "Launcher": 0} and "last" not in report
    assert report["state"] == "Training" and not report["leader"]


def test_ranks_that_left_for_peers_that_left_count_no_restart_here(tmp_path: Path) -> None:
    """A peer pod deleted or its node lost: this pod's ranks see it in a collective (not their fault),
    train.FullWorld makes them leave (exit 1), and their launcher logs a FAILED worker group. The
    deletion or node loss is counted where it happened (the operator), not again as this pod's
    Launcher restart (seen in `make demo`: the node loss showed as ReplacePod and Launcher)."""
    pod = Pod(tmp_path)
    pod.start()
    pod.steps(1, 25)
    pod.ranks[0].failed(RuntimeError("Connection reset by peer"), 25, own=False)
    for progress in pod.ranks:
        progress.left("ranks [2, 3] of 4 left: leaving the in-process restart to ft_launcher's next rendezvous")
    pod.line(KILLED.replace("exitcode: -9", "exitcode: 1").replace("local_rank: 1", "local_rank: 0"))
    pod.line(FAILED)  # read before the tracker polled the ranks' files: the line itself makes it look
    assert pod.report()["state"] == "Recovering" and "recovering" not in pod.report()
    pod.start(step=20)
    pod.steps(21, 23)
    report = pod.report()
    assert report["restarts"] == {"InProcess": 0, "Launcher": 0} and "last" not in report
    # A later fault of this pod's own ranks counts as ever.
    pod.line(KILLED)
    pod.line(UNHEALTHY)
    pod.start(step=20)
    pod.steps(21, 21)
    assert pod.report()["restarts"] == {"InProcess": 0, "Launcher": 1}


def test_ranks_restarted_while_waiting_for_a_lost_peer_count_no_restart_here(tmp_path: Path) -> None:
    """A peer node lost: this pod's ranks lose the connection (a peer's fault) and wait in the in-process
    restart for ranks that never come, until their launcher's heartbeat timeout restarts them (seen end
    to end: the survivor of a node loss counted Launcher/RankHung). The node loss is the operator's."""
    pod = Pod(tmp_path)
    pod.start()
    pod.steps(1, 25)
    for progress in pod.ranks:
        progress.failed(RuntimeError("Connection reset by peer"), 25, own=False)
    pod.line(HUNG)
    pod.line(HUNG.replace("@vm:1", "@vm:0"))
    pod.line(KILLED.replace("local_rank: 1", "local_rank: 0"))
    pod.line(FAILED)
    pod.start(step=20)
    pod.steps(21, 23)
    report = pod.report()
    assert report["restarts"] == {"InProcess": 0, "Launcher": 0} and "last" not in report, report


def test_a_rank_that_hangs_by_itself_counts_even_when_its_sibling_saw_a_peers_fault(tmp_path: Path) -> None:
    """Local rank 1 hangs (it records no fault); local rank 0 times out in the collective waiting for it
    (a peer's fault, to rank 0). The launcher's restart is this pod's."""
    pod = Pod(tmp_path)
    pod.start()
    pod.steps(1, 25)
    pod.ranks[0].failed(RuntimeError("Timed out waiting 10000ms"), 25, own=False)
    pod.line(HUNG)
    pod.line(KILLED)
    pod.line(FAILED)
    pod.start(step=20)
    pod.steps(21, 23)
    report = pod.report()
    assert report["restarts"] == {"InProcess": 0, "Launcher": 1} and report["causes"] == {"Launcher/RankHung": 1}


@pytest.mark.parametrize("lines, cause, detail", [
    ([KILLED, UNHEALTHY], "RankKilled", "local rank 1 (pid 9456) killed by SIGKILL"),
    ([HUNG, KILLED.replace("local_rank: 1", "local_rank: 0"), FAILED], "RankHung", "Did not get subsequent heartbeat"),
    ([KILLED.replace("exitcode: -9", "exitcode: 1"), FAILED], "RankExited", "exited with code 1"),
])
def test_a_launcher_restart_of_this_node_counts_with_its_cause(tmp_path: Path, lines: list[str], cause: str,
                                                                detail: str) -> None:
    pod = Pod(tmp_path)
    pod.start()
    pod.steps(1, 25)
    fault_at = pod.clock.now
    pod.clock.now += 15
    for line in lines:
        pod.line(line)
    assert pod.report()["state"] == "Recovering"
    pod.clock.now += 8
    pod.start(step=20)  # new processes
    pod.steps(21, 21, seconds=1.0)
    report = pod.report()
    assert report["restarts"] == {"InProcess": 0, "Launcher": 1}
    assert report["causes"] == {f"Launcher/{cause}": 1}
    last = report["last"]
    assert last["cause"] == cause and detail in last["detail"] and last["rolledBack"] == 5
    assert last["seconds"] == pytest.approx(pod.clock.now - fault_at)  # from the last step before the fault


def test_an_in_process_fault_the_wrapper_could_not_recover_is_the_launchers(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    pod.start()
    pod.steps(1, 12)
    pod.ranks[0].failed(ValueError("bad batch"), 12, own=True)
    pod.report()
    pod.line(KILLED.replace("exitcode: -9", "exitcode: 1"))
    pod.line(FAILED)
    pod.start(step=10)
    pod.steps(11, 11)
    report = pod.report()
    assert report["restarts"] == {"InProcess": 0, "Launcher": 1}
    assert report["last"]["cause"] == "ValueError" and "not recovered in process" in report["last"]["detail"]


def test_in_loop_seconds_are_those_of_runs_that_hosted_rank_0(tmp_path: Path) -> None:
    leader, follower = Pod(tmp_path / "a", ranks=(0, 1)), Pod(tmp_path / "b", ranks=(2, 3))
    for pod in (leader, follower):
        pod.dir.mkdir()
        pod.start()
        pod.steps(1, 20, seconds=0.5)  # 10 s in the loop
    assert leader.report()["inLoopSeconds"] == pytest.approx(10.0) and leader.report()["leader"]
    assert follower.report()["inLoopSeconds"] == 0 and not follower.report()["leader"]
    leader.ranks[1].failed(RuntimeError("x"), 20, own=True)
    leader.clock.now += 7  # out of the loop: not counted
    leader.start(step=20, iteration=1, new_group=False)
    leader.steps(21, 24, seconds=0.5)
    assert leader.report()["inLoopSeconds"] == pytest.approx(12.0)


def test_checkpoint_and_step_time_come_from_local_rank_0(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    pod.start()
    pod.steps(1, 34, seconds=0.25)
    report = pod.report()
    assert report["ckpt"] == 30 and report["stepSeconds"] == pytest.approx(0.25)
    assert report["ckptAt"] == pytest.approx(1000 + 30 * 0.25)
    assert report["ckptSeconds"] == 3.0  # how long step 30's save took to commit (the operator's stop grace)


def test_nvrx_records_are_read_in_both_formats() -> None:
    assert nvrx_message(UNHEALTHY, PID).startswith("[default] Worker group UNHEALTHY")
    assert nvrx_message(HUNG, PID).startswith("Did not get subsequent heartbeat")
    v06 = ("2026-12-03 15:36:39,363 [INFO] [vm] [workload:?(?) infra:?(?)] launcher.py:561 [default] Worker group "
           "UNHEALTHY. 3/3 attempts left; will restart worker group")
    assert "Worker group UNHEALTHY" in (nvrx_message(v06, PID) or "")
    hung06 = ("2026-12-03 15:37:21,693 [WARNING] [vm] [workload:?(0) infra:?(?)] rank_monitor_server.py:497 [Cycle 1] "
              "Did not get subsequent heartbeat. Waited 15.00 seconds.")
    assert "Did not get subsequent heartbeat" in (nvrx_message(hung06, PID) or "")
    glog = (f"E1203 15:36:39.362000 {PID} torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: -9)"
            " local_rank: 1 (pid: 13634) of binary: /venv/bin/python")
    assert (nvrx_message(glog, PID) or "").startswith("failed (exitcode: -9)")
    assert nvrx_message(glog.replace(str(PID), "77"), PID) is None  # a rank's own torch warning
    assert nvrx_message("2026-12-03 15:29:57,016 rank0 ERROR Worker group FAILED. will restart worker group", PID) \
        is None  # a rank's output


class Sink:
    def __init__(self) -> None:
        self.written: list[dict[str, Any]] = []
        self.fail: Exception | None = None

    def write(self, condition: dict[str, Any]) -> None:
        if self.fail is not None:
            raise self.fail
        self.written.append(condition)


def test_reports_are_coalesced_and_recoveries_written_at_once(tmp_path: Path) -> None:
    pod, sink = Pod(tmp_path), Sink()
    reporter = PodReporter(pod.tracker, sink, clock=pod.clock)
    assert reporter.tick()  # the first report at once: the channel works
    pod.start()
    pod.steps(1, 2, seconds=1.5)
    assert reporter.tick()  # training began: at once
    condition = sink.written[-1]
    assert condition["type"] == CONDITION and condition["status"] == "True" and condition["reason"] == "Training"
    assert json.loads(condition["message"])["step"] == 2
    for second in range(int(INTERVAL_SECONDS) - 1):  # the step moves every second: not yet
        pod.steps(3 + second, 3 + second, seconds=1.0)
        assert not reporter.tick()
    pod.steps(20, 20, seconds=1.0)
    assert reporter.tick() and json.loads(sink.written[-1]["message"])["step"] == 20
    pod.ranks[1].failed(RuntimeError("x"), 20, own=True)
    pod.tracker.poll()
    pod.clock.now += 0.5
    assert not reporter.tick()  # urgent, but 2 s apart at least
    pod.clock.now += 2
    assert reporter.tick() and sink.written[-1]["reason"] == "Recovering"
    pod.clock.now += 5
    pod.start(step=20, iteration=1, new_group=False)
    pod.steps(21, 21)
    assert reporter.tick() and sink.written[-1]["reason"] == "Training"
    assert json.loads(sink.written[-1]["message"])["restarts"]["InProcess"] == 1
    assert len(sink.written) == 5


def test_a_pod_without_rank_0_refreshes_rarely(tmp_path: Path) -> None:
    pod, sink = Pod(tmp_path, ranks=(2, 3)), Sink()
    reporter = PodReporter(pod.tracker, sink, clock=pod.clock)
    pod.start()
    pod.steps(1, 1)
    assert reporter.tick()
    writes = 0
    for _ in range(int(FOLLOWER_SECONDS / 5)):
        pod.steps(2, 2, seconds=5.0)
        writes += reporter.tick()
    assert writes == 1  # one refresh in 5 minutes


def test_a_refused_write_backs_off_and_is_logged_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    pod, sink = Pod(tmp_path), Sink()
    reporter = PodReporter(pod.tracker, sink, clock=pod.clock)
    sink.fail = ReportRejected(403, "forbidden")
    attempts = 0
    for _ in range(120):
        pod.clock.now += 5
        pod.tracker.urgent = True
        attempts += 0 if reporter.tick() else 1
    assert caplog.text.count("could not publish") == 1
    sink.fail = None
    pod.clock.now += 400
    assert reporter.tick() and reporter.writes == 1


def test_the_pod_is_named_by_its_own_token() -> None:
    import base64

    claims = {"kubernetes.io": {"namespace": "ns", "pod": {"name": "train-0-abc", "uid": "u-1"}}}
    payload = base64.urlsafe_b64encode(json.dumps(claims).encode()).decode().rstrip("=")
    assert token_claims(f"h.{payload}.sig") == claims
    assert token_claims("not a token") == {}


def test_without_a_token_the_ranks_are_still_followed_as_they_go(tmp_path: Path) -> None:
    """A pod with nowhere to publish reports only at exit; the tracker must still have read the steps
    before the launcher's restart line, or the steps rolled back would be lost."""
    pod = Pod(tmp_path)
    reporter = PodReporter(pod.tracker, None, poll=0.01).start()
    try:
        pod.start()
        for step in range(1, 26):
            pod.clock.now += 0.5
            for ranks in pod.ranks:
                ranks.stepped(step)
            if step % 10 == 0:
                for ranks in pod.ranks:
                    ranks.commit(step)
        wait_until(lambda: pod.tracker.report()["step"] == 25, timeout=10, what="step 25 tracked", interval=0.01)
        pod.line(KILLED)
        pod.line(FAILED)
        pod.start(step=20)
        pod.steps(21, 22)
    finally:
        report = reporter.stop()
    assert report["restarts"]["Launcher"] == 1 and report["last"]["rolledBack"] == 5


def test_a_scripts_own_latest_checkpointed_iteration_is_its_checkpoint_step(tmp_path: Path) -> None:
    """Issue 28: a script that does not use rtj_worker.progress (Megatron-LM, NeMo, a plain one with NVRx)
    still shows its newest checkpoint when it writes latest_checkpointed_iteration.txt under
    $RTJ_CHECKPOINT_DIR, as those do."""
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    tracker = Tracker(tmp_path, clock=Clock(), checkpoint_dir=ckpt)
    tracker.poll()
    assert "ckpt" not in tracker.report()
    (ckpt / "latest_checkpointed_iteration.txt").write_text("1500\n")
    tracker.poll()
    report = tracker.report()
    assert report["ckpt"] == 1500 and report["ckptAt"] == round((ckpt / "latest_checkpointed_iteration.txt")
                                                                 .stat().st_mtime, 2)
    (ckpt / "latest_checkpointed_iteration.txt").write_text("release\n")  # Megatron's converted checkpoints
    os.utime(ckpt / "latest_checkpointed_iteration.txt", (1, 2))
    tracker.poll()
    assert tracker.report()["ckpt"] == 1500


# The new worker group has joined its rendezvous: NVRx 0.4.1's c10d record, and 0.6's barrier record.
JOINED = f"[2026-12-05 18:01:55,896] [INFO] [ft_launcher{PID}@vm] The node 'localhost_{PID}_0' has joined round 1 " \
         "of the rendezvous 'job' as rank 0 in a world of size 1."
JOINED06 = "2026-12-05 18:01:38,044 [INFO] [vm] [workload:?(?) infra:?(?)] ft_rendezvous_barrier.py:2235 The node " \
           "'localhost_1034_0' has joined the rendezvous 'job' as rank 0 in a world of size 1."


@pytest.mark.parametrize("joined", [JOINED, JOINED06])
def test_a_script_that_reports_no_steps_has_its_launcher_restarts_counted(tmp_path: Path, joined: str) -> None:
    """Issue 28: a script without rtj_worker.progress never shows its next run's first step, so its
    launcher's restart stayed `recovering` for ever and LAUNCHER showed 0, through a crash loop too."""
    pod = Pod(tmp_path)
    pod.line(joined)  # the first group: nothing to count
    assert pod.report()["restarts"] == {"InProcess": 0, "Launcher": 0} and pod.report()["state"] == "Waiting"
    for restart in (1, 2):
        pod.clock.now += 30
        fault_at = pod.clock.now
        pod.line(KILLED.replace("exitcode: -9", "exitcode: 3"))
        pod.line(UNHEALTHY)
        assert pod.report()["state"] == "Recovering" and pod.report()["recovering"]["tier"] == "Launcher"
        pod.clock.now += 2.5
        pod.line(joined)
        report = pod.report()
        assert report["restarts"] == {"InProcess": 0, "Launcher": restart} and "recovering" not in report
        assert report["causes"] == {"Launcher/RankExited": restart} and report["state"] == "Waiting"
        assert report["last"]["seconds"] == pytest.approx(pod.clock.now - fault_at)
        assert "rolledBack" not in report["last"]  # no step is known: none is claimed


def test_a_script_that_reports_steps_is_counted_at_its_first_step_not_at_the_rendezvous(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    pod.start()
    pod.steps(1, 25)
    pod.line(KILLED)
    pod.line(UNHEALTHY)
    pod.clock.now += 3
    pod.line(JOINED)
    assert pod.report()["restarts"]["Launcher"] == 0 and pod.report()["recovering"]["tier"] == "Launcher"
    pod.clock.now += 5  # imports, process groups, the checkpoint load
    pod.start(step=20)
    pod.steps(21, 21)
    report = pod.report()
    assert report["restarts"]["Launcher"] == 1 and report["last"]["rolledBack"] == 5


def test_a_respawn_that_fails_before_its_first_step_is_a_restart_of_its_own(tmp_path: Path) -> None:
    """A launcher restart whose new ranks failed again before their first step (seen with real gloo under
    load: the respawned rank aborted in its process-group setup) is one more respawn of the launcher, with
    its own cause: the pod counts as many as the launcher's records say, where the second used to replace
    the first, still pending, and one went uncounted."""
    pod = Pod(tmp_path)
    pod.start()
    pod.steps(1, 25)
    pod.line(KILLED.replace("exitcode: -9", "exitcode: 3"))
    pod.line(UNHEALTHY)
    pod.clock.now += 3
    pod.line(JOINED)
    pod.start(step=20)  # new processes, no step yet
    pod.clock.now += 4
    second_at = pod.clock.now
    pod.line(KILLED.replace("exitcode: -9", "exitcode: -6"))
    pod.line(FAILED)
    assert pod.report()["restarts"]["Launcher"] == 1 and pod.report()["recovering"]["cause"] == "RankKilled"
    pod.clock.now += 3
    pod.line(JOINED)
    pod.start(step=20)
    pod.steps(21, 21)
    report = pod.report()
    assert report["restarts"] == {"InProcess": 0, "Launcher": 2}
    assert report["causes"] == {"Launcher/RankExited": 1, "Launcher/RankKilled": 1}
    assert report["last"]["cause"] == "RankKilled" and report["last"]["at"] == pytest.approx(second_at, abs=0.01)
    assert report["last"]["rolledBack"] == 5  # the step before the first fault, back to the checkpoint's 20


def test_a_script_that_reports_no_steps_says_started_once_its_ranks_stayed_up(tmp_path: Path) -> None:
    """What the operator shows Running on (policies/phase.ranks_started): a worker group up STARTED_SECONDS
    without a failure, for a script that reports no steps; a command that fails at start never says it."""
    pod = Pod(tmp_path)
    pod.line(JOINED)
    pod.clock.now += STARTED_SECONDS - 1
    assert pod.report()["state"] == "Waiting"
    pod.line(KILLED.replace("exitcode: -9", "exitcode: 1"))  # the typo, just before
    pod.line(UNHEALTHY)
    pod.clock.now += 5
    assert pod.report()["state"] == "Recovering"
    pod.line(JOINED)
    pod.clock.now += STARTED_SECONDS - 1
    assert pod.report()["state"] == "Waiting"  # the clock runs from the new group's rendezvous
    pod.clock.now += 1
    assert pod.report()["state"] == "Started"
    pod.line(PEER)  # a peer restarted the rendezvous: not started again until the next group stays up
    pod.clock.now += STARTED_SECONDS
    assert pod.report()["state"] == "Recovering"


def test_a_script_that_reports_steps_is_training_at_its_first_step(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    pod.line(JOINED)
    pod.clock.now += 3
    pod.start()
    pod.steps(1, 1)
    assert pod.report()["state"] == "Training"
    pod.clock.now += STARTED_SECONDS
    assert pod.report()["state"] == "Training"


def test_a_rendezvous_after_a_peers_restart_counts_nothing_here(tmp_path: Path) -> None:
    pod = Pod(tmp_path)
    pod.line(JOINED)
    pod.line(PEER)
    pod.line(JOINED)
    assert pod.report()["restarts"] == {"InProcess": 0, "Launcher": 0}


@pytest.mark.parametrize("files, reported, expect", [
    ({}, None, 0),
    ({}, 30, 30),  # a script on the progress library: its own commits
    ({"latest_checkpointed_iteration.txt": "40\n"}, 30, 40),  # Megatron-style, newer
    ({"latest_checkpointed_iteration.txt": "20\n"}, "30", 20),  # a report that is not a step: ignored
])
def test_the_exit_report_names_the_newest_step_any_way_the_script_said_it(tmp_path, files, reported, expect):
    from rtj_worker import entrypoint

    for name, text in files.items():
        (tmp_path / name).write_text(text)
    progress = {"v": 1, "ckpt": reported} if reported is not None else None
    entrypoint.write_termination(0, "done", str(tmp_path), str(tmp_path / "termination-log"), progress=progress)
    assert json.loads((tmp_path / "termination-log").read_text())["checkpointStep"] == expect
