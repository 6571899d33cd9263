"""End to end: RTJs applied with kubectl, driven by the real operator, training for real in pods that
local node agents (hack/rtj_dev/nodeagent.py) run as processes, 2 nodes x 2 CPU ranks with gloo,
peers found through CoreDNS, checkpoints on one shared directory (the PVC standing in for FSx).

Each fault must be recovered by the right layer: an exception in process, a SIGKILL by ft_launcher
in the same pod, a lost node by a hot spare (or the operator replacing that one pod); a permanent error
fails fast. The pods run NVRx 0.6, the production image's version (`make nvrx06`; RTJ_AGENT_NVRX).
Needs root (network and mount namespaces); marked `e2e`.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from clusterkit import Job, kubectl, wait_passes, worker_rbac
from rtj_dev.cpu_rtj import RESILIENCY, TOLERATIONS, cpu_rtj, shared_dir
from rtj_dev.localcluster import LocalCluster
from rtj_dev.nodeagent import AGENT_LABEL, AgentNodes, resolve
from rtj_dev.slowfs import FSX_BPS
from rtj_operator.kube import Kube, configure
from rtj_worker import events, exit_codes
from rtj_worker.report import CONDITION
from testkit import ROOT, wait_until

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240),
              pytest.mark.skipif(os.geteuid() != 0, reason="node agents need root (netns, mounts)")]

STEPS, INTERVAL = 60, 10


@pytest.fixture(scope="module")
def agents(cluster: LocalCluster) -> Iterator[AgentNodes]:
    """Three agent nodes (two for the gang, one spare for a replacement) and CoreDNS; their pods import
    NVRx 0.6 from RTJ_AGENT_NVRX (the Makefile sets it; .nvrx06 otherwise)."""
    nvrx = Path(os.environ.get("RTJ_AGENT_NVRX") or ROOT / ".nvrx06")
    if not (nvrx / "nvidia_resiliency_ext").is_dir():
        pytest.fail(f"NVRx 0.6 is missing at {nvrx}: run `make nvrx06` (the e2e tests run the production version)")
    os.environ["RTJ_AGENT_NVRX"] = str(nvrx)
    nodes = AgentNodes(cluster, 3).start()
    try:
        yield nodes
    finally:
        nodes.stop()


class Run:
    """One applied RTJ and what it left on the shared directory."""

    def __init__(self, cluster: LocalCluster, kube: Kube, ns: str, agents: AgentNodes, name: str = "train"):
        self.cluster, self.job, self.name, self.ns, self.agents = cluster, Job(kube, ns, name), name, ns, agents
        self.events_path: Path | None = None  # the ranks' event log, when not on the shared volume

    def apply(self, *train_args: str, steps: int = STEPS, **spec: Any) -> Run:
        # The pods publish their live reports with the chart's rtj-worker ServiceAccount (worker_rbac).
        spec.setdefault("serviceAccountName", "rtj-worker")
        manifest = yaml.safe_dump(cpu_rtj(self.ns, self.name, list(train_args), steps, INTERVAL, **spec))
        kubectl(self.cluster, "apply", "-f", "-", input=manifest)
        return self

    def shared_dir(self) -> Path:
        return shared_dir(self.cluster, self.ns, self.name) or Path("/nonexistent")  # not provisioned yet

    def timeline(self) -> list[dict[str, Any]]:
        return events.read(self.events_path or self.shared_dir() / "events.jsonl")

    def starts(self) -> list[dict[str, Any]]:
        return [e for e in self.timeline() if e["event"] == "start"]

    def result(self) -> dict[str, Any]:
        return json.loads((self.shared_dir() / "result.json").read_text())

    def story(self) -> str:
        """What a weights mismatch needs: every start, fault, stop checkpoint and done, in order."""
        keep = ("start", "fault", "stop_requested", "stop_checkpoint", "stopped", "checkpoint_skipped", "done")
        return "\n".join(json.dumps(e) for e in self.timeline() if e["event"] in keep)

    def pod_uids(self) -> dict[str, str]:
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in self.job.running_pods()}

    def wait_training(self, timeout: float = 150) -> None:
        """Until every rank has made a step (rendezvous done, pods found each other by DNS)."""
        self._wait(lambda: {e["rank"] for e in self.timeline() if e["event"] == "step"} == {0, 1, 2, 3},
                   timeout, "all four ranks training")

    def wait_step(self, step: int, timeout: float = 90) -> None:
        """Until some rank has made `step` (e.g. a checkpoint is complete and the next interval began)."""
        wait_until(lambda: max((e["step"] for e in self.timeline() if e["event"] == "step"), default=0) >= step,
                   timeout=timeout, what=f"step {step}", interval=0.2)

    def lose_node_of(self, pod: dict[str, Any]) -> tuple[Any, float]:
        """Terminate the agent running `pod`: its processes die and its Node is deleted (fenced), as on
        EKS. Returns the agent (to start again) and when it was lost."""
        agent = self.agents.by_name(pod["spec"]["nodeName"])
        lost_at = time.time()
        agent.terminate()
        return agent, lost_at

    def suspend(self, stop_timeout: float = 90) -> set[int | None]:
        """spec.suspend: the phase Suspended and every process of the job stopped; the pods' exit codes."""
        self.job.patch({"suspend": True})
        self.job.wait_phase("Suspended", timeout=60)
        wait_until(lambda: not self.agents.running(self.ns), timeout=stop_timeout, what="every process stopped")
        return {c["state"].get("terminated", {}).get("exitCode") for p in self.job.pods()
                for c in p["status"].get("containerStatuses", [])}

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
        status = self.job.status()
        conditions = {c["type"]: f"{c['status']} {c['reason']}: {c['message'][:200]}"
                      for c in status.pop("conditions", [])}
        events = sorted(self.job.events(), key=lambda e: e.get("lastTimestamp") or "")
        # The charge first: the rest of status (progress, goodput) may be cut.
        charged = {k: status.pop(k) for k in ("attempt", "jobRestarts", "disruptions", "lastFailureReason",
                                               "lastFailureMessage", "restartsByTier") if k in status}
        lines = [f"RTJ charges: {json.dumps(charged)}", f"RTJ status: {json.dumps(status)[:1500]}",
                 f"conditions: {json.dumps(conditions, indent=1)}",
                 "events:", *[f"  {e.get('lastTimestamp')} {e['involvedObject'].get('kind')} {e['reason']}: "
                              f"{e['message'][:300]}" for e in events[-30:]]]
        for agent in self.agents.agents:
            for box in list(agent.sandboxes.values()):
                if box.pod["metadata"]["namespace"] != self.ns:
                    continue
                log = box.dir / "container.log"
                tail = [line[:300] for line in (log.read_text(errors="replace").splitlines() if log.exists() else [])
                        if not any(n in line for n in noise)][-25:]
                lines += [f"--- pod {box.pod['metadata']['name']} on {agent.name}, exit {box.exit_code()}:", *tail]
        return "\n".join(lines)


    def recoveries(self) -> str:
        """What a wrong recovery count needs: each pod's report (its termination message or its live
        condition) and the lines of its launcher and ranks that decide whose restart it was."""
        keys = ("Worker group", "failed (exitcode", "left", "heartbeat", "Joining", "new nodes", "Round", "fn_ex")
        lines = []
        for pod in self.job.pods():
            state = ((pod["status"].get("containerStatuses") or [{}])[0].get("state") or {})
            report = (state.get("terminated") or {}).get("message") or next(
                (c.get("message") for c in pod["status"].get("conditions", []) if c["type"] == CONDITION), "")
            lines.append(f"--- pod {pod['metadata']['name']}: {report}")
        for agent in self.agents.agents:
            for box in list(agent.sandboxes.values()):
                log = box.dir / "container.log"
                if box.pod["metadata"]["namespace"] == self.ns and log.exists():
                    lines.append(f"--- {box.pod['metadata']['name']} on {agent.name}:")
                    lines += [line[:300] for line in log.read_text(errors="replace").splitlines()
                              if any(k in line for k in keys) and "eartbeat sent" not in line]
        return "\n".join(lines)


