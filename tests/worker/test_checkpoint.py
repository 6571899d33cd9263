"""Checkpoints: only whole steps whose every write succeeded are committed; anything partial, corrupt,
truncated or foreign is skipped for an older step, never loaded."""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from rtj_worker import checkpoint, ckpt_index
from rtj_worker.checkpoint import Checkpointer, agree_min, collective_device
from rtj_worker.ckpt_index import MARKER, complete_steps, step_dir
from testkit import free_port, rank_results, wait_until


@pytest.fixture
def group():
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, world_size=1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def state(value: float) -> dict:
    return {"model": {"w": torch.full((4,), value)}, "step": torch.tensor(int(value))}


def blank() -> dict:
    return state(-1.0)


def make(root: Path, use_async: bool = False, uid: str = "job-a", **kwargs) -> Checkpointer:
    ckpt = Checkpointer(root, 0, 1, use_async=use_async, uid=uid, **kwargs)
    ckpt.attach()
    return ckpt


class FailingWriter(checkpoint.dcp.FileSystemWriter):
    """A writer whose storage fails with an I/O error, as a full or broken volume would."""

    def write_data(self, plan, planner):
        raise OSError(5, "Input/output error (injected)")


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_save_commits_marker_and_loads_newest(tmp_path, group, use_async):
    committed = []
    ckpt = make(tmp_path, use_async=use_async, keep=2, on_commit=lambda *commit: committed.append(commit))
    for step in (10, 20, 30):
        ckpt.save(step, state(step))
    ckpt.finalize()
    assert [step for step, _ in committed] == [10, 20, 30]
    assert all(0 < seconds < 30 for _, seconds in committed) and ckpt.write_seconds == committed[-1][1]
    assert complete_steps(tmp_path, "job-a") == [30, 20]  # keep=2 pruned step 10
    assert not step_dir(tmp_path, 10).exists()
    assert not list(tmp_path.glob(".tmp-*"))  # every step was renamed into place
    assert (tmp_path / ckpt_index.ITERATION_FILE).read_text().strip() == "30"
    meta = json.loads((step_dir(tmp_path, 30) / MARKER).read_text())
    assert meta["uid"] == "job-a" and ".metadata" in meta["files"]
    loaded = blank()
    assert make(tmp_path).load_latest(loaded) == 30
    assert torch.equal(loaded["model"]["w"], torch.full((4,), 30.0))


def test_async_save_snapshots_tensors(tmp_path, group):
    ckpt = make(tmp_path, use_async=True)
    live = {"w": torch.zeros(1000)}
    ckpt.save(5, live)
    live["w"].add_(1.0)  # training goes on while the writer serializes
    ckpt.finalize()
    loaded = {"w": torch.full((1000,), 7.0)}
    assert make(tmp_path).load_latest(loaded) == 5
    assert float(loaded["w"].sum()) == 0.0


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_failed_write_is_never_committed_and_good_steps_survive(tmp_path, group, use_async, monkeypatch):
    ckpt = make(tmp_path, use_async=use_async, keep=2)
    ckpt.save(20, state(20))
    ckpt.save(30, state(30))
    monkeypatch.setattr(Checkpointer, "_writer", lambda self, path: FailingWriter(path))
    for step in (40, 50, 60):
        ckpt.save(step, state(step))
    ckpt.finalize()
    assert complete_steps(tmp_path, "job-a") == [30, 20]
    assert not step_dir(tmp_path, 40).exists() and not list(tmp_path.glob(".tmp-*"))
    monkeypatch.undo()
    loaded = blank()
    assert make(tmp_path).load_latest(loaded) == 30
    assert torch.equal(loaded["model"]["w"], torch.full((4,), 30.0))


