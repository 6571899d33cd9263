"""The real kopf operator against the local control plane (real apiserver, Job controller,
garbage collector, scheduler; kwok kubelets), authenticated as the chart's ServiceAccount."""

from __future__ import annotations

import pytest

from clusterkit import Job, wait_passes
from rtj_operator import api
from rtj_operator.kube import KubeError
from rtj_operator.world import SERVICE_NAME_LABEL, published
from testkit import wait_until


def test_create_builds_children_owned_by_the_rtj_and_reports_running(rtj, kube, ns, operator):
    calls: list[tuple[str, str]] = []
    operator.kube._on_call = lambda verb, kind: calls.append((verb, kind))
    rtj.create(storage={"storageClassName": "fsx-sc", "retention": "Delete"})
    st = rtj.wait_running(nodes=2)
    # The gang's pods were released once the coordinator's name was published: the operator, with the
    # chart's grants, listed the Service's EndpointSlices, which the real controller filled.
    assert ("list", "EndpointSlice") in calls
    assert published(operator.kube.list("EndpointSlice", ns, {SERVICE_NAME_LABEL: "train"}),
                     kube.get("Pod", "train-a1-rdzv", ns))
    uid = rtj.body()["metadata"]["uid"]
    for kind, name in (("Service", "train"), ("Job", "train-a1"), ("PersistentVolumeClaim", "train-ckpt"),
                       ("Pod", "train-a1-rdzv"), ("NetworkPolicy", "train")):
        obj = kube.get(kind, name, ns)
        assert obj is not None, kind
        refs = obj["metadata"]["ownerReferences"]
        assert refs[0]["uid"] == uid and refs[0]["kind"] == api.KIND and refs[0]["controller"] is True
    assert st["nodesReady"] == st["nodesDesired"] == 2 and st["observedGeneration"] == 1
    for type_, value in (("Created", "True"), ("Running", "True"), ("InvalidSpec", "False"),
                         ("Restarting", "False"), ("Failed", "False"), ("Succeeded", "False"),
                         ("Suspended", "False")):
        cond = rtj.condition(type_)
        assert cond["status"] == value, cond
        assert cond["reason"][0].isupper() and " " not in cond["reason"]
        assert cond["observedGeneration"] == 1 and cond["lastTransitionTime"].endswith("Z")
    # The real scheduler put one pod per p5 node (anti-affinity), tolerating the GPU taint.
    pods = rtj.running_pods()
    assert len({p["spec"]["nodeName"] for p in pods}) == 2
    assert sorted(p["spec"]["hostname"] for p in pods) == ["train-a1-0", "train-a1-1"]
    reasons = rtj.reasons()
    # Service, NetworkPolicy, PVC, coordinator pod and Job.
    assert reasons.count("Created") == 5 and "Running" in reasons
    # Only the job's own pods may reach them (the API server takes the policy as built; no engine runs here).
    policy = kube.get("NetworkPolicy", "train", ns)
    assert policy["spec"]["podSelector"] == {"matchLabels": {api.LABEL_NAME: "train"}}
    assert policy["spec"]["ingress"] == [{"from": [{"podSelector": {"matchLabels": {api.LABEL_NAME: "train"}}}]}]
    # kopf keeps no copy of the spec in an annotation (it would grow with the spec, up to 256 KiB).
    assert not any("last-handled-configuration" in k for k in rtj.body()["metadata"].get("annotations") or {})


def test_retained_pvc_is_not_owned_and_survives_deletion(rtj, kube, ns, operator):
    rtj.create()
    rtj.wait_running()
    assert "ownerReferences" not in kube.get("PersistentVolumeClaim", "train-ckpt", ns)["metadata"]
    kube.delete(api.KIND, "train", ns)
    wait_until(lambda: kube.get(api.KIND, "train", ns) is None, what="RTJ gone")
    # The real garbage collector removes the owned children (and the Job's pods).
    wait_until(lambda: kube.get("Job", "train-a1", ns) is None and kube.get("Service", "train", ns) is None,
               what="children collected")
    wait_until(lambda: not kube.list("Pod", ns), what="pods collected")
    assert kube.get("PersistentVolumeClaim", "train-ckpt", ns) is not None
    # A new RTJ of the same name reuses the retained claim on purpose (it resumes from its checkpoints).
    rtj.create()
    rtj.wait_running()


