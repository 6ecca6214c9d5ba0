"""The sharding transformation's bookkeeping, in one process: the parts it cuts (shapes, which
rows), and that a checkpoint read through `ShardSpec.read` (safetensors slices) gives exactly
the part `ShardSpec.take` cuts from the full tensor, for fused (transformers) and per-expert
(official) tensors, TP and EP."""

from __future__ import annotations

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from v4serve.model.deepseek_v4 import DeepseekV4ForCausalLM
from v4serve.model.loader import resolve_config
from v4serve.model.official_names import official_expert_target
from v4serve.parallel.shard import ShardSpec, shard_model


class FakeGroup:  # the cut needs only rank and size; no collective runs here
    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size


def meta_model(**overrides):
    config = resolve_config("tiny", {"num_hidden_layers": 2, **overrides})
    with torch.device("meta"):
        return DeepseekV4ForCausalLM(config), config


@pytest.mark.parametrize("expert_parallel", [False, True])
def test_cut_shapes(expert_parallel):
    net, c = meta_model()
    specs = shard_model(net, FakeGroup(1, 2), expert_parallel)
    attn, mlp = net.model.layers[0].self_attn, net.model.layers[0].mlp
    assert attn.n_heads == c.num_attention_heads // 2 and attn.o_groups == c.o_groups // 2
    assert attn.q_b_proj.weight.shape == (c.num_attention_heads // 2 * c.head_dim, c.q_lora_rank)
    assert attn.o_b_proj.weight.shape == (c.hidden_size, c.o_groups // 2 * c.o_lora_rank)
    assert attn.sinks.shape == (c.num_attention_heads // 2,)
    assert attn.kv_proj.weight.shape == (c.head_dim, c.hidden_size)  # the latent KV is replicated
    spec = specs["model.layers.0.self_attn.q_b_proj.weight"]  # rank 1 owns the second half of the heads
    assert spec.keep[0] == c.num_attention_heads // 2 * c.head_dim and spec.keep[-1] == spec.full_shape[0] - 1
    e, i = c.n_routed_experts, c.moe_intermediate_size
    if expert_parallel:
        assert mlp.experts.gate_up_proj.shape == (e // 2, 2 * i, c.hidden_size)
        assert specs["model.layers.0.mlp.experts.down_proj"].keep == tuple(range(e // 2, e))
    else:
        assert mlp.experts.gate_up_proj.shape == (e, i, c.hidden_size)
        assert specs["model.layers.0.mlp.experts.gate_up_proj"].keep == (*range(i // 2, i), *range(i + i // 2, 2 * i))
    assert net.model.embed_tokens.weight.shape == (c.vocab_size // 2, c.hidden_size)
    assert net.lm_head.weight.shape == (c.vocab_size // 2, c.hidden_size)


def test_indivisible_sizes_name_the_field():
    net, _ = meta_model()
    with pytest.raises(ValueError, match=r"o_groups \(2\) must be divisible by tensor_parallel_size \(4\)"):
        shard_model(net, FakeGroup(0, 4))


@pytest.mark.parametrize("spec", [
    ShardSpec(1, (2, 3, 6, 7), (3, 8, 5)),  # TP gate_up rows [gate_r; up_r] of fused [E, 2I, D]
    ShardSpec(2, (1, 2), (3, 5, 4)),  # TP down_proj columns
    ShardSpec(0, (1, 2), (3, 8, 5)),  # EP experts
    ShardSpec(0, (4, 5, 6, 7), (8, 5)),  # a 2-D row cut (q_b_proj, vocabulary)
])
def test_sliced_reads_equal_the_cut(tmp_path, spec):
    full = torch.randn(spec.full_shape)
    tensors = {"fused": full}
    if len(spec.full_shape) == 3:  # the official per-expert tensors of the same values
        half = spec.full_shape[1] // 2
        for x in range(spec.full_shape[0]):
            tensors[f"e{x}.w1"], tensors[f"e{x}.w3"] = full[x, :half].clone(), full[x, half:].clone()
            tensors[f"e{x}.w2"] = full[x].clone()
    save_file(tensors, str(tmp_path / "t.safetensors"))
    expected = spec.take(full)
    with safe_open(str(tmp_path / "t.safetensors"), framework="pt") as f:
        dest = torch.full_like(expected, float("nan"))
        view, part = spec.read(f.get_slice("fused"), dest, None, None)
        view.copy_(part)
        assert torch.equal(dest, expected)
        if len(spec.full_shape) != 3:
            return
        dest = torch.full_like(expected, float("nan"))
        which = ("w2",) if spec.dim == 2 else ("w1", "w3")
        for x in range(spec.full_shape[0]):
            for w in which:
                rows = None if w == "w2" else official_expert_target(0, x, w, spec.full_shape[1] // 2).rows
                placed = spec.read(f.get_slice(f"e{x}.{w}"), dest, x, rows)
                if placed is None:
                    assert spec.dim == 0 and x not in spec.keep
                    continue
                view, part = placed
                assert view.shape == part.shape
                view.copy_(part)
        assert torch.equal(dest, expected)
