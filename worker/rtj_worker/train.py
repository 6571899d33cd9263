"""Reference training script for ResilientTrainingJobs: FSDP2 with NVIDIA Resiliency Extension.

Run by ft_launcher (one process per GPU, or `procsPerNode` on CPU). Each rank:
- sends a RankMonitorClient heartbeat every step, inside setup/step/checkpointing sections when the
  launcher configured section timeouts (ft_launcher kills and respawns hung ranks),
- runs the training loop inside `inprocess.Wrapper`, so an exception on any rank restarts the
  loop on all ranks in the same processes (bounded by a per-rank fault counter),
- shards parameters and optimizer state with FSDP2 (`fully_shard`) and checkpoints the shards
  asynchronously (rtj_worker.checkpoint); every restart iteration starts from the newest complete
  checkpoint, or from the initial weights when there is none.

Batches depend only on (seed, step, rank), so a run with faults ends with the same weights as a
run without: tests compare the checksum rank 0 writes to <checkpoint dir>/result.json.
"""

import argparse
import contextlib
import datetime
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# NVRx's in-process restart needs NCCL errors reported to Python, not turned into CUDA aborts,
# and NVLink SHARP off (NVRx known issues). The operator sets these too; they must precede torch.
if os.environ.get("RTJ_INPROCESS_ENABLED", "1") != "0":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_NCCL_RETHROW_CUDA_ERRORS", "0")

import torch
import torch.distributed as dist
from nvidia_resiliency_ext import inprocess
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from . import events, exit_codes, ranks
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
                        help="Save in the training loop instead of asynchronously.")
    parser.add_argument("--no-inprocess", action="store_true",
                        default=os.environ.get("RTJ_INPROCESS_ENABLED", "1") == "0",
                        help="Run without inprocess.Wrapper (exceptions then end the rank).")
    parser.add_argument("--inprocess-max-faults", type=int, default=env_int("RTJ_INPROCESS_MAX_ITERATIONS", 5),
                        help="Faults this rank may cause (exceptions of its own, not a peer's) before it "
                             "exits and ft_launcher takes over.")
    parser.add_argument("--soft-timeout", type=float, default=env_int("RTJ_INPROCESS_SOFT_TIMEOUT", 45))
    parser.add_argument("--hard-timeout", type=float, default=env_int("RTJ_INPROCESS_HARD_TIMEOUT", 55))
    parser.add_argument("--fault", type=Fault.parse, action="append", default=[],
                        help="Inject RANK:STEP:KIND (exc|sigkill|hang|nan); repeatable.")
    parser.add_argument("--pg-timeout", type=float, default=float(os.environ.get("RTJ_NCCL_TIMEOUT", 0)) or None,
                        help="Collective timeout in seconds (default: 10 with gloo, 30 with NCCL). It bounds "
                             "how long a healthy rank blocks in a collective with a failed peer; NVRx needs "
                             "it below the in-process soft timeout.")
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="Extra time per step, to model a slower accelerator in benchmarks.")
    return parser.parse_args(argv)


def build_model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    torch.manual_seed(args.seed)
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.model_dim, args.model_dim), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to(device)


