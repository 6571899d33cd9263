"""Defaults, schema validation (what `kubectl apply` rejects) and the semantic checks."""

from __future__ import annotations

import pytest

from rtj_operator import api
from rtj_operator.builders.job import build_job
from rtj_operator.spec import (
    MAX_NAME_LENGTH,
    RESERVED_ENV,
    RTJ,
    allowed_service_accounts_from_env,
    nccl_timeout,
    parse_quantity,
    schema_errors,
    semantic_errors,
    with_defaults,
)
from testkit import rtj_body


def test_defaults_match_p5_and_nvrx_reference():
    spec = with_defaults({"image": "x", "nodes": {"count": 2}})
    assert spec["gpusPerNode"] == 8 and spec["efaPerNode"] == 32
    assert spec["placement"]["instanceType"] == "p5.48xlarge"
    res = spec["resiliency"]
    assert (res["heartbeatTimeoutSeconds"], res["initialHeartbeatTimeoutSeconds"], res["monitorIntervalSeconds"]) \
        == (900, 1200, 5)
    assert spec["storage"]["accessMode"] == "ReadWriteMany" and spec["storage"]["retention"] == "Retain"
    assert spec["suspend"] is False


def test_defaults_do_not_override_user_values():
    spec = with_defaults({"image": "x", "nodes": {"count": 2}, "resiliency": {"heartbeatTimeoutSeconds": 60}})
    assert spec["resiliency"]["heartbeatTimeoutSeconds"] == 60
    assert spec["resiliency"]["monitorIntervalSeconds"] == 5


@pytest.mark.parametrize("spec, fragment", [
    ({"nodes": {"count": 2}}, "'image' is a required property"),
    ({"image": "x"}, "'nodes' is a required property"),
    ({"image": "x", "nodes": {"count": 0}}, "0 is less than the minimum of 1"),
    ({"image": "x", "nodes": {"count": 2}, "gpusPerNode": 17}, "17 is greater than the maximum of 16"),
    ({"image": "x", "nodes": {"count": 2}, "storage": {"retention": "Keep"}}, "'Keep' is not one of"),
    ({"image": "x", "nodes": {"count": 2}, "shmSize": "lots"}, "does not match"),
    ({"image": "x", "nodes": {"count": "two"}}, "'two' is not of type 'integer'"),
])
def test_schema_rejects_bad_input(spec, fragment):
    body = rtj_body()
    body["spec"] = spec
    errors = schema_errors(body)
    assert any(fragment in e for e in errors), errors


def test_schema_accepts_minimal_spec():
    assert schema_errors(rtj_body()) == []


@pytest.mark.parametrize("spec, fragment", [
    ({"resiliency": {"heartbeatTimeoutSeconds": 5, "monitorIntervalSeconds": 5}},
     "heartbeatTimeoutSeconds (5) must be greater than resiliency.monitorIntervalSeconds (5)"),
    ({"resiliency": {"initialHeartbeatTimeoutSeconds": 3, "monitorIntervalSeconds": 5}},
     "initialHeartbeatTimeoutSeconds (3)"),
    ({"nodes": {"count": 2, "spares": 1}, "coordinator": {"enabled": False}},
     "nodes.spares needs coordinator.enabled: a spare may be node 0"),
    ({"coordinator": {"tolerations": [{"operator": "Exists", "value": "x"}]}},
     "coordinator.tolerations[0]: a toleration with operator Exists must not set a value"),
    ({"storage": {}}, "set exactly one of existingClaim"),
    ({"storage": {"existingClaim": "a", "storageClassName": "b"}}, "set exactly one of existingClaim"),
    ({"storage": {"storageClassName": "b", "accessMode": "ReadWriteOnce"}}, "must be ReadWriteMany"),
    ({"gpusPerNode": 0}, "efaPerNode requires gpusPerNode > 0"),
    ({"env": [{"name": "NODE_RANK", "value": "3"}]}, "env must not set NODE_RANK"),
    ({"resiliency": {"inProcessRestart": {"softTimeoutSeconds": 90, "hardTimeoutSeconds": 60}}},
     "softTimeoutSeconds (90) must be less than hardTimeoutSeconds (60)"),
])
def test_semantic_errors(spec, fragment):
    rtj = RTJ.from_body(rtj_body(**spec))
    errors = semantic_errors(rtj)
    assert any(fragment in e for e in errors), errors


