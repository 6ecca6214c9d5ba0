"""The MTP drafts' FP8 head (speculative_config draft_head="fp8"): the lm head quantized chunk by chunk
is the whole weight quantized at once, its bytes are what the offload placement keeps free, and it
needs the MTP layers. (Output exactness with it: tests/engine/test_spec_decode.py.)"""

from __future__ import annotations

import pytest
import torch

from v4serve.model import loader
from v4serve.model.deepseek_v4 import FP8_DRAFT_HEAD_BLOCK
from v4serve.model.quantized import FP8Linear
from v4serve.ops.weight_formats import fp8_weight_bytes, quantize_fp8_blocks


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows_per_chunk", [1, 128, 200, 8192])
def test_chunked_quantization_is_the_whole_weights(dtype, rows_per_chunk):
    """300 x 200 (partial blocks both ways), chunks of whole 128-row blocks: the same codes and scales."""
    gen = torch.Generator().manual_seed(0)
    w = (torch.randn(300, 200, generator=gen) * torch.logspace(-3, 2, 300)[:, None]).to(dtype)
    module = FP8Linear.quantized_from(w, (128, 128), rows_per_chunk)
    codes, scale = quantize_fp8_blocks(w, (128, 128))
    assert torch.equal(module.weight.view(torch.uint8), codes.view(torch.uint8))
    assert torch.equal(module.weight_scale_inv, scale)
    assert module.weight.nbytes + module.weight_scale_inv.nbytes == fp8_weight_bytes(300, 200, (128, 128))


def test_the_placement_keeps_the_heads_bytes_free(monkeypatch):
    seen = []
    real = loader.plan_placement
    monkeypatch.setattr(loader, "plan_placement", lambda *a, **k: seen.append(a[4]) or real(*a, **k))
    net, config = loader.build_model("tiny", "cpu", torch.float32, progress=False, mtp=True, draft_head="fp8",
                                     reserve_bytes=1000)
    head = net.draft_head
    assert seen == [1000 + head.weight.nbytes + head.weight_scale_inv.nbytes]
    assert head.block == FP8_DRAFT_HEAD_BLOCK and tuple(head.weight.shape) == (config.vocab_size, config.hidden_size)
    codes, scale = quantize_fp8_blocks(net.lm_head.weight, FP8_DRAFT_HEAD_BLOCK)
    assert torch.equal(head.weight.view(torch.uint8), codes.view(torch.uint8)) and torch.equal(head.weight_scale_inv, scale)


def test_it_needs_the_mtp_layers():
    with pytest.raises(ValueError, match="draft_head"):
        loader.build_model("tiny", "cpu", torch.float32, progress=False, draft_head="fp8")
