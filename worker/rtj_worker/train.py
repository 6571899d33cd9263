"""Reference training script for ResilientTrainingJobs: FSDP2 with NVIDIA Resiliency Extension.

Run by ft_launcher (one process per GPU, or `procsPerNode` on CPU). Each rank:
- sends a RankMonitorClient heartbeat every step, inside setup/step/checkpointing sections when the
  launcher configured section timeouts (ft_launcher kills and respawns hung ranks),
- runs the training loop inside `inprocess.Wrapper`, so an exception on any rank restarts the
  loop on all ranks in the same processes (bounded by a per-rank fault counter),
- trains a toy MLP (the default) or, with `--model llama`, a Llama-architecture transformer
  (rtj_worker.models: RMSNorm, rotary embeddings, GQA attention, SwiGLU; random init),
- shards parameters and optimizer state with FSDP2 (`fully_shard`: every Linear of the MLP, every
  transformer block, then the root) and checkpoints the shards asynchronously (rtj_worker.checkpoint,
  in a thread or a process of its own); every restart iteration starts from the newest complete
  checkpoint, or from the initial weights when there is none. A save that comes due while the
  previous one is still being written is skipped (never waited for); the final one is not,
- when the pod is stopped (SIGTERM, see rtj_worker.stop), finishes its step and saves it with every
  other rank before exiting,
- once the final step is committed, rank 0 writes this job's completion marker: the entrypoint
  exits 0 only with it.

Batches depend only on (seed, step, rank) and kernels are deterministic (unless --nondeterministic),
so a run with faults ends with the same weights as a run without: tests compare the checksum rank 0
writes to <checkpoint dir>/result.json.
"""

import argparse
import contextlib
import datetime
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

# NVRx's in-process restart needs NCCL errors reported to Python, not turned into CUDA aborts,
# and NVLink SHARP off (NVRx known issues). The operator sets these too; they must precede torch.
if os.environ.get("RTJ_INPROCESS_ENABLED", "1") != "0":
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    os.environ.setdefault("TORCH_NCCL_RETHROW_CUDA_ERRORS", "0")
# cuBLAS is deterministic only with a fixed workspace (read when CUDA initializes).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch
import torch.distributed as dist
from nvidia_resiliency_ext import inprocess
from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from . import ckpt_index, events, exit_codes, memstate, ranks
from .checkpoint import WRITERS, Checkpointer, agree_min
from .faults import Fault, maybe_inject
from .models import Llama, LlamaConfig, next_token_loss
from .progress import RankProgress, for_this_rank
from .stop import StopRequest

log = logging.getLogger("rtj_worker.train")


class NonFiniteLoss(inprocess.exception.RestartAbort):
    """Training diverged: restarting from the same checkpoint would diverge again, so this
    bypasses in-process restarts (RestartAbort) and the entrypoint stops the launcher."""


class FinalCheckpointLost(RuntimeError):
    """The final step's save was not committed: training has not finished until it is (an in-process
    restart resumes from the newest committed step and saves the end again)."""


