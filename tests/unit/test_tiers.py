"""The unit tier stays a unit tier: importing every unit test module loads no cluster code (the local
control plane, the node agents, the operator thread, the cluster tiers' fixtures), so `make unit` runs
without a control plane and a change to the cluster harness cannot slow or break it."""

from __future__ import annotations

import subprocess
import sys

from testkit import ROOT

CLUSTER_CODE = ("rtj_dev.localcluster", "rtj_dev.nodeagent", "rtj_dev.operator_thread", "rtj_dev.kueue",
                "clusterkit")


def test_unit_test_modules_import_no_cluster_code():
    modules = sorted(p.stem for p in (ROOT / "tests" / "unit").glob("test_*.py"))
    script = ("import importlib, sys\n"
              f"for name in {modules!r}: importlib.import_module(name)\n"
              f"print(sorted(m for m in {CLUSTER_CODE!r} if m in sys.modules))\n")
    paths = [str(ROOT / p) for p in ("tests/unit", "tests", "hack", "operator", "worker")]
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path[:0] = {paths!r}\n" + script],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"unit test modules import cluster code: {out.stdout}"
