"""Shared fixtures: an embedded emulated API server per test, and the real operator on it."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rtj_operator import api
from rtj_operator.devcluster import EmbeddedCluster, JobSimulator, OperatorThread
from rtj_operator.kube import Kube

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = sorted((ROOT / "examples").glob("*.yaml"))


def rtj_body(name: str = "train", namespace: str = "default", **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"image": "worker:1", "nodes": {"count": 2},
                            "storage": {"storageClassName": "fsx-sc"}}
    base.update(spec)
    return {"apiVersion": api.API_VERSION, "kind": api.KIND,
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1},
            "spec": copy.deepcopy(base)}


def wait_until(check: Callable[[], Any], timeout: float = 20.0, step: Callable[[], None] | None = None,
               what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        if step is not None:
            step()
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


@pytest.fixture
def cluster() -> Iterator[EmbeddedCluster]:
    cluster = EmbeddedCluster().start()
    yield cluster
    cluster.stop()


@pytest.fixture
def kube(cluster: EmbeddedCluster) -> Kube:
    return cluster.kube()


@pytest.fixture
def sim(kube: Kube) -> JobSimulator:
    simulator = JobSimulator(kube, ["node-a", "node-b", "node-c", "node-d"])
    simulator.add_nodes()
    return simulator


@pytest.fixture
def operator(cluster: EmbeddedCluster) -> Iterator[OperatorThread]:
    thread = OperatorThread(cluster.url, max_requeue=0.3).start()
    yield thread
    thread.stop()
    assert thread.error is None, thread.error


def load_yaml(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())