def env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="rtj_worker.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=200, help="Total optimizer steps.")
    parser.add_argument("--model", choices=("mlp", "llama"), default="mlp",
                        help="A toy MLP of --layers Linear+GELU, or a Llama-architecture transformer.")
    parser.add_argument("--model-dim", type=int, default=256, help="Width (the MLP's, or Llama's hidden size).")
    parser.add_argument("--layers", type=int, default=4, help="Linear layers, or transformer blocks.")
    parser.add_argument("--heads", type=int, default=8, help="Llama: attention (query) heads.")
    parser.add_argument("--kv-heads", type=int, default=2, help="Llama: key/value heads (GQA; = --heads: MHA).")
    parser.add_argument("--vocab", type=int, default=1024, help="Llama: vocabulary size.")
    parser.add_argument("--seq-len", type=int, default=128, help="Llama: tokens per sequence.")
    parser.add_argument("--batch", type=int, default=32, help="Rows (MLP) or sequences (Llama) per rank and step.")
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32",
                        help="bf16: compute in bfloat16 (FSDP2 mixed precision: parameters gathered in bf16, "
                             "gradients reduced in fp32, parameters and optimizer state kept in fp32, so "
                             "checkpoints are the same either way).")
    parser.add_argument("--activation-checkpointing", action="store_true",
                        help="Llama: keep only each block's input for the backward pass and recompute the rest "
                             "(about a third more compute; activations shrink about n_layers-fold).")
    parser.add_argument("--init", choices=("device", "meta"), default="device",
                        help="Llama: build whole on the device, then shard; or build on the meta device, shard "
                             "block by block and initialize only each rank's shard (no rank ever holds the "
                             "whole model: what a model larger than one GPU needs).")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--checkpoint-dir", default=os.environ.get("RTJ_CHECKPOINT_DIR", "/tmp/rtj-checkpoints"))
    parser.add_argument("--checkpoint-interval", type=int, default=env_int("RTJ_CHECKPOINT_INTERVAL", 50))
    parser.add_argument("--checkpoint-keep", type=int, default=env_int("RTJ_CHECKPOINT_KEEP", 3))
    parser.add_argument("--sync-checkpoint", action="store_true",
                        default=os.environ.get("RTJ_CHECKPOINT_ASYNC", "1") == "0",
                        help="Save in the training loop instead of asynchronously.")
    parser.add_argument("--checkpoint-writer", choices=WRITERS,
                        default=os.environ.get("RTJ_CHECKPOINT_WRITER", "thread"),
                        help="Who writes an asynchronous save: a thread of this process, or a process of its "
                             "own (no contention for the GIL with the thread that launches kernels).")
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
                        help="Collective timeout in seconds (default: 10 with gloo, 120 with NCCL). With gloo a "
                             "timed-out collective raises in the healthy ranks, so it must be below the "
                             "in-process soft timeout; with NCCL the watchdog kills the process, so it must "
                             "exceed the hard timeout (NVRx usage guide). The operator sets it "
                             "(resiliency.ncclTimeoutSeconds).")
    parser.add_argument("--step-seconds", type=float, default=0.0,
                        help="Extra time per step, to model a slower accelerator in benchmarks.")
    parser.add_argument("--nondeterministic", action="store_true",
                        help="Let torch pick its fastest kernels (flash or memory-efficient attention, whose "
                             "backward passes are not deterministic): a run with faults then ends with weights "
                             "close to, not equal to, a run without.")
    return parser.parse_args(argv)


def llama_config(args: argparse.Namespace) -> LlamaConfig:
    return LlamaConfig(vocab_size=args.vocab, dim=args.model_dim, n_layers=args.layers, n_heads=args.heads,
                       n_kv_heads=args.kv_heads, max_seq_len=args.seq_len)


def build_model(args: argparse.Namespace, device: torch.device) -> torch.nn.Module:
    """The same initial weights at every call (every restart iteration starts from them or a checkpoint)."""
    torch.manual_seed(args.seed)
    if args.model == "llama":
        # Initialized where it trains (no host copy of a large model), or nowhere yet (meta: fresh() shards
        # it, then each rank initializes its shard).
        with torch.device("meta" if args.init == "meta" else device):
            model = Llama(llama_config(args))
        model.activation_checkpointing = args.activation_checkpointing
        return model
    layers: list[torch.nn.Module] = []
    for _ in range(args.layers):
        layers += [torch.nn.Linear(args.model_dim, args.model_dim), torch.nn.GELU()]
    return torch.nn.Sequential(*layers).to(device)


