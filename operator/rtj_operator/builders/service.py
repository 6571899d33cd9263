"""Headless Service: gives each pod the DNS name '<job>-<index>.<service>' for rendezvous."""

from __future__ import annotations

from typing import Any

from ..spec import RTJ
from .names import labels, selector_labels, service_name


def build_service(rtj: RTJ) -> dict[str, Any]:
    port = rtj.spec["resiliency"]["rendezvousPort"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service_name(rtj), "namespace": rtj.namespace, "labels": labels(rtj, "peers")},
        "spec": {
            "clusterIP": "None",
            # Peers must resolve each other before they are Ready: readiness follows rendezvous.
            "publishNotReadyAddresses": True,
            "selector": selector_labels(rtj),
            "ports": [{"name": "rendezvous", "port": port, "targetPort": port, "protocol": "TCP"}],
        },
    }
