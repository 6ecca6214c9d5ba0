"""Benchmark rows of the decode step's small kernels that session 12's fusions changed, each beside
the launch sequence it replaced where that still runs (`bench kernels --only 'fused '`):

* `fused mhc coefficients T{T}`: the mixer with its coefficients epilogue (one launch; the two
  launches it replaced are the `mhc mix` + `mhc coefficients` rows);
* `fused mhc expand coefficients T{T}`: the attention's expand fused with the ffn's mixer and
  coefficients (one launch) against `unfused ...` (hc_expand, then the mixer with its epilogue);
* `fused mhc head T1`: the head's pre (the mixer's HEAD_PRE epilogue) and its collapse with the
  final norm (2 launches) against `unfused mhc head T1` (mixer, 5 torch elementwise, collapse, norm);
* `fused mhc collapse norm T{T}` (the collapse with the sublayer's RMSNorm, one launch) against
  `unfused mhc collapse norm T{T}` (the collapse kernel, then the norm kernel);
* `fused index query T{T}` (RoPE + Hadamard in the norm_rope kernel) against `unfused index query
  T{T}` (the RoPE kernel, then the 24-launch torch Hadamard it replaced): 64 heads x 128, T tokens;
* `fused hadamard R{rows}`: the standalone kernel (prefill's index keys), rows x 128 bf16;
* `fused compressor proj {csa|hca} M{m} {bf16|fp32}`: the compressor / indexer projections of a
  Flash layer (CSA: 2624 rows, HCA: 1024, K 4096), bf16 weights multiplied into fp32 by cuBLAS
  (production) against the fp32 weights and the widening of x they replaced.
(The grouped output projection's rows, `unfused o_a einsum` / `fp8 blockdiag o_a`, moved to
bench/o_a_case.py once o_a_proj was kept in FP8: `o_a ...`.)
"""

import torch
import torch.nn.functional as F

from v4serve.ops.hadamard import hadamard
from v4serve.ops.hc_collapse import hc_collapse
from v4serve.ops.hc_expand import hc_expand
from v4serve.ops.hc_expand_coefficients import hc_expand_coefficients
from v4serve.ops.hc_head_pre import hc_head_pre
from v4serve.ops.hc_mix import hc_mix
from v4serve.ops.hadamard_reference import hadamard_reference
from v4serve.ops.hc_stream_coefficients import hc_stream_coefficients
from v4serve.ops.norm_rope import rms_norm_rope

HIDDEN, INDEX_HEADS, INDEX_DIM, ROPE_PAIRS = 4096, 64, 128, 32
COMPRESSOR_ROWS = {"csa": 2 * 1024 + 2 * 256 + 64, "hca": 2 * 512}  # kv + gate (+ indexer kv, gate, weights)
ROUTED_EXPERTS = 256


def decode_fusion_shapes() -> dict:
    shapes = {}
    for T in (1, 8, 64):
        shapes[f"fused mhc coefficients T{T}"] = ("fused_mhc", (T,))
    for fused in (True, False):
        shapes[f"{'' if fused else 'un'}fused mhc head T1"] = ("fused_mhc_head", (1, fused))
    for T in (1, 8):
        for fused in (True, False):
            shapes[f"{'' if fused else 'un'}fused mhc expand coefficients T{T}"] = ("fused_mhc_expand", (T, fused))
    for T in (1, 8, 64):
        for fused in (True, False):
            shapes[f"{'' if fused else 'un'}fused mhc collapse norm T{T}"] = ("fused_collapse_norm", (T, fused))
    for T in (1, 8):
        for fused in (True, False):
            shapes[f"{'' if fused else 'un'}fused index query T{T}"] = ("fused_index_query", (T, fused))
    shapes["fused hadamard R2048"] = ("fused_hadamard", (2048,))
    for layer in COMPRESSOR_ROWS:
        for m in (1, 8):
            for dtype in ("bf16", "fp32"):
                shapes[f"fused compressor proj {layer} M{m} {dtype}"] = ("fused_compressor", (layer, m, dtype))
    return shapes


