"""The recovery ladder's pure core (ladder.py), table-tested in the style of JobSet's controller
tests: what each pod and node state means (classify), who pays for a fault (attribute), which
budget ends a job (over_budget), what the Job's own verdict means (job_verdict)."""

from __future__ import annotations

import datetime

import pytest

from rtj_operator import ladder
from rtj_worker import exit_codes

NOW = datetime.datetime(2026, 1, 1, 12, 0, tzinfo=datetime.UTC)
TIMING = ladder.Timing(node_grace=datetime.timedelta(seconds=30),
                         terminating_timeout=datetime.timedelta(seconds=60))


def node(ready: str = "True", since: int = 600, unreachable: bool = False, taints: tuple[str, ...] = ()) -> dict:
    changed = (NOW - datetime.timedelta(seconds=since)).strftime("%Y-%m-%dT%H:%M:%SZ")
    keys = [*taints, *(["node.kubernetes.io/unreachable"] if unreachable else [])]
    taints = [{"key": key, "effect": "NoExecute"} for key in keys]
    return {"metadata": {"name": "n"}, "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": changed}]}}


def pod(phase="Running", deleting_since=None, age=3600, **status) -> dict:
    created = (NOW - datetime.timedelta(seconds=age)).strftime("%Y-%m-%dT%H:%M:%SZ")
    meta = {"name": "p", "uid": "u", "creationTimestamp": created}
    if deleting_since is not None:
        meta["deletionTimestamp"] = (NOW - datetime.timedelta(seconds=deleting_since)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"metadata": meta, "spec": {"nodeName": "n"}, "status": {"phase": phase, **status}}


