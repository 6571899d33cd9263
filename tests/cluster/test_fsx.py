"""The FSx for Lustre pre-flight check, against moto's AWS mock, and its effect on reconcile."""

from __future__ import annotations

import os

import boto3
import pytest
from moto import mock_aws
from moto.fsx import models as fsx_models

from clusterkit import Job, start_operator
from rtj_dev.nodes import p5_node
from rtj_operator.fsx import ZONE_LABEL, FsxCheck
from rtj_operator.spec import RTJ
from testkit import fake_aws_credentials, rtj_body, wait_until

REGION = "us-west-2"
# The node-zone checks use an instance type of their own, so the local cluster's p5 nodes
# (all in us-west-2a) do not take part; the nodes they make are real Node objects.
TYPE = "p5e.48xlarge"


@pytest.fixture
def aws(monkeypatch):
    fake_aws_credentials(monkeypatch, REGION)
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


@pytest.fixture
def nodes(kube):
    made: list[str] = []

    def make(name: str, zone: str, instance_type: str = TYPE) -> None:
        node = p5_node(f"{name}-{os.urandom(3).hex()}", zone, managed=False)
        node["metadata"]["labels"]["node.kubernetes.io/instance-type"] = instance_type
        kube.create(node)
        made.append(node["metadata"]["name"])

    yield make
    for name in made:
        kube.delete("Node", name, None)


def rtj(fs_id: str | None, **placement) -> RTJ:
    storage = {"existingClaim": "fsx", **({"fileSystemId": fs_id} if fs_id else {})}
    return RTJ.from_body(rtj_body(storage=storage, placement={"instanceType": TYPE, **placement}))


def test_available_filesystem_in_the_nodes_zone_passes(aws, kube, nodes):
    fsx, ec2 = aws
    fs_id = lustre(fsx, ec2)
    nodes("n1", "us-west-2b")
    ok, reason, message = FsxCheck(kube, fsx, ec2)(rtj(fs_id))
    assert (ok, reason) == (True, "FileSystemAvailable")
    assert message == f"FSx for Lustre {fs_id} is AVAILABLE in us-west-2b"


@pytest.mark.parametrize("lifecycle", ["CREATING", "FAILED", "MISCONFIGURED"])
def test_filesystem_not_available(aws, kube, nodes, lifecycle):
    fsx, ec2 = aws
    fs_id = lustre(fsx, ec2, lifecycle=lifecycle)
    ok, reason, message = FsxCheck(kube, fsx, ec2)(rtj(fs_id))
    assert (ok, reason) == (False, "FileSystemNotAvailable")
    assert f"is {lifecycle}, not AVAILABLE" in message


def test_missing_filesystem(aws, kube, nodes):
    fsx, ec2 = aws
    ok, reason, message = FsxCheck(kube, fsx, ec2)(rtj("fs-0123456789abcdef0"))
    assert (ok, reason) == (False, "FileSystemNotFound")
    assert "fs-0123456789abcdef0 does not exist" in message


def test_other_fsx_type_is_refused(aws, kube, nodes):
    fsx, ec2 = aws
    fs_id = lustre(fsx, ec2, kind="WINDOWS")
    assert FsxCheck(kube, fsx, ec2)(rtj(fs_id))[:2] == (False, "NotLustre")


def test_zone_mismatch_names_the_fix(aws, kube, nodes):
    fsx, ec2 = aws
    fs_id = lustre(fsx, ec2, zone="us-west-2b")
    nodes("n1", "us-west-2a")
    ok, reason, message = FsxCheck(kube, fsx, ec2)(rtj(fs_id))
    assert (ok, reason) == (False, "AvailabilityZoneMismatch")
    assert "is in us-west-2b but the job's nodes are in us-west-2a" in message
    assert f"{ZONE_LABEL}: us-west-2b" in message
    # Pinning the zone in the RTJ is what decides, not where today's nodes happen to be.
    assert FsxCheck(kube, fsx, ec2)(rtj(fs_id, nodeSelector={ZONE_LABEL: "us-west-2b"}))[0] is True


def test_nodes_of_other_instance_types_do_not_count(aws, kube, nodes):
    fsx, ec2 = aws
    fs_id = lustre(fsx, ec2, zone="us-west-2b")
    nodes("cpu-node", "us-west-2a", instance_type="m5.large")
    ok, reason, message = FsxCheck(kube, fsx, ec2)(rtj(fs_id))
    assert (ok, reason) == (True, "FileSystemAvailable") and "no matching nodes yet" in message


def test_no_filesystem_id_is_not_checked(aws, kube, nodes):
    fsx, ec2 = aws
    assert FsxCheck(kube, fsx, ec2)(rtj(None)) == (True, "NotChecked", "spec.storage.fileSystemId is not set")


def test_operator_holds_the_job_pending_until_storage_is_ready(aws, cluster, kube, ns, operator_token):
    fsx, ec2 = aws
    fs_id = lustre(fsx, ec2, zone="us-west-2a", lifecycle="CREATING")  # the local p5 nodes' zone
    kube.create({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": "fsx", "namespace": ns},
                 "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "fsx-sc",
                          "resources": {"requests": {"storage": "1200Gi"}}}})
    operator = start_operator(cluster, operator_token, ns, storage_check=FsxCheck(kube, fsx, ec2, cache_seconds=0))
    try:
        job = Job(kube, ns)
        job.create(storage={"existingClaim": "fsx", "fileSystemId": fs_id})
        cond = wait_until(lambda: job.condition("StorageReady"), what="StorageReady")
        assert cond["status"] == "False" and cond["reason"] == "FileSystemNotAvailable"
        assert job.job() is None and job.status()["phase"] == "Pending"
        # The pass posts its events after its status write: the condition can be read a moment before them.
        warnings = wait_until(lambda: [e["reason"] for e in job.events() if e["type"] == "Warning"], timeout=10,
                              what="the pass's Warning event")
        assert warnings == ["FileSystemNotAvailable"]

        fsx_models.fsx_backends["123456789012"][REGION].file_systems[fs_id].lifecycle = "AVAILABLE"
        job.wait_running()
        assert job.condition("StorageReady")["reason"] == "FileSystemAvailable"
    finally:
        operator.stop()
