"""The verify step's state commit in one launch (`ops/state_commit.py`): the Triton kernel
(interpreted on the CPU) against the formula of state_commit_reference.py, over two state objects
of different shapes (an overlapping compressor's kv / score, an online one's max / sum / acc)."""

import torch

from v4serve.ops.state_commit import StateCommit


def test_state_commit_copies_each_sequences_accepted_checkpoint():
    gen = torch.manual_seed(0)
    groups, max_rows, slots_total = 4, 3, 5
    stacked = [torch.randn(2, slots_total, 8, 6, generator=gen), torch.randn(3, slots_total, 16, generator=gen)]
    saved = [torch.randn(groups, max_rows * s.shape[0], *s.shape[2:], generator=gen) for s in stacked]
    slots, accepted = torch.tensor([3, 0]), torch.tensor([2, 0])  # two sequences in a 3-row step
    want = [s.clone() for s in stacked]
    for state, copies in zip(want, saved):  # the formula, written out
        n = state.shape[0]
        for b, (slot, a) in enumerate(zip(slots.tolist(), accepted.tolist())):
            for t in range(n):
                state[t, slot] = copies[a, b * n + t]
    for impl in ("torch", "triton"):
        got = [s.clone() for s in stacked]
        StateCommit(got, saved, impl=impl)(slots, accepted)
        assert all(torch.equal(g, w) for g, w in zip(got, want)), impl
    assert not torch.equal(want[0], stacked[0]) and torch.equal(want[1][:, 1], stacked[1][:, 1])  # slot 1 untouched
