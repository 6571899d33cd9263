"""Run the test tiers and say where the time goes: each tier's wall time, the CPU time of everything
it started (user + system, the processes it waited for included), and their ratio, in one table.

    python hack/tiers.py run NAME -- CMD...          # run one tier, record its line in $RTJ_TIER_LOG
    python hack/tiers.py table                       # print the recorded lines as a table
    python hack/tiers.py pool [-j 2] [--logs DIR] A B C   # make targets, 2 at a time, in this order

`make test` runs its tiers two at a time (docs/development.md, "CI"): the cluster tier (which builds the
control plane first) beside the worker's, then whichever slot frees first takes the next tier; then
the e2e tier alone. Each target's output goes to its own log, printed whole when it ends (CI's log
reads tier by tier), with a line every few minutes naming what still runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
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


HEARTBEAT_SECONDS = 300.0


def pool(targets: list[str], jobs: int, logs: Path, make: str = "make") -> int:
    """Run the make targets `jobs` at a time, in the order given: whichever slot frees first takes the next
    one. Each target's log is printed whole when it ends. Exit status: 0 if every target passed; a failed
    target does not stop the others."""
    logs.mkdir(parents=True, exist_ok=True)
    printing, queue_lock = threading.Lock(), threading.Lock()
    queue = list(targets)
    running: dict[str, float] = {}
    failed: list[str] = []

    def slot() -> None:
        while True:
            with queue_lock:
                if not queue:
                    return
                target = queue.pop(0)
            log = logs / f"{target}.log"
            start = time.monotonic()
            running[target] = start
            with log.open("wb") as out:
                rc = subprocess.run([make, "--no-print-directory", target], stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL).returncode
            running.pop(target, None)
            if rc:
                failed.append(target)
            with printing:
                print(f"\n===== {target}: exit {rc} after {time.monotonic() - start:.0f} s (log {log}) =====",
                      flush=True)
                sys.stdout.buffer.write(log.read_bytes())
                print(f"===== end of {target} =====", flush=True)

    threads = [threading.Thread(target=slot, daemon=True) for _ in range(max(1, jobs))]
    for t in threads:
        t.start()
    last = time.monotonic()
    while any(t.is_alive() for t in threads):
        time.sleep(1.0)
        now = time.monotonic()
        if running and now - last >= HEARTBEAT_SECONDS:
            last = now
            with printing:
                print("[tiers] still running: " + ", ".join(f"{name} ({(now - since) / 60:.0f} min)"
                                                          for name, since in list(running.items())), flush=True)
    if failed:
        print(f"[tiers] failed: {' '.join(failed)}", flush=True)
    return 1 if failed else 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["pool"]:
        logs, jobs, args = Path(".tier-logs"), 2, argv[1:]
        while len(args) > 1 and args[0] in ("--logs", "-j", "--jobs"):
            if args[0] == "--logs":
                logs = Path(args[1])
            else:
                jobs = int(args[1])
            args = args[2:]
        if not args or any(a.startswith("-") for a in args):
            print(__doc__, file=sys.stderr)
            return 2
        return pool(args, jobs, logs, os.environ.get("MAKE", "make"))
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
