"""The client's paging and throttling (kube.py) against a fake `kubernetes` ApiClient: LISTs read in pages
of one snapshot (an expired continue token restarts the LIST unpaged), and 429s sent again after their
Retry-After a bounded number of times, never the eviction API's (a PodDisruptionBudget's answer)."""

from __future__ import annotations

import json
from typing import Any

import kubernetes
import pytest

from rtj_operator import kube as kube_module
from rtj_operator.kube import Kube, KubeError
from rtj_operator.workqueue import WorkQueue
from testkit import Clock


class Response:
    def __init__(self, body: dict[str, Any]):
        self.data = json.dumps(body).encode()


def api_exception(status: int, retry_after: str | None = None, message: str = "") -> Exception:
    exc = kubernetes.client.exceptions.ApiException(status=status, reason="refused")
    exc.body = json.dumps({"message": message or f"HTTP {status}"})
    exc.headers = {"Retry-After": retry_after} if retry_after is not None else {}
    return exc


class Client:
    """Answers each call with the next of `answers` (a body, or an exception to raise); records queries."""

    def __init__(self, answers: list[Any]):
        self.answers, self.calls = list(answers), []

    def call_api(self, path: str, method: str, query_params: list[tuple[str, str]], **_: Any) -> Response:
        self.calls.append((method, path, dict(query_params)))
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return Response(answer)


def pods(*names: str) -> list[dict[str, Any]]:
    return [{"metadata": {"name": n, "labels": {"a": "b"}}} for n in names]


def test_a_list_is_read_in_pages_of_one_snapshot_whose_version_is_the_lists() -> None:
    client = Client([{"metadata": {"resourceVersion": "100", "continue": "t1"}, "items": pods("p0", "p1")},
                     {"metadata": {"resourceVersion": "100", "continue": "t2"}, "items": pods("p2")},
                     {"metadata": {"resourceVersion": "100"}, "items": pods("p3")}])
    items, version = Kube(client).list_versioned("Pod", "ns", {"a": "b"})  # type: ignore[arg-type]
    assert [i["metadata"]["name"] for i in items] == ["p0", "p1", "p2", "p3"] and version == 100
    assert [c[2] for c in client.calls] == [
        {"labelSelector": "a=b", "limit": str(kube_module.PAGE_SIZE)},
        {"labelSelector": "a=b", "limit": str(kube_module.PAGE_SIZE), "continue": "t1"},
        {"labelSelector": "a=b", "limit": str(kube_module.PAGE_SIZE), "continue": "t2"}]


def test_an_expired_continue_token_restarts_the_list_unpaged_and_nothing_is_counted_twice() -> None:
    client = Client([{"metadata": {"resourceVersion": "100", "continue": "t1"}, "items": pods("p0")},
                     api_exception(410, message="The provided continue parameter is too old"),
                     {"metadata": {"resourceVersion": "180"}, "items": pods("p0", "p1")}])
    items, version = Kube(client).list_versioned("Pod", "ns")  # type: ignore[arg-type]
    assert [i["metadata"]["name"] for i in items] == ["p0", "p1"] and version == 180
    assert client.calls[-1][2] == {}  # no limit, no token: the whole list of a fresh snapshot


def test_a_410_on_the_first_page_is_the_callers() -> None:
    with pytest.raises(KubeError) as gone:
        Kube(Client([api_exception(410)])).list_versioned("Pod", "ns")  # type: ignore[arg-type]
    assert gone.value.status == 410


def test_a_throttled_call_is_sent_again_after_its_retry_after() -> None:
    waits: list[float] = []
    client = Client([api_exception(429, "2"), api_exception(429, "1"), {"metadata": {"name": "a-0"}}])
    result = Kube(client, sleep=waits.append).patch("Pod", "a-0", "ns", {"metadata": {}})  # type: ignore[arg-type]
    assert result == {"metadata": {"name": "a-0"}} and waits == [2.0, 1.0] and len(client.calls) == 3


@pytest.mark.parametrize("answers, waits, retry_after", [
    # throttled every time: TOO_BUSY_RETRIES waits, then the pass gets the 429 and its Retry-After
    ([api_exception(429, "1")] * (kube_module.TOO_BUSY_RETRIES + 1), [1.0] * kube_module.TOO_BUSY_RETRIES, 1.0),
    # a wait longer than TOO_BUSY_MAX_WAIT is not spent holding a worker: the pass is requeued instead
    ([api_exception(429, "60")], [], 60.0),
    # no Retry-After: not this client's to retry (the pass's back-off is)
    ([api_exception(429)], [], None),
    # a 5xx is the pass's back-off too
    ([api_exception(503, "1")], [], 1.0),
])
def test_what_is_not_retried_here_reaches_the_pass_with_its_retry_after(answers, waits, retry_after) -> None:
    seen: list[float] = []
    with pytest.raises(KubeError) as refused:
        Kube(Client(answers), sleep=seen.append).get("Pod", "a-0", "ns")  # type: ignore[arg-type]
    assert seen == waits and refused.value.retry_after == retry_after


def test_the_eviction_apis_429_is_a_disruption_budgets_answer_not_throttling() -> None:
    seen: list[float] = []
    kube = Kube(Client([api_exception(429, "10", "Cannot evict pod as it would violate the pod's disruption "
                                               "budget.")]), sleep=seen.append)  # type: ignore[arg-type]
    assert kube.evict("a-0", "ns") == "refused" and seen == []


def test_a_failed_pass_is_retried_no_sooner_than_retry_after() -> None:
    clock = Clock()
    queue = WorkQueue(clock=clock)
    assert queue.retry(("ns", "a")) == pytest.approx(0.2)  # the back-off's first step
    assert queue.retry(("ns", "b"), at_least=5.0) == 5.0  # the server asked for 5 s
    clock.now += 4.9
    assert queue.get(timeout=0) == ("ns", "a")
    queue.done(("ns", "a"))
    assert queue.get(timeout=0) is None
    clock.now += 0.1
    assert queue.get(timeout=0) == ("ns", "b")
