"""The cluster tiers' fixtures (tests/cluster and tests/e2e import them into their conftest.py): one
local control plane per test run (upstream kube-apiserver, etcd, kube-controller-manager,
kube-scheduler, kwok nodes; see hack/rtj_dev/localcluster.py), the chart installed into it with helm,
a namespace per test, and the real operator authenticated as the chart's ServiceAccount, so the real
API server enforces the chart's RBAC on every call.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import prometheus_client
import pytest
import yaml

from rtj_dev.localcluster import LocalCluster, p5_node
from rtj_dev.operator_thread import OperatorThread
from rtj_operator import api
from rtj_operator.kube import Kube, configure
from testkit import RELEASE, RELEASE_NS, ROOT, TOOLS, rtj_body, wait_until

_ns_counter = itertools.count()
# The control plane of this test run, shared by both tiers' conftest.py (each registers its own
# session fixture): started by the first, stopped when the last lets go.
_shared: dict[str, Any] = {"cluster": None, "users": 0}


@pytest.fixture(scope="session")
def cluster() -> Iterator[LocalCluster]:
    if _shared["cluster"] is None:
        _shared["cluster"], _shared["stop"] = _start_cluster()
    _shared["users"] += 1
    try:
        yield _shared["cluster"]
    finally:
        _shared["users"] -= 1
        if not _shared["users"]:
            stop, _shared["cluster"] = _shared.pop("stop"), None
            stop()


def _start_cluster() -> tuple[LocalCluster, Callable[[], None]]:
    if os.environ.get("RTJ_TEST_CLUSTER"):  # a cluster from `python -m rtj_dev.localcluster up --dir DIR`
        local = LocalCluster.attach(Path(os.environ["RTJ_TEST_CLUSTER"]))
        helm(local, "upgrade", "--install", RELEASE, str(ROOT / "charts" / "rtj-operator"), "-n", RELEASE_NS,
             "--create-namespace", "--set", "replicaCount=0")
        return local, lambda: None
    local = LocalCluster(nodes=int(os.environ.get("RTJ_TEST_NODES", "10"))).start()
    try:
        helm(local, "install", RELEASE, str(ROOT / "charts" / "rtj-operator"), "-n", RELEASE_NS,
             "--create-namespace", "--wait", "--timeout", "60s",
             # The operator runs as a process of the test run (with this release's ServiceAccount),
             # not as the Deployment's pod: kwok nodes run no containers.
             "--set", "replicaCount=0")
        wait_for_garbage_collector(local)
    except BaseException:
        local.stop()
        raise
    return local, local.stop


def wait_for_garbage_collector(cluster: LocalCluster) -> None:
    """The garbage collector learns new kinds from discovery every 30 s; until it knows the CRD it
    cannot collect an RTJ's children. Wait until it collects the dependent of a canary RTJ."""
    ns = "gc-canary"
    cluster.api("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    owner = cluster.api("POST", f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{ns}/{api.PLURAL}",
                        rtj_body("canary", ns))
    ref = {"apiVersion": api.API_VERSION, "kind": api.KIND, "name": "canary", "uid": owner["metadata"]["uid"]}
    cluster.api("POST", f"/api/v1/namespaces/{ns}/configmaps",
                {"metadata": {"name": "dependent", "ownerReferences": [ref]}})
    cluster.api("DELETE", f"/apis/{api.GROUP}/{api.VERSION}/namespaces/{ns}/{api.PLURAL}/canary")
    wait_until(lambda: cluster.api("GET", f"/api/v1/namespaces/{ns}/configmaps/dependent", missing_ok=True) is None,
               timeout=90, what="the garbage collector to know ResilientTrainingJobs", interval=0.5)
    cluster.api("DELETE", f"/api/v1/namespaces/{ns}")


def helm(cluster: LocalCluster, *args: str) -> str:
    result = subprocess.run([str(TOOLS / "helm"), *args], env=cluster.env(), text=True, capture_output=True)
    if result.returncode != 0:
        raise RuntimeError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result.stdout


