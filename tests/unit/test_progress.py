"""The pods' reports folded into the RTJ's status (progress.py), through reconcile() as a pure function:
in-pod recoveries counted once across passes and replaced pods, the newest recovery, live progress and
checkpoint, goodput, rate-limited events, and reports that are malformed or not the current Job's."""

from __future__ import annotations

import datetime
import json
from typing import Any

import pytest
from test_reconcile_table import NOW, W, pod, reasons, ts

from rtj_operator import progress
from rtj_operator.world import World

T = NOW.timestamp()


def report(step: int = 100, at: float = -1.0, **fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"v": 1, "state": "Training", "step": step, "stepAt": T + at, "stepSeconds": 0.5,
                            "ckpt": 90, "ckptAt": T - 20, "leader": False, "resumed": 0, "inLoopSeconds": 0.0,
                            "restarts": {"InProcess": 0, "Launcher": 0}, "causes": {}, "at": T + at}
    data.update(fields)
    return data


def reporting(p: dict[str, Any], data: dict[str, Any] | str) -> dict[str, Any]:
    message = data if isinstance(data, str) else json.dumps(data)
    p["status"]["conditions"].append({"type": progress.CONDITION, "status": "True", "reason": "Training",
                                      "message": message})
    return p


def in_process(n: int, at: float = -15.0, seconds: float = 11.0) -> dict[str, Any]:
    return {"restarts": {"InProcess": n, "Launcher": 0}, "causes": {"InProcess/InjectedFault": n},
            "last": {"tier": "InProcess", "cause": "InjectedFault", "detail": "injected at step 95", "at": T + at,
                     "seconds": seconds, "rolledBack": 5}}


def world(*reports: dict[str, Any] | str | None, **status: Any) -> W:
    w = W(pods=len(reports))
    w.world.pods = [reporting(pod(i), r) if r is not None else pod(i) for i, r in enumerate(reports)]
    w.status(**status)
    return w


def again(w: W, intent: Any, now: datetime.datetime = NOW) -> Any:
    w.body["status"] = intent.status.to_dict()
    return w.run(now)


def test_an_in_pod_recovery_is_counted_once_with_its_cause_and_one_event():
    w = world(report(leader=True, inLoopSeconds=300.0), report(**in_process(1)))
    intent = w.run()
    st = intent.status
    assert st.restarts_by_tier == {"InProcess": 1, "Launcher": 0, "ReplacePod": 0, "GangRestart": 0}
    assert st.restarts == 1 and st.job_restarts == 0 and st.disruptions == 0  # no budget of the operator's
    assert st.restart_counts == [{"tier": "InProcess", "reason": "InjectedFault", "charged": "job", "count": 1}]
    assert st.last_recovery == {"tier": "InProcess", "reason": "InjectedFault", "message": "injected at step 95",
                                "seconds": 11.0, "stepsRolledBack": 5, "time": ts(15), "pod": "train-1-x1"}
    event = next(e for e in intent.events if e.reason == "InProcessRestart")
    assert "1 in-process restart (total 1)" in event.message and "InjectedFault on pod train-1-x1" in event.message
    assert "recovered in 11.0s, 5 steps rolled back" in event.message
    later = again(w, intent, NOW + datetime.timedelta(seconds=120))
    assert later.status.restarts_by_tier["InProcess"] == 1 and "InProcessRestart" not in reasons(later)


def test_the_metrics_of_a_recovery_observe_its_own_seconds():
    """The metrics run after the pass: a closure over a name the pass rebinds observed None (TypeError,
    the pass retried, seen in the e2e run)."""
    from prometheus_client import REGISTRY

    w = world(report(leader=True, inLoopSeconds=300.0), report(**in_process(1)))
    labels = {"tier": "InProcess"}
    before = REGISTRY.get_sample_value("rtj_recovery_seconds_sum", labels) or 0.0
    for record in w.run().metrics:
        record()
    assert REGISTRY.get_sample_value("rtj_recovery_seconds_sum", labels) == pytest.approx(before + 11.0)