def shard(model: torch.nn.Module, device: torch.device, world: int, precision: str = "fp32") -> torch.nn.Module:
    """FSDP2 over an explicit 1-D mesh of every rank: each unit (an MLP's Linear, a transformer block)
    gathers its parameters only around its own forward and backward; the root holds the rest (Llama's
    embedding, final norm and output head). Each rank holds 1/world of every weight. bf16: units gather
    their parameters in bf16 and reduce gradients in fp32; the sharded parameters stay fp32."""
    mesh = init_device_mesh(device.type, (world,))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if precision == "bf16"
              else MixedPrecisionPolicy())
    units = model.layers if isinstance(model, Llama) else [m for m in model if isinstance(m, torch.nn.Linear)]
    for unit in units:
        fully_shard(unit, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def _generator(args: argparse.Namespace, step: int, rank: int) -> torch.Generator:
    return torch.Generator().manual_seed(args.seed * 1_000_003 + step * 1009 + rank)


def batch(args: argparse.Namespace, step: int, rank: int, device: torch.device) -> torch.Tensor:
    return torch.randn(args.batch, args.model_dim, generator=_generator(args, step, rank)).to(device)


def tokens(args: argparse.Namespace, step: int, rank: int, device: torch.device) -> torch.Tensor:
    """(batch, seq_len + 1) token ids: arithmetic sequences modulo the vocabulary, with a random start
    and stride each, so that next-token prediction is learnable (the loss falls) from random weights."""
    gen = _generator(args, step, rank)
    start = torch.randint(0, args.vocab, (args.batch, 1), generator=gen)
    stride = torch.randint(1, 16, (args.batch, 1), generator=gen)
    return ((start + stride * torch.arange(args.seq_len + 1)) % args.vocab).to(device)


def step_loss(args: argparse.Namespace, model: torch.nn.Module, step: int, rank: int,
              device: torch.device) -> torch.Tensor:
    if args.model == "llama":
        ids = tokens(args, step, rank, device)
        return next_token_loss(model(ids[:, :-1]), ids[:, 1:])
    return model(batch(args, step, rank, device)).square().mean()


def deterministic(device: torch.device) -> None:
    """Kernels whose results do not depend on timing: tests compare the checksums of runs with and
    without faults. On CUDA the memory-efficient and flash attention kernels accumulate their backward
    pass with atomics (flash is deterministic only when torch may raise on every other op that is not),
    so attention uses the math kernel."""
    torch.use_deterministic_algorithms(True, warn_only=True)
    if device.type == "cuda":
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_cudnn_sdp(False)
        torch.backends.cuda.enable_math_sdp(True)


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
    model = shard(build_model(args, device), device, world, args.precision)
    if isinstance(model, Llama) and args.init == "meta":
        model.to_empty(device=device)
        torch.manual_seed(args.seed)
        model.init_weights()
    return model, torch.optim.Adam(model.parameters(), lr=args.lr)


def train_state(model: torch.nn.Module, opt: Any) -> dict[str, Any]:
    model_sd, optim_sd = get_state_dict(model, opt)
    return {"model": model_sd, "optim": optim_sd}


def atomic(call_wrapper: inprocess.CallWrapper | None) -> contextlib.AbstractContextManager:
    return call_wrapper.atomic() if call_wrapper is not None else contextlib.nullcontext()


def stop_save(ckpt: Checkpointer, step: int, state: Callable[[], dict[str, Any]], stop: StopRequest) -> None:
    """The pod is stopping (collective, every rank at the same step): commit the save in flight if
    it finishes in time, else save this step synchronously. The time left is agreed first (the
    signalled ranks' deadline), so that every rank takes the same branch and waits as long."""
    budget = agree_min(int(min(stop.remaining(), 1e9) * 1000), ckpt.group) / 1000
    if ckpt.in_flight is not None:
        ckpt.finalize(timeout=budget)
    elif budget > 0:  # the deadline (stop.py) ends a save that runs past it; it is then never committed
        ckpt.save(step, state(), sync=True)
    log.warning("stopping at step %d: newest committed checkpoint step %d", step, ckpt.committed_step)
    events.emit("stop_checkpoint", rank=ckpt.rank, step=step, committed=ckpt.committed_step)


# No `from __future__ import annotations` here: inprocess.Wrapper finds the CallWrapper parameter by
# issubclass() on each annotation, so every parameter of train() is annotated with a real class.
def init_group(backend: str, store: dist.Store, rank: int, world: int, timeout: float) -> None:
    """The default process group of one in-process iteration (`store` is prefixed by the iteration).

    torch names each new group by a per-process counter that it resets only when the default group is
    destroyed. A rank whose init_process_group failed (a peer too slow to connect within the timeout)
    has no group to destroy, so its counter runs ahead of its peers' and every later iteration's groups
    meet under different store keys: the in-process restart livelocks, each side waiting for keys the
    other never writes (seen on 2 loaded cores: names 7 and 8, ten iterations of 10 s timeouts, every
    one a peer's fault to each rank). The store's iteration prefix keeps names from 0 apart from any
    older group's, so every rank starts each iteration from 0.
    """
    if not dist.is_initialized():
        dist.distributed_c10d._world.group_count = 0
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=timeout))


