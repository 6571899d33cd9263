"""reconcile() without kopf: idempotency, one status write per pass, events after it."""

from __future__ import annotations

import datetime

from conftest import rtj_body
from rtj_operator import api
from rtj_operator.controller import run_pass, status_patch
from rtj_operator.kube import Kube, configure
from rtj_operator.reconcile import reconcile

WRITES = {"create", "patch", "patch/status", "delete"}


def converge(kube, sim, name="train", passes=4):
    for _ in range(passes):
        run_pass(kube, "default", name)
        sim.step()


def recording(cluster) -> tuple[Kube, list[tuple[str, str]]]:
    calls: list[tuple[str, str]] = []
    return Kube(configure(cluster.url), on_call=lambda verb, kind: calls.append((verb, kind))), calls


def test_a_converged_pass_writes_nothing(cluster, kube, sim):
    body = rtj_body()
    body["metadata"] = {"name": "train", "namespace": "default"}
    kube.create(body)
    converge(kube, sim)
    assert kube.get(api.KIND, "train", "default")["status"]["phase"] == "Running"
    client, calls = recording(cluster)
    run_pass(client, "default", "train")
    run_pass(client, "default", "train")
    assert not [c for c in calls if c[0] in WRITES], calls


def test_first_pass_writes_status_once_then_events(cluster, kube, sim):
    body = rtj_body()
    body["metadata"] = {"name": "train", "namespace": "default"}
    kube.create(body)
    client, calls = recording(cluster)
    run_pass(client, "default", "train")
    writes = [c for c in calls if c[0] in WRITES]
    assert writes.count(("patch/status", api.KIND)) == 1
    status_at = writes.index(("patch/status", api.KIND))
    assert writes[:status_at] == [("create", "Service"), ("create", "PersistentVolumeClaim"), ("create", "Job")]
    assert set(writes[status_at + 1:]) == {("create", "Event")}


def test_reconcile_is_a_function_of_the_world(cluster, kube, sim):
    body = rtj_body()
    body["metadata"] = {"name": "train", "namespace": "default"}
    kube.create(body)
    converge(kube, sim)
    rtj = kube.get(api.KIND, "train", "default")
    now = datetime.datetime(2026, 12, 2, tzinfo=datetime.UTC)
    first, second = reconcile(kube, rtj, now), reconcile(kube, rtj, now)
    assert first.status == second.status and first.events == second.events == []


def test_status_patch_sets_changes_and_removes_keys_but_not_kopfs():
    old = {"phase": "Running", "restartStartedTime": "t", "kopf": {"x": 1}, "restarts": 1}
    new = {"phase": "Running", "restarts": 2}
    assert status_patch(old, new) == {"restarts": 2, "restartStartedTime": None}
    assert status_patch(new, dict(new)) is None
