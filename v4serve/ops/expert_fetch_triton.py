"""Triton kernel of the expert fetch (math: expert_fetch_reference.py): the SMs copy the listed
rows, reading the source through its device-visible address. With the source in pinned host
memory (CUDA's unified addressing maps every cudaHostAlloc allocation at the same address on the
device) that is a zero-copy read over the host link; the copy list and its length are read on
the device, so the fetch needs no host synchronisation and can be captured in a CUDA graph (a
copy-engine transfer's addresses are fixed when it is captured; a fetch's rows are known only
after routing).

Layout: rows viewed as int32 words (row bytes a multiple of 16, asserted: every MXFP4 expert
tensor is), so each thread moves 16-byte vectors. Work item w = (list entry w // n_chunks,
chunk w % n_chunks of BLOCK words); a fixed grid of `programs` walks the m * n_chunks items of
the list (m read from `copy_count`), so an empty list costs one load per program, and the
fetch occupies only `programs` SMs' worth of warps while the resident experts compute beside it.
"""

import torch
import triton
import triton.language as tl

FETCH_CONFIG = dict(programs=64, BLOCK=2048, num_warps=4)


@triton.jit
def _expert_fetch_kernel(src_ptr, dst_ptr, copy_count_ptr, copy_slot_ptr, copy_src_ptr, row_words, dst_row0,
                         n_chunks, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    n_programs = tl.num_programs(0)
    total = tl.load(copy_count_ptr).to(tl.int32) * n_chunks
    for w in range(pid, total, n_programs):
        j = w // n_chunks
        c = w % n_chunks
        src_row = tl.load(copy_src_ptr + j)
        dst_row = dst_row0 + tl.load(copy_slot_ptr + j)
        words = c * BLOCK + tl.arange(0, BLOCK)
        ok = words < row_words
        values = tl.load(src_ptr + src_row * row_words + words, mask=ok)
        tl.store(dst_ptr + dst_row * row_words + words, values, mask=ok)


def expert_fetch_triton(src: torch.Tensor, dst: torch.Tensor, copy_count: torch.Tensor, copy_slot: torch.Tensor,
                        copy_src: torch.Tensor, dst_row0: int, config: dict | None = None) -> None:
    """`config` overrides FETCH_CONFIG's keys (bench/kernel_configs.py sweeps them)."""
    row_bytes = src[0].numel() * src.element_size()
    cfg = {**FETCH_CONFIG, **(config or {})}
    programs = cfg.pop("programs")
    words_src = src.reshape(src.shape[0], -1).view(torch.int32)
    words_dst = dst.reshape(dst.shape[0], -1).view(torch.int32)
    row_words = row_bytes // 4
    n_chunks = triton.cdiv(row_words, cfg["BLOCK"])
    grid = (max(1, min(programs, copy_slot.shape[0] * n_chunks)),)
    _expert_fetch_kernel[grid](words_src, words_dst, copy_count, copy_slot, copy_src, row_words, dst_row0, n_chunks,
                               **cfg)
