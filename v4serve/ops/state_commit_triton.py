"""Triton kernel of the verify step's state commit (math: state_commit_reference.py): every state
object of every compressor in one launch.

Layouts: one int64 table row per state object i, built once (the tensors never move):
[stacked_i address, saved_i address, n_i, row_i floats, slots of the cache, saved_i's group
stride in floats]; stacked_i fp32 [n_i, slots, row_i] and saved_i fp32 [groups, max_rows * n_i,
row_i], contiguous; slots, accepted [S] int64. Grid (states, S): program (i, b) copies the n_i
rows of sequence b's checkpoint after group accepted[b] over its live state, BLOCK floats a step
(16-byte vectors). The table's addresses become pointers in the kernel (int64 -> pointer), so one
launch serves states of different shapes. CUDA-graph safe: nothing is read on the host.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch

TABLE_COLUMNS = 6
BLOCK = 1024  # floats a copy step: 4 warps x 32 threads x 8


@triton.jit
def _state_commit_kernel(table_ptr, slots_ptr, accepted_ptr, BLOCK: tl.constexpr, PDL: tl.constexpr = False):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    i = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    entry = table_ptr + i * 6
    state = tl.load(entry).to(tl.pointer_type(tl.float32))
    saved = tl.load(entry + 1).to(tl.pointer_type(tl.float32))
    n = tl.load(entry + 2)
    row = tl.load(entry + 3)
    slots_total = tl.load(entry + 4)
    group_stride = tl.load(entry + 5)
    slot = tl.load(slots_ptr + b)
    kept = tl.load(accepted_ptr + b)
    for t in range(n):
        src = saved + kept * group_stride + (b * n + t) * row
        dst = state + (t * slots_total + slot) * row
        for start in range(0, row, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(dst + offs, tl.load(src + offs, mask=offs < row), mask=offs < row)


def commit_table(stacked: list[torch.Tensor], saved: list[torch.Tensor]) -> torch.Tensor:
    """The kernel's int64 table [states, TABLE_COLUMNS] (on the states' device)."""
    rows = []
    for state, copies in zip(stacked, saved):
        n, slots = state.shape[:2]
        row = state[0, 0].numel()
        rows.append([state.data_ptr(), copies.data_ptr(), n, row, slots, copies.stride(0)])
    return torch.tensor(rows, dtype=torch.int64).to(stacked[0].device)


def state_commit_triton(table: torch.Tensor, slots: torch.Tensor, accepted: torch.Tensor) -> None:
    if table.shape[0] == 0 or slots.shape[0] == 0:
        return
    # num_stages 1: the copy loops are not software-pipelined (no dot; registers stay low)
    _state_commit_kernel[(table.shape[0], slots.shape[0])](table, slots, accepted, BLOCK=BLOCK, num_warps=4,
                                                            num_stages=1, **pdl_launch(slots))