def test_deletion_with_retention_delete_removes_the_pvc(rtj, kube, ns, operator):
    rtj.create(storage={"storageClassName": "fsx-sc", "retention": "Delete"})
    rtj.wait_running()
    kube.delete(api.KIND, "train", ns)
    wait_until(lambda: kube.get("PersistentVolumeClaim", "train-ckpt", ns) is None
               or kube.get("PersistentVolumeClaim", "train-ckpt", ns)["metadata"].get("deletionTimestamp"),
               what="PVC deleted")
    wait_until(lambda: kube.get("Job", "train-a1", ns) is None, what="Job collected")


def test_spec_update_converges_the_job(rtj, kube, ns, operator):
    rtj.create()
    rtj.wait_running()
    rtj.patch({"image": "worker:2", "nodes": {"count": 3}})
    wait_until(lambda: ((rtj.job() or {}).get("spec") or {}).get("completions") == 3, what="Job recreated")
    job = rtj.job()
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "worker:2"
    assert job["metadata"]["annotations"][api.LABEL_ATTEMPT] == "2"
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RTJ_RDZV_ID"].endswith("-2")  # a new gang never joins the old rendezvous round
    st = rtj.wait_running(nodes=3)
    assert st["observedGeneration"] == 2
    # A spec change is the user's decision, not a failure: no budget is charged.
    assert st["jobRestarts"] == 0 and st["disruptions"] == 0


def test_status_says_restarting_until_the_new_gang_runs(rtj, kube, ns, operator):
    """Issue 9.8: never Running at the new generation while the old Job is still going away."""
    rtj.create()
    rtj.wait_running()
    rtj.patch({"resiliency": {"rendezvousPort": 29500}})
    phases = set()

    def converged() -> bool:
        st = rtj.status()
        job = rtj.job() or {}
        attempt = (job.get("metadata", {}).get("annotations") or {}).get(api.LABEL_ATTEMPT)
        if st.get("observedGeneration") == 2:
            phases.add((st.get("phase"), attempt, bool(job.get("metadata", {}).get("deletionTimestamp"))))
        return st.get("phase") == "Running" and attempt == "2" and st.get("observedGeneration") == 2

    wait_until(converged, what="Running on the new port", interval=0.02)
    assert kube.get("Service", "train", ns)["spec"]["ports"][0]["port"] == 29500
    running_with_old_job = [p for p in phases if p[0] == "Running" and (p[1] != "2" or p[2])]
    assert not running_with_old_job, phases


def test_suspend_and_resume(rtj, kube, ns, operator):
    rtj.create()
    rtj.wait_running()
    rtj.patch({"suspend": True})
    rtj.wait_phase("Suspended")
    assert rtj.job()["spec"]["suspend"] is True
    wait_until(lambda: not rtj.pods(), what="pods gone (real Job controller)")
    assert rtj.condition("Suspended")["status"] == "True"
    rtj.patch({"suspend": False})
    rtj.wait_running()
    assert rtj.condition("Suspended")["status"] == "False"


