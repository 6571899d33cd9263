"""rtj-worker as a package of its own (worker/pyproject.toml, issue 28): the wheel a user installs into an image
of their own, built here and run in an interpreter that has neither torch, NVRx nor the operator: the progress
library reports as the pod's entrypoint reads it, and the entrypoint refuses with one clear error what the
image lacks."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from rtj_worker import exit_codes, requirements

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "worker"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy (setuptools leaves build/ and egg-info beside its sources) with the
    venv's setuptools: no download."""
    tmp = tmp_path_factory.mktemp("dist")
    shutil.copytree(WORKER, tmp / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "build"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp / "out"), str(tmp / "src")], check=True)
    (found,) = (tmp / "out").glob("rtj_worker-*.whl")
    return found


@pytest.fixture(scope="module")
def site(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-compile", "--target",
                    str(target), str(wheel)], check=True)
    return target


def isolated(site: Path, code: str, env: dict[str, str], python: str = "") -> subprocess.CompletedProcess[str]:
    """`code` in an interpreter that sees only the standard library and `site`: -I ignores PYTHONPATH and the
    user's site, -S the venv's site-packages (torch, NVRx, the operator)."""
    python = python or shutil.which("python3") or sys.executable
    prelude = f"import sys; sys.path.insert(0, {str(site)!r}); "
    return subprocess.run([python, "-I", "-S", "-c", prelude + code], env=env, capture_output=True, text=True,
                          timeout=60)


def test_the_wheel_is_the_worker_alone_with_its_entrypoint(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(meta).decode()
        entry_points = archive.read(meta.replace("METADATA", "entry_points.txt")).decode()
    assert {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")} == {"rtj_worker"}
    assert "rtj_worker/progress.py" in names and "rtj_worker/entrypoint.py" in names
    assert "rtj-worker = rtj_worker.entrypoint:main" in entry_points
    # Nothing required: torch (the image's CUDA build) and NVRx are the image's; NVRx only as an extra.
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    assert requires and all("extra ==" in line for line in requires), requires


def test_its_version_and_python_are_the_projects() -> None:
    worker = tomllib.loads((WORKER / "pyproject.toml").read_text())["project"]
    top = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert worker["version"] == top["version"]
    assert worker["requires-python"] == ">=" + ".".join(map(str, requirements.SUPPORTED_PYTHON))
    assert worker["scripts"]["rtj-worker"] == top["scripts"]["rtj-worker"]


def interpreters() -> list[str]:
    """This machine's python3, and the lowest supported Python where the machine has it (pyenv)."""
    found = [shutil.which("python3") or sys.executable]
    lowest = "python" + ".".join(map(str, requirements.SUPPORTED_PYTHON))
    pyenv = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv") / "versions"
    other = next(iter(sorted(pyenv.glob(f"{lowest[6:]}.*/bin/{lowest}"))), None) or shutil.which(lowest)
    return found + ([str(other)] if other and "shims" not in str(other) else [])


@pytest.mark.parametrize("python", interpreters(), ids=lambda p: Path(p).name)
def test_the_progress_library_reports_without_torch_or_the_operator(site: Path, tmp_path: Path, python: str) -> None:
    """docs/your-script.md's level-3 loop, run as a user's script runs it: the pod's tracker (the same
    installed package) reads its step, its checkpoint and its run."""
    env = {"PATH": os.environ["PATH"], "RTJ_STATE_DIR": str(tmp_path), "LOCAL_RANK": "0",
           "TORCHELASTIC_RESTART_COUNT": "0"}
    code = """
import json
from pathlib import Path
from rtj_worker.progress import for_this_rank
from rtj_worker.report import Tracker
progress = for_this_rank()
progress.loaded(0)
progress.started(0, 0, 0)
for step in range(1, 13):
    progress.stepped(step)
    if step % 5 == 0:
        progress.commit(step)
tracker = Tracker(progress.dir)
tracker.poll()
try:
    import torch
except ImportError:
    torch = None
print(json.dumps({**tracker.report(), "torch": torch is not None,
                  "operator": __import__("importlib.util").util.find_spec("rtj_operator") is not None}))
"""
    done = isolated(site, code, env, python)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.splitlines()[-1])
    assert report["torch"] is False and report["operator"] is False
    assert report["step"] == 12 and report["ckpt"] == 10 and report["state"] == "Training", report


def test_an_image_without_torch_or_nvrx_fails_at_start_with_what_it_lacks(site: Path, tmp_path: Path) -> None:
    from rtj_worker import local

    env = {**local.local_env(tmp_path), "PATH": os.environ["PATH"]}
    done = isolated(site, "from rtj_worker.entrypoint import main; main(['--', 'python', 'train.py'])", env)
    assert done.returncode == exit_codes.CONFIG_ERROR, done.stderr[-2000:]
    reason = json.loads((tmp_path / "termination-log").read_text())["reason"]
    assert "torch is not installed" in reason and "nvidia-resiliency-ext is not installed" in reason, reason
    assert "docs/your-script.md" in reason
