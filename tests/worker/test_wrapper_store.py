"""inprocess.Wrapper's store (rtj_worker.train.CoordinatorStore, NodeZeroStore) against a real TCPStore,
driven through the calls NVRx's own sibling monitor and CallWrapper make when a whole node's ranks go
silent (a node loss): the survivors must be able to leave.

Found end to end on the node agents: NVRx's sibling monitor (0.4.1 and 0.6) records the silent ranks at
the termination barrier as the store's bytes ("b'2'"), and the survivors' CallWrapper.shutdown then
failed to parse the barrier (ValueError), never stopped its ProgressWatchdog thread and hung at exit.
"""

from __future__ import annotations

import datetime

import pytest
import torch.distributed as dist
from nvidia_resiliency_ext import inprocess

from rtj_worker.train import CoordinatorStore, NodeZeroStore
from testkit import free_port

NO_WAIT = datetime.timedelta(0)


def silent_node_then_survivor_leaves(base: inprocess.store.StoreMixin) -> None:
    """Ranks 2 and 3 (a lost node) go silent in iteration 0 of a world of 4; rank 0 then leaves."""
    for rank in range(4):
        base.set_initial_rank(rank, rank)
    iteration = inprocess.store.PrefixStore(0, base)  # as the monitor process and the sibling monitor use it
    for rank in range(4):
        iteration.set_initial_rank(rank, rank)
    silent = iteration.get_initial_ranks([2, 3])  # what SiblingMonitor.terminate_unresponsive_ranks passes on
    iteration.base_store.termination_barrier(ranks=silent, rendezvous_count=4, timeout=NO_WAIT)
    base.termination_barrier(ranks=[0], rendezvous_count=4, timeout=NO_WAIT)  # CallWrapper.shutdown


@pytest.fixture
def server() -> tuple[dist.TCPStore, int]:
    port = free_port()
    return dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, use_libuv=True), port


def test_the_coordinators_store_lets_survivors_leave_after_a_node_went_silent(server) -> None:
    _, port = server
    silent_node_then_survivor_leaves(CoordinatorStore("127.0.0.1", port, "group-a"))


def test_node_zeros_store_lets_survivors_leave_after_a_node_went_silent(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "0")  # NVRx's TCPStore: rank 0 hosts it
    store = NodeZeroStore(host_name="127.0.0.1", port=free_port(), world_size=1, wait_for_workers=False)
    silent_node_then_survivor_leaves(store)


def test_nvrx_own_store_fails_the_same_sequence(server) -> None:
    """What the subclasses fix: with NVRx's store classes the survivor's shutdown raises."""
    _, port = server
    client = dist.TCPStore("127.0.0.1", port, is_master=False, use_libuv=True)

    class Plain(dist.PrefixStore, inprocess.store.StoreMixin):
        pass

    with pytest.raises(ValueError, match="b'2'"):
        silent_node_then_survivor_leaves(Plain("group-b", client))