def test_saving_a_step_again_replaces_it_whole_or_not_at_all(tmp_path, group, monkeypatch):
    ckpt = make(tmp_path)
    ckpt.save(20, state(20))
    monkeypatch.setattr(Checkpointer, "_writer", lambda self, path: FailingWriter(path))
    ckpt.save(20, state(99))  # e.g. after a restart, killed half-way
    monkeypatch.undo()
    loaded = blank()
    assert make(tmp_path).load_latest(loaded) == 20
    assert torch.equal(loaded["model"]["w"], torch.full((4,), 20.0))
    ckpt.save(20, state(21))  # a successful save of the same step replaces it
    assert make(tmp_path).load_latest(loaded) == 20 and float(loaded["model"]["w"][0]) == 21.0


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage", "no-files", "wrong-step"])
def test_damaged_marker_on_newest_step_falls_back_to_older(tmp_path, group, damage):
    ckpt = make(tmp_path)
    ckpt.save(10, state(10))
    ckpt.save(20, state(20))
    marker = step_dir(tmp_path, 20) / MARKER
    text = marker.read_text()
    marker.write_text({"empty": "", "truncated": text[: len(text) // 2], "garbage": "\x00\x01",
                       "no-files": json.dumps({"step": 20, "uid": "job-a"}),
                       "wrong-step": text.replace('"step": 20', '"step": 30')}[damage])
    loaded = blank()
    assert ckpt.load_latest(loaded) == 10
    assert torch.equal(loaded["model"]["w"], torch.full((4,), 10.0))


def test_truncated_shard_falls_back_to_older(tmp_path, group):
    ckpt = make(tmp_path)
    ckpt.save(10, state(10))
    ckpt.save(20, state(20))
    shard = next(step_dir(tmp_path, 20).glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])
    loaded = blank()
    assert ckpt.load_latest(loaded) == 10 and float(loaded["model"]["w"][0]) == 10.0


def test_corrupt_shard_of_the_right_size_is_detected_on_load_and_never_kept_instead_of_a_good_step(tmp_path, group):
    ckpt = make(tmp_path, keep=2)
    ckpt.save(10, state(10))
    ckpt.save(20, state(20))
    shard = next(step_dir(tmp_path, 20).glob("*.distcp"))
    shard.write_bytes(b"\xff" * shard.stat().st_size)
    loaded = blank()
    assert ckpt.load_latest(loaded) == 10 and float(loaded["model"]["w"][0]) == 10.0
    assert complete_steps(tmp_path, "job-a") == [10]
    ckpt.save(30, state(30))  # keep=2 keeps 30 and 10 (the two that load), drops the unloadable 20
    assert complete_steps(tmp_path, "job-a") == [30, 10] and not step_dir(tmp_path, 20).exists()


def test_partial_step_without_marker_is_skipped(tmp_path, group):
    ckpt = make(tmp_path)
    ckpt.save(10, state(10))
    step_dir(tmp_path, 20).mkdir()
    (step_dir(tmp_path, 20) / "__0_0.distcp").write_bytes(b"partial")
    assert ckpt.load_latest(blank()) == 10


