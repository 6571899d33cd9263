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


def test_activation_checkpointing_recomputes_the_same_gradients_under_the_same_names():
    """Issue 27.4: only each block's input is kept for backward; the gradients, and the parameter names a
    checkpoint is keyed by, are those of the plain model."""
    grads = []
    for recompute in (False, True):
        model = build(seed=5)
        model.activation_checkpointing = recompute
        next_token_loss(model(ids()), ids(seed=2)).backward()
        grads.append({name: p.grad.clone() for name, p in model.named_parameters()})
    assert grads[0].keys() == grads[1].keys() == dict(build().named_parameters()).keys()
    for name in grads[0]:
        assert torch.allclose(grads[0][name], grads[1][name], atol=1e-6), name


def _one_rank(fn):
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", free_port(), world_size=1, is_master=True)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1, timeout=datetime.timedelta(seconds=30))
    try:
        return fn()
    finally:
        dist.destroy_process_group()


TINY_ARGS = ["--model", "llama", "--model-dim", "32", "--layers", "2", "--heads", "4", "--kv-heads", "2",
             "--vocab", "97", "--seq-len", "16", "--batch", "2"]


def test_meta_init_builds_nothing_until_sharded_then_initializes_each_shard_as_a_llama():
    """Issue 27.4: `--init meta`: no tensor has memory before fully_shard; afterwards every weight is set
    (norms 1, projections ~N(0, 0.02), the residual ones scaled down) and the rope tables computed, under
    the names a device-built model has (its checkpoints load either way)."""
    from rtj_worker.train import build_model, fresh, parse_args

    args = parse_args([*TINY_ARGS, "--init", "meta"])
    assert all(p.is_meta for p in build_model(args, torch.device("cpu")).parameters())
    model, _ = _one_rank(lambda: fresh(args, torch.device("cpu"), 1))
    full = {name: p.full_tensor() if hasattr(p, "full_tensor") else p for name, p in model.named_parameters()}
    assert full.keys() == dict(build().named_parameters()).keys()
    assert all(not p.is_meta and torch.isfinite(p).all() for p in full.values())
    assert torch.equal(full["norm.weight"], torch.ones(32))
    assert 0.015 < full["layers.0.attn.wq.weight"].std() < 0.025
    assert full["layers.0.attn.wo.weight"].std() < 0.6 * full["layers.0.attn.wq.weight"].std()
    cos, sin = rope_tables(TINY)
    assert torch.equal(model.rope_cos, cos) and torch.equal(model.rope_sin, sin)


def test_bf16_computes_in_bfloat16_and_keeps_fp32_parameters():
    """Issue 27.4: `--precision bf16` (FSDP2 mixed precision): a step's loss is the fp32 model's within bf16's
    precision, and the sharded parameters (what the optimizer and checkpoints hold) stay fp32."""
    from rtj_worker.train import fresh, parse_args, step_loss

    def step(precision: str) -> tuple[float, set[torch.dtype]]:
        args = parse_args([*TINY_ARGS, "--precision", precision])
        model, opt = fresh(args, torch.device("cpu"), 1)
        loss = step_loss(args, model, 0, 0, torch.device("cpu"))
        loss.backward()
        opt.step()
        return loss.item(), {p.dtype for p in model.parameters()}

    (full, dtypes32), (half, dtypes16) = _one_rank(lambda: (step("fp32"), step("bf16")))
    assert dtypes32 == dtypes16 == {torch.float32}
    assert half != full and abs(half - full) < 0.05 * full


def test_the_memory_estimate_reads_the_trainers_arguments_with_the_trainers_defaults():
    from rtj_worker import footprint
    from rtj_worker.train import parse_args

    ours = vars(footprint._parser().parse_args([]))
    theirs = vars(parse_args([]))
    assert {key: theirs[key] for key in ours} == ours
