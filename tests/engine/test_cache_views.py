"""Per-layer cache views: each layer's view holds its own pools and states; a layer whose plan
reads another layer's pools (V4.1's Reindex / Reuse layers) gets that layer's Pool objects and
allocates none of its own."""

from __future__ import annotations

import dataclasses

import torch

from v4serve.cache import CacheGeometry, PagedKVCache
from v4serve.cache.budget import budget_for_pages
from v4serve.formats import CACHE_FORMATS
from v4serve.layer_plan import ModelPlan, layer_plans
from v4serve.presets import preset_config

CONFIG = preset_config("tiny")  # sliding, CSA 4, HCA 16, CSA 4


def _cache(plan: ModelPlan) -> tuple[PagedKVCache, int]:
    geometry = CacheGeometry.from_plan(plan, CONFIG.page_size)
    budget = budget_for_pages(geometry, torch.float32, 16, 2, 8, 64)
    return PagedKVCache(geometry, 16, 2, 64, 8, torch.float32, "cpu"), budget.total_bytes


def test_each_layer_sees_its_own_pools():
    cache, _ = _cache(layer_plans(CONFIG))
    views = [cache.view(i) for i in range(4)]
    assert views[0].compressed is None and views[0].index_keys is None and views[0].compressor_state is None
    assert views[2].compressed is not None and views[2].index_keys is None  # HCA: no indexer
    assert views[1].index_keys is not None and views[1].indexer_state is not None
    ptrs = [v.window.data.data_ptr() for v in views]
    assert len(set(ptrs)) == 4
    assert views[1].compressed.data.data_ptr() != views[3].compressed.data.data_ptr()
    for i, v in enumerate(views):
        assert v.plan.layer == i


def test_a_layer_reading_a_source_layer_gets_its_pools_and_owns_none():
    base = layer_plans(CONFIG)
    reuse = dataclasses.replace(base[3], kv_source=1)
    plan = ModelPlan(base.cache_format, (*base.layers[:3], reuse))
    cache, total = _cache(plan)
    own, own_total = _cache(base)
    assert cache.view(3).compressed is cache.view(1).compressed
    assert cache.view(3).index_keys is cache.view(1).index_keys
    assert cache.view(3).compressor_state is None and cache.view(3).indexer_state is None
    assert cache.view(3).window is not cache.view(1).window  # the window stays the layer's own
    assert cache.nbytes == total < own.nbytes == own_total


def test_plan_formats_reach_the_views():
    cache, _ = _cache(layer_plans(preset_config("tiny", {"head_dim": 192, "qk_rope_head_dim": 64,
                                                          "index_head_dim": 128}), CACHE_FORMATS["auto"]))
    view = cache.view(1)
    assert view.window.row_format.name == view.compressed.row_format.name == "fp8_e8m0_b64_rope64"
    assert view.index_keys.row_format.name == "fp4_e8m0_b32" and view.plan.index_rotated
    assert view.window.read_format is view.window.row_format  # packed: the kernels decode it