def test_a_replaced_pods_counts_stay_and_its_successor_counts_from_zero():
    w = world(report(leader=True), report(**in_process(2)))
    first = w.run()
    assert first.status.restarts_by_tier["InProcess"] == 2 and "pod-1-1" in first.status.recovery.reports
    replacement = reporting(pod(1, attempt=2), report(**in_process(1, at=-2.0)))
    w.world.pods = [w.world.pods[0], replacement]
    second = again(w, first, NOW + datetime.timedelta(seconds=60))
    assert second.status.restarts_by_tier["InProcess"] == 3
    assert set(second.status.recovery.reports) == {"pod-1-2"}  # only listed pods are kept
    assert second.status.restart_counts[0]["count"] == 3


def test_in_pod_events_are_rate_limited_and_say_how_many_they_stand_for():
    w = world(report(leader=True), report(**in_process(1)))
    first = w.run()
    w.world.pods[1] = reporting(pod(1), report(**in_process(3, at=-1.0, seconds=4.0)))
    soon = again(w, first, NOW + datetime.timedelta(seconds=10))
    assert soon.status.restarts_by_tier["InProcess"] == 3 and "InProcessRestart" not in reasons(soon)
    assert soon.requeue.seconds <= 20.5  # due 30 s after the last one
    later = again(w, soon, NOW + datetime.timedelta(seconds=31))
    event = next(e for e in later.events if e.reason == "InProcessRestart")
    assert event.message.startswith(f"2 in-process restarts since {ts(0)} (total 3)")


def test_a_launcher_restart_is_its_own_tier():
    last = {"tier": "Launcher", "cause": "RankKilled", "detail": "local rank 1 (pid 9) killed by SIGKILL",
            "at": T - 30, "seconds": 8.0, "rolledBack": 5}
    w = world(report(leader=True), report(restarts={"InProcess": 0, "Launcher": 1},
                                          causes={"Launcher/RankKilled": 1}, last=last))
    intent = w.run()
    assert intent.status.restarts_by_tier["Launcher"] == 1 and reasons(intent).count("LauncherRestart") == 1
    assert intent.status.last_recovery["reason"] == "RankKilled"


def test_live_progress_checkpoint_and_goodput_from_the_newest_report():
    w = world(report(step=120, at=-1.0, leader=True, inLoopSeconds=480.0, ckpt=100, ckptAt=T - 5),
              report(step=110, at=-30.0), startTime=ts(600))
    st = w.run().status
    assert st.progress["step"] == 120 and st.progress["stepSeconds"] == 0.5 and st.progress["trainingPods"] == 2
    assert st.last_checkpoint_step == 100 and st.progress["checkpointStep"] == 100  # CKPT-STEP, live
    assert st.progress["checkpointAgeSeconds"] == pytest.approx(5, abs=1)
    assert st.goodput["training"] == pytest.approx(120 * 0.5 / 600, abs=1e-3)
    assert st.goodput["infrastructure"] == pytest.approx(480 / 600, abs=1e-3)
    assert st.goodput["startStep"] == 0


def test_a_waiting_spares_report_never_stands_for_the_jobs_progress():
    """Issue 30.8: a hot spare reports while it waits (step 0, no step time), often the newest report."""
    standby = {"v": 1, "state": "Waiting", "step": 0, "leader": False, "inLoopSeconds": 0.0,
               "restarts": {"InProcess": 0, "Launcher": 0}, "causes": {}, "at": T}
    w = world(report(step=120, at=-3.0, leader=True, inLoopSeconds=480.0), report(step=120, at=-2.0), standby,
              startTime=ts(600))
    st = w.run().status
    assert st.progress["step"] == 120 and st.progress["trainingPods"] == 2 and st.progress["reportingPods"] == 3
    assert st.goodput["training"] == pytest.approx(120 * 0.5 / 600, abs=1e-3)


