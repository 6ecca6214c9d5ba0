"""Triton kernel of the verify step's state commit (math: state_commit_reference.py): every state
object of every compressor in one launch.

Layouts: one int64 table row per state object i, built once (the tensors never move):
[stacked_i address, saved_i address, written_i address, n_i, sub-rows a slot sub_i, floats a
sub-row w_i, slots of the cache, saved_i's group stride in floats, written_i's group stride,
groups]; stacked_i fp32 [n_i, slots, sub_i * w_i], saved_i fp32 [groups, max_rows * n_i,
sub_i * w_i], written_i int32 [groups, max_rows], contiguous; slots, accepted [S] int64.
Grid (states, S): program (i, b) undoes groups groups - 1 .. accepted[b] + 1 of sequence b, last
first: the sub-rows in written_i[g, b] of saved_i[g], entry b * n_i + t, over the live rows,
BLOCK floats a step (16-byte vectors). A sub-row undone twice is written by the same thread both
times (same offsets, same tile), so the earlier group's copy lands last. All accepted (the
common case): nothing moves. The table's addresses become pointers in the kernel (int64 ->
pointer), so one launch serves states of different shapes. CUDA-graph safe: nothing is read on
the host.
"""

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from v4serve.ops._dispatch import pdl_launch

TABLE_COLUMNS = 10
BLOCK = 1024  # floats a copy step: 4 warps x 32 threads x 8


@triton.jit
def _state_commit_kernel(table_ptr, slots_ptr, accepted_ptr, BLOCK: tl.constexpr, COLUMNS: tl.constexpr,
                         PDL: tl.constexpr = False):
    if PDL:
        gdc_wait()  # the previous kernel (launched before us, see pdl_launch) has finished
    i = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    entry = table_ptr + i * COLUMNS  # the table row: commit_table's columns, in its order
    state = tl.load(entry).to(tl.pointer_type(tl.float32))
    saved = tl.load(entry + 1).to(tl.pointer_type(tl.float32))
    written = tl.load(entry + 2).to(tl.pointer_type(tl.int32))
    n = tl.load(entry + 3)
    sub = tl.load(entry + 4)
    width = tl.load(entry + 5)
    slots_total = tl.load(entry + 6)
    group_stride = tl.load(entry + 7)
    written_stride = tl.load(entry + 8)
    groups = tl.load(entry + 9)
    slot = tl.load(slots_ptr + b)
    kept = tl.load(accepted_ptr + b)
    for step in range(groups - 1 - kept):
        g = groups - 2 - step
        mask = tl.load(written + g * written_stride + b)
        for t in range(n):
            for x in range(sub):
                if (mask >> x) & 1:
                    src = saved + g * group_stride + ((b * n + t) * sub + x) * width
                    dst = state + ((t * slots_total + slot) * sub + x) * width
                    for start in range(0, width, BLOCK):
                        offs = start + tl.arange(0, BLOCK)
                        tl.store(dst + offs, tl.load(src + offs, mask=offs < width), mask=offs < width)


def commit_table(stacked: list[torch.Tensor], saved: list[torch.Tensor], written: list[torch.Tensor]) -> torch.Tensor:
    """The kernel's int64 table [states, TABLE_COLUMNS] (on the states' device)."""
    rows = []
    for state, copies, masks in zip(stacked, saved, written):
        n, slots = state.shape[:2]
        width = state.shape[-1]
        rows.append([state.data_ptr(), copies.data_ptr(), masks.data_ptr(), n, state[0, 0].numel() // width, width,
                     slots, copies.stride(0), masks.stride(0), copies.shape[0]])
    return torch.tensor(rows, dtype=torch.int64).to(stacked[0].device)


def state_commit_triton(table: torch.Tensor, slots: torch.Tensor, accepted: torch.Tensor) -> None:
    if table.shape[0] == 0 or slots.shape[0] == 0:
        return
    # num_stages 1: the copy loops are not software-pipelined (no dot; registers stay low)
    _state_commit_kernel[(table.shape[0], slots.shape[0])](table, slots, accepted, BLOCK=BLOCK,
                                                            COLUMNS=TABLE_COLUMNS, num_warps=4, num_stages=1,
                                                            **pdl_launch(slots))
