"""Modules whose weights stay in the checkpoint's quantized formats.

FP8 block-scaled linear (`FP8Linear`), the official dense format:

    weight        float8_e4m3fn [N, K]                       e4m3 codes
    weight_scale_inv  float32 [ceil(N/bn), ceil(K/bk)]       one multiplier per (bn, bk) block
    W[n, k] = float(weight[n, k]) * weight_scale_inv[n // bn, k // bk]
    y = x W^T            (fp8_linear: weight-only numerics, or with act_block the official
                          e4m3 activation quantization per act_block channels)

ue8m0 checkpoint scales (F8_E8M0: byte b means 2^(b-127)) are widened to fp32 at load; they are
one number per 128x128 block, so fp32 costs nothing. Partial blocks (N or K not a multiple of the
block) use ceil, the last block covering the remainder.

MXFP4 routed experts (`MXFP4Experts`), OCP MXFP4 along K:

    gate_up_proj  uint8 [E, 2I, D/2]   packed e2m1 pairs: element 2j in the low nibble, 2j+1 high
    gate_up_proj_scale_inv uint8 [E, 2I, D/32]   ue8m0 exponent byte per 32 elements along K
    down_proj     uint8 [E, D, I/2],   down_proj_scale_inv uint8 [E, D, I/32]
    W[e, n, k] = e2m1(code) * 2^(scale[e, n, k // 32] - 127)
    e2m1 code c (4 bits): sign = c >> 3, magnitude = (0, .5, 1, 1.5, 2, 3, 4, 6)[c & 7]

Rows 0..I-1 of gate_up are W1 (gate), rows I..2I-1 are W3 (up), as the bf16 `RoutedExperts`.
The forward is `RoutedExperts`' (sort, two grouped matmuls around the clamped SwiGLU, combine)
with `mxfp4_grouped_matmul` in place of `grouped_matmul`, the SwiGLU fused into the gate_up one
(V4 at decode sizes without the sort: `ops/mxfp4_moe_decode.py`, the same bits; or on tensor cores
where `bind_decode` chose them, within the fp32 sum order). The expert tensors can be handed in
explicitly (`run(..., tensors=)`, or `pick_outputs` / `pass_outputs` for the expert outputs
before the combine), which is how `ExpertOffload` runs them from its slots.
"""

from __future__ import annotations

import torch
from torch import nn

from v4serve.config import ModelConfig
from v4serve.model.kernels import UsesKernels
from v4serve.ops.fp8_grouped_linear import BLOCKDIAG_MAX_ROWS, fp8_grouped_linear
from v4serve.ops.fp8_linear import fp8_linear, fp8_linear_swiglu
from v4serve.ops.moe_combine import moe_combine
from v4serve.ops.moe_sort import moe_sort
from v4serve.ops.mxfp4_grouped_matmul import mxfp4_grouped_matmul
from v4serve.ops.mxfp4_moe_decode import combine_counters_size, direct_applies, mxfp4_experts, mxfp4_experts_pass
from v4serve.ops.mxfp4_moe_mma_triton import mma_config, mma_scales_exact
from v4serve.ops.swiglu import clamped_swiglu
from v4serve.ops.weight_formats import MXFP4_BLOCK, dequantize_fp8_blocks, fp8_scale_shape, quantize_fp8_blocks

MX_BLOCK = MXFP4_BLOCK  # elements along K per MXFP4 scale
EXPERT_TENSORS = ("gate_up_proj", "gate_up_proj_scale_inv", "down_proj", "down_proj_scale_inv")


def kept_counters(kept: torch.Tensor | None, size, x: torch.Tensor) -> torch.Tensor | None:
    """The int32 arrival counters a module keeps for its kernels' last-arriving programs (which
    leave them at zero): `kept` while it lives on x's CUDA device, else `size()` zeros made there,
    but only outside a graph capture (the runners run each step eagerly before capturing it: the
    counters exist by then); None on the CPU or during a capture before they exist."""
    if not x.is_cuda:
        return None
    if kept is not None and kept.device == x.device:
        return kept
    if torch.cuda.is_current_stream_capturing():
        return None
    return torch.zeros(size(), dtype=torch.int32, device=x.device)


