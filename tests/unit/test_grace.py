"""The pods' grace period from measurements (policies/grace.py, issue 27.2): the shortest grace whose stop
leaves the ranks the measured save and a quarter more, applied at a new gang, never a reason for one."""

from __future__ import annotations

import copy

import pytest
from test_reconcile_table import NOW, W, owned

from rtj_operator import api
from rtj_operator.actions import CREATE, DELETE
from rtj_operator.policies import grace
from rtj_worker.launch import stop_bounds


@pytest.mark.parametrize("save, expected", [
    (0.0, 120),  # nothing measured: the default
    (70.0, 120),  # fits the default's 90 s with its margin (87.5 s)
    (73.0, 122),  # 91.25 s wanted: 2 s more than the default
    (321.0, 432),  # 96 GB at 300 MB/s and a 1 s step
    (10_000_000.0, 86400),  # capped at the field's maximum
])
def test_the_grace_is_the_shortest_that_fits_the_save_with_a_margin(save, expected):
    seconds = grace.grace_for(save)
    assert seconds == expected
    if grace.DEFAULT_SECONDS < seconds < grace.MAX_SECONDS:
        assert stop_bounds(seconds)[0] >= save * grace.MARGIN > stop_bounds(seconds - 1)[0]


def _measured(w: W, write: float = 320.0, step: float = 1.0) -> W:
    return w.status(progress={"step": 100, "checkpointWriteSeconds": write, "stepSeconds": step})


def _new_gang(**spec) -> tuple[W, object]:
    """The old gang gone and attempt 2 due: the pass creates its Job."""
    w = _measured(W(**spec)).status(attempt=2).coordinator(2)
    w.world.job, w.world.pods = None, []
    intent = w.run()
    return w, intent


def _job(intent) -> dict:
    return next(a.body for a in intent.actions if (a.verb, a.kind) == (CREATE, "Job"))


def _grace(job: dict) -> tuple[int, str]:
    pod = job["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    return pod["terminationGracePeriodSeconds"], env["RTJ_GRACE_SECONDS"]


def test_a_new_gang_gets_the_grace_its_measured_save_needs_and_keeps_it():
    w, intent = _new_gang()
    job = _job(intent)
    assert _grace(job) == (432, "432") and job["metadata"]["annotations"][api.ANNOTATION_GRACE] == "432"
    assert intent.status.stop_grace == {"appliedSeconds": 432, "source": "Measured", "saveSeconds": 321.0,
                                        "suggestedSeconds": 432}
    # The next passes read that Job back: its template is the one they build, whatever is measured now.
    w.world.job = owned(copy.deepcopy(job), w.body, "job-uid-2")
    w.body["status"] = intent.status.to_dict()
    _measured(w, write=30.0)
    later = w.run(NOW)
    assert later.status.attempt == 2 and not [a for a in later.actions if (a.verb, a.kind) == (DELETE, "Job")]
    assert later.status.stop_grace == {"appliedSeconds": 432, "source": "Measured", "saveSeconds": 31.0,
                                       "suggestedSeconds": 120}


def test_a_grace_the_spec_sets_is_used_as_it_is():
    _, intent = _new_gang(resiliency={"terminationGracePeriodSeconds": 200})
    job = _job(intent)
    assert _grace(job) == (200, "200") and api.ANNOTATION_GRACE not in job["metadata"]["annotations"]
    assert intent.status.stop_grace["appliedSeconds"] == 200 and intent.status.stop_grace["source"] == "Spec"


def test_a_measurement_never_restarts_the_running_gang():
    """The running gang was built with the default: a slow save is reported (StopGraceTooShort, with what the
    next gang gets: test_progress), not acted on by replacing the Job."""
    w = _measured(W())
    intent = w.run()
    assert intent.status.attempt == 1 and not [a for a in intent.actions if a.kind == "Job"]
    assert intent.status.stop_grace["appliedSeconds"] == 120 and intent.status.stop_grace["source"] == "Default"
