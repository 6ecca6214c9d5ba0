"""Token bitmask on logits, torch reference (the kernel: token_bitmask_triton.py).

Layout (xgrammar's): `bitmask` int32 [B, W], W = ceil(V / 32); token t of row b is allowed when
bit (t % 32) of word bitmask[b, t // 32] is set (bit 0 = least significant; the sign bit is bit 31).
Math: logits[b, t] = -inf where the bit is clear, unchanged where it is set. Words past V are
ignored. In place on `logits` [B, V] (any float dtype, unit stride along V).
"""

import torch


def apply_token_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    B, V = logits.shape
    # Word w's bits 8k..8k+7 are its byte k (little-endian), so bit t % 32 of word t // 32 is bit
    # t % 8 of byte t // 8 of the row's bytes: expand each byte through a [256, 8] table of its bits.
    table = (torch.arange(256, device=bitmask.device)[:, None] >> torch.arange(8, device=bitmask.device)) & 1
    row_bytes = bitmask.contiguous().view(torch.uint8).reshape(B, -1).long()
    allowed = table.bool()[row_bytes].reshape(B, -1)[:, :V]
    return logits.masked_fill_(~allowed, float("-inf"))
