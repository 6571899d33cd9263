"""Deterministic names and labels of an RTJ's children.

Each gang attempt has its own Job and coordinator ('<name>-a<attempt>', '<name>-a<attempt>-rdzv'), so
hostnames differ between attempts: a new gang starts while an old one's pods are still going away (a
pod on an unfenced node can take as long as its instance lives), and an old rank that still runs cannot
reach the new gang's rendezvous or stores by name. The Service, claim and NetworkPolicy are the job's.
"""

from __future__ import annotations

import hashlib

from .. import api
from ..spec import RTJ


def service_name(rtj: RTJ) -> str:
    return rtj.name


def job_name(rtj: RTJ, attempt: int) -> str:
    """The Job of gang `attempt`: '<name>-a<attempt>', at most api.MAX_NAME_LENGTH characters so that its
    pods' hostnames '<job>-<index>' stay DNS labels. A name too long for the suffix keeps a prefix and a
    digest of the whole name. Names of two RTJs differ unless one is long and the other is named exactly
    like its shortened form (digest included), or an earlier operator's Job named '<name>' of an RTJ named
    like '<other>-a<n>' is in the way: ownership decides, and a Job that is not the RTJ's is a
    ChildConflict."""
    suffix = f"-a{attempt}"
    room = api.MAX_NAME_LENGTH - len(suffix)
    if len(rtj.name) <= room:
        return rtj.name + suffix
    digest = hashlib.sha256(rtj.name.encode()).hexdigest()[:6]
    return f"{rtj.name[:room - len(digest) - 1].rstrip('-')}-{digest}{suffix}"


def network_policy_name(rtj: RTJ) -> str:
    return rtj.name


def pvc_name(rtj: RTJ) -> str:
    """The PVC the pods mount: the user's, or the one the operator creates."""
    return rtj.spec["storage"].get("existingClaim") or f"{rtj.name}-ckpt"


def selector_labels(rtj: RTJ) -> dict[str, str]:
    return {api.LABEL_NAME: rtj.name}


def labels(rtj: RTJ, component: str) -> dict[str, str]:
    return {**selector_labels(rtj), api.LABEL_MANAGED_BY: api.MANAGER, api.LABEL_COMPONENT: component}


def coordinator_name(job: str) -> str:
    """The coordinator pod of the gang whose Job is named `job`, and its hostname: '<job>-rdzv' fits a DNS
    label as '<job>-<index>' does. Named after its gang's Job, so that a gang an earlier operator made
    (Job '<name>', coordinator '<name>-rdzv') keeps its names, and its pod template hash, after an upgrade."""
    return f"{job}-rdzv"


def rendezvous_host(rtj: RTJ, job: str) -> str:
    """The DNS name of whatever hosts the rendezvous of the gang whose Job is named `job`: its coordinator
    pod, or its node 0 (Indexed Job pods are '<job>-<index>' under the Service subdomain)."""
    host = coordinator_name(job) if rtj.spec["coordinator"]["enabled"] else f"{job}-0"
    return f"{host}.{service_name(rtj)}.{rtj.namespace}.svc"
