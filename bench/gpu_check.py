"""The worker's GPU check (hack/gpu_check.sh): one GPU machine, offline, one command of under 8 minutes,
one table (check, result, seconds, detail); exits 1 if a check fails.

Two backends, because the machine has one GPU and NCCL refuses two ranks on one device:
- NCCL, a world of 1: every check the GPU changes. The Llama model under FSDP2 (units per block,
  collectives and the checkpoint agreement on NCCL: no CPU backend in the training group), staging
  from device memory (pinned, non-blocking), inprocess.Wrapper's restarts across NCCL communicators,
  NVRx's GPU health checks, NCCL's watchdog against the Wrapper's timeouts: each fault kind, the NCCL
  hang, checkpoint overlap with each writer, a save slower than the interval.
- gloo, a world of 2 (CPU tensors): what needs two ranks. A peer's exception failing the healthy rank's
  collective (both restart in process), two writer processes' own world, the commit agreement.
--cpu runs every check with gloo on CPU (a world of 1 where the GPU run has NCCL's) to prove the code
paths before a device is lent. Checks that would not fit in --budget are reported as skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rtj_worker import local

STEPS, INTERVAL = 60, 10
MODELS = {  # Llama configs: ~150M parameters, 8 x 1024 tokens a step on the GPU; tiny on CPU
    "gpu": {"model-dim": 1024, "layers": 8, "heads": 16, "kv-heads": 4, "vocab": 32000, "seq-len": 1024, "batch": 8},
    "cpu": {"model-dim": 64, "layers": 2, "heads": 4, "kv-heads": 2, "vocab": 256, "seq-len": 32, "batch": 4},
}
HEARTBEAT = 20.0  # ft_launcher's rank heartbeat/section timeout, below the Wrapper's soft timeout (30)
# The NCCL hang: the Wrapper's timeouts first, NCCL's watchdog (the collective timeout) after them.
STALL = {"soft": 10, "hard": 20, "nccl": 45}


def model_flags(model: dict[str, Any]) -> list[str]:
    return ["--model", "llama", *(arg for flag, value in model.items() for arg in (f"--{flag}", str(value)))]


@dataclass
class Row:
    check: str
    result: str  # ok, FAIL, SKIP
    seconds: float
    detail: str


class Context:
    def __init__(self, args: argparse.Namespace, root: Path):
        self.cpu, self.root, self.args = args.cpu, root, args
        self.model = MODELS["cpu" if args.cpu else "gpu"]
        self.reference: dict[str, Any] | None = None  # the clean run's result.json
        self.logs: list[tuple[str, str]] = []  # the logs of failed launches, printed after the table

    @property
    def backend(self) -> str:
        return "gloo" if self.cpu else "nccl"

    def train_args(self, model: dict[str, Any] | None = None, steps: int = STEPS) -> list[str]:
        args = ["--steps", str(steps), "--checkpoint-interval", str(INTERVAL), *model_flags(model or self.model)]
        return args + (["--step-seconds", "0.05"] if self.cpu or model is MODELS["cpu"] else [])

    def launch(self, name: str, *extra: str, ranks: int = 1, on_cpu: bool = False, steps: int = STEPS,
               heartbeat: float = HEARTBEAT, **env: str) -> local.LocalRun:
        """The reference trainer under rtj-worker -> ft_launcher -> inprocess.Wrapper, as in a pod."""
        on_cpu = on_cpu or self.cpu
        env = {"RTJ_INPROCESS_SOFT_TIMEOUT": "30", "RTJ_INPROCESS_HARD_TIMEOUT": "45",
               "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT": "300", **({"CUDA_VISIBLE_DEVICES": ""} if on_cpu else {}), **env}
        run = local.launch(self.root / name, [*self.train_args(MODELS["cpu"] if on_cpu else None, steps), *extra],
                           timeout=400, ranks=ranks, heartbeat=heartbeat, **env)
        for step in (self.root / name / "ckpt").glob("step-*"):  # GBs each on the GPU: keep the disk
            shutil.rmtree(step, ignore_errors=True)
        return run

    def failed(self, name: str, run: local.LocalRun) -> None:
        self.logs.append((name, "\n".join(run.log.splitlines()[-60:])))


def starts_after(run: local.LocalRun, t: float) -> list[dict[str, Any]]:
    return [e for e in run.starts() if e["t"] > t]


def faults(run: local.LocalRun) -> dict[str, dict[str, Any]]:
    return {e["kind"]: e for e in run.timeline if e["event"] == "fault"}


def same_weights(ctx: Context, run: local.LocalRun) -> tuple[bool, str]:
    if ctx.reference is None or run.code != 0:
        return False, "no clean run to compare with" if ctx.reference is None else f"exit {run.code}"
    got, want = run.result()["checksum"], ctx.reference["checksum"]
    if got == want:
        return True, "weights identical to the clean run's"
    diff = abs(got - want) / abs(want)
    return diff <= 1e-6, f"weights differ from the clean run's by {diff:.1e} (relative checksum)"


def step_ms(run: local.LocalRun) -> float:
    steps = [e for e in run.timeline if e["event"] == "step" and e["rank"] == 0]
    return 1000 * (steps[-1]["t"] - steps[0]["t"]) / max(1, len(steps) - 1)


# --- the checks: each returns its rows ----------------------------------------------------------

def check_clean(ctx: Context) -> list[Row]:
    from rtj_worker.models import LlamaConfig

    started = time.monotonic()
    run = ctx.launch("clean")
    m = ctx.model
    cfg = LlamaConfig(vocab_size=m["vocab"], dim=m["model-dim"], n_layers=m["layers"], n_heads=m["heads"],
                      n_kv_heads=m["kv-heads"], max_seq_len=m["seq-len"])
    backends = {e["backend"] for e in run.starts()}
    ok = run.code == 0 and backends == {ctx.backend} and len(run.starts()) == 1
    if ok:
        ctx.reference = run.result()
        losses = [e["loss"] for e in run.timeline if e["event"] == "step"]
        detail = (f"{ctx.backend} world 1, FSDP2 per block, Llama {cfg.num_params() / 1e6:.1f}M params "
                  f"({m['layers']}x{m['model-dim']}, {m['heads']}/{m['kv-heads']} GQA heads), {STEPS} steps at "
                  f"{step_ms(run):.0f} ms, loss {losses[0]:.2f} -> {losses[-1]:.2f}")
    else:
        ctx.failed("clean", run)
        detail = f"exit {run.code}, backends {sorted(backends)}, {len(run.starts())} starts"
    return [Row("clean run (the reference)", "ok" if ok else "FAIL", time.monotonic() - started, detail)]


def check_faults(ctx: Context) -> list[Row]:
    """exc, sigkill and hang in one run (each marker fires once), each recovered by its layer."""
    started = time.monotonic()
    run = ctx.launch("faults", "--fault", "0:15:exc", "--fault", "0:35:sigkill", "--fault", "0:50:hang")
    fired, first = faults(run), run.starts()[:1]
    rows = []
    for kind, label, expect in (("exc", "fault exc: in-process restart", "same"),
                                ("sigkill", "fault sigkill: ft_launcher respawn", "new"),
                                ("hang", "fault hang: heartbeat timeout, respawn", "new")):
        fault = fired.get(kind)
        after = starts_after(run, fault["t"]) if fault else []
        if not fault or not after or not first:
            rows.append(Row(label, "FAIL", 0.0, "the fault did not fire" if not fault else "never resumed"))
            continue
        resumed, seconds = after[0], after[0]["t"] - fault["t"]
        same = resumed["pid"] == fault["pid"]
        ok = same == (expect == "same") and resumed["step"] <= fault["step"] and resumed["step"] % INTERVAL == 0
        if kind == "hang":
            ok = ok and seconds >= HEARTBEAT
        how = f"same process, iteration {resumed['iteration']}" if same else "a new process"
        rows.append(Row(label, "ok" if ok else "FAIL", seconds,
                        f"{how}, resumed from step {resumed['step']} (fault at {fault['step']}) {seconds:.0f} s later"
                        + (f" (heartbeat timeout {HEARTBEAT:g} s)" if kind == "hang" else "")))
    ok, detail = same_weights(ctx, run)
    if not ok:
        ctx.failed("faults", run)
    rows.append(Row("faults exc + sigkill + hang: final weights", "ok" if ok else "FAIL", time.monotonic() - started,
                    detail))
    return rows


def check_nan(ctx: Context) -> list[Row]:
    started = time.monotonic()
    run = ctx.launch("nan", "--fault", "0:5:nan", steps=20)
    from rtj_worker import exit_codes

    ok = run.code == exit_codes.PERMANENT_FAILURE and len(run.starts()) == 1
    if not ok:
        ctx.failed("nan", run)
    return [Row("fault nan: permanent, no restart", "ok" if ok else "FAIL", time.monotonic() - started,
                f"exit {run.code} ({run.report.get('reason', '?')}), {len(run.starts())} start(s)")]


def check_stall(ctx: Context) -> list[Row]:
    """A collective that never completes, for longer than the Wrapper's hard timeout: the Wrapper must
    act first (its soft timeout cannot interrupt a native call; its hard timeout terminates the rank,
    ft_launcher respawns it), before NCCL's watchdog, which must be set longer than the hard timeout
    (train.py's --pg-timeout defaults to 120 s with NCCL). With the process writer."""
    started = time.monotonic()
    env = {"RTJ_INPROCESS_SOFT_TIMEOUT": str(STALL["soft"]), "RTJ_INPROCESS_HARD_TIMEOUT": str(STALL["hard"])}
    if not ctx.cpu:
        env["RTJ_NCCL_TIMEOUT"] = str(STALL["nccl"])
    run = ctx.launch("stall", "--fault", "0:25:stall", "--checkpoint-writer", "process", heartbeat=120, **env)
    fault = faults(run).get("stall")
    signals = [e for e in run.timeline if e["event"] == "signalled" and fault and e["t"] > fault["t"]]
    watchdog = "Watchdog caught collective operation timeout" in run.log
    weights_ok, weights = same_weights(ctx, run)
    spawns = [e["seconds"] for e in run.timeline if e["event"] == "writer_process_spawned"]
    if fault and signals:
        killed = signals[0]["t"] - fault["t"]
        bound = STALL["nccl"] if not ctx.cpu else math.inf
        ok = STALL["hard"] <= killed < bound and not watchdog and weights_ok and signals[0]["signal"] == 15
        resumed = starts_after(run, signals[0]["t"])
        detail = (f"SIGTERM by the Wrapper's hard timeout {killed:.0f} s into the hang (soft {STALL['soft']}, "
                  f"hard {STALL['hard']} s; " + (f"NCCL timeout {STALL['nccl']} s: watchdog "
                                                 f"{'FIRED' if watchdog else 'silent'}" if not ctx.cpu else
                                                 "gloo: no watchdog") + "); "
                  + (f"respawned from step {resumed[0]['step']}; " if resumed else "never resumed; ") + weights
                  + (f"; writer process up {min(spawns):.1f}-{max(spawns):.1f} s after its first save" if spawns
                     else ""))
    else:
        ok, detail = False, "the stall did not fire" if not fault else f"no rank was signalled (exit {run.code})"
    if not ok:
        ctx.failed("stall", run)
    return [Row("NCCL hang longer than the hard timeout" if not ctx.cpu else "collective hang > hard timeout",
                "ok" if ok else "FAIL", time.monotonic() - started, detail)]


def check_checkpoints(ctx: Context) -> list[Row]:
    """In a process of its own (a world of 1, the trainer's model and step): part_checkpoints()."""
    started = time.monotonic()
    cmd = [sys.executable, __file__, "--part", "checkpoints", "--work-dir", str(ctx.root / "checkpoints")]
    try:
        proc = subprocess.run([*cmd, *(["--cpu"] if ctx.cpu else [])], capture_output=True, text=True, timeout=300)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("ROWS ")]
        if lines:
            return [Row(**row) for row in json.loads(lines[-1][5:])]
        ctx.logs.append(("checkpoints", (proc.stdout + proc.stderr)[-6000:]))
        detail = f"exit {proc.returncode}"
    except subprocess.TimeoutExpired as exc:
        ctx.logs.append(("checkpoints", str(exc.stdout or "")[-6000:]))
        detail = "timed out after 300 s"
    return [Row("checkpoint overlap and slow saves", "FAIL", time.monotonic() - started, detail)]