def test_long_names_are_rejected_so_hostnames_stay_dns_labels():
    assert semantic_errors(RTJ.from_body(rtj_body(name="a" * MAX_NAME_LENGTH))) == []
    errors = semantic_errors(RTJ.from_body(rtj_body(name="a" * (MAX_NAME_LENGTH + 1))))
    assert errors and "metadata.name" in errors[0]


def test_reserved_env_is_exactly_what_the_job_sets():
    budget = {"maxRestartsWithoutProgress": 3}
    names: set[str] = set()
    for copies in ({"enabled": False}, {"maxBytesPerNode": "100Gi"}):  # one or the other is set
        job = build_job(RTJ.from_body(rtj_body(efaPerNode=0, gpusPerNode=0, restartBudget=budget,
                                               checkpoint={"memoryCopies": copies})))
        names |= {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert names == RESERVED_ENV
    # The defaults are the worker's own: not set, so a Job built before they existed keeps its template hash.
    default = build_job(RTJ.from_body(rtj_body(efaPerNode=0, gpusPerNode=0)))
    assert {e["name"] for e in default["spec"]["template"]["spec"]["containers"][0]["env"]} == RESERVED_ENV - {
        "RTJ_CRASH_LOOP_REPEATS", "RTJ_STATE_COPIES", "RTJ_STATE_COPIES_BYTES_PER_NODE"}


def errors_of(name: str = "train", **spec) -> list[str]:
    """Everything that rejects the RTJ: the schema (kubectl apply) and then spec.py."""
    body = rtj_body(name=name, **spec)
    return schema_errors(body) or semantic_errors(RTJ.from_body(body))


def assert_rejected(fragment: str, name: str = "train", **spec) -> None:
    errors = errors_of(name, **spec)
    assert any(fragment in e for e in errors), errors


@pytest.mark.parametrize("name", ["70b-run", "llama.v2", "Llama", "run-", "a_b"])
def test_names_that_cannot_name_a_service_or_hostname_are_rejected(name):
    assert_rejected("must be a DNS-1035 label", name=name)


def test_a_dns_1035_name_is_accepted():
    assert errors_of("llama-70b-run2") == []


@pytest.mark.parametrize("port, ok", [(65533, True), (65534, False), (65535, False)])
def test_rendezvous_port_leaves_room_for_the_derived_ports(port, ok):
    errors = errors_of(resiliency={"rendezvousPort": port})
    assert (errors == []) == ok, errors
    if not ok:
        assert "resiliency.rendezvousPort" in errors[0]


@pytest.mark.parametrize("directory", ["..", "../other", "a/../../b", "/checkpoints/../etc"])
def test_checkpoint_dir_must_not_climb_out_of_the_volume(directory):
    assert_rejected("must not contain '..'", checkpoint={"dir": directory})


def test_checkpoint_dir_is_relative_to_the_mount_or_absolute_inside_it():
    assert_rejected("not inside storage.mountPath", checkpoint={"dir": "/etc/x"})
    assert_rejected("not inside storage.mountPath", checkpoint={"dir": "/checkpointsX"})
    inside = RTJ.from_body(rtj_body(checkpoint={"dir": "/checkpoints/team/run1"}))
    assert semantic_errors(inside) == [] and inside.checkpoint_dir == "/checkpoints/team/run1"
    relative = RTJ.from_body(rtj_body(checkpoint={"dir": "team//run1/"}))
    assert semantic_errors(relative) == [] and relative.checkpoint_dir == "/checkpoints/team/run1"
    assert RTJ.from_body(rtj_body(storage={"storageClassName": "s", "mountPath": "/ckpt/"})).checkpoint_dir \
        == "/ckpt/train"


@pytest.mark.parametrize("size", ["0", "0Gi", "0.0", "000Ki", "0e3"])
def test_a_zero_storage_size_is_rejected(size):
    assert_rejected("must be a size greater than 0", storage={"storageClassName": "fsx-sc", "size": size})


@pytest.mark.parametrize("size", ["1200Gi", "0.5Gi", "1e3", "+1Ti", "1E"])
def test_positive_storage_sizes_are_accepted(size):
    assert errors_of(storage={"storageClassName": "fsx-sc", "size": size}) == []


@pytest.mark.parametrize("size", ["-1Gi", "1.2.3", "5iG", "1Gb", " 1Gi", "1Gi\n", "1e1.5"])
def test_malformed_sizes_are_rejected_by_the_schema(size):
    errors = schema_errors(rtj_body(storage={"storageClassName": "fsx-sc", "size": size}))
    assert any("storage.size" in e for e in errors), errors


@pytest.mark.parametrize("mount", ["/dev/shm", "/dev/shm/", "/dev/shm/ckpt"])
def test_the_checkpoint_volume_cannot_be_mounted_over_dev_shm(mount):
    assert_rejected("must not be /dev/shm", storage={"storageClassName": "fsx-sc", "mountPath": mount})


@pytest.mark.parametrize("env, fragment", [
    ([{"value": "x"}], "'name' is a required property"),
    ([{"name": "A", "value": 64}], "64 is not of type 'string'"),
    ([{"name": "A=B", "value": "x"}], "env.0.name"),
    ([{"name": "", "value": "x"}], "env.0.name"),
    ([{"name": "A", "value": "x", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
     "set value or valueFrom, not both"),
    ([{"name": "A", "valueFrom": {}}], "env.0.valueFrom"),
    ([{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"},
                                  "secretKeyRef": {"name": "s", "key": "k"}}}], "env.0.valueFrom"),
    ([{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "spec.containers"}}}], "fieldPath"),
    ([{"name": "A", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['bad key']"}}}],
     "is not a valid label key"),
    ([{"name": "A", "valueFrom": {"secretKeyRef": {"name": "Bad_Name", "key": "k"}}}], "secretKeyRef.name"),
    ([{"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "..k"}}}], "must not be '.' or start"),
    ([{"name": "A", "valueFrom": {"configMapKeyRef": {"name": "c"}}}], "'key' is a required property"),
    ([{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "divisor": "1k"}}}],
     "resourceFieldRef.divisor '1k' must be one of 1, 1m"),
    ([{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.nvidia.com/gpu"}}}], "resource"),
    ([{"name": "A", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu", "containerName": "x"}}}],
     "containerName"),
    ([{"name": "A", "value": "1"}, {"name": "A", "value": "2"}], "Duplicate value"),
])
def test_env_entries_kubernetes_would_reject_are_rejected(env, fragment):
    assert_rejected(fragment, env=env)


def test_env_accepts_relaxed_names_and_every_value_source():
    env = [{"name": "my.var-1 x", "value": "v"},
           {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
           {"name": "ZONE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['topology.kubernetes.io/zone']"}}},
           {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Gi"}}},
           {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}}},
           {"name": "CFG", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "a.json"}}}]
    assert errors_of(env=env) == []


@pytest.mark.parametrize("placement, fragment", [
    ({"nodeSelector": {"team": "ml research"}}, "placement.nodeSelector.team"),
    ({"nodeSelector": {"bad key": "x"}}, "nodeSelector key 'bad key' is not a valid label key"),
    ({"nodeSelector": {"a" * 254 + "/b": "x"}}, "is not a valid label key"),
    ({"nodeSelector": {"team": 3}}, "3 is not of type 'string'"),
    ({"instanceType": "p5 48xlarge"}, "placement.instanceType"),
    ({"instanceType": "x" * 64}, "placement.instanceType"),
    ({"tolerations": [{"operator": "Equal", "value": "x"}]}, "without a key must use operator Exists"),
    ({"tolerations": [{"key": "k", "operator": "Exists", "value": "x"}]}, "must not set a value"),
    ({"tolerations": [{"key": "k", "effect": "NoSchedule", "tolerationSeconds": 5}]}, "requires effect NoExecute"),
    ({"tolerations": [{"key": "k", "operator": "Bogus"}]}, "'Bogus' is not one of"),
    ({"tolerations": [{"key": "bad key", "operator": "Exists"}]}, "tolerations.0.key"),
    ({"tolerations": {"key": "k"}}, "is not of type 'array'"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "zone", "operator": "In"}]}]}}}}, "operator In needs values"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "gen", "operator": "Gt", "values": ["x"]}]}]}}}}, "one integer value"),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}},
     "should be non-empty"),
    ({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 0, "podAffinityTerm": {"topologyKey": "zone"}}]}}}, "less than the minimum of 1"),
    ({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{"labelSelector": {}}]}}},
     "'topologyKey' is a required property"),
    ({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "zone", "labelSelector": {"matchExpressions": [
            {"key": "app", "operator": "Exists", "values": ["x"]}]}}]}}}, "takes no values"),
    ({"affinity": {"podAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [
        {"topologyKey": "zone", "labelSelector": {"matchLabels": {"bad key": "x"}}}]}}}, "not a valid label key"),
    ({"affinity": "near"}, "is not of type 'object'"),
])
def test_placement_that_kubernetes_would_reject_is_rejected(placement, fragment):
    assert_rejected(fragment, placement=placement)


