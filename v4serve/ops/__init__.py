"""Ops: one op per file, each a readable torch reference, its Triton kernel(s) and one dispatching
public function (`impl="auto"|"torch"|"triton"`; auto = Triton on CUDA tensors, torch otherwise)."""

from v4serve.ops.gated_pool import gated_pool
from v4serve.ops.grouped_matmul import grouped_matmul
from v4serve.ops.hc_coefficients import hc_coefficients
from v4serve.ops.indexer import index_scores, select_topk
from v4serve.ops.kv_quant import apply_kv_format, hadamard
from v4serve.ops.sparse_attn import sparse_attn_paged

__all__ = [
    "apply_kv_format", "gated_pool", "grouped_matmul", "hadamard", "hc_coefficients", "index_scores", "select_topk",
    "sparse_attn_paged",
]