def check_two_ranks(ctx: Context) -> list[Row]:
    """gloo, two ranks of CPU tensors: a peer's exception, then a SIGKILL, with two writer processes."""
    started = time.monotonic()
    clean = ctx.launch("two-clean", ranks=2, on_cpu=True)
    run = ctx.launch("two-faults", "--fault", "1:25:exc", "--fault", "0:45:sigkill", "--checkpoint-writer",
                     "process", ranks=2, on_cpu=True)
    ok = clean.code == 0 and run.code == 0
    iterations = [e["iteration"] for e in run.starts()]
    ok = ok and iterations == [0, 0, 1, 1, 0, 0] and run.result() == clean.result()
    spawned = {e["rank"] for e in run.timeline if e["event"] == "writer_process_spawned"}
    if not ok:
        ctx.failed("two-faults", run)
    detail = (f"exit {clean.code}/{run.code}; rank 1's exception restarted both ranks in process (iterations "
              f"{iterations}), then a respawn; writer processes on ranks {sorted(spawned)}; "
              + ("weights identical to a clean 2-rank run" if ok else "weights or restarts differ"))
    return [Row("2 ranks, gloo: peer fault, process writers", "ok" if ok else "FAIL", time.monotonic() - started,
                detail)]


def example_shapes() -> list[tuple[str, list[str], int]]:
    """(example, its trainer arguments, its world) for each example that trains the reference Llama."""
    import yaml

    out = []
    for path in sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.yaml")):
        spec = yaml.safe_load(path.read_text())["spec"]
        args = list(spec.get("args") or [])
        if "--model" in args and args[args.index("--model") + 1] == "llama":
            out.append((path.stem, args, spec["nodes"]["count"] * spec.get("gpusPerNode", 8)))
    return out


