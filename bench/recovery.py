"""Worker benchmark on CPU (`make bench-worker`): recovery time per fault kind, and training
efficiency with async vs sync checkpointing at two checkpoint intervals. Medians over repeats.

Recovery time = from the fault to the first training step completed after recovery (both from
the ranks' event log). Efficiency = mean step time without checkpoints / with them, over the
training loop (every save included; the last step saves in all runs).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from rtj_worker import local

HEARTBEAT = 15


def recovery_seconds(workdir: Path, kind: str, steps: int) -> tuple[float, str]:
    fault_rank = 0 if kind == "hang" else 1
    run = local.launch(workdir, ["--steps", str(steps), "--step-seconds", "0.05", "--fault",
                                 f"{fault_rank}:{steps // 2}:{kind}"], heartbeat=HEARTBEAT)
    if run.code != 0:
        sys.exit(f"{kind}: worker exited {run.code}; see {workdir}/worker.log")
    fault = next(e for e in run.timeline if e["event"] == "fault")
    first = run.starts()[:2]
    resumed = [e for e in run.starts()[2:]]
    layer = "in-process (same pids)" if {e["pid"] for e in first} == {e["pid"] for e in resumed} \
        else "ft_launcher respawn (new pids)"
    after = min(e["t"] for e in run.timeline if e["event"] == "step" and e["t"] > max(r["t"] for r in resumed))
    return after - fault["t"], layer


def loop_seconds(workdir: Path, steps: int, interval: int | None, sync: bool, dim: int, ranks: int) -> float:
    args = ["--steps", str(steps), "--model-dim", str(dim), "--layers", "6", "--batch", "16",
            "--checkpoint-interval", str(interval or steps * 10)]
    if sync:
        args.append("--sync-checkpoint")
    run = local.launch(workdir, args, heartbeat=60, ranks=ranks)
    if run.code != 0:
        sys.exit(f"efficiency run exited {run.code}; see {workdir}/worker.log")
    # The training loop only: from step 1 to the last step (saves included, start-up and the
    # Wrapper's completion barrier excluded).
    steps_done = [e for e in run.timeline if e.get("rank") == 0 and e["event"] == "step"]
    first = min(e["t"] for e in steps_done if e["step"] == 1)
    last = max(e["t"] for e in steps_done)
    return (last - first) / (steps - 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--model-dim", type=int, default=1024, help="6 layers: ~6.3M params, ~75 MB/rank with Adam")
    parser.add_argument("--efficiency-ranks", type=int, default=1,
                        help="Ranks in the efficiency runs. The async writer is a process of its own: with as "
                             "many ranks as cores it has no core left, and measures contention, not overlap.")
    parser.add_argument("--only", choices=["recovery", "efficiency"])
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rtj-bench-"))
    if args.only != "efficiency":
        recovery_table(root, args.repeats)
    if args.only != "recovery":
        efficiency_table(root, args)
    print(f"\n(work dirs under {root})")


def recovery_table(root: Path, repeats: int) -> None:

    print(f"Recovery time on CPU: 1 node, 2 ranks (gloo), heartbeat timeout {HEARTBEAT}s, "
          f"median of {repeats} runs")
    print(f"| {'fault':<8} | {'recovered by':<30} | {'median s':>8} | {'min s':>6} | {'max s':>6} |")
    print(f"|{'-' * 10}|{'-' * 32}|{'-' * 10}|{'-' * 8}|{'-' * 8}|")
    for kind in ("exc", "sigkill", "hang"):
        samples, layer = [], ""
        for i in range(repeats):
            seconds, layer = recovery_seconds(root / f"{kind}-{i}", kind, steps=60)
            samples.append(seconds)
        print(f"| {kind:<8} | {layer:<30} | {statistics.median(samples):>8.2f} | {min(samples):>6.2f} | "
              f"{max(samples):>6.2f} |")



def efficiency_table(root: Path, args: argparse.Namespace) -> None:
    ranks = args.efficiency_ranks
    print(f"\nTraining efficiency on CPU: {ranks} rank(s), model dim {args.model_dim} x 6 layers, {args.steps} "
          f"steps, median of {args.repeats} runs")
    # The baseline saves only once, at the end, synchronously: no writer process at all.
    base = statistics.median(loop_seconds(root / f"base-{i}", args.steps, None, True, args.model_dim, ranks)
                             for i in range(args.repeats))
    print(f"| {'checkpointing':<14} | {'every':>5} | {'step ms':>8} | {'efficiency':>10} |")
    print(f"|{'-' * 16}|{'-' * 7}|{'-' * 10}|{'-' * 12}|")
    print(f"| {'none':<14} | {'-':>5} | {base * 1000:>8.1f} | {'100.0%':>10} |")
    for interval in (5, 20):
        for mode, sync in (("async (DCP)", False), ("sync", True)):
            step = statistics.median(loop_seconds(root / f"{mode[:4]}-{interval}-{i}", args.steps, interval, sync,
                                                  args.model_dim, ranks) for i in range(args.repeats))
            print(f"| {mode:<14} | {interval:>5} | {step * 1000:>8.1f} | {base / step:>9.1%} |")


if __name__ == "__main__":
    main()
