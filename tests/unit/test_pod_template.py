"""spec.pod: what a spec adds to the operator's pods, and that it never replaces what recovery needs."""

from __future__ import annotations

import copy

import pytest
from pod_examples import FULL_POD

from rtj_operator import api
from rtj_operator.builders import build_coordinator, build_job
from rtj_operator.builders.coordinator import DO_NOT_DISRUPT
from rtj_operator.spec import RTJ, schema_errors, semantic_errors
from testkit import rtj_body


def rtj(**spec) -> RTJ:
    return RTJ.from_body(rtj_body(**spec))


def template(job: dict) -> dict:
    return job["spec"]["template"]


# Template hashes of Jobs built by the operator before spec.pod existed (commit 0125638), when a Job was
# named '<name>' in every attempt. An RTJ that does not use spec.pod must keep its hash for such a Job (its
# name is the one it has: ensure_job passes it), or an operator upgrade would restart every running gang.
PINNED_HASHES = [
    ({}, "674e291a80a6e046"),
    ({"gpusPerNode": 0, "efaPerNode": 0, "procsPerNode": 2, "coordinator": {"enabled": False}}, "a201648a145025eb"),
    ({"nodes": {"count": 4, "spares": 1}, "env": [{"name": "NCCL_DEBUG", "value": "INFO"}],
      "placement": {"nodeSelector": {"eks.amazonaws.com/nodegroup": "p5"},
                    "tolerations": [{"key": "x", "operator": "Exists"}]},
      "resources": {"requests": {"cpu": "100"}}, "serviceAccountName": "rtj-worker", "priorityClassName": "high",
      "args": ["--steps", "10"]}, "16c4364cffb8b1c6"),
]


@pytest.mark.parametrize("spec, expected", PINNED_HASHES)
def test_an_rtj_without_spec_pod_keeps_its_template_hash(spec, expected):
    assert build_job(rtj(**spec), attempt=2, name="train")["metadata"]["annotations"][
        api.ANNOTATION_TEMPLATE_HASH] == expected
    # An empty spec.pod (or empty parts of it) is no change either.
    empty = {"labels": {}, "annotations": {}, "imagePullSecrets": [], "volumes": [], "volumeMounts": [],
             "initContainers": []}
    assert build_job(rtj(**spec, pod=empty), attempt=2, name="train")["metadata"]["annotations"][
        api.ANNOTATION_TEMPLATE_HASH] == expected


def test_the_coordinator_of_an_rtj_without_spec_pod_is_unchanged():
    coordinator = build_coordinator(rtj(), 2)
    assert set(coordinator["metadata"]) == {"name", "namespace", "labels", "annotations"}
    # The autoscalers' opt-outs (issue 29.4): a coordinator is made per attempt, never compared.
    assert coordinator["metadata"]["annotations"] == {api.LABEL_ATTEMPT: "2", **DO_NOT_DISRUPT}
    assert "imagePullSecrets" not in coordinator["spec"] and "priorityClassName" not in coordinator["spec"]


def test_spec_pod_is_merged_into_the_worker_pods():
    job = build_job(rtj(pod=FULL_POD))
    meta, pod = template(job)["metadata"], template(job)["spec"]
    assert meta["labels"]["team"] == "ml" and meta["labels"][api.LABEL_COMPONENT] == "workers"
    assert meta["annotations"] == FULL_POD["annotations"]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["schedulerName"] == "my-scheduler"
    # The operator's volumes and mounts first, the spec's after them.
    assert [v["name"] for v in pod["volumes"]] == ["dshm", "checkpoints", *(v["name"] for v in FULL_POD["volumes"])]
    worker = pod["containers"][0]
    assert [m["mountPath"] for m in worker["volumeMounts"]] == ["/dev/shm", "/checkpoints", "/data", "/secrets"]
    assert [c["name"] for c in pod["initContainers"]] == ["fetch", "uploader"]
    assert pod["initContainers"][1]["restartPolicy"] == "Always"
    assert pod["initContainers"][1]["ports"] == [{"containerPort": 8080, "name": "metrics", "protocol": "TCP"}]


