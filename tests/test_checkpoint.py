"""Checkpoints: only whole steps whose every write succeeded are committed; anything partial, corrupt,
truncated or foreign is skipped for an older step, never loaded."""

from __future__ import annotations

import contextlib
import datetime
import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rtj_worker import checkpoint, ckpt_index
from rtj_worker.checkpoint import Checkpointer, agree_min, collective_device
from rtj_worker.ckpt_index import MARKER, complete_steps, step_dir


@pytest.fixture
def group():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
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
    ckpt = make(tmp_path, use_async=use_async, keep=2, on_commit=committed.append)
    for step in (10, 20, 30):
        ckpt.save(step, state(step))
    ckpt.finalize()
    assert committed == [10, 20, 30]
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
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op=None, group=None: seen.append(tensor.device))
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