def test_another_jobs_steps_are_neither_loaded_nor_pruned(tmp_path, group):
    other = make(tmp_path, uid="job-b", keep=1)
    other.save(50, state(50))
    mine = make(tmp_path, uid="job-a", keep=1)
    assert mine.load_latest(blank()) == 0  # job-b's step 50 is not ours
    mine.save(10, state(10))
    mine.save(20, state(20))
    assert complete_steps(tmp_path, "job-b") == [50] and complete_steps(tmp_path, "job-a") == [20]
    assert complete_steps(tmp_path) == [50, 20]


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_a_rank_of_an_older_gang_attempt_commits_and_prunes_nothing_once_a_newer_one_started(
        tmp_path, group, use_async):
    """The attempt fence: a pod the operator left behind on a lost, unfenced node (the new gang starts
    without it) may still run its ranks; once a newer attempt recorded its start, they commit, prune and
    finish nothing, so the new gang's steps and the one it loads are safe. Another job's attempts and a
    rank without an attempt (0, outside the operator) are not fenced."""
    old = make(tmp_path, use_async=use_async, keep=1, attempt=1)
    old.save(10, state(10))
    old.finalize()
    ckpt_index.claim_attempt(tmp_path, "job-a", 2)  # attempt 2's pods start
    ckpt_index.claim_attempt(tmp_path, "job-a", 1)  # a late pod of attempt 1 does not lower it
    assert ckpt_index.recorded_attempt(tmp_path, "job-a") == 2
    old.save(20, state(20))  # its write lands in a temporary directory, and is not committed
    old.finalize()
    assert complete_steps(tmp_path, "job-a") == [10] and old.committed_step == 10
    with pytest.raises(ckpt_index.Superseded, match="attempt 2 of this job has started"):
        ckpt_index.write_finished(tmp_path, "job-a", 10, attempt=1)
    new = make(tmp_path, use_async=use_async, keep=1, attempt=2)
    assert new.load_latest(blank()) == 10
    new.save(30, state(30))
    new.finalize()
    assert complete_steps(tmp_path, "job-a") == [30]  # the new gang commits and prunes
    for other in (make(tmp_path, uid="job-b", attempt=1), make(tmp_path, attempt=0)):
        other.save(40, state(40))
        other.finalize()
        assert other.committed_step == 40


def test_no_checkpoint_starts_from_zero_and_leaves_state_alone(tmp_path, group):
    loaded = blank()
    assert make(tmp_path).load_latest(loaded) == 0
    assert float(loaded["model"]["w"][0]) == -1.0
    (tmp_path / "step-garbage").mkdir()
    (tmp_path / "step-garbage" / MARKER).write_text("{}")
    assert complete_steps(tmp_path) == []


def test_agreement_collectives_use_the_groups_device(group, monkeypatch):
    """Under NCCL a group has no CPU backend: the agreement tensors must live on its device."""
    assert collective_device() == torch.device("cpu")

    class NcclLikeGroup:  # what a process group initialized with only an accelerator backend reports
        _device_types = [torch.device("meta")]

    seen = []
    class Done:  # a collective's handle, completed
        def is_completed(self) -> bool:
            return True

        def wait(self) -> None:
            pass

    monkeypatch.setattr(dist, "all_reduce",
                        lambda tensor, op=None, group=None, async_op=False: seen.append(tensor.device) or Done())
    with contextlib.suppress(RuntimeError):  # .item() of the fake all-reduce's meta tensor
        agree_min(1, NcclLikeGroup())  # type: ignore[arg-type]
    assert seen == [torch.device("meta")]
    assert collective_device(NcclLikeGroup()) == torch.device("meta")  # type: ignore[arg-type]


def test_reading_steps_does_not_import_torch(tmp_path, group):
    make(tmp_path).save(10, state(10))
    code = textwrap.dedent(f"""
        import sys
        from rtj_worker import entrypoint
        from rtj_worker.ckpt_index import latest_step
        from pathlib import Path
        assert latest_step(Path({str(tmp_path)!r}), "job-a") == 10
        entrypoint.write_termination(0, "ok", {str(tmp_path)!r}, {str(tmp_path / 't')!r})
        assert "torch" not in sys.modules, sorted(m for m in sys.modules if m.startswith("torch"))
    """)
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": ":".join(sys.path)})
    assert json.loads((tmp_path / "t").read_text())["checkpointStep"] == 10


class SlowWriter(checkpoint.dcp.FileSystemWriter):
    """A volume slower than the checkpoint interval: each write waits until the test releases it."""

    release = None  # a threading.Event

    def write_data(self, plan, planner):
        assert SlowWriter.release.wait(60)
        return super().write_data(plan, planner)