def train(args: argparse.Namespace, ft_client: RankMonitorClient, base_store: dist.Store, ckpt: Checkpointer,
          device: torch.device, backend: str, stop: StopRequest, progress: RankProgress,
          call_wrapper: inprocess.CallWrapper | None = None) -> dict:
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    iteration = call_wrapper.iteration if call_wrapper is not None else 0
    # Rank monitors must learn about a (possibly) new rank-to-process mapping after a restart.
    section = Sections(ft_client)
    section.connect()
    ckpt.abandon()  # a save in flight when the fault hit may be partial on some ranks
    store = dist.PrefixStore(f"iter{iteration}", base_store)
    timeout = args.pg_timeout or (10.0 if backend == "gloo" else 120.0)
    try:
        with section.setup():
            init_group(backend, store, rank, world, timeout)
            # A save's ranks wait for the slowest writer: bound it like a checkpointing section.
            ckpt.attach(timeout=datetime.timedelta(seconds=float(os.environ.get("RTJ_FT_HEARTBEAT_TIMEOUT", 900))))
            # Built anew every iteration: a restart must never keep weights trained since the last
            # checkpoint (nor FSDP state bound to the previous iteration's process group).
            model, opt = fresh(args, device, world)
            state = train_state(model, opt)
            start = ckpt.load_latest(state)
            if start:
                set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
            elif ckpt.load_failed:  # a failed load may have overwritten part of the initial state
                model, opt = fresh(args, device, world)
        events.emit("start", rank=rank, step=start, iteration=iteration, world_size=world, backend=backend,
                    host=os.uname().nodename, model=args.model, source=ckpt.restored_from if start else None,
                    restore_seconds=ckpt.restore_seconds if start else None)
        progress.loaded(start)
        progress.started(rank, iteration, start, ckpt.restored_from if start else None, ckpt.restore_seconds)
        loss = torch.tensor(0.0)
        stop.enter_training()
        try:
            for step in range(start, args.steps):
                with section("step"):
                    poison = maybe_inject(args.fault, rank, step, ckpt.root / "faults", ft_client)
                    opt.zero_grad(set_to_none=True)
                    loss = step_loss(args, model, step, rank, device) * (float("nan") if poison else 1.0)
                    loss.backward()
                    # One all-reduce carries the loss and this rank's vote to stop: every rank must see
                    # a divergence, and a stop, at the same step, or the others block in the next
                    # collective.
                    agreed = torch.stack([loss.detach(), loss.new_tensor(float(stop.requested))])
                    dist.all_reduce(agreed)
                    global_loss, stop_votes = agreed.tolist()
                    if not math.isfinite(global_loss):
                        raise NonFiniteLoss(f"loss is {global_loss} at step {step}")
                    opt.step()
                    if args.step_seconds:
                        time.sleep(args.step_seconds)
                    ft_client.send_heartbeat()
                    ckpt.poll()
                done = step + 1
                events.emit("step", rank=rank, step=done, iteration=iteration, loss=round(global_loss / world, 5))
                progress.stepped(done)
                final = done == args.steps
                if stop_votes and not final:
                    with section("checkpointing"), atomic(call_wrapper):
                        stop_save(ckpt, done, lambda: train_state(model, opt), stop)
                    if stop.requested:  # ranks of nodes that were not signalled train on
                        stop.saved_and_exit(done, ckpt.committed_step)
                elif done % args.checkpoint_interval == 0 or final:
                    stalled = time.perf_counter()
                    state = train_state(model, opt)
                    with section("checkpointing"), atomic(call_wrapper):  # no restart may interrupt a save
                        if ckpt.save(done, state, skip_if_busy=not final) and not final:
                            progress.stalled(time.perf_counter() - stalled)  # the loop's cost of one save
            with section("checkpointing"):
                ckpt.finalize()
            if ckpt.committed_step < args.steps:  # (more: resumed from a longer run's checkpoint)
                raise FinalCheckpointLost(f"the final checkpoint (step {args.steps}) was not committed")
            result = {"loss": float(loss.item()), "checksum": checksum(model)}
        except BaseException as exc:
            try:
                if not isinstance(exc, (SystemExit, KeyboardInterrupt)):
                    progress.failed(exc, progress.step, own=own_fault(exc))
            finally:  # even if inprocess.Wrapper's asynchronous exception lands in the report
                stop.leave_training()  # ends this rank if it was asked to stop
            raise
        stop.finished()
        return result
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


