"""reconcile() as a pure function, table-tested in the style of JobSet's controller tests: a World
built by hand in, the Intent (actions, status, events, requeue) out; settle() folding action
results in. No API server: tests/cluster/test_reconcile.py and tests/cluster/test_recovery.py run the same code
against the local control plane."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import kopf
import pytest

from rtj_operator import api, ladder
from rtj_operator.actions import CREATE, DELETE, EVICT, FAIL_POD, PATCH, Result
from rtj_operator.builders import build_coordinator, build_job, build_network_policy, build_pvc, build_service
from rtj_operator.builders.job import template_hash
from rtj_operator.conditions import timestamp
from rtj_operator.draft import Config, Draft
from rtj_operator.kube import KubeError
from rtj_operator.policies.placement import gang_probes
from rtj_operator.policies.pods import coordinator_attempt, success_met
from rtj_operator.reconcile import reconcile, settle
from rtj_operator.spec import RTJ
from rtj_worker import exit_codes
from testkit import rtj_body

NOW = datetime.datetime(2026, 12, 3, 12, 0, tzinfo=datetime.UTC)


# The operator's Job suspend and resume: the suspend marked on the Job in the same write (api.ANNOTATION_SUSPENDED_BY).
SUSPEND = {"spec": {"suspend": True}, "metadata": {"annotations": {api.ANNOTATION_SUSPENDED_BY: api.MANAGER}}}
RESUME = {"spec": {"suspend": False}, "metadata": {"annotations": {api.ANNOTATION_SUSPENDED_BY: None}}}


def ts(seconds_ago: float) -> str:
    return (NOW - datetime.timedelta(seconds=seconds_ago)).strftime("%Y-%m-%dT%H:%M:%SZ")


def owned(obj: dict[str, Any], body: dict[str, Any], uid: str) -> dict[str, Any]:
    kopf.adopt(obj, owner=RTJ.from_body(body).owner)
    obj["metadata"]["uid"] = uid
    return obj


def node(name: str, ready: str = "True", since: float = 3600) -> dict[str, Any]:
    taints = [{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}] if ready == "Unknown" else []
    return {"metadata": {"name": name}, "spec": {"taints": taints},
            "status": {"conditions": [{"type": "Ready", "status": ready, "lastTransitionTime": ts(since)}]}}


def pod(index: int, phase: str = "Running", code: int | None = None, node_name: str | None = None,
        deleting: float | None = None, attempt: int = 1) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": f"train-{index}-x{attempt}", "namespace": "default",
                            "uid": f"pod-{index}-{attempt}",
                            "labels": {api.LABEL_NAME: "train", api.LABEL_MANAGED_BY: api.MANAGER},
                            "ownerReferences": [{"uid": "job-uid", "kind": "Job", "name": "train"}],
                            "creationTimestamp": ts(600)}
    if deleting is not None:
        meta["deletionTimestamp"], meta["deletionGracePeriodSeconds"] = ts(deleting - 120), 120
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "Ready", "status": str(phase == "Running")}]}
    if code is not None:
        status["containerStatuses"] = [{"state": {"terminated": {"exitCode": code, "finishedAt": ts(1)}}}]
    return {"metadata": meta, "spec": {"nodeName": node_name or f"n{index}"}, "status": status}


class W:
    """A world under construction: an RTJ and, by default, its converged children with 2 pods Running."""

    def __init__(self, children: bool = True, pods: int = 2, **spec: Any):
        from rtj_operator.world import World
        self.body = rtj_body(**spec)
        self.body["metadata"]["resourceVersion"] = "10"
        rtj = RTJ.from_body(self.body)
        self.world = World(self.body)
        if children:
            self.world.service = owned(build_service(rtj), self.body, "svc-uid")
            policy = build_network_policy(rtj)
            self.world.network_policy = owned(policy, self.body, "netpol-uid") if policy else None
            self.world.pvc = build_pvc(rtj)
            self.world.pvc["metadata"]["uid"] = "pvc-uid"
            self.job(1)
            self.world.pods = [pod(i) for i in range(pods)]
            self.world.nodes = {f"n{i}": node(f"n{i}") for i in range(pods)}
            self.coordinator(1)
            self.body["status"] = {"phase": "Running", "attempt": 1, "startTime": ts(600)}

    def coordinator(self, attempt: int, phase: str = "Running", node_name: str = "cpu-0") -> W:
        coord = build_coordinator(RTJ.from_body(self.body), attempt)
        if coord is not None:
            coord = owned(coord, self.body, f"coord-uid-{attempt}")
            coord["spec"]["nodeName"] = node_name
            coord["status"] = {"phase": phase, **({"podIP": "10.0.0.9"} if phase == "Running" else {})}
            self.world.nodes[node_name] = node(node_name)
        self.world.coordinator = coord
        return self

    def job(self, attempt: int, deleting: bool = False, **status: Any) -> W:
        job = owned(build_job(RTJ.from_body(self.body), attempt), self.body, "job-uid")
        job["status"] = status
        if deleting:
            job["metadata"]["deletionTimestamp"] = ts(5)
        self.world.job = job
        return self

    def status(self, **fields: Any) -> W:
        self.body["status"].update(fields)
        return self

    def run(self, now: datetime.datetime = NOW):
        world = copy.deepcopy(self.world)
        # As World.assemble sorts them: the coordinator is status.attempt's, an earlier attempt's is old.
        attempt = int(world.rtj.get("status", {}).get("attempt") or 1)
        if world.coordinator is not None and coordinator_attempt(world.coordinator) != attempt:
            world.old_coordinators.append(world.coordinator)
            name = world.coordinator["spec"].get("nodeName")
            if name in world.nodes:
                world.old_nodes[name] = world.nodes.pop(name)
            world.coordinator = None
        # The pods and nodes a pass reads are the stores' own objects (World.assemble shares them): no pass of
        # any table here may change them.
        shared = copy.deepcopy((world.pods, world.nodes, world.capacity_probes, world.departed))
        intent = reconcile(world, now)
        assert (world.pods, world.nodes, world.capacity_probes, world.departed) == shared, "a pass changed them"
        return intent


def verbs(intent) -> list[tuple[str, str]]:
    return [(a.verb, a.kind) for a in intent.actions]


def reasons(intent) -> list[str]:
    return [e.reason for e in intent.events]


# --- children ------------------------------------------------------------------------------------
def test_a_new_rtj_creates_its_children_in_order_owned_by_it():
    intent = W(children=False).run()
    assert verbs(intent) == [(CREATE, "Service"), (CREATE, "NetworkPolicy"), (CREATE, "PersistentVolumeClaim"),
                             (CREATE, "Pod"), (CREATE, "Job")]
    service, policy, pvc, coordinator, job = (a.body for a in intent.actions)
    assert policy["spec"]["podSelector"] == {"matchLabels": {api.LABEL_NAME: "train"}}
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-train"
    assert coordinator["metadata"]["name"] == "train-a1-rdzv" and coordinator["spec"]["hostname"] == "train-a1-rdzv"
    assert service["metadata"]["ownerReferences"][0]["uid"] == job["metadata"]["ownerReferences"][0]["uid"] \
        == "uid-train"
    assert "ownerReferences" not in pvc["metadata"]  # retention Retain: the claim outlives the job
    # The gang runs without its NetworkPolicy where none can be made (it is no gate: a refusal is said).
    assert [a.kind for a in intent.actions if not a.gates] == ["NetworkPolicy"]
    assert intent.status.phase == "Pending" and intent.requeue.waiting


def test_the_gangs_network_policy_follows_spec_isolation_and_only_ours_is_touched():
    """Issue 30: only the job's own pods may reach its rendezvous and stores (a TCPStore has no
    authentication); allowFrom adds peers; off deletes it, by uid; another's of that name is left alone."""
    peer = {"namespaceSelector": {"matchLabels": {"team": "observability"}}}
    w = W(isolation={"allowFrom": [peer]})
    w.world.network_policy = W().world.network_policy  # made before allowFrom was added: it drifted
    (patch,) = w.run().actions
    assert (patch.verb, patch.kind) == (PATCH, "NetworkPolicy")
    assert patch.body["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": {api.LABEL_NAME: "train"}}},
                                                       peer]}]
    off = W(isolation={"enabled": False})
    off.world.network_policy = W().world.network_policy
    (delete,) = off.run().actions
    assert (delete.verb, delete.kind, delete.uid) == (DELETE, "NetworkPolicy", "netpol-uid")
    theirs = W(isolation={"enabled": False})
    theirs.world.network_policy = None  # World.assemble drops one owned by another
    assert theirs.run().actions == []


def test_a_converged_world_yields_nothing_to_do():
    w = W()
    first = w.run()
    assert first.actions == [] and first.status.phase == "Running"
    w.body["status"] = first.status.to_dict()
    again = w.run()
    assert again.actions == [] and again.events == [] and again.status == first.status
    assert again.requeue.seconds == 60 and not again.requeue.act


def test_an_object_we_do_not_own_holding_a_childs_name_stops_everything():
    w = W()
    w.world.service["metadata"]["ownerReferences"] = [{"uid": "someone-else"}]
    intent = w.run()
    assert intent.actions == [] and intent.status.phase == "Pending"
    assert reasons(intent) == ["ChildConflict"]


def test_an_invalid_spec_creates_nothing_and_says_why():
    intent = W(children=False, nodes={"count": 2, "spares": 1}, coordinator={"enabled": False}).run()
    assert intent.actions == [] and intent.status.phase == "Invalid" and reasons(intent) == ["InvalidSpec"]


