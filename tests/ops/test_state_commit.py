"""The verify step's state commit in one launch (`ops/state_commit.py`): the Triton kernel
(interpreted on the CPU) against the undo formula of state_commit_reference.py written out, over
two state objects of different shapes (an overlapping compressor's kv / score rows of 8 sub-rows,
an online one's max / sum / acc) and random journals (sub-rows undone by several groups too)."""

import torch

from v4serve.ops.state_commit import StateCommit


def test_state_commit_undoes_the_groups_after_each_sequences_accepted_one():
    gen = torch.manual_seed(0)
    groups, max_rows, slots_total = 4, 3, 5
    stacked = [torch.randn(2, slots_total, 8, 6, generator=gen), torch.randn(3, slots_total, 16, generator=gen)]
    saved = [torch.randn(groups, max_rows * s.shape[0], *s.shape[2:], generator=gen) for s in stacked]
    written = [torch.randint(0, 256, (groups, max_rows), generator=gen, dtype=torch.int32),
               torch.randint(0, 2, (groups, max_rows), generator=gen, dtype=torch.int32)]
    written[0][:, 0] = 0b1001_0110  # sequence 0: sub-rows 1, 2, 4, 7 in every group (undone several times)
    slots, accepted = torch.tensor([3, 0, 1]), torch.tensor([1, 3, 0])
    want = [s.clone() for s in stacked]
    for state, copies, masks in zip(want, saved, written):  # the formula, written out
        n = state.shape[0]
        for b, (slot, a) in enumerate(zip(slots.tolist(), accepted.tolist())):
            for g in range(groups - 2, a - 1, -1):
                for t in range(n):
                    rows = state[t, slot].view(-1, state.shape[-1])
                    for x in range(rows.shape[0]):
                        if int(masks[g, b]) >> x & 1:
                            rows[x] = copies[g, b * n + t].view(-1, state.shape[-1])[x]
    for impl in ("torch", "triton"):
        got = [s.clone() for s in stacked]
        StateCommit(got, saved, written, impl=impl)(slots, accepted)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), impl
    assert torch.equal(want[0][:, 0], stacked[0][:, 0])  # sequence 1 accepted everything: nothing moved
    assert not torch.equal(want[0][:, 3], stacked[0][:, 3]) and torch.equal(want[1][:, 2], stacked[1][:, 2])
