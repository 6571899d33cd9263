"""Ranks by node slots (rtj_worker.ranks): a spare takes the slot of the node it replaces, so every other
node keeps its ranks, and with them the shards it holds in memory (rtj_worker.memstate)."""

from __future__ import annotations

import pytest

from rtj_worker.ranks import node_slots, read_slot, slot_file


@pytest.mark.parametrize(("claims", "slots"), [
    ({0: -1, 1: -1, 2: -1}, {0: 0, 1: 1, 2: 2}),  # a new gang: the identity
    ({0: -1, 2: 2, 3: -1}, {0: 0, 2: 2, 3: 1}),  # node 1 lost, spare 3 takes slot 1; node 2 keeps slot 2
    ({1: 1, 2: 2, 3: -1}, {1: 1, 2: 2, 3: 0}),  # node 0 lost: the spare hosts slot 0 (and global rank 0)
    ({0: -1, 4: -1, 5: -1}, {0: 0, 4: 1, 5: 2}),  # two lost and no memory: the spares fill them lowest first
    # Spare 2 became slot 0 when node 0 had not come; node 1 is lost and node 0 joins: node 2 keeps slot 0
    # (its ranks and its copies), and node 0 takes the free slot 1 instead of its own index.
    ({0: -1, 2: 0}, {0: 1, 2: 0}),
    ({0: 1, 1: 1}, {0: 1, 1: 0}),  # one slot claimed twice (stale): the lower node rank keeps it
    ({3: 7, 4: -1}, {3: 0, 4: 1}),  # a slot out of range (the world shrank): not kept
    ({7: -1}, {7: 0}),
])
def test_node_slots(claims, slots):
    assert node_slots(claims) == slots
    assert sorted(node_slots(claims).values()) == list(range(len(claims)))


def test_a_nodes_slot_is_remembered_in_its_pod(tmp_path):
    assert read_slot(slot_file(str(tmp_path))) == -1 and slot_file(None) is None
    slot_file(str(tmp_path)).write_text("3")
    assert read_slot(slot_file(str(tmp_path))) == 3