def test_a_changed_template_makes_a_new_gang_only_if_the_server_takes_it():
    w = W(image="worker:2")  # the spec says worker:2; the running Job still runs worker:1
    w.world.job = owned(build_job(RTJ.from_body(rtj_body()), 1), w.body, "job-uid")
    w.world.template = (False, "denied by policy")
    rejected = w.run()
    assert rejected.actions == [] and rejected.status.attempt == 1 and "InvalidSpec" in reasons(rejected)
    w.world.template = (True, "")
    accepted = w.run()
    assert accepted.status.attempt == 2 and accepted.status.recovery.pending_gang_restart == "SpecChanged"
    assert accepted.requeue.act and accepted.status.job_restarts == 0 and accepted.actions == []


def test_the_old_gang_is_deleted_only_once_status_names_the_next_attempt():
    intent = W().status(attempt=2, recovery={"pendingGangRestart": "RendezvousFailed"}).run()
    old, delete = intent.actions
    assert (old.verb, old.kind, old.uid) == (DELETE, "Pod", "coord-uid-1")
    assert (delete.verb, delete.kind, delete.name, delete.propagation, delete.uid) == (
        DELETE, "Job", "train-a1", "Foreground", "job-uid")
    assert intent.status.phase == "Restarting"


def test_the_next_gang_is_created_once_the_old_job_is_gone_without_waiting_for_the_old_coordinator():
    w = W().status(attempt=2, recovery={"pendingGangRestart": "RendezvousFailed"})
    w.world.job, w.world.pods = None, []
    # The old gang's coordinator answers only its own name: the new Job does not wait for it to go (its pods
    # stay gated until their own coordinator is published). The new coordinator waits while the old one runs
    # on a node that answers: where pods share their node's network, they would share its ports.
    intent = w.run()
    assert [(a.verb, a.kind, a.name) for a in intent.actions] == [
        (DELETE, "Pod", "train-a1-rdzv"), (CREATE, "Job", "train-a2")]
    job = intent.actions[1].body
    assert job["metadata"]["annotations"][api.LABEL_ATTEMPT] == "2"
    settled = settle(intent, [Result(a) for a in intent.actions], w.world, NOW)
    assert settled.status.recovery.pending_gang_restart == ""
    assert [e.reason for e in settled.events if e.done] == ["Created"]
    w.world.nodes["cpu-0"] = node("cpu-0", "Unknown", since=60)  # the old one's node lost: not waited for
    assert [(a.verb, a.name) for a in w.run().actions if a.verb == CREATE] == [
        (CREATE, "train-a2-rdzv"), (CREATE, "train-a2")]
    w.world.nodes["cpu-0"] = node("cpu-0")
    w.world.coordinator["status"] = {"phase": "Succeeded"}  # or ended
    assert (CREATE, "train-a2-rdzv") in [(a.verb, a.name) for a in w.run().actions]


def old_gang(w: W, node_ready: str, phase: str = "Running") -> W:
    """A gang restart under way: status names attempt 2; attempt 1's Job is being deleted (Foreground) and
    its pod 1 is still terminating, on node n1 (Ready True, or lost: Unknown for 10 minutes)."""
    w.status(attempt=2, recovery={"pendingGangRestart": "RendezvousFailed"}, restartStartedTime=ts(60))
    w.job(1, deleting=True)
    w.world.pods = [pod(1, phase=phase, deleting=30)]
    w.world.nodes = {"n1": node("n1", node_ready, since=600), "cpu-0": node("cpu-0")}
    return w


@pytest.mark.parametrize("node_ready, phase, waits", [
    ("True", "Running", True),  # stopping (and saving) on a node that answers: the new gang loads after it
    ("True", "Failed", False),  # ended: nothing of it runs
    ("Unknown", "Running", False),  # on a lost node: it may never confirm its end, and is out of reach
])
def test_the_new_gang_waits_for_old_pods_on_nodes_that_answer_only(node_ready: str, phase: str, waits: bool):
    intent = old_gang(W(), node_ready, phase).run()
    made = [(a.verb, a.kind, a.name) for a in intent.actions if a.verb == CREATE]
    assert (CREATE, "Job", "train-a2") not in made if waits else (CREATE, "Job", "train-a2") in made
    assert intent.status.job_restarts == 0 and intent.status.restarts == 0
    fencing = next((c for c in intent.status.conditions if c["type"] == "WaitingForFencing"), {})
    if node_ready == "Unknown":
        assert fencing["status"] == "True" and fencing["reason"] == "OldGangNotFenced"
        message = fencing["message"]
        assert "pod train-1-x1 on node n1" in message and "attempt 2 runs under its own" in message


def test_an_old_gangs_pod_on_an_unfenced_node_is_left_beside_the_new_gang_and_forced_once_fenced():
    w = old_gang(W(), "Unknown")
    old_job, old_pod = w.world.job, w.world.pods[0]
    w.job(2)
    w.world.job["metadata"]["uid"] = "job-uid-2"
    w.world.pods = [pod(i, attempt=2) for i in range(2)]
    w.world.nodes.update({"n0": node("n0"), "n2": node("n2")})
    w.world.pods[1]["spec"]["nodeName"] = "n2"
    w.world.old_jobs, w.world.old_pods = [old_job], [old_pod]
    w.world.old_nodes = {"n1": w.world.nodes.pop("n1")}  # not the gang's: no loss of it, no brake
    w.coordinator(2)
    waiting = w.run()
    assert not [a for a in waiting.actions if a.name == old_pod["metadata"]["name"]]  # never confirmed: not forced
    assert waiting.status.phase == "Running" and waiting.status.job_restarts == 0
    fencing = next(c for c in waiting.status.conditions if c["type"] == "WaitingForFencing")
    assert (fencing["status"], fencing["reason"]) == ("True", "OldGangNotFenced")
    assert "n1" not in json.dumps(waiting.status.to_dict().get("recovery") or {})  # no loss of this gang's
    w.world.old_nodes["n1"]["spec"]["taints"].append({"key": "node.kubernetes.io/out-of-service",
                                                      "effect": "NoExecute"})
    fenced = w.run()
    (force,) = [a for a in fenced.actions if a.name == old_pod["metadata"]["name"]]
    assert (force.verb, force.uid) == (FAIL_POD, old_pod["metadata"]["uid"])
    assert fenced.status.job_restarts == 0 and fenced.status.restarts == 0 and fenced.status.disruptions == 0


def test_older_jobs_are_deleted_and_a_job_deleted_by_someone_else_is_made_again_once_gone():
    w = W()
    older = owned(build_job(RTJ.from_body(w.body), 1), w.body, "job-uid-0")
    older["metadata"]["annotations"][api.LABEL_ATTEMPT] = "0"
    w.world.old_jobs = [older]
    (delete,) = w.run().actions
    assert (delete.verb, delete.kind, delete.uid, delete.propagation) == (DELETE, "Job", "job-uid-0", "Foreground")
    w.world.old_jobs = []
    w.job(1, deleting=True)  # this attempt's Job, deleted by hand: its name is taken until it is gone
    assert not [a for a in w.run().actions if a.kind == "Job"]
    w.world.job, w.world.pods = None, []
    assert [(a.verb, a.name) for a in w.run().actions if a.kind == "Job"] == [(CREATE, "train-a1")]


def test_suspend_patches_the_running_job_and_a_budget_edit_changes_nothing_in_it():
    w = W(suspend=True, restartBudget={"maxRestarts": 5})
    w.world.job = owned(build_job(RTJ.from_body(rtj_body()), 1), w.body, "job-uid")
    coordinator, patch = w.run().actions
    assert (patch.verb, patch.body) == (PATCH, SUSPEND)  # the budget is the operator's
    assert patch.event[1] == "Suspended" and (coordinator.verb, coordinator.kind) == (DELETE, "Pod")


def test_a_job_an_earlier_operator_made_is_adopted_as_it_runs():
    """Its whole-spec hash differs from anything this operator computes: no new gang on an upgrade; the
    template hash is added and the old Job-wide backstop lifted."""
    w = W()
    legacy = w.world.job = owned(build_job(RTJ.from_body(w.body), 1, name="train"), w.body, "job-uid")
    legacy["metadata"]["annotations"] = {api.LABEL_ATTEMPT: "1", api.ANNOTATION_LEGACY_SPEC_HASH: "0123abcd"}
    legacy["spec"].pop("backoffLimitPerIndex")
    legacy["spec"]["backoffLimit"] = 4
    # Its coordinator, as that operator named it: this attempt's by its label, kept.
    w.world.coordinator = owned(build_coordinator(RTJ.from_body(w.body), 1, "train"), w.body, "coord-uid-1")
    w.world.coordinator["status"] = {"phase": "Running", "podIP": "10.0.0.9"}
    assert w.world.coordinator["metadata"]["name"] == "train-rdzv"
    (patch,) = w.run().actions
    assert patch.name == "train" and patch.body == {"metadata": {"annotations": {
        api.ANNOTATION_TEMPLATE_HASH: template_hash(build_job(RTJ.from_body(w.body), name="train"))}},
        "spec": {"backoffLimit": 2**31 - 1}}
    assert w.run().status.attempt == 1


# --- the ladder, pass by pass ----------------------------------------------------------------------
def test_a_failed_pod_is_charged_once_to_the_job():
    w = W()
    w.world.pods[1] = pod(1, "Failed", code=1)
    first = w.run()
    st = first.status
    assert (st.job_restarts, st.disruptions, st.restarts) == (1, 0, 1) and st.phase == "Restarting"
    assert st.recovery.seen_pods == ["pod-1-1"] and "ReplacePod" in reasons(first)
    w.body["status"] = st.to_dict()
    again = w.run()
    assert again.status.job_restarts == 1 and "ReplacePod" not in reasons(again)


