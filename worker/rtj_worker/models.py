"""A Llama-architecture decoder for the reference trainer: config-built, random init, nothing downloaded.

RMSNorm, rotary position embeddings, grouped-query attention (torch's scaled_dot_product_attention,
causal), SwiGLU feed-forward, no biases, an embedding and an output head that are not tied (tying
weights across FSDP2 units would put one parameter in two of them). Sized by LlamaConfig, from a
few hundred thousand parameters (CPU tests) to billions (GPU nodes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclass(frozen=True)
class LlamaConfig:
    vocab_size: int = 1024
    dim: int = 256
    n_layers: int = 4
    n_heads: int = 8
    n_kv_heads: int = 2  # GQA: each key/value head serves n_heads // n_kv_heads query heads
    max_seq_len: int = 128
    ffn_multiple_of: int = 32  # Llama rounds the SwiGLU width up to a multiple (256 at scale)
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02

    def __post_init__(self) -> None:
        if self.dim % self.n_heads or self.n_heads % self.n_kv_heads or (self.dim // self.n_heads) % 2:
            raise ValueError(f"dim ({self.dim}) must split into n_heads ({self.n_heads}) even-sized heads, "
                             f"and n_heads into n_kv_heads ({self.n_kv_heads}) groups")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def ffn_dim(self) -> int:
        """Llama's SwiGLU width: 2/3 of 4*dim (three matrices cost what two of 4*dim would), rounded up."""
        hidden = int(2 * 4 * self.dim / 3)
        return self.ffn_multiple_of * math.ceil(hidden / self.ffn_multiple_of)

    def num_params(self) -> int:
        d, kv = self.dim, self.n_kv_heads * self.head_dim
        block = 2 * d * d + 2 * d * kv + 3 * d * self.ffn_dim + 2 * d  # wq wo, wk wv, w1 w2 w3, two norms
        return 2 * self.vocab_size * d + d + self.n_layers * block  # embedding + head, final norm


def rope_tables(cfg: LlamaConfig, device: torch.device | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency, (max_seq_len, head_dim / 2), in float32."""
    half = torch.arange(0, cfg.head_dim, 2, dtype=torch.float32, device=device) / cfg.head_dim
    angles = torch.outer(torch.arange(cfg.max_seq_len, dtype=torch.float32, device=device), cfg.rope_theta ** -half)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, head_dim) pairs (i, i + head_dim/2) by their position's angles (rotate-half form)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    cos, sin = cos[: x.shape[-2]], sin[: x.shape[-2]]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.wq(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(b, t, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # enable_gqa: SDPA shares each key/value head among its query group without materializing copies.
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.wo(out.transpose(1, 2).reshape(b, t, -1))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # gate
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.attn_norm, self.attn = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps), Attention(cfg)
        self.ffn_norm, self.ffn = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps), FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.ffn(self.ffn_norm(x))


class Llama(nn.Module):
    def __init__(self, cfg: LlamaConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = nn.RMSNorm(cfg.dim, eps=cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        # Derived from the config: non-persistent, so neither in state_dict() nor in checkpoints.
        cos, sin = rope_tables(cfg, self.tok_emb.weight.device)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # Keep only each block's input for the backward pass and recompute the rest there (non-reentrant
        # torch.utils.checkpoint, so parameter names, and checkpoints, are the same either way).
        self.activation_checkpointing = False
        self.reset_parameters()

    def init_weights(self) -> None:
        """Weights and the rope tables where the model now is: after a build on the meta device, sharding
        and `to_empty` (which leaves every tensor uninitialized), each rank initializes only its shard."""
        self.reset_parameters()
        with torch.no_grad():
            cos, sin = rope_tables(self.cfg, self.rope_cos.device)
            self.rope_cos.copy_(cos)
            self.rope_sin.copy_(sin)

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Normal(0, init_std) weights; the projections back into the residual stream (wo, w2) scaled
        by 1/sqrt(2 * n_layers) so that its variance does not grow with depth (GPT-2, Llama); norms 1."""
        std, residual_std = self.cfg.init_std, self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, 0.0, residual_std if name.endswith(("wo.weight", "w2.weight")) else std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, T, vocab) logits."""
        h = self.tok_emb(tokens)
        for layer in self.layers:
            if self.activation_checkpointing and torch.is_grad_enabled():
                h = checkpoint(layer, h, self.rope_cos, self.rope_sin, use_reentrant=False)
            else:
                h = layer(h, self.rope_cos, self.rope_sin)
        return self.output(self.norm(h))


def next_token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of next-token prediction, in float32 whatever the logits' precision."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())
