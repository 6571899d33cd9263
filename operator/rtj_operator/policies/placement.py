"""Placement and capacity: where the gang's pods may go (node exclusions, the operator's scheduling
gate, the coordinator's address first) and what happens while a pod finds no node (WaitingForCapacity:
suspend the gang to release its nodes, resume it, time it out)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from typing import Any

from .. import api, conditions, ladder
from ..actions import UNGATE, Action
from ..builders.job import build_job
from ..builders.probe import build_capacity_probes, probe_hash
from ..conditions import parse_time, timestamp
from ..draft import Draft
from .kueue import queued
from .phase import UNTIMED_WAITS, WAITING_FOR_CAPACITY, waiting
from .pods import (
    addressed_coordinator,
    bound_since,
    coordinator_attempt,
    gated,
    on_node,
    running_ready,
    succeeded_indexes,
)

# Node exclusions (restartBudget.nodeExclusionSeconds): at most this many at once (the oldest go first),
# and a node is excluded once this many failures charged to the job happened on it.
MAX_EXCLUDED = 16
REPEATED_FAILURES = 2
HOSTNAME_FIELD = "metadata.name"
# How often a gang held for its coordinator's name looks again, once the coordinator has an address: no
# watch feeds the EndpointSlices (World.coordinator_published), and the controller publishes within seconds.
PUBLISHED_POLL_SECONDS = 1.0


@dataclass(frozen=True)
class CapacityWait:
    """What wait_for_capacity learned: whether the gang is short of capacity (a pod of it, not a standby's,
    finds no node: the gang cannot form), and (reason, message) if the job fails for it."""

    short: bool = False
    fails: tuple[str, str] | None = None


def wait_for_capacity(d: Draft, plan: ladder.Plan) -> CapacityWait:
    """A pod the scheduler finds no node for: say so (WaitingForCapacity, with the scheduler's message);
    after capacitySuspendSeconds suspend the gang so its healthy nodes are released, and resume it once
    the scheduler placed one capacity probe per training node (builders/probe.py: the probes' pod events
    wake the job, so it resumes within a pass of room appearing, whether an autoscaler added a node or
    another workload freed one); after capacityTimeoutSeconds in all, end Failed with the platform's
    reason (returned: the caller fails the job). With a queue, its Workload is deactivated instead (Kueue
    owns suspend, and releases the quota), and re-activated to resume: Kueue admits it again once its
    ClusterQueue has the quota. Never charged to the job (ladder.attribute excuses the survivors' failed
    rendezvous)."""
    ledger, budget = d.status.recovery, d.rtj.spec["restartBudget"]
    if d.rtj.spec["suspend"]:
        ledger.capacity_wait_since = ""  # the user's suspension: a wait for capacity after it starts afresh
        return CapacityWait()
    old = conditions.get_condition(d.old.get("conditions") or [], WAITING_FOR_CAPACITY) or {}
    since = parse_time(old.get("lastTransitionTime")) if (
        old.get("status") == "True" and old.get("reason") not in UNTIMED_WAITS) else None
    waited = (d.now - since).total_seconds() if since else 0.0
    whose, short = "the job's pods", False
    if ledger.suspended_for_capacity:
        placed, waiting_on = probes_placed(d)
        if placed >= d.rtj.nodes:
            ledger.suspended_for_capacity = ""
            d.event("Normal", "ResumingForCapacity", f"the scheduler placed all {placed} capacity probes (pods shaped "
                                                     "like the gang's): resuming the gang")
            d.act = True
            waiting(d, WAITING_FOR_CAPACITY, "Resuming", "a node was found for every pod of the gang: it resumes")
        else:
            short = True
            suspended(d, placed, waiting_on)
    elif why := coordinator_unschedulable(d):
        # The gang's pods keep their gate meanwhile (awaiting_coordinator), so they hold no node:
        # nothing to release by suspending (and resuming would wait for worker nodes, not for the
        # coordinator's). Not the job's fault; bounded by capacityTimeoutSeconds.
        holding = sum(1 for p in d.world.pods if on_node(p))
        short, whose = True, "the job's coordinator"
        waiting(d, WAITING_FOR_CAPACITY, "CoordinatorUnschedulable",
                f"the coordinator pod {d.world.coordinator['metadata']['name']}: {why}; the gang's pods wait for it "
                + (f"({holding} of them on nodes)" if holding else "(gated: they hold no node)"))
    elif plan.unschedulable or (old.get("reason") == "Unschedulable" and not scheduled(d)):
        # Once a pod found no node, the wait (and its clock) goes on until every index has a node: a gang
        # short of nodes has its pods take turns on the nodes it has (each failing its rendezvous, the
        # next waiting out the Job controller's back-off), so at a given moment none may be unschedulable.
        if plan.unschedulable:
            pod, message = sorted(plan.unschedulable.items())[0]
            more = f" (and {len(plan.unschedulable) - 1} more)" if len(plan.unschedulable) > 1 else ""
            what = f"pod {pod}{more}: {message}"
            training = running_ready(d.world.pods)
            # A trainer of a finishing gang that exited 0 already: its index is done, no node is missing
            # (the trainers end one after another, the last maybe saving its final checkpoint for minutes).
            done = len(succeeded_indexes(d.world.pods))
            if len(training) + done >= d.rtj.nodes:
                # A spare's (or a lost index's, whose ranks a spare took) pod: the job trains on its nodes
                # meanwhile, so nothing is suspended or timed out; one standby fewer, said so.
                waiting(d, WAITING_FOR_CAPACITY, "StandbyUnschedulable",
                        f"{what}; the job trains on its {d.rtj.nodes} nodes meanwhile"
                        + (f" ({done} of them finished)" if done else "")
                        + f", with {max(0, len(training) + done - d.rtj.nodes)} standby(s)")
                ledger.capacity_wait_since = ""
                return CapacityWait()
        else:
            what = old.get("message") or "a pod of the gang found no node"
        short = True
        waiting(d, WAITING_FOR_CAPACITY, "Unschedulable", what)
        if waited >= budget["capacitySuspendSeconds"]:
            # Recorded first; the next pass suspends the Job or, with a queue (Kueue owns Job.spec.suspend),
            # deactivates its Workload: Kueue then evicts it, suspends the Job and releases its quota
            # (kueue.follow_suspend), and re-queues it once re-activated.
            ledger.suspended_for_capacity = timestamp(d.now)
            how = ("deactivating its Kueue Workload to release its quota and nodes" if queued(d)
                   else "suspending it to release its nodes")
            d.event("Warning", "SuspendingForCapacity", f"the gang has lacked a node for {waited:.0f}s "
                                                       f"(restartBudget.capacitySuspendSeconds; {what}): {how}, "
                                                       f"with {d.rtj.nodes} capacity probes (pods shaped like the "
                                                       "gang's) asking for room; it resumes once all are placed")
            suspended(d, 0, "")  # said in the same write that decides it: the Job is suspended before the next pass
            d.act = True
        else:
            d.wait(max(1.0, budget["capacitySuspendSeconds"] - waited))
    else:
        waiting(d, WAITING_FOR_CAPACITY, "", "")
        if all_bound(d) or (queued(d) and suspended_job(d) and not ledger.suspended_for_capacity):
            # Every index has a node: the wait is over. Or Kueue holds the gang (re-activated after a
            # capacity suspension, waiting for its quota): its admission is a placement afresh, and the
            # queue's wait is Kueue's to bound, not capacityTimeoutSeconds'.
            ledger.capacity_wait_since = ""
        return CapacityWait()
    # The timeout counts from the gang's first lack of a node, across suspend and resume cycles: resumed once
    # its probes were placed, a gang whose room another workload took before its pods were placed waits on
    # (the condition's own clock restarts, and with it capacitySuspendSeconds: the gang gets its chance).
    if short and not ledger.capacity_wait_since:
        ledger.capacity_wait_since = timestamp(since or d.now)
    began = parse_time(ledger.capacity_wait_since) or since
    total = (d.now - began).total_seconds() if began else 0.0
    limit = budget["capacityTimeoutSeconds"]
    if limit and short and total >= limit:
        return CapacityWait(short, ("InsufficientCapacity", f"no capacity for {whose} for {total:.0f}s "
                                                            f"(restartBudget.capacityTimeoutSeconds={limit})"))
    if limit and short:
        d.wait(max(1.0, limit - total))
    return CapacityWait(short)


def suspended(d: Draft, placed: int, waiting_on: str) -> None:
    waiting(d, WAITING_FOR_CAPACITY, "SuspendedForCapacity", f"suspended since "
            f"{d.status.recovery.suspended_for_capacity} to release its nodes: the scheduler placed {placed} of "
            f"{d.rtj.nodes} capacity probes (pods shaped like the gang's, pending where an autoscaler sees "
            f"them){waiting_on}; it resumes by itself once all are placed")


def probes_placed(d: Draft) -> tuple[int, str]:
    """How many of the gang's capacity probes (built as they are now) the scheduler placed on distinct
    nodes, and what the scheduler says of one it did not (", pod X: message"; "" if none says)."""
    want = probe_hash(gang_probes(d)[0])
    live = [p for p in d.world.capacity_probes if not p["metadata"].get("deletionTimestamp")
            and probe_hash(p) == want and (p.get("status") or {}).get("phase") in (None, "Pending", "Running")]
    nodes = {p["spec"]["nodeName"] for p in live if (p.get("spec") or {}).get("nodeName")}
    pending = sorted((p["metadata"]["name"], ladder.unschedulable(p)) for p in live
                     if not (p.get("spec") or {}).get("nodeName") and ladder.unschedulable(p))
    return len(nodes), (f", pod {pending[0][0]}: {pending[0][1]}" if pending else "")


def gang_probes(d: Draft) -> list[dict[str, Any]]:
    """The gang's capacity probes as built now: its affinity with the job's node exclusions in force (as
    release_gated gives its pods), the operator's PriorityClass."""
    template = build_job(d.rtj)["spec"]["template"]["spec"]
    affinity = dict(template.get("affinity") or {})
    nodes = excluded(d.status.excluded_nodes, d.now)
    if nodes:
        required = {"nodeSelectorTerms": exclusion_terms(template, nodes)}
        affinity["nodeAffinity"] = {**(affinity.get("nodeAffinity") or {}),
                                    "requiredDuringSchedulingIgnoredDuringExecution": required}
    return build_capacity_probes(d.rtj, affinity, d.config.capacity_probe_priority_class, template)


def coordinator_unschedulable(d: Draft) -> str:
    """The scheduler's message if it finds no node for the coordinator of the gang's attempt."""
    coordinator = d.world.coordinator
    if coordinator is None or coordinator_attempt(coordinator) != d.status.attempt:
        return ""
    return ladder.unschedulable(coordinator)


def scheduled(d: Draft) -> bool:
    """Whether every index of the gang has a pod bound to a node (not going away), or none is wanted."""
    return suspended_job(d) or all_bound(d)  # suspended: a queue (or the operator) holds the gang, no pod to place


def suspended_job(d: Draft) -> bool:
    return bool(((d.world.job or {}).get("spec") or {}).get("suspend"))


def all_bound(d: Draft) -> bool:
    """Whether every index of the gang has a pod bound to a node (not going away)."""
    bound = {(p["metadata"].get("annotations") or {}).get(ladder.INDEX) for p in d.world.pods if on_node(p)}
    return len(bound - {None}) >= d.rtj.nodes


def exclude(d: Draft, node: str, reason: str) -> None:
    """Keep `node` out of the job's placement for restartBudget.nodeExclusionSeconds (recorded in status
    before any pod is placed by it: release_gated reads status)."""
    seconds = d.rtj.spec["restartBudget"]["nodeExclusionSeconds"]
    if not seconds or not node:
        return
    until = timestamp(d.now + datetime.timedelta(seconds=seconds))
    entries = [e for e in d.status.excluded_nodes if e.get("node") != node]
    d.status.excluded_nodes = [*entries, {"node": node, "reason": reason[:512], "until": until}][-MAX_EXCLUDED:]
    if not any(e.get("node") == node for e in entries):
        d.event("Warning", "NodeExcluded", f"Node {node} is kept out of the job's placement until {until}: {reason}")


REPEATED = "failures of the job's pods in a row on this node"


def count_node_failure(d: Draft, node: str, reason: str) -> None:
    """A failure charged to the job on `node`: the second one in a row there (no failure charged on another
    node between) excludes the node, unless a node is excluded for that already. A restart storm on one
    machine is the machine's, whatever the health agents say; failures that move from node to node, or
    that go on the same way on the node the job moved to, are the job's own code. Excluding every node they
    touched left a job without in-job recovery (every fault fails its pod) no node to run on after a few
    faults (bench/goodput.py's kubernetes mode: every node excluded, the gang suspended for capacity that
    existed)."""
    failures = d.status.recovery.node_failures
    n = failures.get(node, 0) + 1
    failures.clear()  # another node's count ends with this failure: only a run on one node counts
    if n < REPEATED_FAILURES:
        failures[node] = n
    elif not any(REPEATED in e.get("reason", "") for e in d.status.excluded_nodes if in_force(e, d.now)):
        exclude(d, node, f"{n} {REPEATED} (last: {reason})")


def expire_exclusions(d: Draft) -> None:
    """Drop the exclusions that ended from status."""
    d.status.excluded_nodes = [e for e in d.status.excluded_nodes if in_force(e, d.now)]


def in_force(exclusion: dict[str, Any], now: datetime.datetime) -> bool:
    return (parse_time(exclusion.get("until")) or now) > now


def excluded(exclusions: list[dict[str, Any]], now: datetime.datetime) -> list[str]:
    """The nodes excluded now."""
    return sorted({e["node"] for e in exclusions if e.get("node") and in_force(e, now)})


def exclusion_terms(pod_spec: dict[str, Any], nodes: list[str]) -> list[dict[str, Any]]:
    """The pod's required node selector terms with `metadata.name NotIn [node]` added to each, one
    requirement per node: the API server takes exactly one value in a matchFields requirement, and the
    requirements of a term are ANDed (its terms ORed: each term gets them all; a pod held by a scheduling
    gate may only have its node affinity narrowed: KEP-3838)."""
    expressions = [{"key": HOSTNAME_FIELD, "operator": "NotIn", "values": [node]} for node in nodes]
    terms = ((((pod_spec.get("affinity") or {}).get("nodeAffinity") or {})
              .get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get("nodeSelectorTerms") or [])
    if not terms:
        return [{"matchFields": expressions}]
    return [{**t, "matchFields": narrowed(t.get("matchFields") or [], expressions)} for t in terms]


def narrowed(have: list[dict[str, Any]], more: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`have` and those of `more` it lacks (a term that already keeps the pod off a node says it once)."""
    return [*have, *(e for e in more if e not in have)]


def release_gated(d: Draft) -> None:
    """Hand the job's new pods (replacements, spares, a new gang) to the scheduler, each with the node
    exclusions in force now: the operator's scheduling gate removed (others' gates, e.g. Kueue's, kept),
    the excluded nodes added to its node affinity, in one patch guarded by the pod's uid and
    resourceVersion. The caller holds them while they await the coordinator (awaiting_coordinator)."""
    nodes = excluded(d.status.excluded_nodes, d.now)
    for pod in d.world.pods:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        gates = spec.get("schedulingGates") or []
        if not gated(pod):
            continue
        body: dict[str, Any] = {
            "metadata": {"uid": meta.get("uid"), "resourceVersion": meta.get("resourceVersion")},
            "spec": {"schedulingGates": [g for g in gates if g.get("name") != api.SCHEDULING_GATE]}}
        if nodes:
            body["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": exclusion_terms(spec, nodes)}}}
        d.do(Action(UNGATE, "Pod", meta["name"], d.rtj.namespace, body, uid=meta.get("uid", "")))


def awaiting_coordinator(d: Draft) -> tuple[bool, float | None]:
    """Whether the gang's gated pods wait for the coordinator of their attempt to have a name, and when
    to look again if that wait is bounded (the coordinator's own events wake the job sooner).

    A worker's first act is to resolve the coordinator's name, within rendezvousTimeoutSeconds, and a
    name that does not resolve in time fails the pod (76: the platform's, and a new gang). The Service
    publishes not-ready addresses, so the name resolves once the coordinator has an IP and the
    EndpointSlice controller has published it (world.coordinator_published; polled, as no watch feeds
    it): until then the gate stays (CI: a coordinator slow to start on a busy node, then an
    EndpointSlice published 20 s after its address, each cost a job a gang restart). Bounded: once the
    Job is rendezvousTimeoutSeconds old, and the coordinator as long bound to a node, the pods go
    anyway, and their own wait says what is wrong. A coordinator the scheduler finds no node for keeps
    them gated with no such bound: that wait is WaitingForCapacity's (wait_for_capacity), never the job's."""
    if not d.rtj.spec["coordinator"]["enabled"] or d.world.job is None:
        return False, None
    coordinator = d.world.coordinator
    if coordinator is not None and coordinator_attempt(coordinator) != d.status.attempt:
        coordinator = None  # an older gang's: it says nothing of this one
    addressed = addressed_coordinator(coordinator, d.status.attempt) is not None
    if addressed and d.world.coordinator_published is not False:
        return False, None
    if coordinator_unschedulable(d):
        return True, None  # wait_for_capacity says so and bounds it (capacityTimeoutSeconds)
    since = [t for t in (parse_time(d.world.job["metadata"].get("creationTimestamp")),
                         parse_time(bound_since(coordinator))) if t is not None]
    left = d.rtj.spec["resiliency"]["rendezvousTimeoutSeconds"] - ((d.now - max(since)).total_seconds() if since else 0)
    if left <= 0:
        return False, None
    return True, max(0.5, min(left, PUBLISHED_POLL_SECONDS) if addressed else left)
