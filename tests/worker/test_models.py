"""The reference trainer's Llama model (rtj_worker.models) on CPU: shapes, the parameter count, GQA,
causality, determinism, what its checkpoints hold, and FSDP2 sharding by transformer block."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.nn.functional as F

from rtj_worker.models import Llama, LlamaConfig, apply_rope, next_token_loss, rope_tables
from testkit import free_port

TINY = LlamaConfig(vocab_size=97, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, max_seq_len=16)


def build(cfg: LlamaConfig = TINY, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    return Llama(cfg)


def ids(cfg: LlamaConfig = TINY, batch: int = 3, seq: int = 12, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, cfg.vocab_size, (batch, seq), generator=torch.Generator().manual_seed(seed))


def test_logits_have_one_row_per_token_and_vocabulary_entry():
    assert build()(ids()).shape == (3, 12, TINY.vocab_size)


@pytest.mark.parametrize("cfg", [TINY, LlamaConfig(vocab_size=50, dim=48, n_layers=3, n_heads=6, n_kv_heads=6),
                                 LlamaConfig(vocab_size=32000, dim=256, n_layers=1, n_heads=8, n_kv_heads=1,
                                             ffn_multiple_of=256)],
                         ids=["gqa", "mha", "mqa"])
def test_the_parameter_count_formula_matches_the_module(cfg):
    model = Llama(cfg)
    assert sum(p.numel() for p in model.parameters()) == cfg.num_params()
    assert cfg.ffn_dim % cfg.ffn_multiple_of == 0 and cfg.ffn_dim >= 8 * cfg.dim // 3
    assert all(m.bias is None for m in model.modules() if isinstance(m, torch.nn.Linear))  # no biases
    assert model.output.weight.data_ptr() != model.tok_emb.weight.data_ptr()  # head and embedding not tied


def test_rotary_tables_are_buffers_that_checkpoints_leave_out():
    model = build()
    assert {"rope_cos", "rope_sin"} <= {name for name, _ in model.named_buffers()}
    assert not any("rope" in key for key in model.state_dict())
    assert model.rope_cos.shape == (TINY.max_seq_len, TINY.head_dim // 2)


def test_rotary_embedding_keeps_norms_and_makes_scores_depend_on_relative_position():
    cos, sin = rope_tables(TINY)
    q, k = torch.randn(TINY.head_dim), torch.randn(TINY.head_dim)

    def at(x: torch.Tensor, pos: int) -> torch.Tensor:
        rows = torch.zeros(1, 1, TINY.max_seq_len, TINY.head_dim)
        rows[0, 0, pos] = x
        return apply_rope(rows, cos, sin)[0, 0, pos]

    assert torch.allclose(at(q, 5).norm(), q.norm(), atol=1e-5)
    assert torch.allclose(at(q, 7) @ at(k, 3), at(q, 10) @ at(k, 6), atol=1e-4)  # both 4 apart


def test_grouped_query_attention_equals_attention_with_each_kv_head_repeated():
    """enable_gqa shares each key/value head with its query group: the same as repeating it."""
    q, k, v = torch.randn(2, 4, 6, 8), torch.randn(2, 2, 6, 8), torch.randn(2, 2, 6, 8)
    grouped = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    repeated = F.scaled_dot_product_attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), is_causal=True)
    assert torch.allclose(grouped, repeated, atol=1e-6)


def test_a_token_never_sees_the_tokens_after_it():
    model, x = build(), ids()
    changed = x.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % TINY.vocab_size
    before, after = model(x), model(changed)
    assert torch.equal(before[:, :8], after[:, :8]) and not torch.allclose(before[:, 8:], after[:, 8:])


def test_the_same_seed_builds_the_same_model_and_the_same_loss():
    x = ids(seq=13)
    with torch.no_grad():
        losses = [next_token_loss(build(seed=7)(x[:, :-1]), x[:, 1:]) for _ in range(2)]
    assert torch.equal(*losses) and losses[0].dtype == torch.float32
    assert not torch.equal(build(seed=7).output.weight, build(seed=8).output.weight)
    # Random weights predict about uniformly: the loss starts near log(vocabulary).
    assert abs(losses[0].item() - torch.log(torch.tensor(float(TINY.vocab_size)))) < 0.5


def test_residual_projections_start_smaller_than_the_others():
    model = build(LlamaConfig(vocab_size=64, dim=128, n_layers=8, n_heads=4, n_kv_heads=2))
    block = model.layers[0]
    assert block.attn.wo.weight.std() < 0.5 * block.attn.wq.weight.std()
    assert block.ffn.w2.weight.std() < 0.5 * block.ffn.w1.weight.std()
    assert torch.equal(block.attn_norm.weight, torch.ones(128))


def test_the_config_rejects_heads_that_do_not_divide():
    with pytest.raises(ValueError, match="n_kv_heads"):
        LlamaConfig(dim=64, n_heads=4, n_kv_heads=3)


def test_fsdp2_shards_every_block_and_trains_like_the_unsharded_model():
    """World of 1 (gloo): fully_shard turns every parameter into a DTensor, one FSDP unit per block plus
    the root, and a training step gives what the plain module gives."""
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    from rtj_worker.train import llama_config, parse_args, shard, step_loss

    args = parse_args(["--model", "llama", "--model-dim", "32", "--layers", "2", "--heads", "4", "--kv-heads", "2",
                       "--vocab", "97", "--seq-len", "16", "--batch", "2"])
    assert llama_config(args) == TINY
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, world_size=1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        plain, sharded = build(seed=3), shard(build(seed=3), torch.device("cpu"), 1)
        assert all(isinstance(m, FSDPModule) for m in [sharded, *sharded.layers])
        assert all(type(p).__name__ == "DTensor" for p in sharded.parameters())
        for model in (plain, sharded):
            opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            step_loss(args, model, 0, 0, torch.device("cpu")).backward()
            opt.step()
        for (name, p), q in zip(plain.named_parameters(), sharded.parameters(), strict=True):
            assert torch.allclose(p, q.full_tensor(), atol=1e-6), name
    finally:
        dist.destroy_process_group()