def test_typed_placement_accepts_the_usual_shapes():
    affinity = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "topology.kubernetes.io/zone", "operator": "In", "values": ["us-west-2a"]}]}]},
            "preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 10, "preference": {"matchFields": [
                {"key": "metadata.name", "operator": "NotIn", "values": ["node-1"]}]}}]},
        "podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": {
            "topologyKey": "topology.k8s.aws/network-node-layer-3",
            "labelSelector": {"matchLabels": {"training.rtj.dev/name": "train"}}}}]},
    }
    placement = {"nodeSelector": {"eks.amazonaws.com/nodegroup": "p5", "empty": ""}, "affinity": affinity,
                 "tolerations": [{"operator": "Exists"}, {"key": "spot", "operator": "Equal", "value": "true",
                                                          "effect": "NoExecute", "tolerationSeconds": 30}]}
    assert errors_of(placement=placement) == []


@pytest.mark.parametrize("spec, fragment", [
    ({"image": " worker:1"}, "spec.image"),
    ({"image": "worker:1 "}, "spec.image"),
    ({"image": "worker:1\n"}, "spec.image"),
    ({"serviceAccountName": "Trainer_SA"}, "spec.serviceAccountName"),
    ({"serviceAccountName": "sa\n"}, "spec.serviceAccountName"),
    ({"priorityClassName": "high..prio"}, "spec.priorityClassName"),
    ({"storage": {"storageClassName": "FSx SC"}}, "spec.storage.storageClassName"),
    ({"storage": {"existingClaim": "claim/1"}}, "spec.storage.existingClaim"),
])
def test_names_of_other_objects_must_be_valid_kubernetes_names(spec, fragment):
    assert_rejected(fragment, **spec)


