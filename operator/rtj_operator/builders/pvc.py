"""The shared checkpoint volume, created only when the spec names a StorageClass."""

from __future__ import annotations

from typing import Any

from ..spec import RTJ
from .names import labels, pvc_name


def build_pvc(rtj: RTJ) -> dict[str, Any] | None:
    storage = rtj.spec["storage"]
    if storage.get("existingClaim"):
        return None
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": pvc_name(rtj), "namespace": rtj.namespace, "labels": labels(rtj, "checkpoints")},
        "spec": {
            "accessModes": [storage["accessMode"]],
            "storageClassName": storage["storageClassName"],
            "resources": {"requests": {"storage": storage["size"]}},
        },
    }