def kubectl(cluster: LocalCluster, *args: str, input: str | None = None, check: bool = True,
            kubeconfig: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {**cluster.env(), **({"KUBECONFIG": str(kubeconfig)} if kubeconfig else {})}
    result = subprocess.run([str(TOOLS / "kubectl"), *args], env=env, text=True, capture_output=True,
                            input=input)
    if check and result.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
    return result


def worker_rbac(cluster: LocalCluster, ns: str) -> None:
    """The chart's rtj-worker ServiceAccount, Role and RoleBinding for `ns`, rendered and applied as they
    are (the session's helm install has the ValidatingAdmissionPolicy that keeps the token to its pod)."""
    out = subprocess.run([str(TOOLS / "helm"), "template", RELEASE, str(ROOT / "charts" / "rtj-operator"),
                          "-n", RELEASE_NS, "--set", f"workerRBAC.namespaces={{{ns}}}",
                          "--show-only", "templates/worker-rbac.yaml"], check=True, capture_output=True,
                         text=True).stdout
    docs = [d for d in yaml.safe_load_all(out) if d]
    assert {d["kind"] for d in docs} == {"ServiceAccount", "Role", "RoleBinding"}
    kubectl(cluster, "apply", "-f", "-", input=yaml.safe_dump_all(docs))


@pytest.fixture(scope="session")
def operator_token(cluster: LocalCluster) -> str:
    return cluster.service_account_token(RELEASE_NS, RELEASE)


@pytest.fixture
def kube(cluster: LocalCluster) -> Kube:
    """An admin client for the test's own reads and writes (the operator has its own)."""
    return Kube(configure(cluster.server, token=cluster.admin_token, ca_file=str(cluster.ca_file)),
                )


@pytest.fixture
def ns(cluster: LocalCluster, kube: Kube, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace per test; deleted (by the real namespace controller) afterwards."""
    name = f"t{next(_ns_counter)}{os.urandom(2).hex()}-{request.node.name.lower().replace('_', '-')}"[:50]
    name = "".join(c if c.isalnum() or c == "-" else "-" for c in name).strip("-")
    cluster.api("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                                "metadata": {"name": name}})
    wait_until(lambda: cluster.api("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default",
                                   missing_ok=True), what="default ServiceAccount")
    yield name
    cluster.api("DELETE", f"/api/v1/namespaces/{name}", missing_ok=True)


@pytest.fixture
def lost_nodes(cluster: LocalCluster) -> Iterator[Callable[[str], None]]:
    """Lose nodes during a test; they come back (kwok renews their leases again, the out-of-service
    taint a test may add with cluster.fence_node is removed) afterwards."""
    lost: list[str] = []

    def lose(name: str) -> None:
        cluster.lose_node(name)
        lost.append(name)

    yield lose
    for name in lost:
        cluster.restore_node(name)


def start_operator(cluster: LocalCluster, token: str, ns: str, **kwargs: Any) -> OperatorThread:
    kwargs.setdefault("max_requeue", 1.0)
    return OperatorThread(cluster.server, token, str(cluster.ca_file), namespaces=[ns], **kwargs).start()


def passes() -> float:
    """Passes the operators of this process completed (rtj_reconcile_passes_total{outcome="ok"}: each
    looked at the world, decided, acted and wrote status)."""
    return prometheus_client.REGISTRY.get_sample_value("rtj_reconcile_passes_total", {"outcome": "ok"}) or 0.0


def wait_passes(n: int, what: str, timeout: float | None = None) -> None:
    """Until the operator completed `n` more passes: what a test waits for before it asserts that
    nothing changed (the operator looked and did nothing), instead of sleeping. The first of them may
    have begun before the call, so `n` >= 2 for one that saw the world as it is now. A quiet job gets a
    pass a second (start_operator's max_requeue); passes of the test's other jobs count too."""
    target = passes() + n
    wait_until(lambda: passes() >= target, timeout=timeout or 10.0 + 2 * n, what=f"{n} passes: {what}",
               interval=0.05)


@pytest.fixture
def operator(cluster: LocalCluster, operator_token: str, ns: str) -> Iterator[OperatorThread]:
    thread = start_operator(cluster, operator_token, ns)
    yield thread
    thread.stop()
    assert thread.error is None, thread.error


# --- what tests read and do ------------------------------------------------------------------------

@pytest.fixture
def own_nodes(cluster: LocalCluster, kube: Kube) -> Iterator[Callable[..., list[str]]]:
    """Nodes of this test only (a label the RTJ selects): capacity is what the test says it is.
    `add(count, **labels)` makes `count` more, with extra labels."""
    label = f"cap-{os.urandom(3).hex()}"
    made: list[str] = []

    def add(count: int, **labels: str) -> list[str]:
        names = [f"{label}-{len(made) + i}" for i in range(count)]
        for name in names:
            node = p5_node(name)
            node["metadata"]["labels"].update({"rtj.dev/test-node": label, **labels})
            kube.create(node)
        made.extend(names)
        return names

    add.label = label  # type: ignore[attr-defined]
    yield add  # type: ignore[misc]
    for name in made:
        kube.delete("Node", name, None)


@pytest.fixture
def rtj(kube: Kube, ns: str) -> Job:
    """The test's RTJ, named `train` in its namespace (created by the test: `rtj.create(**spec)`)."""
    return Job(kube, ns)


class Job:
    """One RTJ in a test namespace, with the reads and pod actions the tests use."""

    def __init__(self, kube: Kube, ns: str, name: str = "train"):
        self.kube, self.ns, self.name = kube, ns, name

    def create(self, **spec: Any) -> dict[str, Any]:
        return self.kube.create(rtj_body(self.name, self.ns, **spec))

    def patch(self, spec: dict[str, Any]) -> None:
        self.kube.patch(api.KIND, self.name, self.ns, {"spec": spec})

    def body(self) -> dict[str, Any]:
        return self.kube.get(api.KIND, self.name, self.ns) or {}

    def status(self) -> dict[str, Any]:
        return self.body().get("status") or {}

    def condition(self, type_: str) -> dict[str, Any]:
        return next((c for c in self.status().get("conditions", []) if c["type"] == type_), {})

    def job(self) -> dict[str, Any] | None:
        """The Job of the newest gang attempt (each attempt has its own: '<name>-a<attempt>')."""
        jobs = self.kube.list("Job", self.ns, {api.LABEL_NAME: self.name})
        return max(jobs, key=lambda j: int(j["metadata"]["annotations"].get(api.LABEL_ATTEMPT, 1)), default=None)

    def pods(self) -> list[dict[str, Any]]:
        """The gang's workers (the coordinator pod, when there is one, is not among them)."""
        return self.kube.list("Pod", self.ns, {api.LABEL_NAME: self.name, api.LABEL_COMPONENT: "workers"})

    def coordinator(self) -> dict[str, Any] | None:
        """The coordinator pod of the newest gang attempt ('<job>-rdzv')."""
        pods = self.kube.list("Pod", self.ns, {api.LABEL_NAME: self.name, api.LABEL_COMPONENT: "coordinator"})
        return max(pods, key=lambda p: int(p["metadata"]["labels"].get(api.LABEL_ATTEMPT, 0)), default=None)

    def running_pods(self) -> list[dict[str, Any]]:
        return sorted((p for p in self.pods() if p["status"].get("phase") == "Running"
                       and not p["metadata"].get("deletionTimestamp")),
                      key=lambda p: p["metadata"]["name"])

    def events(self) -> list[dict[str, Any]]:
        return self.kube.list("Event", self.ns)

    def reasons(self) -> list[str]:
        return [e["reason"] for e in self.events() if e["involvedObject"].get("kind") == api.KIND]

    def explain(self) -> str:
        """What a failed wait prints: the RTJ's status, events and pods (CI's log alone explains it)."""
        events = sorted(self.events(), key=lambda e: e.get("lastTimestamp") or e.get("eventTime") or "")
        pods = [f"{p['metadata']['name']} {p['status'].get('phase')} on {p['spec'].get('nodeName')}"
                f"{' (deleting)' if p['metadata'].get('deletionTimestamp') else ''}" for p in self.pods()]
        return (f"\nstatus: {json.dumps(self.status(), indent=1)}\nevents:\n" + "\n".join(
            f"  {e.get('lastTimestamp')} {e['involvedObject'].get('kind')} {e['reason']}: {e['message']}"
            for e in events) + "\npods:\n  " + "\n  ".join(pods))

    def wait_phase(self, phase: str, timeout: float = 60.0) -> dict[str, Any]:
        try:
            return wait_until(lambda: self.status() if self.status().get("phase") == phase else None,
                              timeout=timeout, what=f"phase {phase}")
        except AssertionError as exc:
            raise AssertionError(f"{exc}{self.explain()}") from None

    def wait_running(self, nodes: int | None = None, timeout: float = 60.0) -> dict[str, Any]:
        def ok() -> dict[str, Any] | None:
            st = self.status()
            if st.get("phase") == "Running" and (nodes is None or st.get("nodesReady") == nodes):
                return st
            return None
        try:
            return wait_until(ok, timeout=timeout, what="Running")
        except AssertionError as exc:
            raise AssertionError(f"{exc}{self.explain()}") from None

    def exit_pod(self, pod: dict[str, Any], code: int, reason: str = "Error", step: int | None = None,
                 message: dict[str, Any] | None = None) -> None:
        """The pod's container exits with `code` (kwok's pod-exit stage) and writes the worker's
        termination report, as rtj_worker.entrypoint does."""
        report = dict(message or {"exitCode": code, "reason": f"exit {code}"})
        if step is not None:
            report["checkpointStep"] = step
        self.kube.patch("Pod", pod["metadata"]["name"], self.ns, {"metadata": {"annotations": {
            "kwok.rtj.dev/exit-code": str(code), "kwok.rtj.dev/exit-reason": reason,
            "kwok.rtj.dev/exit-message": json.dumps(report)}}})
