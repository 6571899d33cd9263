"""The Dockerfile's targets and build arguments, read without Docker (`make images` builds them)."""

from __future__ import annotations

import importlib.util
import os
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _requirements_module():
    spec = importlib.util.spec_from_file_location("image_requirements", ROOT / "hack/images/requirements.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stages() -> dict[str, list[str]]:
    """Instructions by stage name; the global ARGs before the first FROM under ''."""
    lines = re.sub(r"\\\n", " ", DOCKERFILE).splitlines()
    out: dict[str, list[str]] = {"": []}
    current = ""
    for line in (ln.strip() for ln in lines):
        if not line or line.startswith("#"):
            continue
        match = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if match:
            current = match.group(2) or match.group(1)
            out[current] = [line]
        else:
            out[current].append(line)
    return out


def arg_defaults(instructions: list[str]) -> dict[str, str | None]:
    args = {}
    for line in instructions:
        match = re.match(r"ARG\s+(\w+)(?:=(\S+))?", line)
        if match:
            args[match.group(1)] = match.group(2)
    return args


def test_targets_and_production_defaults():
    s = stages()
    assert {"operator", "worker"} <= set(s)
    assert s["operator"][0] == "FROM ${OPERATOR_BASE} AS operator"
    assert s["worker"][0] == "FROM ${WORKER_BASE} AS worker"
    glob = arg_defaults(s[""])
    assert "ubuntu24.04" in glob["WORKER_BASE"]  # glibc 2.39 + Python 3.12 for NVRx >= 0.6 wheels
    assert glob["OPERATOR_BASE"]
    worker = arg_defaults(s["worker"])
    assert worker["NVRX_VERSION"] == "0.6.0"
    assert worker["INSTALL_EFA"] == "1"
    assert any("USER 65532:65532" == ln for ln in s["operator"]), "the operator runs as non-root"
    # ... with a passwd entry: kopf's getpass.getuser() raises KeyError for an unknown uid.
    assert any(ln.startswith("RUN") and "useradd -u 65532" in ln for ln in s["operator"])


def test_builds_without_a_registry():
    # A `# syntax=` line makes BuildKit pull its frontend image from Docker Hub.
    assert not re.search(r"^#\s*syntax=", DOCKERFILE, re.MULTILINE)
    assert "efa-installer.amazonaws.com" in DOCKERFILE and 'if [ "$INSTALL_EFA" = 1 ]' in DOCKERFILE
    for script in ("base.sh", "build.sh", "python-venv.sh"):
        assert os.access(ROOT / "hack/images" / script, os.X_OK), script


def test_worker_requirements_follow_pyproject_with_the_nvrx_argument():
    module = _requirements_module()
    reqs = module.requirements(PYPROJECT, ["worker"], nvrx="0.6.0")
    worker_extra = PYPROJECT["project"]["optional-dependencies"]["worker"]
    assert "nvidia-resiliency-ext==0.6.0" in reqs
    assert [r for r in reqs if not r.startswith("nvidia-resiliency-ext")] == [
        r for r in PYPROJECT["project"]["dependencies"] + worker_extra if not r.startswith("nvidia-resiliency-ext")]
    assert module.requirements(PYPROJECT, []) == PYPROJECT["project"]["dependencies"]


@pytest.mark.parametrize(("nvrx", "glibc", "ok"), [
    ("0.6.0", "2.36", False), ("0.6.0", "2.39", True), ("0.7.0", "2.41", True), ("0.4.1", "2.36", True),
])
def test_glibc_check(nvrx, glibc, ok):
    module = _requirements_module()
    if ok:
        module.check_glibc(nvrx, glibc)
    else:
        with pytest.raises(SystemExit, match=r"glibc >= 2\.39"):
            module.check_glibc(nvrx, glibc)
