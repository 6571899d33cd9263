"""The chart's alerts and dashboard (metrics.prometheusRule, metrics.dashboard) query only series the
operator exports, per job by namespace and name; the dashboard JSON is the one hack/dashboard.py writes."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest
from prometheus_client import REGISTRY
from test_metrics import SPEC, STATUS

from rtj_operator import metrics

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "rtj-operator"
RULES = (CHART / "templates" / "prometheusrule.yaml").read_text()
DASHBOARD = json.loads((CHART / "dashboards" / "rtj.json").read_text())
METRIC = re.compile(r"\brtj_[a-z_]+\b")
SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


def exported() -> set[str]:
    """Every sample name the operator exports once a job with every field has been recorded, and the
    names of its families (a labelled histogram has no sample before its first observation)."""
    metrics.record_job("team-a", "probe", STATUS, SPEC)
    try:
        families = [f for f in REGISTRY.collect() if f.name.startswith("rtj_")]
        return {s.name for f in families for s in f.samples} | {f.name for f in families}
    finally:
        metrics.forget("team-a", "probe")


def targets() -> list[str]:
    return [t["expr"] for p in DASHBOARD["panels"] for t in p.get("targets", [])]


def test_the_dashboard_file_is_the_generators():
    spec = importlib.util.spec_from_file_location("dashboard", ROOT / "hack" / "dashboard.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (CHART / "dashboards" / "rtj.json").read_text() == module.render()


@pytest.mark.parametrize("where, text", [("alerts", RULES), ("dashboard", "\n".join(targets()))])
def test_every_queried_series_is_exported(where, text):
    names = set(exported())
    queried = set(METRIC.findall(text)) - {"rtj_operator"}
    assert queried, where
    for name in queried:
        assert name in names or any(name.removesuffix(suffix) in names for suffix in SUFFIXES), (where, name)


def test_the_dashboard_has_the_job_variables_and_the_rows():
    variables = [v["name"] for v in DASHBOARD["templating"]["list"]]
    assert variables == ["datasource", "namespace", "job"]
    rows = [p["title"] for p in DASHBOARD["panels"] if p["type"] == "row"]
    assert rows == ["Now", "Progress", "Recovery by tier", "Goodput", "Operator", "GPUs (DCGM)"]
    per_job = [e for e in targets() if "rtj_job_" in e or "rtj_checkpoint_age" in e]
    assert per_job and all('namespace=~"$namespace", name=~"$job"' in e for e in per_job)
    # Every namespace at once (All), and GPU series joined on the jobs' pods by their Indexed Job names.
    namespace = DASHBOARD["templating"]["list"][1]
    assert namespace["includeAll"] and namespace["allValue"] == ".*"
    # A job's pods in every attempt ('<name>-a<attempt>-<index>-<suffix>; an earlier operator's
    # '<name>-<index>-<suffix>'), not another job's whose name starts alike; Prometheus anchors the regex.
    pods = {re.search(r'pod=~"([^"]+)"', e).group(1) for e in targets() if "DCGM_" in e}
    (pattern,) = pods
    matches = [bool(re.fullmatch(pattern.replace("$job", "train"), pod)) for pod in (
        "train-a1-0-x7k2p", "train-a12-3-abcde", "train-0-x7k2p", "train-b-0-x7k2p", "trainer-a1-0-x", "train-a1")]
    assert matches == [True, True, True, False, False, False], (pattern, matches)
    # Tables are instant queries in table format: one row per series, not frames over time.
    tables = [p for p in DASHBOARD["panels"] if p["type"] == "table"]
    assert tables and all(t["format"] == "table" and t["instant"] for p in tables for t in p["targets"])
    [marks] = DASHBOARD["annotations"]["list"]
    assert "rtj_job_restarts_charged_total" in marks["expr"] and marks["enable"]
    ids = [p["id"] for p in DASHBOARD["panels"]]
    assert len(ids) == len(set(ids))
    for p in DASHBOARD["panels"]:  # on the 24-column grid
        assert p["gridPos"]["x"] + p["gridPos"]["w"] <= 24


def test_every_alert_names_its_job():
    alerts = re.findall(r"- alert: (\w+)\n\s+expr: >?-?\s*\n?(.*?)\n\s+(?:for|labels):", RULES, re.S)
    assert [a for a, _ in alerts] == ["RTJCheckpointStale", "RTJRestartStorm", "RTJBudgetNearlySpent",
                                      "RTJNoStepProgress", "RTJWaitingForFencing", "RTJWaitingForPodTermination",
                                      "RTJWaitingForCapacity", "RTJQueuedTooLong", "RTJOperatorDown"]
    for alert, expr in alerts:
        if alert != "RTJOperatorDown":  # absent(): no job to name
            assert "on (namespace, name)" in expr or "by (namespace, name)" in expr, alert
