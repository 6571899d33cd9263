"""Checkpoint efficiency on CPU: no checkpoints, synchronous saves, and asynchronous saves written by a
thread or by a process of their own, side by side in one run (`make bench-checkpoint`).

The real save path (rtj_worker.checkpoint.Checkpointer: the FSDP2 state of the Llama model with Adam,
DCP, the commit protocol, the per-step agreement) writes to a volume throttled to --bandwidth MB/s on
top of real fsyncs, like a shared file system under load. A step's compute is real CPU work in the
training thread: a loop of small matrix products sized to --step-ms, so that the thread spends it the
way a GPU node's host thread spends a step, holding the GIL between short native calls (kernel
launches) and needing it back after each. What a background writer takes from it: the GIL (the
thread writer's Python work: planning, serializing, committing) and, on this 2-core machine, the
cores themselves (copies into the staging buffers, the writes, fsync), which a GPU node has to spare.

Two checkpoint intervals: compute per interval = 2x the write time, and = the write time. Per writer:
- step ms: the median step with no save in flight (the staging step itself counts as blocked);
- while saving: the mean step while a save is in flight, and its inflation over the writer's own
  steps with none in flight (the same runs: the shared machine's load drifts between runs);
- blocked s/save: time the training loop spent in save() (staging; the whole write when synchronous);
- waited s/save: time it waited for the previous save, still being written when the next came due;
- efficiency: training time without checkpoints / with them (same steps; every save is followed by a
  full interval, as in steady-state training, and the last one is waited for), the median of
  --rounds rounds that run every writer in turn.
The process writer is spawned (and every writer warmed up by one save) before anything is timed: its
spawn is paid once per process start, not per save.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import _async_process_executor
from torch.distributed.checkpoint.state_dict import get_state_dict

from rtj_worker.checkpoint import Checkpointer, ShardWriter
from rtj_worker.models import Llama, LlamaConfig
from rtj_worker.train import shard

# With --pin: the training thread has a core of its own, background writers the others, as on a GPU
# node (the host has cores to spare; what the training thread can lose to a writer thread is the GIL).
WRITER_CORES: set[int] = set(json.loads(os.environ.get("RTJ_BENCH_WRITER_CORES", "[]")))
if WRITER_CORES and multiprocessing.parent_process() is not None:
    # The process writer imports this file (as __mp_main__) before it starts a thread: all of them
    # inherit the writers' cores, not the training thread's core it was spawned from.
    os.sched_setaffinity(0, WRITER_CORES)
# torch's writer process logs four INFO lines a save to stderr (its _init_logger, run in the process
# after this file is imported): the table is this script's output.
_async_process_executor._init_logger = lambda rank: None


class ThrottledWriter(ShardWriter):
    """ShardWriter (fsync on) that then waits as a volume of `bandwidth` bytes/s would. An instance
    attribute, not a class one: the process writer unpickles it in a process where main() never ran."""

    def __init__(self, path: str | os.PathLike, bandwidth: float):
        super().__init__(path)
        self.bandwidth = bandwidth

    def write_data(self, plan, planner):  # type: ignore[no-untyped-def]
        if WRITER_CORES and threading.current_thread() is not threading.main_thread():
            os.sched_setaffinity(0, WRITER_CORES)  # this thread only: the thread writer's cores
        started = time.perf_counter()
        future = super().write_data(plan, planner)
        written = sum(r.storage_data.length for r in future.wait())
        time.sleep(max(0.0, written / self.bandwidth - (time.perf_counter() - started)))
        return future


def compute_loop(step_ms: float) -> Callable[[], None]:
    """A step's compute: small matrix products, each a short native call between Python statements."""
    a, w = torch.randn(48, 48), torch.randn(48, 48) / 48

    def run(n: int) -> None:
        x = a
        for _ in range(n):
            x = torch.tanh(x @ w)

    samples = []
    for _ in range(5):  # the median: the machine may be shared
        started = time.perf_counter()
        run(1000)
        samples.append(time.perf_counter() - started)
    iters = max(1, round(1000 * step_ms / 1000 / statistics.median(samples)))
    return lambda: run(iters)


