"""rtj_worker.requirements: what a GPU pod's image needs of its node (issue 27.5), read without torch."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from rtj_worker import requirements
from rtj_worker.requirements import driver_version, package_version, problems

GPU = {"NVIDIA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}


@pytest.mark.parametrize("env, driver, cuda, nccl, want", [
    (GPU, (580, 65, 6), (13, 0, 96), (2, 27, 7), []),
    (GPU, (570, 86, 15), (13, 0, 96), (2, 27, 7), ["below the 580.65 that CUDA 13"]),
    (GPU, (570, 86, 15), (12, 8, 90), (2, 27, 7), []),  # a CUDA 12 image runs there
    (GPU, (580, 95, 5), (13, 0, 96), (2, 28, 5), ["NCCL 2.28.5 crashes under in-process restart"]),
    ({**GPU, "RTJ_INPROCESS_ENABLED": "0"}, (580, 95, 5), (13, 0, 96), (2, 28, 5), []),
    (GPU, (580, 95, 5), (13, 0, 96), (2, 28, 9), []),
    ({}, (470, 1), (13, 0), (2, 28, 5), []),  # no GPUs in this pod: nothing checked
    (GPU, None, (13, 0), (2, 28, 5), []),  # no driver loaded (a CPU node): nothing to say
])
def test_a_gpu_pod_says_what_its_node_or_image_lacks(env, driver, cuda, nccl, want):
    found = problems(env, driver, cuda, nccl)
    assert len(found) == len(want) and all(w in f for w, f in zip(want, found, strict=True)), found


def test_versions_are_read_from_the_driver_file_and_the_package_metadata(tmp_path):
    version = tmp_path / "version"
    version.write_text("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
                       "(dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 06:54:38 UTC 2025\nGCC version:  gcc 13.3.0\n")
    assert driver_version(version) == (580, 65, 6)
    assert driver_version(tmp_path / "absent") is None
    found = [("torch", "2.13.0"), ("nvidia-nccl-cu13", "2.27.7"), ("nvidia-cuda-runtime", "13.0.96")]
    assert package_version(("nvidia-nccl",), lambda: found) == (2, 27, 7)
    assert package_version(("nvidia-cuda-runtime",), lambda: found) == (13, 0, 96)
    assert package_version(("nvidia-cudnn",), lambda: found) is None


@pytest.mark.parametrize("devices, user, plugin, want_env, problem", [
    (0, None, False, {}, ""),  # no EFA in this pod (CPU, or efaPerNode 0): nothing
    (32, None, True, {"NCCL_NET": "AWS Libfabric"}, ""),  # NCCL must use the plugin, or fail
    (32, None, False, {}, "32 EFA devices but the image has no NCCL net plugin"),
    (32, "Socket", False, {}, ""),  # the user's choice is kept, sockets knowingly
])
def test_a_pod_with_efa_makes_nccl_use_it_or_says_why_not(tmp_path, devices, user, plugin, want_env, problem):
    dev = tmp_path / "infiniband"
    dev.mkdir()
    for i in range(devices):
        (dev / f"uverbs{i}").touch()
    lib = tmp_path / "lib"
    lib.mkdir()
    if plugin:
        (lib / "libnccl-net-ofi.so").touch()
    env = {"NCCL_NET": user} if user else {}
    found = requirements.ofi_plugin(f"/nonexistent:{lib}")
    assert (found is not None) == plugin
    got, problems_ = requirements.nccl_network(env, requirements.efa_devices(dev), found)
    assert got == want_env
    assert (problems_[0] if problems_ else "").startswith("the pod has " if problem else "")
    assert all(problem in p for p in problems_)


FAKE_PLUGIN = """
typedef struct { const char* name; void* init; } net_t;
const net_t ncclNetPlugin_v9 = { "%s", 0 };
"""


@pytest.mark.parametrize("name, code", [("AWS Libfabric", 0), ("IB", 1)])
def test_the_image_check_loads_the_plugin_and_reads_its_network(tmp_path, monkeypatch, capsys, name, code):
    """`python -m rtj_worker.requirements efa` (make images-efa runs it in the built image): dlopen, as
    NCCL does, and the network the plugin offers must be the one the pods select. A stand-in plugin
    built here (the real one needs the EFA installer, from the internet): the same symbol and layout."""
    gcc = shutil.which("gcc") or pytest.skip("no gcc")
    source = tmp_path / "plugin.c"
    source.write_text(FAKE_PLUGIN % name)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(tmp_path / "libnccl-net-ofi.so"), str(source)], check=True)
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path))
    assert requirements.main(["efa"]) == code
    assert f"network '{name}'" in capsys.readouterr().out
    monkeypatch.setenv("LD_LIBRARY_PATH", str(tmp_path / "none"))
    assert requirements.main(["efa"]) == 1


@pytest.mark.parametrize("installed, python, want", [
    ({"torch": "2.13.0", "nvidia-resiliency-ext": "0.6.0"}, (3, 11, 7), []),
    ({"torch": "2.11.0+cu130", "nvidia-resiliency-ext": "0.4.1"}, (3, 12, 1), []),
    ({"torch": "2.13.0"}, (3, 11, 7), ["nvidia-resiliency-ext is not installed (ft_launcher"]),
    ({}, (3, 11, 7), ["torch is not installed", "nvidia-resiliency-ext is not installed"]),
    ({"torch": "2.13.0", "nvidia-resiliency-ext": "0.3.0"}, (3, 11, 7), ["nvidia-resiliency-ext 0.3.0 is older"]),
    ({"torch": "1.13.1", "nvidia-resiliency-ext": "0.6.0"}, (3, 11, 7), ["torch 1.13.1 is older than 2.0"]),
    ({"torch": "2.13.0", "nvidia-resiliency-ext": "0.6.0"}, (3, 9, 18), ["Python 3.9.18 is older than the 3.10"]),
])
def test_an_image_without_what_rtj_worker_needs_is_one_clear_error(installed, python, want):
    found = requirements.image_problems(installed.get, python)
    assert len(found) == len(want) and all(w in f for w, f in zip(want, found, strict=True)), found
    if found:
        assert "docs/your-script.md" in found[-1]


def test_this_venv_has_what_rtj_worker_needs():
    assert requirements.image_problems() == []
