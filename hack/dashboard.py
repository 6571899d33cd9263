"""Writes charts/rtj-operator/dashboards/rtj.json, the chart's Grafana dashboard (metrics.dashboard),
from the panels below: variables namespace and job (each may be All), rows now, progress, recovery by tier,
goodput, the operator's health and the job's GPUs (DCGM, where its exporter runs), restarts as annotations.
Plain dashboard JSON (schemaVersion 39); nothing of Grafana's is used to build it.

    python hack/dashboard.py        # tests/unit/test_monitoring.py checks the file is up to date
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "charts" / "rtj-operator" / "dashboards" / "rtj.json"
# Every namespace may be picked (All: the whole cluster's jobs), and several jobs.
JOB = 'namespace=~"$namespace", name=~"$job"'
# A job's pods, for series of exporters that label by pod (DCGM's): its Indexed Jobs' <job>-<index>-<suffix>,
# the Job being '<name>-a<attempt>' (an earlier operator's: '<name>'; a name past 55 characters is shortened
# with a digest, builders/names.py, and not matched here).
PODS = 'namespace=~"$namespace", pod=~"($job)(-a[0-9]+)?-[0-9]+-.+"'
DS = {"type": "prometheus", "uid": "${datasource}"}


def panel(title: str, kind: str, exprs: list[tuple[str, str]], unit: str = "short", width: int = 6,
          height: int = 6, description: str = "") -> dict[str, Any]:
    """A table shows each series' value now (an instant query, one row per series); the rest plot them."""
    table = {"instant": True, "range": False, "format": "table"} if kind == "table" else {}
    return {"type": kind, "title": title, "description": description, "datasource": DS,
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "gridPos": {"w": width, "h": height},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "datasource": DS, **table}
                        for i, (expr, legend) in enumerate(exprs)]}


