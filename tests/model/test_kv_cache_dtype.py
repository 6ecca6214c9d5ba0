"""kv_cache_dtype="auto": the cache holds the official model's rounded rows (fp8 e4m3 with ue8m0
scales per 64 and a bf16 rope tail for KV; Hadamard + fp4 e2m1 with ue8m0 per 32 for index keys).
Until the packed kernels land the rows are stored rounded in the model's dtype (fp32 here)."""

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
    return cache.view(layer).window.data[:w]  # slot 0's ring


def test_first_layer_rows_are_the_formula_applied_to_exact_rows(caches):
    exact, rounded = caches
    # Layer 0 sees identical inputs in both runs, so its KV rows differ only by the rounding.
    expected = apply_kv_format(_window_rows(exact, 0), "fp8_e8m0_b64_rope64", impl="torch")
    assert torch.equal(_window_rows(rounded, 0), expected)
    assert not torch.equal(_window_rows(exact, 0), expected)
    assert torch.equal(_window_rows(rounded, 0)[:, -64:], _window_rows(exact, 0)[:, -64:])  # rope tail kept


def test_every_stored_row_is_a_fixed_point_of_its_format(caches):
    exact, rounded = caches
    views = [(rounded.view(i), exact.view(i)) for i in range(len(rounded.plan))]
    assert any(v.index_keys is not None for v, _ in views) and any(v.compressed is not None for v, _ in views)
    for layer, (view, exact_view) in enumerate(views):
        if view.compressed is not None:
            used = view.compressed.data[: len(PROMPT) // view.plan.ratio]
            assert torch.equal(apply_kv_format(used, "fp8_e8m0_b64_rope64", impl="torch"), used), layer
        if view.index_keys is not None:
            used = view.index_keys.data[: len(PROMPT) // 4]
            assert used.abs().sum() > 0
            assert torch.equal(apply_kv_format(used, "fp4_e8m0_b32", impl="torch"), used), layer
            # In the exact cache the keys are neither rotated nor rounded.
            keys = exact_view.index_keys.data[: len(PROMPT) // 4]
            assert not torch.equal(apply_kv_format(hadamard(keys), "fp4_e8m0_b32", impl="torch"), keys)


def test_reference_is_the_deprecated_name_of_auto(caches):
    with pytest.warns(DeprecationWarning, match="kv_format"):
        llm = LLM("tiny", device="cpu", kv_format="reference", hf_overrides=GEOMETRY, progress=False)
    assert llm.engine.runner.cache_format.name == "auto"
    out = llm.generate(prompt_token_ids=[PROMPT], sampling_params=SamplingParams(temperature=0, max_tokens=1))
    assert torch.equal(_window_rows(llm.engine.cache, 3), _window_rows(caches[1], 3))


def test_the_cpu_default_is_bf16():
    llm = LLM("tiny", device="cpu", progress=False)
    assert llm.engine.runner.cache_format.name == "bf16"
    assert all(p.window_format.name == "bf16" and not p.packed for p in llm.engine.cache.plan)


def test_unknown_format_is_refused():
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp3'"):
        LLM("tiny", device="cpu", kv_cache_dtype="fp3", progress=False)