@pytest.mark.parametrize("resources, fragment", [
    ({"limits": "8"}, "spec.resources.limits: '8' is not of type 'object'"),
    ({"limits": ["cpu"]}, "spec.resources.limits: ['cpu'] is not of type 'object'"),
    ({"requests": {"cpu": "lots"}}, "spec.resources.requests.cpu"),
    ({"requests": {"cpu": -1}}, "is not a non-negative quantity"),
    ({"requests": {"cpu": True}}, "spec.resources.requests.cpu"),
    ({"requests": {"cpus": "1"}}, "not a container resource"),
    ({"requests": {"kubernetes.io/foo": "1"}}, "not a container resource"),
    ({"limits": {"nvidia.com/gpu": "4"}}, "set those instead"),
    ({"requests": {"cpu": "8"}, "limits": {"cpu": "4"}}, "must not exceed the limit"),
    ({"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}, "must not exceed the limit"),
    ({"requests": {"example.com/fpga": "1"}}, "needs a limit equal to its request"),
    ({"requests": {"example.com/fpga": "1"}, "limits": {"example.com/fpga": "2"}}, "needs a limit equal"),
    ({"limits": {"example.com/fpga": "500m"}}, "must be a whole number"),
])
def test_resources_kubernetes_would_reject_are_rejected(resources, fragment):
    assert_rejected(fragment, resources=resources)


def test_odd_shapes_are_reported_by_semantic_errors_not_raised():
    """What reaches the operator without the CRD's schema (an old CRD, a test) is rejected, never a crash."""
    for spec in ({"resources": {"limits": "8"}}, {"env": ["A=1"]}, {"env": [{"name": "A", "value": 64}]},
                 {"placement": {"tolerations": "all"}}, {"placement": "anywhere"}, {"checkpoint": {"dir": 3}},
                 {"storage": {"storageClassName": "s", "size": 0}}):
        errors = semantic_errors(RTJ.from_body(rtj_body(**spec)))
        assert errors and all(e.startswith("spec.") for e in errors), (spec, errors)


def test_resources_accept_quantities_as_strings_or_integers():
    resources = {"requests": {"cpu": 180, "memory": "1800Gi", "example.com/fpga": 1},
                 "limits": {"cpu": "190", "memory": "1.9Ti", "example.com/fpga": "1", "ephemeral-storage": "1e12"}}
    assert errors_of(resources=resources) == []


def test_nodes_has_no_min_or_max():
    """Issue 30.11: nodes.min/max could only equal count (issue 19.1: NVRx 0.4.1 read min < count as "elastic
    down to min", 0.6 as "train on min, keep the rest idle"), so they are gone: kubectl's strict field
    validation names them, and a spec that set them equal to count trains as before once they are dropped."""
    body = rtj_body(nodes={"count": 8, "min": 8, "max": 8})
    assert sorted(schema_errors(body)) == ['unknown field "spec.nodes.max"', 'unknown field "spec.nodes.min"']
    assert RTJ.from_body(body).spec["nodes"] == {"count": 8, "spares": 0}


def test_nulls_and_unknown_fields_are_pruned_like_the_api_server_does():
    """Without strict field validation; kubectl's default (strict) rejects the unknown fields, naming
    them as the API server does (CI's server-side fuzz found the model accepting them)."""
    body = rtj_body(resources={"limits": None}, bogus=1, env=[{"name": "A", "value": "1", "extra": True}])
    assert schema_errors(body, strict=False) == []
    assert schema_errors(body) == ['unknown field "spec.bogus"', 'unknown field "spec.env[0].extra"']
    rtj = RTJ.from_body(body)
    assert "bogus" not in rtj.spec and rtj.spec["resources"] == {} and rtj.spec["env"] == [{"name": "A", "value": "1"}]
    assert semantic_errors(rtj) == []


@pytest.mark.parametrize("value, expected", [
    ("1Gi", 2**30), ("500m", 0.5), ("1.5k", 1500), ("1e3", 1000), (".5", 0.5), ("2", 2), (3, 3), ("1E", 10**18),
    ("-1", -1), ("1.2.3", None), ("1Gb", None), ("", None), (True, None), (None, None), (1.5, None),
])
def test_parse_quantity(value, expected):
    result = parse_quantity(value)
    assert (result is None) if expected is None else result == pytest.approx(expected)


def test_service_account_allow_list_from_env():
    assert allowed_service_accounts_from_env({}) is None
    assert allowed_service_accounts_from_env({"RTJ_ALLOWED_SERVICE_ACCOUNTS": " "}) is None
    assert allowed_service_accounts_from_env({"RTJ_ALLOWED_SERVICE_ACCOUNTS": "rtj-worker, team-a/trainer,"}) \
        == frozenset({"rtj-worker", "team-a/trainer"})


def test_service_account_allow_list_is_enforced():
    allowed = frozenset({"rtj-worker", "team-a/trainer"})

    def check(sa: str | None, namespace: str = "default") -> list[str]:
        spec = {"serviceAccountName": sa} if sa else {}
        return semantic_errors(RTJ.from_body(rtj_body(namespace=namespace, **spec)), allowed)

    assert check("rtj-worker") == [] and check("trainer", "team-a") == []
    assert "serviceAccountName 'trainer' is not allowed" in check("trainer")[0]
    assert "serviceAccountName 'admin' is not allowed" in check("admin")[0]
    assert "'default' is not allowed" in check(None)[0]  # no serviceAccountName: the namespace's default
    assert semantic_errors(RTJ.from_body(rtj_body(serviceAccountName="admin"))) == []  # no list: no limit


def test_defaults_follow_the_nvrx_reference_fault_schedule():
    res = with_defaults({"image": "x", "nodes": {"count": 2}})["resiliency"]
    assert res["maxLauncherRestarts"] == 20 and res["inProcessRestart"]["maxIterations"] == 5
    assert semantic_errors(RTJ.from_body(rtj_body())) == []
    # The default in-process timeouts leave heartbeat timeouts down to 60 s valid... with gloo; with NCCL
    # the watchdog's default (twice the hard timeout) must stay below the heartbeat timeout too.
    assert semantic_errors(RTJ.from_body(rtj_body(gpusPerNode=0, efaPerNode=0,
                                                  resiliency={"heartbeatTimeoutSeconds": 60}))) == []


@pytest.mark.parametrize("spec, value", [
    ({}, 115),  # NCCL, in-process restart: the watchdog fires only after the hard timeout (55), a minute on
    ({"resiliency": {"heartbeatTimeoutSeconds": 60}}, 57),  # ... and before the heartbeat timeout
    ({"resiliency": {"inProcessRestart": {"enabled": False}}}, 600),
    ({"gpusPerNode": 0, "efaPerNode": 0}, 30),  # gloo: below the soft timeout (45)
    ({"gpusPerNode": 0, "efaPerNode": 0, "resiliency": {"inProcessRestart": {"softTimeoutSeconds": 12,
                                                                             "hardTimeoutSeconds": 14}}}, 11),
    ({"resiliency": {"ncclTimeoutSeconds": 300}}, 300),
])
def test_the_collective_timeout_defaults_to_where_its_backend_needs_it(spec, value):
    rtj = RTJ.from_body(rtj_body(**spec))
    assert nccl_timeout(rtj.spec) == value and semantic_errors(rtj) == []


@pytest.mark.parametrize("spec, fragment", [
    ({"resiliency": {"ncclTimeoutSeconds": 30}}, "resiliency.ncclTimeoutSeconds (30) must exceed "
     "resiliency.inProcessRestart.hardTimeoutSeconds (55) with NCCL: the NCCL watchdog kills the process"),
    ({"gpusPerNode": 0, "efaPerNode": 0, "resiliency": {"ncclTimeoutSeconds": 45}},
     "resiliency.ncclTimeoutSeconds (45) must be less than resiliency.inProcessRestart.softTimeoutSeconds (45) "
     "with gloo"),
    ({"resiliency": {"inProcessRestart": {"softTimeoutSeconds": 600, "hardTimeoutSeconds": 1000}}},
     "resiliency.inProcessRestart.hardTimeoutSeconds (1000) must be less than resiliency.heartbeatTimeoutSeconds"),
    ({"resiliency": {"heartbeatTimeoutSeconds": 1500}}, "resiliency.heartbeatTimeoutSeconds (1500) must be less "
                                                        "than resiliency.initialHeartbeatTimeoutSeconds (1200)"),
    ({"resiliency": {"inProcessRestart": {"enabled": False}, "ncclTimeoutSeconds": 1000}},
     "resiliency.ncclTimeoutSeconds (1000) must be less than resiliency.heartbeatTimeoutSeconds (900)"),
    ({"resiliency": {"heartbeatTimeoutSeconds": 56}}, "resiliency.ncclTimeoutSeconds (56, its default) must be "
                                                      "less than resiliency.heartbeatTimeoutSeconds (56)"),
    ({"resiliency": {"rendezvousPort": 40000}}, "ports 40000..40002 overlap the Linux ephemeral range"),
    ({"resiliency": {"rendezvousPort": 32767}}, "ports 32767..32769 overlap"),
])
def test_timeouts_are_ordered_layer_by_layer_and_ports_avoid_ephemeral(spec, fragment):
    errors = semantic_errors(RTJ.from_body(rtj_body(**spec)))
    assert any(fragment in e for e in errors), errors


def test_rendezvous_port_leaves_room_for_the_two_derived_ports():
    assert any("65534 is greater than the maximum of 65533" in e
               for e in schema_errors(rtj_body(resiliency={"rendezvousPort": 65534})))


def test_user_env_must_keep_what_nvrx_in_process_restart_requires():
    errors = semantic_errors(RTJ.from_body(rtj_body(env=[{"name": "NCCL_NVLS_ENABLE", "value": "1"}])))
    assert any("NCCL_NVLS_ENABLE must be '0' with in-process restart" in e for e in errors), errors
    off = rtj_body(env=[{"name": "NCCL_NVLS_ENABLE", "value": "1"}],
                   resiliency={"inProcessRestart": {"enabled": False}})
    assert semantic_errors(RTJ.from_body(off)) == []


@pytest.mark.parametrize("spec, want", [
    ({}, (45, 55)),  # 2 nodes x 8 GPUs
    ({"nodes": {"count": 63}}, (45, 55)),  # 504 ranks
    ({"nodes": {"count": 64}}, (60, 90)),  # 512 ranks: NVRx's own defaults
    ({"nodes": {"count": 600}, "gpusPerNode": 0, "procsPerNode": 1}, (60, 90)),
    ({"nodes": {"count": 64}, "resiliency": {"inProcessRestart": {"softTimeoutSeconds": 30}}}, (30, 90)),
])
def test_the_in_process_timeouts_default_by_world_size(spec, want):
    """Issue 27.7: 45/55 s also covered process-group setup, which takes far longer at 512 ranks."""
    ipr = RTJ.from_body(rtj_body(**spec)).spec["resiliency"]["inProcessRestart"]
    assert (ipr["softTimeoutSeconds"], ipr["hardTimeoutSeconds"]) == want


@pytest.mark.parametrize(("copies", "env"), [
    ({}, {}),  # the worker's defaults: nothing set (a Job built before memoryCopies keeps its hash)
    ({"enabled": False}, {"RTJ_STATE_COPIES": "0"}),
    ({"maxBytesPerNode": "100Gi"}, {"RTJ_STATE_COPIES_BYTES_PER_NODE": str(100 << 30)}),
    ({"maxBytesPerNode": "1T"}, {"RTJ_STATE_COPIES_BYTES_PER_NODE": str(10**12)}),
], ids=["default", "off", "100Gi", "1T"])
def test_memory_copies_reach_the_worker_only_where_they_differ_from_its_defaults(copies, env):
    job = build_job(RTJ.from_body(rtj_body(checkpoint={"memoryCopies": copies})))
    got = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]
           if e["name"].startswith("RTJ_STATE_COPIES")}
    assert got == env


def test_the_memory_copies_default_is_the_workers():
    from rtj_worker import progress

    assert parse_quantity(api.STATE_COPIES_BYTES_PER_NODE) == progress.DEFAULT_COPIES_BYTES_PER_NODE


def test_a_memory_copies_budget_must_be_a_size():
    assert any("maxBytesPerNode" in e for e in errors_of(checkpoint={"memoryCopies": {"maxBytesPerNode": "lots"}}))
