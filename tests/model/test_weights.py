"""Checkpoint loading: both naming schemes, sharded files, and one error listing every problem."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from oracle import random_prompt, save_hf_checkpoint
from v4serve import LLM, SamplingParams
from v4serve.model.weights import WeightsError

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


def test_quantized_tensors_are_refused_clearly(checkpoints, tmp_path):
    tensors = _read(checkpoints["saved"])
    tensors["model.layers.0.attn.wq_a.weight"] = tensors["model.layers.0.attn.wq_a.weight"].to(torch.float8_e4m3fn)
    fp8 = _write(tmp_path / "fp8", tensors, checkpoints["saved"])
    with pytest.raises(WeightsError, match="not supported yet.*layers.0.attn.wq_a.weight"):
        LLM(str(fp8), device="cpu", dtype="float32", progress=False)
