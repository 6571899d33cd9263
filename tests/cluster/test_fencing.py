"""Issue 17.3: a pod stuck on a lost node is replaced only with evidence its node runs nothing any more.
The EC2 check (fencing.py) against moto's AWS mock, then on the local control plane: a kwok node
whose providerID names a moto instance is lost; its pod waits (WaitingForFencing) while the instance
runs, and is failed and replaced once the instance is stopped."""

from __future__ import annotations

import os

import boto3
import pytest
from moto import mock_aws

from conftest import Job, fake_aws_credentials, start_operator, wait_until
from rtj_dev.localcluster import p5_node
from rtj_operator.fencing import Ec2Fencing, instance_id

REGION = "us-west-2"


@pytest.fixture
def ec2(monkeypatch):
    fake_aws_credentials(monkeypatch, REGION)
    with mock_aws():
        yield boto3.client("ec2", region_name=REGION)


def instance(ec2) -> str:
    image = ec2.describe_images()["Images"][0]["ImageId"]
    return ec2.run_instances(ImageId=image, MinCount=1, MaxCount=1, InstanceType="p5.48xlarge")["Instances"][0][
        "InstanceId"]


def node_of(instance: str, name: str = "n") -> dict:
    return {"metadata": {"name": name}, "spec": {"providerID": f"aws:///us-west-2a/{instance}"}}


def test_instance_ids_come_from_the_provider_id():
    assert instance_id(node_of("i-0123456789abcdef0")) == "i-0123456789abcdef0"
    assert instance_id({"spec": {"providerID": "kwok://n"}}) == "" and instance_id({"spec": {}}) == ""


def test_only_a_stopped_terminated_or_vanished_instance_is_evidence(ec2):
    check = Ec2Fencing(ec2, cache_seconds=0)
    running, stopped, gone = instance(ec2), instance(ec2), instance(ec2)
    ec2.stop_instances(InstanceIds=[stopped])
    ec2.terminate_instances(InstanceIds=[gone])
    assert check(node_of(running)) == ""
    assert check(node_of(stopped)) == f"its EC2 instance {stopped} is stopped"
    assert check(node_of(gone)) == f"its EC2 instance {gone} is terminated"
    assert check(node_of("i-0000000000000dead")) == "its EC2 instance i-0000000000000dead no longer exists"
    assert check({"metadata": {"name": "kwok"}, "spec": {}}) == ""  # not an EC2 node: no evidence


def test_answers_are_cached(ec2):
    check = Ec2Fencing(ec2, cache_seconds=60)
    running = instance(ec2)
    assert check(node_of(running)) == ""
    ec2.stop_instances(InstanceIds=[running])
    assert check(node_of(running)) == ""  # within the cache period


def test_a_lost_nodes_pod_is_replaced_once_its_instance_is_stopped(ec2, cluster, kube, ns, operator_token):
    running = instance(ec2)
    name = f"p5-ec2-{os.urandom(3).hex()}"
    node = p5_node(name)
    node["metadata"]["labels"]["rtj.dev/test-node"] = name
    node["spec"]["providerID"] = f"aws:///us-west-2a/{running}"
    kube.create(node)
    operator = start_operator(cluster, operator_token, ns, cloud_fencing=Ec2Fencing(ec2, cache_seconds=0))
    try:
        job = Job(kube, ns)
        job.create(nodes={"count": 1}, placement={"nodeSelector": {"rtj.dev/test-node": name}},
                   restartBudget={"nodeLossGraceSeconds": 1, "terminatingTimeoutSeconds": 2})
        job.wait_running(nodes=1, timeout=60)
        (pod,) = job.running_pods()
        cluster.lose_node(name)
        cond = wait_until(lambda: job.condition("WaitingForFencing") if job.condition("WaitingForFencing").get(
            "status") == "True" else None, timeout=60, what="WaitingForFencing")
        assert name in cond["message"] and "ForceDeletedPod" not in job.reasons()
        ec2.stop_instances(InstanceIds=[running])
        wait_until(lambda: "ForceDeletedPod" in job.reasons(), timeout=30, what="the pod forced")
        event = next(e for e in job.events() if e["reason"] == "ForceDeletedPod")
        assert f"its EC2 instance {running} is stopped" in event["message"]
        wait_until(lambda: all(p["metadata"]["uid"] != pod["metadata"]["uid"] for p in job.pods()), timeout=30,
                   what="the old pod gone")
        assert job.status()["disruptions"] == 1 and job.status().get("jobRestarts", 0) == 0
    finally:
        operator.stop()
        kube.delete("Node", name, None)