def test_a_checkpoints_write_time_is_reported_and_a_stop_that_cannot_fit_it_is_said_once():
    """Issue 27.2: a stop (drain, spot reclaim, suspend) leaves the ranks the grace period less 30 s to
    save (rtj_worker.launch.stop_bounds); 96 GB at 300 MB/s takes about 320 s."""
    w = world(report(leader=True, ckpt=100, ckptAt=T - 5, ckptSeconds=70.04),
              report(ckpt=100, ckptAt=T - 5, ckptSeconds=95.0))
    intent = w.run()
    assert intent.status.progress["checkpointWriteSeconds"] == 95.0  # the slowest pod's
    assert reasons(intent).count("StopGraceTooShort") == 1  # 95 + a 0.5 s step > 120 - 30
    message = next(e.message for e in intent.events if e.reason == "StopGraceTooShort")
    assert "took 95 s to write" in message and "leaves the ranks 90 s" in message
    # The spec leaves the grace unset: the next gang gets one that fits (policies/grace.py).
    assert "the next gang gets 150 s" in message
    assert "StopGraceTooShort" not in reasons(again(w, intent))  # said once, not at every pass
    roomy = world(report(ckpt=100, ckptAt=T - 5, ckptSeconds=95.0))
    roomy.body["spec"]["resiliency"] = {"terminationGracePeriodSeconds": 300}
    assert "StopGraceTooShort" not in reasons(roomy.run())
    tight = world(report(ckpt=100, ckptAt=T - 5, ckptSeconds=95.0))
    tight.body["spec"]["resiliency"] = {"terminationGracePeriodSeconds": 100}
    message = next(e.message for e in tight.run().events if e.reason == "StopGraceTooShort")
    assert "raise spec.resiliency.terminationGracePeriodSeconds" in message  # the spec's value: the user's to change


def test_a_lost_leaders_run_is_counted_to_where_the_others_say_it_ended():
    """Issue 30.8 (node-0 loss): only the leader's pod counts in-loop time, every 15 s, and a lost node's pod
    never reports again. The others trained with it until the run broke: their newest step of that run, 12 s
    after the leader's last report, is where its in-loop time ended."""
    w = world(report(step=100, at=-20.0, leader=True, inLoopSeconds=300.0), report(step=100, at=-20.0),
              startTime=ts(600))
    counted = w.run()
    assert counted.status.goodput["inLoopSeconds"] == 300.0
    # The leader's node is lost: its pod failed (by the operator, once fenced) with no report of its own; the
    # other pod's run broke 12 s after the leader's last report (step 124), and it waits for a new run.
    w.world.pods[0]["status"]["phase"] = "Failed"
    w.world.pods[1]["status"]["conditions"] = []
    reporting(w.world.pods[1], report(step=124, at=-8.0, state="Recovering", runSince=T - 400))
    closed = again(w, counted)
    assert closed.status.goodput["inLoopSeconds"] == 312.0
    assert again(w, closed).status.goodput["inLoopSeconds"] == 312.0  # once
    # The other pod's report of the break may come after the leader's pod is gone (CI: the operator failed
    # the pod at once, the survivor reported a second later): the gap waits for it.
    late = world(report(step=100, at=-20.0, leader=True, inLoopSeconds=300.0), report(step=100, at=-20.0),
                 startTime=ts(600))
    first = late.run()
    del late.world.pods[0]
    waiting = again(late, first)
    assert waiting.status.goodput["inLoopSeconds"] == 300.0 and waiting.status.recovery.leader_gap == T - 20.0
    late.world.pods[0]["status"]["conditions"] = []
    reporting(late.world.pods[0], report(step=124, at=-8.0, state="Recovering"))
    filled = again(late, waiting)
    assert filled.status.goodput["inLoopSeconds"] == 312.0
    # A new leader's run counts from here on: the gap is closed.
    late.world.pods[0]["status"]["conditions"] = []
    reporting(late.world.pods[0], report(step=130, at=-1.0, leader=True, inLoopSeconds=4.0, runSince=T - 5))
    after = again(late, filled)
    assert after.status.recovery.leader_gap is None and after.status.goodput["inLoopSeconds"] == 316.0
    # A step of a run that began after the leader's last report is no evidence: nothing added.
    fresh = world(report(step=100, at=-20.0, leader=True, inLoopSeconds=300.0), report(step=100, at=-20.0),
                  startTime=ts(600))
    first = fresh.run()
    fresh.world.pods[0]["status"]["phase"] = "Failed"
    fresh.world.pods[1]["status"]["conditions"] = []
    reporting(fresh.world.pods[1], report(step=104, at=-2.0, runSince=T - 10))
    assert again(fresh, first).status.goodput["inLoopSeconds"] == 300.0


