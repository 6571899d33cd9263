"""GPU memory per rank of the reference trainer's Llama, estimated from its arguments (pure: no torch, so
the operator can check a spec at `kubectl apply`; `rtj_operator.policies.footprint` does).

What a rank holds at its peak, the terms of `Footprint`:

- **state:** its 1/world of the fp32 parameters, their gradients and Adam's two moments (FSDP2 shards all
  four): 16 bytes per parameter / world;
- **gathered:** the unsharded parameters FSDP2 holds at once in the compute precision (the root's
  embedding, final norm and output head for the whole step; two blocks: the one computing and the one
  prefetched) and the unsharded gradients of one block before its reduce-scatter (fp32);
- **activations:** what the backward pass needs, per block (Korthikanti et al., "Reducing Activation
  Recomputation in Large Transformer Models", 2022, for this block's tensors): the two norms' inputs and
  outputs, q, k and v before and after the rotary embedding, the attention output, the SwiGLU's four
  (B, T, ffn) tensors and, with the deterministic math attention kernel, the (B, heads, T, T) attention
  probabilities (flash and memory-efficient kernels keep only a (B, heads, T) log-sum-exp). With
  activation checkpointing a block keeps only its input, and one block's full set exists at a time,
  while it is recomputed;
- **logits:** the output head's (B, T, vocab) logits, their fp32 copy for the loss and its gradient;
- **reserve:** a fixed allowance for the CUDA context, NCCL's buffers and the caching allocator's
  fragmentation (`RESERVE`).

An estimate, not a measurement: it is meant to tell 137 GB from 15 GB (issue 27: the 8-node example at
fp32, no recomputation, math attention needed about 137 GB of attention probabilities alone on an 80 GB
H100), not 70 from 75. `FIT` is the share of a GPU's memory a spec may plan to use.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

GIB = 1 << 30
RESERVE = 6 * GIB
FIT = 0.9


@dataclass(frozen=True)
class Footprint:
    params: int
    state: int
    gathered: int
    activations: int
    logits: int
    reserve: int = RESERVE

    @property
    def total(self) -> int:
        return self.state + self.gathered + self.activations + self.logits + self.reserve

    def fits(self, gpu_bytes: int) -> bool:
        return self.total <= FIT * gpu_bytes

    def describe(self) -> str:
        parts = {"optimizer state": self.state, "gathered parameters": self.gathered,
                 "activations": self.activations, "logits": self.logits, "reserve": self.reserve}
        return (f"{self.total / GIB:.1f} GiB per GPU for {self.params / 1e9:.2f}B parameters ("
                + ", ".join(f"{name} {size / GIB:.1f}" for name, size in parts.items()) + ")")


def _parser() -> argparse.ArgumentParser:
    """The arguments of rtj_worker.train that size the model and its step (their defaults are train.py's;
    tests/worker/test_models.py checks that they agree)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--model-dim", type=int, default=256)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=1024)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--nondeterministic", action="store_true")
    return parser


def ffn_dim(dim: int, multiple_of: int = 32) -> int:
    """models.LlamaConfig.ffn_dim (2/3 of 4*dim, rounded up to a multiple)."""
    return multiple_of * math.ceil(int(2 * 4 * dim / 3) / multiple_of)


def estimate(args: list[str], world: int) -> Footprint | None:
    """The peak per rank of `rtj_worker.train <args>` on `world` ranks; None unless it trains the Llama (or
    the arguments are not the trainer's)."""
    try:
        a, _ = _parser().parse_known_args(args)
    except SystemExit:  # a value of the wrong type: the trainer itself will say so
        return None
    if a.model != "llama" or world < 1 or min(a.model_dim, a.layers, a.heads, a.kv_heads, a.vocab, a.seq_len,
                                             a.batch) < 1:
        return None
    d, layers, heads, vocab, b, t = a.model_dim, a.layers, a.heads, a.vocab, a.batch, a.seq_len
    kv = a.kv_heads * (d // a.heads)
    ffn = ffn_dim(d)
    block = 2 * d * d + 2 * d * kv + 3 * d * ffn + 2 * d
    root = 2 * vocab * d + d
    params = root + layers * block
    act = 2 if a.precision == "bf16" else 4  # bytes of a computed tensor

    state = 16 * params // world
    gathered = (root + 2 * block) * act + block * 4
    tokens = b * t
    per_block = tokens * act * (4 * d + 2 * (d + 2 * kv) + d + 4 * ffn)
    if not a.nondeterministic:  # the math kernel keeps the attention probabilities
        per_block += b * heads * t * t * act
    if a.activation_checkpointing:
        activations = layers * tokens * d * act + per_block
    else:
        activations = layers * per_block
    logits = tokens * vocab * (act + 4 + 4)
    return Footprint(params, state, gathered, activations, logits)
