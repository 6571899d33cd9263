"""The chart's PrometheusRule (metrics.prometheusRule) with `promtool test rules`: each alert fires on
the series the operator exports for a job in trouble (as it exports them: a job's restart counters from 0,
its conditions' current reasons, the replicas' scrape labels), names that job, and stays quiet for a
healthy one; each can be switched off alone and links its runbook section. promtool is built from the
Prometheus Go module by hack/promtool/build.sh (cached; set RTJ_PROMTOOL_BIN to its folder)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from rtj_operator import ladder
from testkit import ROOT, TOOLS

PROMTOOL = Path(os.environ.get("RTJ_PROMTOOL_BIN", Path.home() / ".cache" / "rtj-promtool" / "v0.316.0" / "bin")) \
    / "promtool"
pytestmark = pytest.mark.skipif(not PROMTOOL.exists() or not (TOOLS / "helm").exists(),
                                reason="run hack/promtool/build.sh and `make tools`")

JOB = 'namespace="team-a", name="llama"'
LABELS = {"namespace": "team-a", "name": "llama"}
RELEASE, RELEASE_NS = "rtj", "rtj-system"
# The scrape labels of this release's operator replicas (the ServiceMonitor's target labels).
OPERATOR = f'namespace="{RELEASE_NS}", service="{RELEASE}-rtj-operator-metrics"'
ALERTS = ["RTJCheckpointStale", "RTJRestartStorm", "RTJBudgetNearlySpent", "RTJNoStepProgress", "RTJWaitingForFencing",
          "RTJWaitingForPodTermination", "RTJWaitingForCapacity", "RTJQueuedTooLong", "RTJOperatorDown"]


def notes(alert: str, summary: str, description: str) -> dict[str, str]:
    return {"summary": summary, "description": description, "runbook_url": f"docs/runbook.md#{alert.lower()}"}


def charged(job: str, counts: dict[tuple[str, str], str]) -> list[dict[str, str]]:
    """rtj_job_restarts_charged_total as the exporter emits it: every (tier, charged) pair of ladder.CHARGES
    from the job's first pass, at 0 unless `counts` says otherwise."""
    return [{"series": f'rtj_job_restarts_charged_total{{{job}, tier="{tier}", charged="{payer}"}}',
             "values": counts.get((tier, payer), "0x20")}
            for tier, payers in ladder.CHARGES.items() for payer in payers]


def condition(type_: str, reason: str, values: str, job: str = JOB) -> dict[str, str]:
    return {"series": f'rtj_job_condition{{{job}, type="{type_}", reason="{reason}"}}', "values": values}


def waits(alert: str, minutes: int, severity: str, summary: str, description: str) -> list[dict]:
    """Quiet a minute before `minutes`, firing a minute after, naming the job."""
    return [{"eval_time": f"{minutes - 1}m", "alertname": alert, "exp_alerts": []},
            {"eval_time": f"{minutes + 1}m", "alertname": alert, "exp_alerts": [{
                "exp_labels": {**LABELS, "severity": severity},
                "exp_annotations": notes(alert, f"RTJ team-a/llama: {summary}", description)}]}]


