"""What spec.pod adds to the pods the operator builds (pure): merged into them, never replacing.

- labels and annotations: added to the operator's own on the worker and coordinator pods; the
  operator's keys are reserved by the schema, and here its own win all the same;
- imagePullSecrets: both pods run spec.image;
- schedulerName, volumes, volumeMounts, initContainers: the worker pods only. The user's volumes and
  mounts come after the operator's, its init containers (and native sidecars) before the worker,
  which stays the pod's only regular container: the pod ends when the worker does, so its exit code
  is the pod's (the ladder reads it) and a Job index completes.

Nothing is added for an absent or empty field, so a spec without spec.pod builds exactly the pod it
built before spec.pod existed (the Job's template hash does not change; tests/unit/test_pod_template.py).
"""

from __future__ import annotations

import copy
from typing import Any

from ..spec import RTJ


def _pod(rtj: RTJ) -> dict[str, Any]:
    pod = rtj.spec.get("pod")
    return pod if isinstance(pod, dict) else {}


def _items(rtj: RTJ, field: str) -> list[dict[str, Any]]:
    value = _pod(rtj).get(field)
    return [copy.deepcopy(v) for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _strings(rtj: RTJ, field: str) -> dict[str, str]:
    value = _pod(rtj).get(field)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def pod_metadata(rtj: RTJ, labels: dict[str, str], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    """A pod's (or pod template's) metadata: the operator's labels and annotations over the spec's."""
    meta: dict[str, Any] = {"labels": {**_strings(rtj, "labels"), **labels}}
    merged = {**_strings(rtj, "annotations"), **(annotations or {})}
    if merged:
        meta["annotations"] = merged
    return meta


def image_pull_secrets(rtj: RTJ) -> dict[str, Any]:
    secrets = [{"name": s["name"]} for s in _items(rtj, "imagePullSecrets") if s.get("name")]
    return {"imagePullSecrets": secrets} if secrets else {}


def worker_pod_fields(rtj: RTJ) -> dict[str, Any]:
    """Pod spec fields the operator does not set for workers at all (nothing to merge with)."""
    fields: dict[str, Any] = image_pull_secrets(rtj)
    scheduler = _pod(rtj).get("schedulerName")
    if scheduler:
        fields["schedulerName"] = scheduler
    init = _items(rtj, "initContainers")
    if init:
        fields["initContainers"] = init
    return fields


def extra_volumes(rtj: RTJ) -> list[dict[str, Any]]:
    return _items(rtj, "volumes")


def extra_mounts(rtj: RTJ) -> list[dict[str, Any]]:
    return _items(rtj, "volumeMounts")