def _fail(run: Run) -> bool:
    raise AssertionError(f"RTJ ended {run.job.status()}\n{run.diagnosis()}")


def same_weights(result: dict[str, Any], clean: dict[str, Any]) -> bool:
    # gloo's allreduce between nodes does not fix the summation order, so the last bits of a sum
    # may differ from run to run (~1e-11 relative); resuming from a wrong step differs by ~1e-4.
    return result["steps"] == clean["steps"] and result["checksum"] == pytest.approx(clean["checksum"], rel=1e-9)


def counters(status: dict[str, Any]) -> dict[str, Any]:
    """What the operator did and charged; the pods' own tiers (InProcess, Launcher) are in_pod()'s."""
    by_tier = status.get("restartsByTier") or {}
    return {"operatorRestarts": by_tier.get("ReplacePod", 0) + by_tier.get("GangRestart", 0),
            **{k: status.get(k, 0) for k in ("jobRestarts", "disruptions", "attempt")}}


def in_pod(status: dict[str, Any]) -> dict[str, int]:
    """The recoveries the pods reported (issue 16): live, on their own status (the agents mount a bound
    token and relay the API server as on EKS), and in their termination messages."""
    by_tier = status.get("restartsByTier") or {}
    return {tier: by_tier.get(tier, 0) for tier in ("InProcess", "Launcher")}


@pytest.fixture
def run(cluster: LocalCluster, kube: Kube, ns: str, agents: AgentNodes, operator: Any) -> Iterator[Run]:
    worker_rbac(cluster, ns)
    yield Run(cluster, kube, ns, agents)
    agents.kill_namespace(ns)  # the next test starts on idle nodes


@pytest.fixture(scope="module")
def clean_result(cluster: LocalCluster, agents: AgentNodes, operator_token: str) -> dict[str, Any]:
    """The weights a fault-free run ends with (batches depend only on seed, step and rank)."""
    from clusterkit import start_operator

    ns = f"e2e-clean-{os.urandom(2).hex()}"
    cluster.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    wait_until(lambda: cluster.api("GET", f"/api/v1/namespaces/{ns}/serviceaccounts/default", missing_ok=True))
    thread = start_operator(cluster, operator_token, ns)
    worker_rbac(cluster, ns)
    kube = Kube(configure(cluster.server, token=cluster.admin_token, ca_file=str(cluster.ca_file)))
    try:
        clean = Run(cluster, kube, ns, agents, "clean").apply()
        started = time.monotonic()
        clean.wait_done()
        result = clean.result()
        result["wall_seconds"] = time.monotonic() - started
        # Each pod's conditions after its last status write, the agent's for the ended container: the
        # worker's own rtj.dev/Progress must be among them (kept as a kubelet keeps foreign conditions).
        result["pod_conditions"] = {p["metadata"]["name"]: {c["type"]: c.get("reason", "")
                                                             for c in p["status"].get("conditions", [])}
                                    for p in clean.job.pods()}
        result["launch_lines"] = [line for a in agents.agents for box in list(a.sandboxes.values())
                                  if box.pod["metadata"]["namespace"] == ns and (box.dir / "container.log").exists()
                                  for line in (box.dir / "container.log").read_text(errors="replace").splitlines()
                                  if "starting: " in line]
        return result
    finally:
        thread.stop()
        agents.kill_namespace(ns)


