"""Tensor-parallel tests reuse the transformers oracle checkpoints of tests/model."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(__file__)), "model"))

# o_lora_rank 32 / moe_intermediate_size 64: each rank's widths at TP 2 are whole scale blocks (the
# writer's defaults, 24 / 32, would split o_b_proj's 32-column FP8 blocks and the 32-channel MXFP4
# groups, which sharding refuses).
QUANTIZED_TP_SHAPES = {"o_lora_rank": 32, "moe_intermediate_size": 64}


def _quantized_checkpoint(tmp_path_factory, naming: str) -> str:
    from quantized_writer import make_quantized_oracle

    path = tmp_path_factory.mktemp(f"quantized_tp_{naming}")
    make_quantized_oracle(path, naming, overrides=QUANTIZED_TP_SHAPES)
    return str(path)


@pytest.fixture(scope="session")
def quantized_tp_checkpoint(tmp_path_factory) -> str:
    """An official-format FP8 / MXFP4 checkpoint (tests/model/quantized_writer.py) that TP 2 can cut:
    per-expert packed tensors, ue8m0 scales in other shards than their weights."""
    return _quantized_checkpoint(tmp_path_factory, "official")


@pytest.fixture(scope="session")
def quantized_tp_checkpoint_hf(tmp_path_factory) -> str:
    """The same weights under transformers' names: fused packed experts, fp32 FP8 scales."""
    return _quantized_checkpoint(tmp_path_factory, "transformers")
