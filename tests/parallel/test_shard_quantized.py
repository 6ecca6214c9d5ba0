"""Sharding the quantized modules, in one process (no collective runs): each rank's FP8 / MXFP4
tensors, read from the official checkpoint or generated for a preset, are exactly its cut of the
one-process model's; cuts that would split a scale block are refused naming the layer; the
Flash and Pro shapes cut on whole blocks for TP 2 / 4 / 8."""

from __future__ import annotations

import pytest
import torch

from v4serve.model.deepseek_v4 import DeepseekV4ForCausalLM
from v4serve.model.loader import build_model, resolve_config
from v4serve.model.quantized import FP8GroupedLinear, FP8Linear, MXFP4Experts
from v4serve.model.quantized_install import install, official_plan
from v4serve.ops.weight_formats import quantize_fp8_blocks
from v4serve.parallel.shard import ShardSpec, shard_model


class FakeGroup:  # the cut needs only rank and size
    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size


def build(model: str, rank: int | None, expert_parallel: bool = False, **kwargs):
    shard = None if rank is None else (lambda net: shard_model(net, FakeGroup(rank, 2), expert_parallel))
    net, _ = build_model(model, "cpu", torch.float32, progress=False, shard=shard, **kwargs)
    return net


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.element_size() == 1 else t  # e4m3 compared by its bytes


def assert_rank_parts(full, ranks):
    """Every parameter of each rank equals its spec's cut of the one-process parameter."""
    expected = dict(full.named_parameters())
    for net in ranks:
        cut = 0
        for name, p in net.named_parameters():
            spec = net.shard_specs.get(name)
            want = expected[name] if spec is None else spec.take(expected[name])
            assert p.dtype == want.dtype and torch.equal(_bits(p), _bits(want)), name
            cut += spec is not None and p.dtype in (torch.float8_e4m3fn, torch.uint8)
        assert cut > 0


@pytest.mark.parametrize("naming", ["official", "transformers"])
@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp", "ep"])
def test_checkpoint_ranks_read_their_parts(request, naming, expert_parallel):
    # widths of whole blocks at TP 2 (conftest.py)
    checkpoint = request.getfixturevalue("quantized_tp_checkpoint" + ("" if naming == "official" else "_hf"))
    full = build(checkpoint, None)
    ranks = [build(checkpoint, r, expert_parallel) for r in range(2)]
    assert_rank_parts(full, ranks)
    layer = ranks[1].model.layers[1]
    assert isinstance(layer.self_attn.o_b_proj, FP8Linear) and isinstance(layer.mlp.experts, MXFP4Experts)
    o_b = layer.self_attn.o_b_proj  # [hidden 64, K 64] cut to K 32: one 32-column block of scales
    assert o_b.weight.shape == (64, 32) and o_b.weight_scale_inv.shape == (4, 1)
    o_a = layer.self_attn.o_a_proj  # FP8 [2 groups x 32, 256] cut to this rank's group: two 16-row blocks
    assert isinstance(o_a, FP8GroupedLinear) and o_a.weight.shape == (32, 256) and o_a.weight_scale_inv.shape == (2, 8)
    experts = layer.mlp.experts
    if expert_parallel:
        assert experts.gate_up_proj.shape[0] == experts.n_experts == 4
    else:
        assert experts.down_proj.shape[2] == 16 and experts.down_proj_scale_inv.shape[2] == 1


def test_preset_ranks_generate_their_parts():
    """A quantized preset's random weights: each rank draws the full tensors and keeps its part."""
    preset = dict(quantization="fp8", overrides={"num_hidden_layers": 2, "o_lora_rank": 128, "head_dim": 128,
                                                 "moe_intermediate_size": 256, "n_routed_experts": 4})
    full = build("tiny", None, **preset)
    assert_rank_parts(full, [build("tiny", r, True, **preset) for r in range(2)])
    assert_rank_parts(full, [build("tiny", r, False, **preset) for r in range(2)])


def meta_quantized(name: str, overrides=None, fp8: bool = True):
    """The official layout on "meta" (`fp8` False: MXFP4 experts only)."""
    config = resolve_config(name, overrides, "fp8")
    with torch.device("meta"):
        net = DeepseekV4ForCausalLM(config)
    plan = official_plan(net, config)
    if not fp8:
        plan.fp8.clear()
    install(net, plan, config.quantization, config)
    return net


