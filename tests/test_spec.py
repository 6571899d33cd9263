"""Defaults, schema validation (what `kubectl apply` rejects) and the semantic checks."""

from __future__ import annotations

import pytest

from conftest import rtj_body
from rtj_operator.builders.job import build_job
from rtj_operator.spec import MAX_NAME_LENGTH, RESERVED_ENV, RTJ, schema_errors, semantic_errors, with_defaults


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
    ({"nodes": {"count": 9, "max": 8}}, "nodes.count (9) must lie within nodes.min..nodes.max (9..8)"),
    ({"nodes": {"count": 5, "min": 6, "max": 5}}, "nodes.min (6) must not exceed nodes.max (5)"),
    ({"nodes": {"count": 4, "min": 5, "max": 8}}, "nodes.count (4) must lie within nodes.min..nodes.max (5..8)"),
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
    job = build_job(RTJ.from_body(rtj_body(efaPerNode=0, gpusPerNode=0)))
    names = {e["name"] for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert names == RESERVED_ENV


def test_defaults_follow_the_nvrx_reference_fault_schedule():
    res = with_defaults({"image": "x", "nodes": {"count": 2}})["resiliency"]
    assert res["maxLauncherRestarts"] == 20 and res["inProcessRestart"]["maxIterations"] == 5
    assert res["ncclTimeoutSeconds"] < res["inProcessRestart"]["softTimeoutSeconds"]
    assert semantic_errors(RTJ.from_body(rtj_body())) == []
    # The default in-process timeouts leave heartbeat timeouts down to 60 s valid.
    assert semantic_errors(RTJ.from_body(rtj_body(resiliency={"heartbeatTimeoutSeconds": 60}))) == []


@pytest.mark.parametrize("resiliency, fragment", [
    ({"ncclTimeoutSeconds": 45}, "resiliency.ncclTimeoutSeconds (45) must be less than "
                                 "resiliency.inProcessRestart.softTimeoutSeconds (45); timeouts must grow in the "
                                 "order ncclTimeoutSeconds < softTimeoutSeconds < hardTimeoutSeconds < "
                                 "heartbeatTimeoutSeconds < initialHeartbeatTimeoutSeconds"),
    ({"inProcessRestart": {"softTimeoutSeconds": 600, "hardTimeoutSeconds": 1000}},
     "resiliency.inProcessRestart.hardTimeoutSeconds (1000) must be less than resiliency.heartbeatTimeoutSeconds"),
    ({"heartbeatTimeoutSeconds": 1500}, "resiliency.heartbeatTimeoutSeconds (1500) must be less than "
                                        "resiliency.initialHeartbeatTimeoutSeconds (1200)"),
    ({"inProcessRestart": {"enabled": False}, "ncclTimeoutSeconds": 1000},
     "must be less than resiliency.heartbeatTimeoutSeconds (900); timeouts must grow in the order "
     "ncclTimeoutSeconds < heartbeatTimeoutSeconds"),
    ({"rendezvousPort": 40000}, "ports 40000..40002 overlap the Linux ephemeral range"),
    ({"rendezvousPort": 32767}, "ports 32767..32769 overlap"),
])
def test_timeouts_must_grow_from_nccl_to_the_initial_heartbeat_and_ports_avoid_ephemeral(resiliency, fragment):
    errors = semantic_errors(RTJ.from_body(rtj_body(resiliency=resiliency)))
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
