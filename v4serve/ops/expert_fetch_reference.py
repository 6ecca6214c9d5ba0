"""Torch reference of the expert fetch: copy the rows of a copy list from a source tensor (host
memory when experts are offloaded) into device rows.

    for j < copy_count:  dst[dst_row0 + copy_slot[j]] = src[copy_src[j]]

src [H, ...] and dst [R + S, ...] have the same row shape and dtype; `copy_count` [1],
`copy_slot` [S], `copy_src` [S] are int64 (expert_cache_plan writes them). The reference reads the
count on the host (a synchronisation on CUDA): it is the readable statement and the CPU path; the
kernel (expert_fetch_triton.py) reads it on the device.
"""

import torch


def expert_fetch_reference(src: torch.Tensor, dst: torch.Tensor, copy_count: torch.Tensor, copy_slot: torch.Tensor,
                           copy_src: torch.Tensor, dst_row0: int) -> None:
    m = int(copy_count.item())
    slots, rows = copy_slot[:m].tolist(), copy_src[:m].tolist()
    for slot, row in zip(slots, rows):
        dst[dst_row0 + slot].copy_(src[row])
