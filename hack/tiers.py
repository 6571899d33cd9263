"""Run the test tiers and say where the time goes: each tier's wall time, the CPU time of everything
it started (user + system, the processes it waited for included), and their ratio, in one table.

    python hack/tiers.py run NAME -- CMD...   # run one tier, record its line in $RTJ_TIER_LOG
    python hack/tiers.py table                # print the recorded lines as a table

`make test` runs every tier through `run` and prints the table last (docs/development.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

LOG = Path(os.environ.get("RTJ_TIER_LOG", ".tier-times.jsonl"))


def run(name: str, cmd: list[str]) -> int:
    start = time.monotonic()
    proc = subprocess.Popen(cmd)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.monotonic() - start
    rc = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    # ru_* of wait4 covers the child; its own waited-for descendants are in RUSAGE_CHILDREN of the child,
    # which the kernel adds to the child's usage once it is reaped (what wait4 returns).
    with LOG.open("a") as f:
        f.write(json.dumps({"tier": name, "wall": round(wall, 1), "cpu": round(cpu, 1), "rc": rc,
                            "cores": os.cpu_count()}) + "\n")
    print(f"[tiers] {name}: {wall:.0f} s wall, {cpu:.0f} s CPU, exit {rc}", flush=True)
    return rc


def table() -> str:
    rows = [json.loads(line) for line in LOG.read_text().splitlines() if line.strip()] if LOG.exists() else []
    out = ["| tier | wall (s) | CPU (s) | CPU / wall | exit |", "|---|---:|---:|---:|---:|"]
    for r in rows:
        out.append(f"| {r['tier']} | {r['wall']:.0f} | {r['cpu']:.0f} | {r['cpu'] / max(r['wall'], 1e-9):.2f} "
                   f"| {r['rc']} |")
    total_wall, total_cpu = sum(r["wall"] for r in rows), sum(r["cpu"] for r in rows)
    out.append(f"| all (sequential sum) | {total_wall:.0f} | {total_cpu:.0f} | "
               f"{total_cpu / max(total_wall, 1e-9):.2f} | |")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    if argv[:1] == ["run"] and "--" in argv:
        sep = argv.index("--")
        return run(argv[1], argv[sep + 1:])
    if argv[:1] == ["table"]:
        print(table())
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
