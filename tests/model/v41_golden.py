"""Harness for the DeepSeek-V4.1 golden data (tests/data/v41-golden, README.md there): builds the
model from the folder as a checkpoint, runs prefill / chunked prefill / decode through the paged
cache, and records per-layer block outputs and index selections. `teacher_forced=True` feeds every
block the golden block input (streams and pre mix), the README's sharpest per-block check."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file

from v4serve.cache import PagedKVCache
from v4serve.cache.batch import SequenceChunk
from v4serve.cache.geometry import CacheGeometry
from v4serve.config import ModelConfig
from v4serve.formats import CACHE_FORMATS
from v4serve.model.v41_weights import build_v41_model

GOLDEN = Path(__file__).parents[1] / "data" / "v41-golden"
INDEX_LAYERS = (2, 4, 6)


def load_golden() -> dict[str, torch.Tensor]:
    return load_file(str(GOLDEN / "golden.safetensors"))


@dataclass
class Record:
    logits: list = field(default_factory=list)  # per step [N, vocab]
    h_out: dict = field(default_factory=dict)  # layer -> list of [T, 4, D] per step
    topk: dict = field(default_factory=dict)  # layer -> list of [T, k]
    candidates: list = field(default_factory=list)

    def cat(self, what: dict, layer: int) -> torch.Tensor:
        return torch.cat(what[layer])


class GoldenRunner:
    def __init__(self, model=None):
        self.config = ModelConfig.from_pretrained(GOLDEN)
        self.model = model if model is not None else build_v41_model(GOLDEN, self.config, "cpu", torch.bfloat16)
        self.model.bind_kernels("torch")
        self.golden = load_golden()
        self.feed = None  # (phase, token rows) when teacher-forced
        self.record = Record()
        for i, layer in enumerate(self.model.model.layers):
            self._wrap_layer(i, layer)

    @classmethod
    def config_only(cls) -> "GoldenRunner":
        """The golden config without building the model."""
        runner = cls.__new__(cls)
        runner.config = ModelConfig.from_pretrained(GOLDEN)
        return runner

    def _wrap_layer(self, i: int, layer) -> None:
        """Feed (teacher forcing) and record each block. The model runs its blocks through
        `forward_deferred`, which returns the block's last expand still pending (the next block's
        first mixer runs it): the wrapper records the expanded output beside it (the same bits) and
        passes the pending expand on, so the model's own path is what runs."""
        run = layer.forward_deferred
        if layer.engram is not None:  # a fed block input is the golden one after Engram
            engram = layer.engram.forward
            layer.engram.forward = lambda streams, rows: streams if self.feed is not None else engram(streams, rows)

        def forward_deferred(streams, pre, batch, cache, step, keep=None):
            if self.feed is not None:
                phase, rows = self.feed
                g = self.golden
                name = f"{phase}.layers.{i}.h_in"
                if name in g:
                    src = g[name]
                elif i:
                    src = g[f"{phase}.layers.{i - 1}.h_out"]
                else:
                    src = g[f"{phase}.embed"][:, None].expand(-1, self.config.hc_mult, -1) if phase == "prefill" else None
                if src is not None:
                    streams = src[rows].to(self.model.model.embed_tokens.weight.dtype).contiguous()
                pre = g[f"{phase}.layers.{i}.pre_mix_in"][rows].float()
            pending, f_pre = run(streams, pre, batch, cache, step, keep)
            self.record.h_out.setdefault(i, []).append(layer.expand_pending(pending).detach().clone())
            return pending, f_pre

        layer.forward_deferred = forward_deferred
        indexer = layer.self_attn.indexer
        if indexer is not None:
            select = indexer.select

            def wrapped(x, qr, batch, cache, rope):
                picks = select(x, qr, batch, cache, rope)
                self.record.topk.setdefault(i, []).append(picks.clone())
                if "candidates" in batch.published and indexer.is_candidate_source:
                    self.record.candidates.append(batch.published["candidates"].clone())
                return picks

            indexer.select = wrapped

    def new_cache(self) -> PagedKVCache:
        return PagedKVCache(CacheGeometry.from_config(self.config, CACHE_FORMATS["auto"]), num_pages=16, max_seqs=2,
                            max_step_tokens=128, max_pages_per_seq=8, dtype=torch.bfloat16, device="cpu")

    def prefill(self, cache, slot, ids, chunks=None, teacher_forced=False):
        """Prefill `ids` in chunks of the given lengths (default one); logits of every position [T, V]."""
        chunks = chunks or [len(ids)]
        cache.reserve(slot, len(ids) + 32)
        out, start = [], 0
        for n in chunks:
            piece = ids[start:start + n]
            batch = cache.build_batch([SequenceChunk(slot, start, n, 0)], piece, list(range(n)))
            self.feed = ("prefill", slice(start, start + n)) if teacher_forced else None
            out.append(self.model(batch, cache))
            start += n
        self.feed = None
        return torch.cat(out)

    def decode(self, cache, slot, tokens, start, teacher_forced=False, golden_rows=None):
        """One decode step per token at positions start, start+1, ...; logits [n, V]."""
        out = []
        for i, t in enumerate(tokens):
            batch = cache.build_decode_batch(torch.tensor([t]), torch.tensor([start + i]), torch.tensor([slot]))
            self.feed = ("decode", slice(i, i + 1)) if teacher_forced else None
            out.append(self.model(batch, cache))
        self.feed = None
        return torch.cat(out)


def logit_stats(got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    d = (got.float() - want.float()).abs().flatten()
    return {"max": d.max().item(), "p99": d.quantile(0.99).item(), "mean": d.mean().item()}


def rel_l2(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).norm() / want.float().norm()).item()


def as_sets(rows: torch.Tensor) -> list[set]:
    return [set(r[r >= 0].tolist()) for r in rows]


def overlap(got: torch.Tensor, want: torch.Tensor) -> float:
    """Fraction of the golden selected rows we also select (rows with a selection only)."""
    kept = total = 0
    for a, b in zip(as_sets(got), as_sets(want)):
        kept += len(a & b)
        total += len(b)
    return kept / max(total, 1)
