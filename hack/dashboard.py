"""Writes charts/rtj-operator/dashboards/rtj.json, the chart's Grafana dashboard (metrics.dashboard),
from the panels below: variables namespace and job, rows now, progress, recovery by tier, goodput.
Plain dashboard JSON (schemaVersion 39); nothing of Grafana's is used to build it.

    python hack/dashboard.py        # tests/unit/test_monitoring.py checks the file is up to date
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "charts" / "rtj-operator" / "dashboards" / "rtj.json"
JOB = 'namespace="$namespace", name=~"$job"'
DS = {"type": "prometheus", "uid": "${datasource}"}


def panel(title: str, kind: str, exprs: list[tuple[str, str]], unit: str = "short", width: int = 6,
          height: int = 6, description: str = "") -> dict[str, Any]:
    return {"type": kind, "title": title, "description": description, "datasource": DS,
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "gridPos": {"w": width, "h": height},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "datasource": DS}
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
              [(f"sum by (name, tier, reason, charged) (rtj_job_restarts_total{{{JOB}}})", "")], width=8, height=8),
        panel("Last recovery seconds by tier", "bargauge",
              [(f"rtj_job_last_recovery_seconds{{{JOB}}}", "{{name}} {{tier}}")], unit="s", width=8, height=8),
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
            {**variable, "name": "namespace", "label": "namespace",
             "query": {"query": "label_values(rtj_job_phase, namespace)", "refId": "namespace"},
             "definition": "label_values(rtj_job_phase, namespace)"},
            {**variable, "name": "job", "label": "job", "multi": True, "includeAll": True, "allValue": ".*",
             "query": {"query": 'label_values(rtj_job_phase{namespace="$namespace"}, name)', "refId": "job"},
             "definition": 'label_values(rtj_job_phase{namespace="$namespace"}, name)'},
        ]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(render())
    print(OUT)