def test_a_save_due_while_the_previous_is_in_flight_is_skipped_and_the_final_one_waits(tmp_path, group, monkeypatch):
    import threading

    from rtj_worker import events

    monkeypatch.setenv("RTJ_EVENT_LOG", str(tmp_path / "events.jsonl"))
    SlowWriter.release = threading.Event()
    monkeypatch.setattr(Checkpointer, "_writer", lambda self, path: SlowWriter(path))
    ckpt = make(tmp_path / "ckpt", use_async=True)
    assert ckpt.save(10, state(10), skip_if_busy=True) and ckpt.in_flight == 10
    assert not ckpt.save(20, state(20), skip_if_busy=True)  # step 10 is still being written: not waited for
    assert ckpt.in_flight == 10 and complete_steps(tmp_path / "ckpt") == []
    assert [(e["event"], e["step"], e["in_flight"]) for e in events.read(tmp_path / "events.jsonl")] == [
        ("checkpoint_skipped", 20, 10)]
    SlowWriter.release.set()
    ckpt.save(30, state(30))  # the final save: waits for step 10, then saves
    assert ckpt.finalize()
    assert complete_steps(tmp_path / "ckpt", "job-a") == [30, 10] and ckpt.committed_step == 30
    loaded = blank()
    assert make(tmp_path / "ckpt").load_latest(loaded) == 30 and float(loaded["model"]["w"][0]) == 30.0


def test_a_bounded_finalize_drops_a_save_still_being_written(tmp_path, group, monkeypatch):
    """The pod is stopping: a write that cannot finish before the deadline is not committed, and
    nobody waits for it."""
    import threading

    SlowWriter.release = threading.Event()
    ckpt = make(tmp_path, use_async=True)
    ckpt.save(10, state(10))
    ckpt.finalize()
    monkeypatch.setattr(Checkpointer, "_writer", lambda self, path: SlowWriter(path))
    ckpt.save(20, state(20))
    assert not ckpt.finalize(timeout=0.5)
    assert ckpt.in_flight is None and complete_steps(tmp_path, "job-a") == [10] and ckpt.committed_step == 10
    SlowWriter.release.set()
    ckpt.save(30, state(30), sync=True)  # a stop's own save: written before it returns
    assert complete_steps(tmp_path, "job-a") == [30, 10] and ckpt.in_flight is None


def test_the_completion_marker_names_the_newest_committed_step_of_this_job(tmp_path, group):
    ckpt = make(tmp_path, uid="job-a")
    ckpt.save(10, state(10))
    assert ckpt_index.finished(tmp_path, "job-a") is None
    ckpt_index.write_finished(tmp_path, "job-a", 10)
    assert ckpt_index.finished(tmp_path, "job-a") == 10
    assert ckpt_index.finished(tmp_path, "job-b") is None  # another job sharing the directory
    ckpt.save(20, state(20))  # trained further (e.g. more steps): the old marker is stale
    assert ckpt_index.finished(tmp_path, "job-a") is None


# --- the process writer (RTJ_CHECKPOINT_WRITER=process): two ranks, each with its writer process -----
#
# Each scenario runs in two rank processes that run this file as a script (a writer process is spawned
# once per Python process, and spawn imports the main module again: the pytest process must not be
# it). A rank prints "RESULT <json>" at the end.

class GatedWriter(checkpoint.ShardWriter):
    """A volume slower than anything: writes wait until the gate file exists (the writer runs in
    another process, where no Event of the test's could reach)."""

    def __init__(self, path, gate: str):
        super().__init__(path)
        self.gate = gate

    def write_data(self, plan, planner):
        wait_until(lambda: os.path.exists(self.gate), timeout=90, what="the gate to open", interval=0.05)
        return super().write_data(plan, planner)


def _writer_pid(timeout: float = 60) -> int:
    """This rank's writer process, once torch has spawned it and its world is up."""
    from torch.distributed.checkpoint import _async_process_executor as ape

    wait_until(lambda: ape._CHECKPOINT_PROCESS is not None, timeout=timeout, what="the writer process", interval=0.05)
    return ape._CHECKPOINT_PROCESS._save_process.pid


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie (exited, not yet reaped) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    return False


