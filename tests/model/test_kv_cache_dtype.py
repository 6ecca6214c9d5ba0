"""kv_cache_dtype="auto": the cache holds the official model's rounded rows (fp8 e4m3 with ue8m0
scales per 64 and a bf16 rope tail for KV; Hadamard + fp4 e2m1 with ue8m0 per 32 for index keys).
The pools hold the formats' packed bytes (uint8); `Pool.values` decodes them."""

from __future__ import annotations

import pytest
import torch

from v4serve import LLM, SamplingParams
from v4serve.ops.kv_quant import apply_kv_format, hadamard

# The fp8 format quantizes head_dim - 64 channels in blocks of 64: give the tiny model room for it.
GEOMETRY = {"head_dim": 192, "qk_rope_head_dim": 64, "index_head_dim": 64}
PROMPT = list(range(2, 150))


def _run(kv_cache_dtype: str):
    llm = LLM("tiny", device="cpu", kv_cache_dtype=kv_cache_dtype, hf_overrides=GEOMETRY, progress=False)
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(temperature=0, max_tokens=1))
    return llm.engine.cache, out[0]


@pytest.fixture(scope="module")
def caches():
    return _run("bf16")[0], _run("auto")[0]


def _window_rows(cache, layer):
    w = cache.page_size
    return cache.view(layer).window.values(slice(0, w))  # slot 0's ring


def test_auto_stores_packed_bytes(caches):
    exact, rounded = caches
    for layer in range(len(rounded.plan)):
        view = rounded.view(layer)
        for pool in (view.window, view.compressed, view.index_keys):
            if pool is not None:
                assert pool.packed and pool.data.dtype == torch.uint8
                assert pool.data.shape[1] == pool.row_format.row_bytes(pool.dim)
    assert rounded.nbytes < exact.nbytes / 2


def test_first_layer_rows_are_the_formula_applied_to_exact_rows(caches):
    exact, rounded = caches
    # Layer 0 sees identical inputs in both runs, so its KV rows differ only by the rounding.
    # The rope tail is stored in bf16 (the model's dtype on the GPU; this fp32 model's tail rounds).
    exact_rows = _window_rows(exact, 0)
    expected = apply_kv_format(exact_rows, "fp8_e8m0_b64_rope64", impl="torch")
    expected[:, -64:] = exact_rows[:, -64:].bfloat16().float()
    assert torch.equal(_window_rows(rounded, 0), expected)
    assert not torch.equal(exact_rows[:, :-64], expected[:, :-64])


def test_every_stored_row_is_a_fixed_point_of_its_format(caches):
    exact, rounded = caches
    views = [(rounded.view(i), exact.view(i)) for i in range(len(rounded.plan))]
    assert any(v.index_keys is not None for v, _ in views) and any(v.compressed is not None for v, _ in views)
    for layer, (view, exact_view) in enumerate(views):
        if view.compressed is not None:
            used = view.compressed.values(slice(0, len(PROMPT) // view.plan.ratio))
            assert torch.equal(apply_kv_format(used, "fp8_e8m0_b64_rope64", impl="torch"), used), layer
        if view.index_keys is not None:
            used = view.index_keys.values(slice(0, len(PROMPT) // 4))
            assert used.abs().sum() > 0
            assert torch.equal(apply_kv_format(used, "fp4_e8m0_b32", impl="torch"), used), layer
            # In the exact cache the keys are neither rotated nor rounded.
            keys = exact_view.index_keys.values(slice(0, len(PROMPT) // 4))
            assert not torch.equal(apply_kv_format(hadamard(keys), "fp4_e8m0_b32", impl="torch"), keys)


def test_reference_is_the_deprecated_name_of_auto(caches):
    with pytest.warns(DeprecationWarning, match="kv_format"):
        llm = LLM("tiny", device="cpu", kv_format="reference", hf_overrides=GEOMETRY, progress=False)
    assert llm.engine.runner.cache_format.name == "auto"
    llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(temperature=0, max_tokens=1))
    assert torch.equal(_window_rows(llm.engine.cache, 3), _window_rows(caches[1], 3))


def test_the_cpu_default_is_bf16():
    llm = LLM("tiny", device="cpu", progress=False)
    assert llm.engine.runner.cache_format.name == "bf16"
    assert all(p.window_format.name == "bf16" and not p.packed for p in llm.engine.cache.plan)


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp3'"):
        LLM("tiny", device="cpu", kv_cache_dtype="fp3", progress=False)


def _bf16_logprobs(monkeypatch, packed: bool):
    """Prompt and decode logprobs of a bf16 model with kv_cache_dtype="auto", its pools packed or
    (the previous storage) rows rounded through the formats and kept in bf16."""
    import v4serve.engine.model_runner as runner
    from v4serve.layer_plan import layer_plans

    monkeypatch.setattr(runner, "layer_plans", lambda config, cache: layer_plans(config, cache, packed=packed))
    llm = LLM("tiny", device="cpu", dtype="bfloat16", kv_cache_dtype="auto", hf_overrides=GEOMETRY,
              max_num_batched_tokens=64, progress=False)
    assert all(p.packed == packed for p in llm.engine.cache.plan)
    params = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, prompt_logprobs=2, logprobs=2)
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=params)[0]
    rows = [sorted((t, lp.logprob) for t, lp in pos.items()) for pos in out.prompt_logprobs[1:]]
    return out.outputs[0].token_ids, rows + [sorted((t, lp.logprob) for t, lp in pos.items())
                                            for pos in out.outputs[0].logprobs]


def test_packed_storage_has_the_numerics_of_rounded_rows(monkeypatch):
    """Same numerics, new storage: in bf16 the packed cache gives exactly the logprobs of the cache
    that keeps each row's rounded values (chunked prefill, then decode steps)."""
    rounded = _bf16_logprobs(monkeypatch, packed=False)
    packed = _bf16_logprobs(monkeypatch, packed=True)
    assert packed == rounded
