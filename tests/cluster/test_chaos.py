"""Issue 17: chaos on the local control plane. A seeded, printed schedule of what real clusters do to
running RTJs (suspends and resumes, evictions, deletes, node losses with and without fencing, blips,
cordons that take capacity away, operator restarts) and of the job's own faults, with invariants
checked after every step:

- no index of a Job ever has two live pods;
- nothing the platform caused is charged to the job: jobRestarts never exceeds the job faults injected,
  disruptions never exceed the platform events injected;
- every charge names a cause of the kind injected, for the payer of that kind (status.restartCounts by
  tier, reason and who was charged), and no payer is charged more often than its causes were injected;
- every wait longer than its timeout carries a condition that says why.

Replay a run with RTJ_CHAOS_SEED=<seed> (printed at the start); RTJ_CHAOS_STEPS sets its length.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from clusterkit import Job, start_operator
from rtj_dev.localcluster import LocalCluster
from rtj_operator import ladder
from testkit import wait_until

INDEX = "batch.kubernetes.io/job-completion-index"
BUDGET = {"maxRestarts": 50, "maxDisruptions": 50, "maxRestartsWithoutProgress": 50, "nodeLossGraceSeconds": 2,
          "terminatingTimeoutSeconds": 3, "capacitySuspendSeconds": 15}
# Reasons a charge may carry, by who pays.
JOB_REASONS = {"ExitCode1"}
PLATFORM_REASONS = {"NodeNotReady", "NodeUnreachable", "NodeDeleted", "NodeFenced", "PodDeleted",
                    "EvictionByEvictionAPI", "DeletionByTaintManager", "DeletionByPodGC", ladder.FORCE_REASON,
                    ladder.COORDINATOR_LOST}
SLACK = 20.0  # seconds past a timeout before a missing condition counts as a broken invariant


@dataclass
class Chaos:
    cluster: LocalCluster
    kube: Any
    ns: str
    rng: random.Random
    jobs: list[Job]
    lost: set[str] = field(default_factory=set)
    cordoned: set[str] = field(default_factory=set)
    job_faults: dict[str, int] = field(default_factory=dict)
    platform_events: dict[str, int] = field(default_factory=dict)
    log: list[str] = field(default_factory=list)

    def say(self, what: str) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {what}")
        print(self.log[-1])

    def live_pods(self, job: Job) -> list[dict[str, Any]]:
        return [p for p in job.pods() if p["status"].get("phase") in ("Pending", "Running")]

    def running(self, job: Job) -> list[dict[str, Any]]:
        return [p for p in job.running_pods() if p["spec"].get("nodeName") not in self.lost]

    # --- what the platform does --------------------------------------------------------------------
    def suspend_resume(self, job: Job) -> None:
        suspended = bool(job.body()["spec"].get("suspend"))
        for pod in self.live_pods(job):  # ft_launcher turns SIGTERM into exit 1
            self.kube.patch("Pod", pod["metadata"]["name"], self.ns,
                            {"metadata": {"annotations": {"kwok.rtj.dev/exit-on-delete": "1"}}})
        job.patch({"suspend": not suspended})
        self.say(f"{'resume' if suspended else 'suspend'} {job.name}")

    def evict(self, job: Job) -> None:
        pods = self.running(job)
        if pods:
            pod = self.rng.choice(pods)
            self.cluster.api("POST", f"/api/v1/namespaces/{self.ns}/pods/{pod['metadata']['name']}/eviction",
                             {"apiVersion": "policy/v1", "kind": "Eviction",
                              "metadata": {"name": pod["metadata"]["name"], "namespace": self.ns}})
            self.platform(job, f"evict {pod['metadata']['name']}")

    def delete_pod(self, job: Job) -> None:
        pods = self.running(job)
        if pods:
            pod = self.rng.choice(pods)
            self.kube.patch("Pod", pod["metadata"]["name"], self.ns,
                            {"metadata": {"annotations": {"kwok.rtj.dev/exit-on-delete": "1"}}})
            self.kube.delete("Pod", pod["metadata"]["name"], self.ns)
            self.platform(job, f"kubectl delete pod {pod['metadata']['name']}")

    def lose_node(self, job: Job) -> None:
        pods = self.running(job)
        if not pods:
            return
        node = self.rng.choice(pods)["spec"]["nodeName"]
        self.cluster.lose_node(node)
        self.lost.add(node)
        for other in self.jobs:
            coordinator = other.coordinator() or {}
            if any(p["spec"].get("nodeName") == node for p in self.live_pods(other)) or (
                    coordinator.get("spec", {}).get("nodeName") == node):
                self.platform(other, f"lose node {node}")

    def fence_or_restore(self) -> None:
        if not self.lost:
            return
        node = self.rng.choice(sorted(self.lost))
        if self.rng.random() < 0.5:
            self.cluster.fence_node(node)
            self.say(f"fence node {node} (out-of-service)")
            time.sleep(4)  # PodGC or the operator forces its pods; then the node comes back
        self.cluster.restore_node(node)
        self.lost.discard(node)
        self.say(f"node {node} back")

    def cordon(self) -> None:
        nodes = [n["metadata"]["name"] for n in self.kube.list("Node") if n["metadata"]["name"] not in self.cordoned]
        if nodes and len(self.cordoned) < 4:
            node = self.rng.choice(sorted(nodes))
            self.kube.patch("Node", node, None, {"spec": {"unschedulable": True}})
            self.cordoned.add(node)
            self.say(f"cordon {node} (capacity taken away)")
        elif self.cordoned:
            node = self.cordoned.pop()
            self.kube.patch("Node", node, None, {"spec": {"unschedulable": False}})
            self.say(f"uncordon {node}")

    def uncordon_all(self) -> None:
        for node in sorted(self.cordoned):
            self.kube.patch("Node", node, None, {"spec": {"unschedulable": False}})
            self.say(f"uncordon {node}")
        self.cordoned.clear()

    def platform(self, job: Job, what: str) -> None:
        self.platform_events[job.name] = self.platform_events.get(job.name, 0) + 1
        self.say(what)

    # --- what the job does -----------------------------------------------------------------------
    def crash(self, job: Job) -> None:
        pods = self.running(job)
        if pods and not job.body()["spec"].get("suspend"):
            pod = self.rng.choice(pods)
            job.exit_pod(pod, 1)
            self.job_faults[job.name] = self.job_faults.get(job.name, 0) + 1
            self.say(f"job fault: {pod['metadata']['name']} exits 1")

    # --- invariants ----------------------------------------------------------------------------------
    def check(self) -> None:
        for job in self.jobs:
            st = job.status()
            by_index: dict[str, list[str]] = {}
            for pod in self.live_pods(job):
                by_index.setdefault(pod["metadata"]["annotations"].get(INDEX, "?"), []).append(pod["metadata"]["name"])
            doubled = {i: names for i, names in by_index.items() if len(names) > 1}
            assert not doubled, f"{job.name}: two live pods of one index {doubled}\n" + "\n".join(self.log)
            assert st.get("jobRestarts", 0) <= self.job_faults.get(job.name, 0), self.explain(job)
            assert st.get("disruptions", 0) <= self.platform_events.get(job.name, 0), self.explain(job)
            reason = st.get("lastFailureReason")
            if st.get("restarts"):
                assert reason in JOB_REASONS | PLATFORM_REASONS, self.explain(job)
            # Every charge, by who paid: a cause of that kind that was injected, and no more of them.
            charged: dict[str, int] = {}
            for entry in st.get("restartCounts") or []:
                payer, why = entry["charged"], entry["reason"]
                assert why in {ladder.JOB: JOB_REASONS, ladder.PLATFORM: PLATFORM_REASONS}.get(payer, set()), \
                    f"{job.name}: {entry} was charged{self.explain(job)}"
                charged[payer] = charged.get(payer, 0) + int(entry["count"])
            assert charged.get(ladder.JOB, 0) <= self.job_faults.get(job.name, 0), self.explain(job)
            assert charged.get(ladder.PLATFORM, 0) <= self.platform_events.get(job.name, 0), self.explain(job)
            self.check_waits(job, st)

    def check_waits(self, job: Job, st: dict[str, Any]) -> None:
        now = time.time()
        conds = {c["type"]: c for c in st.get("conditions") or [] if c["status"] == "True"}
        for pod in job.pods():
            meta = pod["metadata"]
            if meta.get("deletionTimestamp"):
                overdue = now - _epoch(meta["deletionTimestamp"])
                if overdue > BUDGET["terminatingTimeoutSeconds"] + SLACK and pod["status"].get("phase") in (
                        "Pending", "Running"):
                    assert {"WaitingForFencing", "WaitingForPodTermination"} & set(conds) or st.get(
                        "phase") == "Suspended", f"{meta['name']} terminating {overdue:.0f}s{self.explain(job)}"
            scheduled = next((c for c in pod["status"].get("conditions") or [] if c["type"] == "PodScheduled"), {})
            if scheduled.get("reason") == "Unschedulable" and now - _epoch(scheduled["lastTransitionTime"]) > SLACK:
                assert "WaitingForCapacity" in conds, f"{meta['name']} unschedulable{self.explain(job)}"

    def explain(self, job: Job) -> str:
        return (f"\ninjected: job faults {self.job_faults}, platform events {self.platform_events}\n"
                + "\n".join(self.log) + job.explain())


def _epoch(stamp: str) -> float:
    return time.mktime(time.strptime(stamp[:19], "%Y-%m-%dT%H:%M:%S")) - time.timezone


@pytest.fixture
def chaos(cluster, kube, ns) -> Iterator[Chaos]:
    seed = int(os.environ.get("RTJ_CHAOS_SEED") or random.SystemRandom().randrange(1 << 30))
    print(f"\nchaos seed {seed} (replay: RTJ_CHAOS_SEED={seed})")
    world = Chaos(cluster, kube, ns, random.Random(seed), [Job(kube, ns, f"chaos-{i}") for i in range(3)])
    try:
        yield world
    finally:
        for node in world.lost:
            cluster.restore_node(node)
        world.uncordon_all()


@pytest.mark.timeout(900)
def test_chaos_never_charges_the_platforms_faults_to_the_job(chaos: Chaos, cluster, operator_token, ns):
    operator = start_operator(cluster, operator_token, ns)
    try:
        for i, job in enumerate(chaos.jobs):
            job.create(nodes={"count": 2 + i % 2}, restartBudget=BUDGET)
        for job in chaos.jobs:
            job.wait_running(timeout=90)
        steps = int(os.environ.get("RTJ_CHAOS_STEPS", "14"))
        for _ in range(steps):
            job = chaos.rng.choice(chaos.jobs)
            action = chaos.rng.choice(["suspend_resume", "evict", "delete_pod", "lose_node", "fence_or_restore",
                                       "fence_or_restore", "cordon", "crash", "crash", "restart_operator"])
            if action == "restart_operator":
                operator.stop()
                chaos.say("operator restarted")
                operator = start_operator(cluster, operator_token, ns)
            elif action in ("fence_or_restore", "cordon"):
                getattr(chaos, action)()
            else:
                getattr(chaos, action)(job)
            # The platform's pace (a time wait: nodes are judged lost by time), the invariants checked meanwhile.
            deadline = time.monotonic() + chaos.rng.uniform(4, 10)
            wait_until(lambda d=deadline: (chaos.check(), time.monotonic() >= d)[1], timeout=15,
                       what="the step's dwell", interval=1)
        # The platform heals: every node back and uncordoned, every job resumed; all converge to Running.
        while chaos.lost:
            chaos.fence_or_restore()
        chaos.uncordon_all()
        for job in chaos.jobs:
            if job.body()["spec"].get("suspend"):
                job.patch({"suspend": False})
        for job in chaos.jobs:
            wait_until(lambda j=job: (chaos.check(), j.status().get("phase") == "Running")[1], timeout=180,
                       what=f"{job.name} Running again{chaos.explain(job)}", interval=1)
        chaos.check()
        assert operator.error is None, operator.error
    finally:
        operator.stop()
