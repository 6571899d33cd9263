"""End to end: RTJs applied with kubectl, driven by the real operator, training for real in pods that
local node agents (hack/rtj_dev/nodeagent.py) run as processes, 2 nodes x 2 CPU ranks with gloo,
peers found through CoreDNS, checkpoints on one shared directory (the PVC standing in for FSx).

Each fault must be recovered by the right layer: an exception in process, a SIGKILL by ft_launcher
in the same pod, a lost node by the operator replacing that one pod; a permanent error fails fast.
Needs root (network and mount namespaces); marked `e2e`.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import Job, kubectl, wait_until
from rtj_dev.cpu_rtj import RESILIENCY, TOLERATIONS, cpu_rtj, shared_dir
from rtj_dev.localcluster import LocalCluster
from rtj_dev.nodeagent import AGENT_LABEL, AgentNodes, resolve
from rtj_operator.kube import Kube, configure
from rtj_worker import events, exit_codes

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.skipif(os.geteuid() != 0, reason="node agents need root (netns, mounts)")]

STEPS, INTERVAL = 60, 10


@pytest.fixture(scope="module")
def agents(cluster: LocalCluster) -> Iterator[AgentNodes]:
    """Three agent nodes (two for the gang, one spare for a replacement) and CoreDNS."""
    nodes = AgentNodes(cluster, 3).start()
    try:
        yield nodes
    finally:
        nodes.stop()


class Run:
    """One applied RTJ and what it left on the shared directory."""

    def __init__(self, cluster: LocalCluster, kube: Kube, ns: str, agents: AgentNodes, name: str = "train"):
        self.cluster, self.job, self.name, self.ns, self.agents = cluster, Job(kube, ns, name), name, ns, agents

    def apply(self, *train_args: str, **spec: Any) -> Run:
        manifest = yaml.safe_dump(cpu_rtj(self.ns, self.name, list(train_args), STEPS, INTERVAL, **spec))
        kubectl(self.cluster, "apply", "-f", "-", input=manifest)
        return self

    def shared_dir(self) -> Path:
        return shared_dir(self.cluster, self.ns, self.name) or Path("/nonexistent")  # not provisioned yet

    def timeline(self) -> list[dict[str, Any]]:
        return events.read(self.shared_dir() / "events.jsonl")

    def starts(self) -> list[dict[str, Any]]:
        return [e for e in self.timeline() if e["event"] == "start"]

    def result(self) -> dict[str, Any]:
        return json.loads((self.shared_dir() / "result.json").read_text())

    def pod_uids(self) -> dict[str, str]:
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.job.running_pods()}

    def wait_training(self, timeout: float = 90) -> None:
        """Until every rank has made a step (rendezvous done, pods found each other by DNS)."""
        self._wait(lambda: {e["rank"] for e in self.timeline() if e["event"] == "step"} == {0, 1, 2, 3},
                   timeout, "all four ranks training")

    def wait_done(self, phase: str = "Succeeded", timeout: float = 180) -> dict[str, Any]:
        return self._wait(lambda: self.job.status() if self.job.status().get("phase") in (phase, "Failed")
                          and (self.job.status().get("phase") == phase or _fail(self)) else None,
                          timeout, f"phase {phase}")

    def _wait(self, check: Any, timeout: float, what: str) -> Any:
        try:
            return wait_until(check, timeout=timeout, what=what, interval=0.5)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.diagnosis()}") from None

    def diagnosis(self) -> str:
        """What a failed wait needs to be understood from CI's output alone: the RTJ's status, its
        pods, and the last lines each pod's processes wrote (heartbeat chatter left out)."""
        noise = ("eartbeat", "pynvml", "GPU Health", "Health checks", "FutureWarning")
        lines = [f"RTJ status: {json.dumps(self.job.status())[:1500]}"]
        for agent in self.agents.agents:
            for box in list(agent.sandboxes.values()):
                if box.pod["metadata"]["namespace"] != self.ns:
                    continue
                log = box.dir / "container.log"
                tail = [line[:300] for line in (log.read_text(errors="replace").splitlines() if log.exists() else [])
                        if not any(n in line for n in noise)][-25:]
                lines += [f"--- pod {box.pod['metadata']['name']} on {agent.name}, exit {box.exit_code()}:", *tail]
        return "\n".join(lines)


