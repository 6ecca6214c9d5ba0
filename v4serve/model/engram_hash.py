"""Engram n-gram hashing (DeepSeek-V4.1): token ids -> rows of each Engram layer's embedding table.

1. Compressed token map (from the tokenizer, once): decode every id alone, normalise the text
   (NFKC, NFD, drop combining marks, lowercase, runs of whitespace -> one space, strip; a text that
   is only whitespace stays one space), number the distinct results in order of first appearance:
   `cid = token_map[id]`.
2. Per Engram layer L: multipliers m[0..N-1] (N = max n-gram size), odd int64s drawn with numpy's
   PCG64 `default_rng(seed + 10007 * L).integers(0, half, N) * 2 + 1`, half = (2^63-1) // V // 2 with
   V = the compressed vocab size. Bucket counts: for n = 2..N and head j, the next prime above the
   previous (the first above `engram_vocab_size - 1` for each n), never reusing a prime of any
   earlier layer or head.
3. Token at position t, n-gram n, head j: c_k = cid of the token k places back (the compressed pad
   id before the sequence start),
       mix = (c_0 m_0) xor (c_1 m_1) xor ... xor (c_{n-1} m_{n-1})        (int64, wrapping products)
       row = mix mod prime[n][j] + offset[n][j]      (offsets: running sum of the layer's primes)
   giving (N-1) * heads rows per token per layer, ordered n-major then head.
"""

from __future__ import annotations

import re
import unicodedata
import dataclasses
from dataclasses import dataclass

import numpy as np
import torch

from v4serve.config import ModelConfig

LAYER_SEED_STRIDE = 10007
DEFAULT_SEED = 0


def normalize_token_text(text: str) -> str:
    """The Engram normaliser: NFKC, NFD, strip accents, lowercase, collapse whitespace, strip."""
    text = unicodedata.normalize("NFD", unicodedata.normalize("NFKC", text))
    text = "".join(ch for ch in text if not unicodedata.combining(ch)).lower()
    text = re.sub(r"[ \t\r\n]+", " ", text)
    return " " if text == " " else text.strip()


def compressed_token_map(decode_one, vocab_size: int) -> torch.Tensor:
    """int64 [vocab_size]: the compressed id of every token id (`decode_one(id) -> str`)."""
    ids: dict[str, int] = {}
    out = torch.empty(vocab_size, dtype=torch.int64)
    for i in range(vocab_size):
        out[i] = ids.setdefault(normalize_token_text(decode_one(i)), len(ids))
    return out


def modulo_token_map(config: ModelConfig) -> torch.Tensor:
    """A token map for a model without a tokenizer (a preset): id -> id mod the compressed vocab."""
    return torch.arange(config.vocab_size) % config.v41.engram_compressed_vocab_size


def _is_prime(n: int) -> bool:
    if n < 2:
        return False
    f = 2
    while f * f <= n:
        if n % f == 0:
            return False
        f += 1
    return True


def _next_prime(above: int, seen: set[int]) -> int:
    n = above + 1
    while not _is_prime(n) or n in seen:
        n += 1
    return n


def bucket_primes(config: ModelConfig) -> list[list[list[int]]]:
    """Per Engram layer, per n-gram size n = 2..N, per head: its bucket count (a prime; step 2 of
    the module docstring)."""
    v = config.v41
    seen: set[int] = set()
    out = []
    for _ in v.engram_layer_ids:
        per_n = []
        for _ in range(2, v.engram_max_ngram_size + 1):
            start, row = v.engram_vocab_size - 1, []
            for _ in range(v.engram_n_heads):
                start = _next_prime(start, seen)
                seen.add(start)
                row.append(start)
            per_n.append(row)
        out.append(per_n)
    return out


def engram_table_rows(config: ModelConfig) -> tuple[int, ...]:
    """Rows of each Engram layer's table: `engram_num_embeddings` when the config lists them, else
    the sum of the layer's bucket primes (what the hash addresses)."""
    v = config.v41
    if v.engram_num_embeddings:
        return tuple(v.engram_num_embeddings)
    return tuple(sum(sum(row) for row in layer) for layer in bucket_primes(config))