def shard(model: torch.nn.Module, device: torch.device, world: int) -> torch.nn.Module:
    """FSDP2: every Linear is its own unit, so each rank holds 1/world of every weight."""
    mesh = init_device_mesh(device.type, (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def batch(args: argparse.Namespace, step: int, rank: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)
    return torch.randn(args.batch, args.model_dim, generator=gen).to(device)


def checksum(model: torch.nn.Module) -> float:
    """Collective: gathers every shard."""
    with torch.no_grad():
        total = 0.0
        for p in model.parameters():
            full = p.full_tensor() if hasattr(p, "full_tensor") else p
            total += float(full.double().abs().sum().item())
        return total


class Sections:
    """NVRx rank-monitor sections when the launcher configured section timeouts (RTJ_FT_SECTIONS=1)."""

    def __init__(self, client: RankMonitorClient):
        self.client, self.enabled = client, os.environ.get("RTJ_FT_SECTIONS") == "1"

    def connect(self) -> None:
        """(Re)connect to this rank's monitor and at once tell it that the rank is back, with the
        "setup" section opened (sections), or an empty section update (heartbeats; it leaves the
        initial heartbeat timeout in force).

        Why at once: NVRx's rank monitor (0.4.1 and 0.6.0 alike) stays in its "restart handling"
        state from a lost connection until the next message; if the launcher closes the connection in
        that state (another node started a new rendezvous round), the monitor moves to ABORTED, which
        it never leaves, and every heartbeat of every worker respawned on this local rank fails from
        then on. Seen end to end: a hung rank on node 1 made node 0's ranks restart in process while
        both launchers restarted their workers, and training never resumed."""
        if self.client.is_initialized:
            self.client.shutdown_workload_monitoring()
        self.client.init_workload_monitoring()
        if self.enabled:
            self.client.start_section("setup")
        else:
            self.client.end_all_sections()

    @contextlib.contextmanager
    def setup(self) -> Iterator[None]:
        """The "setup" section that connect() opened."""
        try:
            yield
        finally:
            if self.enabled:
                self.client.end_section("setup")

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        if self.enabled:
            self.client.start_section(name)
        try:
            yield
        finally:
            if self.enabled:
                self.client.end_section(name)


def fresh(args: argparse.Namespace, device: torch.device, world: int) -> tuple[torch.nn.Module, Any]:
    model = shard(build_model(args, device), device, world)
    return model, torch.optim.Adam(model.parameters(), lr=args.lr)


# No `from __future__ import annotations` here: inprocess.Wrapper finds the CallWrapper parameter by
# issubclass() on each annotation, so every parameter of train() is annotated with a real class.
def train(args: argparse.Namespace, ft_client: RankMonitorClient, base_store: dist.Store, ckpt: Checkpointer,
          device: torch.device, backend: str, call_wrapper: inprocess.CallWrapper | None = None) -> dict:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    iteration = call_wrapper.iteration if call_wrapper is not None else 0
    # Rank monitors must learn about a (possibly) new rank-to-process mapping after a restart.
    section = Sections(ft_client)
    section.connect()
    ckpt.abandon()  # a save in flight when the fault hit may be partial on some ranks
    store = dist.PrefixStore(f"iter{iteration}", base_store)
    timeout = args.pg_timeout or (10.0 if backend == "gloo" else 30.0)
    try:
        with section.setup():
            dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=timeout))
            # A save's ranks wait for the slowest writer: bound it like a checkpointing section.
            ckpt.attach(timeout=datetime.timedelta(seconds=float(os.environ.get("RTJ_FT_HEARTBEAT_TIMEOUT", 900))))
            # Built anew every iteration: a restart must never keep weights trained since the last
            # checkpoint (nor FSDP state bound to the previous iteration's process group).
            model, opt = fresh(args, device, world)
            model_sd, optim_sd = get_state_dict(model, opt)
            state = {"model": model_sd, "optim": optim_sd}
            start = ckpt.load_latest(state)
            if start:
                set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            elif ckpt.load_failed:  # a failed load may have overwritten part of the initial state
                model, opt = fresh(args, device, world)
        events.emit("start", rank=rank, step=start, iteration=iteration, world_size=world, backend=backend)
        loss = torch.tensor(0.0)
        for step in range(start, args.steps):
            with section("step"):
                poison = maybe_inject(args.fault, rank, step, ckpt.root / "faults")
                opt.zero_grad(set_to_none=True)
                out = model(batch(args, step, rank, device))
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
                model_sd, optim_sd = get_state_dict(model, opt)
                with section("checkpointing"):
                    if call_wrapper is not None:
                        with call_wrapper.atomic():  # no restart may interrupt a save half-way
                            ckpt.save(done, {"model": model_sd, "optim": optim_sd})
                    else:
                        ckpt.save(done, {"model": model_sd, "optim": optim_sd})
        with section("checkpointing"):
            ckpt.finalize()
        return {"loss": float(loss.item()), "checksum": checksum(model)}
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def caused_by_peer(exc: BaseException | None) -> bool:
    """True for the error a healthy rank gets when a peer failed: its collective timed out or lost
    the connection. Not this rank's fault, so it must not count against it."""
    markers = ("Connection closed by peer", "Connection reset by peer", "Broken pipe", "timed out",
               "Timed out", "aborted", "Socket Timeout")
    seen, hops = exc, 0
    while seen is not None and hops < 10:
        if isinstance(seen, dist.DistError) or any(m in str(seen) for m in markers):
            return True
        seen, hops = seen.__cause__ or seen.__context__, hops + 1
    return False


