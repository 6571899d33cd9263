"""The real kopf operator, in-process, against the embedded emulated Kubernetes API."""

from __future__ import annotations

import pytest

from conftest import rtj_body, wait_until
from rtj_operator import api
from rtj_operator.kube import KubeError


def status(kube, name="train"):
    return ((kube.get(api.KIND, name, "default") or {}).get("status")) or {}


def condition(kube, type_, name="train"):
    return next((c for c in status(kube, name).get("conditions", []) if c["type"] == type_), None)


def created(body):
    body = dict(body)
    body["metadata"] = {k: v for k, v in body["metadata"].items() if k not in ("uid", "generation")}
    return body


def test_create_builds_children_owned_by_the_rtj_and_reports_running(kube, sim, operator):
    kube.create(created(rtj_body(storage={"storageClassName": "fsx-sc", "retention": "Delete"})))
    wait_until(lambda: status(kube).get("phase") == "Running", step=sim.step, what="Running")
    rtj = kube.get(api.KIND, "train", "default")
    uid = rtj["metadata"]["uid"]
    for kind, name in (("Service", "train"), ("Job", "train"), ("PersistentVolumeClaim", "train-ckpt")):
        obj = kube.get(kind, name, "default")
        assert obj is not None, kind
        refs = obj["metadata"]["ownerReferences"]
        assert refs[0]["uid"] == uid and refs[0]["kind"] == api.KIND and refs[0]["controller"] is True
    st = status(kube)
    assert st["nodesReady"] == st["nodesDesired"] == 2
    assert st["observedGeneration"] == 1
    for type_, value in (("Created", "True"), ("Running", "True"), ("InvalidSpec", "False"),
                         ("Restarting", "False"), ("Failed", "False"), ("Succeeded", "False"),
                         ("Suspended", "False")):
        cond = condition(kube, type_)
        assert cond["status"] == value, cond
        assert cond["reason"][0].isupper() and " " not in cond["reason"]
        assert cond["observedGeneration"] == 1 and cond["lastTransitionTime"].endswith("Z")
    reasons = [e["reason"] for e in kube.list("Event", "default")]
    assert reasons.count("Created") == 3 and "Running" in reasons


def test_retained_pvc_is_not_owned_and_survives_deletion(kube, sim, operator):
    kube.create(created(rtj_body()))
    wait_until(lambda: status(kube).get("phase") == "Running", step=sim.step)
    assert "ownerReferences" not in kube.get("PersistentVolumeClaim", "train-ckpt", "default")["metadata"]
    kube.delete(api.KIND, "train", "default")
    wait_until(lambda: kube.get(api.KIND, "train", "default") is None, what="RTJ gone")
    wait_until(lambda: kube.get("Job", "train", "default") is None and kube.get("Service", "train", "default") is None)
    assert kube.get("PersistentVolumeClaim", "train-ckpt", "default") is not None
    assert kube.list("Pod", "default") == []


def test_deletion_with_retention_delete_removes_the_pvc(kube, sim, operator):
    kube.create(created(rtj_body(storage={"storageClassName": "fsx-sc", "retention": "Delete"})))
    wait_until(lambda: status(kube).get("phase") == "Running", step=sim.step)
    kube.delete(api.KIND, "train", "default")
    wait_until(lambda: kube.get("PersistentVolumeClaim", "train-ckpt", "default") is None, what="PVC deleted")
    assert kube.get("Job", "train", "default") is None


def test_spec_update_converges_the_job(kube, sim, operator):
    kube.create(created(rtj_body()))
    wait_until(lambda: status(kube).get("phase") == "Running", step=sim.step)
    kube.patch(api.KIND, "train", "default", {"spec": {"image": "worker:2", "nodes": {"count": 3}}})
    wait_until(lambda: (kube.get("Job", "train", "default") or {}).get("spec", {}).get("completions") == 3,
               step=sim.step, what="Job recreated with 3 nodes")
    job = kube.get("Job", "train", "default")
    assert job["spec"]["template"]["spec"]["containers"][0]["image"] == "worker:2"
    assert job["metadata"]["annotations"][api.LABEL_ATTEMPT] == "2"
    wait_until(lambda: status(kube).get("phase") == "Running" and status(kube)["nodesReady"] == 3, step=sim.step)
    st = status(kube)
    assert st["observedGeneration"] == 2
    # A spec change is the user's decision, not a failure: no budget is charged.
    assert st["jobRestarts"] == 0 and st["disruptions"] == 0


