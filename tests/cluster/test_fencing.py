"""Issue 17.3: a pod stuck on a lost node is replaced only with evidence its node runs nothing any more.
On the local control plane: a kwok node whose providerID names a moto instance is lost; its pod waits
(WaitingForFencing) while the instance runs, and is failed and replaced once the instance is stopped.
The EC2 check alone: tests/unit/test_fencing.py."""

from __future__ import annotations

import os

from clusterkit import Job, start_operator
from rtj_dev.nodes import p5_node
from rtj_operator.fencing import Ec2Fencing
from testkit import ec2_instance, wait_until


def test_a_lost_nodes_pod_is_replaced_once_its_instance_is_stopped(ec2, cluster, kube, ns, operator_token):
    running = ec2_instance(ec2)
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
