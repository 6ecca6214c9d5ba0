"""Expert fetch: copy listed rows (offloaded experts in pinned host memory) into device slots:
public entry point (math in expert_fetch_reference.py, kernel in expert_fetch_triton.py)."""

import torch

from v4serve.ops._dispatch import use_triton
from v4serve.ops.expert_fetch_reference import expert_fetch_reference
from v4serve.ops.expert_fetch_triton import expert_fetch_triton


def expert_fetch(src: torch.Tensor, dst: torch.Tensor, copy_count: torch.Tensor, copy_slot: torch.Tensor,
                 copy_src: torch.Tensor, dst_row0: int, impl: str = "auto") -> None:
    """dst[dst_row0 + copy_slot[j]] = src[copy_src[j]] for j < copy_count[0]; `auto` runs the kernel
    when `dst` is on CUDA (`src` may be pinned host memory: the kernel reads it over the host link)."""
    if src.shape[1:] != dst.shape[1:] or src.dtype != dst.dtype:
        raise ValueError(f"src and dst rows differ: {src.dtype} {tuple(src.shape)} vs {dst.dtype} {tuple(dst.shape)}")
    row_bytes = src[0].numel() * src.element_size() if src.shape[0] else 0
    if not (src.is_contiguous() and dst.is_contiguous()) or row_bytes % 16 or src.data_ptr() % 16 or dst.data_ptr() % 16:
        raise ValueError(f"expert rows must be contiguous, 16-byte aligned, a multiple of 16 bytes (row {row_bytes} B)")
    if use_triton(impl, dst):
        if src.device.type == "cpu" and dst.is_cuda and not src.is_pinned():
            raise ValueError("a CUDA fetch reads its source over the host link: host rows must be in pinned memory")
        expert_fetch_triton(src, dst, copy_count, copy_slot, copy_src, dst_row0)
    else:
        expert_fetch_reference(src, dst, copy_count, copy_slot, copy_src, dst_row0)