def terminated(code, reason="Error", finished_ago=None):
    term = {"exitCode": code, "reason": reason}
    if finished_ago is not None:
        term["finishedAt"] = (NOW - datetime.timedelta(seconds=finished_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")
    return {"containerStatuses": [{"state": {"terminated": term}}]}


def waiting(reason):
    return {"containerStatuses": [{"state": {"waiting": {"reason": reason}}}]}


DISRUPTED = [{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI"}]


@pytest.mark.parametrize("the_pod, the_node, kind, reason, action", [
    (pod(), node(), None, None, None),  # alive and healthy: in-job layers own it
    (pod(), None, ladder.PLATFORM_FAULT, "NodeDeleted", ladder.EVICT),
    (pod(), node("False", since=60), ladder.PLATFORM_FAULT, "NodeNotReady", ladder.EVICT),
    (pod(), node("False", since=5), None, None, None),  # a blip: within the grace period
    (pod(), node("Unknown", since=5, unreachable=True), None, None, None),
    (pod(), node("Unknown", since=31, unreachable=True), ladder.PLATFORM_FAULT, "NodeUnreachable", ladder.EVICT),
    (pod(deleting_since=5), node("False"), ladder.PLATFORM_FAULT, "NodeNotReady", ""),
    # Issue 17.3: past the timeout on a lost node, but nothing says the node stopped running it: no force.
    (pod(deleting_since=61), node("False"), ladder.PLATFORM_FAULT, "NodeNotReady", ""),
    (pod(deleting_since=61), node("False", taints=[ladder.OUT_OF_SERVICE]), ladder.PLATFORM_FAULT, "NodeNotReady",
     ladder.FORCE),
    # Issue 29.9: as PodGC, the taint fences a node that is not Ready; one whose kubelet still says Ready
    # (its unreachable taint not yet lifted) may still run the pod: a second process of the rank would
    # share its checkpoints. Not forced.
    (pod(deleting_since=61), node(taints=[ladder.OUT_OF_SERVICE], unreachable=True), ladder.PLATFORM_FAULT,
     "NodeUnreachable", ""),
    (pod(deleting_since=1), None, ladder.PLATFORM_FAULT, "NodeDeleted", ladder.FORCE),  # nothing runs there
    (pod(deleting_since=300), node(), None, None, None),  # a live kubelet finishes it
    (pod(deleting_since=1, conditions=DISRUPTED), node(), ladder.PLATFORM_FAULT, "EvictionByEvictionAPI", ""),
    (pod("Failed", **terminated(137, "OOMKilled")), node(), ladder.JOB_FAILURE, "OOMKilled", ""),
    (pod("Failed", **terminated(1)), node(), ladder.JOB_FAILURE, "ExitCode1", ""),
    (pod("Failed", deleting_since=1, **terminated(143)), node(), ladder.PLATFORM_FAULT, "PodDeleted", ""),
    # Issue 17.1: ended after its deletion was asked for, whatever the exit code (ft_launcher exits 1
    # on SIGTERM): a deletion. Ended before it: its own failure, deleted afterwards.
    (pod("Failed", deleting_since=30, **terminated(1, finished_ago=10)), node(), ladder.PLATFORM_FAULT,
     "PodDeleted", ""),
    (pod("Failed", deleting_since=30, **terminated(1, finished_ago=60)), node(), ladder.JOB_FAILURE,
     "ExitCode1", ""),
    (pod("Failed", **terminated(70)), node(), ladder.JOB_FAILURE, "LauncherRestartsExhausted", ""),
    (pod("Failed", **terminated(71)), node(), ladder.RENDEZVOUS, "RendezvousFailed", ""),
    (pod("Failed", **terminated(72)), node(), ladder.PEER, "RendezvousHostLost", ""),
    (pod("Failed", **terminated(76)), node(), ladder.UNRESOLVED, "RendezvousHostUnresolved", ""),
    (pod("Failed", **terminated(77)), node(), ladder.PLATFORM_FAULT, "RendezvousControlFailed", ""),
    (pod("Failed", **terminated(78)), node(), ladder.RDZV_CLOSED, "RendezvousClosed", ""),
    (pod("Failed", **terminated(79)), node(), ladder.PERMANENT, "LauncherDeclined", ""),
    (pod("Failed", **terminated(73)), node(), ladder.PLATFORM_FAULT, "NodeUnhealthy", ""),
    (pod("Failed", **terminated(74)), node(), ladder.PEER, "GangStopped", ""),
    (pod("Failed", **terminated(75)), node(), ladder.JOB_FAILURE, "LauncherNoProgress", ""),
    (pod("Failed", **terminated(143)), node(), ladder.PLATFORM_FAULT, "Terminated", ""),
    (pod("Failed", **terminated(64)), node(), ladder.PERMANENT, "ConfigError", ""),
    (pod("Failed", reason="Evicted", message="low memory"), node(), ladder.PLATFORM_FAULT, "Evicted", ""),
    (pod("Failed", conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]),
     node(), ladder.PLATFORM_FAULT, "PreemptionByScheduler", ""),
    (pod("Pending", **waiting("ImagePullBackOff")), node(), ladder.PERMANENT, "ImagePullBackOff", ""),
    (pod("Pending", age=60, **waiting("ImagePullBackOff")), node(), None, None, None),
    (pod("Pending", **waiting("InvalidImageName")), node(), ladder.PERMANENT, "InvalidImageName", ""),
    # Issue 8.h: a Secret created a moment later is a common, transient CreateContainerConfigError.
    (pod("Pending", age=30, **waiting("CreateContainerConfigError")), node(), None, None, None),
    (pod("Pending", age=180, **waiting("CreateContainerConfigError")), node(), ladder.PERMANENT,
     "CreateContainerConfigError", ""),
    (pod("Pending", **waiting("ContainerCreating")), node(), None, None, None),
])
def test_classify(the_pod, the_node, kind, reason, action):
    finding = ladder.classify(the_pod, the_node, NOW, TIMING, fenced=ladder.fencing(the_node))
    if kind is None:
        assert finding is None
    else:
        assert (finding.kind, finding.reason, finding.action) == (kind, reason, action)


def test_grace_periods_tell_when_to_look_again():
    plan = ladder.Plan()
    assert ladder.classify(pod(), node("False", since=10), NOW, TIMING, plan) is None
    assert plan.recheck == 20


def test_plan_charges_each_pod_once():
    failed = pod("Failed", **terminated(1))
    first = ladder.plan([failed], {"n": node()}, set(), NOW, TIMING)
    assert [f.reason for f in first.findings] == ["ExitCode1"]
    again = ladder.plan([failed], {"n": node()}, {"u"}, NOW, TIMING)
    assert again.findings == []


@pytest.mark.parametrize("failed, delay", [(0, 0), (1, 10), (2, 20), (3, 40), (7, 600), (50, 600)])
def test_replacement_backoff_follows_the_job_controller(failed, delay):
    assert ladder.replacement_backoff(failed) == delay


# --- one fault, one charge ---------------------------------------------------------------------------
def finding(kind: str, name: str = "p", reason: str = "R", lost_node: str = "", age: float = 0.0) -> ladder.Finding:
    return ladder.Finding(name, f"uid-{name}", kind, reason, f"{name}: {reason}", lost_node=lost_node, age=age)


NODE_LOSS = finding(ladder.PLATFORM_FAULT, "p0", "NodeUnreachable", lost_node="n0")
PEER_EXIT = finding(ladder.PEER, "p1", "RendezvousHostLost")
PEER_EXIT_2 = finding(ladder.PEER, "p2", "RendezvousHostLost")
PEER_EXIT_OLD = finding(ladder.PEER, "p2", "RendezvousHostLost", age=61)
RDZV_1 = finding(ladder.RENDEZVOUS, "p1", "RendezvousFailed")
RDZV_2 = finding(ladder.RENDEZVOUS, "p2", "RendezvousFailed")
CRASH = finding(ladder.JOB_FAILURE, "p1", "ExitCode1")
UNRESOLVED_1 = finding(ladder.UNRESOLVED, "p1", "RendezvousHostUnresolved")
CLOSED_1 = finding(ladder.RDZV_CLOSED, "p1", "RendezvousClosed")
CLOSED_2 = finding(ladder.RDZV_CLOSED, "p2", "RendezvousClosed")
CLOSED_OLD = finding(ladder.RDZV_CLOSED, "p2", "RendezvousClosed", age=61)
UNHEALTHY_0 = finding(ladder.PLATFORM_FAULT, "p0", "NodeUnhealthy", lost_node="n0")
LOST_N0 = {"n0": "NodeUnreachable"}


@pytest.mark.parametrize("findings, fault, lost, expect, after", [
    # A lost node and the failures it caused on its peers, seen in the same pass: one disruption.
    ([PEER_EXIT, PEER_EXIT_2, NODE_LOSS], ladder.Fault(1), LOST_N0,
     [("p0", ladder.PLATFORM, ""), ("p1", ladder.NOBODY, ladder.EXCUSED), ("p2", ladder.NOBODY, ladder.EXCUSED)],
     ladder.Fault(1, ("n0",), 1, True)),
    # The peers' failures first, node 0 lost already but its pod not yet found: charged once, as that
    # node's disruption; the node's own finding, later, is not charged again.
    ([PEER_EXIT, PEER_EXIT_2], ladder.Fault(1), LOST_N0,
     [("p1", ladder.PLATFORM, ""), ("p2", ladder.NOBODY, ladder.EXCUSED)], ladder.Fault(1, ("n0",), 1, True)),
    ([NODE_LOSS], ladder.Fault(1, ("n0",), 1, True), LOST_N0, [("p0", ladder.NOBODY, ladder.DUPLICATE)],
     ladder.Fault(1, ("n0",), 1, True)),
    # No cause in sight: held, then charged to the job once PEER_ATTRIBUTION_SECONDS have passed, and
    # the later peers of it follow from that one charge.
    ([PEER_EXIT], ladder.Fault(1), {}, [("p1", ladder.NOBODY, ladder.HOLD)], ladder.Fault(1)),
    ([PEER_EXIT_OLD], ladder.Fault(1), {}, [("p2", ladder.JOB, "")], ladder.Fault(1, (), 1)),
    ([PEER_EXIT], ladder.Fault(1, (), 1), {}, [("p1", ladder.NOBODY, ladder.EXCUSED)], ladder.Fault(1, (), 1)),
    # A job failure being recovered: its peers' failures are its consequences.
    ([CRASH, PEER_EXIT, PEER_EXIT_OLD], ladder.Fault(1), {},
     [("p1", ladder.JOB, ""), ("p1", ladder.NOBODY, ladder.EXCUSED), ("p2", ladder.NOBODY, ladder.EXCUSED)],
     ladder.Fault(1, (), 1)),
    # Every pod reports the same failed rendezvous: one charge per attempt.
    ([RDZV_1, RDZV_2], ladder.Fault(2), {}, [("p1", ladder.JOB, ""), ("p2", ladder.NOBODY, ladder.DUPLICATE)],
     ladder.Fault(2, (), 1)),
    # Issue 27.3: the barrier closed the rendezvous after an unhealthy node (its lifetime count over the
    # spares): every survivor exits 78; one charge, the unhealthy node's disruption, and one new gang.
    ([CLOSED_1, CLOSED_2, UNHEALTHY_0], ladder.Fault(1), {"n0": "NodeUnhealthy"},
     [("p0", ladder.PLATFORM, ""), ("p1", ladder.NOBODY, ladder.EXCUSED), ("p2", ladder.NOBODY, ladder.DUPLICATE)],
     ladder.Fault(1, ("n0",), 1, True)),
    # No cause in sight: held like a peer's exit, then charged to the job once, never once per pod.
    ([CLOSED_1, CLOSED_2], ladder.Fault(1), {}, [("p1", ladder.NOBODY, ladder.HOLD),
                                                 ("p2", ladder.NOBODY, ladder.DUPLICATE)], ladder.Fault(1)),
    ([CLOSED_OLD], ladder.Fault(1), {}, [("p2", ladder.JOB, "")], ladder.Fault(1, (), 1)),
    # The rendezvous host's name did not resolve: the cluster's DNS, once per attempt, and the peer that
    # gave up on the rendezvous meanwhile follows from it (charged first, whatever the order found).
    ([RDZV_2, UNRESOLVED_1], ladder.Fault(1), {},
     [("p1", ladder.PLATFORM, ""), ("p2", ladder.NOBODY, ladder.EXCUSED)], ladder.Fault(1, (), 1, True)),
    # Issue 29.6: a survivor's rendezvous gave up while a node of the gang is lost within its grace period (not
    # evicted, not charged yet): that node's disruption, not the job's failure; the node's own finding, later,
    # is not charged again.
    ([RDZV_1], ladder.Fault(1), LOST_N0, [("p1", ladder.PLATFORM, "")], ladder.Fault(1, ("n0",), 1, True)),
    # While a platform fault's replacement waits (no capacity), the survivors' failed rendezvous follow from it.
    ([RDZV_1], ladder.Fault(1, ("n0",), 1, True), {}, [("p1", ladder.NOBODY, ladder.EXCUSED)],
     ladder.Fault(1, ("n0",), 1, True)),
])
def test_attribute(findings, fault, lost, expect, after):
    charges, fault_after = ladder.attribute(findings, fault, lost)
    assert [(c.finding.pod, c.payer, c.why) for c in charges] == expect
    assert fault_after == after


def test_nothing_is_charged_while_the_job_is_suspended():
    charges, fault = ladder.attribute([CRASH, NODE_LOSS, RDZV_1], ladder.Fault(1), LOST_N0, suspended=True)
    assert {c.why for c in charges} == {ladder.SUSPENDED} and fault == ladder.Fault(1)


def test_nothing_is_charged_once_the_gang_finished():
    charges, fault = ladder.attribute([CRASH, NODE_LOSS, RDZV_1], ladder.Fault(1), LOST_N0, finished=True)
    assert {c.why for c in charges} == {ladder.FINISHED} and fault == ladder.Fault(1)


def test_attribute_gives_each_charge_its_tier():
    charges, _ = ladder.attribute([RDZV_1, CRASH], ladder.Fault(1), {})
    assert {c.finding.reason: c.tier for c in charges} == {"RendezvousFailed": ladder.GANG_RESTART,
                                                            "ExitCode1": ladder.REPLACE_POD}


def test_a_held_peer_failure_says_when_to_decide():
    (charge,), _ = ladder.attribute([finding(ladder.PEER, age=45)], ladder.Fault(1), {})
    assert charge.why == ladder.HOLD and charge.hold == 15 and not charge.seen


# --- the tables ------------------------------------------------------------------------------------
def test_every_exit_code_of_the_worker_has_a_meaning():
    contract = {v for k, v in vars(exit_codes).items() if k.isupper() and isinstance(v, int)}
    # Every code the entrypoint exits with has a meaning here; 0 is success, SIGKILL (137) is a failure
    # like any other (the OOM killer, or a kubelet past the grace period of a deletion, told apart by
    # the deletion), and 93 is ft_launcher's, which the entrypoint maps to LAUNCHER_DECLINED.
    assert set(ladder.EXIT_CODES) == contract - {exit_codes.OK, exit_codes.SIGKILL, exit_codes.NVRX_DO_NOT_RESTART}
    assert all(kind in ladder.FINDINGS for kind, _ in ladder.EXIT_CODES.values())
    # The Job's pod failure policy fails it on PERMANENT; 79 fails the job too, by the operator alone (the
    # policy's codes are part of the pod template, which running Jobs keep across an operator upgrade).
    assert {code for code, (kind, _) in ladder.EXIT_CODES.items() if ladder.FINDINGS[kind].fails} \
        == set(exit_codes.PERMANENT) | {exit_codes.LAUNCHER_DECLINED}


BUDGET = {"maxRestarts": 3, "maxDisruptions": 10, "maxRestartsWithoutProgress": 2}


@pytest.mark.parametrize("counters, reason", [
    ({"jobRestarts": 3, "disruptions": 10, "restartsWithoutProgress": 2}, None),
    ({"jobRestarts": 4}, "RestartBudgetExhausted"),
    ({"disruptions": 11}, "DisruptionBudgetExhausted"),
    ({"restartsWithoutProgress": 3}, "NoProgress"),
    ({"jobRestarts": 4, "restartsWithoutProgress": 3}, "RestartBudgetExhausted"),  # the first in order
])
def test_over_budget(counters, reason):
    spent = ladder.over_budget(counters, BUDGET, "pod p exited with code 1", 40)
    assert (spent[0] if spent else None) == reason
    if reason == "NoProgress":
        assert "past 40" in spent[1]


T0 = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.UTC)


def _at(seconds_ago: float) -> str:
    return (T0 - datetime.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.mark.parametrize("ages, window, keep, kept", [
    ([], 3600, 4, []),
    ([7200, 3000, 60], 3600, 4, [3000, 60]),  # older than the window: no longer counts
    ([3600, 3599], 3600, 4, [3599]),  # exactly the window's age: out
    ([50, 40, 30, 20, 10], 3600, 4, [40, 30, 20, 10]),  # the newest limit + 1 only: bounded
    ([10], 3600, 0, []),
])
def test_charges_in_window(ages, window, keep, kept):
    assert ladder.charges_in_window([_at(a) for a in ages], T0, window, keep) == [_at(a) for a in kept]


LIFETIME = {"jobRestarts": 9, "disruptions": 40, "restartsWithoutProgress": 2}


@pytest.mark.parametrize("window, times, counts", [
    # No window: the lifetime counters, whatever times are kept.
    (0, {"jobRestarts": [_at(10)]}, LIFETIME),
    # A window: the windowed budgets count their charges in it; the count in a row is never windowed.
    (3600, {"jobRestarts": [_at(7200), _at(10)], "disruptions": [_at(100), _at(50), _at(5)]},
     {"jobRestarts": 1, "disruptions": 3, "restartsWithoutProgress": 2}),
    (3600, {}, {"jobRestarts": 0, "disruptions": 0, "restartsWithoutProgress": 2}),
])
def test_budget_counts(window, times, counts):
    assert ladder.budget_counts(LIFETIME, times, {**BUDGET, "windowSeconds": window}, T0) == counts


def test_a_windowed_budget_says_so_when_spent():
    spent = ladder.over_budget({"disruptions": 11}, {**BUDGET, "windowSeconds": 3600}, "", 0)
    assert spent == ("DisruptionBudgetExhausted", "11 platform disruptions within 3600 s "
                     "(restartBudget.windowSeconds) exceed restartBudget.maxDisruptions=10")
    spent = ladder.over_budget({"restartsWithoutProgress": 3}, {**BUDGET, "windowSeconds": 3600}, "", 7)
    assert spent[0] == "NoProgress" and "within" not in spent[1]


@pytest.mark.parametrize("conditions, fails, tier", [
    ([], None, None),
    ([{"type": "FailureTarget", "status": "True", "reason": "PodFailurePolicy"}], "PermanentFailure", None),
    ([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}], "", ladder.GANG_RESTART),
    ([{"type": "FailureTarget", "status": "False", "reason": "BackoffLimitExceeded"}], None, None),
])
def test_job_verdict(conditions, fails, tier):
    verdict = ladder.job_verdict({"status": {"conditions": conditions}})
    if fails is None:
        assert verdict is None
    else:
        assert (verdict[0].fails, verdict[0].tier) == (fails, tier)


def failed_pod(index: int, failures: int = 0, ignored: int = 0, finished: float = 5, tracked: bool = True,
               phase: str = "Failed") -> dict:
    annotations = {ladder.INDEX: str(index), ladder.INDEX_FAILURES: str(failures)}
    if ignored:
        annotations[ladder.INDEX_IGNORED] = str(ignored)
    state = {"terminated": {"finishedAt": (NOW - datetime.timedelta(seconds=finished)).strftime("%Y-%m-%dT%H:%M:%SZ")}}
    return {"metadata": {"name": f"p{index}", "annotations": annotations,
                         "finalizers": [ladder.JOB_TRACKING] if tracked else []},
            "status": {"phase": phase, "containerStatuses": [{"state": state if phase == "Failed" else {}}]}}


@pytest.mark.parametrize("pods, due", [
    ([failed_pod(0)], {0: (10, 5)}),  # first failure of index 0, 5 s ago: 10 s, 5 left
    ([failed_pod(1, failures=1, ignored=1, finished=100)], {1: (40, 0)}),  # ignored failures count too
    ([failed_pod(0, finished=5), failed_pod(0, failures=2, finished=1)], {0: (40, 39)}),  # the last one counts
    ([failed_pod(0), failed_pod(0, phase="Running")], {}),  # replaced already
    ([failed_pod(0, tracked=False)], {}),  # accounted for: no back-off left for it
    ([failed_pod(2, failures=9, finished=0)], {2: (600, 600)}),  # capped at 10 minutes
])
def test_replacement_due_reads_the_job_controllers_per_index_back_off(pods, due):
    assert ladder.replacement_due(pods, NOW) == due


def test_a_pod_past_the_timeout_on_an_unfenced_node_waits_and_says_so():
    plan = ladder.plan([pod(deleting_since=61)], {"n": node("Unknown", unreachable=True)}, set(), NOW, TIMING)
    assert plan.actions == [] and plan.unfenced == {"n": ("p", "NodeUnreachable", 61.0)}
    fenced = ladder.plan([pod(deleting_since=61)], {"n": node("Unknown", unreachable=True)}, set(), NOW, TIMING,
                         cloud={"n": "its EC2 instance i-1 is terminated"})
    assert [a.action for a in fenced.actions] == [ladder.FORCE] and fenced.unfenced == {}


def test_a_pod_stuck_terminating_on_a_healthy_node_is_reported_not_forced():
    plan = ladder.plan([pod(deleting_since=300)], {"n": node()}, set(), NOW, TIMING)
    assert plan.actions == [] and plan.stuck == {"p": ("n", 300.0)}


def gang(n: int) -> tuple[list[dict], dict[str, dict]]:
    pods = []
    for i in range(n):
        p = pod()
        p["metadata"].update(name=f"p{i}", uid=f"u{i}")
        p["spec"]["nodeName"] = f"n{i}"
        pods.append(p)
    return pods, {f"n{i}": node() for i in range(n)}


def test_many_nodes_going_dark_at_once_brake_evictions():
    pods, nodes = gang(4)
    nodes["n0"] = node("Unknown", since=60, unreachable=True)
    one = ladder.plan(pods, nodes, set(), NOW, TIMING)
    assert [a.action for a in one.actions] == [ladder.EVICT] and not one.brake
    for n in ("n1", "n2"):
        nodes[n] = node("Unknown", since=60, unreachable=True)
    three = ladder.plan(pods, nodes, set(), NOW, TIMING)
    assert three.actions == [] and three.findings == [] and "3 of the gang's 4 nodes" in three.brake
    zone = ladder.plan(pods[:1], {"n0": nodes["n0"]}, set(), NOW, TIMING, zones={"us-west-2a": (5, 3)})
    assert zone.actions == [] and "zone us-west-2a" in zone.brake
    nodes.update(n1=None, n2=None)  # deleted: fenced, so their pods are replaced whatever the brake
    fenced = ladder.plan(pods, nodes, set(), NOW, TIMING)
    assert not fenced.brake and len(fenced.actions) == 3


# --- issue 29.5: nodes lost in one event are one disruption ----------------------------------------------
LOSS = {n: finding(ladder.PLATFORM_FAULT, f"p{n[1:]}", "NodeUnreachable", lost_node=n) for n in ("n0", "n1", "n2")}


@pytest.mark.parametrize("findings, fault, lost, window_open, expect, after", [
    # Three nodes lost in one pass (a rack): the first is the disruption, the others its event's.
    ([LOSS["n0"], LOSS["n1"], LOSS["n2"]], ladder.Fault(1), {"n0", "n1", "n2"}, False,
     [("p0", False), ("p1", True), ("p2", True)], ladder.Fault(1, ("n0", "n1", "n2"), 1, True)),
    # A later pass, within the window of the recovery's first loss: the same event.
    ([LOSS["n2"]], ladder.Fault(1, ("n0",), 1, True), {"n0", "n2"}, True, [("p2", True)],
     ladder.Fault(1, ("n0", "n2"), 1, True)),
    # ... past it: another disruption.
    ([LOSS["n2"]], ladder.Fault(1, ("n0",), 1, True), {"n0", "n2"}, False, [("p2", False)],
     ladder.Fault(1, ("n0", "n2"), 2, True)),
    # A node its health agent reports bad is a fault of its own, not part of a loss (no brake either way).
    ([LOSS["n0"], LOSS["n1"]], ladder.Fault(1), {"n0"}, False, [("p0", False), ("p1", False)],
     ladder.Fault(1, ("n0", "n1"), 2, True)),
    # A job's failure being recovered opens no event for a node lost later.
    ([LOSS["n1"]], ladder.Fault(1, (), 1), {"n1"}, True, [("p1", False)], ladder.Fault(1, ("n1",), 2, True)),
])
def test_nodes_lost_in_one_event_are_one_disruption(findings, fault, lost, window_open, expect, after):
    charges, fault_after = ladder.attribute(findings, fault, {n: "NodeUnreachable" for n in lost},
                                            lost=frozenset(lost), window_open=window_open)
    assert [(c.finding.pod, c.correlated) for c in charges] == expect
    assert all(c.payer == ladder.PLATFORM for c in charges)
    assert fault_after == after
