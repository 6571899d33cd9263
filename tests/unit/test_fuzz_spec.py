"""Property: a generated spec (tests/specgen.py) is rejected with a message naming the field, or every
child it yields is valid (the upstream OpenAPI schemas and the transcribed server-side checks).
tests/cluster/test_fuzz_spec_server.py feeds the same generator to a real API server."""

from __future__ import annotations

import functools
from collections import Counter
from typing import Any

import kubernetes_validate.utils
import pytest
from hypothesis import given, settings
from pod_examples import FULL_POD

from specgen import SETTINGS, bodies, check, children_for_spec, pod_bodies, server_side_errors, with_issue_examples


def test_server_side_rules_catch_what_the_issue_reported():
    """The transcribed rules reject the children of the specs in issue 9 item 2 (built without spec.py)."""
    from testkit import rtj_body

    def child_errors(name: str = "train", **spec: Any) -> list[str]:
        return [e for m in children_for_spec(rtj_body(name=name, **spec)) for e in server_side_errors(m)]

    assert child_errors() == []
    assert child_errors("70b-run") and child_errors("llama.v2")
    assert child_errors(placement={"nodeSelector": {"team": "ml research"}})
    assert child_errors(placement={"instanceType": "p5 48xlarge"})
    assert child_errors(image=" worker:1")
    assert child_errors(serviceAccountName="Trainer") and child_errors(priorityClassName="a..b")
    assert child_errors(storage={"storageClassName": "fsx-sc", "size": "0"})
    assert child_errors(env=[{"value": "x"}]) and child_errors(env=[{"name": "A", "value": 64}])
    assert child_errors(placement={"tolerations": [{"operator": "Equal", "value": "x"}]})
    assert child_errors(resiliency={"rendezvousPort": 65534})
    # Issue 18.4: the pod template's parts, as the API server would see them.
    assert child_errors(pod={"volumeMounts": [{"name": "missing", "mountPath": "/x"}]})
    assert child_errors(pod={"volumes": [{"name": "data"}]})
    assert child_errors(pod={"volumes": [{"name": "dshm", "emptyDir": {}}]})
    assert child_errors(pod={"initContainers": [{"name": "worker", "image": "i"}]})
    assert child_errors(pod={"annotations": {"bad key": "x"}}) and child_errors(pod={"schedulerName": "Bad"})
    assert child_errors(pod={"initContainers": [{"name": "s", "image": "i", "ports": [{"containerPort": 1,
                                                                                   "name": "a--b"}]}]})
    assert child_errors(pod={"volumes": [{"name": "d", "emptyDir": {}}],
                             "volumeMounts": [{"name": "d", "mountPath": "/checkpoints"}]})
    assert child_errors(pod={"volumes": [{"name": "v", "hostPath": {"path": "/a/../b"}}]})
    assert child_errors(pod={"volumes": [{"name": "s", "secret": {"secretName": "s", "items": [
        {"key": "k", "path": "../x"}]}}]})
    assert child_errors(pod=FULL_POD) == []



@pytest.fixture
def cached_schemas(monkeypatch: pytest.MonkeyPatch) -> None:
    """kubernetes-validate reads its JSON schemas from disk on every call: 3/4 of this test's time."""
    monkeypatch.setattr(kubernetes_validate.utils, "schema_contents",
                        functools.cache(kubernetes_validate.utils.schema_contents))


def test_every_spec_is_rejected_clearly_or_yields_valid_children(cached_schemas: None):
    seen: Counter = Counter()

    @SETTINGS
    @with_issue_examples
    @given(bodies)
    def run(body: dict[str, Any]) -> None:
        check(body, seen)

    run()
    # The generator must reach both outcomes, or the property says little.
    assert seen["accepted"] >= 10 and seen["rejected"] >= 10, seen


def test_every_spec_pod_is_rejected_clearly_or_yields_valid_children(cached_schemas: None):
    """spec.pod on an otherwise plausible spec: in `bodies` the rest of a large spec is nearly always
    rejected first, so the pod template's own outcomes get a run of their own."""
    seen: Counter = Counter()

    @settings(SETTINGS, max_examples=400)
    @given(pod_bodies)
    def run(body: dict[str, Any]) -> None:
        check(body, seen)

    run()
    assert seen["accepted"] >= 50 and seen["rejected"] >= 50, seen