def test_clean_run_trains_across_two_nodes(clean_result: dict[str, Any]) -> None:
    assert clean_result["steps"] == STEPS and clean_result["world_size"] == 4
    # Each pod's ft_launcher ran NVRx 0.6's barrier rendezvous (the entrypoint picks flags by version).
    assert len(clean_result["launch_lines"]) == 2, clean_result["launch_lines"]
    assert all("--ft-rdzv-impl=barrier" in line for line in clean_result["launch_lines"])
    conditions = clean_result["pod_conditions"]
    assert len(conditions) == 2 and all({"Ready", CONDITION} <= set(c) for c in conditions.values()), conditions


def _same_processes(before: list[dict[str, Any]], after: list[dict[str, Any]]) -> bool:
    # Each pod has its own PID namespace: a process is (rank's pod, pid); ranks keep their pod here.
    return sorted(e["pid"] for e in before) == sorted(e["pid"] for e in after)


def test_exception_is_recovered_in_process(run: Run, clean_result: dict[str, Any]) -> None:
    # Slower steps: ~10 s of training after the recovery, for the live report to reach the status first.
    run.apply("--fault", "3:25:exc", step_seconds=0.3)
    run.wait_training()
    uids, before = run.pod_uids(), counters(run.job.status())
    # Live (issue 16): the pod's report puts the recovery in the RTJ's status while it still trains. Waited
    # for with the phase Running: a phase that reads Pending for a moment while the pods train (CI run 11:
    # the agents' status of the new pods lagging their processes, "0/2 nodes ready") is the API's view.
    def counted_or_ended() -> dict[str, Any] | None:
        status = run.job.status()
        counted = in_pod(status)["InProcess"] and status.get("phase") == "Running"
        return status if counted or status.get("phase") in ("Succeeded", "Failed") else None

    live = run._wait(counted_or_ended, 90, "the in-process restart in the status")
    assert live["phase"] == "Running", live  # not only from the termination messages, after the end
    assert live["progress"]["step"] >= 20 and live["lastRecovery"]["tier"] == "InProcess", live
    status = run.wait_done()
    starts = run.starts()
    first, second = [e for e in starts if e["iteration"] == 0], [e for e in starts if e["iteration"] == 1]
    assert len(first) == 4 and len(second) == 4, starts
    assert _same_processes(first, second)  # the Wrapper restarted the loop in the same processes
    assert {e["step"] for e in second} == {20}  # newest complete checkpoint before step 25
    # Issue 31: restored from the ranks' own memory, not the volume, and the status says so.
    assert {e["source"] for e in second} == {"memory"}, second
    assert status["lastRecovery"]["restoredFrom"] == "memory", status["lastRecovery"]
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in run.job.pods()} == uids
    assert counters(status) == before and in_pod(status) == {"InProcess": 1, "Launcher": 0}, \
        f"{status}\n{run.recoveries()}"
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
    assert {e["source"] for e in last.values()} == {"node"}, last  # respawned ranks: their node's /dev/shm
    assert {p["metadata"]["name"]: p["metadata"]["uid"] for p in run.job.pods()} == uids
    assert counters(status) == before and in_pod(status)["Launcher"] == 1, f"{status}\n{run.recoveries()}"
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


def test_a_typo_in_a_users_command_ends_failed_with_its_traceback(run: Run) -> None:
    """Issue 28.2: a command whose import fails showed Running while each pod spent ft_launcher's 20
    restarts and the operator its 3 (164 s), and the error was only in the pods' logs."""
    started = time.monotonic()
    run.apply(command=["python", "-c", "import flash_attn_typo"], args=[])
    status = run.job.wait_phase("Failed", timeout=150)
    elapsed = time.monotonic() - started
    failed = run.job.condition("Failed")
    assert failed["reason"] == "CrashLoop", status
    assert "ModuleNotFoundError: No module named 'flash_attn_typo'" in failed["message"], failed
    assert "its last lines: Traceback (most recent call last):" in failed["message"], failed
    assert status.get("jobRestarts", 0) <= 1, status  # the first pod's loop, then the second's confirms it
    # Its pods were ready, its ranks never started: never shown Running (it was RanksStarting meanwhile).
    uid = run.job.body()["metadata"]["uid"]
    assert not [e for e in run.job.events() if e["involvedObject"].get("uid") == uid and e["reason"] == "Running"], \
        run.job.explain()
    print(f"a typo in the command: Failed {elapsed:.1f} s after kubectl apply")


