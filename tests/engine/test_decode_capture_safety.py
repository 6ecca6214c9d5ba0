"""The decode step the CUDA-graph runner captures (`DecodeRunner._forward`) runs no op that breaks a
capture (`tests/capture_guard.py`: host syncs, mask indexing, tensors built from host lists), with
the torch reference kernels, over plain and packed pools.

On the H200, kernels="torch" with kv_cache_dtype="auto" failed its capture
(cudaErrorStreamCaptureInvalidated, then eager decoding): the packed stores of the torch path
selected their kept rows with a boolean mask (a `nonzero`), and fp4 rows were decoded through a
grid tensor built from a host list. This checks the same step on the CPU. (The Triton kernels under
the interpreter take ~9 minutes here for the same step: not run in CI; they captured on the GPU.)"""

from __future__ import annotations

import pytest
import torch

from capture_guard import NoCaptureBreakingOps
from v4serve.engine import Engine, EngineArgs, SamplingParams

torch.set_num_threads(1)

PACKABLE = {"head_dim": 192, "qk_rope_head_dim": 64, "index_head_dim": 128}  # room for the native formats


@pytest.mark.parametrize("kv_cache_dtype", ["bf16", "auto"])
def test_torch_decode_step_is_capture_safe(kv_cache_dtype):
    engine = Engine(EngineArgs(model="tiny", device="cpu", dtype="bfloat16", max_num_seqs=4, kernels="torch",
                               kv_cache_dtype=kv_cache_dtype, progress=False,
                               hf_overrides=PACKABLE if kv_cache_dtype == "auto" else None))
    assert engine.runner.cache_format_note is None, "the packed formats must be in use"
    runner = engine.decode_runner
    forward, checked = runner._forward, []

    def guarded(n):
        with NoCaptureBreakingOps():
            out = forward(n)
        checked.append(n)
        return out

    runner._forward = guarded
    # 33 tokens: the ratio-4 and ratio-32 compressors complete blocks (and their indexer keys) in decode.
    for i, n in enumerate((5, 30, 33)):
        engine.add_request(str(i), list(range(10, 10 + n)), SamplingParams(temperature=0.0, max_tokens=4,
                                                                            ignore_eos=True))
    while engine.has_unfinished():
        engine.step()
    assert checked, "decode steps must have run through the runner"


def test_the_guard_refuses_what_breaks_a_capture():
    x = torch.arange(6)
    for bad in (lambda: x[x > 2], lambda: x.sum().item(), lambda: torch.tensor([1, 2]), lambda: x.nonzero(),
                lambda: torch.repeat_interleave(x)):
        with pytest.raises(AssertionError), NoCaptureBreakingOps():
            bad()
    with NoCaptureBreakingOps():  # what captures: index tensors, scalar operands, sized repeat_interleave
        x[x.clamp(max=2)]
        torch.where(x > 2, 0.5, x.float())
        torch.repeat_interleave(x, 2)
