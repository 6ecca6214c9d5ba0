"""The compressor steps of a speculative verify step, k + 1 tokens per sequence in one call (two
launches on the Triton path, the pooling over channel slices and the row finish, instead of one per
token and a state copy per token; the rollback's undo journal written on the way): public entry
point (math in compress_verify_reference.py, kernels in compress_verify_triton.py)."""

from __future__ import annotations

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.compress_decode import check_compress_inputs
from v4serve.ops.compress_verify_reference import compress_verify_reference
from v4serve.ops.compress_verify_triton import compress_verify_triton


def compress_verify(
    kv: torch.Tensor, score: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
    position_bias: torch.Tensor, state: tuple[torch.Tensor, ...], ratio: int, norm_weight: torch.Tensor,
    eps: float, cos: torch.Tensor, sin: torch.Tensor, rows_of: torch.Tensor, scratch: int, out_dtype: torch.dtype,
    groups: int, saved: torch.Tensor | None = None, written: torch.Tensor | None = None, impl: str = "auto",
    pool: torch.Tensor | None = None, row_format=None, hadamard: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`groups` compressor decode steps (`compress_decode`) of the S = len(slots) sequences, token
    g * S + b being sequence b's g-th (group-major: kv, score, positions, cos, sin, rows_of have
    groups * S rows), state updated in place; with the undo journal `saved` ([groups, >= S * n,
    *state row], the state's dtype) and `written` ([groups, >= S] int32), group g >= 1 first keeps
    the state sub-rows it overwrites in saved[g - 1, b * n + t] and their bit mask in
    written[g - 1, b] (n state tensors; compress_verify_reference.py says which sub-rows).
    Returns (rows [groups * S, d], target [groups * S] int64) as `compress_decode` does per group."""
    s = slots.shape[0]
    if groups < 1 or kv.shape[0] != groups * s:
        raise ValueError(f"a verify step of {groups} groups of {s} sequences has {groups * s} tokens, got {kv.shape[0]}")
    fmt = check_compress_inputs(kv, score, position_bias, state, ratio, norm_weight, cos, sin, pool, row_format,
                                hadamard)
    if (saved is None) != (written is None):
        raise ValueError("the undo journal is saved and written together: pass both or neither")
    if saved is not None:
        n, row = len(state), state[0].shape[1:]
        if saved.shape[0] < groups or saved.shape[1] < s * n or saved.shape[2:] != row or saved.dtype != state[0].dtype:
            raise ValueError(f"saved must be [>= {groups}, >= {s * n}, {', '.join(map(str, row))}] {state[0].dtype}, "
                             f"got {tuple(saved.shape)} {saved.dtype}")
        if written.shape[0] < groups or written.shape[1] < s or written.dtype != torch.int32:
            raise ValueError(f"written must be [>= {groups}, >= {s}] int32, got {tuple(written.shape)} {written.dtype}")
        if not saved.is_contiguous() or any(t.stride(0) != row.numel() or not t[0].is_contiguous() for t in state):
            raise ValueError("saved and every state tensor need contiguous rows (sub-rows at one slot's offsets)")
        if n == 2 and 2 * ratio > 31:
            raise ValueError(f"an overlap state's 2 x {ratio} sub-rows do not fit written's int32 bit masks")
    if kv.stride(0) != score.stride(0):  # the kernel reads both with one row stride
        kv, score = kv.contiguous(), score.contiguous()
    if use_triton(impl, kv, score, *state):
        return compress_verify_triton(kv, score, positions, slots, position_bias, state, ratio, norm_weight, eps,
                                      cos, sin, rows_of, scratch, out_dtype, groups, saved, written, pool=pool,
                                      row_format=fmt, hadamard=hadamard)
    return compress_verify_reference(kv, score, positions, slots, position_bias, state, ratio, norm_weight, eps, cos,
                                     sin, rows_of, scratch, out_dtype, groups, saved, written, pool, fmt, hadamard)
