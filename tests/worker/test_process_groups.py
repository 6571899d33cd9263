"""Process groups across in-process iterations (rtj_worker.train.init_group), with two real gloo
processes: a rank whose group init failed in one iteration must meet its peers in the next.

Seen on the node agents on 2 loaded cores: one rank's init_process_group timed out (a peer too slow to
connect), its torch group counter ran ahead of its peers' (they had destroyed their default group,
which resets it), and every later iteration waited for store keys under a different group name.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import nvidia_resiliency_ext

from testkit import free_port

ROOT = Path(__file__).resolve().parents[2]

# Rank 1 tries iteration 0 alone (rank 0 never comes: its init times out); rank 0 had its own default
# group in iteration 0 and destroyed it (as the Wrapper's abort does). Both then meet in iteration 1.
SCRIPT = """
import datetime, json, sys
import torch.distributed as dist
from rtj_worker.train import init_group

rank, port, fixed = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "fixed"
base = dist.TCPStore("127.0.0.1", port, 2, rank == 0, timeout=datetime.timedelta(seconds=30))

def init(iteration, timeout):
    store = dist.PrefixStore(f"iter{iteration}", base)
    if fixed:
        init_group("gloo", store, rank, 2, timeout)
    else:
        dist.init_process_group("gloo", store=store, rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=timeout))

if rank == 1:
    try:
        init(0, 2)
    except Exception:
        pass  # a peer too slow: the Wrapper restarts the iteration
else:
    solo = dist.PrefixStore("solo", base)
    dist.init_process_group("gloo", store=solo, rank=0, world_size=1)
    dist.destroy_process_group()
try:
    init(1, 6)
    dist.barrier()
    print(json.dumps({"rank": rank, "met": True}))
except Exception as exc:
    print(json.dumps({"rank": rank, "met": False, "error": str(exc)[:200]}))
"""


def _iteration_after_a_failed_init(tmp_path: Path, fixed: bool) -> list[dict]:
    script = tmp_path / "groups.py"
    script.write_text(SCRIPT)
    port = free_port()
    # The NVRx under test (the tier's: .nvrx06 or .nvrx07 first on this process's path), not the venv's.
    nvrx = Path(next(iter(nvidia_resiliency_ext.__path__))).parent  # 0.4.1 is a namespace package
    env = {"PYTHONPATH": f"{ROOT / 'worker'}:{ROOT / 'operator'}:{nvrx}", "PATH": "/usr/bin:/bin"}
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), str(port), "fixed" if fixed else "plain"],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for rank in (0, 1)]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    results = []
    for out in outs:
        lines = [line for line in out.splitlines() if line.startswith("{")]
        assert lines, out[-2000:]
        results.append(json.loads(lines[-1]))
    return results


def test_a_rank_whose_group_init_failed_meets_its_peers_in_the_next_iteration(tmp_path: Path) -> None:
    results = _iteration_after_a_failed_init(tmp_path, fixed=True)
    assert [r["met"] for r in results] == [True, True], results


def test_without_the_reset_the_ranks_never_meet(tmp_path: Path) -> None:
    """What the reset prevents, with torch's own init_process_group: the test above can fail."""
    results = _iteration_after_a_failed_init(tmp_path, fixed=False)
    assert [r["met"] for r in results] == [False, False], results
