"""The MoE pick groups (ops/moe_pick_groups.py): the kernel (interpreted on the CPU) against the
torch reference, and the reference against the groups written out by hand."""

import pytest
import torch

from v4serve.ops.moe_pick_groups import moe_pick_groups


def test_the_groups_written_out():
    # expert 5: picks 0, 2, 3, 6, 7 (groups of 2: led by 0 and 3, and 7 alone); expert 1: picks 1, 4;
    # expert 9: pick 5
    experts = torch.tensor([5, 1, 5, 5, 1, 9, 5, 5])
    want = torch.full((8, 2), -1, dtype=torch.int32)
    want[0], want[3], want[7], want[1], want[5] = (torch.tensor(r, dtype=torch.int32)
                                                   for r in ([0, 2], [3, 6], [7, -1], [1, 4], [5, -1]))
    assert torch.equal(moe_pick_groups(experts, 2, impl="torch"), want)


@pytest.mark.parametrize("picks, n_experts, dtype", [(48, 256, torch.int64), (120, 6, torch.int32),
                                                     (7, 3, torch.int64), (200, 1, torch.int64), (1, 4, torch.int32)])
def test_the_kernel_matches_the_reference(picks, n_experts, dtype):
    """Uniform ids (c8's 48 picks over 256), few experts (runs longer than a group, several leads an
    expert), one expert for every pick (runs across the kernel's 64-pick blocks), a single pick."""
    experts = torch.randint(0, n_experts, (picks,), generator=torch.Generator().manual_seed(picks), dtype=dtype)
    got = moe_pick_groups(experts, 8, impl="triton")
    want = moe_pick_groups(experts, 8, impl="torch")
    assert torch.equal(got, want)
    led = want[want[:, 0] >= 0]
    served = led[led >= 0]  # every pick is served exactly once, by its group's lead
    assert torch.equal(served.sort().values, torch.arange(picks, dtype=torch.int32))


def test_bad_input_is_named():
    with pytest.raises(ValueError, match="experts must be contiguous integer ids"):
        moe_pick_groups(torch.zeros(4, 2, dtype=torch.int64), 8)
    with pytest.raises(ValueError, match="group must be a power of two"):
        moe_pick_groups(torch.zeros(4, dtype=torch.int64), 6)


@pytest.mark.gpu
def test_the_compiled_kernel_matches_the_reference_gpu():
    """c64's 384 uniform picks and a verify batch whose 192 picks share 6 experts, compiled."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    for experts in (torch.randint(0, 256, (384,), device="cuda"), torch.arange(6, device="cuda").repeat(32)):
        assert torch.equal(moe_pick_groups(experts, 8), moe_pick_groups(experts, 8, impl="torch"))
