"""Node objects shaped like EKS's (p5.48xlarge GPU nodes, m5.2xlarge CPU nodes): pure dicts, so the unit
tier builds them without the local control plane (localcluster.py and the node agents register them)."""

from __future__ import annotations

from typing import Any

INSTANCE_TYPE = "p5.48xlarge"
CPU_INSTANCE_TYPE = "m5.2xlarge"
KWOK_LABEL = "kwok.rtj.dev/managed"  # kwok manages (renews the lease of) nodes with this label = "true"


def cpu_node(name: str, zone: str = "us-west-2a", managed: bool = True) -> dict[str, Any]:
    """A Node shaped like an EKS m5.2xlarge in a CPU node group: where RTJ coordinators prefer to run."""
    node = p5_node(name, zone, managed)
    node["metadata"]["labels"].update({"node.kubernetes.io/instance-type": CPU_INSTANCE_TYPE,
                                       "eks.amazonaws.com/nodegroup": "cpu"})
    node["spec"]["taints"] = []
    capacity = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    node["status"] = {"capacity": capacity, "allocatable": capacity}
    return node


def p5_node(name: str, zone: str = "us-west-2a", managed: bool = True) -> dict[str, Any]:
    """A Node shaped like an EKS p5.48xlarge in a GPU node group (labels, capacity, GPU taint)."""
    capacity = {"cpu": "192", "memory": "2048Gi", "pods": "110", "ephemeral-storage": "3800Gi",
                "nvidia.com/gpu": "8", "vpc.amazonaws.com/efa": "32", "hugepages-2Mi": "0"}
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {
            "kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": INSTANCE_TYPE, "topology.kubernetes.io/zone": zone,
            "eks.amazonaws.com/nodegroup": "p5", "type": "kwok", KWOK_LABEL: str(managed).lower()},
            "annotations": {"kwok.x-k8s.io/node": "fake"}},
        "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}]},
        "status": {"capacity": capacity, "allocatable": capacity},
    }
