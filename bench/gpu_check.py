"""The worker on one GPU machine (`hack/gpu_check.sh`): NCCL on N GPUs, FSDP2, asynchronous checkpoint
overlap, and every fault kind recovered with the same final weights as a run without faults.

What CPU tests cannot show: collectives and checkpoint agreement on the nccl backend (no CPU
backend in the training group), CUDA-side async staging, and NVRx's GPU health checks. Prints one
table; exits non-zero if any check fails. A few minutes on 8 GPUs.
"""

from __future__ import annotations

import argparse
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from rtj_worker import local

STEPS = 60


def train_args(args: argparse.Namespace, *extra: str) -> list[str]:
    return ["--steps", str(STEPS), "--model-dim", str(args.model_dim), "--layers", str(args.layers),
            "--batch", str(args.batch), "--checkpoint-interval", "10", *extra]


def launch(workdir: Path, args: argparse.Namespace, *extra: str) -> local.LocalRun:
    run = local.launch(workdir, train_args(args, *extra), timeout=600, ranks=args.gpus, heartbeat=60,
                       RTJ_NCCL_TIMEOUT="15", RTJ_INPROCESS_SOFT_TIMEOUT="30", RTJ_INPROCESS_HARD_TIMEOUT="45",
                       RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT="300")
    for step in (workdir / "ckpt").glob("step-*"):  # GBs each: keep the disk for the next runs
        shutil.rmtree(step, ignore_errors=True)
    return run


def step_seconds(run: local.LocalRun) -> float:
    steps = [e for e in run.timeline if e.get("rank") == 0 and e["event"] == "step"]
    first = min(e["t"] for e in steps if e["step"] == 1)
    return (max(e["t"] for e in steps) - first) / (STEPS - 1)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--model-dim", type=int, default=8192,
                        help="8 layers of 8192: 0.54B params, 6.4 GB with Adam state, sharded over the GPUs")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8192, help="Rows per rank and step (the compute)")
    args = parser.parse_args()
    if not torch.cuda.is_available() or args.gpus < 1:
        print("no CUDA device: this check needs a GPU machine")
        return 2
    root = Path(tempfile.mkdtemp(prefix="rtj-gpu-check-"))
    rows: list[tuple[str, str, str, str]] = []
    failed = False

    def record(check: str, ok: bool, detail: str, seconds: float) -> None:
        nonlocal failed
        failed |= not ok
        rows.append((check, "ok" if ok else "FAIL", detail, f"{seconds:.1f}"))

    started = time.monotonic()
    clean = launch(root / "clean", args)
    backends = {e.get("backend") for e in clean.starts()}
    record("clean run, nccl, FSDP2", clean.code == 0 and backends == {"nccl"},
           f"exit {clean.code}, backend {backends}, world {args.gpus}", time.monotonic() - started)
    if clean.code != 0:
        print(clean.log[-4000:])
        return 1
    reference = clean.result()
    victim = 1 if args.gpus > 1 else 0
    for kind, fault, layer in (("exc before 1st checkpoint", f"{victim}:5:exc", "in-process"),
                               ("exc", f"{victim}:25:exc", "in-process"),
                               ("sigkill", f"{victim}:25:sigkill", "ft_launcher respawn"),
                               ("hang", "0:25:hang", "heartbeat timeout + respawn")):
        started = time.monotonic()
        run = launch(root / kind.replace(" ", "-"), args, "--fault", fault)
        ok = run.code == 0 and math.isclose(run.result()["checksum"], reference["checksum"], rel_tol=1e-6)
        detail = f"exit {run.code}, {layer}, checksum {'matches' if ok else 'differs'}"
        record(f"fault {kind}", ok, detail, time.monotonic() - started)

    # Asynchronous overlap: step time with a save every 10 steps vs no saves at all.
    base = step_seconds(launch(root / "nockpt", args, "--checkpoint-interval", str(STEPS * 10)))
    for mode, extra in (("async", ()), ("sync", ("--sync-checkpoint",))):
        started = time.monotonic()
        runs = [launch(root / f"{mode}-{i}", args, *extra) for i in range(2)]
        eff = base / statistics.median(step_seconds(r) for r in runs)
        record(f"checkpoint every 10 steps, {mode}", all(r.code == 0 for r in runs),
               f"efficiency {eff:.1%} of the step rate without saves", time.monotonic() - started)

    print(f"\nGPU check: {args.gpus} GPU(s) {torch.cuda.get_device_name(0)}, model {args.layers}x{args.model_dim}, "
          f"{STEPS} steps, torch {torch.__version__}")
    print(f"| {'check':<36} | {'result':<6} | {'detail':<60} | {'s':>6} |")
    print(f"|{'-' * 38}|{'-' * 8}|{'-' * 62}|{'-' * 8}|")
    for check, result, detail, seconds in rows:
        print(f"| {check:<36} | {result:<6} | {detail:<60} | {seconds:>6} |")
    print(f"\n(work dirs under {root})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