def test_rendezvous_port_change_converges_service_and_job(kube, sim, operator):
    kube.create(created(rtj_body()))
    wait_until(lambda: status(kube).get("phase") == "Running", step=sim.step)
    kube.patch(api.KIND, "train", "default", {"spec": {"resiliency": {"rendezvousPort": 29500}}})

    def port() -> int:
        return kube.get("Service", "train", "default")["spec"]["ports"][0]["port"]

    wait_until(lambda: port() == 29500, step=sim.step, what="Service port updated")
    wait_until(lambda: status(kube).get("phase") == "Running" and status(kube)["observedGeneration"] == 2,
               step=sim.step, what="Running on the new port")
    env = {e["name"]: e.get("value") for e in
           kube.get("Job", "train", "default")["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["RTJ_RDZV_ENDPOINT"].endswith(":29500")


def test_suspend_and_resume(kube, sim, operator):
    kube.create(created(rtj_body()))
    wait_until(lambda: status(kube).get("phase") == "Running", step=sim.step)
    kube.patch(api.KIND, "train", "default", {"spec": {"suspend": True}})
    wait_until(lambda: status(kube).get("phase") == "Suspended", step=sim.step, what="Suspended")
    assert kube.get("Job", "train", "default")["spec"]["suspend"] is True
    wait_until(lambda: not kube.list("Pod", "default"), step=sim.step, what="pods gone")
    assert condition(kube, "Suspended")["status"] == "True"
    kube.patch(api.KIND, "train", "default", {"spec": {"suspend": False}})
    wait_until(lambda: status(kube).get("phase") == "Running", step=sim.step, what="resumed")
    assert condition(kube, "Suspended")["status"] == "False"


def test_invalid_spec_creates_nothing_and_says_why(kube, sim, operator):
    kube.create(created(rtj_body(resiliency={"heartbeatTimeoutSeconds": 3, "monitorIntervalSeconds": 5})))
    wait_until(lambda: condition(kube, "InvalidSpec"), what="InvalidSpec")
    cond = condition(kube, "InvalidSpec")
    assert cond["status"] == "True" and cond["reason"] == "InvalidSpec"
    assert "heartbeatTimeoutSeconds (3) must be greater than" in cond["message"]
    assert status(kube)["phase"] == "Invalid"
    for kind in ("Job", "Service", "PersistentVolumeClaim"):
        assert kube.list(kind, "default") == [], kind
    warnings = [e for e in kube.list("Event", "default") if e["type"] == "Warning"]
    assert warnings and warnings[0]["reason"] == "InvalidSpec"
    # Fixing the spec converges.
    kube.patch(api.KIND, "train", "default", {"spec": {"resiliency": {"heartbeatTimeoutSeconds": 60}}})
    wait_until(lambda: status(kube).get("phase") == "Running", step=sim.step, what="Running after fix")
    assert condition(kube, "InvalidSpec")["status"] == "False"


def test_invalid_update_keeps_the_running_job(kube, sim, operator):
    kube.create(created(rtj_body()))
    wait_until(lambda: status(kube).get("phase") == "Running", step=sim.step)
    job_uid = kube.get("Job", "train", "default")["metadata"]["uid"]
    kube.patch(api.KIND, "train", "default", {"spec": {"nodes": {"count": 4, "max": 3}}})
    wait_until(lambda: (condition(kube, "InvalidSpec") or {}).get("status") == "True", step=sim.step)
    assert kube.get("Job", "train", "default")["metadata"]["uid"] == job_uid
    assert status(kube)["phase"] == "Running"
    assert len([p for p in kube.list("Pod", "default") if p["status"]["phase"] == "Running"]) == 2


def test_schema_violations_are_rejected_at_apply(kube, operator):
    with pytest.raises(KubeError) as err:
        kube.create(created(rtj_body(nodes={"count": 0})))
    assert err.value.status == 422 and "spec.nodes.count: 0 is less than the minimum of 1" in str(err.value)
    assert kube.list(api.KIND, "default") == []


def test_job_completion_marks_succeeded(kube, sim, operator):
    kube.create(created(rtj_body()))
    wait_until(lambda: status(kube).get("phase") == "Running", step=sim.step)
    for pod in kube.list("Pod", "default"):
        kube.patch("Pod", pod["metadata"]["name"], "default", {"status": {"phase": "Succeeded"}})
    wait_until(lambda: status(kube).get("phase") == "Succeeded", step=sim.step, what="Succeeded")
    assert condition(kube, "Succeeded")["status"] == "True"
    assert status(kube)["completionTime"]
