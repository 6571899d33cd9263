"""The EC2 fencing check (fencing.py) against moto's AWS mock: a node lost with its instance still
running is no evidence; a stopped, terminated or vanished instance is. On the API server:
tests/cluster/test_fencing.py."""

from __future__ import annotations

from rtj_operator.fencing import Ec2Fencing, instance_id
from testkit import ec2_instance


def node_of(instance: str, name: str = "n") -> dict:
    return {"metadata": {"name": name}, "spec": {"providerID": f"aws:///us-west-2a/{instance}"}}


def test_instance_ids_come_from_the_provider_id():
    assert instance_id(node_of("i-0123456789abcdef0")) == "i-0123456789abcdef0"
    assert instance_id({"spec": {"providerID": "kwok://n"}}) == "" and instance_id({"spec": {}}) == ""


def test_only_a_stopped_terminated_or_vanished_instance_is_evidence(ec2):
    check = Ec2Fencing(ec2, cache_seconds=0)
    running, stopped, gone = ec2_instance(ec2), ec2_instance(ec2), ec2_instance(ec2)
    ec2.stop_instances(InstanceIds=[stopped])
    ec2.terminate_instances(InstanceIds=[gone])
    assert check(node_of(running)) == ""
    assert check(node_of(stopped)) == f"its EC2 instance {stopped} is stopped"
    assert check(node_of(gone)) == f"its EC2 instance {gone} is terminated"
    assert check(node_of("i-0000000000000dead")) == "its EC2 instance i-0000000000000dead no longer exists"
    assert check({"metadata": {"name": "kwok"}, "spec": {}}) == ""  # not an EC2 node: no evidence


def test_answers_are_cached(ec2):
    check = Ec2Fencing(ec2, cache_seconds=60)
    running = ec2_instance(ec2)
    assert check(node_of(running)) == ""
    ec2.stop_instances(InstanceIds=[running])
    assert check(node_of(running)) == ""  # within the cache period
