"""The EC2 fencing check (fencing.py) against moto's AWS mock: a node lost with its instance still
running is no evidence; a stopped or terminated instance is, and only one found where the node is. On
the API server: tests/cluster/test_fencing.py."""

from __future__ import annotations

import boto3

from rtj_operator.fencing import Ec2Fencing, instance_id, region_of
from testkit import EC2_REGION, ec2_instance


def node_of(instance: str, name: str = "n", zone: str = f"{EC2_REGION}a") -> dict:
    return {"metadata": {"name": name}, "spec": {"providerID": f"aws:///{zone}/{instance}"}}


def test_instance_ids_come_from_the_provider_id():
    assert instance_id(node_of("i-0123456789abcdef0")) == "i-0123456789abcdef0"
    assert instance_id({"spec": {"providerID": "kwok://n"}}) == "" and instance_id({"spec": {}}) == ""


def test_only_a_stopped_or_terminated_instance_is_evidence(ec2):
    check = Ec2Fencing(ec2, cache_seconds=0)
    running, stopped, gone = ec2_instance(ec2), ec2_instance(ec2), ec2_instance(ec2)
    ec2.stop_instances(InstanceIds=[stopped])
    ec2.terminate_instances(InstanceIds=[gone])
    assert check(node_of(running)) == ""
    assert check(node_of(stopped)) == f"its EC2 instance {stopped} is stopped"
    assert check(node_of(gone)) == f"its EC2 instance {gone} is terminated"
    # Issue 29.9: not found is no evidence (a client of another account finds none of the fleet).
    assert check(node_of("i-0000000000000dead")) == ""
    assert check({"metadata": {"name": "kwok"}, "spec": {}}) == ""  # not an EC2 node: no evidence


def test_answers_are_cached(ec2):
    check = Ec2Fencing(ec2, cache_seconds=60)
    running = ec2_instance(ec2)
    assert check(node_of(running)) == ""
    ec2.stop_instances(InstanceIds=[running])
    assert check(node_of(running)) == ""  # within the cache period


def test_a_client_of_another_region_gives_no_evidence(ec2, monkeypatch):
    """Issue 29.9: every lost node looked fenced to a client of the wrong region (its instances not found);
    even a stopped instance of the same id there says nothing of the node's."""
    stopped = ec2_instance(ec2)
    ec2.stop_instances(InstanceIds=[stopped])
    assert Ec2Fencing(ec2, cache_seconds=0)(node_of(stopped, zone="eu-west-1b")) == ""
    assert region_of(node_of(stopped, zone="eu-west-1b")) == "eu-west-1" and region_of({"spec": {}}) == ""
    other = boto3.client("ec2", region_name="eu-west-1")
    assert Ec2Fencing(other, cache_seconds=0)(node_of(stopped)) == ""
