"""Unit tests of the pure builders: RTJ in, manifest out."""

from __future__ import annotations

import re

import pytest

from rtj_operator import api
from rtj_operator.builders import (
    build_coordinator,
    build_job,
    build_pvc,
    build_service,
    coordinator_name,
    job_name,
    pvc_name,
    service_name,
)
from rtj_operator.builders.job import EFA, GPU, template_hash
from rtj_operator.policies.pods import attempt_job_name, is_older
from rtj_operator.spec import RTJ
from rtj_worker import exit_codes
from testkit import rtj_body


def rtj(**spec) -> RTJ:
    return RTJ.from_body(rtj_body(**spec))


def env_of(job: dict) -> dict:
    container = job["spec"]["template"]["spec"]["containers"][0]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def test_service_is_headless_and_publishes_not_ready_peers():
    svc = build_service(rtj())
    assert svc["metadata"]["name"] == service_name(rtj()) == "train"
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    assert svc["spec"]["selector"] == {api.LABEL_NAME: "train"}
    assert svc["spec"]["ports"][0]["port"] == 29400


def test_job_is_indexed_one_pod_per_node_with_stable_hostnames():
    job = build_job(rtj(nodes={"count": 4}))
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 4
    assert pod["subdomain"] == "train" and pod["restartPolicy"] == "Never"
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    # The gang's workers only: the coordinator pod leaves a node usable for a worker.
    assert anti["labelSelector"]["matchLabels"] == {api.LABEL_NAME: "train", api.LABEL_COMPONENT: "workers"}


def test_the_coordinator_prefers_another_instance_type_and_a_node_without_its_gangs_workers():
    """Only preferred (it still runs on a cluster of GPU nodes only, or a small one); required would leave
    a gang without its rendezvous where every node runs a worker."""
    pod = build_coordinator(rtj(), 1)
    affinity = pod["spec"]["affinity"]
    (node,) = affinity["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert node["preference"]["matchExpressions"] == [{"key": "node.kubernetes.io/instance-type",
                                                       "operator": "NotIn", "values": ["p5.48xlarge"]}]
    (anti,) = affinity["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert anti["podAffinityTerm"] == {"topologyKey": "kubernetes.io/hostname", "labelSelector": {
        "matchLabels": {api.LABEL_NAME: "train", api.LABEL_COMPONENT: "workers"}}}
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in affinity["podAntiAffinity"]
    assert {"key": GPU, "operator": "Exists", "effect": "NoSchedule"} in pod["spec"]["tolerations"]


def test_autoscalers_are_asked_not_to_move_the_coordinator():
    """Issue 29.4: a Karpenter consolidation removing it ended the gang's rendezvous."""
    annotations = build_coordinator(rtj(), 1)["metadata"]["annotations"]
    assert annotations["karpenter.sh/do-not-disrupt"] == "true"
    assert annotations["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"


def test_job_env_derives_rendezvous_from_index_zero_and_rank_from_completion_index():
    env = env_of(build_job(rtj(nodes={"count": 4}, coordinator={"enabled": False}), attempt=2))
    assert env["MASTER_ADDR"] == "train-a2-0.train.default.svc"
    assert env["RTJ_RDZV_ENDPOINT"] == "train-a2-0.train.default.svc:29400"
    assert env["NNODES"] == "4" and env["RTJ_NNODES"] == "4:4"
    assert env["NODE_RANK"] == {"fieldRef": {"fieldPath":
                                             "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}
    assert env["RTJ_RDZV_ID"] == "uid-train-2"
    assert env["RTJ_FT_HEARTBEAT_TIMEOUT"] == "900" and env["RTJ_FT_INITIAL_HEARTBEAT_TIMEOUT"] == "1200"
    assert env["RTJ_FT_MONITOR_INTERVAL"] == "5"
    assert env["RTJ_CHECKPOINT_DIR"] == "/checkpoints/train"
    assert env["NPROC_PER_NODE"] == "8"


def test_job_requests_gpus_and_efa_and_mounts_shm_and_checkpoints():
    job = build_job(rtj(resources={"requests": {"cpu": "100"}}, shmSize="128Gi"))
    pod = job["spec"]["template"]["spec"]
    res = pod["containers"][0]["resources"]
    assert res["limits"] == {GPU: "8", EFA: "32"}
    assert res["requests"] == {"cpu": "100", GPU: "8", EFA: "32"}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "128Gi"}
    assert volumes["checkpoints"]["persistentVolumeClaim"]["claimName"] == "train-ckpt"
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    assert mounts == {"dshm": "/dev/shm", "checkpoints": "/checkpoints"}
    assert env_of(job)["FI_PROVIDER"] == "efa"


def test_cpu_job_has_no_accelerator_resources_or_gpu_toleration():
    job = build_job(rtj(gpusPerNode=0, efaPerNode=0, procsPerNode=2))
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["resources"] == {}
    assert pod["tolerations"] == []
    assert env_of(job)["NPROC_PER_NODE"] == "2"
    assert "FI_PROVIDER" not in env_of(job)


def test_job_placement_merges_instance_type_selector_tolerations_and_affinity():
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]}]}]}}}
    job = build_job(rtj(placement={"nodeSelector": {"eks.amazonaws.com/nodegroup": "p5"},
                                   "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists"}],
                                   "affinity": affinity}))
    pod = job["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge",
                                   "eks.amazonaws.com/nodegroup": "p5"}
    assert pod["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists"}]  # not duplicated
    assert pod["affinity"]["nodeAffinity"] == affinity["nodeAffinity"]
    assert "podAntiAffinity" in pod["affinity"]


