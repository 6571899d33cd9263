"""Checkpoints: complete ones are found, partial and corrupt ones are skipped, never loaded."""

from __future__ import annotations

import datetime
import socket

import pytest
import torch
import torch.distributed as dist

from rtj_worker.checkpoint import MARKER, Checkpointer, complete_steps, step_dir


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
    return {"w": torch.full((4,), value)}


@pytest.mark.parametrize("use_async", [False, True], ids=["sync", "async"])
def test_save_commits_marker_and_loads_newest(tmp_path, group, use_async):
    committed = []
    ckpt = Checkpointer(tmp_path, rank=0, world_size=1, use_async=use_async, keep=2, on_commit=committed.append)
    for step in (10, 20, 30):
        ckpt.save(step, state(step))
    ckpt.finalize()
    ckpt.close()
    assert committed == [10, 20, 30]
    assert complete_steps(tmp_path) == [30, 20]  # keep=2 pruned step 10
    assert not step_dir(tmp_path, 10).exists()
    step, loaded = Checkpointer(tmp_path, 0, 1, use_async=False).load_latest()
    assert step == 30 and torch.equal(loaded["w"], torch.full((4,), 30.0))


def test_async_save_snapshots_cpu_tensors(tmp_path, group):
    ckpt = Checkpointer(tmp_path, 0, 1, use_async=True)
    live = {"w": torch.zeros(1000)}
    ckpt.save(5, live)
    live["w"].add_(1.0)  # training goes on while the writer serializes
    ckpt.finalize()
    ckpt.close()
    _, loaded = Checkpointer(tmp_path, 0, 1, use_async=False).load_latest()
    assert float(loaded["w"].sum()) == 0.0


def test_partial_checkpoint_without_marker_is_skipped(tmp_path, group):
    ckpt = Checkpointer(tmp_path, 0, 1, use_async=False)
    ckpt.save(10, state(10))
    step_dir(tmp_path, 20).mkdir()
    torch.save({"step": 20, "state": state(20)}, step_dir(tmp_path, 20) / "rank-00000.pt")  # no COMPLETE
    assert ckpt.load_latest()[0] == 10


def test_corrupt_checkpoint_is_skipped_for_an_older_one(tmp_path, group):
    ckpt = Checkpointer(tmp_path, 0, 1, use_async=False)
    ckpt.save(10, state(10))
    ckpt.save(20, state(20))
    shard = step_dir(tmp_path, 20) / "rank-00000.pt"
    shard.write_bytes(shard.read_bytes()[: len(shard.read_bytes()) // 2])  # truncated write
    step, loaded = ckpt.load_latest()
    assert step == 10 and torch.equal(loaded["w"], torch.full((4,), 10.0))


def test_checkpoint_with_wrong_step_is_skipped(tmp_path, group):
    ckpt = Checkpointer(tmp_path, 0, 1, use_async=False)
    ckpt.save(10, state(10))
    ckpt.save(20, state(20))
    torch.save({"step": 999, "state": state(1)}, step_dir(tmp_path, 20) / "rank-00000.pt")
    assert ckpt.load_latest()[0] == 10


def test_no_checkpoint_starts_from_zero(tmp_path, group):
    assert Checkpointer(tmp_path, 0, 1, use_async=False).load_latest() == (0, None)
    (tmp_path / "step-garbage").mkdir()
    (tmp_path / "step-garbage" / MARKER).write_text("{}")
    assert complete_steps(tmp_path) == []