def test_node_loss_replaces_only_that_pod(run: Run, agents: AgentNodes, clean_result: dict[str, Any]) -> None:
    run.apply()
    run.wait_training()
    pods = run.job.running_pods()
    by_index = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p for p in pods}
    lost_pod, kept_pod = by_index["1"], by_index["0"]
    run.wait_step(24)  # lose the node once a checkpoint is complete, mid-interval
    agent, lost_at = run.lose_node_of(lost_pod)
    try:
        status = run.wait_done(timeout=200)
    finally:
        agent.start()  # the node comes back for the next test
    now = {p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"]: p for p in run.job.pods()
           if p["status"].get("phase") == "Succeeded"}
    assert now["0"]["metadata"]["uid"] == kept_pod["metadata"]["uid"]  # node 0's pod was not restarted
    assert now["1"]["metadata"]["uid"] != lost_pod["metadata"]["uid"]
    assert now["1"]["spec"]["nodeName"] not in (lost_pod["spec"]["nodeName"], kept_pod["spec"]["nodeName"])
    assert status.get("disruptions") == 1 and status.get("jobRestarts", 0) == 0, run.diagnosis()
    # Counted once, where it happened: the survivor's ranks left for the lost peer (no Launcher restart).
    assert in_pod(status) == {"InProcess": 0, "Launcher": 0}, f"{status}\n{run.recoveries()}"
    resumed = [e for e in run.starts() if e["t"] > lost_at]
    assert len(resumed) == 4 and {e["step"] for e in resumed} == {20}, resumed
    # The survivor kept its slot and restored from its node; the replacement fetched its ranks' copies from
    # the survivor (the next node in the ring held them): no rank read the volume.
    assert {e["host"]: e["source"] for e in resumed} == {kept_pod["spec"]["hostname"]: "node",
                                                        lost_pod["spec"]["hostname"]: "peer"}, resumed
    assert same_weights(run.result(), clean_result)
    print(f"node loss: recovered in {min(e['t'] for e in resumed) - lost_at:.1f}s "
          f"(lastRecoverySeconds {status.get('lastRecoverySeconds')})")


def test_node_loss_with_a_spare_is_recovered_in_job_before_any_replacement_exists(
        run: Run, agents: AgentNodes, clean_result: dict[str, Any]) -> None:
    """nodes.spares=1: three pods on the three nodes, NVRx 0.6's barrier makes two of them train and keeps
    the third standing by. Losing an active node (node 0 when it is active: the coordinator holds the
    stores) moves its ranks to the standby in ft_launcher's next round, with the same world size; the
    lost index's replacement finds no node (all three are gone or busy) and the job finishes without it.
    Placed only once a trainer's exit freed a node, it is then stopped by the Job controller (the success
    rule met), which is charged to nobody."""
    run.apply(nodes={"count": 2, "spares": 1})
    run.wait_training()
    wait_until(lambda: len(run.job.running_pods()) == 3, timeout=30, what="three pods running")
    active = {e["host"] for e in run.starts()}
    pods = {p["spec"]["hostname"]: p for p in run.job.running_pods()}
    assert len(active) == 2 and len(set(pods) - active) == 1, (active, sorted(pods))
    assert run.job.status().get("standbys") == 1
    node_0 = f"{run.job.job()['metadata']['name']}-0"
    lost = pods[node_0] if node_0 in active else pods[sorted(active)[0]]
    standby = (set(pods) - active).pop()
    run.wait_step(24)
    agent, lost_at = run.lose_node_of(lost)
    try:
        resumed = run._wait(lambda: (r := [e for e in run.starts() if e["t"] > lost_at]) and len(r) == 4 and r,
                            90, "four ranks resumed")
        replacements = [p for p in run.job.pods() if p["metadata"]["uid"] != lost["metadata"]["uid"]
                        and p["spec"].get("hostname") == lost["spec"]["hostname"]]
        # Training resumed in-job: the standby's ranks joined and no replacement pod runs.
        assert standby in {e["host"] for e in resumed} and {e["step"] for e in resumed} == {20}, resumed
        assert {e["source"] for e in resumed if e["host"] == standby} == {"peer"}, resumed  # its slot's copies
        assert {e["source"] for e in resumed if e["host"] != standby} == {"node"}, resumed
        assert not [p for p in replacements if p["status"].get("phase") == "Running"], replacements
        status = run.wait_done(timeout=200)
    finally:
        agent.start()  # the node comes back for the next test
    assert status.get("disruptions") == 1 and status.get("jobRestarts", 0) == 0, run.diagnosis()
    assert in_pod(status) == {"InProcess": 0, "Launcher": 0}, f"{status}\n{run.recoveries()}"
    assert same_weights(run.result(), clean_result)
    print(f"node loss with a spare: training resumed {min(e['t'] for e in resumed) - lost_at:.1f}s after the loss "
          f"on the standby {standby} (lost {lost['spec']['hostname']}); counters {counters(status)}")


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


# A pod's connection attempt: exit 0 if a TCP connection to HOST:PORT opens within 3 s, 1 if not.
PROBE = ("import socket, sys\ntry:\n    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()\n"
         "except OSError as exc:\n    sys.exit(f'no connection: {exc}')")


