"""Ops: one op per file, each a readable torch reference, its Triton kernel(s) and one dispatching
public function (`impl="auto"|"torch"|"triton"`; auto = Triton on CUDA tensors, torch otherwise)."""

from v4serve.ops.gated_pool import gated_pool
from v4serve.ops.grouped_matmul import grouped_matmul
from v4serve.ops.hc_coefficients import hc_coefficients
from v4serve.ops.hc_collapse import hc_collapse
from v4serve.ops.hc_expand import hc_expand
from v4serve.ops.hc_mix import hc_mix
from v4serve.ops.indexer import index_scores, select_topk
from v4serve.ops.hadamard import hadamard
from v4serve.ops.kv_quant import apply_kv_format
from v4serve.ops.moe_combine import moe_combine
from v4serve.ops.moe_route import moe_route
from v4serve.ops.moe_sort import moe_sort
from v4serve.ops.sparse_attn import sparse_attn_paged
from v4serve.ops.swiglu import clamped_swiglu

__all__ = [
    "apply_kv_format", "clamped_swiglu", "gated_pool", "grouped_matmul", "hadamard", "hc_coefficients", "hc_collapse",
    "hc_expand", "hc_mix", "index_scores", "moe_combine", "moe_route", "moe_sort", "select_topk", "sparse_attn_paged",
]
