"""Quantized checkpoints: transformers' FP8 naming, and bad checkpoints (truncated shard, wrong
scale shape, a missing scale, an FP8 tensor under an unknown name, an unknown dtype) each refused
with one error naming the tensor, before anything is allocated."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import save_file

from oracle import random_prompt
from quantized_writer import make_quantized_oracle
from v4serve import LLM, SamplingParams
from v4serve.model.loader import build_model
from v4serve.model.weights import WeightsError


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("quantized")
    make_quantized_oracle(root / "official", "official")
    make_quantized_oracle(root / "transformers", "transformers", shards=2)
    return root


def _greedy(path, **kwargs):
    llm = LLM(str(path), device="cpu", dtype="float32", progress=False, **kwargs)
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, logprobs=0)
    out = llm.generate(prompt_token_ids=[random_prompt(80, seed=3)], sampling_params=params)[0].outputs[0]
    return out.token_ids, [next(iter(lp.values())).logprob for lp in out.logprobs]


def test_transformers_named_fp8_checkpoint_equals_the_official_one(checkpoints):
    """Same codes and scales under the other naming (fp32 `weight_scale_inv`, fused packed experts
    with `gate_up_proj_scale_inv`): the same tokens and logprobs to the bit."""
    assert _greedy(checkpoints / "official") == _greedy(checkpoints / "transformers")


def _copy(checkpoints, tmp_path, name="broken"):
    dst = tmp_path / name
    shutil.copytree(checkpoints / "official", dst)
    return dst


def _shard_of(path, key):
    return path / json.loads((path / "model.safetensors.index.json").read_text())["weight_map"][key]


def _rewrite(path, key, value=None, rename=None):
    """Change (or rename) one tensor of its shard, keeping the index file right."""
    shard = _shard_of(path, key)
    with safe_open(str(shard), framework="pt") as f:
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if value is not None:
        tensors[key] = value
    if rename is not None:
        tensors[rename] = tensors.pop(key)
        index = json.loads((path / "model.safetensors.index.json").read_text())
        index["weight_map"][rename] = index["weight_map"].pop(key)
        (path / "model.safetensors.index.json").write_text(json.dumps(index))
    save_file(tensors, str(shard))


def _error(path) -> str:
    with pytest.raises(WeightsError) as err:
        LLM(str(path), device="cpu", dtype="float32", progress=False)
    return str(err.value)


def test_truncated_shard_names_its_tensors(checkpoints, tmp_path):
    path = _copy(checkpoints, tmp_path)
    shard = _shard_of(path, "layers.1.attn.wq_b.weight")
    data = shard.read_bytes()
    header = 8 + int.from_bytes(data[:8], "little")
    offsets = json.loads(data[8:header])
    last = max((k for k in offsets if k != "__metadata__"), key=lambda k: offsets[k]["data_offsets"][1])
    shard.write_bytes(data[:-10])  # the last tensor of the shard loses its end
    message = _error(path)
    assert "truncated tensors (the shard ends before their data) (1)" in message and last in message and shard.name in message


def test_wrong_scale_shape_is_named_with_the_ceil_shape(checkpoints, tmp_path):
    path = _copy(checkpoints, tmp_path)
    # q_a_proj [40, 64] in (16, 32) blocks has ceil(40/16) x 2 = 3 x 2 scales; floor would be 2 x 2.
    _rewrite(path, "layers.2.attn.wq_a.scale", torch.full((2, 2), 127, dtype=torch.uint8).view(torch.float8_e8m0fnu))
    message = _error(path)
    assert "scales with the wrong shape (1)" in message
    assert "layers.2.attn.wq_a.scale: checkpoint (2, 2), expected (3, 2) for layers.2.attn.wq_a.weight (40, 64)" in message


def test_missing_scales_are_named(checkpoints, tmp_path):
    path = _copy(checkpoints, tmp_path)
    for key in ("layers.0.attn.wkv.scale", "layers.3.ffn.experts.5.w2.scale"):
        shard = _shard_of(path, key)
        with safe_open(str(shard), framework="pt") as f:
            tensors = {k: f.get_tensor(k) for k in f.keys() if k != key}
        save_file(tensors, str(shard))
    message = _error(path)
    assert "missing scales (a quantized weight without its scale) (2)" in message
    assert "layers.0.attn.wkv.weight" in message and "layers.3.ffn.experts.5.w2.weight" in message


def test_fp8_tensor_under_an_unknown_name(checkpoints, tmp_path):
    path = _copy(checkpoints, tmp_path)
    _rewrite(path, "layers.1.attn.wq_b.weight", rename="layers.1.attn.wq_c.weight")
    message = _error(path)
    assert "FP8 tensors under names v4serve does not know (1)" in message and "layers.1.attn.wq_c.weight" in message
    # its scale now belongs to nothing, and wq_b is missing: all in the same error
    assert "layers.1.attn.wq_b.scale" in message and "model.layers.1.self_attn.q_b_proj.weight" in message


def test_unknown_dtype_and_fp8_where_the_model_keeps_float(checkpoints, tmp_path):
    path = _copy(checkpoints, tmp_path)
    _rewrite(path, "layers.0.attn.wq_a.weight", torch.zeros(40, 64, dtype=torch.float8_e5m2))
    _rewrite(path, "layers.0.attn.compressor.wkv.weight", torch.zeros(256, 64, dtype=torch.float8_e4m3fn))
    message = _error(path)
    assert "tensors of an unknown dtype (1):\n    layers.0.attn.wq_a.weight (F8_E5M2)" in message
    assert "FP8 tensors for parameters v4serve keeps in high precision (1):\n    layers.0.attn.compressor.wkv.weight" \
        in message


@pytest.mark.parametrize("cpu_offload_gb", [0, 1e-4])
def test_a_failure_while_copying_leaves_nothing_allocated(checkpoints, monkeypatch, cpu_offload_gb):
    """Headers pass, then a read fails half-way: the error propagates and every parameter of the
    model is back on "meta" (on CUDA the allocator cache is emptied too)."""
    import v4serve.model.loader as loader

    built, real_copy, real_model = {}, loader.copy_weights, loader.DeepseekV4ForCausalLM

    def failing_copy(scan, write, device, progress=True):
        done = []

        def write_half(target, value):
            if len(done) > len(scan.jobs) // 2:
                raise OSError("read error half-way")
            done.append(target)
            write(target, value)

        real_copy(scan, write_half, device, progress)

    def keep(config):
        built["model"] = real_model(config)
        return built["model"]

    monkeypatch.setattr(loader, "copy_weights", failing_copy)
    monkeypatch.setattr(loader, "DeepseekV4ForCausalLM", keep)
    with pytest.raises(OSError, match="half-way"):
        build_model(str(checkpoints / "official"), "cpu", torch.float32, progress=False, cpu_offload_gb=cpu_offload_gb)
    tensors = list(built["model"].parameters()) + list(built["model"].buffers())
    assert tensors and all(t.device.type == "meta" for t in tensors)
    assert all(getattr(m, "offload", None) is None for m in built["model"].modules())  # slots and host rows dropped


def test_save_pretrained_of_a_quantized_model_loads_back(tmp_path):
    """Our own names (e4m3 `weight` + fp32 `weight_scale_inv`, packed experts + U8 `*_scale_inv`)."""
    from v4serve.model.loader import save_pretrained

    params = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True, logprobs=0)
    llm = LLM("tiny", device="cpu", quantization="fp8", progress=False)
    save_pretrained(llm.engine.model, llm.engine.config, tmp_path / "saved")
    again = LLM(str(tmp_path / "saved"), device="cpu", progress=False)
    outs = [x.generate(prompt_token_ids=[[0, 4, 5, 6]], sampling_params=params)[0].outputs[0] for x in (llm, again)]
    assert outs[0].token_ids == outs[1].token_ids
    assert [lp for lp in outs[0].logprobs] == [lp for lp in outs[1].logprobs]
