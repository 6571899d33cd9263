"""The chart's PrometheusRule (metrics.prometheusRule) with `promtool test rules`: each alert fires on
the series the operator exports for a job in trouble, names that job, and stays quiet for a healthy
one. promtool is built from the Prometheus Go module by hack/promtool/build.sh (cached; set
RTJ_PROMTOOL_BIN to its folder)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from testkit import ROOT, TOOLS

PROMTOOL = Path(os.environ.get("RTJ_PROMTOOL_BIN", Path.home() / ".cache" / "rtj-promtool" / "v0.316.0" / "bin")) \
    / "promtool"
pytestmark = pytest.mark.skipif(not PROMTOOL.exists() or not (TOOLS / "helm").exists(),
                                reason="run hack/promtool/build.sh and `make tools`")

JOB = 'namespace="team-a", name="llama"'
LABELS = {"namespace": "team-a", "name": "llama"}


def running(minutes: int = 60, phase: str = "Running") -> list[dict[str, str]]:
    return [{"series": f'rtj_jobs{{phase="{phase}"}}', "values": f"1x{minutes}"},
            {"series": f'rtj_job_phase{{{JOB}, phase="{phase}"}}', "values": f"1x{minutes}"}]


TESTS = [
    {  # the checkpoint is 60 s older every minute, due every 100 s: stale beyond 300 s (6 min), for 5 min
        "interval": "1m",
        "input_series": [*running(), {"series": f"rtj_checkpoint_age_seconds{{{JOB}}}", "values": "0+60x60"},
                         {"series": f"rtj_job_checkpoint_interval_seconds{{{JOB}}}", "values": "100x60"}],
        "alert_rule_test": [
            {"eval_time": "10m", "alertname": "RTJCheckpointStale", "exp_alerts": []},
            {"eval_time": "12m", "alertname": "RTJCheckpointStale", "exp_alerts": [{
                "exp_labels": {**LABELS, "severity": "warning"},
                "exp_annotations": {
                    "summary": "RTJ team-a/llama: no checkpoint committed for 3 checkpoint intervals",
                    "description": "The newest committed checkpoint is 12m 0s old while the job runs: a fault now "
                                   "would roll back that much training."}}]},
        ],
    },
    {  # the same age while Restarting: the recovery is what is late, not the checkpoints
        "interval": "1m",
        "input_series": [*running(phase="Restarting"),
                         {"series": f"rtj_checkpoint_age_seconds{{{JOB}}}", "values": "0+60x60"},
                         {"series": f"rtj_job_checkpoint_interval_seconds{{{JOB}}}", "values": "100x60"}],
        "alert_rule_test": [{"eval_time": "30m", "alertname": "RTJCheckpointStale", "exp_alerts": []}],
    },
    {  # 6 in-process restarts in 3 minutes: a storm; 3 would not be
        "interval": "1m",
        "input_series": [*running(),
                         {"series": f'rtj_job_restarts_total{{{JOB}, tier="InProcess", reason="RuntimeError", '
                                    'charged="job"}', "values": "0 0 2 4 6 6 6 6 6 6 6"},
                         {"series": 'rtj_job_restarts_total{namespace="team-a", name="calm", tier="Launcher", '
                                    'reason="RankKilled", charged="job"}', "values": "0 0 1 2 3 3 3 3 3 3 3"}],
        "alert_rule_test": [{"eval_time": "6m", "alertname": "RTJRestartStorm", "exp_alerts": [{
            "exp_labels": {**LABELS, "severity": "warning"},
            "exp_annotations": {
                "summary": "RTJ team-a/llama: more than 5 restarts in 30m",
                "description": "Restarts of every tier, the pods' own included; `kubectl describe rtj` and "
                               "status.restartCounts say why."}}]}],
    },
    {  # one restart left while Running; none of it once Succeeded
        "interval": "1m",
        "input_series": [*running(),
                         {"series": f'rtj_job_budget_remaining{{{JOB}, budget="maxRestarts"}}', "values": "3 2 1 1"},
                         {"series": f'rtj_job_budget_remaining{{{JOB}, budget="maxDisruptions"}}', "values": "9x3"},
                         {"series": 'rtj_job_phase{namespace="team-a", name="done", phase="Running"}',
                          "values": "0x3"},
                         {"series": 'rtj_job_budget_remaining{namespace="team-a", name="done", budget="maxRestarts"}',
                          "values": "0x3"}],
        "alert_rule_test": [
            {"eval_time": "1m", "alertname": "RTJBudgetNearlySpent", "exp_alerts": []},
            {"eval_time": "2m", "alertname": "RTJBudgetNearlySpent", "exp_alerts": [{
                "exp_labels": {**LABELS, "budget": "maxRestarts", "severity": "warning"},
                "exp_annotations": {"summary": "RTJ team-a/llama: 1 restarts left in maxRestarts",
                                    "description": "The next failures charged to this budget fail the job."}}]},
        ],
    },
    {  # Running, and the last step was reported at time 0: quiet up to 15 min, then 2 min pending
        "interval": "1m",
        "input_series": [*running(), {"series": f"rtj_job_step_timestamp_seconds{{{JOB}}}", "values": "0x60"}],
        "alert_rule_test": [
            {"eval_time": "16m", "alertname": "RTJNoStepProgress", "exp_alerts": []},
            {"eval_time": "20m", "alertname": "RTJNoStepProgress", "exp_alerts": [{
                "exp_labels": {**LABELS, "severity": "critical"},
                "exp_annotations": {
                    "summary": "RTJ team-a/llama: Running, but no training step for 20m 0s",
                    "description": "The pods report no new step: a hang the in-job layers did not catch, or a data "
                                   "or storage stall."}}]},
        ],
    },
    {  # the leader's series stop (the standby still scraped, not leading): down after 5 minutes
        "interval": "1m",
        "input_series": [{"series": 'rtj_leader{pod="op-a"}', "values": "1 1 1 _ _ _ _ _ _ _ _ _ _ _ _"},
                         {"series": 'rtj_leader{pod="op-b"}', "values": "0x14"}],
        "alert_rule_test": [
            {"eval_time": "3m", "alertname": "RTJOperatorDown", "exp_alerts": []},
            {"eval_time": "14m", "alertname": "RTJOperatorDown", "exp_alerts": [{
                "exp_labels": {"severity": "critical"},
                "exp_annotations": {"summary": "No rtj-operator replica leads",
                                    "description": "No replica is scraped, or none holds the leader Lease: nothing "
                                                   "recovers ResilientTrainingJobs beyond their pods' own layers."}}]},
        ],
    },
    {  # a healthy operator with no job at all (rtj_jobs all 0), a standby beside it: quiet
        "interval": "1m",
        "input_series": [{"series": 'rtj_leader{pod="op-a"}', "values": "1x20"},
                         {"series": 'rtj_leader{pod="op-b"}', "values": "0x20"},
                         {"series": 'rtj_jobs{pod="op-a", phase="Running"}', "values": "0x20"}],
        "alert_rule_test": [{"eval_time": "15m", "alertname": "RTJOperatorDown", "exp_alerts": []}],
    },
]


def test_the_alerts_fire_on_a_job_in_trouble_and_name_it(tmp_path: Path):
    out = subprocess.run([str(TOOLS / "helm"), "template", "rtj-operator", str(ROOT / "charts" / "rtj-operator"),
                          "--set", "metrics.prometheusRule.enabled=true", "--show-only",
                          "templates/prometheusrule.yaml"], check=True, capture_output=True, text=True).stdout
    rule = yaml.safe_load(out)
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rule["spec"]))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
                                                         "tests": TESTS}))
    check = subprocess.run([str(PROMTOOL), "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    result = subprocess.run([str(PROMTOOL), "test", "rules", str(tmp_path / "tests.yaml")], capture_output=True,
                            text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
