"""Fault injection for tests and benchmarks: `--fault RANK:STEP:KIND`, KIND one of

- exc:     raise in the step (soft fault; in-process restart recovers it),
- sigkill: SIGKILL the rank (hard fault; ft_launcher respawns the workers),
- hang:    stop making progress and heartbeats (the rank monitor times out, then respawn),
- stall:   the step's collective does not complete for 3x the in-process hard timeout: what a peer that
           never joins looks like to this rank. On CUDA a kernel spins ahead of the collective on the
           stream, so its work is pending for NCCL's watchdog and the host blocks in a native call
           (reading the loss) like in a hung NCCL collective; on CPU the host blocks in a native sleep.
           inprocess.Wrapper's soft timeout cannot interrupt it, its hard timeout terminates the rank
           (ft_launcher respawns it), unless NCCL's watchdog is set to act first,
- nan:     make the loss NaN (a permanent failure: the job must stop, not restart),
- unhealthy: the rank asks NVRx to exclude its node (what a failed GPU or NIC health check leads to) and
           dies: its launcher leaves at its next rendezvous (exit 73) and the barrier counts the node as
           unhealthy for the rest of the rendezvous.

Each fault fires once per job: a marker on the shared volume keeps a resumed run from
firing it again.
"""

from __future__ import annotations

import argparse
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import events

KINDS = ("exc", "sigkill", "hang", "stall", "nan", "unhealthy")


class InjectedFault(RuntimeError):
    pass


@dataclass(frozen=True)
class Fault:
    rank: int
    step: int
    kind: str

    @classmethod
    def parse(cls, text: str) -> Fault:
        try:
            rank, step, kind = text.split(":")
            fault = cls(int(rank), int(step), kind.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"--fault must be RANK:STEP:KIND, got {text!r}") from None
        if fault.kind not in KINDS:
            raise argparse.ArgumentTypeError(f"fault kind must be one of {', '.join(KINDS)}, got {fault.kind!r}")
        return fault


def maybe_inject(faults: list[Fault], rank: int, step: int, marker_dir: Path, client: Any = None) -> bool:
    """Fire the faults due now; True means: poison this step's loss. `client`: the rank's RankMonitorClient
    (for "unhealthy")."""
    for fault in faults:
        if fault.rank != rank or fault.step != step:
            continue
        marker = marker_dir / f"fault-{fault.rank}-{fault.step}-{fault.kind}"
        try:
            marker_dir.mkdir(parents=True, exist_ok=True)
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            continue  # fired before this restart
        os.close(fd)
        events.emit("fault", rank=rank, step=step, kind=fault.kind)
        if fault.kind == "exc":
            raise InjectedFault(f"injected exception at step {step} on rank {rank}")
        if fault.kind == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)
        if fault.kind == "hang":
            while True:
                time.sleep(3600)
        if fault.kind == "stall":
            stall(3 * float(os.environ.get("RTJ_INPROCESS_HARD_TIMEOUT", 55)))
        if fault.kind == "nan":
            return True
        if fault.kind == "unhealthy":
            exclude_this_node(client, f"injected at step {step} on rank {rank}")
    return False


def exclude_this_node(client: Any, why: str) -> None:
    """Ask ft_launcher, through this rank's monitor client, to exclude the node, then die as a rank on a bad
    GPU would (no exception: in-process restart must not recover it)."""
    from nvidia_resiliency_ext.fault_tolerance.data import WorkloadAction, WorkloadControlRequest

    client.send_workload_control_request(WorkloadControlRequest(WorkloadAction.ExcludeThisNode, why))
    os._exit(1)


def stall(seconds: float) -> None:
    """See KINDS' "stall"."""
    import torch  # only here: parsing --fault needs no torch

    if not torch.cuda.is_available():
        time.sleep(seconds)  # one native call: no Python bytecode runs in this thread until it returns
        return
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10**7)  # calibrate the spin kernel: cycles per millisecond
    end.record()
    end.synchronize()
    torch.cuda._sleep(int(1e7 / start.elapsed_time(end) * seconds * 1000))