def _scenario(name: str, ckpt: Checkpointer, rank: int, gate: Path, mesh: Any) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    def sharded(value: float) -> dict:  # each rank holds half of w
        return {"model": {"w": distribute_tensor(torch.full((8,), value), mesh, [Shard(0)])}}

    out: dict[str, Any] = {}
    if name == "commit":
        ckpt.save(10, sharded(10))
        out["pids"] = [_writer_pid()]
        ckpt.save(20, sharded(20))  # waits for step 10, then saves with the same writer process
        out["pids"].append(_writer_pid())
        assert ckpt.finalize()
    elif name == "killed":
        ckpt.save(10, sharded(10))
        out["pids"] = [_writer_pid()]
        dist.barrier()  # both writers are blocked at the gate
        if rank == 0:
            os.kill(out["pids"][0], signal.SIGKILL)
        dist.barrier()
        gate.touch()  # rank 1's writer now writes, then waits in a collective for the dead one
        started = time.monotonic()
        ckpt.finalize()
        out["failed_after"] = time.monotonic() - started
        out["committed_after_kill"] = ckpt.committed_step
        ckpt.save(20, sharded(20))  # a new writer process on every rank
        out["pids"].append(_writer_pid())
        assert ckpt.finalize()
    elif name == "abandon":
        ckpt.save(10, sharded(10))
        started = time.monotonic()
        ckpt.abandon()  # at once: torch is still spawning the writer
        out["abandon_while_spawning"] = time.monotonic() - started
        ckpt.save(20, sharded(20))
        out["pids"] = [_writer_pid()]
        dist.barrier()
        started = time.monotonic()
        ckpt.abandon()  # mid-write (blocked at the gate)
        out["abandon_while_writing"] = time.monotonic() - started
        out["alive_after_abandon"] = _alive(out["pids"][0])
        gate.touch()
        ckpt.save(30, sharded(30))
        out["pids"].append(_writer_pid())
        assert ckpt.finalize()
    elif name == "skip":
        assert ckpt.save(10, sharded(10), skip_if_busy=True)
        out["pids"] = [_writer_pid()]
        out["skipped"] = not ckpt.save(20, sharded(20), skip_if_busy=True)
        out["in_flight"] = ckpt.in_flight
        gate.touch()
        ckpt.save(30, sharded(30))  # the final save: waits for step 10, then saves
        assert ckpt.finalize()
    elif name == "orphan":  # the rank dies by SIGKILL mid-save: its writer process must follow it
        ckpt.save(10, sharded(10))
        print("RESULT " + json.dumps({"pids": [_writer_pid()]}), flush=True)
        dist.barrier()
        if rank == 0:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(30)  # rank 1 waits for rank 0's end in the test
    out["committed"] = ckpt.committed_step
    return out


