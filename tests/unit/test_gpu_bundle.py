"""hack/gpu_bundle.py's choices, read without a network: which wheels the offline GPU machine
(CPython 3.12, glibc 2.39) can install, and what a bundle lacks (`make gpu-bundle` downloads it)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bundle_module():
    spec = importlib.util.spec_from_file_location("gpu_bundle", ROOT / "hack/gpu_bundle.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bundle = _bundle_module()


def test_platforms_cover_every_older_glibc_and_the_legacy_names_but_no_newer_one():
    tags = bundle.platforms((2, 39))
    assert tags[0] == "manylinux_2_39_x86_64"
    assert {"manylinux_2_17_x86_64", "manylinux_2_5_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert "manylinux_2_40_x86_64" not in tags
    assert "manylinux2014_x86_64" not in bundle.platforms((2, 12))  # 2014 = glibc 2.17


def test_wheel_fits_the_images_python_and_glibc_only():
    nvrx = "nvidia_resiliency_ext-0.6.0-cp312-cp312-manylinux_2_39_x86_64.whl"
    assert bundle.wheel_fits(nvrx, (3, 12), (2, 39))
    assert not bundle.wheel_fits(nvrx, (3, 11), (2, 39))  # built for another Python
    assert not bundle.wheel_fits(nvrx, (3, 12), (2, 35))  # needs a newer glibc
    assert bundle.wheel_fits("protobuf-6.33.6-cp39-abi3-manylinux2014_x86_64.whl", (3, 12), (2, 39))
    assert not bundle.wheel_fits("protobuf-6.33.6-cp313-abi3-manylinux2014_x86_64.whl", (3, 12), (2, 39))
    assert bundle.wheel_fits("idna-3.20-py3-none-any.whl")
    assert not bundle.wheel_fits("grpcio-1.76.0-cp312-cp312-macosx_11_0_universal2.whl")


def _metadata(*requires: str) -> str:
    return "Metadata-Version: 2.1\nName: x\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)


def test_requirements_follow_markers_and_leave_extras_out():
    text = _metadata("psutil>=6", 'tomli; python_version < "3.11"', 'pytest; extra == "test"',
                     'pywin32; sys_platform == "win32"', "torch")
    assert [r.name for r in bundle.requirements(text, (3, 12))] == ["psutil", "torch"]
    assert [r.name for r in bundle.requirements(text, (3, 10))] == ["psutil", "tomli", "torch"]


def test_closure_problems_name_what_is_neither_bundled_nor_in_the_image_and_bad_versions():
    metadata = {
        "nvidia-resiliency-ext": ("0.6.0", _metadata("torch>=2.3", "psutil>=6", "pyyaml", "httpx")),
        "psutil": ("5.9.0", _metadata()),
        "pyyaml": ("6.0.3", _metadata()),
    }
    assert sorted(bundle.closure_problems(metadata)) == [
        "nvidia-resiliency-ext requires httpx: neither in the bundle nor in the image",
        "nvidia-resiliency-ext requires psutil>=6: the bundle has psutil 5.9.0"]
    assert bundle.missing(metadata) == {"httpx"}  # torch is the image's
    assert bundle.pinned({"httpx", "left-pad"}) == (["httpx==" + bundle.PINS["httpx"]], ["left-pad"])