def own_fault(exc: BaseException) -> bool:
    """Whether this rank raised the fault itself: not a peer's seen through a collective, nor the
    Wrapper's RankShouldRestart (raised into a rank because another one failed)."""
    return not caused_by_peer(exc) and not any(c.__name__ == "RankShouldRestart" for c in type(exc).__mro__)


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


class IntRankBarriers:
    """NVRx's sibling monitor (0.4.1 and 0.6) passes the initial ranks of the ranks it found silent to
    termination_barrier as the store's bytes (get_initial_ranks returns multi_get's values), so the
    barrier's key gets "b'2'," appended and every later reader fails on int("b'2'"): a ValueError in
    CallWrapper.shutdown, which then never stops its (non-daemon) ProgressWatchdog thread, and the rank
    hangs at exit until its launcher kills it (exit 143). That is every node loss where a whole node's
    ranks went silent: the survivors' launcher then counted a restart of its own. Ranks are ints here."""

    def termination_barrier(self, ranks: Any, **kwargs: Any) -> None:
        inprocess.store.StoreMixin.reentrant_barrier(
            self, [int(r) for r in ranks], group_name=inprocess.store.StoreMixin.TERMINATION_BARRIER, **kwargs)


class NodeZeroStore(IntRankBarriers, inprocess.store.TCPStore):
    """inprocess.Wrapper's store when node 0's rank 0 serves it (no coordinator)."""


class CoordinatorStore(IntRankBarriers, dist.PrefixStore, inprocess.store.StoreMixin):
    """inprocess.Wrapper's store when the coordinator serves it: every rank a client, and its keys (its
    barriers are not prefixed by iteration) those of this worker group only, since the store outlives it."""

    def __init__(self, host_name: str, port: int, prefix: str, timeout: datetime.timedelta = datetime.timedelta(
            seconds=300)):
        self.base_store = dist.TCPStore(host_name=host_name, port=port, is_master=False, timeout=timeout,
                                        use_libuv=True)
        super().__init__(f"{prefix}/wrapper", self.base_store)

    @property
    def critical_ranks(self) -> tuple[int, ...]:
        return ()  # no rank hosts it


class WorldLost(inprocess.exception.RestartError):
    """Ranks left the world: the in-process layer cannot recover it (see FullWorld)."""