def check_shapes(ctx: Context) -> list[Row]:
    """Issue 27.4: one transformer block at each example's shape and settings (precision, activation
    checkpointing, the deterministic math attention unless --nondeterministic), forward and backward on
    the GPU: its peak memory against rtj_worker.footprint's estimate of one block (activations, its
    gathered parameters and gradients). With --cpu: the same code at the CPU model's shape, no memory
    figure (the estimate is printed)."""
    import torch
    from torch.utils.checkpoint import checkpoint

    from rtj_worker import footprint
    from rtj_worker import train as trainer
    from rtj_worker.models import Block, rope_tables

    rows = []
    device = torch.device("cpu") if ctx.cpu else torch.device("cuda", 0)
    try:
        shapes = example_shapes()
    except ImportError as exc:  # PyYAML, for the examples: NVRx's dependency, so in the bundle; said if not
        return [Row("one block at each example's shape", "SKIP", 0, f"cannot read the examples: {exc}")]
    if ctx.cpu:  # the examples' settings at a shape a CPU computes in seconds
        shapes = [(f"{name} (CPU model)", [*model_flags(MODELS["cpu"]), *[a for a in args if a in (
            "--precision", "bf16", "--activation-checkpointing")]], world) for name, args, world in shapes]
    for name, args, world in shapes:
        started = time.monotonic()
        a = trainer.parse_args(args)
        if not a.nondeterministic:
            trainer.deterministic(device)
        cfg = trainer.llama_config(a)
        dtype = torch.bfloat16 if a.precision == "bf16" else torch.float32
        one = footprint.estimate([*args, "--layers", "1"], world)
        assert one is not None
        if not ctx.cpu:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        block = Block(cfg).to(device=device, dtype=dtype)
        cos, sin = (t.to(device) for t in rope_tables(cfg))
        x = torch.randn(a.batch, a.seq_len, cfg.dim, device=device, dtype=dtype, requires_grad=True)
        out = (checkpoint(block, x, cos, sin, use_reentrant=False) if a.activation_checkpointing
               else block(x, cos, sin))
        out.float().square().mean().backward()
        if ctx.cpu:
            rows.append(Row(f"one block of {name}", "ok", time.monotonic() - started,
                            f"{a.precision}, recompute {a.activation_checkpointing}: forward and backward ran; "
                            f"estimate {(one.activations + one.gathered) / 2**20:.1f} MiB (no memory figure on CPU)"))
            continue
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        estimated = one.activations + one.gathered
        ok = peak <= 1.5 * estimated
        rows.append(Row(f"one block of {name}", "ok" if ok else "FAIL", time.monotonic() - started,
                        f"{a.batch}x{a.seq_len} tokens, dim {cfg.dim}, {a.precision}, recompute "
                        f"{a.activation_checkpointing}: peak {peak / 2**30:.2f} GiB, estimated "
                        f"{estimated / 2**30:.2f} GiB ({peak / estimated:.2f}x); the whole example: "
                        f"{footprint.estimate(args, world).describe()}"))  # type: ignore[union-attr]
        del block, x, out
    return rows


