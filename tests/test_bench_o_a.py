"""The grouped output projection's benchmark rows (`bench kernels --only 'o_a '`) build on any
device; on the CPU they run the op's reference path and give o_b_proj's [T, G*R] input."""

import torch

from v4serve.bench.kernels import build
from v4serve.bench.shapes import all_shapes


def test_o_a_rows_build_and_run_on_the_cpu():
    shapes = {name: spec for name, spec in all_shapes().items() if spec[0] == "o_a"}
    assert {"o_a bf16 einsum T1", "o_a fp8 blockdiag T2", "o_a fp8 groups T2048"} <= set(shapes)
    fn, nbytes, flops, _ = build(*shapes["o_a fp8 blockdiag T2"], "cpu")
    out = fn()
    assert out.shape == (2, 8 * 1024) and torch.isfinite(out.float()).all()
    assert nbytes > 8 * 1024 * 4096 and flops == 2 * 2 * 8 * 1024 * 4096
