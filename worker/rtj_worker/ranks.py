"""Deterministic ranks and ports, independent of the launcher's choices.

- Ports: the operator reserves three consecutive ports on node 0, or on the coordinator pod
  (rendezvousPort = P): P is the launcher's c10d rendezvous store, P+1 the training processes' store,
  P+2 inprocess.Wrapper's store.
  ft_launcher overwrites MASTER_ADDR/MASTER_PORT in the ranks' environment with its own choice (a
  free port on whichever host it picked), so the stores are found from RTJ_RDZV_ENDPOINT instead.
- Ranks: the c10d rendezvous orders nodes by their host names as strings ("-10" before "-2"); the
  global rank is re-derived from the numeric node rank (the Job's completion index) and local rank,
  by node slots: a node keeps the slot it had in its previous worker group, and a spare or a replaced
  pod takes a missing node's slot. Each rank's FSDP shard follows its rank, so the nodes that survive a
  loss keep the shards they hold in memory (rtj_worker.memstate) and only the newcomer fetches its own.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

APP_STORE_OFFSET = 1
WRAPPER_STORE_OFFSET = 2


class KeyValueStore(Protocol):
    def set(self, key: str, value: str | bytes) -> None: ...

    def get(self, key: str) -> bytes: ...


def store_endpoint(env: Mapping[str, str]) -> tuple[str, int]:
    """Node 0's host and the rendezvous port P, from which P+1 and P+2 derive."""
    endpoint = env.get("RTJ_RDZV_ENDPOINT")
    if endpoint:
        host, port = endpoint.rsplit(":", 1)
        return host, int(port)
    return env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29400")) - 1


def group_key(env: Mapping[str, str]) -> str:
    """What names one worker group (one rendezvous round's ranks) alike on every rank: the address
    ft_launcher picked for the group's own store at that rendezvous, with the gang attempt."""
    return f"attempt{env.get('RTJ_ATTEMPT', '0')}/{env.get('MASTER_ADDR', '')}:{env.get('MASTER_PORT', '')}"


def numeric_rank(store: KeyValueStore, rank: int, world_size: int, node_rank: int, local_rank: int,
                 prefix: str, previous_slot: int = -1) -> int:
    """This process's rank: ranks ordered by (node slot, local rank), node_slots() giving the slots.
    `previous_slot`: the slot this node had in its previous worker group (-1: none; see slot_file).

    Collective over `store`: every rank publishes its (node, local, previous slot) under its launcher
    rank and reads all of them (get blocks until a key exists)."""
    store.set(f"{prefix}/{rank}", f"{node_rank}:{local_rank}:{previous_slot}")
    pairs, claims = [], {}
    for other in range(world_size):
        node, local, *prev = (int(x) for x in store.get(f"{prefix}/{other}").decode().split(":"))
        pairs.append((node, local))
        claims[node] = max(claims.get(node, -1), prev[0] if prev else -1)
    slots = node_slots(claims)
    return sorted((slots[node], local) for node, local in pairs).index((slots[node_rank], local_rank))


def node_slots(claims: dict[int, int]) -> dict[int, int]:
    """Each node rank's slot among len(claims) slots, given the slot each node had in its previous worker
    group (-1: none). A node keeps its previous slot (the lower node rank wins one claimed twice); then a
    node whose rank is a free slot takes it (a new gang: the identity); the others (spares, replaced pods)
    take the free slots, lowest node rank into the lowest slot. So when a node is lost, whoever replaces
    it takes its slot and every other node keeps its ranks, and with them the shards it holds."""
    count, slots = len(claims), {}
    for node in sorted(claims):
        if 0 <= claims[node] < count and claims[node] not in slots.values():
            slots[node] = claims[node]
    for node in sorted(claims):
        if node not in slots and node < count and node not in slots.values():
            slots[node] = node
    free = iter(sorted(set(range(count)) - set(slots.values())))
    return {node: slots[node] if node in slots else next(free) for node in sorted(claims)}


def slot_file(state_dir: str | None) -> Path | None:
    """Where a pod remembers its node's slot between its worker groups (it outlives the ranks, not the pod:
    as the copies of state a node holds do)."""
    return Path(state_dir) / "node-slot" if state_dir else None


def read_slot(path: Path | None) -> int:
    try:
        return int(path.read_text()) if path is not None else -1
    except (OSError, ValueError):
        return -1


def own_address(peer: str, env: Mapping[str, str]) -> str:
    """This host's address as other nodes reach it (a service this rank runs, e.g. the checkpoint
    writers' store when it is rank 0): RTJ_POD_IP when set (the pod's IP, from the downward API), else
    the source address of this host's route to `peer` (the stores' host: the coordinator pod, or node
    0 without one; connecting a UDP socket sends nothing), else its fully qualified name."""
    if env.get("RTJ_POD_IP"):
        return env["RTJ_POD_IP"]
    try:
        family, _, _, _, sockaddr = socket.getaddrinfo(peer, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect(sockaddr)
            return str(sock.getsockname()[0])
    except OSError:
        return socket.getfqdn()
