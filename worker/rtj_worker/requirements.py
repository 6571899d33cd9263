"""What a GPU pod's image needs of its node, checked at worker start (no torch import: read from the
installed packages' metadata and the kernel module's version file), so that a mismatch is a clear
configuration error in the RTJ's status instead of a CUDA or NCCL failure in every rank, restarted
until the budgets are spent.

- The NVIDIA driver must be at least what the CUDA runtime that torch ships with needs (CUDA 13: 580,
  CUDA 12: 525; the image's base is CUDA 13, `Dockerfile`).
- NCCL 2.28.3 to 2.28.8 segfault under in-process restart (NVRx's release notes): with it on, they
  are refused.

Only where the pod has GPUs (the device plugin's NVIDIA_VISIBLE_DEVICES, and the driver's version
file); a CPU pod is not checked.
"""

from __future__ import annotations

import importlib.metadata
import re
from collections.abc import Callable, Mapping
from pathlib import Path

DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
# The lowest Linux driver each CUDA major version's runtime runs on (NVIDIA's CUDA release notes).
MIN_DRIVER = {12: (525, 60), 13: (580, 65)}
# NCCL releases that crash under in-process restart (NVRx's known issues).
NCCL_INPROCESS_BROKEN = ((2, 28, 3), (2, 28, 8))
Version = tuple[int, ...]


def parse_version(text: str) -> Version | None:
    match = re.search(r"(\d+(?:\.\d+)+)", text or "")
    return tuple(int(p) for p in match.group(1).split(".")) if match else None


def driver_version(path: Path = DRIVER_VERSION_FILE) -> Version | None:
    """The loaded NVIDIA kernel module's version ("... Kernel Module  580.65.06 ..."), if any."""
    try:
        text = path.read_text()
    except OSError:
        return None
    match = re.search(r"Kernel Module(?: for [\w-]+)?\s+(\d+(?:\.\d+)+)", text)
    return parse_version(match.group(1)) if match else None


def package_version(prefixes: tuple[str, ...],
                    distributions: Callable[[], list[tuple[str, str]]] | None = None) -> Version | None:
    """The version of the first installed distribution whose name starts with one of `prefixes`."""
    found = distributions() if distributions is not None else [
        (d.metadata["Name"] or "", d.version) for d in importlib.metadata.distributions()]
    for name, version in found:
        if name.lower().startswith(prefixes):
            return parse_version(version)
    return None


def problems(env: Mapping[str, str], driver: Version | None, cuda: Version | None, nccl: Version | None) -> list[str]:
    """What the node or the image lacks for this pod (empty: nothing known to be wrong)."""
    devices = env.get("NVIDIA_VISIBLE_DEVICES", "")
    if not devices or devices in ("void", "none") or driver is None:
        return []
    out = []
    need = MIN_DRIVER.get(cuda[0]) if cuda else None
    if need is not None and driver[:2] < need:
        out.append(f"the node's NVIDIA driver is {'.'.join(map(str, driver))}, below the "
                   f"{'.'.join(map(str, need))} that CUDA {cuda[0]} (torch's runtime in this image) needs: run "
                   "it on nodes with a newer driver (an AMI of that CUDA generation), or use an image built "
                   "for the node's CUDA")
    low, high = NCCL_INPROCESS_BROKEN
    if (nccl is not None and low <= nccl[:3] <= high and env.get("RTJ_INPROCESS_ENABLED", "1") != "0"):
        out.append(f"NCCL {'.'.join(map(str, nccl))} crashes under in-process restart (NVRx's known issues, "
                   f"{'.'.join(map(str, low))} to {'.'.join(map(str, high))}): use another NCCL in the image, "
                   "or set resiliency.inProcessRestart.enabled to false")
    return out


def check(env: Mapping[str, str]) -> list[str]:
    """problems() of this machine and image."""
    if not env.get("NVIDIA_VISIBLE_DEVICES"):
        return []
    return problems(env, driver_version(), package_version(("nvidia-cuda-runtime",)),
                    package_version(("nvidia-nccl",)))