class RankFaultCounter(inprocess.health_check.FaultCounter):
    """FaultCounter that counts only faults this rank caused. NVRx's counts every exception, so the
    healthy rank whose collective timed out because a peer raised is charged too, and a schedule
    of faults spread over ranks ends the in-process layer early."""

    def __call__(self, state: inprocess.FrozenState) -> inprocess.FrozenState:
        if caused_by_peer(state.fn_exception):
            log.info("not counting a peer's fault against this rank: %s", state.fn_exception)
            return state
        return super().__call__(state)


class HostHealthCheck(inprocess.health_check.HealthCheck):
    """Device-independent checks before a rank rejoins after a fault: it must be able to write to
    the checkpoint volume and to /dev/shm. A rank that cannot would fail the next save or step; it
    exits and ft_launcher takes over."""

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


@contextlib.contextmanager
def _without_local_rank() -> Iterator[None]:
    """NVRx 0.6's Wrapper adds GPU, NVLink and NIC health checks when LOCAL_RANK is set; with no
    GPU they cannot pass. Hide LOCAL_RANK while the Wrapper is built on a CPU-only host."""
    saved = os.environ.pop("LOCAL_RANK", None) if not torch.cuda.is_available() else None
    try:
        yield
    finally:
        if saved is not None:
            os.environ["LOCAL_RANK"] = saved


def wrap(args: argparse.Namespace, store_host: str, wrapper_port: int) -> Any:
    """`train` inside inprocess.Wrapper, with bounds that suit both CPU and GPU."""
    soft = datetime.timedelta(seconds=args.soft_timeout)
    hard = datetime.timedelta(seconds=args.hard_timeout)
    barrier = max(datetime.timedelta(seconds=120), hard + datetime.timedelta(seconds=30))
    checks: list[Any] = [RankFaultCounter(max_rank_faults=args.inprocess_max_faults),
                         HostHealthCheck(args.checkpoint_dir)]
    if torch.cuda.is_available():
        checks.append(inprocess.health_check.CudaHealthCheck())
    with _without_local_rank():
        return inprocess.Wrapper(
            store_kwargs={"host_name": store_host, "port": wrapper_port},
            health_check=inprocess.Compose(*checks),
            rank_assignment=inprocess.Compose(inprocess.rank_assignment.ActivateAllRanks(),
                                              inprocess.rank_assignment.ShiftRanks()),
            soft_timeout=soft, hard_timeout=hard, barrier_timeout=barrier, completion_timeout=barrier,
            heartbeat_timeout=datetime.timedelta(seconds=30),
        )(train)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s rank{os.environ.get('RANK', '?')} %(levelname)s %(message)s")
    launcher_rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    # NODE_RANK: the Job's completion index (the operator); GROUP_RANK: torch elastic's, outside it.
    node_rank = int(os.environ.get("NODE_RANK", os.environ.get("GROUP_RANK", 0)))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device, backend = torch.device("cuda", local_rank), "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        torch.set_num_threads(1)
    host, port = ranks.store_endpoint(os.environ)
    # The store's server runs where its address points: node 0, local rank 0 (whatever rank the
    # launcher gave that process).
    base_store = dist.TCPStore(host_name=host, port=port + ranks.APP_STORE_OFFSET, world_size=world,
                               is_master=node_rank == 0 and local_rank == 0, multi_tenant=True,
                               wait_for_workers=True, use_libuv=True)
    # The store is new at every worker-group start (its server is this group's node-0 rank-0 process),
    # so the gang attempt alone names the keys. Not TORCHELASTIC_RESTART_COUNT: it differs between
    # nodes (a node restarted for a peer's failure does not count it), and the ranks of a multi-node
    # group then waited on different keys for ever (found end to end with 2 nodes).
    rank = ranks.numeric_rank(base_store, launcher_rank, world, node_rank, local_rank,
                              f"ranks/{os.environ.get('RTJ_ATTEMPT', '0')}")
    os.environ["RANK"] = str(rank)  # inprocess.Wrapper and train() read it
    ckpt = Checkpointer(args.checkpoint_dir, rank, world, use_async=not args.sync_checkpoint,
                        keep=args.checkpoint_keep, uid=os.environ.get("RTJ_UID", ""))
    ft_client = RankMonitorClient()
    fn = train if args.no_inprocess else wrap(args, host, port + ranks.WRAPPER_STORE_OFFSET)
    try:
        result = fn(args, ft_client, base_store, ckpt, device, backend)
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
        result = {"steps": args.steps, **result, "world_size": world}
        (Path(args.checkpoint_dir) / "result.json").write_text(json.dumps(result))
        log.info("training finished: %s", result)
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
