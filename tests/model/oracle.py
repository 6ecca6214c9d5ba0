"""Tiny random DeepSeek-V4 checkpoints written by transformers (the independent oracle)."""

from __future__ import annotations

from pathlib import Path

import torch

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"

# Varied geometry: seeds, windows, compress rates, head counts, index top-k below the number of
# compressed rows (so the indexer truly selects), hash and score MoE layers. Index heads are many
# (16+): an index score is exactly 0 when every head's relu(q.k) is 0 (probability 2^-heads), and
# such ties at the top-k cut are broken differently by transformers' torch.topk and by our
# lower-column-first rule.
ORACLE_CONFIGS = {
    "a": dict(seed=0, layer_types=[SWA, CSA, HCA, CSA], mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
              compress_rates={CSA: 4, HCA: 16}, sliding_window=32, num_attention_heads=4, head_dim=64,
              partial_rotary_factor=0.25, o_groups=2, index_topk=8, index_n_heads=16),
    "b": dict(seed=1, layer_types=[CSA, HCA, SWA, CSA, HCA], mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe", "moe"],
              compress_rates={CSA: 4, HCA: 8}, sliding_window=16, num_attention_heads=8, head_dim=32,
              partial_rotary_factor=0.5, o_groups=4, index_topk=5, index_n_heads=32),
    "c": dict(seed=2, layer_types=[HCA, CSA, SWA], mlp_layer_types=["moe", "moe", "hash_moe"],
              compress_rates={CSA: 4, HCA: 32}, sliding_window=64, num_attention_heads=2, head_dim=64,
              partial_rotary_factor=0.25, o_groups=1, index_topk=12, index_n_heads=16),
    # The real models' geometry in small: Flash's CSA/HCA alternation, an HCA ratio equal to the
    # window (a compression boundary on every page boundary), the 64-channel rope tail and 128-wide
    # index heads.
    "d": dict(seed=3, layer_types=[CSA, HCA, CSA, HCA], mlp_layer_types=["hash_moe", "moe", "moe", "moe"],
              compress_rates={CSA: 4, HCA: 32}, sliding_window=32, num_attention_heads=4, head_dim=128,
              partial_rotary_factor=0.5, o_groups=2, index_topk=6, index_n_heads=16, index_head_dim=128),
}


def make_hf_model(name: str, spec: dict | None = None):
    """A transformers DeepseekV4ForCausalLM with random float32 weights, perturbed beyond its
    init (sinks, position biases, gate biases, mHC bases, norms, hash tables) so every term matters.
    `spec` (same keys as ORACLE_CONFIGS' entries) instead of a named config."""
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    spec = dict(ORACLE_CONFIGS[name] if spec is None else spec)
    seed = spec.pop("seed")
    n_layers = len(spec["layer_types"])
    shared = dict(
        vocab_size=512, hidden_size=64, num_hidden_layers=n_layers, q_lora_rank=32, o_lora_rank=24,
        n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32, index_head_dim=32,
        max_position_embeddings=4096, rope_theta=10000.0, compress_rope_theta=160000.0,
        rope_parameters={"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 64,
                         "beta_fast": 32.0, "beta_slow": 1.0},
        routed_scaling_factor=1.5, initializer_range=0.1, eos_token_id=1, bos_token_id=0,
    )
    config = DeepseekV4Config(**{**shared, **spec})
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(config).float().eval()
    gen = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for pname, p in list(model.named_parameters()) + list(model.named_buffers()):
            if pname.endswith("tid2eid"):
                p.copy_(torch.randint(0, config.n_routed_experts, p.shape, generator=gen))
            elif pname.endswith(("sinks", "position_bias", "e_score_correction_bias", ".base", "hc_base")):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
            elif "norm" in pname and pname.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen))
    return model


def save_hf_checkpoint(name: str, path: Path):
    model = make_hf_model(name)
    model.save_pretrained(path)
    return model


def random_prompt(length: int, seed: int, vocab: int = 512) -> list[int]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(2, vocab, (length,), generator=gen).tolist()