def test_pod_failure_policy_ignores_disruptions_first_and_fails_fast_on_permanent_codes():
    spec = build_job(rtj())["spec"]
    rules = spec["podFailurePolicy"]["rules"]
    # First match wins: a drained pod that exits 64 is a disruption, not a configuration error.
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert rules[1]["action"] == "FailJob" and rules[1]["onExitCodes"]["values"] == sorted(exit_codes.PERMANENT)
    assert spec["podReplacementPolicy"] == "Failed"


def test_the_job_never_fails_on_its_own_for_failures_the_operator_excuses():
    """Issue 17.2: no Job-wide backoffLimit (maxRestarts + 1 counted 7 peer exits of an 8-node job as
    failures); per-index mode for the per-index back-off and failure counts it exposes."""
    spec = build_job(rtj(restartBudget={"maxRestarts": 3}))["spec"]
    assert "backoffLimit" not in spec and "maxFailedIndexes" not in spec
    assert spec["backoffLimitPerIndex"] == 2**31 - 1


def test_job_user_env_and_args_are_passed_through():
    job = build_job(rtj(args=["--steps", "10"], env=[{"name": "NCCL_DEBUG", "value": "INFO"},
                                                     {"name": "FI_PROVIDER", "value": "tcp"}]))
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["--steps", "10"]
    assert container["command"] == ["rtj-worker", "--", "python", "-m", "rtj_worker.train"]
    names = [e["name"] for e in container["env"]]
    assert names.count("FI_PROVIDER") == 1 and env_of(job)["FI_PROVIDER"] == "tcp"
    assert env_of(job)["NCCL_DEBUG"] == "INFO"


def test_builders_are_deterministic_and_hash_tracks_template_changes():
    assert build_job(rtj()) == build_job(rtj())
    a = build_job(rtj())["metadata"]["annotations"][api.ANNOTATION_TEMPLATE_HASH]
    assert a == template_hash(build_job(rtj()))
    assert a != build_job(rtj(image="worker:2"))["metadata"]["annotations"][api.ANNOTATION_TEMPLATE_HASH]
    # Suspending is done in place, not by a new Job; a budget edit changes nothing in the Job.
    assert a == build_job(rtj(suspend=True))["metadata"]["annotations"][api.ANNOTATION_TEMPLATE_HASH]
    assert a == build_job(rtj(restartBudget={"maxRestarts": 9}))["metadata"]["annotations"][
        api.ANNOTATION_TEMPLATE_HASH]
    assert build_job(rtj(suspend=True))["spec"]["suspend"] is True


