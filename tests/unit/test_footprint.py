"""Issue 27.4: the memory estimate of the reference trainer's Llama (rtj_worker.footprint) at each example's
shape, and the operator's warning for a spec that cannot fit its GPUs (policies/footprint.py)."""

from __future__ import annotations

from typing import Any

import pytest
from test_reconcile_table import W, reasons

from rtj_operator.policies.footprint import GPU_BYTES
from rtj_worker.footprint import FIT, GIB, estimate
from testkit import ROOT, load_yaml

EIGHT_NODE = load_yaml(ROOT / "examples" / "rtj-8node.yaml")["spec"]
# The 8-node example's model and batch, without the settings that make it fit (as it was before issue 27).
AS_IT_WAS = [a for a in EIGHT_NODE["args"] if a not in ("--precision", "bf16", "--activation-checkpointing",
                                                         "--init", "meta")]


def world(spec: dict[str, Any]) -> int:
    return spec["nodes"]["count"] * spec.get("gpusPerNode", 8)


@pytest.mark.parametrize("name", ["rtj-2node.yaml", "rtj-8node.yaml", "rtj-kueue.yaml"])
def test_every_example_fits_its_gpus(name):
    spec = load_yaml(ROOT / "examples" / name)["spec"]
    footprint = estimate(spec["args"], world(spec))
    assert footprint is not None
    gpu = GPU_BYTES[spec["placement"].get("instanceType", "p5.48xlarge")]
    assert footprint.fits(gpu), footprint.describe()


def test_the_eight_node_example_as_it_was_needs_its_attention_probabilities_alone_137_gb():
    """The issue's arithmetic: fp32, no recomputation, the math attention kernel, batch 2 of 4096 tokens and
    32 heads: 2 x 32 x 4096^2 x 4 bytes = 4.3 GB per layer, 137 GB for 32 layers, on an 80 GB H100."""
    before = estimate(AS_IT_WAS, world(EIGHT_NODE))
    assert before is not None and not before.fits(GPU_BYTES["p5.48xlarge"])
    assert before.activations > 32 * 2 * 32 * 4096**2 * 4 > 137e9
    after = estimate(EIGHT_NODE["args"], world(EIGHT_NODE))
    assert after is not None and after.total < before.total / 10
    assert after.params == before.params  # the same model


@pytest.mark.parametrize("extra, smaller", [
    (["--precision", "bf16"], "activations"),  # half the bytes per activation
    (["--activation-checkpointing"], "activations"),  # a block's input instead of its every tensor
    (["--nondeterministic"], "activations"),  # flash/memory-efficient attention keep no probabilities
])
def test_each_setting_shrinks_what_it_should(extra, smaller):
    base, changed = estimate(AS_IT_WAS, 64), estimate([*AS_IT_WAS, *extra], 64)
    assert getattr(changed, smaller) < getattr(base, smaller) and changed.state == base.state


def test_the_optimizer_state_is_sharded_over_every_gpu():
    one, many = estimate(AS_IT_WAS, 8), estimate(AS_IT_WAS, 64)
    assert one.state == pytest.approx(8 * many.state, rel=1e-6)
    assert one.state == pytest.approx(16 * one.params / 8, rel=1e-6)


@pytest.mark.parametrize("args", [[], ["--model", "mlp"], ["--model", "llama", "--heads", "x"],
                                  ["--model", "llama", "--batch", "0"]])
def test_no_estimate_without_a_llama_to_estimate(args):
    assert estimate(args, 8) is None


# --- the operator --------------------------------------------------------------------------------------
def spec(args: list[str], **extra: Any) -> dict[str, Any]:
    return {"command": ["python", "-m", "rtj_worker.train"], "args": args, "gpusPerNode": 8,
            "nodes": {"count": 8}, "placement": {"instanceType": "p5.48xlarge"}, **extra}


def test_a_spec_that_cannot_fit_is_warned_of_once_per_generation_with_what_shrinks_it():
    w = W(children=False, **spec(AS_IT_WAS))
    intent = w.run()
    [event] = [e for e in intent.events if e.reason == "GpuMemoryEstimate"]
    assert event.type == "Warning" and "GiB per GPU" in event.message and "attention" not in event.message
    assert "--precision bf16" in event.message and "--activation-checkpointing" in event.message
    assert f"over {FIT:.0%} of a p5.48xlarge GPU's {80e9 / GIB:.1f} GiB" in event.message
    w.body["status"] = {"observedGeneration": 1}
    assert "GpuMemoryEstimate" not in reasons(w.run())  # the same spec: said once
    w.body["metadata"]["generation"] = 2
    assert "GpuMemoryEstimate" in reasons(w.run())  # an edit that still does not fit: said again


@pytest.mark.parametrize("changes", [
    {"args": EIGHT_NODE["args"]},  # the example as it is: it fits
    {"command": ["python", "train.py"]},  # not the reference trainer: its memory is its own
    {"placement": {"instanceType": "g6.xlarge"}},  # a GPU this operator does not know
    {"gpusPerNode": 0},
])
def test_no_warning_where_it_fits_or_cannot_be_known(changes):
    assert "GpuMemoryEstimate" not in reasons(W(children=False, **{**spec(AS_IT_WAS), **changes}).run())