def test_steps_alone_are_written_at_most_every_10_seconds():
    w = world(report(step=100, leader=True, inLoopSeconds=50.0), report(step=100))
    first = w.run()
    w.world.pods[1] = reporting(pod(1), report(step=104, at=3.0))  # another pod's newer step, nothing counted
    soon = again(w, first, NOW + datetime.timedelta(seconds=4))
    assert soon.status.progress == first.status.progress  # held back: no status write for it
    assert soon.requeue.seconds <= 6.5
    later = again(w, soon, NOW + datetime.timedelta(seconds=11))
    assert later.status.progress["step"] == 104


def test_reports_from_pods_of_another_job_are_not_read():
    w = world(report(leader=True))
    stranger = reporting(pod(5), report(**in_process(7)))
    stranger["metadata"]["ownerReferences"] = [{"uid": "another-job", "kind": "Job", "name": "x"}]
    mine = World.assemble(w.body, w.world.service, [w.world.job], w.world.pvc,
                          [*w.world.pods, stranger, w.world.coordinator], lambda n: w.world.nodes.get("n0"))
    w.world = mine
    assert w.run().status.restarts_by_tier["InProcess"] == 0


@pytest.mark.parametrize("garbage", [
    "not json", "[]", json.dumps({"v": 2, "step": 5}),
    json.dumps(report(step=-5, restarts={"InProcess": "many"}, causes={"x": 1, "InProcess/" + "A" * 500: True})),
    json.dumps(report(restarts={"InProcess": 10**20}, last={"tier": "Operator", "at": "now"}, stepSeconds=-1)),
])
def test_a_malformed_report_counts_nothing(garbage: str):
    st = world(garbage, report()).run().status
    assert st.restarts == 0 and st.last_recovery is None


def test_the_termination_message_is_the_final_report():
    p = pod(1, phase="Succeeded", code=0)
    p["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = json.dumps(
        {"exitCode": 0, "reason": "training finished", "checkpointStep": 200, "progress": report(**in_process(2))})
    reporting(p, report(**in_process(1)))  # the condition, older
    assert progress.pod_report(p).restarts["InProcess"] == 2


def test_a_finished_jobs_pods_are_counted_from_their_termination_messages():
    """Pods without a token publish nothing live: the final reports still reach the status."""
    w = world(None, None)
    for i in range(len(w.world.pods)):
        done = pod(i, phase="Succeeded", code=0)
        final = report(step=200, ckpt=200, leader=i == 0, inLoopSeconds=500.0 if i == 0 else 0.0,
                       **(in_process(1) if i == 1 else {}))
        done["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = json.dumps(
            {"exitCode": 0, "reason": "training finished", "checkpointStep": 200, "progress": final})
        w.world.pods[i] = done
    w.world.job["status"] = {"succeeded": 2, "conditions": [{"type": "Complete", "status": "True"}]}
    st = w.run().status
    assert st.phase == "Succeeded"
    assert st.restarts_by_tier == {"InProcess": 1, "Launcher": 0, "ReplacePod": 0, "GangRestart": 0}
    assert st.progress["step"] == 200 and st.last_checkpoint_step == 200
    assert st.goodput["infrastructure"] == pytest.approx(500 / 600, abs=0.01)


def replacing_a_pod() -> W:
    """The operator replaced a pod lost at step 128 (40 s ago); both pods reported before the fault."""
    return world(report(step=130, leader=True, runSince=T - 500), report(step=130, resumed=120, runSince=T - 500),
                 startTime=ts(600), restartStartedTime=ts(40), restarts=1, disruptions=1,
                 restartsByTier={"InProcess": 0, "Launcher": 0, "ReplacePod": 1, "GangRestart": 0},
                 lastFailureReason="NodeLost", lastFailureMessage="node n1 lost",
                 conditions=[{"type": "Restarting", "status": "True", "reason": "ReplacePod", "message": "",
                              "lastTransitionTime": ts(40)}],
                 recovery={"stepAtFault": 128})


def test_an_operator_recovery_learns_its_rolled_back_steps_from_the_new_pods():
    w = replacing_a_pod()
    intent = w.run()
    last = intent.status.last_recovery
    assert last["tier"] == "ReplacePod" and last["reason"] == "NodeLost" and last["seconds"] == 40
    assert "stepsRolledBack" not in last  # no pod has reported since the recovery began
    w.world.pods[1] = reporting(pod(1), report(step=121, resumed=120, at=2.0, runSince=T - 10))
    later = again(w, intent, NOW + datetime.timedelta(seconds=5))
    assert later.status.last_recovery["stepsRolledBack"] == 8