def test_a_pod_outside_the_job_cannot_reach_its_rendezvous(run: Run, cluster: LocalCluster, agents: AgentNodes,
                                                           clean_result: dict[str, Any]) -> None:
    """Issue 30.1: the RTJ's NetworkPolicy (spec.isolation, on by default) enforced by the agents'
    stand-in engine (hack/rtj_dev/netpol.py: a simulation; the VPC CNI's agent, Calico and Cilium cannot
    run here). The job trains to the clean run's weights under it (its own workers, coordinator and
    stores admitted); a pod of another namespace, on a node of its own, cannot open a connection to the
    coordinator's rendezvous port, until spec.isolation.allowFrom names its namespace."""
    enforcer = agents.enforce_network_policies()
    outsiders = f"{run.ns}-nosy"[:63]
    cluster.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": outsiders}})
    try:
        run.apply()
        run.wait_training()
        coordinator = run.job.coordinator()
        assert coordinator is not None
        env = {e["name"]: e.get("value") for e in (run.job.job() or {})["spec"]["template"]["spec"]["containers"][0]
               ["env"]}
        port = env["RTJ_RDZV_ENDPOINT"].rsplit(":", 1)[1]
        host = coordinator["status"]["podIP"]
        used = {p["spec"]["nodeName"] for p in run.job.pods()} | {coordinator["spec"]["nodeName"]}
        free = next(a for a in agents.agents if a.name not in used)
        wait_until(lambda: cluster.api("GET", f"/api/v1/namespaces/{outsiders}/serviceaccounts/default",
                                       missing_ok=True), what="default ServiceAccount")

        def probe(name: str) -> str:
            cluster.api("POST", f"/api/v1/namespaces/{outsiders}/pods", {
                "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                "spec": {"nodeName": free.name, "restartPolicy": "Never", "terminationGracePeriodSeconds": 1,
                         "tolerations": TOLERATIONS, "containers": [{"name": "c", "image": "none", "command": [
                             sys.executable, "-c", PROBE, host, port]}]}})

            def ended() -> str | None:
                phase = cluster.api("GET", f"/api/v1/namespaces/{outsiders}/pods/{name}")["status"].get("phase")
                return phase if phase in ("Succeeded", "Failed") else None
            return wait_until(ended, timeout=30, what=f"probe {name}", interval=0.2)

        assert probe("blocked") == "Failed"  # the connection never opened
        run.job.patch({"isolation": {"enabled": True, "allowFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": outsiders}}}]}})
        attempt = iter(range(100))
        wait_until(lambda: probe(f"admitted-{next(attempt)}") == "Succeeded", timeout=60,
                   what="a probe admitted once allowFrom names its namespace")
        status = run.wait_done()
        assert status.get("jobRestarts", 0) == 0 and status.get("disruptions", 0) == 0, status
        assert same_weights(run.result(), clean_result)
    finally:
        enforcer.stop()
        agents.kill_namespace(outsiders)


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
    assert counters(status) == before and in_pod(status)["Launcher"] == 1, f"{status}\n{run.recoveries()}"
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
    wait_passes(3, "passes of the Failed job")  # no loop: nothing new is created once Failed
    assert {p["metadata"]["name"] for p in run.job.pods()} <= names


