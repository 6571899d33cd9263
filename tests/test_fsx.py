"""The FSx for Lustre pre-flight check, against moto's AWS mock, and its effect on reconcile."""

from __future__ import annotations

import boto3
import pytest
from moto import mock_aws
from moto.fsx import models as fsx_models

from conftest import rtj_body, wait_until
from rtj_operator import api
from rtj_operator.devcluster import OperatorThread, node_manifest
from rtj_operator.fsx import ZONE_LABEL, FsxCheck
from rtj_operator.spec import RTJ

REGION = "us-west-2"


@pytest.fixture
def aws(monkeypatch):
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_SESSION_TOKEN": "testing", "AWS_DEFAULT_REGION": REGION}.items():
        monkeypatch.setenv(key, value)
    # moto 5.2.5 leaves Lifecycle out of FileSystem descriptions; AWS always sends it.
    original = fsx_models.FileSystem.to_dict

    def to_dict(self):
        return {"Lifecycle": getattr(self, "lifecycle", "AVAILABLE"), **original(self)}

    monkeypatch.setattr(fsx_models.FileSystem, "to_dict", to_dict)
    with mock_aws():
        yield boto3.client("fsx", region_name=REGION), boto3.client("ec2", region_name=REGION)


def lustre(fsx, ec2, zone: str = "us-west-2b", lifecycle: str = "AVAILABLE", kind: str = "LUSTRE") -> str:
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24", AvailabilityZone=zone)["Subnet"]["SubnetId"]
    fs_id = fsx.create_file_system(FileSystemType=kind, StorageCapacity=1200, SubnetIds=[subnet])["FileSystem"][
        "FileSystemId"]
    backend = fsx_models.fsx_backends["123456789012"][REGION]
    backend.file_systems[fs_id].lifecycle = lifecycle
    return fs_id


def zoned_node(kube, name: str, zone: str) -> None:
    node = node_manifest(name)
    node["metadata"]["labels"][ZONE_LABEL] = zone
    kube.create(node)


def rtj(fs_id: str | None, **placement) -> RTJ:
    storage = {"existingClaim": "fsx", **({"fileSystemId": fs_id} if fs_id else {})}
    return RTJ.from_body(rtj_body(storage=storage, placement=placement))


def test_available_filesystem_in_the_nodes_zone_passes(aws, kube):
    fsx, ec2 = aws
    fs_id = lustre(fsx, ec2)
    zoned_node(kube, "n1", "us-west-2b")
    ok, reason, message = FsxCheck(kube, fsx, ec2)(rtj(fs_id))
    assert (ok, reason) == (True, "FileSystemAvailable")
    assert message == f"FSx for Lustre {fs_id} is AVAILABLE in us-west-2b"


@pytest.mark.parametrize("lifecycle", ["CREATING", "FAILED", "MISCONFIGURED"])
def test_filesystem_not_available(aws, kube, lifecycle):
    fsx, ec2 = aws
    fs_id = lustre(fsx, ec2, lifecycle=lifecycle)
    ok, reason, message = FsxCheck(kube, fsx, ec2)(rtj(fs_id))
    assert (ok, reason) == (False, "FileSystemNotAvailable")
    assert f"is {lifecycle}, not AVAILABLE" in message


def test_missing_filesystem(aws, kube):
    fsx, ec2 = aws
    ok, reason, message = FsxCheck(kube, fsx, ec2)(rtj("fs-0123456789abcdef0"))
    assert (ok, reason) == (False, "FileSystemNotFound")
    assert "fs-0123456789abcdef0 does not exist" in message


def test_other_fsx_type_is_refused(aws, kube):
    fsx, ec2 = aws
    fs_id = lustre(fsx, ec2, kind="WINDOWS")
    assert FsxCheck(kube, fsx, ec2)(rtj(fs_id))[:2] == (False, "NotLustre")


def test_zone_mismatch_names_the_fix(aws, kube):
    fsx, ec2 = aws
    fs_id = lustre(fsx, ec2, zone="us-west-2b")
    zoned_node(kube, "n1", "us-west-2a")
    ok, reason, message = FsxCheck(kube, fsx, ec2)(rtj(fs_id))
    assert (ok, reason) == (False, "AvailabilityZoneMismatch")
    assert "is in us-west-2b but the job's nodes are in us-west-2a" in message
    assert f"{ZONE_LABEL}: us-west-2b" in message
    # Pinning the zone in the RTJ is what decides, not where today's nodes happen to be.
    assert FsxCheck(kube, fsx, ec2)(rtj(fs_id, nodeSelector={ZONE_LABEL: "us-west-2b"}))[0] is True


def test_nodes_of_other_instance_types_do_not_count(aws, kube):
    fsx, ec2 = aws
    fs_id = lustre(fsx, ec2, zone="us-west-2b")
    other = node_manifest("cpu-node", instance_type="m5.large")
    other["metadata"]["labels"][ZONE_LABEL] = "us-west-2a"
    kube.create(other)
    ok, reason, message = FsxCheck(kube, fsx, ec2)(rtj(fs_id))
    assert (ok, reason) == (True, "FileSystemAvailable") and "no matching nodes yet" in message


def test_no_filesystem_id_is_not_checked(aws, kube):
    fsx, ec2 = aws
    assert FsxCheck(kube, fsx, ec2)(rtj(None)) == (True, "NotChecked", "spec.storage.fileSystemId is not set")


def test_operator_holds_the_job_pending_until_storage_is_ready(aws, cluster, kube, sim):
    fsx, ec2 = aws
    fs_id = lustre(fsx, ec2, lifecycle="CREATING")
    check = FsxCheck(cluster.kube(), fsx, ec2, cache_seconds=0)
    operator = OperatorThread(cluster.url, storage_check=check, max_requeue=0.3).start()
    try:
        body = rtj_body(storage={"existingClaim": "fsx", "fileSystemId": fs_id})
        body["metadata"] = {"name": "train", "namespace": "default"}
        kube.create(body)

        def condition(type_: str) -> dict | None:
            status = (kube.get(api.KIND, "train", "default") or {}).get("status") or {}
            return next((c for c in status.get("conditions", []) if c["type"] == type_), None)

        cond = wait_until(lambda: condition("StorageReady"), what="StorageReady")
        assert cond["status"] == "False" and cond["reason"] == "FileSystemNotAvailable"
        assert kube.get("Job", "train", "default") is None
        assert kube.get(api.KIND, "train", "default")["status"]["phase"] == "Pending"
        warnings = [e["reason"] for e in kube.list("Event", "default") if e["type"] == "Warning"]
        assert warnings == ["FileSystemNotAvailable"]

        fsx_models.fsx_backends["123456789012"][REGION].file_systems[fs_id].lifecycle = "AVAILABLE"
        wait_until(lambda: (condition("Running") or {}).get("status") == "True", step=sim.step, what="Running")
        assert condition("StorageReady")["reason"] == "FileSystemAvailable"
    finally:
        operator.stop()