def test_invalid_spec_creates_nothing_and_says_why(rtj, kube, ns, operator):
    rtj.create(resiliency={"heartbeatTimeoutSeconds": 3, "monitorIntervalSeconds": 5})
    wait_until(lambda: rtj.condition("InvalidSpec").get("status") == "True", what="InvalidSpec")
    cond = rtj.condition("InvalidSpec")
    assert cond["reason"] == "InvalidSpec" and "heartbeatTimeoutSeconds (3) must be greater than" in cond["message"]
    assert rtj.status()["phase"] == "Invalid"
    for kind in ("Job", "Service", "PersistentVolumeClaim"):
        assert kube.list(kind, ns) == [], kind
    warnings = [e for e in rtj.events() if e["type"] == "Warning"]
    assert warnings and warnings[0]["reason"] == "InvalidSpec"
    rtj.patch({"resiliency": {"heartbeatTimeoutSeconds": 60}})
    rtj.wait_running()
    assert rtj.condition("InvalidSpec")["status"] == "False"


def test_invalid_update_keeps_the_running_job(rtj, kube, ns, operator):
    rtj.create()
    rtj.wait_running()
    job_uid = rtj.job()["metadata"]["uid"]
    rtj.patch({"nodes": {"spares": 1}, "coordinator": {"enabled": False}})  # the operator's check, not the schema's
    wait_until(lambda: rtj.condition("InvalidSpec").get("status") == "True", what="InvalidSpec")
    assert rtj.job()["metadata"]["uid"] == job_uid
    assert rtj.status()["phase"] == "Running" and len(rtj.running_pods()) == 2


@pytest.fixture
def image_policy(cluster, kube, ns):
    """A cluster admin's ValidatingAdmissionPolicy (enforced by the real API server): Jobs in this
    namespace may only run images from registry.internal. The RTJ's own schema cannot know it."""
    name = f"images-{ns}"[:63]
    cluster.api("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies", {
        "metadata": {"name": name}, "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {"resourceRules": [{"apiGroups": ["batch"], "apiVersions": ["v1"],
                                                    "operations": ["CREATE", "UPDATE"], "resources": ["jobs"]}]},
            "validations": [{"expression": "object.spec.template.spec.containers.all(c, "
                                           "c.image.startsWith('registry.internal/') || c.image == 'worker:1')",
                             "message": "images must come from registry.internal"}]}})
    cluster.api("POST", "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings", {
        "metadata": {"name": name}, "spec": {"policyName": name, "validationActions": ["Deny"], "matchResources": {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}}}}})

    def enforced() -> bool:
        # The API server loads new policies asynchronously: probe with a dry run until it denies.
        probe = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "probe", "namespace": ns},
                 "spec": {"template": {"spec": {"restartPolicy": "Never",
                                                "containers": [{"name": "c", "image": "elsewhere/x:1"}]}}}}
        try:
            kube.create(probe, dry_run=True)
        except KubeError as exc:
            return "registry.internal" in str(exc)
        return False

    wait_until(enforced, what="the admission policy enforced", interval=0.5)
    yield
    for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
        cluster.api("DELETE", f"/apis/admissionregistration.k8s.io/v1/{kind}/{name}", missing_ok=True)


def test_an_edit_the_api_server_rejects_keeps_the_running_job(rtj, kube, ns, operator, image_policy):
    """Issue 9.1: the new Job is checked with a server-side dry run before the old one is deleted."""
    rtj.create()
    rtj.wait_running()
    job_uid = rtj.job()["metadata"]["uid"]
    pods = {p["metadata"]["uid"] for p in rtj.running_pods()}
    rtj.patch({"image": "docker.io/someone/worker:2"})
    cond = wait_until(lambda: rtj.condition("InvalidSpec") if rtj.condition("InvalidSpec").get("status") == "True"
                      else None, what="InvalidSpec from the API server")
    assert cond["reason"] == "ChildRejected" and "images must come from registry.internal" in cond["message"], cond
    assert rtj.job()["metadata"]["uid"] == job_uid and not rtj.job()["metadata"].get("deletionTimestamp")
    assert {p["metadata"]["uid"] for p in rtj.running_pods()} == pods and rtj.status()["phase"] == "Running"
    assert rtj.reasons().count("InvalidSpec") == 1
    # Fixing the edit converges: the new gang runs the allowed image.
    rtj.patch({"image": "registry.internal/worker:2"})
    wait_until(lambda: (rtj.job() or {}).get("metadata", {}).get("uid") not in (None, job_uid), what="new Job")
    rtj.wait_running()
    assert rtj.condition("InvalidSpec")["status"] == "False"