@dataclass(frozen=True)
class EngramHashTables:
    layer_ids: tuple[int, ...]
    multipliers: torch.Tensor  # int64 [layers, N]
    primes: torch.Tensor  # int64 [layers, N-1, heads]
    offsets: torch.Tensor  # int64 [layers, (N-1) * heads]
    pad_compressed_id: int
    max_ngram: int

    @classmethod
    def build(cls, config: ModelConfig, token_map: torch.Tensor, seed: int = DEFAULT_SEED) -> "EngramHashTables":
        v = config.v41
        n = v.engram_max_ngram_size
        vocab = v.engram_compressed_vocab_size
        found = int(token_map.max()) + 1
        if found != vocab:
            raise ValueError(
                f"the tokenizer's Engram token map has {found} compressed ids but config field "
                f"`engram_compressed_vocab_size` is {vocab}"
            )
        half = max(1, (np.iinfo(np.int64).max // vocab) // 2)
        mults = []
        for layer in v.engram_layer_ids:
            rng = np.random.default_rng(seed + LAYER_SEED_STRIDE * layer)
            mults.append(torch.from_numpy(rng.integers(0, half, size=(n,), dtype=np.int64) * 2 + 1))
        primes_t = torch.tensor(bucket_primes(config), dtype=torch.int64)
        flat = primes_t.flatten(1)
        offsets = torch.cat((torch.zeros_like(flat[:, :1]), flat.cumsum(1)[:, :-1]), dim=1)
        for i, (layer, total) in enumerate(zip(v.engram_layer_ids, flat.sum(1).tolist())):
            if v.engram_num_embeddings and v.engram_num_embeddings[i] != total:
                raise ValueError(
                    f"Engram layer {layer}: the hash buckets add up to {total} rows but config field "
                    f"`engram_num_embeddings[{i}]` is {v.engram_num_embeddings[i]}"
                )
        return cls(tuple(v.engram_layer_ids), torch.stack(mults), primes_t, offsets,
                   int(token_map[v.engram_pad_token_id]), n)

    def to(self, device: torch.device | str) -> "EngramHashTables":
        """The tables on `device` (a step hashes there: no host-to-device copy inside a captured step)."""
        return dataclasses.replace(self, multipliers=self.multipliers.to(device), primes=self.primes.to(device),
                                   offsets=self.offsets.to(device))

    def hash(self, history: torch.Tensor, layer_index: int) -> torch.Tensor:
        """history int64 [T, N]: compressed ids of each token (column 0) and of the N-1 before it
        (column k = k places back, pad id before the start) -> table rows int64 [T, (N-1)*heads]."""
        m = self.multipliers[layer_index].to(history.device)
        products = history * m  # wraps like the reference's int64 arithmetic
        mixes, mix = [], products[:, 0]
        for k in range(1, self.max_ngram):
            mix = mix ^ products[:, k]
            mixes.append(mix)
        primes = self.primes[layer_index].to(history.device)  # [N-1, heads]
        rows = torch.stack(mixes, 1)[:, :, None] % primes[None]  # Python-sign modulo: >= 0
        return rows.flatten(1) + self.offsets[layer_index].to(history.device)


def ngram_history(cids: torch.Tensor, before: torch.Tensor, max_ngram: int) -> torch.Tensor:
    """cids [L] compressed ids of a chunk, before [N-1] the ids of the N-1 tokens ahead of it
    (most recent last; pad where none) -> [L, N] (column k = token k places back)."""
    ctx = torch.cat((before, cids))
    n = max_ngram - 1
    return torch.stack([ctx[n - k:n - k + cids.shape[0]] for k in range(max_ngram)], dim=1)


class NgramHasher:
    """A step's Engram table rows: per token, the compressed ids of it and of the N-1 tokens before
    it (from the cache's per-sequence token history, which the step advances), hashed for every
    Engram table."""

    def __init__(self, tables: EngramHashTables, token_map: torch.Tensor, device: torch.device | str):
        self.tables = tables.to(device)
        self.token_map = token_map.to(device)
        self.history_len = tables.max_ngram - 1

    def rows(self, batch, history: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Per Engram table, int64 [T, (N-1) * heads] rows of the step's tokens (`batch`: a
        `ForwardBatch`); `history` [slots, N-1] the last N-1 token ids of each sequence, oldest
        first, updated in place."""
        n = self.history_len
        if batch.is_decode:
            ctx = torch.cat((history[batch.slots], batch.token_ids[:, None]), dim=1)  # [B, n + 1], oldest first
            windows = ctx.flip(1)
            history[batch.slots] = ctx[:, 1:]
        else:
            parts = []
            for c in batch.chunks:
                ctx = torch.cat((history[c.slot], batch.token_ids[c.offset:c.offset + c.length]))
                parts.append(torch.stack([ctx[n - k:n - k + c.length] for k in range(n + 1)], dim=1))
                history[c.slot] = ctx[-n:]
            windows = torch.cat(parts)
        ids = self.token_map[windows]
        return tuple(self.tables.hash(ids, i) for i in range(len(self.tables.layer_ids)))