class FullWorld(inprocess.rank_assignment.RankAssignment):
    """In-process restart only with every rank. NVRx's ShiftRanks (and FillGaps) go on with a smaller
    world when ranks left (their pod deleted or stopped, their node lost): this job would then train
    on other batches (they follow seed, step and rank) at another global batch size, and the
    replacement pod would find nobody to join. Here the survivors leave too, and ft_launcher's next
    rendezvous round brings the world back whole (a spare, or the replacement).

    `on_leave` hears it first: the Wrapper's exit path still has barriers to pass before the exception
    reaches the caller, and the pod's report must know the restart that follows is not this pod's."""

    def __init__(self, on_leave: Callable[[str], None] | None = None):
        self.on_leave = on_leave

    def __call__(self, ctx: inprocess.rank_assignment.RankAssignmentCtx) -> inprocess.rank_assignment.RankAssignmentCtx:
        if ctx.terminated_ranks:
            lost = WorldLost(f"ranks {sorted(ctx.terminated_ranks)} of {ctx.state.world_size} left: "
                             "leaving the in-process restart to ft_launcher's next rendezvous")
            if self.on_leave is not None:
                self.on_leave(str(lost))
            raise lost
        return ctx


def wrapper_timeouts(hard_seconds: float, rendezvous_seconds: float) -> tuple[datetime.timedelta, datetime.timedelta]:
    """(barrier, heartbeat) timeouts of inprocess.Wrapper. The barrier is how long ranks wait for each
    other to restart in process: below half the rendezvous timeout where it can be (when a whole node is
    gone its replacement's launcher waits that long to join, and the others must give up on the
    in-process restart, and start a new rendezvous round, before it does), never below the hard timeout
    plus a margin. The heartbeat (a rank's silence that counts as its death) must be below the barrier:
    NVRx rejects anything else (inprocess.Wrapper: heartbeat_timeout < barrier_timeout)."""
    barrier = max(hard_seconds + 15.0, min(120.0, rendezvous_seconds / 2))
    return datetime.timedelta(seconds=barrier), datetime.timedelta(seconds=min(30.0, barrier / 2))


