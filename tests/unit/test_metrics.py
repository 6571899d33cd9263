"""Per-job Prometheus series (metrics.py): from the status as written, labelled by namespace and name
only, computed at scrape time, and gone with the RTJ."""

from __future__ import annotations

import re
import time

import pytest
from prometheus_client import REGISTRY, generate_latest

from rtj_operator import ladder, metrics

STATUS = {
    "phase": "Running", "nodesReady": 2, "nodesDesired": 2, "jobRestarts": 1, "disruptions": 4,
    "restartCounts": [{"tier": "InProcess", "reason": "RuntimeError", "charged": "job", "count": 5},
                      {"tier": "ReplacePod", "reason": "NodeLost", "charged": "platform", "count": 2}],
    "lastRecovery": {"tier": "Launcher", "reason": "RankKilled", "seconds": 12.5, "stepsRolledBack": 7,
                     "time": "2026-12-03T10:00:00Z"},
    "lastCheckpointStep": 400, "lastCheckpointTime": "2026-12-03T10:00:00Z",
    "progress": {"step": 420, "stepTime": "2026-12-03T10:00:20Z", "stepSeconds": 0.5},
    "goodput": {"training": 0.8, "infrastructure": 0.9},
}
SPEC = {"restartBudget": {"maxRestarts": 3, "maxDisruptions": 10, "maxRestartsWithoutProgress": 2},
        "checkpoint": {"intervalSteps": 200}}
JOB = {"namespace": "team-a", "name": "llama"}
T = 1796292000.0  # 2026-12-03T10:00:00Z


@pytest.fixture
def job():
    metrics.record_job("team-a", "llama", STATUS, SPEC)
    yield
    metrics.forget("team-a", "llama")


@pytest.mark.parametrize("name, labels, value", [
    ("rtj_job_phase", {"phase": "Running"}, 1.0),
    ("rtj_job_phase", {"phase": "Restarting"}, 0.0),
    ("rtj_job_nodes_ready", {}, 2.0),
    ("rtj_job_nodes_desired", {}, 2.0),
    ("rtj_job_restarts_total", {"tier": "InProcess", "reason": "RuntimeError", "charged": "job"}, 5.0),
    ("rtj_job_restarts_total", {"tier": "ReplacePod", "reason": "NodeLost", "charged": "platform"}, 2.0),
    ("rtj_job_last_recovery_seconds", {"tier": "Launcher"}, 12.5),
    ("rtj_job_last_recovery_steps_rolled_back", {"tier": "Launcher"}, 7.0),
    ("rtj_job_budget_remaining", {"budget": "maxRestarts"}, 2.0),
    ("rtj_job_budget_remaining", {"budget": "maxDisruptions"}, 6.0),
    ("rtj_job_budget_remaining", {"budget": "maxRestartsWithoutProgress"}, 2.0),
    ("rtj_job_checkpoint_step", {}, 400.0),
    ("rtj_job_checkpoint_timestamp_seconds", {}, T),
    ("rtj_job_checkpoint_interval_seconds", {}, 100.0),
    ("rtj_job_step", {}, 420.0),
    ("rtj_job_step_timestamp_seconds", {}, T + 20),
    ("rtj_job_step_seconds", {}, 0.5),
    ("rtj_job_goodput_ratio", {"kind": "training"}, 0.8),
    ("rtj_job_goodput_ratio", {"kind": "infrastructure"}, 0.9),
])
def test_a_jobs_series_come_from_its_status(job, name, labels, value):
    assert REGISTRY.get_sample_value(name, {**JOB, **labels}) == value


def test_the_checkpoint_age_is_taken_at_scrape_time(job):
    age = REGISTRY.get_sample_value("rtj_checkpoint_age_seconds", JOB)
    assert age == pytest.approx(time.time() - T, abs=5)


def test_labels_are_bounded_no_pod_no_step(job):
    text = generate_latest(REGISTRY).decode()
    lines = [line for line in text.splitlines() if line.startswith("rtj_job_") and 'name="llama"' in line]
    assert lines
    allowed = {"namespace", "name", "phase", "tier", "reason", "charged", "budget", "kind", "type"}
    for line in lines:
        keys = {pair.split("=")[0] for pair in line[line.index("{") + 1:line.index("}")].split(",")}
        assert keys <= allowed, line


def test_a_deleted_jobs_series_disappear():
    metrics.record_job("team-a", "gone", STATUS, SPEC)
    assert REGISTRY.get_sample_value("rtj_job_step", {"namespace": "team-a", "name": "gone"}) == 420.0
    assert REGISTRY.get_sample_value("rtj_jobs", {"phase": "Running"}) >= 1
    metrics.forget("team-a", "gone")
    text = generate_latest(REGISTRY).decode()
    assert 'name="gone"' not in text


def test_a_job_without_a_report_has_no_progress_series():
    metrics.record_job("team-a", "quiet", {"phase": "Pending"}, {})
    try:
        assert REGISTRY.get_sample_value("rtj_job_phase", {"namespace": "team-a", "name": "quiet",
                                                           "phase": "Pending"}) == 1.0
        for name in ("rtj_job_step", "rtj_job_checkpoint_step", "rtj_checkpoint_age_seconds"):
            assert REGISTRY.get_sample_value(name, {"namespace": "team-a", "name": "quiet"}) is None
    finally:
        metrics.forget("team-a", "quiet")