CHECKS: dict[str, tuple[Callable[[Context], list[Row]], float]] = {  # name: (check, seconds it may take on a GPU)
    "clean": (check_clean, 45), "faults": (check_faults, 120), "nan": (check_nan, 30), "stall": (check_stall, 80),
    "checkpoints": (check_checkpoints, 120), "two-ranks": (check_two_ranks, 90), "shapes": (check_shapes, 20),
}


# --- the checkpoint part, in its own process: NCCL (or gloo) world of 1 ---------------------------

def part_checkpoints(cpu: bool, work: Path) -> list[Row]:
    """Checkpoint overlap: the trainer's own step (the Llama model, FSDP2, Adam) with a save every
    interval by each writer, against no saves; then a save slower than the interval."""
    sys.path.insert(0, str(Path(__file__).parent))
    import torch
    import torch.distributed as dist
    from checkpoint_efficiency import Run, checkpointer, train
    from torch.distributed.checkpoint.state_dict import get_state_dict

    from rtj_worker import train as trainer

    device = torch.device("cpu") if cpu else torch.device("cuda", 0)
    if cpu:
        torch.set_num_threads(1)
    else:
        torch.cuda.set_device(0)
    trainer.deterministic(device)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, world_size=1, is_master=True)
    dist.init_process_group("gloo" if cpu else "nccl", store=store, rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=120))
    args = trainer.parse_args(model_flags(MODELS["cpu" if cpu else "gpu"]))
    model, opt = trainer.fresh(args, device, 1)
    counter = iter(range(10**9))

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = trainer.step_loss(args, model, next(counter), 0, device)
        loss.backward()
        opt.step()
        loss.item()  # the host waits for the step, as the trainer does (its all-reduce of the loss)

    for _ in range(3):
        step()  # warm-up (kernels, allocator)
    # The volume: the local disk on the GPU machine; throttled on CPU, where the state is tiny.
    bandwidth = 20e6 if cpu else math.inf
    writers = {"none": None, **{name: checkpointer(work / name, writer, bandwidth)
                                for name, writer in (("sync", None), ("thread", "thread"), ("process", "process"))}}
    model_sd, optim_sd = get_state_dict(model, opt)
    started = time.perf_counter()
    writers["sync"].save(1, {"model": model_sd, "optim": optim_sd})  # type: ignore[union-attr]
    write = time.perf_counter() - started
    spawn = time.perf_counter()
    for name in ("thread", "process"):  # warm up; spawns the writer process
        writers[name].save(1, {"model": model_sd, "optim": optim_sd})  # type: ignore[union-attr]
        writers[name].finalize()  # type: ignore[union-attr]
    spawn = time.perf_counter() - spawn
    size = sum(f.stat().st_size for f in (work / "sync").rglob("*.distcp")) / 1e9
    base_step = statistics.median(train(None, model, opt, step, 10, 1).free)
    interval = max(2, math.ceil(2 * write / base_step))  # compute per interval = 2x the write time
    steps = interval * 3  # two saves, each followed by a full interval
    runs: dict[str, Run] = {}
    rows = []
    for name, ckpt in writers.items():
        started = time.perf_counter()
        runs[name] = train(ckpt, model, opt, step, steps, interval)
        if name == "none":
            continue
        run, free = runs[name], statistics.median(runs[name].free)
        efficiency = runs["none"].seconds / run.seconds
        inflation = (f", {statistics.mean(run.saving) * 1000:.0f} ms while a save runs "
                     f"({statistics.mean(run.saving) / free - 1:+.0%})" if run.saving else "")
        ok = ckpt.committed_step == steps - interval if ckpt else False
        rows.append(Row(f"checkpoint every {interval} steps, {name}", "ok" if ok else "FAIL",
                        time.perf_counter() - started,
                        f"{size:.2f} GB state; step {free * 1000:.0f} ms{inflation}, blocked "
                        f"{run.blocked / max(1, run.saves):.2f} s/save; efficiency {efficiency:.0%} of no saves"
                        + (f"; writer process spawned in {spawn:.1f} s (once)" if name == "process" else "")))
    for ckpt in writers.values():
        if ckpt is not None:
            ckpt.close()
    # A save 3x slower than the interval: skipped while one is in flight, never waited for.
    started = time.perf_counter()
    slow = checkpointer(work / "slow", "thread", bandwidth=size * 1e9 / max(1e-3, 3 * interval * base_step))
    run = train(slow, model, opt, step, interval * 6, interval, skip_if_busy=True)
    longest, median = max(run.free + run.saving), statistics.median(run.free + run.saving)
    ok = run.skipped > 0 and slow.committed_step > 0 and longest < max(3 * median, median + 1.0)
    slow.close()
    rows.append(Row("a save slower than the interval", "ok" if ok else "FAIL", time.perf_counter() - started,
                    f"{run.skipped} of {run.saves + run.skipped} saves skipped while one was in flight; slowest step "
                    f"{longest * 1000:.0f} ms (median {median * 1000:.0f} ms): no stall; newest committed step "
                    f"{slow.committed_step}"))
    dist.destroy_process_group()
    return rows