def invalid_spec(rtj) -> dict:
    return wait_until(lambda: rtj.condition("InvalidSpec") if rtj.condition("InvalidSpec").get("status") == "True"
                      else None, what="InvalidSpec from the API server")


def test_a_priority_class_that_does_not_exist_is_said_in_status(rtj, kube, ns, operator):
    """The Priority admission plugin refuses pods (never a Job's template) that name no PriorityClass:
    the coordinator's create is refused with 403, which once crashed every pass and left the job
    with no word of why."""
    missing = f"missing-{ns}"[:63]
    rtj.create(priorityClassName=missing)
    cond = invalid_spec(rtj)
    assert cond["reason"] == "ChildRejected" and f"no PriorityClass with name {missing}" in cond["message"], cond
    assert rtj.job() is None and rtj.status()["phase"] == "Invalid"
    assert operator.error is None


def test_an_edit_naming_a_missing_priority_class_keeps_the_running_job(rtj, kube, ns, operator, cluster):
    """The new template passes the Job dry run; only a pod dry run shows that none of its pods could be
    created. The running gang stays until the edit names a class that exists."""
    rtj.create()
    rtj.wait_running()
    job_uid = rtj.job()["metadata"]["uid"]
    pods = {p["metadata"]["uid"] for p in rtj.running_pods()}
    missing = f"missing-{ns}"[:63]
    rtj.patch({"priorityClassName": missing})
    cond = invalid_spec(rtj)
    assert cond["reason"] == "ChildRejected" and f"no PriorityClass with name {missing}" in cond["message"], cond
    assert rtj.job()["metadata"]["uid"] == job_uid and not rtj.job()["metadata"].get("deletionTimestamp")
    assert {p["metadata"]["uid"] for p in rtj.running_pods()} == pods and rtj.status()["phase"] == "Running"
    cluster.api("POST", "/apis/scheduling.k8s.io/v1/priorityclasses",
                {"metadata": {"name": missing}, "value": 1000})
    try:
        rtj.patch({"priorityClassName": missing, "image": "worker:2"})  # an edit: a pass now, not in 60 s
        wait_until(lambda: (rtj.job() or {}).get("metadata", {}).get("uid") not in (None, job_uid), what="new Job")
        rtj.wait_running()
        assert rtj.condition("InvalidSpec")["status"] == "False"
        assert {p["spec"].get("priorityClassName") for p in rtj.running_pods()} == {missing}
    finally:
        cluster.api("DELETE", f"/apis/scheduling.k8s.io/v1/priorityclasses/{missing}", missing_ok=True)


def test_schema_violations_are_rejected_at_apply(rtj, kube, ns, operator):
    with pytest.raises(KubeError) as err:
        rtj.create(nodes={"count": 0})
    assert err.value.status == 422 and "spec.nodes.count" in str(err.value) and "1" in str(err.value)
    assert kube.list(api.KIND, ns) == []


def test_job_completion_marks_succeeded(rtj, kube, ns, operator):
    rtj.create()
    rtj.wait_running()
    for pod in rtj.running_pods():
        rtj.exit_pod(pod, 0)
    rtj.wait_phase("Succeeded")
    assert rtj.condition("Succeeded")["status"] == "True" and rtj.status()["completionTime"]


def test_a_budget_edit_keeps_the_gang(rtj, kube, ns, operator):
    """Issue 8.h: budgets are the operator's (status), nothing in the Job depends on them."""
    rtj.create()
    rtj.wait_running()
    job = rtj.job()
    rtj.patch({"restartBudget": {"maxRestarts": 7}})
    wait_until(lambda: rtj.status().get("observedGeneration") == 2, what="the edit seen")
    after = rtj.job()
    assert after["metadata"]["uid"] == job["metadata"]["uid"] and rtj.status()["attempt"] == 1
    assert after["spec"] == job["spec"]