def test_a_lost_node_is_charged_as_a_disruption_then_its_pod_evicted():
    w = W(restartBudget={"nodeLossGraceSeconds": 30})
    w.world.nodes["n1"] = node("n1", "Unknown", since=10)
    blip = w.run()
    assert blip.status.disruptions == 0 and blip.requeue.deadline == 20  # within the grace: look again then
    wait = condition(blip, "WaitingForFencing")  # said while it waits (issue 29.6)
    assert wait["reason"] == "NodeLost" and "nodeLossGraceSeconds (30s)" in wait["message"], wait
    w.world.nodes["n1"] = node("n1", "Unknown", since=31)
    charged = w.run()
    assert charged.status.disruptions == 1 and charged.actions == [] and charged.requeue.act
    w.body["status"] = charged.status.to_dict()
    acted = w.run()
    assert [(a.verb, a.name, a.uid) for a in acted.actions] == [(EVICT, "train-1-x1", "pod-1-1")]
    assert acted.status.disruptions == 1


@pytest.mark.parametrize("taint, force", [(True, True), (False, False)])
def test_a_fenced_nodes_pod_is_failed_at_once_an_unfenced_ones_waits_out_the_grace(taint, force):
    """Issue 29.6: a pod on a node tainted out-of-service (NotReady: fenced, as PodGC reads it) waited the
    grace period like a blip; nothing runs there, so it is failed and deleted at once. Unfenced, it waits."""
    w = W(restartBudget={"nodeLossGraceSeconds": 300})
    lost = node("n1", "Unknown", since=10)
    if taint:
        lost["spec"]["taints"] = [{"key": "node.kubernetes.io/out-of-service", "effect": "NoExecute"}]
    w.world.nodes["n1"] = lost
    charged = w.run()
    assert charged.status.disruptions == int(force)
    w.body["status"] = charged.status.to_dict()
    acted = w.run()
    assert [(a.verb, a.name) for a in acted.actions] == ([(FAIL_POD, "train-1-x1")] if force else [])
    if not force:
        assert condition(acted, "WaitingForFencing")["reason"] == "NodeLost"


def test_nodes_lost_in_one_event_are_one_disruption_and_a_later_loss_another():
    """Issue 29.5: three of eight nodes (a rack) lost together, then a fourth within the window: one
    disruption, every lost node's pod replaced; a loss after the window is another disruption."""
    w = W(pods=8, nodes={"count": 8}, restartBudget={"nodeLossGraceSeconds": 30})
    for n in ("n1", "n2", "n3"):
        w.world.nodes[n] = node(n, "Unknown", since=40)
    rack = w.run()
    st = rack.status
    assert (st.disruptions, st.restarts_by_tier.get("ReplacePod"), st.job_restarts) == (1, 3, 0), st
    assert sum("same event as node n1" in e.message for e in rack.events) == 2
    w.body["status"] = st.to_dict()
    w.world.nodes["n4"] = node("n4", "Unknown", since=40)
    later = w.run(NOW + datetime.timedelta(seconds=60))  # within 120 s of the first charge
    assert later.status.disruptions == 1 and later.status.restarts_by_tier["ReplacePod"] == 4
    for n in ("n1", "n2", "n3", "n4"):  # replaced by now (five of eight dark at once would be the mass-loss brake)
        w.world.nodes[n] = node(n)
    w.world.nodes["n5"] = node("n5", "Unknown", since=40)
    w.body["status"] = later.status.to_dict()
    after = w.run(NOW + datetime.timedelta(seconds=300))  # past it: another event
    assert after.status.disruptions == 2 and after.status.restarts_by_tier["ReplacePod"] == 5


def test_twelve_of_sixty_four_nodes_lost_at_once_are_one_disruption():
    """Issue 29's target: a rack or switch event taking 12 of a 64-node gang's nodes (under the mass-loss
    brake) is one disruption of the default 10, and every lost node's pod is replaced."""
    w = W(pods=64, nodes={"count": 64}, restartBudget={"nodeLossGraceSeconds": 30})
    lost = [f"n{i}" for i in range(3, 64, 5)][:12]
    for n in lost:
        w.world.nodes[n] = node(n, "Unknown", since=40)
    st = w.run().status
    assert (st.disruptions, st.restarts_by_tier.get("ReplacePod"), st.job_restarts) == (1, 12, 0), st
    assert st.phase != "Failed" and len(lost) == 12


def test_a_pod_stuck_on_a_lost_node_waits_for_fencing_then_is_failed_and_deleted_guarded_by_its_uid():
    w = W(restartBudget={"nodeLossGraceSeconds": 1, "terminatingTimeoutSeconds": 60})
    w.world.nodes["n1"] = node("n1", "Unknown", since=300)
    w.world.pods[1] = pod(1, deleting=181)  # asked 181 s ago: 61 s past its 120 s grace period
    w.status(recovery={"seenPods": ["pod-1-1"]}, disruptions=1)
    unfenced = w.run()
    assert unfenced.actions == [] and "NodeNotFenced" in reasons(unfenced)
    cond = next(c for c in unfenced.status.conditions if c["type"] == "WaitingForFencing")
    assert cond["status"] == "True" and "node n1" in cond["message"] and "train-1-x1" in cond["message"]
    w.world.nodes["n1"]["spec"]["taints"].append({"key": ladder.OUT_OF_SERVICE, "effect": "NoExecute"})
    w.body["status"] = unfenced.status.to_dict()
    (force,) = (fenced := w.run()).actions
    assert (force.verb, force.uid) == (FAIL_POD, "pod-1-1")
    assert force.body["metadata"]["uid"] == "pod-1-1" and force.body["status"]["phase"] == "Failed"
    assert "NodeNotFenced" not in reasons(fenced)  # one event when the wait began


def test_a_pod_stuck_terminating_on_a_healthy_node_is_reported_once():
    w = W(restartBudget={"terminatingTimeoutSeconds": 60})
    w.world.pods[1] = pod(1, deleting=200)
    first = w.run()
    assert first.actions == [] and reasons(first).count("PodStuckTerminating") == 1
    w.body["status"] = first.status.to_dict()
    assert "PodStuckTerminating" not in reasons(w.run())


def test_a_failed_rendezvous_restarts_the_gang_once():
    w = W()
    w.world.pods = [pod(0, "Failed", code=exit_codes.RENDEZVOUS_FAILED),
                    pod(1, "Failed", code=exit_codes.RENDEZVOUS_FAILED)]
    intent = w.run()
    st = intent.status
    assert (st.job_restarts, st.restarts_by_tier["GangRestart"], st.attempt) == (1, 1, 2)
    assert st.recovery.pending_gang_restart == "RendezvousFailed" and intent.requeue.act


def crash_looped(p: dict, error: str = "ModuleNotFoundError: No module named 'flash_attn'") -> dict:
    """A pod whose worker stopped its ranks' crash loop (rtj_worker.crashloop), as its exit report says."""
    p["status"]["phase"] = "Failed"
    report = {"exitCode": 66, "checkpointStep": 0,
              "reason": f"its ranks failed the same way 2 times in a row with no step or checkpoint progress: {error}",
              "lines": ["Traceback (most recent call last):", '  File "/work/train.py", line 3, in <module>', error]}
    p["status"]["containerStatuses"] = [{"state": {"terminated": {
        "exitCode": exit_codes.CRASH_LOOP, "message": json.dumps(report), "finishedAt": ts(1)}}}]
    return p


def test_a_crash_loop_is_replaced_once_and_the_second_pod_to_loop_so_fails_the_job_with_its_traceback():
    """Issue 28.2: a typo'd import ran as Running while each pod spent ft_launcher's 20 restarts, then
    the operator's 3, and the error was only in pod logs."""
    w = W()
    w.world.pods[0] = crash_looped(w.world.pods[0])
    st = w.run().status
    assert (st.phase, st.job_restarts, st.last_failure_reason) == ("Restarting", 1, "CrashLoop")
    assert "its last lines: Traceback (most recent call last):" in st.last_failure_message
    w.body["status"] = st.to_dict()
    w.world.pods[1] = crash_looped(w.world.pods[1])
    intent = w.run()
    failed = next(c for c in intent.status.conditions if c["type"] == "Failed")
    assert (intent.status.phase, failed["reason"]) == ("Failed", "CrashLoop")
    assert "No module named 'flash_attn'" in failed["message"] and "second pod to fail so" in failed["message"]
    # Another failure of the second pod is not the same loop: a restart like any other.
    other = W()
    other.world.pods[0] = crash_looped(other.world.pods[0])
    other.body["status"] = other.run().status.to_dict()
    other.world.pods[1] = crash_looped(other.world.pods[1], "ValueError: bad batch size")
    assert other.run().status.phase != "Failed"


@pytest.mark.parametrize("codes, pending, not_charged", [
    # Issue 27.3: the barrier closed the rendezvous after an unhealthy node; the survivors used to exit 70
    # each, all charged to the job in one pass.
    ((exit_codes.NODE_UNHEALTHY, exit_codes.RENDEZVOUS_CLOSED, exit_codes.RENDEZVOUS_CLOSED), "RendezvousClosed", 1),
    # The cluster's DNS published the coordinator's name too late (CI: an EndpointSlice controller backing
    # off on a busy machine): not the training code's, and no launcher ever started.
    ((exit_codes.RENDEZVOUS_HOST_UNRESOLVED, exit_codes.RENDEZVOUS_HOST_UNRESOLVED), "RendezvousHostUnresolved", 1),
])
def test_a_rendezvous_the_platform_ended_is_one_disruption_and_one_new_gang(codes, pending, not_charged):
    w = W(pods=len(codes))
    w.world.pods = [pod(i, "Failed", code=code) for i, code in enumerate(codes)]
    intent = w.run()
    st = intent.status
    assert (st.disruptions, st.job_restarts, st.restarts_without_progress, st.attempt) == (1, 0, 0, 2), \
        reasons(intent)
    assert st.recovery.pending_gang_restart == pending and reasons(intent).count("NotCharged") == not_charged


