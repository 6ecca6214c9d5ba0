"""The layer plan of every preset and every parity config, against the layer types and compress
rates as each config file states them (not as v4serve/config/ parses them), for both cache dtypes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from oracle import CSA, HCA, ORACLE_CONFIGS, SWA, save_hf_checkpoint
from v4serve.config import ModelConfig
from v4serve.formats import CACHE_FORMATS
from v4serve.layer_plan import CompressorKind, IndexerMode, layer_plans
from v4serve.presets import PRESETS, preset_config

# The official config.json lists; their last entry is the MTP layer's (not a decoder layer).
FLASH_RATIOS = ([0, 0] + [4, 128] * 20 + [4, 0])[:-1]
PRO_RATIOS = ([128, 128] + [4, 128] * 29 + [4, 0])[:-1]
STATED = {
    "tiny": [SWA, CSA, HCA, CSA],
    "deepseek-v4-flash": [{0: SWA, 4: CSA, 128: HCA}[r] for r in FLASH_RATIOS],
    "deepseek-v4-pro": [{0: SWA, 4: CSA, 128: HCA}[r] for r in PRO_RATIOS],
}


def _check(config: ModelConfig, kinds: list[str], rates: dict[str, int]) -> None:
    assert len(kinds) == config.num_hidden_layers
    for dtype in ("bf16", "auto"):
        if dtype == "auto" and config.head_dim < 64:  # the fp8 rows keep 64 rope channels in bf16
            with pytest.raises(ValueError, match="head_dim"):
                layer_plans(config, CACHE_FORMATS[dtype], packed=True)
            continue
        plan = layer_plans(config, CACHE_FORMATS[dtype], packed=dtype == "auto")
        assert len(plan) == len(kinds)
        for i, (p, kind) in enumerate(zip(plan, kinds)):
            assert p.layer == i and p.kv_source == i and p.owns_pools
            assert p.ratio == (0 if kind == SWA else rates[kind])
            assert p.compressor is {SWA: CompressorKind.NONE, CSA: CompressorKind.OVERLAPPING,
                                    HCA: CompressorKind.PLAIN}[kind]
            assert p.indexer is (IndexerMode.OWN if kind == CSA else IndexerMode.NONE)
            kv = "bf16" if dtype == "bf16" else "fp8_e8m0_b64_rope64"
            assert p.window_format.name == kv
            assert (p.compressed_format and p.compressed_format.name) == (None if kind == SWA else kv)
            index = "bf16" if dtype == "bf16" else "fp4_e8m0_b32"
            assert (p.index_format and p.index_format.name) == (index if kind == CSA else None)
            assert p.index_rotated == (kind == CSA and dtype == "auto")
            assert p.packed == (dtype == "auto")
        assert plan.ratios == tuple(sorted({rates[k] for k in kinds if k != SWA}))


def test_every_v4_preset_is_stated():
    assert set(PRESETS) == set(STATED) | {"deepseek-v4.1-flash"}  # V4.1's roles: tests/model/test_v41_preset.py


@pytest.mark.parametrize("name", sorted(STATED))
def test_preset_plans(name):
    raw = PRESETS[name]
    rates = {CSA: 4, HCA: 128, **raw.get("compress_rates", {})}
    _check(preset_config(name), STATED[name], rates)


@pytest.mark.parametrize("name", sorted(ORACLE_CONFIGS))
def test_parity_config_plans(name, tmp_path):
    spec = ORACLE_CONFIGS[name]
    save_hf_checkpoint(name, tmp_path)
    _check(ModelConfig.from_pretrained(tmp_path), spec["layer_types"], spec["compress_rates"])


def test_flash_row_bytes():
    """At Flash dims the packed rows are the official ones (448 e4m3 + 64 bf16 rope + 7 scales,
    padded; 128 e2m1 + 4 scales), against 1024 / 256 bytes in bf16."""
    plan = layer_plans(preset_config("deepseek-v4-flash"), CACHE_FORMATS["auto"], packed=True)
    csa = plan[2]
    assert 584 <= csa.window_format.row_bytes(512) <= 592
    assert csa.index_format.row_bytes(128) == 68


def test_a_format_that_cannot_hold_the_row_names_the_field():
    with pytest.raises(ValueError, match="head_dim"):
        layer_plans(preset_config("tiny", {"head_dim": 96}), CACHE_FORMATS["auto"])


def test_no_module_derives_a_layer_role_from_the_config():
    """Only the config package (which parses them) and layer_plan.py read the per-layer attention fields."""
    root = Path(__file__).parents[2] / "v4serve"
    readers = {f.relative_to(root).parts[0] for f in root.rglob("*.py")
               if re.search(r"\.(layer_types|compress_ratios|indexed_layers)\b", f.read_text())}
    assert sorted(readers) == ["config", "layer_plan.py"]


def test_auto_falls_back_to_bf16_where_the_native_formats_do_not_fit():
    from v4serve.layer_plan import resolve_cache_format

    tiny = preset_config("tiny")  # head_dim 64 with 16 RoPE channels: no native packed format
    cache, note = resolve_cache_format(tiny, "auto", "cuda")
    assert cache.name == "bf16" and "qk_rope_head_dim 16" in note
    flash = preset_config("deepseek-v4-flash")
    cache, note = resolve_cache_format(flash, "auto", "cuda")
    assert cache.name == "auto" and note is None
    assert resolve_cache_format(flash, None, "cpu")[0].name == "bf16"  # the CPU default
