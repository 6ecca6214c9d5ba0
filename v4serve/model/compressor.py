"""KV compressor: pools every `ratio` tokens of a layer's input into one compressed row.

For token t: kv_t = x_t Wkv^T, s_t = x_t Wgate^T + ape[t mod ratio] (fp32). Compressed row g is a
per-channel softmax-gated pool:

* without overlap (HCA): over the `ratio` tokens of block g;
* with overlap (CSA, and every indexer): over 2*ratio candidates, the first head_dim channels
  of block g-1's tokens and the last head_dim channels of block g's tokens (block -1: score -inf);

then `kv_norm` (RMSNorm), then RoPE on the last rope channels at the block's START position
g*ratio with the compressed-layer table. Row g exists once token g*ratio + ratio - 1 is seen.

State between steps: with overlap (`cache.kv_cache.CompressorState`) the open block's projected
rows and the previous complete block's; without (`OnlinePoolState`) an online softmax of the open
block (running max, sum, weighted sum per channel), exact up to fp32 rounding. Blocks wholly
inside one prefill chunk are pooled at once.
"""

from __future__ import annotations

import torch
from torch import nn

from v4serve.cache import ForwardBatch, Pool
from v4serve.cache.kv_cache import CompressorState, OnlinePoolState
from v4serve.config import ModelConfig
from v4serve.model.kernels import UsesKernels
from v4serve.model.norm import RMSNorm
from v4serve.model.rope import StepRope, rotary_angles
from v4serve.ops.compress_decode import compress_decode
from v4serve.ops.compress_decode_reference import fold_online
from v4serve.ops.compress_verify import compress_verify
from v4serve.ops.gated_pool import gated_pool
from v4serve.ops.hadamard import hadamard
from v4serve.ops.norm_rope import rms_norm_rope


