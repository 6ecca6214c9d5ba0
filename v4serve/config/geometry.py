"""The names and small value types ModelConfig's per-layer fields are spelled in: the attention
layer types, the MLP layer types, and the YaRN scaling of the compressed layers' RoPE."""

from __future__ import annotations

from dataclasses import dataclass

SLIDING = "sliding_attention"
CSA = "compressed_sparse_attention"  # ratio-4 compressor with overlap + lightning indexer
HCA = "heavily_compressed_attention"  # ratio-128 compressor, every compressed row visible
# V4.1 (v41.py): a layer that reads compressed rows (ratio 1 or 2).
CSA2 = "compressed_sparse_attention_v41"
LAYER_TYPES = (SLIDING, CSA, HCA, CSA2)
MLP_LAYER_TYPES = ("hash_moe", "moe")


@dataclass(frozen=True)
class YarnScaling:
    """YaRN frequency interpolation of the compressed layers' RoPE (no attention mscale in V4)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
