"""Print the pinned requirements of pyproject.toml, one a line, for the image's dependency layer.

    python requirements.py pyproject.toml                      # the operator: [project] dependencies
    python requirements.py pyproject.toml worker --nvrx 0.6.0  # + the `worker` extra, NVRx pinned to 0.6.0

The Dockerfile installs these before copying the code, so that a code change does not reinstall
torch; `--nvrx` replaces the extra's nvidia-resiliency-ext pin (the build argument NVRX_VERSION).
"""

from __future__ import annotations

import argparse
import platform
import re
import tomllib

NVRX = "nvidia-resiliency-ext"
# NVRx's wheels are manylinux_2_31 up to 0.4.x and manylinux_2_39 from 0.6.0 (Ubuntu 24.04, Debian 13).
NVRX_GLIBC = [((0, 6), (2, 39)), ((0, 0), (2, 31))]


def requirements(pyproject: dict, extras: list[str], nvrx: str | None = None) -> list[str]:
    project = pyproject["project"]
    reqs = list(project["dependencies"])
    for extra in extras:
        reqs += project["optional-dependencies"][extra]
    if nvrx:
        if not any(_name(r) == NVRX for r in reqs):
            raise SystemExit(f"--nvrx given but no {NVRX} requirement in {extras}")
        reqs = [f"{NVRX}=={nvrx}" if _name(r) == NVRX else r for r in reqs]
    return reqs


def check_glibc(nvrx: str, glibc: str | None = None) -> None:
    """Fail early, with the fix, where pip would only say that no wheel matches."""
    have = _version(glibc or platform.libc_ver()[1])
    need = next(g for v, g in NVRX_GLIBC if _version(nvrx)[:2] >= v)
    if have < need:
        raise SystemExit(f"{NVRX}=={nvrx} needs glibc >= {'.'.join(map(str, need))}, this base has "
                         f"{'.'.join(map(str, have))}: use an Ubuntu 24.04 base (WORKER_BASE) or NVRX_VERSION=0.4.1")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text)[:3])


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;@]", req, maxsplit=1)[0].lower().replace("_", "-")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("pyproject")
    parser.add_argument("extras", nargs="*")
    parser.add_argument("--nvrx", default=None, help=f"pin {NVRX} to this version instead")
    parser.add_argument("--check-glibc", action="store_true", help="fail unless this glibc can run that NVRx")
    args = parser.parse_args()
    if args.nvrx and args.check_glibc:
        check_glibc(args.nvrx)
    with open(args.pyproject, "rb") as f:
        print("\n".join(requirements(tomllib.load(f), args.extras, args.nvrx)))


if __name__ == "__main__":
    main()