@dataclass
class Run:
    seconds: float = 0.0
    free: list[float] = field(default_factory=list)  # step durations with no save in flight
    saving: list[float] = field(default_factory=list)  # ... with one in flight
    blocked: float = 0.0  # in save(): staging (all of the write when synchronous)
    waited: float = 0.0  # for the previous save, still in flight when the next was due
    saves: int = 0
    skipped: int = 0


def train(ckpt: Checkpointer | None, model: torch.nn.Module, opt: torch.optim.Optimizer, compute: Callable[[], None],
          steps: int, interval: int, skip_if_busy: bool = False) -> Run:
    """`steps` steps of `compute`, a save every `interval` (but at the last step), the last one waited for."""
    run = Run()
    started = time.perf_counter()
    for step in range(1, steps + 1):
        busy = ckpt is not None and ckpt.in_flight is not None
        t0 = time.perf_counter()
        compute()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(1e-6)  # the optimizer's update: the state really changes under the writer
        if ckpt is not None:
            ckpt.poll()  # commits a finished save: part of what asynchronous saving costs the loop
        (run.saving if busy else run.free).append(time.perf_counter() - t0)
        if ckpt is not None and step % interval == 0 and step < steps:  # the last interval overlaps the last save
            if ckpt.in_flight is not None and not skip_if_busy:  # save() would wait for it first
                t0 = time.perf_counter()
                ckpt.finalize()
                run.waited += time.perf_counter() - t0
            t0 = time.perf_counter()
            model_sd, optim_sd = get_state_dict(model, opt)
            saved = ckpt.save(step, {"model": model_sd, "optim": optim_sd}, skip_if_busy=skip_if_busy)
            run.blocked += time.perf_counter() - t0
            run.saves += saved
            run.skipped += not saved
    if ckpt is not None:
        ckpt.finalize()
    run.seconds = time.perf_counter() - started
    return run