STORM = {"alertname": "RTJRestartStorm", "exp_alerts": [{
    "exp_labels": {**LABELS, "severity": "warning"},
    "exp_annotations": notes("RTJRestartStorm", "RTJ team-a/llama: more than 5 restarts in 30m",
                             "Restarts of every tier, the pods' own included; `kubectl describe rtj` and "
                             "status.restartCounts say why.")}]}


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
                "exp_annotations": notes(
                    "RTJCheckpointStale", "RTJ team-a/llama: no checkpoint committed for 3 checkpoint intervals",
                    "The newest committed checkpoint is 12m 0s old while the job runs: a fault now would roll back "
                    "that much training.")}]},
        ],
    },
    {  # the same age while Restarting: the recovery is what is late, not the checkpoints
        "interval": "1m",
        "input_series": [*running(phase="Restarting"),
                         {"series": f"rtj_checkpoint_age_seconds{{{JOB}}}", "values": "0+60x60"},
                         {"series": f"rtj_job_checkpoint_interval_seconds{{{JOB}}}", "values": "100x60"}],
        "alert_rule_test": [{"eval_time": "30m", "alertname": "RTJCheckpointStale", "exp_alerts": []}],
    },
    {  # a fresh job's first restarts, 6 in-process ones in 2 minutes: a storm, counted from the series' 0
        # (as exported from the job's first pass); 3 would not be
        "interval": "1m",
        "input_series": [*running(),
                         *charged(JOB, {("InProcess", "job"): "0 0 2 4 6 6 6 6 6 6 6"}),
                         *charged('namespace="team-a", name="calm"', {("Launcher", "job"): "0 0 1 2 3 3 3 3 3 3 3"})],
        "alert_rule_test": [{"eval_time": "6m", **STORM}],
    },
    {  # the first restarts at once, 6 between two scrapes, and across tiers and payers: counted too
        "interval": "1m",
        "input_series": [*running(), *charged(JOB, {("ReplacePod", "platform"): "0 0 4x10",
                                                   ("GangRestart", "job"): "0 0 2x10"})],
        "alert_rule_test": [{"eval_time": "3m", **STORM}],
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
                "exp_annotations": notes("RTJBudgetNearlySpent", "RTJ team-a/llama: 1 restarts left in maxRestarts",
                                         "The next failures charged to this budget fail the job.")}]},
        ],
    },
    {  # Running, and the last step was reported at time 0: quiet up to 15 min, then 2 min pending
        "interval": "1m",
        "input_series": [*running(), {"series": f"rtj_job_step_timestamp_seconds{{{JOB}}}", "values": "0x60"}],
        "alert_rule_test": [
            {"eval_time": "16m", "alertname": "RTJNoStepProgress", "exp_alerts": []},
            {"eval_time": "20m", "alertname": "RTJNoStepProgress", "exp_alerts": [{
                "exp_labels": {**LABELS, "severity": "critical"},
                "exp_annotations": notes(
                    "RTJNoStepProgress", "RTJ team-a/llama: Running, but no training step for 20m 0s",
                    "The pods report no new step: a hang the in-job layers did not catch, or a data or storage "
                    "stall.")}]},
        ],
    },
    {  # this release's leader's series stop (its standby still scraped, not leading; another release's
        # operator leads in its own namespace): down after 5 minutes
        "interval": "1m",
        "input_series": [{"series": f'rtj_leader{{{OPERATOR}, pod="op-a"}}', "values": "1 1 1 _ _ _ _ _ _ _ _ _ _ _ _"},
                         {"series": f'rtj_leader{{{OPERATOR}, pod="op-b"}}', "values": "0x14"},
                         {"series": 'rtj_leader{namespace="other", service="other-rtj-operator-metrics", pod="x"}',
                          "values": "1x14"}],
        "alert_rule_test": [
            {"eval_time": "3m", "alertname": "RTJOperatorDown", "exp_alerts": []},
            {"eval_time": "14m", "alertname": "RTJOperatorDown", "exp_alerts": [{
                "exp_labels": {"severity": "critical", "namespace": RELEASE_NS,
                               "service": f"{RELEASE}-rtj-operator-metrics"},
                "exp_annotations": notes(
                    "RTJOperatorDown", f"No rtj-operator replica of {RELEASE_NS}/{RELEASE} leads",
                    "No replica is scraped, or none holds the leader Lease: nothing recovers ResilientTrainingJobs "
                    "beyond their pods' own layers.")}]},
        ],
    },
    {  # a healthy operator with no job at all (rtj_jobs all 0), a standby beside it: quiet
        "interval": "1m",
        "input_series": [{"series": f'rtj_leader{{{OPERATOR}, pod="op-a"}}', "values": "1x20"},
                         {"series": f'rtj_leader{{{OPERATOR}, pod="op-b"}}', "values": "0x20"},
                         {"series": f'rtj_jobs{{{OPERATOR}, pod="op-a", phase="Running"}}', "values": "0x20"}],
        "alert_rule_test": [{"eval_time": "15m", "alertname": "RTJOperatorDown", "exp_alerts": []}],
    },
    {  # waiting for fencing since 0, the reason changing at 6 min (the old reason's series gone): one wait,
        # firing after 10 min; the same condition over for another job after 4 min: quiet
        "interval": "1m",
        "input_series": [condition("WaitingForFencing", "NodeNotFenced", "1x5"),
                         condition("WaitingForFencing", "MassNodeLoss", "_x5 1x20"),
                         condition("WaitingForFencing", "NodeNotFenced", "1x4",
                                   job='namespace="team-a", name="fenced"')],
        "alert_rule_test": waits(
            "RTJWaitingForFencing", 10, "critical", "a lost node's pod has waited 10m for the node to be fenced",
            "The pod's index is not replaced until its node is known to run nothing: delete the Node, taint it "
            "node.kubernetes.io/out-of-service, or stop its instance (fencing.ec2)."),
    },
    {  # a pod stuck on a healthy node for 15 minutes; a pod without a node for 30; queued for 2 hours
        "interval": "1m",
        "input_series": [condition("WaitingForPodTermination", "PodStuckTerminating", "1x200"),
                         condition("WaitingForCapacity", "Unschedulable", "1x200"),
                         condition("Queued", "Pending", "1x200")],
        "alert_rule_test": [
            *waits("RTJWaitingForPodTermination", 15, "warning", "a pod has not stopped on a healthy node for 15m",
                   "Past its grace period, the pod still runs on a Ready node: its kubelet or container runtime does "
                   "not end it, and the job waits."),
            *waits("RTJWaitingForCapacity", 30, "warning", "a pod has found no node for 30m",
                   "`kubectl describe rtj` gives the scheduler's message; the job fails after "
                   "restartBudget.capacityTimeoutSeconds."),
            *waits("RTJQueuedTooLong", 120, "warning", "queued in Kueue for 2h",
                   "Kueue has not admitted the gang (or evicted it and not re-admitted it): `kubectl describe rtj` "
                   "gives Kueue's reason."),
        ],
    },
]


