"""The chart's README is generated from values.yaml (hack/chart_readme.py) and kept up to date."""

from __future__ import annotations

import sys

import pytest

from testkit import ROOT

sys.path.insert(0, str(ROOT / "hack"))
import chart_readme

VALUES = """\
# -- Replicas.
replicaCount: 2
image:
  # -- Repository,
  # on two lines.
  repository: rtj
  # not documented
  tag: ""
# -- A documented mapping is one row.
resources:
  requests:
    # -- never listed: its parent is documented
    cpu: 100m
"""


def test_the_chart_readme_is_up_to_date():
    assert (chart_readme.CHART / "README.md").read_text() == chart_readme.expected(), \
        "run `python hack/chart_readme.py`"


def test_documented_values_are_rows_with_their_whole_comment():
    assert chart_readme.documented(VALUES) == [
        ("replicaCount", "Replicas."), ("image.repository", "Repository, on two lines."),
        ("resources", "A documented mapping is one row.")]


@pytest.mark.parametrize("path, cell", [
    ("replicaCount", "| `replicaCount` | int | `2` | Replicas. |"),
    ("resources", '| `resources` | object | `{"requests": {"cpu": "100m"}}` | A documented mapping is one row. |'),
])
def test_rows_show_type_and_default(path, cell):
    readme = chart_readme.render(VALUES, {"name": "c", "description": "d", "version": "1", "appVersion": "1",
                                          "kubeVersion": ">=1"})
    assert cell in readme.splitlines()
    assert "tag" not in readme and "cpu" not in readme.split("| `resources`")[0]


def test_every_value_in_the_chart_is_in_its_readme():
    import yaml

    def leaves(node, prefix=""):
        for key, value in node.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and value:
                yield from leaves(value, f"{path}.")
            else:
                yield path

    rows = [path for path, _ in chart_readme.documented((chart_readme.CHART / "values.yaml").read_text())]
    values = yaml.safe_load((chart_readme.CHART / "values.yaml").read_text())
    missing = [p for p in leaves(values) if not any(p == r or p.startswith(f"{r}.") for r in rows)]
    assert missing == []
