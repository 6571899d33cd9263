"""capacity.fitting_nodes: which nodes could take a pod of the job, from the nodes alone."""

from __future__ import annotations

import datetime

from rtj_dev.nodes import p5_node
from rtj_operator.builders import build_job
from rtj_operator.capacity import fitting_nodes, tolerated
from rtj_operator.spec import RTJ
from testkit import rtj_body

NOW = datetime.datetime.now(datetime.UTC)


def ready(node: dict) -> dict:
    node["status"]["conditions"] = [{"type": "Ready", "status": "True",
                                     "lastTransitionTime": NOW.strftime("%Y-%m-%dT%H:%M:%SZ")}]
    return node


def pod_spec(**spec) -> dict:
    return build_job(RTJ.from_body(rtj_body(**spec)))["spec"]["template"]["spec"]


def test_ready_p5_nodes_fit_a_gpu_pod_and_others_do_not():
    fine = ready(p5_node("fine"))
    cordoned = ready(p5_node("cordoned"))
    cordoned["spec"]["unschedulable"] = True
    other_type = ready(p5_node("p4"))
    other_type["metadata"]["labels"]["node.kubernetes.io/instance-type"] = "p4d.24xlarge"
    tainted = ready(p5_node("tainted"))
    tainted["spec"]["taints"].append({"key": "rtj.dev/node-agent", "value": "true", "effect": "NoSchedule"})
    small = ready(p5_node("small"))
    small["status"]["allocatable"]["nvidia.com/gpu"] = "4"
    not_ready = p5_node("not-ready")
    nodes = [fine, cordoned, other_type, tainted, small, not_ready]
    assert list(fitting_nodes(nodes, pod_spec(), NOW)) == ["fine"]


def test_tolerations_follow_the_kubernetes_rules():
    taint = {"key": "k", "value": "v", "effect": "NoSchedule"}
    assert tolerated(taint, [{"key": "k", "operator": "Exists"}])
    assert tolerated(taint, [{"operator": "Exists"}])
    assert tolerated(taint, [{"key": "k", "value": "v", "effect": "NoSchedule"}])
    assert not tolerated(taint, [{"key": "k", "value": "w"}])
    assert not tolerated(taint, [{"key": "k", "operator": "Exists", "effect": "NoExecute"}])