def test_node_0_lost_and_its_peers_rendezvous_exit_are_one_disruption():
    w = W()
    w.world.nodes["n0"] = node("n0", "Unknown", since=5)
    w.world.pods[1] = pod(1, "Failed", code=exit_codes.RENDEZVOUS_HOST_LOST)
    st = w.run().status
    assert (st.disruptions, st.job_restarts) == (1, 0) and st.recovery.charged.nodes == ("n0",)


@pytest.mark.parametrize("code, reason", [(exit_codes.CONFIG_ERROR, "ConfigError"),
                                          (exit_codes.PERMANENT_FAILURE, "PermanentFailure"),
                                          (exit_codes.LAUNCHER_DECLINED, "LauncherDeclined")])  # NVRx 0.7's 93
def test_a_permanent_failure_fails_the_job_then_its_gang_is_suspended(code, reason):
    w = W()
    w.world.pods[0] = pod(0, "Failed", code=code)
    failed = w.run()
    assert failed.status.phase == "Failed" and failed.status.last_failure_reason == reason
    assert failed.status.job_restarts == 0
    w.body["status"] = failed.status.to_dict()
    suspend, coordinator = w.run().actions
    assert (suspend.verb, suspend.body) == (PATCH, {"spec": {"suspend": True}})  # terminal: never resumed
    assert (coordinator.verb, coordinator.kind) == (DELETE, "Pod")


def test_the_budget_ends_a_job_that_keeps_failing():
    w = W(restartBudget={"maxRestarts": 1, "maxRestartsWithoutProgress": 10})
    w.status(jobRestarts=1, restarts=1, restartsByTier={"ReplacePod": 1, "GangRestart": 0})
    w.world.pods[0] = pod(0, "Failed", code=1)
    st = w.run().status
    assert st.phase == "Failed" and st.last_failure_reason == "RestartBudgetExhausted"


def _charge_job_failures(w: W, times: list[datetime.datetime]) -> Any:
    """A pod of the job fails (exit 1) at each time, one pass each; the last pass's intent."""
    intent = None
    for i, now in enumerate(times):
        w.world.pods[0] = pod(0, "Failed", code=1)
        w.world.pods[0]["metadata"]["uid"] = f"failed-{i}"  # a new pod each time
        intent = w.run(now)
        w.body["status"] = intent.status.to_dict()
        if intent.status.phase == "Failed":
            break
    return intent


@pytest.mark.parametrize("window, spacing, failed", [
    (0, 3600, True),  # the job's life: the second failure spends maxRestarts=1 however far apart
    (1800, 3600, False),  # each failure outside the window of the one before: never spent
    (7200, 3600, True),  # both within the window
])
def test_a_budget_window_forgets_old_charges(window, spacing, failed):
    w = W(restartBudget={"maxRestarts": 1, "maxRestartsWithoutProgress": 10, "windowSeconds": window})
    intent = _charge_job_failures(w, [NOW, NOW + datetime.timedelta(seconds=spacing),
                                      NOW + datetime.timedelta(seconds=2 * spacing)])
    st = intent.status
    assert (st.phase == "Failed") == failed, reasons(intent)
    if failed:
        assert st.last_failure_reason == "RestartBudgetExhausted"
        assert ("within" in (st.conditions and next(c["message"] for c in st.conditions
                                                    if c["type"] == "Failed"))) == bool(window)
    else:
        assert st.job_restarts == 3  # every charge is still counted in status
        # Only the charges that still count are kept, with their times.
        assert st.recovery.charge_times == {"jobRestarts": [timestamp(NOW + datetime.timedelta(seconds=7200))]}


def test_the_jobs_own_failure_is_a_new_gang_charged_to_the_job():
    w = W().job(1, conditions=[{"type": "FailureTarget", "status": "True", "reason": "BackoffLimitExceeded"}])
    intent = w.run()
    assert intent.status.job_restarts == 1 and intent.status.attempt == 2


# --- settle: what the actions did -------------------------------------------------------------------
def test_a_child_the_server_rejects_is_invalid_spec_and_the_rest_waits():
    w = W(children=False)
    intent = w.run()
    service, *rest = intent.actions
    results = [Result(service, ok=False, rejected="admission webhook denied"),
               *(Result(a, ok=False, skipped=True) for a in rest)]
    settled = settle(intent, results, w.world, NOW)
    assert settled.status.phase == "Invalid" and "InvalidSpec" in [e.reason for e in settled.events]
    assert not [e for e in settled.events if e.done] and settled.requeue.seconds == 60


def test_a_name_held_by_an_object_we_do_not_own_is_a_conflict():
    w = W(children=False)
    intent = w.run()
    service = intent.actions[0]
    settled = settle(intent, [Result(service, ok=False, conflict="Service default/train already exists and is not "
                                                               "owned by this ResilientTrainingJob")], w.world, NOW)
    assert settled.status.phase == "Pending" and "ChildConflict" in [e.reason for e in settled.events]
    created = next(c for c in settled.status.conditions if c["type"] == "Created")
    assert created["reason"] == "ChildConflict" and "not owned" in created["message"]


def test_a_refused_eviction_is_reported():
    w = W(restartBudget={"nodeLossGraceSeconds": 1})
    w.world.nodes["n1"] = node("n1", "Unknown", since=300)
    w.status(recovery={"seenPods": ["pod-1-1"]}, disruptions=1)
    intent = w.run()
    settled = settle(intent, [Result(intent.actions[0], ok=False, refused="refused")], w.world, NOW)
    assert "EvictionRefused" in [e.reason for e in settled.events]
    w.body["status"] = settled.status.to_dict()
    again = w.run()
    assert again.actions == intent.actions  # retried, ...
    assert "EvictionRefused" not in [e.reason for e in settle(again, [Result(again.actions[0], ok=False,
                                                                             refused="refused")], w.world, NOW).events]


def test_reconcile_does_not_touch_its_world():
    w = W()
    w.world.pods[1] = pod(1, "Failed", code=1)
    before = copy.deepcopy(w.world)
    tables = {name: getattr(ladder, name) for name in ("FINDINGS", "CONSEQUENCES", "REASON_CONSEQUENCES",
                                                       "CHARGE_ORDER", "EXIT_CODES", "WAITING_GRACE", "JOB_VERDICTS")}
    tables_before = copy.deepcopy(tables)
    intent = reconcile(w.world, NOW)
    assert intent.status.phase == "Restarting"  # the failure was classified: the tables were read
    assert w.world == before
    # The tables are module data, not state: a pass leaves them as it found them.
    assert {name: getattr(ladder, name) for name in tables} == tables_before


# --- capacity ------------------------------------------------------------------------------------------
def unschedulable(index: int) -> dict[str, Any]:
    p = pod(index, "Pending", attempt=2)
    p["spec"].pop("nodeName")
    p["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                  "message": "0/2 nodes are available: 1 node(s) didn't match pod anti-affinity "
                                             "rules, 1 node(s) had untolerated taint "
                                             "{node.kubernetes.io/unreachable: }"}]
    return p


def waiting_since(w: W, seconds: float, reason: str = "Unschedulable") -> W:
    w.body["status"]["conditions"] = [{"type": "WaitingForCapacity", "status": "True", "reason": reason,
                                       "message": "", "lastTransitionTime": ts(seconds), "observedGeneration": 1}]
    return w


def condition(intent, type_: str) -> dict[str, Any]:
    return next(c for c in intent.status.conditions if c["type"] == type_)


def test_a_pod_that_finds_no_node_is_waiting_for_capacity_with_the_schedulers_message():
    w = W(restartBudget={"capacitySuspendSeconds": 300})
    w.world.pods[1] = unschedulable(1)
    intent = w.run()
    cond = condition(intent, "WaitingForCapacity")
    assert cond["status"] == "True" and "0/2 nodes are available" in cond["message"]
    assert "Unschedulable" in reasons(intent) and intent.requeue.seconds <= 300 and intent.actions == []


def probes(w: W, placed: dict[int, str] | None = None, priority_class: str = "") -> list[dict[str, Any]]:
    """The gang's capacity probes as the operator builds them now, owned by the RTJ; `placed`: index ->
    the node the scheduler bound it to (the others pending, with the scheduler's message)."""
    d = Draft(w.world, NOW, Config(capacity_probe_priority_class=priority_class))
    out = []
    for i, p in enumerate(gang_probes(d)):
        p = owned(p, w.body, f"probe-uid-{i}")
        if placed and i in placed:
            p["spec"]["nodeName"], p["status"] = placed[i], {"phase": "Running"}
        else:
            p["status"] = {"phase": "Pending", "conditions": [{
                "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."}]}
        out.append(p)
    return out


def suspended_for_capacity(w: W) -> W:
    w = waiting_since(w, 400, "SuspendedForCapacity")
    w.world.job["spec"]["suspend"] = True
    w.world.pods, w.world.coordinator = [], None
    w.status(recovery={"suspendedForCapacity": ts(100), "suspendedJob": True})
    return w


def test_after_capacity_suspend_seconds_the_gang_is_suspended_to_release_its_nodes():
    w = waiting_since(W(restartBudget={"capacitySuspendSeconds": 300}), 301)
    w.world.pods[1] = unschedulable(1)
    decided = w.run()
    assert decided.status.recovery.suspended_for_capacity
    assert decided.requeue.act and decided.actions == [] and "SuspendingForCapacity" in reasons(decided)
    assert condition(decided, "WaitingForCapacity")["reason"] == "SuspendedForCapacity"  # with the decision
    w.body["status"] = decided.status.to_dict()
    coordinator, *made, patch = w.run().actions
    assert patch.body == SUSPEND and "WaitingForCapacity" in patch.event[2]
    assert (coordinator.verb, coordinator.kind) == (DELETE, "Pod")  # the gang's rendezvous goes with it
    # One capacity probe per node, made before the Job is suspended: pending, they ask for room.
    assert [(a.verb, a.name) for a in made] == [(CREATE, "train-capacity-0"), (CREATE, "train-capacity-1")]
    assert all(a.event is None for a in made)  # no event per probe: SuspendingForCapacity says it


