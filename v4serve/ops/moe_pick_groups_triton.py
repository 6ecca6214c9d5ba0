"""Triton kernel of the MoE pick groups (math: moe_pick_groups_reference.py).

Grid (cdiv(P, BLOCK),): a program owns BLOCK picks p and walks every pick q in blocks of BLOCK,
comparing expert ids ([BLOCK, BLOCK] a step, BLOCK 32; P <= a few hundred: a decode batch's picks):

    rank[p]  += #{q < p : e_q == e_p}                        (p leads iff rank[p] % G == 0)
    nth[p, q] = after[p] + #{q' in this block, p < q' <= q : e_q' == e_p}   (a running count)
    members[p, j] = the q > p with e_q == e_p and nth[p, q] == j,  j = 1 .. G - 1
    members[p, 0] = p

and stores members [P, G] int32 (row p all -1 unless p leads). Ids are compared as loaded (any
integer dtype); padding lanes read sentinels that match nothing (ids are >= 0).
"""

import torch
import triton
import triton.language as tl

BLOCK = 32


@triton.jit
def _moe_pick_groups_kernel(experts_ptr, members_ptr, P, GROUP: tl.constexpr, BLOCK: tl.constexpr):
    p = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    e_p = tl.load(experts_ptr + p, mask=p < P, other=-1)
    g = tl.arange(0, GROUP)[None, :]
    members = tl.where(g == 0, p[:, None], -1)
    rank = tl.zeros([BLOCK], tl.int32)
    after = tl.zeros([BLOCK], tl.int32)
    for q0 in range(0, P, BLOCK):
        q = q0 + tl.arange(0, BLOCK)
        same = e_p[:, None] == tl.load(experts_ptr + q, mask=q < P, other=-2)[None, :]
        rank += tl.sum((same & (q[None, :] < p[:, None])).to(tl.int32), 1)
        later = (same & (q[None, :] > p[:, None])).to(tl.int32)
        nth = after[:, None] + tl.cumsum(later, 1)
        for j in tl.static_range(1, GROUP):
            at = tl.max(tl.where((later == 1) & (nth == j), q[None, :], -1), 1)[:, None]
            members = tl.where((g == j) & (at >= 0), at, members)
        after += tl.sum(later, 1)
    members = tl.where((rank % GROUP == 0)[:, None], members, -1)
    tl.store(members_ptr + p[:, None] * GROUP + g, members, mask=(p < P)[:, None])


def moe_pick_groups_triton(experts: torch.Tensor, group: int) -> torch.Tensor:
    picks = experts.numel()
    members = torch.empty(picks, group, dtype=torch.int32, device=experts.device)
    if picks:
        _moe_pick_groups_kernel[(triton.cdiv(picks, BLOCK),)](experts, members, picks, GROUP=group, BLOCK=BLOCK,
                                                              num_warps=4)
    return members
