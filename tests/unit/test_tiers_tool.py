"""hack/tiers.py, which runs CI's tiers: two at a time in the order given (a free slot takes the next),
each tier's log printed whole, a failed tier failing the run without stopping the others, and each
tier's wall and CPU seconds recorded for the table."""

from __future__ import annotations

import json
import subprocess
import sys

from testkit import ROOT

TIERS = ROOT / "hack" / "tiers.py"
MAKEFILE = """\
slow:
\t@sleep 1; echo slow-done
fails:
\t@echo fails-ran; exit 3
quick:
\t@echo quick-done
"""


def test_the_pool_runs_every_tier_two_at_a_time_and_fails_if_one_fails(tmp_path):
    (tmp_path / "Makefile").write_text(MAKEFILE)
    log = tmp_path / "times.jsonl"
    out = subprocess.run([sys.executable, str(TIERS), "pool", "-j", "2", "--logs", str(tmp_path / "logs"),
                          "slow", "fails", "quick"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
                         env={"PATH": "/usr/bin:/bin", "RTJ_TIER_LOG": str(log)})
    assert out.returncode == 1, out.stdout + out.stderr
    blocks = [line for line in out.stdout.splitlines() if line.startswith("===== ") and "exit" in line]
    # `fails` and `quick` end while `slow` still runs (the slot `fails` freed took `quick`).
    assert [b.split(":")[0] for b in blocks] == ["===== fails", "===== quick", "===== slow"], out.stdout
    assert "exit 2" in blocks[0] and "Error 3" in out.stdout  # make says which recipe failed and how
    assert "fails-ran" in out.stdout and "slow-done" in out.stdout
    assert "[tiers] failed: fails" in out.stdout


def test_run_records_wall_and_cpu_seconds_and_the_table_shows_them(tmp_path):
    log = tmp_path / "times.jsonl"
    env = {"PATH": "/usr/bin:/bin", "RTJ_TIER_LOG": str(log)}
    burn = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.3: pass"
    rc = subprocess.run([sys.executable, str(TIERS), "run", "busy", "--", sys.executable, "-c", burn],
                        env=env, timeout=60).returncode
    assert rc == 0
    [row] = [json.loads(line) for line in log.read_text().splitlines()]
    assert row["tier"] == "busy" and row["rc"] == 0 and row["cpu"] >= 0.3 and row["wall"] >= row["cpu"] - 0.1
    table = subprocess.run([sys.executable, str(TIERS), "table"], env=env, capture_output=True, text=True).stdout
    assert "| busy |" in table and "CPU / wall" in table
