"""Token bitmask on logits, torch reference (the kernel: token_bitmask_triton.py).

Layout (xgrammar's): `bitmask` int32 [B, W], W = ceil(V / 32); token t of row b is allowed when
bit (t % 32) of word bitmask[b, t // 32] is set (bit 0 = least significant; the sign bit is bit 31).
Math: logits[b, t] = -inf where the bit is clear, unchanged where it is set. Words past V are
ignored. In place on `logits` [B, V] (any float dtype, unit stride along V).
"""

import torch


def apply_token_bitmask_reference(logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    B, V = logits.shape
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask[:, :, None] >> shifts) & 1  # arithmetic shift; & 1 keeps bit `shift` alone
    allowed = bits.reshape(B, -1)[:, :V].bool()
    return logits.masked_fill_(~allowed, float("-inf"))
