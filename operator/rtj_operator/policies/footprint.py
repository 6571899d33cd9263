"""A spec whose reference-trainer Llama cannot fit its nodes' GPUs, said at `kubectl apply`: a Warning event
GpuMemoryEstimate at the first pass of each spec generation, with the estimate's terms and what shrinks
them. The estimate is rtj_worker.footprint's (the trainer's own arguments, world = nodes x GPUs per node;
hot spares do not train). A warning, not InvalidSpec: an estimate may be wrong, and an out-of-memory rank
ends the job with its traceback anyway (CrashLoop); this only says so before any GPU is spent.

Only for the reference trainer (`python -m rtj_worker.train`): another command's memory is its own
business, and only for instance types whose GPU memory is known here (GPU_BYTES)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rtj_worker.footprint import FIT, GIB, estimate
from rtj_worker.launch import runs_reference_trainer

if TYPE_CHECKING:
    from ..draft import Draft

GB = 10**9
# Memory of one GPU of each GPU instance type (the GPU's rated size, in GB, as AWS lists it).
GPU_BYTES = {
    "p5.48xlarge": 80 * GB,  # H100 80 GB
    "p5e.48xlarge": 141 * GB,  # H200
    "p5en.48xlarge": 141 * GB,  # H200
    "p4de.24xlarge": 80 * GB,  # A100 80 GB
    "p4d.24xlarge": 40 * GB,  # A100 40 GB
}
REMEDIES = ("--precision bf16", "--activation-checkpointing", "a smaller --batch or --seq-len", "more nodes")


def warn_gpu_memory(d: Draft) -> None:
    rtj = d.rtj
    if d.old.get("observedGeneration") == rtj.generation:
        return
    spec = rtj.spec
    gpu = GPU_BYTES.get(spec["placement"].get("instanceType") or "")
    command = [*(spec.get("command") or []), *(spec.get("args") or [])]
    if gpu is None or not spec.get("gpusPerNode") or not runs_reference_trainer(command):
        return
    footprint = estimate(list(spec.get("args") or []), rtj.nodes * spec["gpusPerNode"])
    if footprint is None or footprint.fits(gpu):
        return
    d.event("Warning", "GpuMemoryEstimate",
            f"the model may not fit: {footprint.describe()}, over {FIT:.0%} of a "
            f"{spec['placement']['instanceType']} GPU's {gpu / GIB:.1f} GiB; consider "
            + ", ".join(r for r in REMEDIES if r.split()[0] not in command))