def wrap(args: argparse.Namespace, store_host: str, wrapper_port: int, group: str | None = None,
         on_leave: Callable[[str], None] | None = None) -> Any:
    """`train` inside inprocess.Wrapper, with bounds that suit both CPU and GPU. `group`: the coordinator
    serves the Wrapper's store (else node 0's rank 0 does), under this worker group's prefix. `on_leave`:
    told when this rank leaves because peers left the world (FullWorld)."""
    soft = datetime.timedelta(seconds=args.soft_timeout)
    hard = datetime.timedelta(seconds=args.hard_timeout)
    barrier, heartbeat = wrapper_timeouts(args.hard_timeout, float(os.environ.get("RTJ_RDZV_TIMEOUT", 600)))
    checks: list[Any] = [RankFaultCounter(max_rank_faults=args.inprocess_max_faults),
                         HostHealthCheck(args.checkpoint_dir)]
    if torch.cuda.is_available():
        checks.append(inprocess.health_check.CudaHealthCheck())
    with _without_local_rank():
        store: dict[str, Any] = {"store_factory": NodeZeroStore,
                                 "store_kwargs": {"host_name": store_host, "port": wrapper_port}}
        if group is not None:
            store = {"store_factory": CoordinatorStore,
                     "store_kwargs": {"host_name": store_host, "port": wrapper_port, "prefix": group}}
        return inprocess.Wrapper(
            **store,
            health_check=inprocess.Compose(*checks),
            rank_assignment=inprocess.Compose(inprocess.rank_assignment.ActivateAllRanks(), FullWorld(on_leave)),
            soft_timeout=soft, hard_timeout=hard, barrier_timeout=barrier, completion_timeout=barrier,
            heartbeat_timeout=heartbeat,
        )(train)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO,
                        format=f"%(asctime)s rank{os.environ.get('RANK', '?')} %(levelname)s %(message)s")
    stop = StopRequest(os.environ.get("RTJ_STATE_DIR"))
    stop.install()  # before any thread or fork (the wrapper's monitor process)
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
    if not args.nondeterministic:
        deterministic(device)
    host, port = ranks.store_endpoint(os.environ)
    coordinator = os.environ.get("RTJ_COORDINATOR") == "1"
    # The store's server runs where its address points: the coordinator pod, or node 0's local rank 0
    # (whatever rank the launcher gave that process); everyone else is a client.
    base_store: dist.Store = dist.TCPStore(
        host_name=host, port=port + ranks.APP_STORE_OFFSET, world_size=None if coordinator else world,
        is_master=not coordinator and node_rank == 0 and local_rank == 0, multi_tenant=True,
        wait_for_workers=not coordinator, use_libuv=True)
    # Keys of this worker group only. Node 0's store is new at every worker-group start (its server is
    # that group's process); the coordinator's outlives groups, so they are prefixed with what names this
    # group alone and every rank of it agrees on: the address ft_launcher gave it for its own store
    # (picked afresh at each rendezvous). Not TORCHELASTIC_RESTART_COUNT: it differs between nodes (a node
    # restarted for a peer's failure does not count it), and the ranks of a multi-node group then waited
    # on different keys for ever (found end to end with 2 nodes).
    group = ranks.group_key(os.environ) if coordinator else f"attempt{os.environ.get('RTJ_ATTEMPT', '0')}"
    base_store = dist.PrefixStore(group, base_store)
    slot_file = ranks.slot_file(os.environ.get("RTJ_STATE_DIR"))
    rank = ranks.numeric_rank(base_store, launcher_rank, world, node_rank, local_rank, "ranks",
                              ranks.read_slot(slot_file))
    if slot_file is not None and local_rank == 0:  # the node's slot: its first rank's // ranks per node
        with contextlib.suppress(OSError):
            slot_file.write_text(str(rank // int(os.environ.get("LOCAL_WORLD_SIZE") or 1)))
    os.environ["RANK"] = str(rank)  # inprocess.Wrapper and train() read it
    # What this rank tells its pod's entrypoint (rtj_worker.report); the run: this worker group on this node.
    progress = for_this_rank(os.environ)
    uid = os.environ.get("RTJ_UID", "")
    attempt = int(os.environ.get("RTJ_ATTEMPT") or 0)
    tiers = memstate.Tiers.from_env(os.environ, rank, world, uid)
    ckpt = Checkpointer(args.checkpoint_dir, rank, world, use_async=not args.sync_checkpoint,
                        keep=args.checkpoint_keep, uid=uid, writer=args.checkpoint_writer,
                        address=ranks.own_address(host, os.environ) if args.checkpoint_writer == "process" else None,
                        on_commit=progress.commit, tiers=tiers,
                        local_world=int(os.environ.get("LOCAL_WORLD_SIZE", 1)), attempt=attempt)
    progress.tiers = tiers
    ft_client = RankMonitorClient()
    # A rank that leaves because peers left is not at fault: its pod's report counts no recovery for the
    # launcher's restart that follows.
    fn = train if args.no_inprocess else wrap(args, host, port + ranks.WRAPPER_STORE_OFFSET,
                                              group if coordinator else None, on_leave=progress.left)
    try:
        result = fn(args, ft_client, base_store, ckpt, device, backend, stop, progress)
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
        # train() returned only once step args.steps (or a later one) was committed, every rank agreed.
        try:
            ckpt_index.write_finished(Path(args.checkpoint_dir), uid, ckpt.committed_step, attempt)
        except ckpt_index.Superseded as exc:
            log.error("%s", exc)
            return exit_codes.OK
        log.info("training finished: %s", result)
    return exit_codes.OK


if __name__ == "__main__":
    sys.exit(main())
