"""Triton kernel of the MoE pick groups (math: moe_pick_groups_reference.py).

Grid (cdiv(P, BLOCK_P),): a program owns BLOCK_P picks p and walks every pick q in blocks of
BLOCK_Q, comparing expert ids ([BLOCK_P, BLOCK_Q] a step; P <= a few hundred, a decode batch's
picks). With same[p, q] = (e_q == e_p):

    rank[p]   = #{q < p : same}                                   p leads iff rank[p] % G == 0
    nth[p, q] = #{q' : p < q' <= q, same[p, q']}                  q's place among p's later picks
    members[p, nth[p, q]] = q   for same[p, q], q > p, nth < G    (a scatter: one q a slot)
    members[p, 0] = p

The program first fills its rows with -1, then stores slot 0 and scatters the later picks as it
walks (nth carries across blocks as a running count), and last clears the rows whose pick does not
lead (a barrier between the phases: the same rows, other threads). Ids are compared as loaded (any
integer dtype); padding lanes read sentinels that match nothing (ids are >= 0).
"""

import torch
import triton
import triton.language as tl

BLOCK_P, BLOCK_Q = 32, 64


@triton.jit
def _moe_pick_groups_kernel(experts_ptr, members_ptr, P, GROUP: tl.constexpr, BLOCK_P: tl.constexpr,
                            BLOCK_Q: tl.constexpr):
    p = tl.program_id(0) * BLOCK_P + tl.arange(0, BLOCK_P)
    on = p < P
    e_p = tl.load(experts_ptr + p, mask=on, other=-1)
    g = tl.arange(0, GROUP)[None, :]
    rows = members_ptr + p[:, None] * GROUP + g
    tl.store(rows, tl.where(g == 0, p[:, None], -1), mask=on[:, None])
    tl.debug_barrier()
    rank = tl.zeros([BLOCK_P], tl.int32)
    after = tl.zeros([BLOCK_P], tl.int32)
    for q0 in range(0, P, BLOCK_Q):
        q = q0 + tl.arange(0, BLOCK_Q)
        same = e_p[:, None] == tl.load(experts_ptr + q, mask=q < P, other=-2)[None, :]
        rank += tl.sum((same & (q[None, :] < p[:, None])).to(tl.int32), 1)
        later = (same & (q[None, :] > p[:, None])).to(tl.int32)
        nth = after[:, None] + tl.cumsum(later, 1)
        tl.store(members_ptr + p[:, None] * GROUP + nth, q[None, :] + 0 * nth, mask=(later == 1) & (nth < GROUP))
        after += tl.sum(later, 1)
    tl.debug_barrier()
    tl.store(rows, tl.full([BLOCK_P, GROUP], -1, tl.int32), mask=(on & (rank % GROUP != 0))[:, None])


def moe_pick_groups_triton(experts: torch.Tensor, group: int) -> torch.Tensor:
    picks = experts.numel()
    members = torch.empty(picks, group, dtype=torch.int32, device=experts.device)
    if picks:
        _moe_pick_groups_kernel[(triton.cdiv(picks, BLOCK_P),)](experts, members, picks, GROUP=group, BLOCK_P=BLOCK_P,
                                                                BLOCK_Q=BLOCK_Q, num_warps=8)
    return members
