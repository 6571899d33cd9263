"""rtj_worker.requirements: what a GPU pod's image needs of its node (issue 27.5), read without torch."""

from __future__ import annotations

import pytest

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