@pytest.mark.slow
def test_node0_loss_is_recovered_from_the_last_checkpoint(
        run: Run, agents: AgentNodes, clean_result: dict[str, Any]) -> None:
    """Issue 19.2: node 0 hosts nothing (the coordinator pod holds the stores), so losing it is losing any
    node: only its pod is replaced (no gang restart, node 1's pod keeps running), one disruption is
    charged to the platform, and training resumes from the newest complete checkpoint; the figures are
    printed."""
    run.apply()
    run.wait_training()
    node0 = next(p for p in run.job.running_pods()
                 if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "0")
    node1 = next(p for p in run.job.running_pods()
                 if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1")
    run.wait_step(24)
    agent, lost_at = run.lose_node_of(node0)
    try:
        status = run.wait_done(timeout=200)
    finally:
        agent.start()
    resumed = [e for e in run.starts() if e["t"] > lost_at]
    assert resumed and {e["step"] for e in resumed} == {20}, resumed
    # One loss, one charge, one pod replaced: the survivor's launcher restarts its ranks and waits in the
    # coordinator's rendezvous for node 0's replacement (no exit, no gang restart).
    by_tier = status.get("restartsByTier") or {}
    charged = (status.get("disruptions"), status.get("jobRestarts", 0), by_tier.get("ReplacePod", 0),
               by_tier.get("GangRestart", 0), status.get("attempt"))
    assert charged == (1, 0, 1, 0, 1), (
        f"{status}\n" + "\n".join(f"{e.get('lastTimestamp')} {e['reason']}: {e['message']}"
                                   for e in run.job.events()) + f"\n{run.diagnosis()}")
    now1 = [p for p in run.job.pods()
            if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1"]
    assert [p["metadata"]["uid"] for p in now1] == [node1["metadata"]["uid"]], now1  # node 1's pod kept running
    assert same_weights(run.result(), clean_result)
    print(f"node-0 loss: resumed {min(e['t'] for e in resumed) - lost_at:.1f}s after the loss; "
          f"counters {counters(status)}, restartsByTier {status.get('restartsByTier')}, "
          f"last failure {status.get('lastFailureReason')}: {status.get('lastFailureMessage')}")


# --- issue 17: what the platform does, with real ft_launcher ---------------------------------------------
def newest_checkpoint(run: Run) -> int:
    from rtj_worker.ckpt_index import latest_step
    return latest_step(run.shared_dir(), run.job.body()["metadata"]["uid"]) or 0


def test_suspend_and_resume_keep_every_counter_and_resume_from_the_newest_checkpoint(
        run: Run, clean_result: dict[str, Any]) -> None:
    """Measured before: suspending a training RTJ moved jobRestarts 0 -> 1 (ft_launcher turns SIGTERM
    into exit 1, the entrypoint mapped that to 70). Now each pod exits 143 after its ranks saved."""
    run.apply()
    run.wait_training()
    run.wait_step(24)
    before = counters(run.job.status())
    codes = run.suspend()
    assert codes <= {exit_codes.SIGTERM}, codes
    saved = newest_checkpoint(run)
    assert saved >= 24, saved  # the ranks saved the step they had reached
    suspended_at = time.time()
    run.job.patch({"suspend": False})
    status = run.wait_done()
    resumed = [e for e in run.starts() if e["t"] > suspended_at]
    assert resumed and {e["step"] for e in resumed} == {saved}, resumed
    assert counters(status) == before, (status, before)
    assert same_weights(run.result(), clean_result)


# State of real size: each checkpoint writes as a 6 GB one would on the example's FSx for Lustre (~300 MB/s,
# so ~20 s: longer than the in-process hard timeout), through the node agents' slow volume (hack/slowfs).
# Reads are not slowed here: the kernel reads ahead whole small files at every open, and the scale makes
# that a read of tens of GB per tensor (a load's time is issue 31's measure, not this test's).
SLOW = {"write_bps": FSX_BPS, "read_bps": 0, "scale": 6e9 / 100e3}  # the e2e model's ~100 kB state
SLOW_RESILIENCY = {**RESILIENCY, "heartbeatTimeoutSeconds": 60, "initialHeartbeatTimeoutSeconds": 120,
                   "terminationGracePeriodSeconds": 90}


@pytest.mark.timeout(480)
def test_a_suspend_during_a_slow_save_commits_it_and_resumes_from_it(run: Run) -> None:
    """Issue 27.1: a stop (a suspend here; a drain is the same SIGTERM) while a save takes minutes. The
    in-flight save is finished within the grace period and committed, the pods exit 143, nothing is
    charged, and the resumed gang starts from that step: nothing committed is lost."""
    run.agents.slow.want(run.ns, "train-ckpt", **SLOW)
    # The ranks' event log off the slow volume (its scale would make each line weigh megabytes): the
    # pods are processes here, and see the host's paths.
    run.events_path = run.agents.workdir / f"{run.ns}-events.jsonl"
    run.apply(steps=5000, resiliency=SLOW_RESILIENCY,
              env=[{"name": "RTJ_EVENT_LOG", "value": str(run.events_path)}, {"name": "TORCH_CPP_LOG_LEVEL",
                                                                             "value": "ERROR"}])
    run.wait_training(timeout=240)
    wait_until(lambda: newest_checkpoint(run) >= INTERVAL, timeout=180, what="the first slow checkpoint")
    first = newest_checkpoint(run)
    wait_until(lambda: run.job.status().get("progress", {}).get("checkpointWriteSeconds"), timeout=60,
               what="the checkpoint's write time in status")
    written = run.job.status()["progress"]["checkpointWriteSeconds"]
    assert written > SLOW_RESILIENCY["inProcessRestart"]["hardTimeoutSeconds"], written
    run.wait_step(first + 2 * INTERVAL)  # the next save is being written (a save is due every 10 steps)
    before = counters(run.job.status())
    codes = run.suspend(stop_timeout=120)
    # A pod the Job controller removed before its end was reported shows none (CI run 4, under load).
    assert codes - {None} <= {exit_codes.SIGTERM}, codes
    saved = newest_checkpoint(run)
    assert saved > first, (saved, first, run.story())  # the save in flight when the stop came, committed
    suspended_at = time.time()
    run.job.patch({"suspend": False})
    wait_until(lambda: [e for e in run.starts() if e["t"] > suspended_at], timeout=240, what="the resumed gang")
    resumed = [e for e in run.starts() if e["t"] > suspended_at]
    assert {e["step"] for e in resumed} == {saved}, resumed
    assert counters(run.job.status()) == before, (run.job.status(), before)
    print(f"slow volume: a checkpoint took {written:.1f} s to write; suspended while step {saved}'s was "
          "in flight: committed, resumed from it")


@pytest.mark.timeout(600)
def test_an_unhealthy_node_on_a_slow_volume_is_replaced_with_the_rendezvous_kept_open(
        run: Run, clean_result: dict[str, Any]) -> None:
    """Issue 27.3 end to end, on the real-size volume (27.1): a rank asks NVRx to exclude its node (what a
    failed GPU or NIC health check leads to) while each save takes tens of seconds. NVRx's barrier counts
    unhealthy nodes over the rendezvous' life; without the headroom the operator gives it, the survivor's
    launcher found the rendezvous closed (78) and the whole gang restarted. Now the node's pod exits 73
    (the platform's: one disruption), the operator replaces it, the survivor waits in its next round for
    the replacement, and training ends with a fault-free run's weights."""
    run.agents.slow.want(run.ns, "train-ckpt", **SLOW)
    run.events_path = run.agents.workdir / f"{run.ns}-events.jsonl"  # off the slow volume (see above)
    run.apply("--fault", "2:15:unhealthy", resiliency=SLOW_RESILIENCY,
              env=[{"name": "RTJ_EVENT_LOG", "value": str(run.events_path)},
                   {"name": "TORCH_CPP_LOG_LEVEL", "value": "ERROR"}])
    status = run.wait_done(timeout=540)
    assert (status.get("disruptions"), status.get("jobRestarts", 0)) == (1, 0), run.diagnosis()
    assert status.get("lastFailureReason") == "NodeUnhealthy", run.diagnosis()
    assert (status.get("restartsByTier") or {}).get("GangRestart", 0) == 0, run.diagnosis()  # kept open
    assert status.get("attempt", 1) == 1, run.diagnosis()
    written = (status.get("progress") or {}).get("checkpointWriteSeconds") or 0
    assert written > SLOW_RESILIENCY["inProcessRestart"]["hardTimeoutSeconds"], status.get("progress")
    assert same_weights(run.result(), clean_result), run.story()
    print(f"slow volume: a checkpoint took {written:.1f} s to write; an unhealthy node's pod was replaced "
          "and the survivor's rendezvous stayed open")


@pytest.mark.timeout(420)
def test_deleting_a_training_pod_is_one_disruption(run: Run, clean_result: dict[str, Any]) -> None:
    run.apply()
    run.wait_training()
    pod = next(p for p in run.job.running_pods()
               if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1")
    kubectl(run.cluster, "delete", "pod", "-n", run.ns, pod["metadata"]["name"], "--wait=false")
    status = run.wait_done(timeout=360)
    assert (status.get("disruptions"), status.get("jobRestarts", 0)) == (1, 0), run.diagnosis()
    assert status.get("lastFailureReason") == "PodDeleted", run.diagnosis()
    assert same_weights(run.result(), clean_result), run.story()


def set_node_condition(cluster: LocalCluster, node: str, status: str, reason: str, message: str) -> None:
    """The EKS node monitoring agent's AcceleratedHardwareReady condition, as it writes it."""
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cluster.api("PATCH", f"/api/v1/nodes/{node}/status", {"status": {"conditions": [{
        "type": "AcceleratedHardwareReady", "status": status, "reason": reason, "message": message,
        "lastHeartbeatTime": now, "lastTransitionTime": now}]}}, content_type="application/strategic-merge-patch+json")


def test_a_node_its_health_agent_reports_bad_loses_its_pod_at_once_and_is_excluded(
        run: Run, agents: AgentNodes, clean_result: dict[str, Any]) -> None:
    """Issue 18.2 on node-agent nodes: the EKS node monitoring agent's AcceleratedHardwareReady=False
    (here patched onto the Node, which the agent's own status writes keep, as a kubelet keeps foreign
    conditions) on a Ready node that trains. The operator evicts that pod at once (no grace for a node
    that is not lost), charges the platform, keeps the node out of the job's placement, and the
    replacement trains on the third node with the weights of a fault-free run."""
    run.apply()
    run.wait_training()
    pod = next(p for p in run.job.running_pods()
               if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1")
    bad = pod["spec"]["nodeName"]
    reported_at = time.time()
    set_node_condition(run.cluster, bad, "False", "NvidiaXID79Error", "GPU has fallen off the bus")
    try:
        status = run.wait_done(timeout=240)
    finally:
        set_node_condition(run.cluster, bad, "True", "Healthy", "")
    assert (status.get("disruptions"), status.get("jobRestarts", 0)) == (1, 0), run.diagnosis()
    assert status.get("lastFailureReason") == "NodeUnhealthy", status
    assert "NvidiaXID79Error" in (status.get("lastFailureMessage") or ""), status
    assert [e["node"] for e in status.get("excludedNodes") or []] == [bad], status
    assert any(e["reason"] == "NodeExcluded" and bad in e["message"] for e in run.job.events()), run.diagnosis()
    index1 = [p for p in run.job.pods()
              if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1"]
    assert {p["spec"]["nodeName"] for p in index1 if p["metadata"]["uid"] != pod["metadata"]["uid"]} \
        and bad not in {p["spec"]["nodeName"] for p in index1 if p["metadata"]["uid"] != pod["metadata"]["uid"]}
    resumed = [e for e in run.starts() if e["t"] > reported_at]
    assert len(resumed) == 4, resumed
    assert same_weights(run.result(), clean_result), run.story()


def live_processes_of_index(agents: AgentNodes, ns: str, index: str) -> list[tuple[str, str]]:
    """(node, pod) for every live process tree of the job's pods of `index`, on every node."""
    return [(agent.name, box.pod["metadata"]["name"]) for agent in agents.agents
            for uid, box in list(agent.sandboxes.items())
            if box.pod["metadata"]["namespace"] == ns and uid in agent.processes()
            and box.pod["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == index]


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_a_partitioned_node_never_yields_two_processes_of_one_rank(run: Run, agents: AgentNodes) -> None:
    """Issue 17.3, measured before: a node that lost the API server but kept its processes got a
    replacement pod of its index 17 s later, and both ran as node rank 1 for the remaining 103 s. Now
    nothing replaces it until the node is fenced; then (shut down, tainted out-of-service) it is."""
    run.apply(steps=400)
    run.wait_training()
    pod = next(p for p in run.job.running_pods()
               if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1")
    agent = agents.by_name(pod["spec"]["nodeName"])
    agent.partition()
    try:
        waiting = wait_until(lambda: run.job.condition("WaitingForFencing") if run.job.condition(
            "WaitingForFencing").get("status") == "True" else None, timeout=90, what="WaitingForFencing")
        assert agent.name in waiting["message"]
        step_then = max(e["step"] for e in run.timeline() if e["event"] == "step")

        def one_process_of_index_1_until(deadline: float) -> bool:
            live = live_processes_of_index(agents, run.ns, "1")
            assert len(live) <= 1, live
            return time.monotonic() >= deadline

        # A time wait: past every grace period and timeout the RTJ sets (and the 17 s after which a
        # replacement came before), while the partitioned ranks keep training; then passes after it.
        deadline = time.monotonic() + 40
        wait_until(lambda: one_process_of_index_1_until(deadline), timeout=50, what="40 s of partition",
                   interval=1)
        wait_passes(2, "passes after 40 s of partition")
        one_process_of_index_1_until(0)
        # The ranks kept training all along: the control plane lost the node, the job did not.
        assert max(e["step"] for e in run.timeline() if e["event"] == "step") > step_then
        assert run.job.status().get("jobRestarts", 0) == 0
        agent.stop(lose=True)  # now it is shut down for good ...
        run.cluster.fence_node(agent.name)  # ... and said so: its pod is replaced
        replaced = wait_until(lambda: [p for p in run.job.running_pods() if p["metadata"]["annotations"][
            "batch.kubernetes.io/job-completion-index"] == "1" and p["metadata"]["uid"] != pod["metadata"]["uid"]],
            timeout=120, what="index 1 replaced")
        assert replaced[0]["spec"]["nodeName"] != agent.name
        status = run.job.status()
        assert status.get("jobRestarts", 0) == 0 and status.get("disruptions") == 1, status
    finally:
        agent.start()


@pytest.mark.slow
@pytest.mark.timeout(360)
def test_no_third_node_waits_for_capacity_and_resumes_when_one_comes(run: Run, agents: AgentNodes) -> None:
    """Issue 17.4, measured before: with no third node a lost node left the RTJ Restarting for 5.5 min with
    nothing saying why; the survivor's rendezvous exits were then charged to the job. As with the defaults
    (a 600 s rendezvous timeout, 600 s before the suspend counted from the condition), the survivor's
    launcher gives up on its rendezvous before the gang is suspended: that exit is the lost node's
    consequence (71, excused), not a failure of the ranks it had trained with (70, charged)."""
    spare = next(a for a in agents.agents if not any(
        box.pod["metadata"]["namespace"] == run.ns for box in a.sandboxes.values()))
    spare.stop()  # two nodes in all
    try:
        run.apply(steps=200, resiliency={**RESILIENCY, "rendezvousTimeoutSeconds": 20},
                  restartBudget={"nodeLossGraceSeconds": 2, "terminatingTimeoutSeconds": 3,
                                 "capacitySuspendSeconds": 60})
        run.wait_training()
        wait_until(lambda: newest_checkpoint(run) >= 10, timeout=90, what="a checkpoint", interval=0.5)
        pod = next(p for p in run.job.running_pods()
                   if p["metadata"]["annotations"]["batch.kubernetes.io/job-completion-index"] == "1")
        lost = agents.by_name(pod["spec"]["nodeName"])
        lost.terminate()
        waiting = wait_until(lambda: run.job.condition("WaitingForCapacity") if run.job.condition(
            "WaitingForCapacity").get("status") == "True" else None, timeout=60, what="WaitingForCapacity")
        assert "nodes are available" in waiting["message"]
        try:
            wait_until(lambda: ((run.job.job() or {}).get("spec") or {}).get("suspend") is True, timeout=120,
                       what="the gang suspended")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{run.diagnosis()}") from None
        # The gang's processes are gone; a capacity probe (a sleeping pod shaped like the gang's) runs on the
        # released node and another waits for a node: the gang resumes once both are placed.
        wait_until(lambda: [n for n in run.agents.running(run.ns) if "-capacity-" in n]
                   and not [n for n in run.agents.running(run.ns) if "-capacity-" not in n], timeout=90,
                   what="the healthy node released to a capacity probe")
        status = run.job.status()
        assert status.get("jobRestarts", 0) == 0 and status.get("restartsWithoutProgress", 0) == 0, \
            run.diagnosis()
        assert "placed 1 of 2 capacity probes" in run.job.condition("WaitingForCapacity")["message"], run.diagnosis()
        # The rendezvous gave up before the suspend and said so: the survivor's launcher (71, not 70) or
        # the coordinator's nvrx-control (77), whichever first; not charged, though it takes a new gang.
        assert any(e["reason"] == "NotCharged" and (
            ("RendezvousFailed" in e["message"] and f"exited with code {exit_codes.RENDEZVOUS_FAILED}" in e["message"])
            or ("RendezvousControlFailed" in e["message"]
                and f"exited with code {exit_codes.RENDEZVOUS_CONTROL_FAILED}" in e["message"]))
            for e in run.job.events()), run.diagnosis()
        saved, added_at = newest_checkpoint(run), time.time()
        spare.start()  # a node arrives
        status = run.wait_done(timeout=240)
        resumed = [e for e in run.starts() if e["t"] > added_at]
        assert resumed and {e["step"] for e in resumed} == {saved}, resumed
        # One disruption for the loss, nothing for the job. CI run 5 (this stop) once saw the first gang's
        # pods wait 20 s for the coordinator's name (exit 76) although the operator had released them only
        # once its EndpointSlice listed it: cluster DNS lagging the API server, a platform fault of its own,
        # charged as one (and rare: not seen in the five full runs before). Counted apart, and printed.
        charges = {(c["tier"], c["reason"], c["charged"]): c["count"] for c in status.get("restartCounts", [])}
        dns = charges.pop(("GangRestart", "RendezvousHostUnresolved", "platform"), 0)
        assert status.get("jobRestarts", 0) == 0 and status.get("disruptions") == 1 + dns, run.diagnosis()
        assert all(charged == "platform" for _, _, charged in charges), charges
        assert status.get("restartsWithoutProgress", 0) == 0, run.diagnosis()
        if dns:
            print(f"the first gang waited for cluster DNS and was restarted ({dns}x, platform): {charges}")
    finally:
        for agent in agents.agents:
            if not agent.up:
                agent.start()
