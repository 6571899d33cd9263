"""The checkpoint interval from measurements (policies/interval.py): Young-Daly beside the configured one,
applied only to a new gang, and never seen as a change of the running gang's template."""

from __future__ import annotations

import pytest
from test_progress import report, reporting
from test_reconcile_table import NOW, W, pod, verbs

from rtj_operator.actions import CREATE
from rtj_operator.policies import interval


@pytest.mark.parametrize(("args", "expected"), [
    # (configured, stall, failures, wall, step seconds, write seconds)
    ((100, None, 0, 600.0, 1.0, None), {"configuredSteps": 100, "failures": 0}),  # nothing measured yet
    ((100, 10.0, 0, 600.0, 1.0, None), {"configuredSteps": 100, "failures": 0, "saveStallSeconds": 10.0}),
    # 10 s stall, one failure an hour: sqrt(2 x 10 x 3600) = 268.3 s = 268 steps of 1 s
    ((100, 10.0, 1, 3600.0, 1.0, None), {"configuredSteps": 100, "failures": 1, "saveStallSeconds": 10.0,
                                         "meanSecondsBetweenFailures": 3600.0, "suggestedSeconds": 268.3,
                                         "suggestedSteps": 268}),
    # a save that takes 400 s to write: a shorter interval would only skip saves
    ((100, 10.0, 1, 3600.0, 1.0, 400.0), {"configuredSteps": 100, "failures": 1, "saveStallSeconds": 10.0,
                                          "meanSecondsBetweenFailures": 3600.0, "suggestedSeconds": 268.3,
                                          "suggestedSteps": 400}),
    # failures every 2 minutes and a 0.2 s stall: every 7 s, 14 steps of 0.5 s
    ((100, 0.2, 5, 600.0, 0.5, None), {"configuredSteps": 100, "failures": 5, "saveStallSeconds": 0.2,
                                       "meanSecondsBetweenFailures": 120.0, "suggestedSeconds": 6.9,
                                       "suggestedSteps": 14}),
], ids=["nothing", "no-failure", "hourly", "slow-write", "stormy"])
def test_suggest(args, expected):
    assert interval.suggest(*args) == expected


def young_daly(w: W) -> W:
    w.body["spec"]["checkpoint"] = {"intervalSteps": 100, "intervalPolicy": "YoungDaly"}
    return w


def interval_env(job: dict) -> str:
    env = job["spec"]["template"]["spec"]["containers"][0]["env"]
    return next(e["value"] for e in env if e["name"] == "RTJ_CHECKPOINT_INTERVAL")


@pytest.mark.parametrize(("policy", "steps"), [("YoungDaly", "268"), ("Fixed", "100")])
def test_a_new_gang_gets_the_suggested_interval_only_under_young_daly_and_status_records_it(policy, steps):
    w = W(children=True)
    w.body["spec"]["checkpoint"] = {"intervalSteps": 100, "intervalPolicy": policy}
    w.world.job, w.world.pods, w.world.coordinator = None, [], None
    w.status(attempt=2, checkpointInterval={"configuredSteps": 100, "suggestedSteps": 268, "appliedSteps": 100})
    intent = w.run()
    job = next(a.body for a in intent.actions if (a.verb, a.kind) == (CREATE, "Job"))
    assert interval_env(job) == steps
    assert intent.status.checkpoint_interval["appliedSteps"] == int(steps)


def test_the_running_gang_keeps_its_interval_when_the_suggestion_moves():
    w = young_daly(W())
    from test_reconcile_table import owned

    from rtj_operator.builders import build_job
    from rtj_operator.spec import RTJ

    w.world.job = owned(build_job(RTJ.from_body(w.body), 1, 268), w.body, "job-uid")
    # The status lost what the gang was built with (its write refused after the create): the Job says it.
    w.status(checkpointInterval={"configuredSteps": 100, "suggestedSteps": 300, "appliedSteps": 100})
    intent = w.run()
    assert intent.status.attempt == 1 and "RecreatingGang" not in [e.reason for e in intent.events]
    assert (CREATE, "Job") not in verbs(intent)
    assert intent.status.checkpoint_interval["appliedSteps"] == 268
    assert interval_env(w.world.job) == "268"


def test_the_status_shows_the_measured_stall_and_failures_beside_the_configured_interval():
    w = young_daly(W())
    w.world.pods = [reporting(pod(0), report(leader=True, saveStallSeconds=2.0, stepSeconds=0.5)),
                    reporting(pod(1), report(saveStallSeconds=3.0, stepSeconds=0.5))]
    w.status(restarts=2, restartsByTier={"InProcess": 2, "Launcher": 0, "ReplacePod": 0, "GangRestart": 0})
    got = w.run(NOW).status.checkpoint_interval
    assert got["policy"] == "YoungDaly" and got["configuredSteps"] == 100
    assert got["saveStallSeconds"] == 3.0 and got["failures"] == 2  # the slowest pod's stall
    wall = got["meanSecondsBetweenFailures"] * 2
    assert wall == pytest.approx(600 - 1, abs=2)  # startTime 600 s ago, the newest report 1 s ago
    assert got["suggestedSteps"] == round((2 * 3.0 * wall / 2) ** 0.5 / 0.5)