ROWS: list[tuple[str, list[dict[str, Any]]]] = [
    ("Now", [
        panel("Phase", "stat", [(f"rtj_job_phase{{{JOB}}} == 1", "{{name}} {{phase}}")], width=6),
        panel("Nodes ready / desired", "stat", [(f"rtj_job_nodes_ready{{{JOB}}}", "{{name}} ready"),
                                                (f"rtj_job_nodes_desired{{{JOB}}}", "{{name}} desired")]),
        panel("Restart budget left", "stat", [(f"rtj_job_budget_remaining{{{JOB}}}", "{{name}} {{budget}}")]),
        panel("Checkpoint age", "stat", [(f"rtj_checkpoint_age_seconds{{{JOB}}}", "{{name}}")], unit="s"),
    ]),
    ("Progress", [
        panel("Training step", "timeseries", [(f"rtj_job_step{{{JOB}}}", "{{name}} step"),
                                               (f"rtj_job_checkpoint_step{{{JOB}}}", "{{name}} checkpoint")],
              width=12, height=8, description="The gap between the lines is what a fault now rolls back."),
        panel("Seconds per step", "timeseries", [(f"rtj_job_step_seconds{{{JOB}}}", "{{name}}")], unit="s",
              height=8),
        panel("Checkpoint age vs interval", "timeseries",
              [(f"rtj_checkpoint_age_seconds{{{JOB}}}", "{{name}} age"),
               (f"rtj_job_checkpoint_interval_seconds{{{JOB}}}", "{{name}} interval")], unit="s", height=8),
    ]),
    ("Recovery by tier", [
        panel("Restarts by tier (1h)", "timeseries",
              [(f"sum by (name, tier) (increase(rtj_job_restarts_charged_total{{{JOB}}}[1h]))", "{{name}} {{tier}}")],
              width=8, height=8),
        panel("Restarts by cause and charge", "table",
              [(f"sum by (namespace, name, tier, reason, charged) (rtj_job_restarts_total{{{JOB}}})", "")],
              width=8, height=8),
        panel("Last recovery seconds by tier", "bargauge",
              [(f"rtj_job_last_recovery_seconds{{{JOB}}}", "{{name}} {{tier}}")], unit="s", width=4, height=8),
        panel("Steps rolled back, last recovery by tier", "bargauge",
              [(f"rtj_job_last_recovery_steps_rolled_back{{{JOB}}}", "{{name}} {{tier}}")], width=4, height=8,
              description="Steps trained again: the step reached at the fault minus the step it resumed from."),
    ]),
    ("Goodput", [
        panel("Goodput so far", "timeseries", [(f"rtj_job_goodput_ratio{{{JOB}}}", "{{name}} {{kind}}")],
              unit="percentunit", width=12, height=8,
              description="training: steps x step time / wall time; infrastructure: time in the training loop / "
                          "wall time (bench/goodput.py)."),
        panel("Operator recoveries (all jobs)", "timeseries",
              [("histogram_quantile(0.9, sum by (le, tier) (rate(rtj_recovery_seconds_bucket[1h])))", "p90 {{tier}}")],
              unit="s", width=12, height=8),
    ]),
    ("Operator", [
        panel("Leader", "stat", [("rtj_leader", "{{pod}}")], width=4,
              description="1 on the replica that holds the Lease and runs passes (RTJOperatorDown: none)."),
        panel("Passes by outcome", "timeseries",
              [("sum by (outcome) (rate(rtj_reconcile_passes_total[5m]))", "{{outcome}}")], unit="ops", width=7),
        panel("Pass seconds (p99)", "timeseries",
              [("histogram_quantile(0.99, sum by (le) (rate(rtj_reconcile_seconds_bucket[5m])))", "p99")],
              unit="s", width=6),
        panel("API calls", "timeseries", [("sum by (verb, kind) (rate(rtj_api_calls_total[5m]))", "{{verb}} {{kind}}")],
              unit="reqps", width=7),
    ]),
    ("GPUs (DCGM)", [
        panel("GPU utilization", "timeseries", [(f"avg by (pod) (DCGM_FI_DEV_GPU_UTIL{{{PODS}}})", "{{pod}}")],
              unit="percent", width=8, height=8,
              description="NVIDIA's dcgm-exporter, where it runs with its Kubernetes pod labels; empty without it."),
        panel("GPU memory used", "timeseries", [(f"sum by (pod) (DCGM_FI_DEV_FB_USED{{{PODS}}})", "{{pod}}")],
              unit="decmbytes", width=8, height=8),
        panel("XID errors", "timeseries",
              [(f"max by (pod, gpu) (DCGM_FI_DEV_XID_ERRORS{{{PODS}}})", "{{pod}} {{gpu}}")], width=8, height=8,
              description="The last XID a GPU reported (0: none); e.g. 79: fallen off the bus, 48: an "
                          "uncorrectable ECC error."),
    ]),
]


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y, next_id = 0, 1
    for title, row in ROWS:
        panels.append({"type": "row", "title": title, "id": next_id, "collapsed": False,
                       "gridPos": {"x": 0, "y": y, "w": 24, "h": 1}, "panels": []})
        next_id, y, x = next_id + 1, y + 1, 0
        height = 0
        for p in row:
            if x + p["gridPos"]["w"] > 24:
                x, y, height = 0, y + height, 0
            p = {**p, "id": next_id, "gridPos": {**p["gridPos"], "x": x, "y": y}}
            panels.append(p)
            next_id, x, height = next_id + 1, x + p["gridPos"]["w"], max(height, p["gridPos"]["h"])
        y += height
    variable = {"type": "query", "datasource": DS, "refresh": 2, "includeAll": False, "multi": False}
    return {
        "title": "ResilientTrainingJobs", "uid": "rtj-operator", "schemaVersion": 39, "version": 1,
        "tags": ["rtj", "training"], "timezone": "browser", "refresh": "30s", "editable": True,
        "time": {"from": "now-6h", "to": "now"},
        "templating": {"list": [
            {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus"},
            {**variable, "name": "namespace", "label": "namespace", "multi": True, "includeAll": True,
             "allValue": ".*", "query": {"query": "label_values(rtj_job_phase, namespace)", "refId": "namespace"},
             "definition": "label_values(rtj_job_phase, namespace)"},
            {**variable, "name": "job", "label": "job", "multi": True, "includeAll": True, "allValue": ".*",
             "query": {"query": 'label_values(rtj_job_phase{namespace=~"$namespace"}, name)', "refId": "job"},
             "definition": 'label_values(rtj_job_phase{namespace=~"$namespace"}, name)'},
        ]},
        # A mark on the graphs at each restart of the jobs shown, by tier.
        "annotations": {"list": [{
            "name": "Restarts", "datasource": DS, "enable": True, "iconColor": "red", "step": "1m",
            "expr": f"sum by (namespace, name, tier) (increase(rtj_job_restarts_charged_total{{{JOB}}}[1m])) > 0",
            "titleFormat": "{{namespace}}/{{name}}: {{tier}} restart", "textFormat": "{{tier}}"}]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(OUT)