def test_every_phase_is_exported_before_any_job():
    """rtj_jobs has samples on an operator with no job yet (an alert on its absence stays quiet)."""
    text = generate_latest(REGISTRY).decode()
    assert all(f'rtj_jobs{{phase="{p}"}}' in text for p in metrics.PHASES)



def test_every_phase_the_crd_allows_is_exported():
    """metrics.PHASES is the CRD's status.phase enum, so no phase's series is missing or left stale."""
    from rtj_operator import api

    assert list(metrics.PHASES) == api.STATUS_SCHEMA["properties"]["phase"]["enum"]
    text = generate_latest(REGISTRY).decode()
    assert all(f'rtj_jobs{{phase="{p}"}}' in text for p in api.PHASES)


def test_a_job_leaving_queued_is_no_longer_counted_there():
    ns, name = "phase-test", "queued-then-running"
    queued = REGISTRY.get_sample_value("rtj_jobs", {"phase": "Queued"})
    running = REGISTRY.get_sample_value("rtj_jobs", {"phase": "Running"})
    metrics.record_phase(ns, name, "Queued")
    try:
        assert REGISTRY.get_sample_value("rtj_jobs", {"phase": "Queued"}) == queued + 1
        assert REGISTRY.get_sample_value("rtj_job_phase", {"namespace": ns, "name": name, "phase": "Queued"}) == 1.0
        metrics.record_job(ns, name, {"phase": "Running"}, {})
        assert REGISTRY.get_sample_value("rtj_jobs", {"phase": "Queued"}) == queued
        assert REGISTRY.get_sample_value("rtj_jobs", {"phase": "Running"}) == running + 1
        assert REGISTRY.get_sample_value("rtj_job_phase", {"namespace": ns, "name": name, "phase": "Queued"}) == 0.0
    finally:
        metrics.forget(ns, name)


def test_the_user_guide_lists_the_crds_phases():
    from rtj_operator import api
    from testkit import ROOT

    line = next(line for line in (ROOT / "docs" / "user-guide.md").read_text().splitlines()
                if line.startswith("- `phase`:"))
    assert re.findall(r"`(\w+)`", line)[1:] == list(api.PHASES)


def test_restart_counters_start_at_zero_for_every_tier_and_charge():
    """Each (tier, charged) pair a tier can take (ladder.CHARGES: the pods' own tiers are the job's, the
    operator's tiers either payer's) is a series from the job's first pass, at 0: increase() then counts the
    first restart, which a series that appears at 1 would hide."""
    assert ladder.CHARGES == {"InProcess": ("job",), "Launcher": ("job",), "ReplacePod": ("job", "platform"),
                              "GangRestart": ("job", "platform")}
    job = {"namespace": "charge-test", "name": "fresh"}
    metrics.record_job(job["namespace"], job["name"], {"phase": "Running"}, {})
    try:
        for tier, payers in ladder.CHARGES.items():
            for payer in payers:
                labels = {**job, "tier": tier, "charged": payer}
                assert REGISTRY.get_sample_value("rtj_job_restarts_charged_total", labels) == 0.0, labels
        metrics.record_job(job["namespace"], job["name"], STATUS, SPEC)
        assert REGISTRY.get_sample_value("rtj_job_restarts_charged_total",
                                         {**job, "tier": "InProcess", "charged": "job"}) == 5.0
        assert REGISTRY.get_sample_value("rtj_job_restarts_charged_total",
                                         {**job, "tier": "ReplacePod", "charged": "platform"}) == 2.0
        assert REGISTRY.get_sample_value("rtj_job_restarts_charged_total",
                                         {**job, "tier": "ReplacePod", "charged": "job"}) == 0.0
    finally:
        metrics.forget(job["namespace"], job["name"])
    # The operator's own counter: its tiers' pairs exist before any restart (0 on a fresh process).
    for tier in ladder.TIERS:
        for payer in ladder.CHARGES[tier]:
            assert REGISTRY.get_sample_value("rtj_restarts_charged_total", {"tier": tier, "charged": payer}) \
                is not None, (tier, payer)


def test_the_condition_gauge_has_only_each_true_conditions_current_reason():
    job = {"namespace": "condition-test", "name": "waits"}

    def conditions(*conds: tuple[str, str, str]) -> dict:
        return {"phase": "Running", "conditions": [{"type": t, "status": s, "reason": r} for t, s, r in conds]}

    def series() -> dict[tuple[str, str], float]:
        text = generate_latest(REGISTRY).decode()
        found = re.findall(r'rtj_job_condition\{name="waits",namespace="condition-test",reason="(\w*)",'
                           r'type="(\w+)"\} (\S+)', text)
        return {(t, r): float(v) for r, t, v in found}

    metrics.record_job(job["namespace"], job["name"], conditions(
        ("WaitingForCapacity", "True", "Unschedulable"), ("Running", "False", "WaitingForPods")), {})
    try:
        assert series() == {("WaitingForCapacity", "Unschedulable"): 1.0}
        metrics.record_job(job["namespace"], job["name"], conditions(
            ("WaitingForCapacity", "True", "SuspendedForCapacity"), ("Running", "False", "Suspended")), {})
        assert series() == {("WaitingForCapacity", "SuspendedForCapacity"): 1.0}  # the old reason's is gone
        metrics.record_job(job["namespace"], job["name"], conditions(
            ("WaitingForCapacity", "False", "Resolved"), ("Running", "True", "AllNodesRunning")), {})
        assert series() == {("Running", "AllNodesRunning"): 1.0}
    finally:
        metrics.forget(job["namespace"], job["name"])
    assert series() == {}