class FP8Linear(UsesKernels, nn.Module):
    """y = x W^T with W kept as e4m3 codes + fp32 block scales (see the module docstring)."""

    def __init__(self, in_features: int, out_features: int, block: tuple[int, int], act_block: int | None = None):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.block, self.act_block = tuple(block), act_block
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=torch.float8_e4m3fn),
                                   requires_grad=False)
        self.weight_scale_inv = nn.Parameter(
            torch.empty(fp8_scale_shape(out_features, in_features, self.block), dtype=torch.float32), requires_grad=False
        )
        self.arrivals = None  # split counters of the decode kernels (`split_counters`), not state

    @classmethod
    def quantized_from(cls, weight: torch.Tensor, block: tuple[int, int], rows_per_chunk: int = 8192) -> "FP8Linear":
        """The module of `quantize_fp8_blocks(weight, block)` (ue8m0 scales) on weight's device,
        quantized a chunk of whole row blocks at a time (the same blocks; temporaries of a chunk's size)."""
        n, k = weight.shape
        with torch.device(weight.device):
            module = cls(k, n, block)
        step = max(1, rows_per_chunk // block[0]) * block[0]
        for first in range(0, n, step):
            codes, scale = quantize_fp8_blocks(weight[first:first + step], block)
            module.weight[first:first + step] = codes
            module.weight_scale_inv[first // block[0]:first // block[0] + scale.shape[0]] = scale
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_linear(x, self.weight, self.weight_scale_inv, block=self.block, act_block=self.act_block,
                          impl=self.impl, arrivals=self.split_counters(x))

    def swiglu(self, x: torch.Tensor, limit: float) -> torch.Tensor:
        """The clamped SwiGLU of the two halves of y (a stacked gate | up weight: `fp8_linear_swiglu`)."""
        return fp8_linear_swiglu(x, self.weight, self.weight_scale_inv, limit, block=self.block,
                                 act_block=self.act_block, impl=self.impl, arrivals=self.split_counters(x))

    def split_counters(self, x: torch.Tensor) -> torch.Tensor | None:
        """int32 zeros [ceil(out / 64)] on x's device that the FP8 decode kernels' last-arriving
        programs count on and leave at zero (one launch instead of a split-K sum after it): made
        on the first CUDA call outside a graph capture (the runners run each step eagerly before
        capturing it); None on the CPU or before that (the sum kernel then runs)."""
        counters = kept_counters(self.arrivals, lambda: -(-self.weight.shape[0] // 64), x)
        self.arrivals = self.arrivals if counters is None else counters
        return counters

    def dequantized(self) -> torch.Tensor:
        return dequantize_fp8_blocks(self.weight, self.weight_scale_inv, self.block)

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}, block={self.block}, act_block={self.act_block}"


class FP8GroupedLinear(FP8Linear):
    """The attention's grouped output projection (`o_a_proj`, official `wo_a`) kept in FP8:
    z[t, g] = W[g] x[t, g] for x [T, G, I], W = the e4m3 codes [G*R, I] with their block scales,
    group g owning rows g*R .. (g+1)*R - 1 (`ops/fp8_grouped_linear.py`: one block-diagonal FP8 GEMM
    up to `blockdiag_max_rows` rows T*G, one GEMM a group beyond). Always weight-only numerics
    (the official code multiplies this weight dequantized to bf16). Installed only where each
    group's R rows are whole scale blocks (`quantized_install.grouped_fp8_fits`), so a
    tensor-parallel cut by groups keeps whole blocks; G is read from x (a cut keeps fewer)."""

    def __init__(self, in_features: int, out_features: int, block: tuple[int, int]):
        super().__init__(in_features, out_features, block, act_block=None)
        self.blockdiag_max_rows = BLOCKDIAG_MAX_ROWS

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fp8_grouped_linear(x, self.weight, self.weight_scale_inv, self.block, impl=self.impl,
                                  arrivals=self.split_counters(x), blockdiag_max_rows=self.blockdiag_max_rows)


class MXFP4Experts(UsesKernels, nn.Module):
    """The routed experts of one layer in MXFP4 (see the module docstring for the layout)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        e, d, i = config.n_routed_experts, config.hidden_size, config.moe_intermediate_size
        for name, k in (("hidden_size", d), ("moe_intermediate_size", i)):
            if k % MX_BLOCK:
                raise ValueError(f"MXFP4 experts need `{name}` ({k}) to be a multiple of {MX_BLOCK}")
        self.n_experts, self.limit = e, config.swiglu_limit
        u8 = dict(dtype=torch.uint8)
        self.gate_up_proj = nn.Parameter(torch.empty(e, 2 * i, d // 2, **u8), requires_grad=False)
        self.gate_up_proj_scale_inv = nn.Parameter(torch.empty(e, 2 * i, d // MX_BLOCK, **u8), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(e, d, i // 2, **u8), requires_grad=False)
        self.down_proj_scale_inv = nn.Parameter(torch.empty(e, d, i // MX_BLOCK, **u8), requires_grad=False)
        self.offload = None  # an ExpertOffload (model/quantized_offload.py) when some experts live in host memory
        # V4.1's expert numerics (its reference's, as `RoutedExperts`): what each GEMM sees of its
        # input (`v41_quant.act_quant`; None: as is), and the routing weight applied to the fp32
        # SwiGLU output before the down projection. Set by the loader (`quantized_install.install`).
        self.act_quant = None
        self.weight_before_down = False
        self.arrivals = None  # ticket counters of the combine in the down launch (`combine_counters`), not state
        self.tensor_core_decode = False  # V4's decode route (`bind_decode`), decided once the weights are in

    def forward(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
                add: torch.Tensor | None = None) -> torch.Tensor:
        if self.offload is not None:
            return self.offload.run(self, x, experts, weights, add)
        return self.run(x, experts, weights, add, [getattr(self, n) for n in EXPERT_TENSORS])

    def run(self, x: torch.Tensor, experts: torch.Tensor, weights: torch.Tensor,
            add: torch.Tensor | None, tensors: list[torch.Tensor]) -> torch.Tensor:
        """`RoutedExperts.forward` over `tensors` (EXPERT_TENSORS order, leading dim = groups):
        expert ids index their leading dim. No host synchronisation."""
        if self.weight_before_down:
            y, pos = self.pick_outputs(x, experts, tensors, weights=weights)
            return moe_combine(y, pos, torch.ones_like(weights), add, impl=self.impl)
        if self.act_quant is None:  # V4: sort-free at decode (`ops/mxfp4_moe_decode.py`), on tensor cores if bound
            return mxfp4_experts(x, experts, weights, tensors, self.limit, add, impl=self.impl,
                                 tile_experts=self.n_experts, arrivals=self.combine_counters(x, experts.shape[1]),
                                 tensor_cores=self.tensor_core_decode)
        y, pos = self.pick_outputs(x, experts, tensors)
        return moe_combine(y, pos, weights, add, impl=self.impl)

    @property
    def v4_numerics(self) -> bool:
        """V4's expert numerics (inputs as they are, routing weights in the combine): the sort-free
        decode route and its tensor-core form take these; V4.1's (`act_quant`, `weight_before_down`)
        keep the sorted path."""
        return self.act_quant is None and not self.weight_before_down

    def bind_decode(self, tensor_cores: bool) -> bool:
        """Choose the decode route once the weights are in place (the loader, a bench), never per
        step: `tensor_core_decode` = `tensor_cores` (production's `TENSOR_CORE_DECODE` or the bench's
        choice) for V4's numerics, where the tensor-core kernels take both projections' K (D and I
        multiples of their K step) and every scale byte is <= 128 (`mma_scales_exact`: the decoder's
        folded scale multiply is exact), in device and host memory alike (an offloaded layer's slots
        receive its host experts). A reduction and a host read per scale tensor; nothing when off."""
        self.tensor_core_decode = bool(
            tensor_cores and self.v4_numerics
            and all(2 * self.stored(w)[0].shape[2] % mma_config(swiglu)["BLOCK_K"] == 0
                    for w, swiglu in (("gate_up_proj", True), ("down_proj", False)))
            and all(mma_scales_exact(t) for name in ("gate_up_proj_scale_inv", "down_proj_scale_inv")
                    for t in self.stored(name)))
        return self.tensor_core_decode

    def stored(self, name: str) -> list[torch.Tensor]:
        """Where expert tensor `name` (EXPERT_TENSORS) lives: the parameter, or an ExpertOffload's
        resident device rows and its host rows (not the slots: they hold copies of host rows, or
        whatever the allocator left before the first fetch)."""
        if self.offload is None:
            return [getattr(self, name)]
        i = EXPERT_TENSORS.index(name)
        return [self.offload.device_tensors[i][:len(self.offload.row_of)], self.offload.host_tensors[i]]

    def combine_counters(self, x: torch.Tensor, top_k: int) -> torch.Tensor | None:
        """int32 zeros on x's device for the combine in the down launch (`mxfp4_experts`' arrivals,
        left at zero by each launch), sized for the largest decode batch: made on the first CUDA
        call outside a graph capture (the runners run each step eagerly before capturing it), as
        `FP8Linear.split_counters`; None on the CPU or before that (the combine is then its own launch)."""
        counters = kept_counters(
            self.arrivals, lambda: combine_counters_size(self.n_experts, top_k, self.down_proj.shape[1]), x)
        self.arrivals = self.arrivals if counters is None else counters
        return counters

    def decodes_in_passes(self, x: torch.Tensor, experts: torch.Tensor, tensors: list[torch.Tensor]) -> bool:
        """`pass_outputs` takes this step: V4's numerics at a decode size (`direct_applies` at the
        layer's E: where `run` would take the sort-free route)."""
        return self.v4_numerics and direct_applies(self.impl, x, experts, tensors, self.n_experts,
                                                   self.tensor_core_decode)

    def pass_outputs(self, x: torch.Tensor, groups: torch.Tensor, tensors: list[torch.Tensor],
                     outputs: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of a decode step split over passes (`ExpertOffload`), on the route `run` takes
        (`mxfp4_experts_pass`: the GEMV, or tensor cores where `bind_decode` chose them): the picks
        whose group (groups [T, k]) is a row of `tensors` write their rows of (hidden, y), the
        others keep theirs. `outputs`: the earlier passes' (hidden, y), None in the first."""
        return mxfp4_experts_pass(x, groups, tensors, self.limit, outputs, tensor_cores=self.tensor_core_decode)

    def pick_outputs(self, x: torch.Tensor, groups: torch.Tensor, tensors: list[torch.Tensor],
                     n_sort: int | None = None, weights: torch.Tensor | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        """(y [T*k, D] in sorted pick order, pos [T*k]) before the routing weights: the picks
        sorted by their row of `tensors` (groups [T, k]), the two grouped matmuls around the SwiGLU.

        `n_sort` > G (the leading dim of `tensors`): picks with group id G are sorted past every
        group and computed by none (their rows of y are undefined); `ExpertOffload` runs a pass
        over some experts that way. The tiles are chosen for the layer's n_experts whatever G is,
        so a pick's row of y has the same bits as with every expert resident: it depends only on
        the picks of its group (the same ones, in the same order: the sort is stable) and the tiles.

        `weights` [T, k] (with `weight_before_down`): each pick's SwiGLU output is scaled by its
        routing weight before the down projection (y is then already weighted)."""
        gate_up, gate_up_scale, down, down_scale = tensors
        g = gate_up.shape[0]
        rows, ends, pos = moe_sort(groups, n_sort or g, impl=self.impl)
        ends = ends[:g]
        tiles = dict(impl=self.impl, tile_experts=self.n_experts)
        if self.act_quant is None and weights is None:  # V4: the SwiGLU fused into the gate_up launch
            hidden = mxfp4_grouped_matmul(x, gate_up, gate_up_scale, rows, ends, swiglu_limit=self.limit, **tiles)
            return mxfp4_grouped_matmul(hidden, down, down_scale, None, ends, **tiles), pos
        rounded = self.act_quant or (lambda t: t)  # V4.1: activations rounded, weights before the down
        gate, up = mxfp4_grouped_matmul(rounded(x), gate_up, gate_up_scale, rows, ends, **tiles).chunk(2, dim=-1)
        if weights is not None:
            sorted_weights = torch.empty_like(weights.flatten())
            sorted_weights[pos] = weights.flatten()
            hidden = clamped_swiglu(gate.float(), up.float(), self.limit, impl=self.impl) * sorted_weights[:, None]
            hidden = hidden.to(x.dtype)
        else:
            hidden = clamped_swiglu(gate, up, self.limit, impl=self.impl)
        return mxfp4_grouped_matmul(rounded(hidden), down, down_scale, None, ends, **tiles), pos

    def expert_bytes(self) -> int:
        """Bytes of one expert (its four tensors)."""
        return sum(getattr(self, n)[0].numel() * getattr(self, n).element_size() for n in EXPERT_TENSORS)
