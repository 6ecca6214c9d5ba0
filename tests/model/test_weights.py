"""Checkpoint loading: both naming schemes, sharded files, and one error listing every problem."""

from __future__ import annotations

import json
import re
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from oracle import random_prompt, save_hf_checkpoint
from v4serve import LLM, SamplingParams
from v4serve.model.weights import WeightsError, compact_names

# transformers writes official per-layer names under `model.`, but keeps its own names for the
# top-level tensors and spells the attention kv norm `attn.norm`; this finishes the job by hand.
_TOP_LEVEL_TO_OFFICIAL = {
    "model.embed_tokens.weight": "embed.weight",
    "head.weight": "head.weight",
    "model.norm.weight": "norm.weight",
    "model.hc_head.hc_fn": "hc_head_fn",
    "model.hc_head.hc_base": "hc_head_base",
    "model.hc_head.hc_scale": "hc_head_scale",
}


def _read(path) -> dict[str, torch.Tensor]:
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}


def _write(path, tensors, config_from, shards: int = 1):
    path.mkdir()
    shutil.copy(config_from / "config.json", path / "config.json")
    names = sorted(tensors)
    if shards == 1:
        save_file(tensors, str(path / "model.safetensors"))
        return path
    weight_map = {}
    for i in range(shards):
        part = names[i::shards]
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file({k: tensors[k] for k in part}, str(path / file))
        weight_map.update({k: file for k in part})
    (path / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return path


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("naming")
    saved = root / "saved_by_transformers"
    hf_model = save_hf_checkpoint("a", saved)
    official = {}
    for name, t in _read(saved).items():
        name = _TOP_LEVEL_TO_OFFICIAL.get(name, name.removeprefix("model."))
        official[name.replace(".attn.norm.", ".attn.kv_norm.")] = t
    state_dict = {k: v.contiguous() for k, v in hf_model.state_dict().items()}
    return {
        "saved": saved,
        "official": _write(root / "official", official, saved, shards=3),
        "transformers": _write(root / "transformers_names", state_dict, saved),
    }


def _greedy(path, prompt):
    llm = LLM(str(path), device="cpu", dtype="float32", progress=False)
    params = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, logprobs=0)
    out = llm.generate(prompt_token_ids=[prompt], sampling_params=params)[0].outputs[0]
    return out.token_ids, [next(iter(lp.values())).logprob for lp in out.logprobs]


def test_official_and_transformers_names_give_identical_tokens(checkpoints):
    assert any(k.startswith("layers.0.ffn.experts.0.w1") for k in _read_keys(checkpoints["official"]))
    prompt = random_prompt(90, seed=5)
    results = {name: _greedy(path, prompt) for name, path in checkpoints.items()}
    assert results["official"] == results["transformers"] == results["saved"]


def _read_keys(path):
    keys = []
    for file in path.glob("*.safetensors"):
        with safe_open(str(file), framework="pt") as f:
            keys.extend(f.keys())
    return keys


def test_every_problem_is_reported_together(checkpoints, tmp_path):
    tensors = _read(checkpoints["saved"])
    tensors["model.layers.1.attn.wq_a.weight"] = tensors["model.layers.1.attn.wq_a.weight"][:, :-1].contiguous()
    del tensors["model.layers.2.attn.attn_sink"]
    tensors["model.layers.0.attn.not_a_weight"] = torch.zeros(3)
    broken = _write(tmp_path / "broken", tensors, checkpoints["saved"])
    with pytest.raises(WeightsError) as err:
        LLM(str(broken), device="cpu", dtype="float32", progress=False)
    message = str(err.value)
    assert "model.layers.2.self_attn.sinks" in message and "missing" in message
    assert "model.layers.0.attn.not_a_weight" in message and "unexpected" in message
    assert "model.layers.1.attn.wq_a.weight" in message and "wrong shape" in message


def test_an_error_names_every_tensor_compactly(checkpoints, tmp_path):
    tensors = _read(checkpoints["saved"])
    for layer in range(4):
        del tensors[f"model.layers.{layer}.attn.wq_a.weight"]
    for layer in range(30):  # more than a cut-off list would show
        tensors[f"model.layers.{layer}.attn.not_a_weight"] = torch.zeros(3)
    broken = _write(tmp_path / "broken", tensors, checkpoints["saved"])
    with pytest.raises(WeightsError) as err:
        LLM(str(broken), device="cpu", dtype="float32", progress=False)
    assert str(err.value).splitlines()[1:] == [
        "  missing tensors (4):",
        "    model.layers.{0-3}.self_attn.q_a_proj.weight",
        "  unexpected tensors (30):",
        "    model.layers.{0-29}.attn.not_a_weight",
    ]


