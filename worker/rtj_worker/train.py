"""Reference training script for ResilientTrainingJobs: DDP with NVIDIA Resiliency Extension.

Run by ft_launcher (one process per GPU, or `procsPerNode` on CPU). Each rank:
- sends a RankMonitorClient heartbeat every step (ft_launcher kills and respawns hung ranks),
- runs the training loop inside `inprocess.Wrapper`, so an exception on any rank restarts the
  loop on all ranks in the same processes (bounded by FaultCounter, with rank reassignment),
- checkpoints per-rank state with TorchAsyncCheckpoint and resumes from the newest complete one.

Batches depend only on (seed, step, rank), so a run with faults ends with the same weights as a
run without: tests compare the checksum rank 0 writes to <checkpoint dir>/result.json.
"""

import argparse
import datetime
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from nvidia_resiliency_ext import inprocess
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

from . import events, exit_codes, progress
from .checkpoint import Checkpointer
from .faults import Fault, maybe_inject

log = logging.getLogger("rtj_worker.train")


class NonFiniteLoss(inprocess.exception.RestartAbort):
    """Training diverged: restarting from the same checkpoint would diverge again, so this
    bypasses in-process restarts (RestartAbort) and the entrypoint stops the launcher."""


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rtj_worker.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="Total optimizer steps.")
    parser.add_argument("--model-dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--checkpoint-dir", default=os.environ.get("RTJ_CHECKPOINT_DIR", "/tmp/rtj-checkpoints"))
    parser.add_argument("--checkpoint-interval", type=int, default=env_int("RTJ_CHECKPOINT_INTERVAL", 50))
    parser.add_argument("--checkpoint-keep", type=int, default=env_int("RTJ_CHECKPOINT_KEEP", 3))
    parser.add_argument("--sync-checkpoint", action="store_true",
                        default=os.environ.get("RTJ_CHECKPOINT_ASYNC", "1") == "0",
                        help="Save with torch.save in the training loop instead of TorchAsyncCheckpoint.")
    parser.add_argument("--no-inprocess", action="store_true",
                        default=os.environ.get("RTJ_INPROCESS_ENABLED", "1") == "0",
                        help="Run without inprocess.Wrapper (exceptions then end the rank).")
    parser.add_argument("--inprocess-max-faults", type=int, default=env_int("RTJ_INPROCESS_MAX_ITERATIONS", 3))
    parser.add_argument("--soft-timeout", type=float, default=env_int("RTJ_INPROCESS_SOFT_TIMEOUT", 60))
    parser.add_argument("--hard-timeout", type=float, default=env_int("RTJ_INPROCESS_HARD_TIMEOUT", 90))
    parser.add_argument("--fault", type=Fault.parse, action="append", default=[],
                        help="Inject RANK:STEP:KIND (exc|sigkill|hang); repeatable.")
    parser.add_argument("--pg-timeout", type=float, default=None,
                        help="Collective timeout in seconds (default: 10 with gloo, 150 with NCCL). It bounds how "
                             "long a healthy rank can block in a collective with a failed peer before the "
                             "in-process restart can proceed.")
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="Extra time per step, to model a slower accelerator in benchmarks.")
    return parser.parse_args(argv)


def build_model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.model_dim, args.model_dim), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to(device)