def test_a_capacity_probe_is_shaped_like_a_pod_of_the_gang_and_holds_nothing_it_need_not():
    w = W(placement={"nodeSelector": {"pool": "p5"}, "affinity": {"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "zone", "operator": "In", "values": ["a"]}]}]}}}})
    w.status(excludedNodes=[{"node": "bad-1", "reason": "x", "until": (NOW + datetime.timedelta(hours=1)).isoformat()}])
    probe = probes(w, priority_class="rtj-capacity-probe")[0]
    gang = w.world.job["spec"]["template"]["spec"]
    spec, (container,) = probe["spec"], probe["spec"]["containers"]
    assert spec["nodeSelector"] == gang["nodeSelector"] and spec["tolerations"] == gang["tolerations"]
    assert container["resources"] == gang["containers"][0]["resources"]  # GPUs, EFA, CPU, memory
    assert container["image"] == gang["containers"][0]["image"]  # a new node pulls it before the gang resumes
    assert [v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"]] == ["train-ckpt"]  # its zone
    assert all(m["readOnly"] for m in container["volumeMounts"])
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"][0]["key"] == "zone"  # the user's term, with the exclusion added
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "NotIn", "values": ["bad-1"]}]
    (anti,) = spec["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "capacity-probe"  # one per node
    assert spec["priorityClassName"] == "rtj-capacity-probe" and spec["terminationGracePeriodSeconds"] == 0
    assert "schedulingGates" not in spec and probe["metadata"]["labels"]["app.kubernetes.io/component"] != "workers"


@pytest.mark.parametrize("placed, resumes", [
    ({}, False),
    ({0: "n0"}, False),  # the released node only: still one short
    ({0: "n0", 1: "n0"}, False),  # two on one node is not room for two pods
    ({0: "n0", 1: "new"}, True),  # an autoscaler's node, or GPUs another job freed on a node of the fleet
])
def test_a_gang_suspended_for_capacity_resumes_once_every_capacity_probe_is_placed(placed, resumes):
    w = suspended_for_capacity(W())
    w.world.capacity_probes = probes(w, placed)
    decided = w.run()
    assert bool(decided.status.recovery.suspended_for_capacity) is not resumes
    assert decided.status.job_restarts == 0 and decided.status.disruptions == 0
    if not resumes:
        assert decided.actions == []
        message = condition(decided, "WaitingForCapacity")["message"]
        assert f"placed {len(set(placed.values()))} of 2 capacity probes" in message
        assert ("Insufficient nvidia.com/gpu" in message) is (len(placed) < 2)  # what it says of a pending one
        return
    assert decided.requeue.act and "ResumingForCapacity" in reasons(decided)
    w.body["status"] = decided.status.to_dict()
    *deleted, patch = w.run().actions
    assert [(a.verb, a.name) for a in deleted] == [(DELETE, "train-capacity-0"), (DELETE, "train-capacity-1")]
    assert patch.body == RESUME  # after the probes free their nodes


def test_a_probe_that_ended_or_was_built_from_another_spec_is_made_again():
    w = suspended_for_capacity(W())
    w.world.capacity_probes = probes(w, {0: "n0", 1: "n1"})
    w.world.capacity_probes[0]["status"] = {"phase": "Failed", "reason": "Evicted"}
    w.world.capacity_probes[1]["metadata"]["annotations"]["training.rtj.dev/probe-hash"] = "old"
    intent = w.run()
    assert not any(r == "ResumingForCapacity" for r in reasons(intent))  # neither counts as placed
    assert [(a.verb, a.name) for a in intent.actions] == [(DELETE, "train-capacity-0"), (DELETE, "train-capacity-1")]
    w.world.capacity_probes = []
    assert [(a.verb, a.name) for a in w.run().actions] == [(CREATE, "train-capacity-0"), (CREATE, "train-capacity-1")]


def test_a_capacity_probe_the_server_refuses_is_said_where_the_wait_is_and_fails_no_pass():
    """A full ResourceQuota (403) or a missing PriorityClass must not fail the pass (no status written, the
    job frozen): the wait's condition quotes the refusal, and the next pass tries again."""
    from rtj_operator.actions import execute
    w = suspended_for_capacity(W())
    intent = w.run()
    creates = [a for a in intent.actions if a.verb == CREATE]
    assert creates and all(a.best_effort for a in creates)

    class Full:
        def create(self, obj, dry_run=False):
            raise KubeError(403, 'pods "train-capacity-0" is forbidden: exceeded quota: gpus, requested: '
                                 'requests.nvidia.com/gpu=8, used: requests.nvidia.com/gpu=8, limited: '
                                 'requests.nvidia.com/gpu=8')

    results = execute(Full(), creates)
    assert [r.failed != "" for r in results] == [True, True]
    settled = settle(intent, results, w.world, NOW)
    message = condition(settled, "WaitingForCapacity")["message"]
    assert "train-capacity-0 could not be made" in message and "exceeded quota" in message
    assert condition(settled, "InvalidSpec")["status"] == "False"  # not the spec's fault


def workload(active: bool = True, admitted: bool = True) -> dict[str, Any]:
    conds = [{"type": "Admitted", "status": "True", "reason": "Admitted", "message": ""}] if admitted else []
    return {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
            "metadata": {"name": "job-train-a1-1", "namespace": "default", "uid": "wl-uid"},
            "spec": {"active": active}, "status": {"conditions": conds}}


def test_a_queued_gang_short_of_capacity_releases_its_quota_through_kueue_and_is_queued_again_once_placed():
    """Issue 29.2: Kueue owns Job.spec.suspend, so suspending for capacity released nothing (the Job stayed
    admitted, its quota held for up to capacityTimeoutSeconds). Now its Workload is deactivated (Kueue
    evicts it, suspends the Job, releases the quota), its capacity probes ask for room, and once all are
    placed it is re-activated: Kueue queues it again. Recorded in status first; never charged."""
    w = waiting_since(W(queueName="team-a", restartBudget={"capacitySuspendSeconds": 300}), 301)
    w.world.pods[1] = unschedulable(1)
    w.status(queue={"name": "team-a", "admitted": True, "activeRequested": True})
    decided = w.run()
    assert decided.status.recovery.suspended_for_capacity and decided.requeue.act
    (event,) = [e for e in decided.events if e.reason == "SuspendingForCapacity"]
    assert "deactivating its Kueue Workload to release its quota" in event.message
    w.body["status"] = decided.status.to_dict()
    w.world.workload = workload()
    acting = w.run()
    (deactivate,) = [a for a in acting.actions if a.kind == "Workload"]
    assert deactivate.body == {"spec": {"active": False}} and "finds no node" in deactivate.event[2]
    assert not [a for a in acting.actions if a.kind == "Job"]  # Kueue's to suspend
    assert [a.name for a in acting.actions if a.verb == CREATE] == ["train-capacity-0", "train-capacity-1"]
    assert (acting.status.job_restarts, acting.status.disruptions) == (0, 0)
    # Kueue evicted it: the Job is suspended, its pods gone; the probes are all placed.
    w.body["status"] = acting.status.to_dict()
    w.world.job["spec"]["suspend"], w.world.pods, w.world.coordinator = True, [], None
    w.world.workload = workload(active=False, admitted=False)
    queued = condition(w.run(), "Queued")
    assert (queued["status"], queued["reason"]) == ("True", "SuspendedForCapacity"), queued
    w.world.capacity_probes = probes(w, {0: "n0", 1: "new"})
    resumed = w.run()
    assert not resumed.status.recovery.suspended_for_capacity and "ResumingForCapacity" in reasons(resumed)
    w.body["status"] = resumed.status.to_dict()
    (activate,) = [a for a in w.run().actions if a.kind == "Workload"]
    assert activate.body == {"spec": {"active": True}} and "queued again" in activate.event[2]


def test_a_workload_someone_else_deactivated_is_not_activated_when_the_capacity_wait_ends():
    """Kueue's requeue limit or an admin (`kueuectl stop`) deactivated the Workload before the operator's
    capacity suspension would have: once the probes are placed, it stays deactivated (Queued, Deactivated)."""
    w = waiting_since(W(queueName="team-a", restartBudget={"capacitySuspendSeconds": 300}), 301)
    w.world.pods[1] = unschedulable(1)
    w.status(queue={"name": "team-a", "admitted": True, "activeRequested": True})
    w.body["status"] = w.run().status.to_dict()
    w.world.workload = workload(active=False, admitted=False)
    acting = w.run()
    assert not [a for a in acting.actions if a.kind == "Workload"]
    assert acting.status.queue["deactivatedForCapacity"] is False
    w.body["status"] = acting.status.to_dict()
    w.world.job["spec"]["suspend"], w.world.pods, w.world.coordinator = True, [], None
    w.world.capacity_probes = probes(w, {0: "n0", 1: "new"})
    w.body["status"] = w.run().status.to_dict()  # resumed: suspendedForCapacity cleared
    after = w.run()
    assert not [a for a in after.actions if a.kind == "Workload"]
    assert condition(after, "Queued")["reason"] == "Deactivated"


def test_waiting_for_capacity_past_the_timeout_fails_with_the_platforms_reason():
    w = waiting_since(W(restartBudget={"capacityTimeoutSeconds": 3600, "capacitySuspendSeconds": 300}), 3601)
    w.world.pods[1] = unschedulable(1)
    st = w.run().status
    assert st.phase == "Failed" and st.last_failure_reason == "InsufficientCapacity" and st.job_restarts == 0


def test_the_capacity_timeout_counts_across_a_resume_whose_room_was_taken_before_the_pods_were_placed():
    """Resumed once all its probes were placed, a gang whose room another workload took first lacks a node
    again: its WaitingForCapacity condition went False in between (no pod of it was pending yet), but the
    timeout counts from its first lack of a node (recovery.capacityWaitSince), so flickering room cannot
    keep it waiting past capacityTimeoutSeconds; capacitySuspendSeconds counts afresh (it gets its chance)."""
    budget = {"capacityTimeoutSeconds": 3600, "capacitySuspendSeconds": 300}
    w = waiting_since(W(restartBudget=budget), 301)
    w.world.pods[1] = unschedulable(1)
    first = w.run()
    assert first.status.recovery.capacity_wait_since == ts(301)  # when the condition's clock began
    w.body["status"] = first.status.to_dict()
    w.world.job["spec"]["suspend"], w.world.pods, w.world.coordinator = True, [], None
    later = NOW + datetime.timedelta(seconds=3000)
    w.world.capacity_probes = probes(w, {0: "n0", 1: "new"})
    resumed = w.run(later)
    assert not resumed.status.recovery.suspended_for_capacity and "ResumingForCapacity" in reasons(resumed)
    w.body["status"] = resumed.status.to_dict()
    w.world.capacity_probes = []
    gap = w.run(later + datetime.timedelta(seconds=5))  # this pass lifts the suspend: no pod pending yet
    assert [a.body for a in gap.actions if a.kind == "Job"] == [RESUME]
    assert condition(gap, "WaitingForCapacity")["status"] == "False"
    assert gap.status.recovery.capacity_wait_since == ts(301) and gap.status.phase != "Failed"
    w.body["status"] = gap.status.to_dict()
    w.world.job["spec"]["suspend"] = False
    w.world.pods = [pod(0, attempt=2), unschedulable(1)]  # the room went to someone else
    again = w.run(later + datetime.timedelta(seconds=10))
    cond = condition(again, "WaitingForCapacity")
    assert (cond["status"], cond["reason"]) == ("True", "Unschedulable")
    assert not again.status.recovery.suspended_for_capacity  # capacitySuspendSeconds counts from now
    assert again.status.phase != "Failed"  # 3311 s in all
    w.body["status"] = again.status.to_dict()
    timed_out = w.run(later + datetime.timedelta(seconds=300)).status  # 3601 s since the first lack of a node
    assert timed_out.phase == "Failed" and timed_out.last_failure_reason == "InsufficientCapacity"
    assert "for 3601s" in (timed_out.last_failure_message or ""), timed_out.last_failure_message


def test_a_gang_with_a_node_for_every_index_forgets_its_capacity_wait():
    w = waiting_since(W(restartBudget={"capacitySuspendSeconds": 300}), 100)
    w.world.pods[1] = unschedulable(1)
    waiting = w.run()
    assert waiting.status.recovery.capacity_wait_since
    w.body["status"] = waiting.status.to_dict()
    w.world.pods[1] = pod(1)
    for i, p in enumerate(w.world.pods):
        p["metadata"]["annotations"] = {ladder.INDEX: str(i)}
    placed = w.run()
    assert condition(placed, "WaitingForCapacity")["status"] == "False"
    assert not placed.status.recovery.capacity_wait_since


def test_a_standbys_long_wait_for_a_node_is_not_the_gangs_wait():
    """StandbyUnschedulable keeps WaitingForCapacity True while the job trains; when the gang itself
    then lacks a node, its wait (capacitySuspendSeconds, capacityTimeoutSeconds) starts then, not a
    day ago (review: the old transition time suspended or failed the gang at its first wait)."""
    w = waiting_since(W(restartBudget={"capacityTimeoutSeconds": 3600, "capacitySuspendSeconds": 300}), 90000,
                      reason="StandbyUnschedulable")
    w.world.pods[1] = unschedulable(1)
    st = w.run().status
    cond = condition_of(st, "WaitingForCapacity")
    assert (cond["status"], cond["reason"]) == ("True", "Unschedulable"), cond
    assert cond["lastTransitionTime"] == NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert st.phase != "Failed" and not st.recovery.suspended_for_capacity


def condition_of(status, type_: str) -> dict[str, Any]:
    return next(c for c in status.conditions if c["type"] == type_)


def test_a_job_another_controller_manages_is_mirrored_not_waited_on():
    w = W()
    w.world.job["spec"]["managedBy"] = "example.com/another-controller"
    w.world.job["status"] = {"ready": 2, "active": 2}
    w.world.pods = []
    intent = w.run()
    assert intent.status.phase == "Running" and intent.actions == [] and "ManagedElsewhere" in reasons(intent)
    assert condition(intent, "Running")["reason"] == "ManagedElsewhere"
    w.world.job["status"]["conditions"] = [{"type": "Complete", "status": "True"}]
    assert w.run().status.phase == "Succeeded"


def test_a_job_multikueue_dispatches_is_refused_and_its_workload_deactivated():
    """Issue 29.11: MultiKueue copies the Job to a worker cluster without the Service, coordinator and claim:
    that gang could never rendezvous there. Refused at once, with why, and withdrawn."""
    w = W(queueName="team-a")
    w.world.job["spec"].update(managedBy="kueue.x-k8s.io/multikueue", suspend=True)
    w.world.pods = []
    failed = w.run()
    assert failed.status.phase == "Failed" and failed.status.last_failure_reason == "MultiKueueUnsupported"
    assert "worker cluster" in failed.status.last_failure_message and failed.status.job_restarts == 0
    w.body["status"] = failed.status.to_dict()
    w.world.workload = {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
                        "metadata": {"name": "job-train-1", "namespace": "default", "uid": "wl-uid"},
                        "spec": {"active": True}}
    actions = w.run().actions
    assert any(a.kind == "Workload" and a.body == {"spec": {"active": False}} for a in actions), actions


def test_a_failed_rendezvous_right_after_a_platform_fault_recovered_is_its_consequence():
    """The gang's pods run again before its ranks do: a replacement whose launcher then fails to join
    the rendezvous (exit 71) within rendezvousTimeoutSeconds follows from the fault, not a new one. Its
    launcher closed the rendezvous for good, so a new gang starts either way: charged only in the end."""
    w = W(resiliency={"rendezvousTimeoutSeconds": 60})
    w.status(restartStartedTime=ts(20), disruptions=1, restarts=1, restartsByTier={"ReplacePod": 1, "GangRestart": 0},
             recovery={"charged": {"attempt": 1, "nodes": ["n9"], "faults": 1, "platform": True}})
    recovered = w.run()
    assert "Recovered" in reasons(recovered) and recovered.status.recovery.fault_settles_at
    w.body["status"] = recovered.status.to_dict()
    w.world.pods[1] = pod(1, "Failed", code=exit_codes.RENDEZVOUS_FAILED)
    st = w.run(NOW + datetime.timedelta(seconds=30)).status
    assert (st.job_restarts, st.attempt, st.recovery.pending_gang_restart) == (0, 2, "RendezvousFailed")
    late = w.run(NOW + datetime.timedelta(seconds=90)).status  # past the settling: a new fault of the job
    assert (late.job_restarts, late.attempt) == (1, 2)


# --- the coordinator ----------------------------------------------------------------------------------
def test_losing_the_coordinator_is_one_disruption_and_a_new_gang_whatever_its_peers_say():
    w = W(restartBudget={"nodeLossGraceSeconds": 30})
    w.world.nodes["cpu-0"] = node("cpu-0", "Unknown", since=60)
    w.world.pods = [pod(0, "Failed", code=exit_codes.RENDEZVOUS_HOST_LOST),
                    pod(1, "Failed", code=exit_codes.RENDEZVOUS_HOST_LOST)]
    intent = w.run()
    st = intent.status
    assert (st.disruptions, st.job_restarts, st.attempt) == (1, 0, 2), reasons(intent)
    assert st.recovery.pending_gang_restart == "CoordinatorLost" and reasons(intent).count("NotCharged") == 2


def test_a_crashed_coordinator_is_the_jobs_failure_and_a_finished_one_is_nothing():
    crashed = W()
    crashed.world.coordinator["status"] = {"phase": "Failed", "containerStatuses": [
        {"state": {"terminated": {"exitCode": 1, "finishedAt": ts(1)}}}]}
    st = crashed.run().status
    assert (st.job_restarts, st.attempt, st.recovery.pending_gang_restart) == (1, 2, "CoordinatorFailed")
    finished = W()
    finished.world.coordinator["status"] = {"phase": "Succeeded"}
    assert finished.run().status.attempt == 1
    # Its nvrx-control raised (issue 27.6: it used to exit 0, and nobody looked until the workers lost
    # their store): the rendezvous is gone, the platform's doing, and a new gang at once.
    control = W()
    control.world.coordinator["status"] = {"phase": "Failed", "containerStatuses": [
        {"state": {"terminated": {"exitCode": exit_codes.RENDEZVOUS_CONTROL_FAILED, "finishedAt": ts(1)}}}]}
    st = control.run().status
    assert (st.disruptions, st.job_restarts, st.attempt) == (1, 0, 2)
    assert st.recovery.pending_gang_restart == "RendezvousControlFailed"
    # ... and a consequence, not charged, while a pod of the gang finds no node (CI: every new gang's
    # round failed to close as it waited for capacity, each a disruption until maxDisruptions).
    waiting = W()
    waiting.world.coordinator["status"] = control.world.coordinator["status"]
    waiting.world.pods[1]["spec"].pop("nodeName", None)
    waiting.world.pods[1]["status"] = {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/3 nodes are available: 1 node(s) didn't match pod anti-affinity rules."}]}
    intent = waiting.run()
    st = intent.status
    assert (st.disruptions, st.job_restarts, st.attempt) == (0, 0, 2), reasons(intent)
    assert "NotCharged" in reasons(intent)


@pytest.mark.parametrize("phase, evicted", [("Running", False), ("Running", True), ("Succeeded", False),
                                             ("Succeeded", True)])
def test_a_coordinator_deleted_by_someone_else_is_the_platforms_loss(phase, evicted):
    """Issue 29.4: `kubectl delete pod`, a drain, a consolidation. It exits 0 on SIGTERM, and a Succeeded
    coordinator used to be read as a finished gang's: the workers then lost their store (72) and were
    charged to the job. Found while Terminating, or once ended: one disruption, one new gang, the workers'
    exits not charged. The operator's own deletions (settled in status first) are never charged."""
    w = W()
    coordinator = w.world.coordinator
    coordinator["metadata"]["deletionTimestamp"] = ts(-25)
    coordinator["status"] = {"phase": phase}
    if evicted:
        coordinator["status"]["conditions"] = [{"type": "DisruptionTarget", "status": "True",
                                                "reason": "EvictionByEvictionAPI", "message": "Eviction API"}]
    w.world.pods = [pod(0, "Failed", code=exit_codes.RENDEZVOUS_HOST_LOST), pod(1)]
    intent = w.run()
    st = intent.status
    assert (st.disruptions, st.job_restarts, st.attempt) == (1, 0, 2), reasons(intent)
    assert st.recovery.pending_gang_restart == "CoordinatorLost"
    # Deleted by the operator itself (a gang restart, a suspend): settled first, nothing charged.
    ours = W()
    ours.world.coordinator["metadata"]["deletionTimestamp"] = ts(-25)
    ours.world.coordinator["status"] = {"phase": phase}
    ours.status(recovery={"seenPods": [ours.world.coordinator["metadata"]["uid"]]})
    st = ours.run().status
    assert (st.disruptions, st.job_restarts, st.attempt) == (0, 0, 1)


def test_node_0_hosts_nothing_with_the_coordinator_and_everything_without_it():
    with_coordinator = build_job(RTJ.from_body(rtj_body()))["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in with_coordinator["env"]}
    assert env["RTJ_RDZV_ENDPOINT"] == "train-a1-rdzv.train.default.svc:29400" and env["RTJ_COORDINATOR"] == "1"
    assert "ports" not in with_coordinator
    without = build_job(RTJ.from_body(rtj_body(coordinator={"enabled": False})))["spec"]["template"]["spec"][
        "containers"][0]
    env = {e["name"]: e.get("value") for e in without["env"]}
    assert env["RTJ_RDZV_ENDPOINT"] == "train-a1-0.train.default.svc:29400" and env["RTJ_COORDINATOR"] == "0"
    assert [p["containerPort"] for p in without["ports"]] == [29400, 29401, 29402]
    assert build_coordinator(RTJ.from_body(rtj_body(coordinator={"enabled": False})), 1) is None


# --- spares -----------------------------------------------------------------------------------------
def test_spares_are_more_pods_of_the_job_and_the_job_runs_with_its_training_nodes():
    job = build_job(RTJ.from_body(rtj_body(nodes={"count": 2, "spares": 1})))
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == 3
    assert env["NNODES"] == "2" and env["RTJ_NNODES"] == "2:3"
    # Two exits 0 end it, even if the lost index's replacement never found a node.
    assert job["spec"]["successPolicy"] == {"rules": [{"succeededCount": 2}]}
    assert "successPolicy" not in build_job(RTJ.from_body(rtj_body(nodes={"count": 2})))["spec"]
    w = W(pods=3, nodes={"count": 2, "spares": 1})
    intent = w.run()
    assert intent.actions == [] and intent.status.phase == "Running"
    assert (intent.status.nodes_desired, intent.status.nodes_ready, intent.status.standbys) == (2, 2, 1)
    w.world.pods = w.world.pods[:2]  # a spare took over; the lost pod is being replaced in the background
    st = w.run().status
    assert st.phase == "Running" and st.standbys == 0


def test_a_standby_that_finds_no_node_never_suspends_a_job_that_trains_on_its_nodes():
    """nodes 2 + 1 spare, a spare took the lost node's ranks, its replacement finds no node: reported, but
    the gang keeps its nodes (no suspend, no capacity timeout) because it trains meanwhile."""
    w = waiting_since(W(pods=3, nodes={"count": 2, "spares": 1},
                        restartBudget={"capacitySuspendSeconds": 300, "capacityTimeoutSeconds": 600}), 3601)
    w.world.pods[2] = unschedulable(2)
    intent = w.run()
    cond = condition(intent, "WaitingForCapacity")
    assert cond["status"] == "True" and cond["reason"] == "StandbyUnschedulable", cond
    assert "trains on its 2 nodes meanwhile, with 0 standby(s)" in cond["message"]
    assert not intent.status.recovery.suspended_for_capacity and intent.status.phase == "Running"
    assert intent.actions == []


def finished_gang(trained: int, stopped: dict[str, Any], **job_status: Any) -> W:
    """nodes 2 + 1 spare after a node loss: a spare took the lost node's ranks; `trained` of the two
    training indexes (0 and 2) exited 0; the lost index's replacement (1), placed once a trainer's exit
    freed its node, in state `stopped`."""
    w = W(pods=3, nodes={"count": 2, "spares": 1})
    w.job(1, **job_status)
    w.status(disruptions=1, restartsByTier={ladder.REPLACE_POD: 1})
    trainers = [indexed(pod(i, "Succeeded" if n < trained else "Running", code=0 if n < trained else None), i)
                for n, i in enumerate((0, 2))]
    replacement = indexed(pod(1, **stopped), 1)
    replacement["metadata"]["uid"] = "pod-1-replacement"
    w.world.pods = [trainers[0], replacement, trainers[1]]
    return w


def _job(completions: int, success: int | None = None, *conditions: str) -> dict[str, Any]:
    spec: dict[str, Any] = {"completions": completions}
    if success:
        spec["successPolicy"] = {"rules": [{"succeededCount": success}]}
    return {"spec": spec, "status": {"conditions": [{"type": c, "status": "True"} for c in conditions]}}


@pytest.mark.parametrize("job, phases, met", [
    (None, ["Succeeded"] * 2, False),
    (_job(2), ["Succeeded", "Running"], False),
    (_job(2), ["Succeeded", "Succeeded"], True),
    (_job(3, 2), ["Succeeded", "Failed", "Succeeded"], True),  # the success rule, not completions
    (_job(3, 2), ["Succeeded", "Running", "Running"], False),
    (_job(2), ["Running", "Running"], False),
    (_job(2, None, "SuccessCriteriaMet"), ["Running", "Running"], True),  # the Job's word
    (_job(2, None, "Complete"), [], True),
])
def test_success_met_reads_the_jobs_success_rule_from_its_pods_by_index(job, phases, met):
    pods = [indexed(pod(i, phase), i) for i, phase in enumerate(phases)]
    assert success_met(job, pods) is met
    if len(pods) == 2 and met and job and not job["status"]["conditions"]:
        # Two pods of one index (a replaced pod's record and its replacement) are one index.
        assert success_met(job, [pods[0], indexed(pod(1, "Succeeded"), 0)]) is False


STOPPED = {  # what the Job controller's stop leaves of a pod that had just started
    "deleted while running": {"phase": "Failed", "code": 1, "deleting": 119},
    "its rendezvous gone": {"phase": "Failed", "code": exit_codes.RENDEZVOUS_FAILED},
    "terminating": {"phase": "Running", "deleting": 119},
}


@pytest.mark.parametrize("job_says", [False, True], ids=["before the Job says so", "SuccessCriteriaMet"])
@pytest.mark.parametrize("stopped", STOPPED.values(), ids=STOPPED.keys())
def test_a_pod_the_job_controller_stops_once_the_gang_finished_is_charged_to_nobody(stopped, job_says):
    """Two exits 0 meet the success rule; the Job controller stops the replacement that found a node only
    once a trainer's exit freed one. The pods' store shows that stop after the exits 0, the Job's store
    maybe later (CI saw a second disruption charged so): the stop is never a fault, and the job succeeded."""
    conditions = [{"type": "SuccessCriteriaMet", "status": "True"}] if job_says else []
    intent = finished_gang(2, stopped, conditions=conditions).run()
    st = intent.status
    assert (st.disruptions, st.job_restarts, st.restarts_by_tier[ladder.REPLACE_POD]) == (1, 0, 1)
    assert st.phase == "Succeeded" and reasons(intent) == ["Succeeded"]
    assert not st.recovery.pending_gang_restart and intent.actions == []


def test_a_pod_deleted_before_the_gang_finished_is_a_disruption():
    """The same deletion with one trainer still training: the platform's, as ever."""
    intent = finished_gang(1, STOPPED["deleted while running"]).run()
    assert intent.status.disruptions == 2 and intent.status.phase != "Succeeded"


def test_a_standbys_wait_stays_a_standbys_while_the_gangs_trainers_finish_one_after_another():
    """The lost index's replacement still finds no node when one trainer has exited 0 and the other is
    still at its final save: no node is missing (that index is done), so no Unschedulable wait starts a
    clock that could suspend the finishing gang."""
    w = waiting_since(W(pods=3, nodes={"count": 2, "spares": 1},
                        restartBudget={"capacitySuspendSeconds": 300, "capacityTimeoutSeconds": 600}), 3601,
                      reason="StandbyUnschedulable")
    w.world.pods = [indexed(pod(0, "Succeeded", code=0), 0), indexed(unschedulable(1), 1), indexed(pod(2), 2)]
    intent = w.run()
    cond = condition(intent, "WaitingForCapacity")
    assert cond["reason"] == "StandbyUnschedulable" and "(1 of them finished), with 0 standby(s)" in cond["message"]
    assert "Unschedulable" not in reasons(intent) and not intent.status.recovery.suspended_for_capacity
    assert not intent.status.recovery.capacity_wait_since


def test_a_deleted_pods_final_report_still_counts():
    """A gang stopped by a suspend or a preemption: the Job controller removes its pods a moment after
    their containers ended, maybe before a pass saw them; their final checkpoint step still counts."""
    w = W()
    last = pod(0, "Failed", code=1)
    last["status"]["containerStatuses"][0]["state"]["terminated"]["message"] = '{"checkpointStep": 40}'
    w.world.pods, w.world.departed = w.world.pods[1:], [last]
    assert w.run().status.last_checkpoint_step == 40


def indexed(p: dict[str, Any], index: int, failures: int = 0) -> dict[str, Any]:
    p["metadata"]["annotations"] = {ladder.INDEX: str(index), ladder.INDEX_FAILURES: str(failures)}
    p["metadata"]["finalizers"] = [ladder.JOB_TRACKING]
    return p


def test_short_of_capacity_a_survivors_failed_rendezvous_is_not_charged_in_any_attempt():
    """The lost node's fault was recovered by a new gang (attempt 2), whose index 1 finds no node: its
    survivor's launcher gives up on the rendezvous (71). No rendezvous could complete without that pod:
    not the job's failure. The launcher closed the rendezvous, so a third gang starts, not charged."""
    w = W()
    w.status(attempt=2).job(2).coordinator(2)
    w.world.pods = [indexed(pod(0, "Failed", code=exit_codes.RENDEZVOUS_FAILED, attempt=2), 0), unschedulable(1)]
    intent = w.run()
    st = intent.status
    assert (st.job_restarts, st.disruptions, st.attempt) == (0, 0, 3), st
    assert "NotCharged" in reasons(intent) and "RecreatingGang" in reasons(intent)


@pytest.mark.parametrize("short_of_capacity", [True, False])
def test_short_of_capacity_a_peers_exit_is_not_charged_however_long_it_waited(short_of_capacity):
    """CI, stop 25: two indexes, one node, attempt 3. The pods take turns on the node; one whose gang was
    stopped by a survivor that gave up on the rendezvous exits 74 (GangStopped, a PEER finding). No
    fault of this attempt explains it and it waited past PEER_ATTRIBUTION_SECONDS, yet a pod of the gang
    finds no node: that is its cause, not the job. With every index placed, the same exit is charged."""
    w = waiting_since(W(restartBudget={"capacitySuspendSeconds": 300}), 90) if short_of_capacity else W()
    w.status(attempt=3).job(3).coordinator(3)
    stopped = indexed(pod(0, "Failed", code=exit_codes.GANG_STOPPED, attempt=3), 0)
    stopped["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = ts(
        ladder.PEER_ATTRIBUTION_SECONDS + 10)
    w.world.pods = [stopped, indexed(unschedulable(1) if short_of_capacity else pod(1, attempt=3), 1)]
    intent = w.run()
    assert intent.status.job_restarts == (0 if short_of_capacity else 1), intent.status
    excused = [e.message for e in intent.events if e.reason == "NotCharged"]
    assert bool(excused) is short_of_capacity and all(ladder.SHORT_OF_CAPACITY in m for m in excused), excused


@pytest.mark.parametrize("short_of_capacity", [False, True])
def test_a_long_replacement_backoff_starts_a_new_gang_unless_it_is_short_of_capacity(short_of_capacity):
    """A replacement later than half the rendezvous timeout: a new gang starts at once, unless a pod of
    the gang finds no node (the new gang would wait for the same node; only the survivors restart)."""
    w = W()
    w.world.pods[0] = indexed(pod(0, "Failed", code=1), 0, failures=6)  # 600 s back-off
    w.world.pods[1] = indexed(unschedulable(1) if short_of_capacity else w.world.pods[1], 1)
    w.status(recovery={"seenPods": ["pod-0-1"]})
    st = w.run().status
    assert (st.recovery.pending_gang_restart == "ReplacementBackoff") is not short_of_capacity, st.recovery


def test_the_capacity_wait_goes_on_while_the_gangs_pods_are_not_placed_yet():
    """Pods just created (a Job recreated, a replacement) that the scheduler has not judged yet: the wait
    and its clock go on; resolving it would restart the clock with every new pod."""
    w = waiting_since(W(restartBudget={"capacitySuspendSeconds": 300}), 250)
    fresh = indexed(pod(1, "Pending"), 1)
    fresh["spec"].pop("nodeName")
    w.world.pods[1] = fresh
    cond = condition(w.run(), "WaitingForCapacity")
    assert (cond["status"], cond["lastTransitionTime"]) == ("True", ts(250)), cond
    w.world.pods[1] = indexed(pod(1), 1)  # placed: the wait is over
    w.world.pods[0] = indexed(w.world.pods[0], 0)
    assert condition(w.run(), "WaitingForCapacity")["status"] == "False"


@pytest.mark.parametrize("asked,charged", [(10, 0), (2, 1)])
def test_a_pod_a_suspend_deleted_is_not_charged_when_its_end_shows_after_a_quick_resume(asked, charged):
    """Suspended and resumed within a moment: the Job controller deleted the pods for the suspend, and
    their ends show only once the Job runs again. A pod deleted before the resume is the suspend's; one
    deleted after it is a disruption."""
    w = W()
    w.world.job["status"] = {"conditions": [{"type": "Suspended", "status": "False", "reason": "JobResumed",
                                             "lastTransitionTime": ts(5)}]}
    w.world.pods[0] = pod(0, "Failed", code=1, deleting=asked)
    st = w.run().status
    assert (st.disruptions, st.job_restarts) == (charged, 0), st


def test_a_gang_whose_pods_take_turns_on_too_few_nodes_is_suspended_after_capacity_suspend_seconds():
    """Two indexes, one node: each pod in turn gets the node, fails its rendezvous and waits out the Job
    controller's back-off, so often no pod is unschedulable at the moment a pass looks. The gang still
    lacks a node: the wait goes on and the gang is suspended when it is due."""
    w = waiting_since(W(restartBudget={"capacitySuspendSeconds": 60}), 61)
    w.world.pods = [indexed(pod(0), 0), indexed(pod(1, "Failed", code=exit_codes.GANG_STOPPED), 1, failures=2)]
    decided = w.run()
    assert decided.status.recovery.suspended_for_capacity and "SuspendingForCapacity" in reasons(decided)
    assert (decided.status.job_restarts, decided.status.attempt) == (0, 1)


# --- Running waits for the ranks (policies/phase.ranks_started) --------------------------------------------


def reporting(p: dict[str, Any], state: str | None, ready_for: float) -> dict[str, Any]:
    """The pod Ready `ready_for` seconds ago, with its worker's report in `state` (None: no report at all)."""
    p["status"]["conditions"][0]["lastTransitionTime"] = ts(ready_for)
    if state is not None:
        report = {"v": 1, "state": state, "step": 0, "restarts": {}, "causes": {}, "at": NOW.timestamp()}
        p["status"]["conditions"].append({"type": "rtj.dev/Progress", "status": str(state == "Training"),
                                          "reason": state, "message": json.dumps(report)})
    return p


@pytest.mark.parametrize("states, ready_for, trained, phase, reason", [
    # A new gang whose pods are Ready: Running only once a pod says its ranks started.
    (("Waiting", "Waiting"), 60, None, "Pending", "RanksStarting"),
    (("Recovering", "Waiting"), 60, None, "Pending", "RanksStarting"),  # failed before it ever started
    (("Started", "Waiting"), 60, None, "Running", "AllNodesRunning"),  # a script that reports no steps
    (("Training", "Waiting"), 60, None, "Running", "AllNodesRunning"),
    (("Finished", "Finished"), 60, None, "Running", "AllNodesRunning"),
    # Pods that report nothing (no worker in them, or their patches refused): readiness, after a grace.
    ((None, None), 2, None, "Pending", "RanksStarting"),
    ((None, None), 6, None, "Running", "AllNodesRunning"),
    # Once this attempt started, a recovery inside it is Running with its pods, as before.
    (("Recovering", "Waiting"), 60, 1, "Running", "AllNodesRunning"),
    # An earlier attempt's start says nothing of this one's (a gang restart; a spec edit with a typo).
    (("Waiting", "Waiting"), 60, 0, "Pending", "RanksStarting"),
])
def test_a_gang_is_running_once_its_ranks_started_not_when_its_pods_are_ready(states, ready_for, trained, phase,
                                                                               reason):
    w = W()
    w.world.pods = [reporting(p, s, ready_for) for p, s in zip(w.world.pods, states, strict=True)]
    w.status(phase="Pending", **({"recovery": {"trainedAttempt": trained}} if trained is not None else {}))
    intent = w.run()
    running = next(c for c in intent.status.conditions if c["type"] == "Running")
    assert (intent.status.phase, running["reason"]) == (phase, reason), running
    if phase == "Running":
        assert intent.status.recovery.trained_attempt == 1 and "Running" in reasons(intent)
    else:
        assert intent.status.recovery.trained_attempt == trained and "Running" not in reasons(intent)
        assert "no rank has started training" in running["message"] and intent.requeue.seconds <= 30
    if states == (None, None) and phase == "Pending":
        assert intent.requeue.seconds <= 5 - ready_for + 0.5  # looks again when the grace ends
