"""Which nodes cannot train although they are Ready: the node-health signals of the cluster's own
agents, read from the Node alone (pure).

- The EKS node monitoring agent sets one condition per category (`AcceleratedHardwareReady` for GPU
  XIDs, NVLink and DCGM findings, `NetworkingReady` for EFA and the VPC CNI, `StorageReady`,
  `KernelReady`, `ContainerRuntimeReady`), False with a reason such as `NvidiaXID79Error`. EKS
  node auto-repair replaces such a node only after about 10 minutes; until then ft_launcher would
  respawn the ranks onto the same bad GPU.
- SageMaker HyperPod labels a node `sagemaker.amazonaws.com/node-health-status` with an
  `Unschedulable*` value while it checks, reboots or replaces it.

The operator treats such a node like a lost one, but at once: its pod is evicted (the node's kubelet
still works, so no fencing is needed) and the job is not charged. The rules are the operator's
(`--unhealthy-node-condition`, `--unhealthy-node-label`; the chart's `nodeHealth` values).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .memo import per_version

EKS_CONDITIONS = ("AcceleratedHardwareReady", "NetworkingReady", "StorageReady", "KernelReady",
                  "ContainerRuntimeReady")
HYPERPOD_LABEL = "sagemaker.amazonaws.com/node-health-status"
HYPERPOD_UNHEALTHY = ("Unschedulable", "UnschedulablePendingReplacement", "UnschedulablePendingReboot")
# Reasons of those conditions that the workload causes, not the node: the EKS agent's KernelReady
# ForkFailedOutOfPIDs (the job's processes spent the PID limit) and ContainerRuntimeReady
# PodStuckTerminating. Read as node faults, the job's own bug became a platform charge and excluded
# healthy nodes for an hour; they are left to the pods' own exits, charged to the job.
WORKLOAD_REASONS = ("ForkFailedOutOfPIDs", "PodStuckTerminating")


@dataclass(frozen=True)
class NodeHealth:
    """conditions: (type, status that means unhealthy); labels: (key, values that mean unhealthy)."""

    conditions: tuple[tuple[str, str], ...] = tuple((c, "False") for c in EKS_CONDITIONS)
    labels: tuple[tuple[str, frozenset[str]], ...] = ((HYPERPOD_LABEL, frozenset(HYPERPOD_UNHEALTHY)),)
    workload_reasons: frozenset[str] = frozenset(WORKLOAD_REASONS)  # a matching condition with one: healthy

    @classmethod
    def parse(cls, conditions: list[str] | None, labels: list[str] | None,
              workload_reasons: list[str] | None = None) -> NodeHealth:
        """From flags: `Type=Status` (e.g. `AcceleratedHardwareReady=False`), `key=v1,v2` and reasons; None
        keeps the defaults, an empty list turns that kind of signal (or of exception) off."""
        default = cls()
        conds = default.conditions if conditions is None else tuple(_pair(c, "condition") for c in conditions)
        labs = default.labels if labels is None else tuple(
            (key, frozenset(v for v in values.split(",") if v)) for key, values in
            (_pair(spec, "label") for spec in labels))
        reasons = default.workload_reasons if workload_reasons is None else frozenset(
            r.strip() for r in workload_reasons if r.strip())
        return cls(conds, labs, reasons)


def _pair(text: str, what: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value.strip():
        raise ValueError(f"unhealthy node {what} {text!r}: expected KEY=VALUE")
    return key.strip(), value.strip()


DEFAULT = NodeHealth()
NONE = NodeHealth((), (), frozenset())


@per_version
def unhealthy(node: dict[str, Any] | None, rules: NodeHealth = DEFAULT) -> str:
    """Why a Ready node cannot train, as shown to users ('' if it can): the first matching signal."""
    if node is None:
        return ""
    for cond in (node.get("status") or {}).get("conditions") or []:
        for type_, bad in rules.conditions:
            if (cond.get("type") == type_ and cond.get("status") == bad
                    and cond.get("reason") not in rules.workload_reasons):
                why = cond.get("reason") or bad
                message = (cond.get("message") or "").strip()
                return f"{type_}={bad} ({why})" + (f": {message[:200]}" if message else "")
    labels = node.get("metadata", {}).get("labels") or {}
    for key, values in rules.labels:
        if labels.get(key) in values:
            return f"{key}={labels[key]}"
    return ""
