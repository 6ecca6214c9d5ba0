"""DeepSeek-V4.1's cache on the layer plan: roles, shared pools by view, packed rows of its native
formats (bit-identical to the rounded-value pools) and the bytes each tier costs."""

import torch

from v41_golden import GoldenRunner
from v4serve.cache import CacheGeometry, PagedKVCache
from v4serve.cache.budget import tier_costs
from v4serve.formats import CACHE_FORMATS, row_format
from v4serve.layer_plan import CompressorKind, IndexerMode, layer_plans


def _cache(config, packed):
    geometry = CacheGeometry.from_config(config, CACHE_FORMATS["auto"], packed)
    return PagedKVCache(geometry, num_pages=16, max_seqs=2, max_step_tokens=128, max_pages_per_seq=8,
                        dtype=torch.bfloat16, device="cpu")


def test_plan_and_views():
    runner = GoldenRunner.config_only()
    plan = layer_plans(runner.config, CACHE_FORMATS["auto"])
    assert [p.indexer for p in plan] == [IndexerMode.NONE] * 2 + [
        IndexerMode.FULL, IndexerMode.REUSE, IndexerMode.FULL, IndexerMode.REUSE, IndexerMode.REINDEX,
        IndexerMode.REUSE]
    assert [p.compressor for p in plan][2:5] == [CompressorKind.PLAIN, CompressorKind.NONE, CompressorKind.GATELESS]
    assert [p.kv_source for p in plan] == [0, 1, 2, 2, 4, 4, 4, 4]
    assert not any(p.q_head_rms or p.index_rotated for p in plan)
    assert [p.publishes_candidates for p in plan].index(True) == 4 and plan[6].candidate_restricted
    assert plan[2].window_format.name == "fp8_e8m0_b32" and plan[2].compressed_format.name == "fp4_e4m3_b16"
    assert plan[2].index_format.name == "fp4_e8m0_b32"
    cache = _cache(runner.config, True)
    for layer, src in ((3, 2), (5, 4), (6, 4), (7, 4)):  # non-sources read their source's pools
        assert cache.view(layer).compressed is cache.view(src).compressed
        assert cache.view(layer).index_keys is cache.view(src).index_keys
        assert cache.view(layer).window is not cache.view(src).window  # every layer keeps its own window
    assert cache.view(0).compressed is None and cache.view(3).compressor_state is None


def test_packed_bytes_per_token_follow_the_formats():
    config = GoldenRunner.config_only().config
    per_token, per_seq, *_ = tier_costs(CacheGeometry.from_config(config, CACHE_FORMATS["auto"]), torch.bfloat16)
    main, index, window = (row_format(n).row_bytes(d) for n, d in
                           (("fp4_e4m3_b16", 128), ("fp4_e8m0_b32", 64), ("fp8_e8m0_b32", 128)))
    assert (main, index, window) == (80, 36, 144)  # 64 codes + 8 scales -> 16; 32 + 2 -> 4; 128 + 4 -> 16
    # sources: layer 2 (ratio 2) and layer 4 (ratio 1); every layer has a window ring of 16 rows
    assert per_token == {"compressed rows": main / 2 + main, "index keys": index / 2 + index}
    assert per_seq["window ring"] == 8 * 16 * window


def test_packed_pools_give_the_same_logits_as_rounded_rows():
    runner = GoldenRunner()
    g = runner.golden
    ids, decode = g["input_ids"].tolist(), g["decode.tokens_in"].tolist()[:4]
    out = []
    for packed in (False, True):
        cache = _cache(runner.config, packed)
        slot = cache.open_sequence()
        prefill = runner.prefill(cache, slot, ids, chunks=[31, 46])
        out.append((prefill, runner.decode(cache, slot, decode, len(ids))))
    assert out[1][0].dtype == torch.float32
    assert torch.equal(out[0][0], out[1][0]) and torch.equal(out[0][1], out[1][1])
