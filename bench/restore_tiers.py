"""Recovery with and without the copies of committed state off the volume (issue 31), on a fast and on a
slow checkpoint volume (`python bench/restore_tiers.py`; root, for the slow volume's FUSE mount).

The reference trainer under `rtj-worker` (ft_launcher, real ranks on CPU, NVRx from the venv or
RTJ_BENCH_NVRX) recovers four faults, each in its own run:

- in-process:   an exception in rank 1 (inprocess.Wrapper restarts the loop in the same processes);
- ft_launcher:  rank 1 killed (its launcher respawns the worker group), one node of 2 ranks;
- respawn:      the same on a gang of 2 nodes of 1 rank behind a coordinator (as spare and replacement
                run): every node's launcher joins a new rendezvous round; the like-for-like base of
                the node-loss faults' ratio;
- spare:        2 training nodes and a hot spare behind a coordinator (NVRx 0.6's barrier rendezvous);
                one training node is killed, the spare takes its slot;
- replacement:  2 nodes behind a coordinator, no spare; node 1 is killed and a new pod with the same
                index and an empty /dev/shm starts at once (the operator's replacement, without its
                detection delay or the image pull).

Each fault runs with copies on (RTJ_STATE_COPIES=1, the default) and off, on a plain directory ("fast")
and on hack/slowfs with reads throttled to FSx for Lustre's ~300 MB/s and each byte standing for
--state-gb / the trainer's state (a SIMULATION of a real-size state on FSx, which cannot run here;
writes are not throttled, so every run has the same committed steps). Recovery = from the fault to the
first step after it (the ranks' own timeline). The table gives, per fault and copies setting, both
volumes' recovery, their ratio (slow / fast: 1.0 means the volume's throughput does not matter), where
the state came from, and each fault's ratio to a respawn with the same setting on the slow volume (the
in-process fault's to the one-node ft_launcher's; the spare's and the replacement's to the gang's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "hack"), str(ROOT / "worker")]

from rtj_dev import slowfs  # noqa: E402
from rtj_worker import events, local  # noqa: E402

STATE_BYTES = 3.3e6  # the trainer's default MLP (4 x 256 x 256) with Adam, on disk
FAULTS = ("in-process", "ft_launcher", "respawn", "spare", "replacement")
STEPS, FAULT_STEP, STEP_SECONDS = 60, 25, 0.1
# Bounds that a minute-long load from the slow volume must fit: the ranks' waits and the launcher's
# first heartbeat (a respawned rank sends none until it has loaded).
BOUNDS = {"heartbeat": 600, "RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT": "900", "RTJ_RDZV_TIMEOUT": "600"}


@contextlib.contextmanager
def volume(workdir: Path, slow: bool, state_gb: float) -> Iterator[None]:
    ckpt = workdir / "ckpt"
    if not slow:
        yield
        return
    with slowfs.SlowVolume(workdir / "backing", ckpt, read_bps=slowfs.FSX_BPS, scale=state_gb * 1e9 / STATE_BYTES):
        yield


def train_args() -> list[str]:
    return ["--steps", str(STEPS), "--step-seconds", str(STEP_SECONDS)]


def first_step_after(timeline: list[dict[str, Any]], t: float) -> float:
    starts = [e["t"] for e in timeline if e["event"] == "start" and e["t"] > t]
    return min(e["t"] for e in timeline if e["event"] == "step" and e["t"] > max(starts))


def sources_after(timeline: list[dict[str, Any]], t: float) -> str:
    return "+".join(sorted({str(e.get("source")) for e in timeline if e["event"] == "start" and e["t"] > t}))


def one_node(workdir: Path, kind: str, env: dict[str, str]) -> tuple[float, str]:
    fault = f"1:{FAULT_STEP}:{'exc' if kind == 'in-process' else 'sigkill'}"
    run = local.start(workdir, [*train_args(), "--fault", fault], **BOUNDS, **env).wait(900)
    if run.code != 0:
        sys.exit(f"{kind}: the worker exited {run.code}; see {workdir}/worker.log")
    at = next(e["t"] for e in run.timeline if e["event"] == "fault")
    return first_step_after(run.timeline, at) - at, sources_after(run.timeline, at)


def coordinator(workdir: Path, nnodes: str, port: int) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RTJ_RDZV_PORT": str(port), "RTJ_NNODES": nnodes, "RTJ_RDZV_ID": workdir.name,
           "RTJ_RDZV_TIMEOUT": BOUNDS["RTJ_RDZV_TIMEOUT"]}
    log = open(workdir / "coordinator.log", "w")  # the process's, for its lifetime
    return subprocess.Popen([sys.executable, "-m", "rtj_worker.coordinator"], env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def trains(node: local.LocalNode) -> bool:
    from rtj_worker.entrypoint import descendants

    for pid in descendants(node.proc.pid):
        with contextlib.suppress(OSError):
            if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[1:3] == [b"-m", b"rtj_worker.train"]:
                return True
    return False


def wait_for(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := check():
            return got
        time.sleep(0.2)
    sys.exit(f"timed out waiting for {what}")


def gang(workdir: Path, kind: str, env: dict[str, str]) -> tuple[float, str]:
    spare = kind == "spare"
    nnodes, count = ("2:3", 3) if spare else ("2:2", 2)  # respawn and replacement: no spare
    workdir.mkdir(parents=True, exist_ok=True)
    port = local.free_port()
    coord = coordinator(workdir, nnodes, port)
    common = {"ranks": "1", "NNODES": "2", "RTJ_NNODES": nnodes, "RTJ_RDZV_ENDPOINT": f"127.0.0.1:{port}",
              "RTJ_COORDINATOR": "1", "RTJ_FT_MAX_RESTARTS": "3", **BOUNDS, **env}
    try:
        wait_for("the coordinator", lambda: "serving the rendezvous" in (workdir / "coordinator.log").read_text(), 60)
        fault = ["--fault", f"1:{FAULT_STEP}:sigkill"] if kind == "respawn" else []
        nodes = [local.start(workdir, [*train_args(), *fault], name=f"-{i}", NODE_RANK=str(i), **common)
                 for i in range(count)]
        active = wait_for("two training nodes", lambda: (lambda a: a if len(a) == 2 else None)(
            [n for n in nodes if trains(n)]), 300)
        timeline = lambda: events.read(workdir / "events.jsonl")  # noqa: E731
        if kind == "respawn":
            runs = [n.wait(900) for n in nodes]
            if any(r.code != 0 for r in runs):
                sys.exit(f"{kind}: a node exited {[r.code for r in runs]}; see {workdir}")
            at = next(e["t"] for e in timeline() if e["event"] == "fault")
            return first_step_after(timeline(), at) - at, sources_after(timeline(), at)
        # Lose a node right after a committed step's copies reached the peers (both nodes' ranks hold one).
        wait_for("step 20 committed", lambda: max((e["step"] for e in timeline() if e["event"] == "step"),
                                                   default=0) >= FAULT_STEP, 300)
        lost = active[-1]
        lost_at = time.time()
        lost.kill()
        if not spare:  # the replacement: the same index, a new pod (an empty /dev/shm)
            index = next(i for i, n in enumerate(nodes) if n is lost)
            nodes.append(local.start(workdir, train_args(), name=f"-{index}b", NODE_RANK=str(index), **common))
        runs = [n.wait(900) for n in nodes if n is not lost]
        if any(r.code != 0 for r in runs):
            sys.exit(f"{kind}: a node exited {[r.code for r in runs]}; see {workdir}")
        return first_step_after(timeline(), lost_at) - lost_at, sources_after(timeline(), lost_at)
    finally:
        coord.terminate()
        coord.wait(60)


def measure(base: Path, kind: str, copies: bool, slow: bool, state_gb: float) -> dict[str, Any]:
    workdir = base / f"{kind}-{'copies' if copies else 'volume'}-{'slow' if slow else 'fast'}"
    env = {"RTJ_STATE_COPIES": "1" if copies else "0"}
    workdir.mkdir(parents=True)
    with volume(workdir, slow, state_gb):
        seconds, source = (one_node if kind in ("in-process", "ft_launcher") else gang)(workdir, kind, env)
    return {"fault": kind, "copies": copies, "slow": slow, "seconds": round(seconds, 2), "source": source}


def table(rows: list[dict[str, Any]], state_gb: float) -> str:
    get = {(r["fault"], r["copies"], r["slow"]): r for r in rows}
    read = slowfs.seconds_for(int(STATE_BYTES), slowfs.FSX_BPS, state_gb * 1e9 / STATE_BYTES)
    out = [f"slow volume: reads at {slowfs.FSX_BPS / 1e6:.0f} MB/s, the state standing for {state_gb:g} GB "
           f"(a whole read: {read:.0f} s)", "",
           "| fault | copies | fast volume | slow volume | slow / fast | restored from (fast; slow) | vs a respawn "
           "(slow) |", "|---|---|---|---|---|---|---|"]
    for fault in FAULTS:
        for copies in (True, False):
            fast, slow = get.get((fault, copies, False)), get.get((fault, copies, True))
            if fast is None and slow is None:
                continue
            base = get.get(("respawn" if fault in ("spare", "replacement") else "ft_launcher", copies, True))
            cell = lambda r: f"{r['seconds']:.1f} s" if r else "-"  # noqa: E731
            ratio = f"{slow['seconds'] / fast['seconds']:.2f}x" if fast and slow else "-"
            versus = f"{slow['seconds'] / base['seconds']:.2f}x" if slow and base and base is not slow else "-"
            where = f"{fast['source'] if fast else '-'}; {slow['source'] if slow else '-'}"
            out.append(f"| {fault} | {'on' if copies else 'off'} | {cell(fast)} | {cell(slow)} | {ratio} | {where} "
                       f"| {versus} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", default=",".join(FAULTS))
    parser.add_argument("--state-gb", type=float, default=20.0,
                        help="what the trainer's state stands for on the slow volume (20 GB: a 67 s read)")
    parser.add_argument("--volumes", default="fast,slow")
    parser.add_argument("--json", help="also write the rows here")
    args = parser.parse_args()
    if "slow" in args.volumes and not slowfs.usable():
        sys.exit("the slow volume needs root and /dev/fuse (or pass --volumes fast)")
    rows = []
    with tempfile.TemporaryDirectory(prefix="rtj-restore-") as tmp:
        for kind in args.faults.split(","):
            for copies in (True, False):
                for slow in [v == "slow" for v in args.volumes.split(",")]:
                    rows.append(measure(Path(tmp), kind, copies, slow, args.state_gb))
                    print(json.dumps(rows[-1]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(table(rows, args.state_gb))


if __name__ == "__main__":
    main()