def _fail(run: Run) -> bool:
    raise AssertionError(f"RTJ ended {run.job.status()}\n{run.diagnosis()}")


def same_weights(result: dict[str, Any], clean: dict[str, Any]) -> bool:
    # gloo's allreduce between nodes does not fix the summation order, so the last bits of a sum
    # may differ from run to run (~1e-11 relative); resuming from a wrong step differs by ~1e-4.
    return result["steps"] == clean["steps"] and result["checksum"] == pytest.approx(clean["checksum"], rel=1e-9)


def counters(status: dict[str, Any]) -> dict[str, Any]:
    return {k: status.get(k, 0) for k in ("restarts", "jobRestarts", "disruptions", "attempt")}


@pytest.fixture
def run(cluster: LocalCluster, kube: Kube, ns: str, agents: AgentNodes, operator: Any) -> Iterator[Run]:
    yield Run(cluster, kube, ns, agents)
    agents.kill_namespace(ns)  # the next test starts on idle nodes


@pytest.fixture(scope="module")
def clean_result(cluster: LocalCluster, agents: AgentNodes, operator_token: str) -> dict[str, Any]:
    """The weights a fault-free run ends with (batches depend only on seed, step and rank)."""
    from conftest import start_operator

    ns = f"e2e-clean-{os.urandom(2).hex()}"
    cluster.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    wait_until(lambda: cluster.api("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default", missing_ok=True))
    thread = start_operator(cluster, operator_token, ns)
    kube = Kube(configure(cluster.server, token=cluster.admin_token, ca_file=str(cluster.ca_file)))
    try:
        clean = Run(cluster, kube, ns, agents, "clean").apply()
        started = time.monotonic()
        clean.wait_done()
        result = clean.result()
        result["wall_seconds"] = time.monotonic() - started
        return result
    finally:
        thread.stop()
        agents.kill_namespace(ns)


def test_clean_run_trains_across_two_nodes(clean_result: dict[str, Any]) -> None:
    assert clean_result["steps"] == STEPS and clean_result["world_size"] == 4


def _same_processes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> bool:
    # Each pod has its own PID namespace: a process is (rank's pod, pid); ranks keep their pod here.
    return sorted(e["pid"] for e in before) == sorted(e["pid"] for e in after)


def test_exception_is_recovered_in_process(run: Run, clean_result: dict[str, Any]) -> None:
    run.apply("--fault", "3:25:exc")
    run.wait_training()
    uids, before = run.pod_uids(), counters(run.job.status())
    status = run.wait_done()
    starts = run.starts()
    first, second = [e for e in starts if e["iteration"] == 0], [e for e in starts if e["iteration"] == 1]
    assert len(first) == 4 and len(second) == 4, starts
    assert _same_processes(first, second)  # the Wrapper restarted the loop in the same processes
    assert {e["step"] for e in second} == {20}  # newest complete checkpoint before step 25
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in run.job.pods()} == uids
    assert counters(status) == before and status.get("restarts", 0) == 0
    assert same_weights(run.result(), clean_result)


def test_sigkill_is_recovered_by_ft_launcher_in_the_same_pod(run: Run, clean_result: dict[str, Any]) -> None:
    # Both layers on: the other ranks restart in process while the launchers start a new round (the race
    # that left NVRx's rank monitors ABORTED before train.Sections.connect spoke at once).
    run.apply("--fault", "3:25:sigkill")
    run.wait_training()
    uids, before = run.pod_uids(), counters(run.job.status())
    status = run.wait_done()
    starts = run.starts()
    fault = next(e for e in run.timeline() if e["event"] == "fault")
    first, last = [e for e in starts if e["t"] < fault["t"]], {e["rank"]: e for e in starts}
    assert len(first) == 4 and len(last) == 4, starts
    # ft_launcher respawned every rank (new processes; the survivors may have restarted in process first)
    assert not {e["pid"] for e in last.values()} & {e["pid"] for e in first}, starts
    assert {e["step"] for e in starts if e["t"] > fault["t"]} == {20}
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in run.job.pods()} == uids
    assert counters(status) == before and status.get("restarts", 0) == 0
    assert same_weights(run.result(), clean_result)


