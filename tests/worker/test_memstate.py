"""Copies of committed state off the shared volume (rtj_worker.memstate): restored from this process's
memory, from the node's /dev/shm, or from a peer node, with the volume never read; a copy that fails
its checksum is skipped for the next tier, and a restore is all ranks or none."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from rtj_worker import checkpoint, memstate
from rtj_worker.checkpoint import Checkpointer
from testkit import free_port, rank_results

MiB = 1 << 20


@pytest.fixture
def group():
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, world_size=1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    yield
    dist.destroy_process_group()


def state(value: float) -> dict[str, Any]:
    return {"model": {"w": torch.full((64,), value)},
            "optim": {"state": {"w": {"step": torch.tensor(value), "exp_avg": torch.full((64,), value / 2)}},
                      "param_groups": [{"lr": 0.1 * value, "betas": (0.9, 0.999), "params": ["w"]}]}}


def tiers(node_dir: Path | None, budget: int | None = 64 * MiB) -> memstate.Tiers:
    return memstate.Tiers(0, 1, "job-a", budget, node_dir)


def checkpointer(root: Path, tiers_: memstate.Tiers | None) -> Checkpointer:
    ckpt = Checkpointer(root, 0, 1, use_async=True, uid="job-a", tiers=tiers_)
    ckpt.attach()
    return ckpt


@pytest.fixture
def no_volume_reads(monkeypatch):
    """Fails the test if a load reads the volume."""
    reads = []

    def load(*args, **kwargs):
        reads.append(kwargs.get("checkpoint_id"))
        return real(*args, **kwargs)

    real = checkpoint.dcp.load
    monkeypatch.setattr(checkpoint.dcp, "load", load)
    return reads


def saved(root: Path, held: memstate.Tiers, steps=(10, 20)) -> None:
    ckpt = checkpointer(root, held)
    for step in steps:
        ckpt.save(step, state(float(step)))
    ckpt.finalize()
    held.wait_written()


def test_an_in_process_restart_restores_from_memory_and_reads_nothing(tmp_path, group, no_volume_reads):
    held = tiers(tmp_path / "shm")
    saved(tmp_path / "ckpt", held)
    got = state(-1.0)
    ckpt = checkpointer(tmp_path / "ckpt", held)  # the same process: its copies are still there
    assert ckpt.load_latest(got) == 20
    assert ckpt.restored_from == memstate.MEMORY and no_volume_reads == []
    assert torch.equal(got["model"]["w"], torch.full((64,), 20.0))
    assert got["optim"]["param_groups"][0]["lr"] == pytest.approx(2.0)


def test_a_respawned_process_restores_from_the_node(tmp_path, group, no_volume_reads):
    saved(tmp_path / "ckpt", tiers(tmp_path / "shm"))
    got = state(-1.0)
    ckpt = checkpointer(tmp_path / "ckpt", tiers(tmp_path / "shm"))  # a new process: nothing in memory
    assert ckpt.load_latest(got) == 20
    assert ckpt.restored_from == memstate.NODE and no_volume_reads == []
    assert torch.equal(got["optim"]["state"]["w"]["exp_avg"], torch.full((64,), 10.0))


@pytest.mark.parametrize("damage", ["flip", "truncate", "other-step"])
def test_a_damaged_node_copy_is_skipped_for_the_volume(tmp_path, group, no_volume_reads, damage):
    saved(tmp_path / "ckpt", tiers(tmp_path / "shm"))
    path = tmp_path / "shm" / "own-rank-0.pt"
    data = bytearray(path.read_bytes())
    if damage == "flip":  # one bit of a tensor's bytes: the file still reads, its checksum does not match
        at = data.rindex(torch.full((64,), 20.0).numpy().tobytes()) + 100
        data[at] ^= 0x01
        path.write_bytes(bytes(data))
    elif damage == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:  # a copy of step 10 where step 20 is the newest committed: never loaded in its place
        saved(tmp_path / "old", tiers(tmp_path / "shm"), steps=(10,))
    got = state(-1.0)
    ckpt = checkpointer(tmp_path / "ckpt", tiers(tmp_path / "shm"))
    assert ckpt.load_latest(got) == 20
    assert ckpt.restored_from == memstate.VOLUME and len(no_volume_reads) == 1
    assert torch.equal(got["model"]["w"], torch.full((64,), 20.0))


def test_a_memory_copy_that_fails_its_checksum_falls_back_to_the_node(tmp_path, group, no_volume_reads):
    held = tiers(tmp_path / "shm")
    saved(tmp_path / "ckpt", held)
    assert held.committed is not None
    held.committed.tensors[repr(("model", "w"))][3] = 7.0  # a bit flip in host memory
    got = state(-1.0)
    ckpt = checkpointer(tmp_path / "ckpt", held)
    assert ckpt.load_latest(got) == 20 and ckpt.restored_from == memstate.NODE
    assert torch.equal(got["model"]["w"], torch.full((64,), 20.0))


def test_a_state_over_the_budget_is_not_copied_and_says_so(tmp_path, group, no_volume_reads):
    held = tiers(None, budget=1024)  # a state of 64 floats + 64 floats: 512 bytes, twice over 1024
    saved(tmp_path / "ckpt", held, steps=(10,))
    assert held.committed is not None and held.memory_bytes == 516
    small = tiers(None, budget=256)
    saved(tmp_path / "ckpt2", small, steps=(10,))
    assert small.committed is None and small.memory_bytes == 0 and "do not fit" in small.skipped
    got = state(-1.0)
    ckpt = checkpointer(tmp_path / "ckpt2", small)
    assert ckpt.load_latest(got) == 10 and ckpt.restored_from == memstate.VOLUME


def test_a_copy_restores_only_into_the_same_structure():
    copy = memstate.Copy.take(10, 0, 1, "u", state(10.0)).seal()
    other = state(0.0)
    other["model"]["extra"] = torch.zeros(2)
    with pytest.raises(ValueError, match="another structure"):
        copy.restore_into(other)
    resized = state(0.0)
    resized["model"]["w"] = torch.zeros(32)
    with pytest.raises(ValueError, match="does not fit"):
        copy.restore_into(resized)


@pytest.mark.parametrize(("own", "held", "plan"), [
    ([True, True, True, True], [2, 3, 0, 1], {}),  # every rank has its own copy
    ([True, True, False, False], [2, 3, -1, -1], {2: 0, 3: 1}),  # node 1 lost: node 0 holds its ranks' copies
    ([True, True, False, False], [2, -1, -1, -1], None),  # rank 3's copy is nowhere: all from the volume
    ([False, False, False, False], [2, 3, 0, 1], {0: 2, 1: 3, 2: 0, 3: 1}),  # every node respawned elsewhere
], ids=["all-own", "spare", "one-missing", "all-peer"])
def test_plan_restore(own, held, plan):
    assert memstate.plan_restore(own, held) == plan


@pytest.mark.parametrize(("rank", "world", "local", "partner"), [
    (0, 4, 2, 2), (3, 4, 2, 1), (1, 2, 2, None), (5, 24, 8, 13), (0, 1, 1, None)])
def test_the_peer_is_the_same_local_rank_on_the_next_node(rank, world, local, partner):
    assert memstate.partner(rank, world, local) == partner


# --- two nodes of two ranks each, FSDP2-sharded, as separate processes --------------------------------
def _rank_main(scenario: str, rank: int, port: int, root: str) -> None:
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.set_num_threads(1)
    torch.manual_seed(0)
    world, local_world = 4, 2
    store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (world,))
    node = f"node{rank // local_world}"

    def model_and_opt():
        model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Linear(16, 16))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.Adam(model.parameters(), lr=0.01)

    def ckpt_on(node_dir: str) -> Checkpointer:
        held = memstate.Tiers(rank, world, "job-a", 64 * MiB, Path(root) / node_dir)
        ckpt = Checkpointer(Path(root) / "ckpt", rank, world, use_async=True, uid="job-a", tiers=held,
                            local_world=local_world)
        ckpt.attach(timeout=datetime.timedelta(seconds=60))
        return ckpt

    out: dict[str, Any] = {}
    if scenario == "save":
        model, opt = model_and_opt()
        ckpt = ckpt_on(node)
        for step in (1, 2, 3):
            model(torch.randn(4, 16, generator=torch.Generator().manual_seed(step * 10 + rank))).sum().backward()
            opt.step()
            opt.zero_grad()
            model_sd, optim_sd = get_state_dict(model, opt)
            ckpt.save(step, {"model": model_sd, "optim": optim_sd})
        ckpt.finalize()
        ckpt._exchange.join()  # the peer copies of the last commit are on their nodes
        out["checksum"] = [float(p.full_tensor().double().abs().sum()) for p in model.parameters()]
    else:  # "restore": new processes; node 1's pod was replaced (a fresh /dev/shm), or its copies damaged
        reads = []
        real = checkpoint.dcp.load
        checkpoint.dcp.load = lambda *a, **k: reads.append(1) or real(*a, **k)
        model, opt = model_and_opt()
        model_sd, optim_sd = get_state_dict(model, opt)
        ckpt = ckpt_on(node)
        st = {"model": model_sd, "optim": optim_sd}
        out["step"] = ckpt.load_latest(st)
        set_state_dict(model, opt, model_state_dict=st["model"], optim_state_dict=st["optim"])
        out.update(source=ckpt.restored_from, volume_reads=len(reads),
                   checksum=[float(p.full_tensor().double().abs().sum()) for p in model.parameters()])
        ckpt.tiers.wait_written()
        out["own_file_now"] = (Path(root) / node / f"own-rank-{rank}.pt").exists()
    ckpt.close()
    print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


def four_ranks(tmp_path: Path, scenario: str) -> list[dict[str, Any]]:
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TORCH_CPP_LOG_LEVEL": "ERROR"}
    procs = [subprocess.Popen([sys.executable, __file__, scenario, str(rank), str(port), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
             for rank in range(4)]
    return rank_results(procs)


def test_a_replaced_node_fetches_its_ranks_copies_from_its_peer_and_the_volume_is_not_read(tmp_path):
    before = four_ranks(tmp_path, "save")
    assert sorted(p.name for p in (tmp_path / "node0").iterdir()) == [
        "own-rank-0.pt", "own-rank-1.pt", "peer-rank-2.pt", "peer-rank-3.pt"]
    for path in (tmp_path / "node1").iterdir():  # node 1's replacement: a fresh /dev/shm
        path.unlink()
    after = four_ranks(tmp_path, "restore")
    assert [r["source"] for r in after] == ["node", "node", "peer", "peer"]
    assert all(r["step"] == 3 and r["volume_reads"] == 0 for r in after)
    assert [r["checksum"] for r in after] == [b["checksum"] for b in before]
    assert all(r["own_file_now"] for r in after)  # the fetched copies are the new node's own from now on


def test_a_damaged_peer_copy_sends_every_rank_to_the_volume(tmp_path):
    before = four_ranks(tmp_path, "save")
    for path in (tmp_path / "node1").iterdir():
        path.unlink()
    held = tmp_path / "node0" / "peer-rank-3.pt"
    data = bytearray(held.read_bytes())
    data[-200] ^= 0xFF
    held.write_bytes(bytes(data))
    after = four_ranks(tmp_path, "restore")
    assert [r["source"] for r in after] == ["volume"] * 4
    assert all(r["step"] == 3 and r["volume_reads"] == 1 for r in after)
    assert [r["checksum"] for r in after] == [b["checksum"] for b in before]


if __name__ == "__main__":
    _rank_main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])