def rules(*values: str) -> dict:
    out = subprocess.run([str(TOOLS / "helm"), "template", RELEASE, str(ROOT / "charts" / "rtj-operator"),
                          "--namespace", RELEASE_NS, "--set", "metrics.prometheusRule.enabled=true", *values,
                          "--show-only", "templates/prometheusrule.yaml"], capture_output=True, text=True)
    if "could not find template" in out.stderr:
        return {}
    assert out.returncode == 0, out.stderr
    return yaml.safe_load(out.stdout) or {}


def test_the_alerts_fire_on_a_job_in_trouble_and_name_it(tmp_path: Path):
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules()["spec"]))
    (tmp_path / "tests.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
                                                         "tests": TESTS}))
    check = subprocess.run([str(PROMTOOL), "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True,
                           text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    result = subprocess.run([str(PROMTOOL), "test", "rules", str(tmp_path / "tests.yaml")], capture_output=True,
                            text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def alert_names(rule: dict) -> list[str]:
    return [r["alert"] for group in rule["spec"]["groups"] for r in group["rules"]] if rule else []


@pytest.mark.parametrize("alert", ALERTS)
def test_each_alert_can_be_switched_off_alone(alert):
    assert alert_names(rules()) == ALERTS
    assert alert_names(rules("--set", f"metrics.prometheusRule.alerts.{alert}.enabled=false")) == \
        [a for a in ALERTS if a != alert]


def test_no_rule_without_an_alert():
    off = [arg for a in ALERTS for arg in ("--set", f"metrics.prometheusRule.alerts.{a}.enabled=false")]
    assert rules(*off) == {}


def test_every_alert_links_its_runbook_section():
    """runbook_url is metrics.prometheusRule.runbookURL and the anchor of the alert's heading in docs/runbook.md."""
    headings = {line[3:].strip().lower() for line in (ROOT / "docs" / "runbook.md").read_text().splitlines()
                if line.startswith("## ")}
    for rule in rules("--set", "metrics.prometheusRule.runbookURL=https://example.com/runbook")["spec"]["groups"][0][
            "rules"]:
        url = rule["annotations"]["runbook_url"]
        assert url == f"https://example.com/runbook#{rule['alert'].lower()}", url
        assert url.split("#")[1] in headings, url


SERIES = re.compile(r'^(\w+)\{(.*)\}$')
# Labels a scrape adds (the ServiceMonitor's target labels); the exporter's own are the rest.
SCRAPE_LABELS = {"service", "pod"}
# Labels whose values the exporter takes from a closed set: an input series with another value is one the
# exporter never emits.
CLOSED = {"phase", "tier", "charged", "type", "budget", "kind"}


def exported_series() -> dict[str, list[dict[str, str]]]:
    """The label sets the real exporter (rtj_operator.metrics, as scraped) emits, by sample name, for jobs
    in every state the alert tests model: running with restarts and a checkpoint, waiting on each
    condition an alert watches, queued."""
    from prometheus_client import REGISTRY
    from prometheus_client.parser import text_string_to_metric_families
    from test_metrics import SPEC, STATUS

    from rtj_operator import metrics

    def cond(type_: str, reason: str) -> dict[str, str]:
        return {"type": type_, "status": "True", "reason": reason, "message": "", "lastTransitionTime":
                "2026-12-03T10:00:00Z"}

    jobs = {
        "running": STATUS,
        "waiting": {**STATUS, "phase": "Restarting", "conditions": [
            cond("WaitingForFencing", "NodeNotFenced"), cond("WaitingForPodTermination", "PodStuckTerminating"),
            cond("WaitingForCapacity", "Unschedulable")]},
        "queued": {"phase": "Queued", "conditions": [cond("Queued", "Pending")]},
    }
    for name, status in jobs.items():
        metrics.record_job("team-a", name, status, SPEC)
    try:
        text = prometheus_client_exposition(REGISTRY)
    finally:
        for name in jobs:
            metrics.forget("team-a", name)
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("rtj_"):
                out.setdefault(sample.name, []).append(dict(sample.labels))
    return out


def prometheus_client_exposition(registry) -> str:
    from prometheus_client import generate_latest
    return generate_latest(registry).decode()


def test_the_alert_tests_feed_series_shaped_as_the_exporter_emits_them():
    """Issue 30.7: the promtool tests above feed hand-written series; each must be one the exporter really
    emits: its name, its own label keys (the scrape adds the target's), and for the labels with a closed
    set of values, a value the exporter emits (a RestartStorm test that fed `tier="Pod"`, or a series
    without `charged`, would pass promtool and never fire in a cluster). Counters the alerts take
    increase() of start at 0, as the exporter starts them."""
    real = exported_series()
    fed = [(m[1], dict(re.findall(r'(\w+)="([^"]*)"', m[2])), s["values"]) for test in TESTS
           for s in test["input_series"] if (m := SERIES.match(s["series"].strip()))]
    assert len(fed) == sum(len(t["input_series"]) for t in TESTS)
    for name, labels, values in fed:
        assert name in real, f"{name}: the exporter emits no such series"
        own = {k: v for k, v in labels.items() if k not in SCRAPE_LABELS}
        if name in ("rtj_leader", "rtj_jobs"):  # the operator's own: its namespace is the target's
            own.pop("namespace", None)
        shapes = {frozenset(ls) for ls in real[name]}
        assert frozenset(own) in shapes, (name, sorted(own), sorted(map(sorted, shapes)))
        for key in own.keys() & CLOSED:
            emitted = {ls[key] for ls in real[name] if key in ls}
            assert own[key] in emitted, (name, key, own[key], sorted(emitted))
        if name == "rtj_job_restarts_charged_total":
            assert values.split()[0].startswith("0"), (labels, values)  # the exporter's first sample is 0
