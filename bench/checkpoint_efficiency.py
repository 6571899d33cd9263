"""Checkpoint efficiency on CPU, asynchronous vs synchronous, with a write path slow enough for
overlap to matter (`make bench-checkpoint`).

The real save path (rtj_worker.checkpoint.Checkpointer: FSDP2 state, DCP, commit protocol, per-step
agreement) writes to a volume throttled to --bandwidth MB/s on top of real fsyncs, like a shared file
system under load. A step's compute is modelled as time the host waits for the accelerator
(--step-seconds): on a GPU node the host is idle while kernels run, which is what asynchronous
saving overlaps with; on this 2-core CPU real compute would instead measure contention for the cores.

Two checkpoint intervals: compute per interval = 2x the write time, and = the write time.
Efficiency = training time without checkpoints / training time with them (same steps; every save is
followed by a full interval, as in steady-state training, and waited for at the end).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict

from rtj_worker.checkpoint import Checkpointer
from rtj_worker.train import shard


class ThrottledWriter(dcp.FileSystemWriter):
    """FileSystemWriter (fsync on) that then waits as a volume of `bandwidth` bytes/s would."""

    bandwidth = 32e6

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        started = time.perf_counter()
        future = super().write_data(plan, planner)
        written = sum(r.storage_data.length for r in future.wait())
        time.sleep(max(0.0, written / self.bandwidth - (time.perf_counter() - started)))
        return future


def model_state(dim: int, layers: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Sequential(*[torch.nn.Linear(dim, dim) for _ in range(layers)])
    model = shard(model, torch.device("cpu"), 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.randn(2, dim)).sum().backward()
    opt.step()
    return model, opt


def run(root: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int, interval: int | None,
        use_async: bool, step_seconds: float) -> tuple[float, float]:
    """Seconds for `steps` steps (saves included, the last one waited for) and seconds blocked in save()."""
    ckpt = Checkpointer(root, 0, 1, use_async=use_async, keep=2, uid="bench")
    ckpt.attach()
    ckpt._writer = lambda path: ThrottledWriter(path, sync_files=True)  # type: ignore[method-assign]
    started = time.perf_counter()
    for step in range(1, steps + 1):
        time.sleep(step_seconds)  # the accelerator computing the step
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-6)  # the optimizer's update: the state really changes under the writer
        ckpt.poll()
        if interval and step % interval == 0 and step < steps:  # the last interval overlaps the last save
            model_sd, optim_sd = get_state_dict(model, opt)
            ckpt.save(step, {"model": model_sd, "optim": optim_sd})
    ckpt.finalize()
    return time.perf_counter() - started, ckpt.save_seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=1024, help="Linear width; 8 layers of 1024: ~100 MB with Adam")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--bandwidth", type=float, default=50.0, help="MB/s of the throttled volume")
    parser.add_argument("--step-seconds", type=float, default=0.1)
    parser.add_argument("--checkpoints", type=int, default=3, help="Saves per measured run")
    args = parser.parse_args()

    torch.set_num_threads(1)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, world_size=1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=300))
    ThrottledWriter.bandwidth = args.bandwidth * 1e6
    model, opt = model_state(args.dim, args.layers)
    root = Path(tempfile.mkdtemp(prefix="rtj-ckpt-bench-"))

    # Calibrate: the write time of one checkpoint when nothing else runs.
    write_seconds, _ = run(root / "calibrate", model, opt, 2, 1, False, 0.0)  # one save, at step 1
    size_mb = sum(f.stat().st_size for f in (root / "calibrate").rglob("*.distcp")) / 1e6
    print(f"Checkpoint efficiency on CPU: FSDP2 state {size_mb:.0f} MB, volume throttled to {args.bandwidth:g} MB/s "
          f"with fsync; one synchronous save = {write_seconds:.2f} s; step = {args.step_seconds:g} s of "
          f"accelerator time; {args.checkpoints} saves per run; {os.cpu_count()} CPU cores")
    print(f"| {'case':<28} | {'interval':>8} | {'compute/interval s':>18} | {'write s':>7} | {'sync':>7} | "
          f"{'async':>7} | {'async blocked s/save':>20} |")
    print(f"|{'-' * 30}|{'-' * 10}|{'-' * 20}|{'-' * 9}|{'-' * 9}|{'-' * 9}|{'-' * 22}|")
    for label, ratio in (("compute = 2x write", 2.0), ("compute = write", 1.0)):
        interval = max(1, round(ratio * write_seconds / args.step_seconds))
        steps = interval * (args.checkpoints + 1)
        base, _ = run(root / f"base-{ratio}", model, opt, steps, None, False, args.step_seconds)
        sync, _ = run(root / f"sync-{ratio}", model, opt, steps, interval, False, args.step_seconds)
        asy, blocked = run(root / f"async-{ratio}", model, opt, steps, interval, True, args.step_seconds)
        print(f"| {label:<28} | {interval:>8} | {interval * args.step_seconds:>18.2f} | {write_seconds:>7.2f} | "
              f"{base / sync:>6.1%} | {base / asy:>6.1%} | {blocked / args.checkpoints:>20.3f} |")
    print(f"\n(work dir {root})")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
