"""A small CPU ResilientTrainingJob for the node agents (nodeagent.py): 2 nodes x 2 gloo ranks,
a tiny model, short timeouts so a fault is recovered in seconds. Used by tests/e2e/test_e2e.py and
bench/goodput.py; the training run's timeline lands in <shared dir>/<name>/events.jsonl.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from rtj_operator import api

from .localcluster import LocalCluster
from .nodeagent import AGENT_LABEL

MOUNT = "/checkpoints"
TOLERATIONS = [{"key": key, "operator": "Exists", "effect": "NoSchedule"} for key in ("nvidia.com/gpu", AGENT_LABEL)]
# Short, in the order the operator validates: collective < in-process soft < hard < heartbeat < initial.
RESILIENCY = {"ncclTimeoutSeconds": 10, "heartbeatTimeoutSeconds": 15, "initialHeartbeatTimeoutSeconds": 60,
              "monitorIntervalSeconds": 1, "rendezvousTimeoutSeconds": 60,
              "inProcessRestart": {"softTimeoutSeconds": 12, "hardTimeoutSeconds": 14}}


def cpu_rtj(ns: str, name: str, train_args: list[str], steps: int = 60, interval: int = 10,
            step_seconds: float = 0.1, **spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "image": "rtj-worker:local",  # node agents run processes; the image is never pulled
        "nodes": {"count": 2}, "gpusPerNode": 0, "efaPerNode": 0, "procsPerNode": 2, "shmSize": "256Mi",
        "placement": {"nodeSelector": {AGENT_LABEL: "true"}, "tolerations": TOLERATIONS},
        # The coordinator runs as a process too (an agent node; the CPU agent, by preference).
        "coordinator": {"nodeSelector": {AGENT_LABEL: "true"}, "tolerations": TOLERATIONS},
        "storage": {"storageClassName": "fsx-sc", "size": "1Gi", "mountPath": MOUNT},
        "command": ["python", "-m", "rtj_worker.train"],
        "args": ["--steps", str(steps), "--model-dim", "32", "--layers", "2", "--batch", "8",
                 "--step-seconds", str(step_seconds), *train_args],
        "checkpoint": {"intervalSteps": interval},
        "resiliency": RESILIENCY,
        "restartBudget": {"nodeLossGraceSeconds": 2, "terminatingTimeoutSeconds": 3},
        "env": [{"name": "RTJ_EVENT_LOG", "value": f"{MOUNT}/{name}/events.jsonl"},
                {"name": "TORCH_CPP_LOG_LEVEL", "value": "ERROR"}],
    }
    body.update(spec)
    return {"apiVersion": api.API_VERSION, "kind": api.KIND, "metadata": {"name": name, "namespace": ns},
            "spec": body}


def shared_dir(cluster: LocalCluster, ns: str, name: str) -> Path | None:
    """<the PVC's hostPath>/<name>: the checkpoint dir all pods share, once the claim is bound."""
    pvc = cluster.api("GET", f"/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}-ckpt", missing_ok=True)
    volume = (pvc or {}).get("spec", {}).get("volumeName")
    if not volume:
        return None
    pv = cluster.api("GET", f"/api/v1/persistentvolumes/{volume}")
    return Path(pv["spec"]["hostPath"]["path"]) / name


def result(cluster: LocalCluster, ns: str, name: str) -> dict[str, Any]:
    path = shared_dir(cluster, ns, name)
    assert path is not None
    return json.loads((path / "result.json").read_text())