def test_pvc_is_created_only_for_a_storage_class():
    pvc = build_pvc(rtj(storage={"storageClassName": "fsx-sc", "size": "2400Gi"}))
    assert pvc["metadata"]["name"] == pvc_name(rtj()) == "train-ckpt"
    assert pvc["spec"] == {"accessModes": ["ReadWriteMany"], "storageClassName": "fsx-sc",
                           "resources": {"requests": {"storage": "2400Gi"}}}
    existing = rtj(storage={"existingClaim": "shared-fsx"})
    assert build_pvc(existing) is None
    assert pvc_name(existing) == "shared-fsx"
    claim = build_job(existing)["spec"]["template"]["spec"]["volumes"][1]["persistentVolumeClaim"]["claimName"]
    assert claim == "shared-fsx"


def rtj_named(name: str) -> RTJ:
    body = rtj_body()
    body["metadata"]["name"] = name
    return RTJ.from_body(body)


def test_names_are_deterministic():
    r = rtj()
    assert (job_name(r, 1), service_name(r), pvc_name(r)) == ("train-a1", "train", "train-ckpt")
    assert job_name(r, 12) == "train-a12" and coordinator_name(job_name(r, 12)) == "train-a12-rdzv"
    assert build_coordinator(r, 3)["metadata"]["name"] == build_coordinator(r, 3)["spec"]["hostname"] == "train-a3-rdzv"
    # A gang an earlier operator made keeps its names: its Job's, and its coordinator's after it.
    assert build_coordinator(r, 3, "train")["metadata"]["name"] == "train-rdzv"


@pytest.mark.parametrize("name", ["a" * api.MAX_NAME_LENGTH, "b" * 55, "c" * 50 + "-" + "d" * 7, "x"])
def test_every_attempt_has_its_own_job_name_that_keeps_hostnames_dns_labels(name: str):
    """Pods are '<job>-<index>' and the coordinator '<job>-rdzv': each must stay a DNS label (63) at any
    attempt, names of two RTJs sharing a long prefix must differ, and so must two attempts'."""
    r, other = rtj_named(name), rtj_named(name[:-1] + ("z" if name[-1] != "z" else "y"))
    for attempt in (1, 9, 10, 12345, 10**6 - 1):
        job = job_name(r, attempt)
        assert len(f"{job}-1023") <= 63 and len(coordinator_name(job)) <= 63, job
        assert re.fullmatch(api.DNS1035_LABEL, job) and job.endswith(f"-a{attempt}")
        assert job != job_name(r, attempt + 1) and job != job_name(other, attempt)
    assert job_name(r, 1) == job_name(rtj_named(name), 1)  # deterministic


def test_the_name_of_an_attempts_job_is_the_existing_ones_or_the_one_it_gets():
    """World (this attempt's coordinator) and Draft (status.attempt, maybe one ahead) ask the same rule."""
    r = rtj()
    legacy = {"metadata": {"name": "train", "annotations": {api.LABEL_ATTEMPT: "2"}}}
    assert attempt_job_name(legacy, r, 2) == "train"  # an earlier operator's gang keeps its name
    assert attempt_job_name(legacy, r, 3) == "train-a3" and attempt_job_name(None, r, 1) == "train-a1"
    assert is_older(legacy, 3) and not is_older(legacy, 2) and not is_older(None, 3)


def test_builders_do_not_crash_on_wrong_shaped_parts():
    """semantic_errors rejects these first; a builder that still meets one treats the part as absent."""
    for spec in ({"resources": {"limits": "8"}}, {"resources": {"limits": ["cpu"], "requests": None}},
                 {"resources": "lots"}, {"env": "A=1"}, {"env": ["A=1", {"name": "B", "value": "2"}]},
                 {"placement": {"tolerations": "all", "affinity": "near", "nodeSelector": ["a"]}}):
        job = build_job(RTJ(name="train", namespace="default", uid="u", generation=1,
                            spec={**rtj().spec, **{k: v for k, v in spec.items() if k != "placement"},
                                  "placement": {**rtj().spec["placement"], **spec.get("placement", {})}}))
        pod = job["spec"]["template"]["spec"]
        assert pod["containers"][0]["resources"]["limits"] == {GPU: "8", EFA: "32"}
        assert pod["tolerations"] == [{"key": GPU, "operator": "Exists", "effect": "NoSchedule"}]
        assert "podAntiAffinity" in pod["affinity"]
        assert pod["nodeSelector"] == {"node.kubernetes.io/instance-type": "p5.48xlarge"}