def _rank_main(name: str, rank: int, port: int, root: str, gate: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=datetime.timedelta(seconds=60))
    ckpt = Checkpointer(root, rank, 2, use_async=True, uid="job-a", writer="process", address="127.0.0.1")
    ckpt._writer = lambda path: GatedWriter(path, gate)  # type: ignore[method-assign]
    ckpt.attach(timeout=datetime.timedelta(seconds=60))
    out = _scenario(name, ckpt, rank, Path(gate), init_device_mesh("cpu", (2,)))
    ckpt.close()  # kills the writer process
    out["alive_after_close"] = [_alive(pid) for pid in out["pids"]]
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def start_ranks(tmp_path: Path, name: str, gate_open: bool = False) -> list[subprocess.Popen[str]]:
    port = free_port()
    gate = tmp_path / "gate"
    if gate_open:
        gate.touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TORCH_CPP_LOG_LEVEL": "ERROR"}
    return [subprocess.Popen([sys.executable, __file__, name, str(rank), str(port), str(tmp_path / "ckpt"), str(gate)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
            for rank in (0, 1)]


def two_ranks(tmp_path: Path, name: str, gate_open: bool = False, timeout: float = 180) -> list[dict[str, Any]]:
    """Run scenario `name` on two ranks; their results."""
    procs = start_ranks(tmp_path, name, gate_open)
    return rank_results(procs, timeout)


def loaded_w(root: Path) -> tuple[int, list[float]]:
    """The newest step, loaded into one rank: the two ranks' shards reshard into a whole tensor."""
    loaded = {"model": {"w": torch.zeros(8)}}
    return make(root).load_latest(loaded), loaded["model"]["w"].tolist()


def test_process_writer_saves_commits_and_loads_on_another_world_size(tmp_path, group):
    results = two_ranks(tmp_path, "commit", gate_open=True)
    for out in results:
        assert out["committed"] == 20
        assert out["pids"][0] == out["pids"][1]  # spawned once, reused
        assert out["alive_after_close"] == [False, False]
    assert results[0]["pids"][0] != results[1]["pids"][0]  # one writer process per rank
    assert complete_steps(tmp_path / "ckpt", "job-a") == [20, 10]
    assert set(p.name for p in step_dir(tmp_path / "ckpt", 20).iterdir()) >= {"__0_0.distcp", "__1_0.distcp"}
    assert loaded_w(tmp_path / "ckpt") == (20, [20.0] * 8)


def test_a_killed_writer_process_fails_its_save_without_committing_it(tmp_path, group):
    results = two_ranks(tmp_path, "killed")
    for out in results:
        assert out["committed_after_kill"] == 0 and out["failed_after"] < 30  # not gloo's 30 minutes
        assert out["pids"][0] != out["pids"][1]  # the next save spawned new writer processes everywhere
        assert out["committed"] == 20 and out["alive_after_close"] == [False, False]
    assert complete_steps(tmp_path / "ckpt", "job-a") == [20]
    assert loaded_w(tmp_path / "ckpt") == (20, [20.0] * 8)


def test_abandon_kills_the_writer_process_and_the_next_save_works(tmp_path, group):
    results = two_ranks(tmp_path, "abandon")
    for out in results:
        assert out["abandon_while_spawning"] < 20 and out["abandon_while_writing"] < 20
        assert not out["alive_after_abandon"] and out["pids"][0] != out["pids"][1]
        assert out["committed"] == 30
    assert complete_steps(tmp_path / "ckpt", "job-a") == [30]  # neither abandoned step was committed
    assert loaded_w(tmp_path / "ckpt") == (30, [30.0] * 8)


def test_a_save_due_while_the_writer_process_is_busy_is_skipped(tmp_path, group):
    for out in two_ranks(tmp_path, "skip"):
        assert out["skipped"] and out["in_flight"] == 10 and out["committed"] == 30
    assert complete_steps(tmp_path / "ckpt", "job-a") == [30, 10]


def test_a_writer_process_ends_with_its_rank(tmp_path):
    """SIGKILL leaves a rank no chance to stop its writer process (blocked in a save): the writer
    notices that it was orphaned and exits, instead of holding the staged state for as long as its
    collectives wait."""
    rank0, rank1 = start_ranks(tmp_path, "orphan")
    try:
        assert rank0.stdout is not None
        line = next((line for line in rank0.stdout if line.startswith("RESULT ")), None)
        assert line, rank0.communicate()[0]
        writer = json.loads(line[len("RESULT "):])["pids"][0]
        assert rank0.wait(60) == -signal.SIGKILL
        wait_until(lambda: not _alive(writer), timeout=10, what="the dead rank's writer process to end")
    finally:
        for proc in (rank0, rank1):
            if proc.poll() is None:
                proc.kill()
            proc.communicate()


if __name__ == "__main__":
    _rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5])
