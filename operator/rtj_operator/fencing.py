"""Opt-in cloud evidence that a lost node runs nothing any more (`--check-ec2`): its EC2 instance is
stopped or terminated.

Why it matters: a node the control plane lost may still run its pods (it lost the API server, not
its power). Replacing such a pod starts a second process of the same node rank, writing the same
checkpoints. So the operator force-deletes a pod stuck on a lost node only with fencing evidence:
the Node deleted, the out-of-service taint (ladder.fencing), or, with this check, the instance
itself stopped or terminated. On EKS the cloud node lifecycle controller deletes the Node of a
terminated instance anyway; this check answers sooner, and for stopped instances too.

Evidence needs a positive identity: the instance, found in the region of the node's zone, is stopped
or terminated. An instance not found is no evidence (it used to be): a client of another region or
account finds none of the fleet's instances, and every lost node would have looked fenced, putting a
second process of a rank that still runs on the same checkpoints. A terminated instance stays visible
for about an hour, and its Node is deleted (fencing by itself) long before it vanishes.

Credentials come from the operator's ServiceAccount (IRSA or EKS Pod Identity); it needs
ec2:DescribeInstances.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

log = logging.getLogger(__name__)
CACHE_SECONDS = 15.0
FENCED_STATES = ("stopped", "terminated")


def instance_id(node: dict[str, Any]) -> str:
    """The EC2 instance of a node, from its providerID (aws:///us-west-2a/i-0123456789abcdef0)."""
    provider = (node.get("spec") or {}).get("providerID") or ""
    last = provider.rsplit("/", 1)[-1]
    return last if provider.startswith("aws://") and last.startswith("i-") else ""


def region_of(node: dict[str, Any]) -> str:
    """The region of a node's zone, from its providerID (aws:///us-west-2a/i-...: us-west-2), or ''."""
    parts = ((node.get("spec") or {}).get("providerID") or "").split("/")
    zone = parts[-2] if len(parts) >= 2 else ""
    return zone[:-1] if zone[-1:].isalpha() and zone[:-1][-1:].isdigit() else ""


class Ec2Fencing:
    """A cloud fencing check: node -> evidence that it runs nothing any more, or ''."""

    def __init__(self, ec2: Any, cache_seconds: float = CACHE_SECONDS):
        self.ec2, self.cache_seconds = ec2, cache_seconds
        self._cache: dict[str, tuple[float, str]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls) -> Ec2Fencing:
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        return cls(boto3.client("ec2", region_name=region))

    def __call__(self, node: dict[str, Any]) -> str:
        instance = instance_id(node)
        if not instance:
            return ""
        mine, theirs = self.ec2.meta.region_name, region_of(node)
        if theirs and mine != theirs:
            log.warning("EC2 fencing: node %s is in %s, the operator's EC2 client in %s: no evidence",
                        (node.get("metadata") or {}).get("name"), theirs, mine)
            return ""
        with self._lock:
            cached = self._cache.get(instance)
            if cached and time.monotonic() - cached[0] < self.cache_seconds:
                return cached[1]
        try:
            reservations = self.ec2.describe_instances(InstanceIds=[instance]).get("Reservations", [])
            states = [i["State"]["Name"] for r in reservations for i in r.get("Instances", [])]
            states = [i["State"]["Name"] for r in reservations for i in r.get("Instances", [])
                      if i.get("InstanceId") == instance]
            evidence = f"its EC2 instance {instance} is {states[0]}" if states and states[0] in FENCED_STATES else ""
        except ClientError as exc:  # InvalidInstanceID.NotFound too: not found is not evidence (see above)
            log.warning("could not describe EC2 instance %s: %s", instance, exc)
            evidence = ""
        except BotoCoreError as exc:
            log.warning("could not describe EC2 instance %s: %s", instance, exc)
            evidence = ""
        with self._lock:
            self._cache[instance] = (time.monotonic(), evidence)
        return evidence
