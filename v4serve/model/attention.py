"""DeepSeek-V4 attention, shared by sliding (ratio 0), CSA (ratio 4) and HCA (ratio 128) layers.

    qr = q_a_norm(x Wq_a^T)                              low-rank q, reused by the indexer
    q  = rms(qr Wq_b^T per head)                         weightless per-head RMS
    kv = kv_norm(x Wkv^T)                                one latent per token: K = V
    rope(q), rope(kv) on the last rope channels at the token position (layer's table)
    o_h = sum_i e^(l_i - m) kv_i / (sum_i e^(l_i - m) + e^(sink_h - m)),  l_i = q_h . kv_i / sqrt(D)
    over the window rows (positions p-W+1..p) and the layer's compressed rows:
      HCA: every complete row t < (p+1)//ratio;  CSA: the indexer's top-k of those.
    o  = inverse rope(o) at p;  out = Wo_b concat_g(Wo_a[g] o_g)   (grouped low-rank output)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from v4serve.cache import ForwardBatch, LayerCache
from v4serve.config import ModelConfig
from v4serve.layer_plan import IndexerMode, LayerPlan
from v4serve.model.compressor import Compressor
from v4serve.model.csa2 import IndexerV41, SourceCompressor, compressed_columns
from v4serve.model.fusion import bf16_storage_fits, fp32_product, fuse_fp8_rows, fuse_rows, widths
from v4serve.model.indexer import Indexer
from v4serve.model.kernels import UsesKernels
from v4serve.model.norm import RMSNorm
from v4serve.model.quantized import FP8GroupedLinear
from v4serve.model.step_plan import StepPlan
from v4serve.ops.norm_rope import rms_norm_rope
from v4serve.ops.sparse_attn import sparse_attn_paged


class Attention(UsesKernels, nn.Module):
    """One layer's attention, built from its `LayerPlan` (ratio, compressor kind, indexer mode).
    Row formats are the cache's: a step reads them from its `LayerCache` view."""

    def __init__(self, config: ModelConfig, plan: LayerPlan):
        super().__init__()
        self.layer = plan.layer
        self.ratio = plan.ratio
        self.n_heads = h = config.num_attention_heads
        self.head_dim = d = config.head_dim
        self.window = config.sliding_window
        self.o_groups = config.o_groups
        self.eps = config.rms_norm_eps
        self.q_a_proj = nn.Linear(config.hidden_size, config.q_lora_rank, bias=False)
        self.q_a_norm = RMSNorm(config.q_lora_rank, config.rms_norm_eps)
        self.q_b_proj = nn.Linear(config.q_lora_rank, h * d, bias=False)
        self.kv_proj = nn.Linear(config.hidden_size, d, bias=False)
        self.kv_norm = RMSNorm(d, config.rms_norm_eps)
        # Grouped output projection: group g maps its heads' h*d/G channels to o_lora_rank.
        self.o_a_proj = nn.Linear(h * d // config.o_groups, config.o_groups * config.o_lora_rank, bias=False)
        self.o_b_proj = nn.Linear(config.o_groups * config.o_lora_rank, config.hidden_size, bias=False)
        self.sinks = nn.Parameter(torch.zeros(h, dtype=torch.float32))
        self.register_buffer("input_proj", None, persistent=False)  # [q_a_proj; kv_proj] once fused
        self.input_proj_fp8 = None  # the same as one FP8Linear where both are FP8 (`fusion.fuse_fp8_rows`)
        self.register_buffer("compressor_proj", None, persistent=False)  # the fp32 compressor projections, fused
        self.compressor = None
        self.indexer = None  # V4.1's (a V4 CSA indexer sits under its compressor)
        self.plan = plan
        if plan.v41:  # DeepSeek-V4.1 (`model/csa2.py`): the role decides what the layer owns
            if plan.compressed:
                self.compressor = SourceCompressor(config, self.ratio)
            if plan.indexer in (IndexerMode.FULL, IndexerMode.REINDEX):
                self.indexer = IndexerV41(config, plan)
        elif plan.compressed:
            if plan.indexer not in (IndexerMode.NONE, IndexerMode.OWN):
                raise NotImplementedError(f"layer {plan.layer}: indexer mode {plan.indexer.value!r} (V4.1)")
            indexer = Indexer(config, self.ratio) if plan.indexer is IndexerMode.OWN else None
            self.compressor = Compressor(config, d, self.ratio, overlap=plan.overlap, indexer=indexer)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: LayerCache, step: StepPlan) -> torch.Tensor:
        t = x.shape[0]
        angles = step.rope.for_ratio(self.ratio)
        q_low, kv = self._project_input(x)
        window = cache.window
        q_a_norm = (q_low, self.q_a_norm.weight)  # normalised in the kv norm's launch
        if window.packed:  # the norm kernel quantizes and packs the rows into the window pool too
            _, qr = rms_norm_rope(kv, self.eps, self.kv_norm.weight, angles.cos, angles.sin, impl=self.impl,
                                  pool=window.data, rows=batch.staging_rows, row_format=window.row_format,
                                  also_norm=q_a_norm)
        else:
            kv, qr = rms_norm_rope(kv, self.eps, self.kv_norm.weight, angles.cos, angles.sin, impl=self.impl,
                                   also_norm=q_a_norm)
            window.store(batch.staging_rows, kv, self.impl)
        q_eps = self.eps if self.plan.q_head_rms else None  # V4.1: no per-head q RMS
        q = rms_norm_rope(self.q_b_proj(qr).view(t, self.n_heads, self.head_dim), q_eps,
                          cos=angles.cos, sin=angles.sin, impl=self.impl)
        cmp, columns, counts = window, batch.window_columns, None
        if self.plan.v41 and self.ratio:  # V4.1: a non-source layer's compressed pool is its source's
            cmp = cache.compressed
            columns = compressed_columns(self, x, qr, batch, cache, step.rope)
        elif self.compressor is not None:
            cmp = cache.compressed
            columns, counts = self._compress_and_select(x, qr, batch, cache, step)
        rows = step.attn_rows
        o = sparse_attn_paged(
            q.to(window.value_dtype).reshape(*rows, *q.shape[1:]), window.data, cmp.data, columns.reshape(*rows, -1),
            self.window, self.sinks, self.head_dim**-0.5, counts=None if counts is None else counts.reshape(rows),
            row_format=window.read_format, impl=self.impl, cmp_row_format=cmp.read_format,
            unpack_bound=step.unpack_bound(self.ratio),
        ).reshape(q.shape)
        if not batch.is_decode:  # decode wrote its rows straight to the ring
            window.copy_rows(batch.ring_dst, batch.ring_src)

        o = rms_norm_rope(o.to(x.dtype), cos=angles.cos, sin=angles.sin, inverse=True, impl=self.impl)
        z = self._project_groups(o.reshape(t, self.o_groups, -1))  # [T, G, H*D/G] -> [T, G, o_rank]
        return self.o_b_proj(z.flatten(1))

    def _project_groups(self, groups: torch.Tensor) -> torch.Tensor:
        """z[t, g] = Wo_a[g] groups[t, g]: the FP8 module where the loader kept o_a_proj FP8
        (`FP8GroupedLinear`), else one einsum over the model-dtype weight viewed [G, o_rank, H*D/G]."""
        if isinstance(self.o_a_proj, FP8GroupedLinear):
            return self.o_a_proj(groups)
        return torch.einsum("tgi,goi->tgo", groups, self.o_a_proj.weight.view(self.o_groups, -1, groups.shape[-1]))

    def _compress_and_select(
        self, x: torch.Tensor, qr: torch.Tensor, batch: ForwardBatch, cache: LayerCache, step: StepPlan
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the step's completed compressed rows, then give each token's columns: ([T, W + K]
        window rows, then compressed pool rows, -1 = none; [T] int32 live compressed count, the
        live compressed columns coming first)."""
        kv_all, score_all, *index_projected = self._project_compressor_input(x)
        self.compressor.compress(kv_all, score_all, batch, cache.compressor_state, cache.compressed, step.rope)
        if self.compressor.indexer is None:  # HCA: every complete compressed row
            return batch.columns_of_all_rows(self.ratio), batch.visible_compressed(self.ratio)
        columns = self.compressor.indexer.select(index_projected, qr, batch, cache, step.rope)
        # Picks come best first with the holes last, so the kernel can stop at the visible ones.
        k = columns.shape[1] - batch.window_columns.shape[1]
        return columns, batch.live_picks(self.ratio, k)

    def fuse_projections(self) -> None:
        """One GEMM for the two projections of the layer input (q_a_proj, kv_proj), one fp32 GEMM for
        the compressor's and the indexer's (kv and gate of each, the index head weights), whose
        weights are stored as bf16 where their values are bf16 (the checkpoint's) on CUDA: half the
        bytes of the decode step's largest non-FP8 read after the output projection."""
        members = [self.q_a_proj, self.kv_proj]
        self.input_proj, self._input_widths = fuse_rows(members), widths(members)
        if self.input_proj is None:  # FP8 members: one FP8 GEMM over stacked codes and block scales
            self.input_proj_fp8 = fuse_fp8_rows(members)
        if self.compressor is not None:
            members = self._compressor_projections()
            narrow = torch.bfloat16 if bf16_storage_fits(members, self.q_a_norm.weight.dtype) else None
            self.compressor_proj, self._compressor_widths = fuse_rows(members, narrow), widths(members)

    def _compressor_projections(self) -> list[nn.Linear]:
        indexer = self.compressor.indexer
        return self.compressor.projections() + (indexer.projections() if indexer is not None else [])

    def _project_compressor_input(self, x: torch.Tensor) -> list[torch.Tensor]:
        """x in fp32 through every `_compressor_projections()` (the reference keeps them in fp32; their
        bf16 checkpoint values may be stored as bf16 once fused: `fusion.fp32_product`)."""
        if self.compressor_proj is None:
            return [F.linear(x.float(), m.weight) for m in self._compressor_projections()]
        return list(fp32_product(x, self.compressor_proj).split(self._compressor_widths, dim=-1))

    def _project_input(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(x Wq_a^T, x Wkv^T): row-strided views of one product once fused."""
        if self.input_proj is not None:
            return tuple(F.linear(x, self.input_proj).split(self._input_widths, dim=-1))
        if self.input_proj_fp8 is not None:
            return tuple(self.input_proj_fp8(x).split(self._input_widths, dim=-1))
        return self.q_a_proj(x), self.kv_proj(x)