class Compressor(UsesKernels, nn.Module):
    def __init__(
        self, config: ModelConfig, head_dim: int, ratio: int, overlap: bool, indexer: nn.Module | None = None
    ):
        super().__init__()
        self.head_dim = head_dim
        self.ratio = ratio
        self.overlap = overlap
        width = (2 if overlap else 1) * head_dim
        # The reference runs the compressor projections in fp32; they are kept fp32 at any model dtype.
        self.kv_proj = nn.Linear(config.hidden_size, width, bias=False, dtype=torch.float32)
        self.gate_proj = nn.Linear(config.hidden_size, width, bias=False, dtype=torch.float32)
        self.position_bias = nn.Parameter(torch.zeros(ratio, width, dtype=torch.float32))
        self.kv_norm = RMSNorm(head_dim, config.rms_norm_eps)
        # A CSA layer's indexer sits under its compressor, as in the checkpoints (`compressor.indexer.*`).
        self.indexer = indexer

    def projections(self) -> list[nn.Linear]:
        """The fp32 projections of the layer input this module reads (the attention may fuse them)."""
        return [self.kv_proj, self.gate_proj]

    def compress(
        self, kv_all: torch.Tensor, score_all: torch.Tensor, batch: ForwardBatch,
        state: CompressorState | OnlinePoolState, pool: Pool, rope: StepRope, rotate: bool = False,
    ) -> None:
        """Pool every block the step completes and store its row in `pool` (rows from `batch`;
        the pool rounds or packs it to its format), Hadamard-rotated first when `rotate` (index
        keys of a quantized cache). kv_all, score_all: the layer input through kv_proj and
        gate_proj, fp32 [T, W]."""
        if batch.is_decode:
            self._compress_decode(kv_all, score_all, batch, state, pool, rope, rotate)
            return
        inv_freq = rope.compress.inv_freq
        rows_of = batch.compressed_rows[self.ratio]
        for b, c in enumerate(batch.chunks):
            span = slice(c.offset, c.offset + c.length)
            in_block = (batch.positions[span] % self.ratio).long()
            rows, first_group = self._pool_chunk(
                kv_all[span], score_all[span] + self.position_bias[in_block], state, c.slot, c.start
            )
            if rows is None:
                continue
            groups = torch.arange(first_group, first_group + rows.shape[0], device=rows.device)
            rows = self.normalize_and_rotate(rows.to(pool.value_dtype), groups * self.ratio, inv_freq)
            pool.store(rows_of[b, groups].long(), hadamard(rows, self.impl) if rotate else rows, self.impl)

    def _compress_decode(
        self, kv: torch.Tensor, score: torch.Tensor, batch: ForwardBatch, state: CompressorState | OnlinePoolState,
        pool: Pool, rope: StepRope, rotate: bool,
    ) -> None:
        """One token per sequence, no host decisions (`ops/compress_decode.py`): every sequence
        records its token in the open block; sequences whose block did not complete write to the
        pool's scratch row. A verify step (`batch.verify_groups` tokens per sequence, group-major)
        folds its groups in position order in one call (`ops/compress_verify.py`), which also
        journals what each group overwrites in the step's checkpoints (the rollback's undo log).
        The kernels also apply the keys' Hadamard rotation (`rotate`) and pack packed pools."""
        r = self.ratio
        angles = rope.block_starts(r)  # rows are rotated at their block's start position
        fused = pool.packed  # the kernel packs its rows into the pool itself
        packed = dict(pool=pool.data, row_format=pool.row_format) if fused else {}
        args = (kv, score, batch.positions)
        common = (self.position_bias, state.tensors(), r, self.kv_norm.weight, self.kv_norm.eps, angles.cos,
                  angles.sin, batch.compressed_rows[r], pool.scratch_row, pool.value_dtype)
        groups = batch.verify_groups
        if groups == 1:
            rows, target = compress_decode(*args, batch.slots, *common, impl=self.impl, hadamard=rotate, **packed)
        else:
            checkpoints = batch.checkpoints
            saved, written = (None, None) if checkpoints is None else checkpoints.journal(state)
            slots = batch.slots[:kv.shape[0] // groups]  # group 0's: one per sequence
            rows, target = compress_verify(*args, slots, *common, groups, saved, written, impl=self.impl,
                                           hadamard=rotate, **packed)
        if not fused:
            pool.store(target, rows, self.impl)

    def normalize_and_rotate(self, rows: torch.Tensor, starts: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
        """kv_norm, then RoPE at each row's block start position."""
        angles = rotary_angles(starts, inv_freq)
        return rms_norm_rope(rows, self.kv_norm.eps, self.kv_norm.weight, angles.cos, angles.sin, impl=self.impl)

    def _pool_chunk(
        self, kv: torch.Tensor, score: torch.Tensor, state: CompressorState | OnlinePoolState, slot: int, start: int,
    ) -> tuple[torch.Tensor | None, int]:
        """(pooled rows [n, head_dim] fp32 of the blocks completed in this chunk, first group id)."""
        if self.overlap:
            return self._pool_chunk_overlap(kv, score, state, slot, start)
        return self._pool_chunk_online(kv, score, state, slot, start)

    def _pool_chunk_overlap(
        self, kv: torch.Tensor, score: torch.Tensor, state: CompressorState, slot: int, start: int
    ) -> tuple[torch.Tensor | None, int]:
        r, d = self.ratio, self.head_dim
        open_rows = start % r
        kv = torch.cat((state.kv[slot, r:r + open_rows], kv))  # positions [start - open_rows, end)
        score = torch.cat((state.score[slot, r:r + open_rows], score))
        n_blocks = kv.shape[0] // r
        done = n_blocks * r
        width = kv.shape[-1]
        pooled = None
        if n_blocks:
            blocks_kv, blocks_score = kv[:done].view(n_blocks, r, width), score[:done].view(n_blocks, r, width)
            prev_kv = torch.cat((state.kv[slot, None, :r], blocks_kv[:-1]))[..., :d]
            prev_score = torch.cat((state.score[slot, None, :r], blocks_score[:-1]))[..., :d]
            pool_kv = torch.cat((prev_kv, blocks_kv[..., d:]), dim=1)  # [n, 2r, d]
            pool_score = torch.cat((prev_score, blocks_score[..., d:]), dim=1)
            state.kv[slot, :r], state.score[slot, :r] = blocks_kv[-1], blocks_score[-1]
            pooled = gated_pool(pool_kv, pool_score, out_dtype=torch.float32, impl=self.impl)
        rest = kv.shape[0] - done
        state.kv[slot, r:r + rest] = kv[done:]
        state.score[slot, r:r + rest] = score[done:]
        return pooled, (start - open_rows) // r

    def _pool_chunk_online(
        self, kv: torch.Tensor, score: torch.Tensor, state: OnlinePoolState, slot: int, start: int
    ) -> tuple[torch.Tensor | None, int]:
        """The open block takes the chunk's first tokens (folded in; pooled if they complete it),
        whole blocks inside the chunk are pooled at once, the trailing partial block is folded."""
        r = self.ratio
        head = min(kv.shape[0], (r - start % r) % r)
        rows = []
        if head:
            m, total, acc = fold_online(state.max[slot], state.sum[slot], state.acc[slot], kv[:head], score[:head])
            if (start + head) % r == 0:
                rows.append((acc / total)[None])
                state.reset(slot)
            else:
                state.max[slot], state.sum[slot], state.acc[slot] = m, total, acc
        first_group = start // r if head and (start + head) % r == 0 else (start + head) // r
        kv, score = kv[head:], score[head:]
        n_blocks = kv.shape[0] // r
        done = n_blocks * r
        if n_blocks:
            width = kv.shape[-1]
            rows.append(gated_pool(kv[:done].view(n_blocks, r, width), score[:done].view(n_blocks, r, width),
                                   out_dtype=torch.float32, impl=self.impl))
        if done < kv.shape[0]:  # the open block at the chunk's end; the state is empty at a boundary
            folded = fold_online(state.max[slot], state.sum[slot], state.acc[slot], kv[done:], score[done:])
            state.max[slot], state.sum[slot], state.acc[slot] = folded
        return (torch.cat(rows) if rows else None), first_group

