"""Optional pre-flight check of spec.storage.fileSystemId with boto3 (`--check-fsx`).

Before any pod is created: the FSx for Lustre file system must exist, be AVAILABLE, and sit in
the Availability Zone of the nodes the job will run on. A mismatch is not an error the pods
would report clearly (Lustre across AZs mounts, then crawls, and costs cross-AZ traffic), so the
operator holds the job Pending with a StorageReady=False condition that says what to fix.

Credentials come from the operator's ServiceAccount (IRSA or EKS Pod Identity, see the chart);
it needs fsx:DescribeFileSystems and ec2:DescribeSubnets.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import boto3
from botocore.exceptions import BotoCoreError, ClientError

from .kube import Kube
from .spec import RTJ

log = logging.getLogger(__name__)
ZONE_LABEL = "topology.kubernetes.io/zone"
CACHE_SECONDS = 60.0


class FsxCheck:
    """A reconcile StorageCheck: (ok, reason, message) for an RTJ's FSx file system."""

    def __init__(self, kube: Kube, fsx: Any, ec2: Any, cache_seconds: float = CACHE_SECONDS):
        self.kube, self.fsx, self.ec2 = kube, fsx, ec2
        self.cache_seconds = cache_seconds
        self._cache: dict[str, tuple[float, dict[str, Any] | None, str]] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_environment(cls, kube: Kube) -> FsxCheck:
        region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
        return cls(kube, boto3.client("fsx", region_name=region), boto3.client("ec2", region_name=region))

    def __call__(self, rtj: RTJ) -> tuple[bool, str, str]:
        fs_id = rtj.spec["storage"].get("fileSystemId")
        if not fs_id:
            return True, "NotChecked", "spec.storage.fileSystemId is not set"
        try:
            fs, zone = self._describe(fs_id)
        except (ClientError, BotoCoreError) as exc:
            code = exc.response["Error"]["Code"] if isinstance(exc, ClientError) else type(exc).__name__
            if code == "FileSystemNotFound":
                return False, "FileSystemNotFound", f"FSx file system {fs_id} does not exist in this region"
            return False, "FileSystemCheckFailed", f"could not describe FSx file system {fs_id}: {exc}"
        if fs is None:
            return False, "FileSystemNotFound", f"FSx file system {fs_id} does not exist in this region"
        if fs.get("FileSystemType") != "LUSTRE":
            return False, "NotLustre", f"{fs_id} is an FSx for {fs.get('FileSystemType')} file system, not Lustre"
        lifecycle = fs.get("Lifecycle", "UNKNOWN")
        if lifecycle != "AVAILABLE":
            return False, "FileSystemNotAvailable", f"FSx file system {fs_id} is {lifecycle}, not AVAILABLE"
        node_zones = self._node_zones(rtj)
        if node_zones and node_zones != {zone}:
            return False, "AvailabilityZoneMismatch", (
                f"FSx file system {fs_id} is in {zone} but the job's nodes are in {', '.join(sorted(node_zones))}; "
                f"set spec.placement.nodeSelector {ZONE_LABEL}: {zone}")
        where = f"in {zone}" if node_zones else f"in {zone} (no matching nodes yet to compare zones)"
        return True, "FileSystemAvailable", f"FSx for Lustre {fs_id} is AVAILABLE {where}"

    def _describe(self, fs_id: str) -> tuple[dict[str, Any] | None, str]:
        with self._lock:
            cached = self._cache.get(fs_id)
            if cached and time.monotonic() - cached[0] < self.cache_seconds:
                return cached[1], cached[2]
        systems = self.fsx.describe_file_systems(FileSystemIds=[fs_id]).get("FileSystems", [])
        fs = systems[0] if systems else None
        zone = ""
        if fs is not None and fs.get("SubnetIds"):
            subnets = self.ec2.describe_subnets(SubnetIds=[fs["SubnetIds"][0]])["Subnets"]
            zone = subnets[0]["AvailabilityZone"] if subnets else ""
        with self._lock:
            self._cache[fs_id] = (time.monotonic(), fs, zone)
        return fs, zone

    def _node_zones(self, rtj: RTJ) -> set[str]:
        """Zones the job can land in: its pinned zone, else those of the nodes its selector matches."""
        placement = rtj.spec["placement"]
        selector = {"node.kubernetes.io/instance-type": placement["instanceType"],
                    **(placement.get("nodeSelector") or {})}
        if ZONE_LABEL in selector:
            return {selector[ZONE_LABEL]}
        return {node["metadata"]["labels"][ZONE_LABEL] for node in self.kube.list("Node", labels=selector)
                if ZONE_LABEL in (node["metadata"].get("labels") or {})}
