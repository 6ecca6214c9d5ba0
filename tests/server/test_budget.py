"""The KV budget the server prints at start: tier costs and the pages a byte budget buys."""

from __future__ import annotations

import pytest
import torch

from v4serve.cache import CacheGeometry, PagedKVCache
from v4serve.cache.budget import parse_size, solve_kv_budget
from v4serve.presets import preset_config


@pytest.fixture(scope="module")
def geometry() -> CacheGeometry:
    return CacheGeometry.from_config(preset_config("tiny"))


def test_budget_counts_every_byte_the_cache_allocates(geometry):
    budget = solve_kv_budget(geometry, torch.float32, 3 * 2**20, 8, 128, 512)
    cache = PagedKVCache(geometry, budget.num_pages, 8, 512, 128, torch.float32, "cpu")
    assert cache.nbytes == budget.total_bytes  # tests/engine/test_kv_cache_size.py counts every view's tensors


def test_a_large_budget_is_capped_at_full_length_sequences(geometry):
    budget = solve_kv_budget(geometry, torch.float32, 2**30, 8, 128, 512)
    assert budget.num_pages == 8 * 128


def test_pages_fill_the_budget_exactly(geometry):
    memory = 3 * 2**20
    budget = solve_kv_budget(geometry, torch.float32, memory, 8, 128, 512)
    page_bytes = budget.bytes_per_token * budget.page_size
    assert budget.total_bytes <= memory < budget.total_bytes + page_bytes
    assert budget.full_length_sequences == budget.num_pages // 128
    for tier in ("compressed rows", "index keys", "window ring", "compressor state"):  # every tier, per token
        assert any(line.strip().startswith(tier) and "bytes/token" in line for line in budget.describe()), tier


def test_too_small_a_budget_names_the_option(geometry):
    with pytest.raises(ValueError, match="kv_cache_memory"):
        solve_kv_budget(geometry, torch.float32, 1000, 8, 128, 512)


@pytest.mark.parametrize("text,value", [("2GiB", 2 * 2**30), ("512MiB", 512 * 2**20), ("1.5GB", 1_500_000_000),
                                        ("4096", 4096), ("64k", 65536)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["", "lots", "-1GiB", "2XB"])
def test_parse_size_refuses_nonsense(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_server_prints_the_budget(server):
    log = server.log()
    assert "KV cache budget" in log and "bytes/token" in log and "pages of" in log
    assert "KV cache size: " in log and "Maximum concurrency for " in log