def test_restart_counts_stay_bounded():
    from rtj_operator.status import Status

    st = Status()
    for i in range(100):
        progress.count_restart(st, "InProcess", f"Cause{i}", "job")
    assert len(st.restart_counts) <= progress.MAX_RESTART_COUNTS
    assert sum(e["count"] for e in st.restart_counts) == 100
    assert any(e["reason"] == "Other" for e in st.restart_counts)


def test_where_a_recovery_restored_its_state_from_and_the_copies_held_reach_the_status():
    """Issue 31: the pods say where each run's state came from (memory, node, peer, volume) and what a
    rank holds off the volume; the status and the event carry both."""
    last = {**in_process(1)["last"], "restoredFrom": "memory", "restoreSeconds": 0.4}
    copies = {"memoryBytes": 2048, "nodeBytes": 1100, "peerBytes": 1100, "skipped": ""}
    w = world(report(leader=True, copies=copies), report(**{**in_process(1), "last": last}))
    intent = w.run()
    assert intent.status.last_recovery["restoredFrom"] == "memory"
    assert intent.status.last_recovery["restoreSeconds"] == 0.4
    assert intent.status.progress["stateCopies"] == {"memoryBytesPerRank": 2048, "nodeBytesPerRank": 1100,
                                                      "peerBytesPerRank": 1100, "skipped": ""}
    event = next(e for e in intent.events if e.reason == "InProcessRestart")
    assert "state from memory in 0.4s" in event.message


@pytest.mark.parametrize("source", ["disk", 3, None])
def test_a_source_that_is_not_one_of_the_tiers_is_left_out(source):
    last = {**in_process(1)["last"], "restoredFrom": source, "restoreSeconds": 0.4}
    intent = world(report(**{**in_process(1), "last": last})).run()
    assert "restoredFrom" not in intent.status.last_recovery and "restoreSeconds" not in intent.status.last_recovery


def test_an_operator_recovery_learns_where_the_new_pods_restored_from_their_slowest():
    w = replacing_a_pod()
    intent = w.run()
    w.world.pods[0] = reporting(pod(0), report(step=121, resumed=120, at=2.0, runSince=T - 10, leader=True,
                                               restoredFrom="node", restoreSeconds=0.2))
    w.world.pods[1] = reporting(pod(1), report(step=121, resumed=120, at=2.0, runSince=T - 10,
                                               restoredFrom="peer", restoreSeconds=1.5))
    last = again(w, intent, NOW + datetime.timedelta(seconds=5)).status.last_recovery
    assert (last["restoredFrom"], last["restoreSeconds"], last["stepsRolledBack"]) == ("peer", 1.5, 8)


def _reported(data: dict[str, Any] | str, rv: int = 10, reason: str = "Training", **pod_changes: Any) -> dict[str, Any]:
    p = reporting(pod(0, "Running"), data)
    p["metadata"]["resourceVersion"] = str(rv)
    p["status"]["conditions"][-1]["reason"] = reason
    for key, value in pod_changes.items():
        p["status"][key] = value
    return p


@pytest.mark.parametrize("after, refresh", [
    # the step, the checkpoint and their times moved on: a refresh (woken at most every PROGRESS_SECONDS)
    (_reported(report(step=140, at=0.0, ckpt=130, ckptAt=T, inLoopSeconds=20.0), rv=11), True),
    # an in-job recovery counted: at the pace of events
    (_reported(report(**in_process(1)), rv=11), False),
    # recovering now (the worker's urgent write)
    (_reported(report(recovering={"tier": "Launcher", "cause": "Crash", "at": T}), rv=11), False),
    # the state changed
    (_reported(report(step=140, state="Finished"), rv=11, reason="Finished"), False),
    # something else of the pod changed with it (here its phase)
    (_reported(report(step=140), rv=11, phase="Failed"), False),
    # a report that cannot be read
    (_reported("not json", rv=11), False),
])
def test_a_report_that_only_moves_the_step_on_is_a_refresh(after: dict[str, Any], refresh: bool):
    assert progress.refresh_only(_reported(report(step=100)), after) is refresh


def test_a_first_report_is_not_a_refresh():
    assert not progress.refresh_only(pod(0, "Running"), _reported(report()))
