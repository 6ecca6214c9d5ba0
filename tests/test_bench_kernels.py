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


def test_launch_glue_rows_compute_what_their_unglued_rows_compute_on_the_cpu():
    """Each `glue` row and its `unglue` row (the launches it replaced) give the same result."""
    shapes = {name: spec for name, spec in all_shapes().items() if spec[0].startswith("glue_")}
    assert len(shapes) == 8
    for name, (kind, args) in shapes.items():
        if not name.startswith("glue ") or args[0] > 1:
            continue
        glued, nbytes, _, _ = build(kind, args, "cpu")
        unglued = build(kind, (*args[:-1], False), "cpu")[0]
        got, want = glued(), unglued()
        got = got[1] if isinstance(got, tuple) else got  # the pair: (kv, q_a_norm(q_low))
        assert nbytes > 0 and torch.equal(got, want), name
