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

- EFA: where the EFA device plugin gave the pod its devices (/dev/infiniband/uverbs*), NCCL must use
  them through the aws-ofi-nccl net plugin. NCCL that finds no net plugin uses TCP sockets without an
  error (a p5's 3200 Gbps of EFA unused), so the image must carry the plugin (else a configuration
  error), and the ranks get NCCL_NET="AWS Libfabric": a plugin that then fails to load is NCCL's error,
  not a silent fallback. A NCCL_NET the user sets is kept (NCCL_NET=Socket to rule EFA out).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from .launch import NVRX

DRIVER_VERSION_FILE = Path("/proc/driver/nvidia/version")
EFA_DEVICES = Path("/dev/infiniband")
# aws-ofi-nccl's net plugin (NCCL dlopens libnccl-net-<NCCL_NET_PLUGIN>.so, or libnccl-net.so), and the
# name its ncclNet reports: NCCL_NET selects a network by that name and fails if none has it.
OFI_PLUGINS = ("libnccl-net-ofi.so", "libnccl-net.so")
OFI_NET = "AWS Libfabric"
# The lowest Linux driver each CUDA major version's runtime runs on (NVIDIA's CUDA release notes).
MIN_DRIVER = {12: (525, 60), 13: (580, 65)}
# NCCL releases that crash under in-process restart (NVRx's known issues).
NCCL_INPROCESS_BROKEN = ((2, 28, 3), (2, 28, 8))
Version = tuple[int, ...]
# What every image that runs rtj-worker needs besides this package (docs/your-script.md, "What the image must
# contain"): the distribution, the lowest version whose launcher flags rtj_worker.launch was checked against
# (fault_tolerance/launcher.py of 0.4.1 and 0.6.0), and why.
IMAGE_PACKAGES = (
    ("torch", (2, 0), "the ranks' process groups, and ft_launcher's elastic agent"),
    (NVRX, (0, 4, 1), "ft_launcher, which rtj-worker starts"),
)
SUPPORTED_PYTHON = (3, 10)


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


def image_problems(version: Callable[[str], str | None] | None = None,
                   python: Version = tuple(sys.version_info[:3])) -> list[str]:
    """What the image lacks to run rtj-worker at all (empty: nothing): an image of the user's own that
    installed this package but not torch or NVRx, or too old a one, fails here with one clear configuration
    error, not with a launcher traceback that ft_launcher's restarts and the operator's replay."""
    version = version or _installed
    out = []
    if python[:2] < SUPPORTED_PYTHON:
        out.append(f"Python {'.'.join(map(str, python))} is older than the "
                   f"{'.'.join(map(str, SUPPORTED_PYTHON))} rtj-worker needs")
    for name, lowest, why in IMAGE_PACKAGES:
        found = version(name)
        have = parse_version(found) if found else None
        if found is None:
            out.append(f"{name} is not installed ({why})")
        elif have is not None and have[:len(lowest)] < lowest:
            out.append(f"{name} {found} is older than {'.'.join(map(str, lowest))} ({why})")
    if out:
        out[-1] += ("; the image must contain Python, torch, nvidia-resiliency-ext and the rtj-worker package "
                    "(docs/your-script.md): build it FROM the worker image, or pip install them")
    return out


def _installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def check(env: Mapping[str, str]) -> list[str]:
    """problems() of this machine and image."""
    if not env.get("NVIDIA_VISIBLE_DEVICES"):
        return []
    return problems(env, driver_version(), package_version(("nvidia-cuda-runtime",)),
                    package_version(("nvidia-nccl",)))


def efa_devices(devices: Path = EFA_DEVICES) -> int:
    """How many EFA (RDMA verbs) devices the pod was given."""
    try:
        return sum(1 for _ in devices.glob("uverbs*"))
    except OSError:
        return 0


def ofi_plugin(library_path: str) -> Path | None:
    """The aws-ofi-nccl net plugin on the library path, if any."""
    for directory in filter(None, library_path.split(":")):
        for name in OFI_PLUGINS:
            if (Path(directory) / name).exists():
                return Path(directory) / name
    return None


def nccl_network(env: Mapping[str, str], devices: int, plugin: Path | None) -> tuple[dict[str, str], list[str]]:
    """(what the ranks' environment gets, what is wrong) for a pod with `devices` EFA devices."""
    if not devices or env.get("NCCL_NET"):
        return {}, []
    if plugin is None:
        return {}, [f"the pod has {devices} EFA devices but the image has no NCCL net plugin for them "
                    f"({' or '.join(OFI_PLUGINS)} on LD_LIBRARY_PATH): NCCL would use TCP sockets. Build the "
                    "worker image with INSTALL_EFA=1 (make images-efa), or set NCCL_NET=Socket in spec.env to "
                    "run on sockets knowingly"]
    return {"NCCL_NET": OFI_NET}, []


# The net plugin API versions NCCL looks for, newest first; each is a struct whose first field is the
# network's name (nccl's ext-net/*/net_v*.h).
PLUGIN_SYMBOLS = tuple(f"ncclNetPlugin_v{v}" for v in range(11, 1, -1))


def plugin_name(plugin: Path) -> str:
    """Load the net plugin as NCCL does (dlopen: its libfabric and the rest must resolve) and read the name
    of the network it offers. Raises OSError when it cannot be loaded or exports no net API."""
    lib = ctypes.CDLL(str(plugin))
    for symbol in PLUGIN_SYMBOLS:
        try:
            name = ctypes.c_char_p.in_dll(lib, symbol).value
        except ValueError:
            continue
        return (name or b"").decode()
    raise OSError(f"{plugin} exports none of {', '.join(PLUGIN_SYMBOLS)}")


def main(argv: list[str] | None = None) -> int:
    """`python -m rtj_worker.requirements efa`: the image's EFA check (make images-efa runs it in the built
    image): the plugin is on the library path, loads, and offers the network the pods select."""
    args = sys.argv[1:] if argv is None else argv
    if args != ["efa"]:
        print("usage: python -m rtj_worker.requirements efa", file=sys.stderr)
        return 2
    plugin = ofi_plugin(os.environ.get("LD_LIBRARY_PATH", ""))
    if plugin is None:
        print(f"no NCCL net plugin ({' or '.join(OFI_PLUGINS)}) on LD_LIBRARY_PATH", file=sys.stderr)
        return 1
    try:
        name = plugin_name(plugin)
    except OSError as exc:
        print(f"{plugin} does not load: {exc}", file=sys.stderr)
        return 1
    print(f"{plugin}: network {name!r}")
    if name != OFI_NET:
        print(f"the pods select NCCL_NET={OFI_NET!r}: NCCL would not find it", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