def test_compact_names_merges_layer_and_expert_indices_exactly():
    q_a = [f"model.layers.{layer}.self_attn.q_a_proj.weight" for layer in (5, 0, 1, 2, 3)]
    assert compact_names([*q_a, "model.norm.weight"]) == [
        "model.layers.{0-3,5}.self_attn.q_a_proj.weight", "model.norm.weight"]
    assert compact_names(["layers.7.attn.wq_a.weight"]) == ["layers.7.attn.wq_a.weight"]
    experts = [f"layers.{layer}.ffn.experts.{e}.w1.weight" for layer in range(3) for e in range(256)]
    assert compact_names([*experts, "layers.3.ffn.experts.7.w1.weight"]) == [
        "layers.{0-2}.ffn.experts.{0-255}.w1.weight", "layers.3.ffn.experts.7.w1.weight"]
    # Layer 1 lacks expert 0: merging it with layers 0 and 2 would name a tensor that is not listed.
    uneven = [f"layers.{layer}.ffn.experts.{e}.w1.weight" for layer, e in ((0, 0), (0, 1), (1, 1), (2, 0), (2, 1))]
    assert compact_names(uneven) == ["layers.{0,2}.ffn.experts.{0-1}.w1.weight", "layers.1.ffn.experts.1.w1.weight"]
    shapes = [f"layers.{layer}.attn.wq_a.weight: checkpoint (64, {n}), model (64, 32)"
              for layer, n in enumerate((31, 31, 30))]
    assert compact_names(shapes) == ["layers.{0-1}.attn.wq_a.weight: checkpoint (64, 31), model (64, 32)",
                                     "layers.2.attn.wq_a.weight: checkpoint (64, 30), model (64, 32)"]


def _fp4(t: torch.Tensor) -> torch.Tensor:
    """Two e2m1 values per byte, as the official checkpoint packs its experts."""
    return torch.zeros(t.shape[0], t.shape[1] // 2, dtype=torch.uint8).view(torch.float4_e2m1fn_x2)


@pytest.mark.parametrize(
    "name, quantize",
    [
        ("model.layers.0.attn.wq_a.weight", lambda t: t.to(torch.float8_e4m3fn)),
        ("model.layers.1.ffn.experts.0.w1.weight", _fp4),
    ],
)
def test_quantized_tensors_without_their_scale_are_named(checkpoints, tmp_path, name, quantize):
    """FP8 and packed FP4 tensors load as quantized modules (tests/model/test_quantized_*.py); one
    without its scale is named (config.json of this checkpoint has no quantization_config, so the
    FP8 block size comes from `quantization="fp8"`)."""
    tensors = _read(checkpoints["saved"])
    tensors[name] = quantize(tensors[name])
    quantized = _write(tmp_path / "quantized", tensors, checkpoints["saved"])
    with pytest.raises(WeightsError, match=f"(?s)missing scales.*{re.escape(name)}"):
        LLM(str(quantized), device="cpu", dtype="float32", quantization="fp8", progress=False)
    if "wq_a" in name:
        with pytest.raises(WeightsError, match="no `quantization_config`"):
            LLM(str(quantized), device="cpu", dtype="float32", progress=False)


def test_the_checkpoint_tokenizer_wins_over_the_bundled_one(checkpoints, tmp_path):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    folder = shutil.copytree(checkpoints["saved"], tmp_path / "with_tokenizer")
    words = Tokenizer(WordLevel({f"w{i}": i for i in range(512)}, unk_token="w0"))
    words.pre_tokenizer = WhitespaceSplit()
    words.save(str(folder / "tokenizer.json"))
    llm = LLM(str(folder), device="cpu", dtype="float32", progress=False)
    assert llm.tokenizer.file == folder / "tokenizer.json"
    out = llm.generate(["w5 w7 w9"], SamplingParams(temperature=0.0, max_tokens=4, ignore_eos=True))[0]
    assert out.prompt_token_ids == [5, 7, 9]
    assert out.outputs[0].text == " ".join(f"w{i}" for i in out.outputs[0].token_ids)