@pytest.mark.parametrize("kind, make", [
    ("Service", lambda ns: {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "train", "namespace": ns},
                            "spec": {"selector": {"app": "theirs"}, "ports": [{"port": 80}]}}),
    ("Job", lambda ns: {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train-a1", "namespace": ns},
                        "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [
                            {"name": "c", "image": "theirs:1"}]}}}}),
    ("PersistentVolumeClaim", lambda ns: {
        "apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "train-ckpt", "namespace": ns},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}),
])
def test_objects_it_did_not_create_are_never_taken_over(rtj, kube, ns, operator, kind, make):
    """Issue 9.4: a name clash is a conflict condition; the other object is neither changed nor deleted."""
    theirs = kube.create(make(ns))
    rtj.create()
    cond = wait_until(lambda: rtj.condition("Created") if rtj.condition("Created").get("reason") == "ChildConflict"
                      else None, what="ChildConflict")
    assert (kind in cond["message"] and "not owned" in cond["message"]) or "not made" in cond["message"]
    # Events follow the status write (one write per pass, events after it): wait for the event too.
    wait_until(lambda: "ChildConflict" in rtj.reasons(), what="a ChildConflict event")
    kube.delete(api.KIND, "train", ns)
    wait_until(lambda: kube.get(api.KIND, "train", ns) is None, what="RTJ deleted")
    after = kube.get(kind, theirs["metadata"]["name"], ns)
    assert after is not None and after["metadata"]["uid"] == theirs["metadata"]["uid"]
    assert after["spec"] == kube.get(kind, theirs["metadata"]["name"], ns)["spec"]
    if kind == "Service":
        assert after["spec"]["selector"] == {"app": "theirs"} and after["spec"]["ports"][0]["port"] == 80


def test_a_steady_state_pass_makes_no_read_request(rtj, kube, ns, operator):
    """Issue 20.2: passes read the RTJ, its Job, Service, PVC, pods and nodes from the watch-fed
    stores; with 1000 jobs a GET or LIST per pass was most of what a pass cost."""
    rtj.create()
    rtj.wait_running()
    # The pass that wrote Running posts its event after the status write the test saw (CI, a loaded
    # machine: its create was counted here): the steady state begins once that pass is over.
    wait_passes(2, "the pass that wrote Running")
    calls: list[tuple[str, str]] = []
    operator.kube._on_call = lambda verb, kind: calls.append((verb, kind))
    wait_passes(5, "steady state")
    assert calls == [], calls
    # What the stores serve is current: a failure is counted from the watch alone.
    rtj.exit_pod(rtj.running_pods()[0], 1)
    wait_until(lambda: rtj.status().get("jobRestarts") == 1, what="the failure counted")
    assert not [c for c in calls if c[0] in ("get", "list")], calls


def test_no_rtj_carries_a_finalizer_and_deletion_never_waits_for_the_operator(rtj, kube, ns, operator):
    """Issue 20.1: no daemon, no finalizer; an RTJ made by an older operator loses the old finalizer."""
    rtj.create()
    rtj.wait_running()
    assert not rtj.body()["metadata"].get("finalizers")
    other = Job(kube, ns, "legacy")
    other.create()
    other.wait_running()
    kube.patch(api.KIND, "legacy", ns, {"metadata": {"finalizers": [f"{api.GROUP}/finalizer"]}})
    wait_until(lambda: not other.body()["metadata"].get("finalizers"), what="the legacy finalizer removed")
    operator.stop()  # with no operator at all, a deletion completes (the garbage collector takes the children)
    kube.delete(api.KIND, "train", ns)
    wait_until(lambda: kube.get(api.KIND, "train", ns) is None, timeout=10, what="the RTJ gone")
