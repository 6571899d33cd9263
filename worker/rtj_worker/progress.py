"""Tell the operator about checkpoint progress: each pod's local rank 0 annotates its own Pod
with the newest complete checkpoint step (training.rtj.dev/checkpoint-step).

Best effort and off the training thread: outside Kubernetes, or without RBAC to patch pods,
it does nothing; the entrypoint's termination message still carries the step.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)
ANNOTATION = "training.rtj.dev/checkpoint-step"


def publisher(rank: int) -> Callable[[int], None] | None:
    pod, namespace = os.environ.get("POD_NAME"), os.environ.get("POD_NAMESPACE")
    if int(os.environ.get("LOCAL_RANK", rank)) != 0 or not pod or not namespace \
            or not os.environ.get("KUBERNETES_SERVICE_HOST"):
        return None

    def publish(step: int) -> None:
        threading.Thread(target=_patch, args=(pod, namespace, step), daemon=True).start()

    return publish


def _patch(pod: str, namespace: str, step: int) -> None:
    try:
        import kubernetes

        kubernetes.config.load_incluster_config()
        kubernetes.client.CoreV1Api().patch_namespaced_pod(
            pod, namespace, {"metadata": {"annotations": {ANNOTATION: str(step)}}})
    except Exception as exc:  # progress reporting must never disturb training
        log.debug("could not annotate pod %s with step %d: %s", pod, step, exc)