def test_an_absolute_checkpoint_dir_inside_the_mount_is_used_as_is():
    env = env_of(build_job(rtj(checkpoint={"dir": "/checkpoints/shared/run-7"})))
    assert env["RTJ_CHECKPOINT_DIR"] == "/checkpoints/shared/run-7"
    assert env_of(build_job(rtj(checkpoint={"dir": "shared/run-7"})))["RTJ_CHECKPOINT_DIR"] \
        == "/checkpoints/shared/run-7"


def test_gpu_pods_get_nvrx_nccl_efa_env_ipc_lock_and_cpu_memory_requests():
    job = build_job(rtj())
    env, container = env_of(job), job["spec"]["template"]["spec"]["containers"][0]
    assert env["NCCL_NVLS_ENABLE"] == "0" and env["TORCH_NCCL_RETHROW_CUDA_ERRORS"] == "0"
    assert env["RDMAV_FORK_SAFE"] == "1" and env["FI_EFA_FORK_SAFE"] == "1" and env["FI_PROVIDER"] == "efa"
    assert env["NCCL_TUNER_PLUGIN"] == "/opt/amazon/ofi-nccl/lib/libnccl-ofi-tuner.so"
    assert container["securityContext"] == {"capabilities": {"add": ["IPC_LOCK"]}}
    assert container["resources"]["requests"] == {"cpu": "160", "memory": "1600Gi", GPU: "8", EFA: "32"}
    user = build_job(rtj(env=[{"name": "NCCL_SOCKET_IFNAME", "value": "eth0"}]))
    assert env_of(user)["NCCL_SOCKET_IFNAME"] == "eth0"  # the user's value, once
    assert [e["name"] for e in user["spec"]["template"]["spec"]["containers"][0]["env"]].count(
        "NCCL_SOCKET_IFNAME") == 1


def test_cpu_pods_get_no_nccl_env_or_ipc_lock():
    job = build_job(rtj(gpusPerNode=0, efaPerNode=0))
    assert "NCCL_NVLS_ENABLE" not in env_of(job)
    assert "securityContext" not in job["spec"]["template"]["spec"]["containers"][0]


def test_job_env_carries_uid_nccl_timeout_and_no_progress_limit_and_reserves_three_ports():
    job = build_job(rtj(resiliency={"ncclTimeoutSeconds": 20, "maxNoProgressCycles": 4},
                        coordinator={"enabled": False}))
    env = env_of(job)
    assert env["RTJ_UID"] == "uid-train" and env["RTJ_NCCL_TIMEOUT"] == "20"
    assert env["RTJ_FT_MAX_NO_PROGRESS_CYCLES"] == "4"
    ports = job["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert [(p["name"], p["containerPort"]) for p in ports] == [
        ("rendezvous", 29400), ("store", 29401), ("inprocess-store", 29402)]


@pytest.mark.parametrize("grace", [None, 30, 900])
def test_the_pods_grace_period_is_the_specs_and_the_worker_stops_within_it(grace):
    """Issue 27.2: a fixed 120 s fits no 96 GB stop-save below about 1.1 GB/s."""
    job = build_job(rtj(resiliency={} if grace is None else {"terminationGracePeriodSeconds": grace}))
    want = 120 if grace is None else grace
    assert job["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == want
    assert env_of(job)["RTJ_GRACE_SECONDS"] == str(want)


def test_default_requests_never_exceed_a_limit_the_user_set():
    """Found by the fuzz test: 160 CPUs requested under a 1-CPU limit is a Job the API server rejects."""
    resources = build_job(rtj(resources={"limits": {"cpu": "1"}}))["spec"]["template"]["spec"]["containers"][0][
        "resources"]
    assert "cpu" not in {k for k in resources["requests"] if k != GPU} and resources["requests"]["memory"] == "1600Gi"
