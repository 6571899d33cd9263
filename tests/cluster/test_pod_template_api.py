"""spec.pod on the real API server: `kubectl apply` rejects mistakes (strict field validation and the
CRD's CEL rules), and a job with a pod template runs and recovers with it (kwok kubelets)."""

from __future__ import annotations

import yaml

from clusterkit import Job, kubectl
from rtj_operator import api
from testkit import rtj_body, wait_until

POD = {
    "labels": {"team": "ml"},
    "annotations": {"karpenter.sh/do-not-disrupt": "true"},
    "imagePullSecrets": [{"name": "regcred"}],
    "volumes": [{"name": "scratch", "emptyDir": {"sizeLimit": "1Gi"}},
                {"name": "config", "configMap": {"name": "cfg", "optional": True}}],
    "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}],
    "initContainers": [
        {"name": "fetch", "image": "busybox:1", "command": ["true"]},
        {"name": "uploader", "image": "busybox:1", "restartPolicy": "Always",
         "volumeMounts": [{"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True}]},
    ],
}


def apply(cluster, ns: str, **spec):
    return kubectl(cluster, "apply", "-n", ns, "-f", "-", check=False,
                   input=yaml.safe_dump(rtj_body("train", ns, **spec) | {"metadata": {"name": "train"}}))


def test_kubectl_apply_rejects_pod_template_mistakes(cluster, ns):
    for pod, fragment in [
        ({"volumes": [{"name": "d", "emptyDir": {"sizeLimt": "1Gi"}}]}, 'unknown field "spec.pod.volumes[0].emptyDir'),
        ({"restartPolicy": "Always"}, 'unknown field "spec.pod.restartPolicy"'),
        ({"containers": [{"name": "x", "image": "i"}]}, 'unknown field "spec.pod.containers"'),
        ({"labels": {api.LABEL_NAME: "other"}}, "labels must not use the operator's"),
        ({"volumeMounts": [{"name": "missing", "mountPath": "/data"}]}, "must name a volume"),
        ({"initContainers": [{"name": "worker", "image": "i"}]}, "is the operator's"),
        ({"volumes": [{"name": "d", "emptyDir": {}}, {"name": "d", "emptyDir": {}}]}, "Duplicate value"),
    ]:
        result = apply(cluster, ns, pod=pod)
        assert result.returncode != 0 and fragment in result.stderr, (pod, result.stderr)
    assert apply(cluster, ns, pod=POD).returncode == 0


def test_a_job_with_a_pod_template_runs_and_recovers_with_it(kube, ns, operator):
    rtj = Job(kube, ns)
    rtj.create(pod=POD)
    rtj.wait_running()

    def has_the_template(pod: dict) -> bool:
        meta, spec = pod["metadata"], pod["spec"]
        worker = next(c for c in spec["containers"] if c["name"] == "worker")
        return (meta["labels"]["team"] == "ml" and meta["labels"][api.LABEL_NAME] == "train"
                and meta["annotations"]["karpenter.sh/do-not-disrupt"] == "true"
                and spec["imagePullSecrets"] == [{"name": "regcred"}]
                and [c["name"] for c in spec["initContainers"]] == ["fetch", "uploader"]
                and [c["name"] for c in spec["containers"]] == ["worker"]
                and {"scratch", "config", "dshm", "checkpoints"} <= {v["name"] for v in spec["volumes"]}
                and "/scratch" in [m["mountPath"] for m in worker["volumeMounts"]]
                and spec["restartPolicy"] == "Never" and not spec.get("schedulingGates"))

    first = rtj.running_pods()
    assert all(has_the_template(p) for p in first), first
    coordinator = rtj.coordinator()
    assert coordinator["metadata"]["labels"]["team"] == "ml"
    assert coordinator["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    # A worker fails: its index is replaced with the same template, the gang and its Job stay.
    job_uid = rtj.job()["metadata"]["uid"]
    rtj.exit_pod(first[0], 1)
    wait_until(lambda: rtj.status().get("jobRestarts") == 1, what="failure charged")
    rtj.wait_running(nodes=2)
    wait_until(lambda: first[0]["metadata"]["uid"] not in {p["metadata"]["uid"] for p in rtj.running_pods()},
               what="the failed pod replaced")
    assert all(has_the_template(p) for p in rtj.running_pods())
    assert rtj.job()["metadata"]["uid"] == job_uid