def environment(cpu: bool) -> str:
    import importlib.metadata

    import torch

    nvrx = importlib.metadata.version("nvidia-resiliency-ext")
    where = ("CPU (--cpu)" if cpu else f"{torch.cuda.device_count()} x {torch.cuda.get_device_name(0)}"
             if torch.cuda.is_available() else "no CUDA device")
    nccl = ""
    if not cpu and torch.cuda.is_available():
        with contextlib.suppress(Exception):  # torch built without NCCL
            nccl = ", NCCL " + ".".join(str(v) for v in torch.cuda.nccl.version())
    return (f"GPU check on {where}: torch {torch.__version__}{nccl}, NVRx {nvrx}, Python {sys.version.split()[0]}, "
            f"{os.cpu_count()} CPUs; {'gloo' if cpu else 'nccl'} world 1, gloo world 2 for two ranks")


def print_table(rows: list[Row]) -> None:
    width = max(len(r.check) for r in rows)
    print(f"| {'check':<{width}} | result | {'s':>5} | detail |")
    print(f"|{'-' * (width + 2)}|--------|{'-' * 7}|--------|")
    for r in rows:
        print(f"| {r.check:<{width}} | {r.result:<6} | {r.seconds:>5.0f} | {r.detail} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="Every check with gloo on CPU")
    parser.add_argument("--only", default=",".join(CHECKS), help=f"Checks to run, of {','.join(CHECKS)}")
    parser.add_argument("--budget", type=float, default=None,
                        help="Seconds for all checks (default 450 on a GPU, 1200 with --cpu): what would not fit "
                             "is skipped")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part == "checkpoints":
        print("ROWS " + json.dumps([asdict(r) for r in part_checkpoints(args.cpu, args.work_dir)]), flush=True)
        return 0
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("no CUDA device: run with --cpu to check the same code paths with gloo")
        return 2
    print(environment(args.cpu), flush=True)
    names = [n for n in args.only.split(",") if n]
    unknown = set(names) - set(CHECKS)
    if unknown:
        parser.error(f"unknown checks {sorted(unknown)}")
    budget = args.budget or (1200 if args.cpu else 450)
    root = Path(tempfile.mkdtemp(prefix="rtj-gpu-check-"))
    ctx = Context(args, root)
    rows: list[Row] = []
    started, scale = time.monotonic(), 1.0
    for name in names:
        check, estimate = CHECKS[name]
        left = budget - (time.monotonic() - started)
        if estimate * scale > left:
            rows.append(Row(name, "SKIP", 0, f"needs about {estimate * scale:.0f} s, {left:.0f} s of the budget left"))
            continue
        t0 = time.monotonic()
        try:
            rows += check(ctx)
        except Exception as exc:  # one broken check must not cost the table
            rows.append(Row(name, "FAIL", time.monotonic() - t0, f"{type(exc).__name__}: {exc}"))
        if name == "clean":  # how this machine compares with the estimates (launch overheads)
            scale = max(1.0, (time.monotonic() - t0) / estimate)
        print(f"  {name}: {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    print()
    print_table(rows)
    print(f"\n{time.monotonic() - started:.0f} s in all; work dirs under {root}")
    for name, log in ctx.logs:
        print(f"\n--- the last lines of the failed run {name!r} ---\n{log}")
    with contextlib.suppress(OSError):
        shutil.rmtree(root / "checkpoints", ignore_errors=True)
    return 1 if any(r.result == "FAIL" for r in rows) else 0


if __name__ == "__main__":  # the process writer's spawn imports this file again
    sys.exit(main())
