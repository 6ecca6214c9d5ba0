"""The step plan's bound on the rows a prefill layer reads (it sizes the pool packed rows are
unpacked into, ops/kv_compact.py): at least the distinct pool rows the step's columns name, and
loose by at most one ring row per chunk."""

import torch

from v4serve.cache import CacheGeometry, PagedKVCache, SequenceChunk
from v4serve.model.step_plan import unpack_bounds
from v4serve.presets import preset_config


def _named_rows(columns: torch.Tensor, n_window: int, n_win_rows: int, counts: torch.Tensor | None) -> int:
    """Distinct rows named by live columns (window columns first, compressed ones after them)."""
    c = torch.arange(columns.shape[1])
    live = columns >= 0
    if counts is not None:
        live &= c[None, :] < n_window + counts[:, None]
    g = torch.where(c[None, :] < n_window, columns.long(), columns.long() + n_win_rows)
    return int(torch.unique(g[live]).numel())


def test_bounds_cover_the_rows_a_step_names():
    config = preset_config("tiny")
    cache = PagedKVCache(CacheGeometry.from_config(config), num_pages=40, max_seqs=4, max_step_tokens=512,
                         max_pages_per_seq=16, dtype=torch.float32, device="cpu")
    w = config.page_size
    spans = [(0, 70), (3 * w + 5, 40), (w - 2, 9)]  # (start, length): fresh, deep, window straddling the start
    slots = [cache.open_sequence() for _ in spans]
    offsets = [0, 70, 110]
    for slot, (start, length) in zip(slots, spans):
        cache.reserve(slot, start + length)
    chunks = [SequenceChunk(slot, start, length, off) for slot, (start, length), off in zip(slots, spans, offsets)]
    batch = cache.build_batch(chunks, [1] * 119, [69, 109, 118])
    bounds = dict(unpack_bounds(batch))
    assert set(bounds) == {0} | set(batch.compressed_rows)
    n_win_rows = cache.view(0).window.data.shape[0]
    window = _named_rows(batch.window_columns, w, n_win_rows, None)
    assert window <= bounds[0] <= window + len(chunks)
    for r in batch.compressed_rows:
        named = _named_rows(batch.columns_of_all_rows(r), w, n_win_rows, batch.visible_compressed(r))
        assert named <= bounds[r] <= named + len(chunks)
        assert named - window == sum((start + length) // r for start, length in spans)