def test_spec_pod_never_replaces_what_recovery_depends_on():
    """The worker stays the only regular container, with its command, restart policy, grace period,
    hostname and completion index; the operator's labels win over any the spec could sneak in."""
    plain, full = build_job(rtj()), build_job(rtj(pod=FULL_POD))
    for key in ("restartPolicy", "subdomain", "terminationGracePeriodSeconds", "nodeSelector", "tolerations",
                "affinity"):
        assert template(full)["spec"][key] == template(plain)["spec"][key], key
    assert [c["name"] for c in template(full)["spec"]["containers"]] == ["worker"]
    worker, before = template(full)["spec"]["containers"][0], template(plain)["spec"]["containers"][0]
    assert {k: v for k, v in worker.items() if k != "volumeMounts"} == {
        k: v for k, v in before.items() if k != "volumeMounts"}
    # Even a spec that bypassed the schema cannot replace the operator's labels.
    body = rtj_body()
    body["spec"]["pod"] = {"labels": {api.LABEL_NAME: "other", api.LABEL_COMPONENT: "x", "team": "a"}}
    sneaky = RTJ(name="train", namespace="default", uid="u", generation=1,
                 spec={**rtj().spec, "pod": body["spec"]["pod"]})
    labels = template(build_job(sneaky))["metadata"]["labels"]
    assert labels[api.LABEL_NAME] == "train" and labels[api.LABEL_COMPONENT] == "workers" and labels["team"] == "a"
    assert semantic_errors(sneaky)


def test_the_coordinator_gets_labels_annotations_pull_secrets_and_the_workers_priority():
    pod = build_coordinator(rtj(pod=FULL_POD, priorityClassName="training-high"), 3)
    assert pod["metadata"]["labels"]["team"] == "ml" and pod["metadata"]["labels"][api.LABEL_COMPONENT] == "coordinator"
    assert pod["metadata"]["annotations"] == {**FULL_POD["annotations"], api.LABEL_ATTEMPT: "3", **DO_NOT_DISRUPT}
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["priorityClassName"] == "training-high"
    # Scheduler, volumes and init containers are the workers' only.
    assert "schedulerName" not in pod["spec"] and "initContainers" not in pod["spec"] and "volumes" not in pod["spec"]


def test_a_spec_pod_edit_changes_the_template_hash():
    base = build_job(rtj())["metadata"]["annotations"][api.ANNOTATION_TEMPLATE_HASH]
    for pod in ({"labels": {"team": "a"}}, {"annotations": {"a": "b"}}, {"schedulerName": "s"},
                {"imagePullSecrets": [{"name": "r"}]}, {"initContainers": [{"name": "s", "image": "i"}]}):
        assert build_job(rtj(pod=pod))["metadata"]["annotations"][api.ANNOTATION_TEMPLATE_HASH] != base, pod


def test_the_builder_does_not_alias_the_spec():
    spec = rtj(pod=copy.deepcopy(FULL_POD))
    job = build_job(spec)
    template(job)["spec"]["initContainers"][0]["name"] = "changed"
    template(job)["spec"]["volumes"][-1]["name"] = "changed"
    assert spec.spec["pod"]["initContainers"][0]["name"] == "fetch"
    assert spec.spec["pod"]["volumes"][-1]["name"] == "host"


@pytest.mark.parametrize("pod, fragment", [
    ({"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": "/dev/shm/"}]},
     "is /dev/shm"),
    ({"volumes": [{"name": "d", "emptyDir": {}}], "volumeMounts": [{"name": "d", "mountPath": "/checkpoints/"}]},
     "is storage.mountPath"),
    ({"initContainers": [{"name": "s", "image": "i", "resources": {"limits": {"nvidia.com/gpu": 1},
                                                                  "requests": {"nvidia.com/gpu": 1}}}]},
     "not an init container's"),
    ({"initContainers": [{"name": "s", "image": "i", "env": [{"name": "A"}, {"name": "A"}]}]}, "duplicate name"),
    ({"initContainers": [{"name": "s", "image": "i", "resources": {"limits": {"cpu": "1"},
                                                                  "requests": {"cpu": "2"}}}]},
     "must not exceed the limit"),
])
def test_semantic_errors_catch_what_only_the_whole_spec_shows(pod, fragment):
    errors = semantic_errors(rtj(pod=pod))
    assert any(fragment in e and e.startswith("spec.pod") is False and "pod." in e for e in errors), errors


@pytest.mark.parametrize("pod", [
    {"volumes": [{"name": "d", "emptyDir": {}}, {"name": "d", "emptyDir": {}}]},
    {"initContainers": [{"name": "s", "image": "i"}, {"name": "s", "image": "j"}]},
    {"imagePullSecrets": [{"name": "r"}, {"name": "r"}]},
])
def test_duplicate_list_map_keys_are_schema_errors(pod):
    """kube-apiserver rejects duplicate keys of x-kubernetes-list-type map lists; JSON Schema cannot say it."""
    errors = schema_errors(rtj_body(pod=pod))
    assert len(errors) == 1 and "Duplicate value" in errors[0] and errors[0].startswith("spec.pod."), errors