def test_permanent_error_fails_fast_with_its_reason(run: Run) -> None:
    run.apply("--fault", "1:15:nan")
    run.wait_training()
    uids = run.pod_uids()
    started = time.monotonic()
    status = run.job.wait_phase("Failed", timeout=90)
    elapsed = time.monotonic() - started
    assert status["lastFailureReason"] == "PermanentFailure", status
    assert "loss is nan at step 15" in status["lastFailureMessage"]
    assert status.get("restarts", 0) == 0 and len(run.starts()) == 4  # nothing restarted, at no layer
    assert set(uids) >= {p["metadata"]["name"] for p in run.job.pods()}
    codes = {c["state"].get("terminated", {}).get("exitCode") for p in run.job.pods()
             for c in p["status"].get("containerStatuses", [])}
    assert exit_codes.PERMANENT_FAILURE in codes, codes
    print(f"permanent failure: Failed {elapsed:.1f}s after training began")


def test_node_loss_replaces_only_that_pod(run: Run, agents: AgentNodes, clean_result: dict[str, Any]) -> None:
    run.apply()
    run.wait_training()
    pods = run.job.running_pods()
    by_index = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p for p in pods}
    lost_pod, kept_pod = by_index["1"], by_index["0"]
    # Lose the node once a checkpoint is complete, mid-interval.
    wait_until(lambda: max((e["step"] for e in run.timeline() if e["event"] == "step"), default=0) >= 24,
               timeout=90, what="step 24", interval=0.2)
    agent = agents.by_name(lost_pod["spec"]["nodeName"])
    lost_at = time.time()
    agent.stop(lose=True)
    try:
        status = run.wait_done(timeout=200)
    finally:
        agent.start()  # the node comes back for the next test
    now = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p for p in run.job.pods()
           if p["status"].get("phase") == "Succeeded"}
    assert now["0"]["metadata"]["uid"] == kept_pod["metadata"]["uid"]  # node 0's pod was not restarted
    assert now["1"]["metadata"]["uid"] != lost_pod["metadata"]["uid"]
    assert now["1"]["spec"]["nodeName"] not in (lost_pod["spec"]["nodeName"], kept_pod["spec"]["nodeName"])
    assert status.get("disruptions") == 1 and status.get("jobRestarts", 0) == 0, status
    resumed = [e for e in run.starts() if e["t"] > lost_at]
    assert len(resumed) == 4 and {e["step"] for e in resumed} == {20}, resumed
    assert same_weights(run.result(), clean_result)
    print(f"node loss: recovered in {min(e['t'] for e in resumed) - lost_at:.1f}s "
          f"(lastRecoverySeconds {status.get('lastRecoverySeconds')})")


