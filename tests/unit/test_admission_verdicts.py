"""Which refusals of the API server are the spec's fault (InvalidSpec ChildRejected, the running gang
kept) and which are not (the pass retries): actions.rejected over the servers' own words, and the pod
dry run that makes the pod admission plugins judge a changed template before the old gang goes."""

from __future__ import annotations

from typing import Any

import pytest

from rtj_operator.actions import CREATE, Action, execute, rejected
from rtj_operator.builders import build_job
from rtj_operator.builders.job import template_pod
from rtj_operator.kube import KubeError
from rtj_operator.spec import RTJ
from rtj_operator.world import dry_run_template
from testkit import rtj_body


@pytest.mark.parametrize("status, message, spec_fault", [
    (422, 'Job.batch "train" is invalid: spec.template.spec.containers[0].image: Required value', True),
    (400, "the object provided is unrecognized", True),
    (403, 'admission webhook "vjob.kb.io" denied the request: images must come from registry.internal', True),
    (403, 'jobs.batch "train" is forbidden: ValidatingAdmissionPolicy \'images\' with binding \'images\' '
          'denied request: images must come from registry.internal', True),
    # plugin/pkg/admission/priority: the named PriorityClass does not exist
    (403, 'pods "train-rdzv" is forbidden: no PriorityClass with name rtj-worker was found', True),
    # plugin/pkg/admission/serviceaccount
    (403, 'pods "train-rdzv" is forbidden: error looking up service account t/trainer: serviceaccount '
          '"trainer" not found', True),
    (403, 'pods "train-rdzv" is forbidden: violates PodSecurity "restricted:latest": privileged', True),
    # Not the spec's: RBAC, a namespace going away, quota the running gang holds, the server busy.
    (403, 'pods is forbidden: User "system:serviceaccount:rtj:rtj-operator" cannot create resource "pods"', False),
    (403, 'pods "train-rdzv" is forbidden: unable to create new content in namespace t because it is being '
          'terminated', False),
    (403, 'pods "train-rdzv" is forbidden: exceeded quota: gpus, requested: nvidia.com/gpu=8', False),
    (429, "the server has received too many requests", False),
    (500, "etcdserver: request timed out", False),
])
def test_a_refusal_is_the_specs_fault_only_in_the_servers_words_for_it(status, message, spec_fault):
    assert rejected(KubeError(status, message)) is spec_fault


class FakeKube:
    """Answers creates from a table keyed by kind; records what it was asked."""

    def __init__(self, answers: dict[str, KubeError | None]):
        self.answers, self.asked = answers, []

    def create(self, obj: dict[str, Any], dry_run: bool = False) -> dict[str, Any]:
        self.asked.append((obj["kind"], dry_run))
        error = self.answers.get(obj["kind"])
        if error is not None:
            raise error
        return obj


def test_a_missing_priority_class_on_create_is_a_rejection_not_a_crashed_pass():
    job = build_job(RTJ.from_body(rtj_body(priorityClassName="rtj-worker")))
    kube = FakeKube({"Job": KubeError(403, 'jobs.batch "train" is forbidden: no PriorityClass with name '
                                           'rtj-worker was found')})
    [result] = execute(kube, [Action(CREATE, "Job", "train", "default", job, gates=True)])
    assert not result.ok and "no PriorityClass with name rtj-worker" in result.rejected


def test_the_template_pod_is_what_the_job_controller_would_create():
    job = build_job(RTJ.from_body(rtj_body(priorityClassName="high", serviceAccountName="trainer")))
    pod = template_pod(job)
    assert pod["kind"] == "Pod" and pod["metadata"]["namespace"] == job["metadata"]["namespace"]
    assert pod["spec"] == job["spec"]["template"]["spec"]
    assert pod["spec"]["priorityClassName"] == "high" and pod["spec"]["serviceAccountName"] == "trainer"
    assert pod["metadata"]["labels"] == job["spec"]["template"]["metadata"]["labels"]
    pod["spec"]["containers"].clear()
    assert job["spec"]["template"]["spec"]["containers"], "the probe is a copy"


@pytest.mark.parametrize("answers, verdict", [
    ({}, (True, "")),
    ({"Job": KubeError(409, "already exists")}, (True, "")),
    ({"Job": KubeError(422, "spec.template: invalid")}, (False, "HTTP 422: spec.template: invalid")),
    # The Job's template passes, but no pod of it could be created: the old gang must stay.
    ({"Pod": KubeError(403, "no PriorityClass with name high was found")},
     (False, "HTTP 403: no PriorityClass with name high was found")),
    # Quota held by the running gang: the new gang's pods are the Job controller's to retry.
    ({"Pod": KubeError(403, "exceeded quota: gpus")}, (True, "")),
])
def test_a_changed_template_is_judged_as_a_job_and_as_a_pod(answers, verdict):
    kube = FakeKube(answers)
    assert dry_run_template(kube, build_job(RTJ.from_body(rtj_body(priorityClassName="high")))) == verdict
    assert all(dry for _, dry in kube.asked)


def test_an_error_that_is_not_the_specs_on_the_job_dry_run_fails_the_pass():
    with pytest.raises(KubeError):
        dry_run_template(FakeKube({"Job": KubeError(500, "etcd")}), build_job(RTJ.from_body(rtj_body())))