def checkpointer(root: Path, writer: str | None, bandwidth: float) -> Checkpointer:
    """writer None: synchronous saves."""
    ckpt = Checkpointer(root, 0, 1, use_async=writer is not None, keep=2, uid="bench", writer=writer or "thread",
                        address="127.0.0.1")
    ckpt.attach()
    ckpt._writer = lambda path: ThrottledWriter(path, bandwidth)  # type: ignore[method-assign]
    return ckpt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=12, help="Transformer blocks (12 of 256: 123 MB with Adam, "
                                                               "444 tensors)")
    parser.add_argument("--bandwidth", type=float, default=100.0, help="MB/s of the throttled volume")
    parser.add_argument("--step-ms", type=float, default=100.0, help="Compute per step, in the training thread")
    parser.add_argument("--checkpoints", type=int, default=2, help="Saves per measured run")
    parser.add_argument("--rounds", type=int, default=2, help="Runs of each writer, interleaved")
    parser.add_argument("--no-pin", dest="pin", action="store_false",
                        help="Leave threads unpinned (default: the training thread on core 0, writers on the others)")
    args = parser.parse_args()

    torch.set_num_threads(1)
    cores = sorted(os.sched_getaffinity(0))
    if args.pin and len(cores) > 1:
        # Set before the writer process is spawned: it reads the writers' cores from the environment.
        os.environ["RTJ_BENCH_WRITER_CORES"] = json.dumps(cores[1:])
        WRITER_CORES.update(cores[1:])
        os.sched_setaffinity(0, {cores[0]})  # the main (training) thread; threads it starts inherit it
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, world_size=1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=300))
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=4096, dim=args.dim, n_layers=args.layers, n_heads=8, n_kv_heads=2, max_seq_len=64)
    model = shard(Llama(cfg), torch.device("cpu"), 1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    model(torch.zeros(1, 8, dtype=torch.long)).sum().backward()
    opt.step()  # Adam's moments exist: the state is the full training state
    compute = compute_loop(args.step_ms)
    root = Path(tempfile.mkdtemp(prefix="rtj-ckpt-bench-"))
    bandwidth = args.bandwidth * 1e6
    writers: dict[str, Checkpointer | None] = {"none": None}
    for name, writer in (("sync", None), ("thread", "thread"), ("process", "process")):
        writers[name] = checkpointer(root / name, writer, bandwidth)
    # Calibrate the write time (synchronous, nothing else running) and warm every writer up: the
    # process writer is spawned here.
    sync_ckpt = writers["sync"]
    assert sync_ckpt is not None
    started = time.perf_counter()
    model_sd, optim_sd = get_state_dict(model, opt)
    sync_ckpt.save(1, {"model": model_sd, "optim": optim_sd})
    write_seconds = time.perf_counter() - started
    for name in ("thread", "process"):
        ckpt = writers[name]
        assert ckpt is not None
        ckpt.save(1, {"model": model_sd, "optim": optim_sd})
        ckpt.finalize()
    size_mb = sum(f.stat().st_size for f in (root / "sync").rglob("*.distcp")) / 1e6
    tensors = len(model_sd) + sum(len(s) for s in optim_sd["state"].values())
    base_step = statistics.median(train(None, model, opt, compute, 20, 1).free)
    print(f"Checkpoint efficiency on CPU ({os.cpu_count()} cores): Llama {args.layers}x{args.dim}, FSDP2 state with "
          f"Adam {size_mb:.0f} MB in {tensors} tensors; volume throttled to {args.bandwidth:g} MB/s with fsync; one "
          f"synchronous save {write_seconds:.2f} s; step = {args.step_ms:g} ms of compute in the training thread "
          f"(measured alone: {base_step * 1000:.0f} ms); {args.checkpoints} saves per run, {args.rounds} rounds; "
          + (f"training thread on core {cores[0]}, writers on {cores[1:]}" if WRITER_CORES else "threads unpinned"))
    header = (f"| {'interval':<30} | {'writer':<8} | {'step ms':>7} | {'while saving ms':>15} | {'inflation':>9} | "
              f"{'blocked s/save':>14} | {'waited s/save':>13} | {'efficiency':>10} |")
    print(header)
    print("|" + "|".join("-" * len(c) for c in header.split("|")[1:-1]) + "|")
    for label, ratio in (("compute = 2x write", 2.0), ("compute = write", 1.0)):
        interval = max(1, round(ratio * write_seconds / args.step_ms * 1000))
        steps = interval * (args.checkpoints + 1)
        # Rounds of every writer in turn: the machine's load drifts (it is shared), each round's
        # efficiency is against that round's run without checkpoints.
        runs: dict[str, list[Run]] = {name: [] for name in writers}
        efficiency: dict[str, list[float]] = {name: [] for name in writers}
        for _ in range(args.rounds):
            for name, ckpt in writers.items():
                runs[name].append(train(ckpt, model, opt, compute, steps, interval))
                efficiency[name].append(runs["none"][-1].seconds / runs[name][-1].seconds)
        for name in writers:
            free = statistics.median(t for r in runs[name] for t in r.free)
            saving = [t for r in runs[name] for t in r.saving]
            during = (f"{statistics.mean(saving) * 1000:>15.0f} | {statistics.mean(saving) / free - 1:>+9.0%}"
                      if saving else f"{'-':>15} | {'-':>9}")
            saves = sum(r.saves for r in runs[name])
            blocked = (f"{sum(r.blocked for r in runs[name]) / saves:>14.3f} | "
                       f"{sum(r.waited for r in runs[name]) / saves:>13.3f}" if saves else f"{'-':>14} | {'-':>13}")
            print(f"| {f'{label} ({interval} steps)':<30} | {name:<8} | {free * 1000:>7.0f} | {during} | {blocked} | "
                  f"{statistics.median(efficiency[name]):>10.1%} |")
    for ckpt in writers.values():
        if ckpt is not None:
            ckpt.close()
    print(f"\n(work dir {root})")
    dist.destroy_process_group()


if __name__ == "__main__":  # the process writer's spawn imports this file again
    main()
