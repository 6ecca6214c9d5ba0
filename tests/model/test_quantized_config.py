"""`quantization_config` / `expert_dtype` parsing, the `quantization` override, quantized presets,
and the official activation quantization as an explicit option only."""

from __future__ import annotations

import argparse

import pytest
import torch
from torch import nn

from v4serve import LLM, SamplingParams
from v4serve.config import ConfigError, ModelConfig, QuantConfig, apply_quantization_override
from v4serve.engine.offload import parse_cpu_offload_gb
from v4serve.model.loader import build_model
from v4serve.model.quantized import FP8Linear, MXFP4Experts
from v4serve.presets import preset_config

OFFICIAL = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0", "weight_block_size": [128, 128],
            "activation_scheme": "dynamic"}


def _raw(**fields):
    return {**preset_config("tiny").to_hf_dict(), **fields}


def test_official_and_transformers_spellings():
    official = ModelConfig.from_dict(_raw(quantization_config=OFFICIAL, expert_dtype="fp4")).quantization
    assert official == QuantConfig(scale_fmt="ue8m0", weight_block_size=(128, 128), expert_dtype="fp4")
    # transformers moves expert_dtype into quantization_config; V4.1 has 32x32 blocks
    hf = ModelConfig.from_dict(_raw(quantization_config={**OFFICIAL, "weight_block_size": [32, 32],
                                                         "expert_dtype": "fp4"})).quantization
    assert hf.weight_block_size == (32, 32) and hf.expert_dtype == "fp4"
    # fp32 block scales (V4-Flash-Base): no scale_fmt
    fp32 = {k: v for k, v in OFFICIAL.items() if k != "scale_fmt"}
    assert ModelConfig.from_dict(_raw(quantization_config=fp32)).quantization.scale_fmt is None
    assert ModelConfig.from_dict(_raw()).quantization is None
    config = ModelConfig.from_dict(_raw(quantization_config=OFFICIAL, expert_dtype="fp4"))
    assert "quantization_config" not in config.extra
    assert ModelConfig.from_dict(config.to_hf_dict()).quantization == config.quantization


@pytest.mark.parametrize("fields, named", [
    (dict(quantization_config={**OFFICIAL, "quant_method": "awq"}), "quantization_config.quant_method"),
    (dict(quantization_config={**OFFICIAL, "fmt": "e5m2"}), "quantization_config.fmt"),
    (dict(quantization_config={**OFFICIAL, "scale_fmt": "e4m3"}), "quantization_config.scale_fmt"),
    (dict(quantization_config={**OFFICIAL, "weight_block_size": [128]}), "quantization_config.weight_block_size"),
    (dict(quantization_config={**OFFICIAL, "weight_block_size": [128, 0]}), "weight_block_size[1]"),
    (dict(quantization_config=OFFICIAL, expert_dtype="int4"), "expert_dtype"),
    (dict(expert_dtype="fp4"), "expert_dtype"),
])
def test_bad_quantization_fields_are_named(fields, named):
    with pytest.raises(ConfigError, match=named.replace("[", r"\[").replace("]", r"\]")):
        ModelConfig.from_dict(_raw(**fields))


def test_the_override_only_overrides():
    tiny = preset_config("tiny")
    assert apply_quantization_override(tiny, None) is tiny
    assert apply_quantization_override(tiny, "fp8").quantization == QuantConfig.official()
    assert apply_quantization_override(tiny, "fp8-reference").quantization.act_block == 128
    flash = preset_config("deepseek-v4-flash")
    assert flash.quantization == QuantConfig.official()  # the presets are in the official formats
    assert apply_quantization_override(flash, "none").quantization is None
    with pytest.raises(ConfigError, match="quantization 'int8'"):
        apply_quantization_override(tiny, "int8")
    assert parse_cpu_offload_gb("auto") == "auto" and parse_cpu_offload_gb("12.5") == 12.5
    with pytest.raises(argparse.ArgumentTypeError, match="cpu-offload-gb"):
        parse_cpu_offload_gb("-1")


def test_tiny_is_bf16_unless_asked_and_fp8_presets_get_random_official_formats():
    plain, _ = build_model("tiny", "cpu", torch.float32, progress=False)
    assert not any(isinstance(m, (FP8Linear, MXFP4Experts)) for m in plain.modules())
    net, _ = build_model("tiny", "cpu", torch.float32, progress=False, quantization="fp8")
    fp8 = [m for m in net.modules() if isinstance(m, FP8Linear)]
    experts = [m for m in net.modules() if isinstance(m, MXFP4Experts)]
    assert len(fp8) == 4 * 7 + 2 and len(experts) == 4
    for m in fp8:
        s = m.weight_scale_inv
        assert m.weight.dtype == torch.float8_e4m3fn and torch.equal(torch.exp2(torch.log2(s).round()), s)
    assert isinstance(net.model.layers[0].self_attn.o_a_proj, nn.Linear)  # kept in the model dtype
    codes = experts[0].gate_up_proj
    assert codes.dtype == torch.uint8 and len(codes.unique()) > 200  # random packed pairs


def test_activation_quantization_only_when_asked():
    params = SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True, logprobs=0)
    runs = {}
    for q in ("fp8", "fp8-reference"):
        llm = LLM("tiny", device="cpu", quantization=q, progress=False)
        blocks = {m.act_block for m in llm.engine.model.modules() if isinstance(m, FP8Linear)}
        assert blocks == ({None} if q == "fp8" else {128})
        out = llm.generate(prompt_token_ids=[[0, 5, 6, 7, 8]], sampling_params=params)[0].outputs[0]
        runs[q] = [next(iter(lp.values())).logprob for lp in out.logprobs]
    assert runs["fp8"] != runs["fp8-reference"]  # the activation rounding shows in the logprobs
