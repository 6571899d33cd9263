"""Deterministic names and labels of an RTJ's children."""

from __future__ import annotations

from .. import api
from ..spec import RTJ


def service_name(rtj: RTJ) -> str:
    return rtj.name


def job_name(rtj: RTJ) -> str:
    return rtj.name


def network_policy_name(rtj: RTJ) -> str:
    return rtj.name


def pvc_name(rtj: RTJ) -> str:
    """The PVC the pods mount: the user's, or the one the operator creates."""
    return rtj.spec["storage"].get("existingClaim") or f"{rtj.name}-ckpt"


def selector_labels(rtj: RTJ) -> dict[str, str]:
    return {api.LABEL_NAME: rtj.name}


def labels(rtj: RTJ, component: str) -> dict[str, str]:
    return {**selector_labels(rtj), api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_COMPONENT: component}


def coordinator_name(rtj: RTJ) -> str:
    """The coordinator pod, and its hostname: '<name>-rdzv' fits a DNS label as '<name>-<index>' does."""
    return f"{rtj.name}-rdzv"


def rendezvous_host(rtj: RTJ) -> str:
    """Stable DNS name of whatever hosts the rendezvous: the coordinator pod, or node 0 (Indexed Job pods
    are '<job>-<index>' under the Service subdomain)."""
    host = coordinator_name(rtj) if rtj.spec["coordinator"]["enabled"] else f"{job_name(rtj)}-0"
    return f"{host}.{service_name(rtj)}.{rtj.namespace}.svc"
