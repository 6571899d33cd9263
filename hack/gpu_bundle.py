"""`make gpu-bundle`: the wheels the GPU check installs offline on the device (hack/gpu_check.sh).

The GPU machine has no network and an image of its own (Python 3.12, torch with CUDA 13) without NVRx.
Where PyPI is reachable, this downloads NVRx 0.6.0's wheel for that image (CPython 3.12,
manylinux_2_39 x86_64: glibc 2.39) and the closure of its requirements less what the image has
(IMAGE: torch, numpy, and setuptools, which torch requires on Python 3.12), every one pinned, into
.gpu-bundle/. It fails if a wheel does not fit the image's tags, if a requirement of any wheel is
neither in the bundle nor the image (a new NVRx dependency must be pinned here, not dropped), or if
the bundle exceeds --max-mib. The folder is git-ignored: carry it with the working tree (what the
device receives is limited to 64 MiB in all).
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

NVRX = ("nvidia-resiliency-ext", "0.6.0")
# NVRx 0.6.0's requirements (no extras) and theirs, at the versions the worker's tests use (the
# Makefile's NVRX06_DEPS and the venv). typing-extensions is torch's too, but anyio needs >= 4.16,
# which an image's may predate: the bundle's comes first on the path.
PINS = {
    "defusedxml": "0.7.1", "grpcio": "1.76.0", "grpcio-tools": "1.76.0", "protobuf": "6.33.6",
    "httpx": "0.28.1", "httpcore": "1.0.9", "h11": "0.16.0", "anyio": "4.16.0", "certifi": "2026.10.19.post1",
    "idna": "3.20", "nvidia-ml-py": "13.615.71", "packaging": "26.4", "psutil": "7.2.2", "pyyaml": "6.0.3",
    "typing-extensions": "4.16.0",
}
IMAGE = frozenset({"torch", "numpy", "setuptools"})
PYTHON = (3, 12)
GLIBC = (2, 39)


def platforms(glibc: tuple[int, int] = GLIBC) -> list[str]:
    """Platform tags a glibc `glibc` x86_64 host accepts, newest first. pip expands only the legacy
    manylinux2014/2010 names itself, so `pip download --platform manylinux_2_39_x86_64` alone would
    miss every wheel built for an older glibc (grpcio's, pyyaml's)."""
    tags = [f"manylinux_2_{minor}_x86_64" for minor in range(glibc[1], 4, -1)]
    legacy = {17: "manylinux2014_x86_64", 12: "manylinux2010_x86_64", 5: "manylinux1_x86_64"}
    return tags + [tag for minor, tag in legacy.items() if minor <= glibc[1]]


def wheel_fits(filename: str, python: tuple[int, int] = PYTHON, glibc: tuple[int, int] = GLIBC) -> bool:
    """Whether CPython `python` on glibc `glibc` x86_64 can install the wheel `filename`."""
    ok_platforms = {*platforms(glibc), "any"}
    for tag in parse_wheel_filename(filename)[3]:
        interpreter, abi, platform = tag.interpreter, tag.abi, tag.platform
        if platform not in ok_platforms:
            continue
        if interpreter in ("py3", f"py{python[0]}{python[1]}") and abi == "none":
            return True
        match = re.fullmatch(r"cp(\d)(\d+)", interpreter)
        if not match or int(match.group(1)) != python[0]:
            continue
        minor = int(match.group(2))
        if (abi == f"cp{python[0]}{python[1]}" and minor == python[1]) or (abi == "abi3" and minor <= python[1]):
            return True
    return False


def requirements(metadata: str, python: tuple[int, int] = PYTHON) -> list[Requirement]:
    """A wheel's requirements on a Linux x86_64 CPython `python`, without extras."""
    env = {"python_version": f"{python[0]}.{python[1]}", "python_full_version": f"{python[0]}.{python[1]}.0",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
           "implementation_name": "cpython", "platform_python_implementation": "CPython", "extra": ""}
    found = []
    for line in metadata.splitlines():
        if line.startswith("Requires-Dist:"):
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is None or req.marker.evaluate(env):
                found.append(req)
    return found


