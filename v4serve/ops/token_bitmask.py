"""Token bitmask on logits (structured outputs): public entry point (math and layout in
token_bitmask_reference.py, kernel in token_bitmask_triton.py)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.token_bitmask_reference import apply_token_bitmask_reference
from v4serve.ops.token_bitmask_triton import apply_token_bitmask_triton


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, impl="auto") -> torch.Tensor:
    """Mask `logits` [B, V] in place to -inf where `bitmask` int32 [B, >= ceil(V/32)] has a clear
    bit; returns `logits`."""
    if logits.dim() != 2 or bitmask.dim() != 2 or bitmask.shape[0] != logits.shape[0]:
        raise ValueError(f"logits must be [B, V] and bitmask [B, W], got {tuple(logits.shape)} and "
                         f"{tuple(bitmask.shape)}")
    if bitmask.dtype != torch.int32 or bitmask.shape[1] * 32 < logits.shape[1]:
        raise ValueError(f"bitmask must be int32 with at least ceil(V/32) = {-(-logits.shape[1] // 32)} words per "
                         f"row, got {bitmask.dtype} with {bitmask.shape[1]}")
    if logits.stride(1) != 1 or bitmask.stride(1) != 1:
        raise ValueError("logits and bitmask need unit stride along their last dimension")
    if bitmask.device != logits.device:
        raise ValueError(f"bitmask is on {bitmask.device}, logits on {logits.device}")
    if use_triton(impl, logits, bitmask):
        return apply_token_bitmask_triton(logits, bitmask)
    return apply_token_bitmask_reference(logits, bitmask)
