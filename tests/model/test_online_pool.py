"""The online softmax pool of non-overlapping compressors equals pooling the block at once,
however the block's tokens arrive."""

import pytest
import torch

from v4serve.ops.compress_decode_reference import fold_online
from v4serve.ops.gated_pool import gated_pool


@pytest.mark.parametrize("pieces", [[16], [1] * 16, [3, 5, 8], [15, 1]])
def test_folding_in_pieces_equals_pooling_at_once(pieces):
    gen = torch.Generator().manual_seed(len(pieces))
    kv, score = torch.randn(16, 40, generator=gen), torch.randn(16, 40, generator=gen) * 4
    running_max, total, acc = torch.full((40,), float("-inf")), torch.zeros(40), torch.zeros(40)
    start = 0
    for n in pieces:
        running_max, total, acc = fold_online(running_max, total, acc, kv[start:start + n], score[start:start + n])
        start += n
    want = gated_pool(kv[None], score[None], out_dtype=torch.float32, impl="torch")[0]
    torch.testing.assert_close(acc / total, want, rtol=1e-5, atol=1e-6)
    # The independent formula: per channel, sum_r kv * softmax_r(score).
    torch.testing.assert_close(acc / total, (kv * torch.softmax(score, dim=0)).sum(0), rtol=1e-5, atol=1e-6)