@pytest.mark.parametrize("field, value, words", [
    ("o_lora_rank", 64, r"model\.layers\.0\.self_attn\.o_b_proj would be cut at input columns 64\.\.127 of 128, "
                        r"which splits its FP8 scale blocks of 128"),
    ("moe_intermediate_size", 128, r"model\.layers\.0\.mlp\.shared_experts\.gate_proj would be cut at output rows "
                                   r"64\.\.127 of 128"),
])
def test_a_cut_inside_an_fp8_block_names_the_layer(field, value, words):
    net = meta_quantized("tiny", {"num_hidden_layers": 1, "o_lora_rank": 128, "moe_intermediate_size": 256,
                                  field: value})
    with pytest.raises(ValueError, match=words):
        shard_model(net, FakeGroup(1, 2))


def test_a_cut_inside_an_mxfp4_group_names_the_layer():
    net = meta_quantized("tiny", {"num_hidden_layers": 1, "moe_intermediate_size": 96}, fp8=False)
    with pytest.raises(ValueError, match=r"model\.layers\.0\.mlp\.experts would be cut at intermediate channels "
                                         r"48\.\.95 of 96, which splits its MXFP4 scale groups of 32"):
        shard_model(net, FakeGroup(1, 2))


@pytest.mark.parametrize("size", [2, 4, 8])
@pytest.mark.parametrize("name", ["deepseek-v4-flash", "deepseek-v4-pro"])
def test_flash_and_pro_cut_on_whole_blocks(name, size):
    """Every rank's cut of the official layout at full width (two layers: every layer is alike)."""
    net = meta_quantized(name, {"num_hidden_layers": 2})
    c = net.config
    specs = shard_model(net, FakeGroup(size - 1, size))
    attn, mlp = net.model.layers[1].self_attn, net.model.layers[1].mlp
    assert attn.q_b_proj.weight.shape == (c.num_attention_heads // size * c.head_dim, c.q_lora_rank)
    assert attn.o_b_proj.weight_scale_inv.shape == (c.hidden_size // 128, c.o_groups // size * c.o_lora_rank // 128)
    assert isinstance(attn.o_a_proj, FP8GroupedLinear) and attn.o_a_proj.weight_scale_inv.shape == (
        c.o_groups // size * c.o_lora_rank // 128, c.num_attention_heads * c.head_dim // c.o_groups // 128)
    assert mlp.shared_experts.down_proj.weight_scale_inv.shape == (c.hidden_size // 128,
                                                                  c.moe_intermediate_size // size // 128)
    assert mlp.experts.down_proj_scale_inv.shape == (c.n_routed_experts, c.hidden_size,
                                                     c.moe_intermediate_size // size // 32)
    assert specs["model.layers.1.mlp.experts.gate_up_proj"].full_shape[1] == 2 * c.moe_intermediate_size


@pytest.mark.parametrize("dim, keep", [(0, range(5, 13)), (0, range(9, 15)), (1, range(3, 11))])
def test_dequantized_part_reads_whole_blocks_around_a_cut_inside_one(tmp_path, dim, keep):
    """`o_a_proj` is dequantized at load: a rank's rows may start inside a scale block (blocks of 4
    here; 15 rows, the last block partial); the part equals the formula's W[n, k] = code * scale."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    codes, scale = quantize_fp8_blocks(torch.randn(15, 14), block=(4, 4))
    save_file({"w": codes, "s": scale}, str(tmp_path / "t.safetensors"))
    expected = codes.float() * scale.repeat_interleave(4, 0)[:15].repeat_interleave(4, 1)[:, :14]
    spec = ShardSpec(dim, tuple(keep), (15, 14))
    with safe_open(str(tmp_path / "t.safetensors"), framework="pt") as f:
        part = spec.read_dequantized(f.get_slice("w"), f.get_slice("s"), (4, 4), lambda s: s.float(), "cpu")
    assert torch.equal(part, expected.index_select(dim, torch.tensor(list(keep))))