def build_decode_fusion(kind, args, device, seed=0, mhc_case=None):
    """-> (fn, bytes, flops, bytes of one input set). `mhc_case`: bench.shapes.mhc_case."""
    g = torch.Generator(device=device).manual_seed(seed)
    if kind == "fused_mhc":
        (T,) = args
        streams, fn, base, scale = mhc_case(T, device=device, seed=seed)
        x, n = streams.flatten(1), streams.shape[1]
        tickets = torch.zeros(1024, dtype=torch.int32, device=device)
        nbytes = x.numel() * 2 + fn.numel() * 4 + T * (2 * n + n * n) * 4
        return (lambda: hc_stream_coefficients(x, fn, 1e-6, base, scale, n, 20, 1e-6, tickets)[2]), nbytes, \
            2 * T * fn.numel(), nbytes
    if kind == "fused_mhc_expand":  # the attention's expand, then the ffn's mixer + coefficients
        T, fused = args
        streams, fn, base, scale = mhc_case(T, device=device, seed=seed)
        n = streams.shape[1]
        output = torch.randn(T, HIDDEN, generator=g, device=device).bfloat16()
        post = 2 * torch.rand(T, n, generator=g, device=device)
        comb = torch.softmax(torch.randn(T, n, n, generator=g, device=device), dim=1)
        tickets = torch.zeros(64, dtype=torch.int32, device=device)
        nbytes = 3 * streams.numel() * 2 + output.numel() * 2 + fn.numel() * 4
        if fused:
            return (lambda: hc_expand_coefficients(output, streams, post, comb, fn, 1e-6, base, scale, n, 20, 1e-6,
                                                   tickets)[3]), nbytes, 2 * T * fn.numel(), nbytes

        def unfused():
            new_streams = hc_expand(output, streams, post, comb)
            return hc_stream_coefficients(new_streams.flatten(1), fn, 1e-6, base, scale, n, 20, 1e-6, tickets)[2]
        return unfused, nbytes, 2 * T * fn.numel(), nbytes
    if kind == "fused_mhc_head":  # the head: pre, collapse and the final norm (2 launches; 8 unfused)
        T, fused = args
        streams, fn, base, scale = mhc_case(T, device=device, seed=seed)
        x, n = streams.flatten(1), streams.shape[1]
        fn, base, scale = fn[:n].contiguous(), base[:n].contiguous(), scale[:1].contiguous()
        weight = (torch.rand(HIDDEN, generator=g, device=device) + 0.5).bfloat16()
        tickets = torch.zeros(64, dtype=torch.int32, device=device)
        nbytes = x.numel() * 2 + fn.numel() * 4 + T * HIDDEN * 2
        if fused:
            return (lambda: hc_collapse(streams, hc_head_pre(x, fn, 1e-6, base, scale, 1e-6, tickets), weight,
                                        1e-6)), nbytes, 2 * T * fn.numel(), nbytes

        def unfused():
            mixes, row_scale = hc_mix(x, fn, 1e-6, tickets)
            pre = torch.sigmoid(mixes * (row_scale[:, None] * scale) + base) + 1e-6
            return rms_norm_rope(hc_collapse(streams, pre), 1e-6, weight)
        return unfused, nbytes, 2 * T * fn.numel(), nbytes
    if kind == "fused_collapse_norm":
        T, fused = args
        streams = mhc_case(T, device=device, seed=seed)[0]
        pre = torch.rand(T, streams.shape[1], generator=g, device=device) + 0.1
        weight = (torch.rand(HIDDEN, generator=g, device=device) + 0.5).bfloat16()
        nbytes = streams.numel() * 2 + T * HIDDEN * 2 + HIDDEN * 2
        if fused:
            return (lambda: hc_collapse(streams, pre, weight, 1e-6)), nbytes, 0, nbytes
        return (lambda: rms_norm_rope(hc_collapse(streams, pre), 1e-6, weight)), nbytes, 0, nbytes
    if kind == "fused_index_query":
        T, fused = args
        q = torch.randn(T, INDEX_HEADS, INDEX_DIM, generator=g, device=device).bfloat16()
        angles = torch.rand(T, ROPE_PAIRS, generator=g, device=device) * 6.28
        cos, sin = angles.cos(), angles.sin()
        nbytes = 2 * q.numel() * 2
        if fused:
            return (lambda: rms_norm_rope(q, cos=cos, sin=sin, hadamard=True)), nbytes, 0, nbytes
        return (lambda: hadamard_reference(rms_norm_rope(q, cos=cos, sin=sin))), nbytes, 0, nbytes
    if kind == "fused_hadamard":
        (rows,) = args
        keys = torch.randn(rows, INDEX_DIM, generator=g, device=device).bfloat16()
        return (lambda: hadamard(keys)), 2 * keys.numel() * 2, 0, 2 * keys.numel() * 2
    if kind == "fused_compressor":
        layer, m, dtype = args
        n = COMPRESSOR_ROWS[layer]
        x = torch.randn(m, HIDDEN, generator=g, device=device).bfloat16()
        w = (torch.randn(n, HIDDEN, generator=g, device=device) * 0.02).bfloat16()
        flops = 2 * m * n * HIDDEN
        if dtype == "bf16":
            nbytes = w.numel() * 2 + m * (HIDDEN * 2 + n * 4)
            return (lambda: torch.mm(x, w.t(), out_dtype=torch.float32)), nbytes, flops, nbytes
        w32 = w.float()
        nbytes = w32.numel() * 4 + m * (HIDDEN * 2 + n * 4)
        return (lambda: F.linear(x.float(), w32)), nbytes, flops, nbytes
    raise ValueError(f"not a decode-fusion row: {kind}")
