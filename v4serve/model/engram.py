"""Engram (DeepSeek-V4.1): hashed n-gram embeddings added to the residual streams before a block.

For a token with streams X [n, D] (n = hc_mult) and its table rows r [R] (`engram_hash.py`,
R = (max_ngram - 1) * heads), with e = concat_i dequant(table[r_i]) [R * head_dim]:

    [k_0 .. k_{n-1}, v] = Wkv e                    (FP8 GEMM: e rounded to e4m3 / ue8m0 per 32)
    a_j    = <rms(X_j) * q_weight[j], rms(k_j) * k_weight[j]> / sqrt(D)
    gate_j = sigmoid(sign(a_j) sqrt(|a_j|))        (|a_j| floored at 1e-6 before the root)
    X_j   += gate_j * v

rms = RMSNorm without weight (eps = rms_norm_eps), fp32 math. The table is e4m3 codes
`table [rows, head_dim]` with one ue8m0 scale per 32 channels, stored as its exponent byte
`table_scale [rows, head_dim / 32]` uint8 (2^(b - 127)). The table can stay in host memory
(V4.1-Flash's two are ~183 GiB), pinned when the model runs on CUDA: the lookup kernel
(ops/engram_lookup.py) reads the step's T * R rows there over the host link, with the row ids on
the device (no host sync, so a decode step with Engram is captured in a CUDA graph).
"""

from __future__ import annotations

import contextlib
import math

import torch
from torch import nn

from v4serve.config import ModelConfig
from v4serve.model.kernels import UsesKernels
from v4serve.model.v41_quant import act_quant
from v4serve.ops.engram_lookup import engram_lookup
from v4serve.ops.engram_lookup_reference import SCALE_BLOCK
ENGRAM_TABLE_BUFFERS = ("table", "table_scale")


class Engram(UsesKernels, nn.Module):
    def __init__(self, config: ModelConfig, num_embeddings: int):
        super().__init__()
        v = config.v41
        self.hc_mult = n = config.hc_mult
        self.dim = d = config.hidden_size
        self.eps = config.rms_norm_eps
        self.head_dim = v.engram_head_dim
        rows = (v.engram_max_ngram_size - 1) * v.engram_n_heads
        if self.head_dim % SCALE_BLOCK:
            raise ValueError(f"config field `engram_head_dim` ({self.head_dim}) must be a multiple of {SCALE_BLOCK}")
        # e4m3 codes and ue8m0 exponent bytes: not parameters (never cast to the model dtype).
        self.register_buffer("table", torch.zeros(num_embeddings, self.head_dim, dtype=torch.float8_e4m3fn))
        self.register_buffer("table_scale", torch.full((num_embeddings, self.head_dim // SCALE_BLOCK), 127,
                                                        dtype=torch.uint8))
        self.wkv = nn.Linear(rows * self.head_dim, (n + 1) * d, bias=False)
        self.q_weight = nn.Parameter(torch.ones(n, d))
        self.k_weight = nn.Parameter(torch.ones(n, d))

    def lookup(self, rows: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """rows int64 [T, R] -> dequantized embeddings [T, R * head_dim] on `rows.device`, read where
        the table lives (ops/engram_lookup.py)."""
        return engram_lookup(self.table, self.table_scale, rows, dtype, impl=self.impl)

    def forward(self, streams: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """streams [T, n, D], rows [T, R] -> streams with the gated n-gram value added."""
        e = self.lookup(rows, self.q_weight.dtype)
        # an FP8Linear of a quantized model rounds the same way again: idempotent
        kv = self.wkv(act_quant(e, self.impl))
        keys, value = kv[:, : self.hc_mult * self.dim].view(-1, self.hc_mult, self.dim), kv[:, self.hc_mult * self.dim:]
        q = _rms(streams) * self.q_weight.float()
        k = _rms(keys) * self.k_weight.float()
        a = (q * k).sum(-1) / math.sqrt(self.dim)
        gate = torch.sigmoid(a.abs().clamp(min=1e-6).sqrt() * a.sign())
        return (streams.float() + gate[..., None] * value.float()[:, None]).to(streams.dtype)


def _rms(x: torch.Tensor, eps: float = 1e-20) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


@contextlib.contextmanager
def engram_tables_in_host_memory(net: torch.nn.Module, pinned: bool = False):
    """Inside: the model's Engram tables are out of it (so `to_empty` does not allocate them on the
    device); after: they are back, allocated in host memory, uninitialised (V4.1-Flash's two are
    ~183 GiB; a step looks up T * R rows there, `Engram.lookup`). `pinned` (a model on CUDA):
    page-locked, so the lookup kernel reads them in place."""
    held = [(m, name, m._buffers.pop(name)) for m in net.modules() if isinstance(m, Engram)
            for name in ENGRAM_TABLE_BUFFERS]
    try:
        yield
    finally:
        for module, name, meta in held:
            module.register_buffer(name, torch.empty(meta.shape, dtype=meta.dtype, device="cpu", pin_memory=pinned))