def missing(metadata: dict[str, tuple[str, str]], python: tuple[int, int] = PYTHON) -> set[str]:
    """Names that wheels of the bundle require and neither the bundle nor the image has.
    `metadata`: canonical name -> (version, METADATA) of every wheel in the bundle."""
    needed = {canonicalize_name(r.name) for _, text in metadata.values() for r in requirements(text, python)}
    return needed - IMAGE - set(metadata)


def pinned(names: set[str]) -> tuple[list[str], list[str]]:
    """(pinned specs to download, names without a pin)."""
    return [f"{n}=={PINS[n]}" for n in sorted(names) if n in PINS], sorted(n for n in names if n not in PINS)


def closure_problems(metadata: dict[str, tuple[str, str]], python: tuple[int, int] = PYTHON) -> list[str]:
    """What the bundle lacks, or has at a version some wheel of it does not accept."""
    problems = []
    for name, (_, text) in sorted(metadata.items()):
        for req in requirements(text, python):
            dep = canonicalize_name(req.name)
            if dep in IMAGE:
                continue
            if dep not in metadata:
                problems.append(f"{name} requires {req}: neither in the bundle nor in the image")
            elif not req.specifier.contains(metadata[dep][0], prereleases=True):
                problems.append(f"{name} requires {req}: the bundle has {dep} {metadata[dep][0]}")
    return problems


def read_metadata(wheel: Path) -> tuple[str, str, str]:
    """(canonical name, version, METADATA) of a wheel file."""
    name, version, _, _ = parse_wheel_filename(wheel.name)
    with zipfile.ZipFile(wheel) as archive:
        member = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        return canonicalize_name(name), str(version), archive.read(member).decode()


def download(specs: list[str], dest: Path, python: tuple[int, int]) -> None:
    tags = [arg for platform in platforms() for arg in ("--platform", platform)]
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:", *tags,
                    "--python-version", f"{python[0]}.{python[1]}", "--implementation", "cp",
                    "--abi", f"cp{python[0]}{python[1]}", "--dest", str(dest), *specs], check=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dest", type=Path, default=Path(".gpu-bundle"))
    parser.add_argument("--max-mib", type=float, default=40.0)
    parser.add_argument("--python", default=f"{PYTHON[0]}.{PYTHON[1]}",
                        help="The image's Python (3.11: a bundle for this venv, to try hack/gpu_check.sh --cpu here)")
    args = parser.parse_args()
    python = (int(args.python.split(".")[0]), int(args.python.split(".")[1]))
    shutil.rmtree(args.dest, ignore_errors=True)  # never a stale wheel: the device installs every one
    args.dest.mkdir(parents=True)
    specs, unpinned = ["==".join(NVRX)], []
    while specs:  # NVRx, then what its wheels require, until nothing is missing (or not pinned)
        download(specs, args.dest, python)
        metadata = {name: (version, text) for name, version, text in map(read_metadata, args.dest.glob("*.whl"))}
        specs, new = pinned(missing(metadata, python) - set(unpinned))
        unpinned += new
    wheels = sorted(args.dest.glob("*.whl"))
    misfits = [w.name for w in wheels if not wheel_fits(w.name, python)]
    problems = [f"{w} does not fit CPython {args.python} on glibc {GLIBC[0]}.{GLIBC[1]}" for w in misfits]
    problems += [f"{name} is required but not pinned in hack/gpu_bundle.py (PINS)" for name in unpinned]
    problems += closure_problems(metadata, python)
    size = sum(w.stat().st_size for w in wheels) / 2**20
    for wheel in wheels:
        print(f"{wheel.stat().st_size / 2**20:7.2f} MiB  {wheel.name}")
    print(f"{size:7.2f} MiB  {len(wheels)} wheels in {args.dest} (the image provides {', '.join(sorted(IMAGE))})")
    if size > args.max_mib:
        problems.append(f"the bundle is {size:.1f} MiB, over {args.max_mib:g} MiB")
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