def batch(args: argparse.Namespace, step: int, rank: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    return torch.randn(args.batch, args.model_dim, generator=gen).to(device)


def checksum(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return float(sum(p.double().abs().sum().item() for p in model.parameters()))


# No `from __future__ import annotations` here: inprocess.Wrapper finds the CallWrapper parameter by
# issubclass() on each annotation, so every parameter of train() is annotated with a real class.
def train(args: argparse.Namespace, ft_client: RankMonitorClient, base_store: dist.Store,
          model: torch.nn.Module, opt: torch.optim.Optimizer, ckpt: Checkpointer, device: torch.device,
          backend: str, call_wrapper: inprocess.CallWrapper | None = None) -> float:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    iteration = call_wrapper.iteration if call_wrapper is not None else 0
    # Rank monitors must learn about a (possibly) new rank-to-process mapping after a restart.
    if ft_client.is_initialized:
        ft_client.shutdown_workload_monitoring()
    ft_client.init_workload_monitoring()
    ckpt.abandon()  # a save in flight when the fault hit may be partial on some ranks
    store = dist.PrefixStore(f"iter{iteration}", base_store)
    timeout = args.pg_timeout or (10.0 if backend == "gloo" else 150.0)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        start, state = ckpt.load_latest()
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
        events.emit("start", rank=rank, step=start, iteration=iteration, world_size=world)
        loss = torch.tensor(0.0)
        for step in range(start, args.steps):
            poison = maybe_inject(args.fault, rank, step, ckpt.root / "faults")
            opt.zero_grad(set_to_none=True)
            out = ddp(batch(args, step, rank, device))
            loss = out.square().mean() * (float("nan") if poison else 1.0)
            loss.backward()
            # Every rank must see a divergence at once, or the others block in the next collective.
            global_loss = loss.detach().clone()
            dist.all_reduce(global_loss)
            if not torch.isfinite(global_loss):
                raise NonFiniteLoss(f"loss is {global_loss.item()} at step {step}")
            opt.step()
            if args.step_seconds:
                time.sleep(args.step_seconds)
            ft_client.send_heartbeat()
            ckpt.poll()
            done = step + 1
            events.emit("step", rank=rank, step=done, iteration=iteration)
            if done % args.checkpoint_interval == 0 or done == args.steps:
                state = {"model": model.state_dict(), "opt": opt.state_dict()}
                if call_wrapper is not None:
                    with call_wrapper.atomic():  # no restart may interrupt a save half-way
                        ckpt.save(done, state)
                else:
                    ckpt.save(done, state)
        ckpt.finalize()
        return float(loss.item())
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


class HostHealthCheck(inprocess.health_check.HealthCheck):
    """Device-independent checks before a rank rejoins after a fault: it must be able to write to
    the checkpoint volume and to /dev/shm (collectives and the async writer use both). A rank that
    cannot would fail the next save or step; it exits and ft_launcher takes over."""

    def __init__(self, checkpoint_dir: str):
        self.paths = [Path(checkpoint_dir), Path("/dev/shm")]

    def __call__(self, state: inprocess.FrozenState) -> inprocess.FrozenState:
        for path in self.paths:
            if not path.is_dir():
                continue
            probe = path / f".rtj-health-{os.getpid()}"
            try:
                probe.write_bytes(b"ok")
                probe.unlink()
            except OSError as exc:
                raise inprocess.exception.HealthCheckError(f"{path} is not writable: {exc}") from exc
        return state


def wrap(args: argparse.Namespace) -> Any:
    """`train` inside inprocess.Wrapper, with bounds that suit both CPU and GPU."""
    soft = datetime.timedelta(seconds=args.soft_timeout)
    hard = datetime.timedelta(seconds=args.hard_timeout)
    barrier = max(datetime.timedelta(seconds=120), hard + datetime.timedelta(seconds=30))
    checks: list[Any] = [inprocess.health_check.FaultCounter(max_rank_faults=args.inprocess_max_faults),
                         HostHealthCheck(args.checkpoint_dir)]
    if torch.cuda.is_available():
        checks.append(inprocess.health_check.CudaHealthCheck())
    return inprocess.Wrapper(
        store_kwargs={"port": int(os.environ["MASTER_PORT"]) + 2},
        health_check=inprocess.Compose(*checks),
        rank_assignment=inprocess.Compose(inprocess.rank_assignment.ActivateAllRanks(),
                                          inprocess.rank_assignment.ShiftRanks()),
        soft_timeout=soft, hard_timeout=hard, barrier_timeout=barrier, completion_timeout=barrier,
        heartbeat_timeout=datetime.timedelta(seconds=30),
    )(train)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # ft_launcher starts ranks only once rendezvous is complete.
    events.mark("started")
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s rank{os.environ.get('RANK', '?')} %(levelname)s %(message)s")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(1)
    model = build_model(args, device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    # The application store lives on MASTER_PORT + 1: the launcher's is on MASTER_PORT and the
    # in-process wrapper's on MASTER_PORT + 2.
    base_store = dist.TCPStore(host_name=os.environ["MASTER_ADDR"], port=int(os.environ["MASTER_PORT"]) + 1,
                               world_size=world, is_master=rank == 0, multi_tenant=True,
                               wait_for_workers=True, use_libuv=True)
    ckpt = Checkpointer(args.checkpoint_dir, rank, world, use_async=not args.sync_checkpoint,
                        keep=args.checkpoint_keep, on_commit=progress.publisher(rank))
    ft_client = RankMonitorClient()
    fn = train if args.no_inprocess else wrap(args)
    try:
        loss = fn(args, ft_client, base_store, model, opt, ckpt, device, backend)
    except NonFiniteLoss as exc:
        log.error("permanent failure: %s", exc)
        events.mark("permanent", str(exc))
        return exit_codes.PERMANENT_FAILURE
    finally:
        ckpt.close()
        if ft_client.is_initialized:
            ft_client.shutdown_workload_monitoring()
    events.emit("done", rank=rank, step=args.steps, save_seconds=round(ckpt.save_seconds, 4))
    if rank == 0:
        result = {"steps": args.steps, "loss": loss, "checksum": checksum(model), "world_size": world}
        (Path(args.checkpoint_dir) / "result.json").write_text(json.dumps(result))
        log.info("training finished: %s", result)
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