def test_dns_record_of_a_new_pod_appears_within_seconds(cluster: LocalCluster, ns: str, agents: AgentNodes) -> None:
    """`<host>.<subdomain>.<ns>.svc` as an RTJ's pods use it: headless Service, publishNotReadyAddresses,
    the EndpointSlice made by the real endpointslice controller from the pod's IP, served by CoreDNS."""
    cluster.api("POST", f"/api/v1/namespaces/{ns}/services", {
        "apiVersion": "v1", "kind": "Service", "metadata": {"name": "peers"},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": {"app": "dns"}}})
    created = time.monotonic()
    cluster.api("POST", f"/api/v1/namespaces/{ns}/pods", {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p-0", "labels": {"app": "dns"}},
        "spec": {"hostname": "p-0", "subdomain": "peers", "restartPolicy": "Never",
                 "terminationGracePeriodSeconds": 1, "nodeSelector": {AGENT_LABEL: "true"},
                 "tolerations": TOLERATIONS,
                 "containers": [{"name": "c", "image": "none", "command": ["sleep", "60"]}]}})
    address = wait_until(lambda: resolve(f"p-0.peers.{ns}.svc.cluster.local"), timeout=20,
                         what="the pod's DNS record", interval=0.05)
    lag = time.monotonic() - created
    pod = cluster.api("GET", f"/api/v1/namespaces/{ns}/pods/p-0")
    assert address == pod["status"]["podIP"] == agents.by_name(pod["spec"]["nodeName"]).ip
    print(f"DNS: record of a new pod resolvable {lag:.2f}s after the pod was created")
    assert lag < 10


@pytest.mark.slow
def test_hung_rank_is_detected_by_heartbeat_and_respawned_in_the_same_pod(
        run: Run, clean_result: dict[str, Any]) -> None:
    run.apply("--fault", "3:25:hang")
    run.wait_training()
    uids, before = run.pod_uids(), counters(run.job.status())
    status = run.wait_done()
    fault = next(e for e in run.timeline() if e["event"] == "fault")
    resumed = [e for e in run.starts() if e["t"] > fault["t"]]
    assert resumed and {e["step"] for e in resumed} == {20}, resumed
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in run.job.pods()} == uids
    assert counters(status) == before and status.get("restarts", 0) == 0
    assert same_weights(run.result(), clean_result)
    print(f"hang: training resumed {min(e['t'] for e in resumed) - fault['t']:.1f}s after the rank hung "
          f"(heartbeat timeout 15s)")


def test_faults_beyond_the_budgets_fail_with_the_budget_reason(run: Run) -> None:
    run.apply("--fault", "3:15:sigkill", resiliency={**RESILIENCY, "maxLauncherRestarts": 0},
        restartBudget={"maxRestarts": 0, "nodeLossGraceSeconds": 2, "terminatingTimeoutSeconds": 3})
    run.wait_training()
    names = set(run.pod_uids())
    status = run.job.wait_phase("Failed", timeout=120)
    assert status["lastFailureReason"] == "RestartBudgetExhausted", status
    assert "restartBudget.maxRestarts=0" in status["lastFailureMessage"]
    time.sleep(3)  # no loop: nothing new is created once Failed
    assert {p["metadata"]["name"] for p in run.job.pods()} <= names


@pytest.mark.slow
def test_node0_loss_is_recovered_from_the_last_checkpoint(
        run: Run, agents: AgentNodes, clean_result: dict[str, Any]) -> None:
    """Node 0 hosts the rendezvous store: its loss takes the survivors' launcher down with it. Whatever
    the operator does (replace the pod, or restart the gang), training must resume from the newest
    complete checkpoint and be charged to the platform; the figures are printed."""
    run.apply()
    run.wait_training()
    node0 = next(p for p in run.job.running_pods()
                 if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "0")
    wait_until(lambda: max((e["step"] for e in run.timeline() if e["event"] == "step"), default=0) >= 24,
               timeout=90, what="step 24", interval=0.2)
    agent = agents.by_name(node0["spec"]["nodeName"])
    lost_at = time.time()
    agent.stop(lose=True)
    try:
        status = run.wait_done(timeout=200)
    finally:
        agent.start()
    resumed = [e for e in run.starts() if e["t"] > lost_at]
    assert resumed and {e["step"] for e in resumed} == {20}, resumed
    # The survivor's ft_launcher loses the c10d store with node 0 and its pod exits too: one loss, one
    # charge (the operator does not count the survivor's failure again).
    assert (status.get("disruptions"), status.get("jobRestarts", 0), status.get("restarts")) == (1, 0, 1), (
        f"{status}\n" + "\n".join(f"{e.get('lastTimestamp')} {e['reason']}: {e['message']}"
                                   for e in run.job.events()) + f"\n{run.diagnosis()}")
    assert same_weights(run.result(), clean_result)
    print(f"node-0 loss: resumed {min(e['t'] for e in resumed) - lost_at:.1f}s after the loss; "
          f"counters {counters(status)}, restartsByTier {status.get('restartsByTier')}, "
          f"last failure {status.get('lastFailureReason')}: {status.get('lastFailureMessage')}")
