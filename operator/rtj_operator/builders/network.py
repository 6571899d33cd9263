"""The gang's NetworkPolicy: only the RTJ's own pods (its workers and its coordinator) reach them.

The rendezvous, the ranks' stores and the process groups' ports answer anyone who can connect (a
TCPStore has no authentication): on a shared cluster, a neighbour's pod could join a rendezvous round,
read or overwrite store keys, or stall a collective. Ingress to every pod of the job is therefore
allowed from the job's own pods only, plus `spec.isolation.allowFrom` (NetworkPolicy peers: a
profiler, a metrics scraper). Egress is left alone (DNS, the API server, storage, image registries).
Enforced by the cluster's network policy engine (the EKS VPC CNI's, once enabled; Calico, Cilium);
where none runs, the object changes nothing.
"""

from __future__ import annotations

from typing import Any

from ..spec import RTJ
from .names import labels, network_policy_name, selector_labels


def build_network_policy(rtj: RTJ) -> dict[str, Any] | None:
    isolation = rtj.spec["isolation"]
    if not isolation["enabled"]:
        return None
    peers = [{"podSelector": {"matchLabels": selector_labels(rtj)}}, *(isolation.get("allowFrom") or [])]
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": network_policy_name(rtj), "namespace": rtj.namespace,
                     "labels": labels(rtj, "isolation")},
        "spec": {"podSelector": {"matchLabels": selector_labels(rtj)}, "policyTypes": ["Ingress"],
                 "ingress": [{"from": peers}]},
    }
