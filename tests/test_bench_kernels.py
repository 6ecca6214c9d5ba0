"""`v4serve bench kernels` builds its cases on any device (timing needs a GPU): the mHC rows run
through the ops' reference paths on the CPU and report the bytes they must move."""

from __future__ import annotations

import torch

from v4serve.bench.kernels import build
from v4serve.bench.shapes import all_shapes


def test_mhc_rows_build_and_run_on_the_cpu():
    shapes = {name: spec for name, spec in all_shapes().items() if spec[0] == "mhc"}
    assert set(shapes) == {f"mhc {op} T{t}" for op in ("mix", "coefficients") for t in (1, 8, 64)}
    for name, (kind, (op, T)) in shapes.items():
        if T > 8:
            continue
        fn, nbytes, flops, _ = build(kind, (op, T), "cpu")
        out = fn()
        assert out.shape == ((T, 24) if op == "mix" else (T, 4, 4)), name
        assert torch.isfinite(out).all() and nbytes > 0 and (flops > 0) == (op == "mix"), name
