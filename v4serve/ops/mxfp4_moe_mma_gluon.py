"""Gluon kernel of the MXFP4 MoE decode projection on Hopper tensor cores (issue 18): the same math,
contract and calling convention as mxfp4_moe_mma_triton.py (read its docstring first), written in
Gluon so that the layouts are ours instead of Triton's choices:

- the weight bytes are loaded straight in a layout whose registers, once decoded, ARE wgmma's
  register operand (no shared-memory round trip and no ldmatrix re-layout of the bytes: the
  `convert_layout` to the dot operand below is a register renaming);
- x's operand X [K 128, N 16] (column 0 = x, 15 zero columns) is one 4 KB shared tile per
  operand (even / odd elements), built from one 16-byte load of 8 consecutive x a row-0 thread;
  rows 8..15 are zeroed once, rows 0..7 rewritten each step.

K loop (sm_90, Triton 3.6; two 256-element steps an iteration, both steps' bytes loaded first):
729 SASS instructions for 256 weights a thread, 2.85 a weight (production's sort-free GEMV 4.64,
mxfp4_moe_mma_triton.py 3.64): decode 2.13 (3 integer ops and one HFMA2 a pair, a shift a word),
1/8 HGMMA, the rest X (8 STS, 5 PRMT, 1 LDG a step: rows 0..7 of the tile rewritten, 8..15 zeroed
once), addresses, fences and barriers; 128
registers, no spills. The staged K loop (production at decode sizes, STAGES below): the bytes and
scale bytes of STAGES - 1 steps in flight through a ring of cp.async shared-memory stages (16-byte
copies of [64 rows, 128 bytes] a step, 128-byte rows swizzled in 16-byte chunks by row parity so
the readback's LDS.128 of a quad pair is conflict-free; 4-byte copies of the [64, 8] scale bytes),
one step an iteration, each read back in the register layout above: 381 SASS instructions a step
(2.98 a weight), 125 registers, 43 KB of shared memory at 4 stages.

Layouts (4 warps = one warpgroup, 64 weight rows a program, BLOCK_K 256 a step). A K step's bytes
of one row are 128: thread t (lane bits 0-1) of a quad owns bytes 32t .. 32t+31 (two 16-byte
loads), rows: lane bits 2-4 = row bits 0-2, register = row bit 3, warps = row bits 4-5. The bytes
tensor is [64 rows, 4 t, 2 b, 16 ii] (byte 32t + 16b + ii, one 32-element scale block per (t, b)).
The PTX decoder takes 4 consecutive bytes (ii bits 0-1, registers) and returns for the low and the
high nibbles the bf16 pairs (bytes 0, 2) and (1, 3), times the block scale pair 2^(b - 1) (the
folded multiply of mxfp4_moe_mma_triton.py: exact for scale bytes <= 128). Reshaped and permuted
logically to [64, 128] with position p = 16 (4 b + c) + 8 u + 2 t + e (ii = 4 c + 2 u + e), each
thread holds exactly the positions wgmma's A fragment gives it (rows g, g + 8; k = 2t, 2t+1, 2t+8,
2t+9 of each k16 chunk), so both the even (low nibble) and the odd (high nibble) tiles are A
operands as they are. Position p holds the nibble of byte 32t + 16b + 4c + 2 (q & 1) + (q >> 1),
q = 2u + e (the decoder's byte order 0, 2, 1, 3); X's column 0 is loaded in that order.

Picks of one expert (GROUPED; production past UNGROUPED_MAX_PICKS picks): a launch of several tokens
repeats experts (uniform routing over 256: ~4 of 48 picks at c8, ~58 of 192 in a c32 verify batch,
~185 of 384 at c64), and a program a pick decodes a repeated expert's weights once per pick.
Grouped, a program serves up to 8 picks of its expert, their x rows in X's rows 0..7 (column j of
the MMA is member j's output), as the launch's moe_pick_groups table says (one small launch a layer,
read by both projections); the programs of the other picks exit at once. (Each program scanning the
launch's expert ids itself cost more than it saved at c8: +30 µs, session 20.)

The pair of launches (mxfp4_moe_decode.py): gate_up calls griddepcontrol.launch_dependents at once
(TRIGGER) and down is its programmatic dependent launch (PDL), which requests its first weight
stages before griddepcontrol.wait and reads x (gate_up's output) after it: down's programs take the
SM slots gate_up's last programs free with their weights already in flight (H200, Flash layer: c8
207.0 -> 204.1 µs, verify c4 114.0 -> 110.3, c1 38.5 -> 37.9). gate_up is itself a dependent launch
of the kernel before it (the route, or the pick-groups table), waiting for it before anything
(WAIT_FIRST) and only then triggering, and down triggers the combine when its grid is one wave.

Numerics: as mxfp4_moe_mma_triton.py (exact products, fp32 sums in the MMA's order), the k order
of the sums differs from it (so do the last bits). A pick's row does not depend on the batch: column
j of an HGMMA sums in the order column 0 does, so grouped picks get a program a pick's bits (GPU test).
"""

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere.async_copy import commit_group, wait_group
from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

from v4serve.ops._dispatch import compiled_on_cuda, pdl_launch, sm_count
from v4serve.ops.gluon_builtins import barrier, cp_async, gdc_launch_dependents, gdc_wait
from v4serve.ops.moe_pick_groups import moe_pick_groups
from v4serve.ops.mxfp4_decode_triton import NIBBLE_HIGH, NIBBLE_LOW, nibble_pair_ptx
from v4serve.ops.mxfp4_moe_decode_triton import pick_rows



# $0 / $1: the low nibbles of bytes (0, 2) / (1, 3) of the 4 bytes in $4; $2 / $3: the high ones;
# $5..$8: the block's scale pair 2^(b - 1) as bf16x2 (the 4 bytes share a block: $5 serves all).
# Sign bit 3 (7) -> 15 (x 2^12 / 2^8), magnitude bits 2..0 (6..4) -> 8..6 (x 2^6 / 2^2): the bf16
# e2m1 * 2^-126, times 2^(b - 1) (fma with -0: signed zeros kept).
_DECODE_ASM = gl.constexpr(
    "{\n.reg .b32 a, v, nz;\nmov.b32 nz, 0x80008000;\nshr.u32 v, $4, 8;\n"
    + nibble_pair_ptx("$0", "$4", NIBBLE_LOW, "$5") + nibble_pair_ptx("$1", "v", NIBBLE_LOW, "$5")
    + nibble_pair_ptx("$2", "$4", NIBBLE_HIGH, "$5") + nibble_pair_ptx("$3", "v", NIBBLE_HIGH, "$5") + "}")
ROWS = 64  # weight rows a program (wgmma M)
BLOCK_K = gl.constexpr(256)
# The K loop of production, by the launch's picks: up to RING_MAX_PICKS a ring of STAGES shared-memory
# stages filled by cp.async (STAGES - 1 steps in flight while a step decodes), above the bytes loaded
# into registers, two steps an iteration. Same bits either way. H200, `kernel_configs 'moe staged'`
# (session 18, a program a pick, plain launches; Flash layer, µs, registers / 3 / 4 / 6 stages): c1
# 43.1 / 39.2 / 39.0 / 43.2, c8 219.9 / 220.0 / 215.3 / 245.1, verify c32 789.2 / 805.7 / 804.9 / 855.7
# (6 stages: 59 KB of shared memory a program, fewer resident): the ring then stopped at 48 picks.
# With the picks of an expert grouped and down a dependent launch (session 21, `'moe grouped'`, µs,
# registers / ring of 4 / 5): verify c16 (96 picks) 383.1-384.9 / 364.6 / 377.4, c32 (192) 661.0-662.3 /
# 622.7 / 646.6, c64 (384) 1026.1-1028.0 / 958.4 / 993.6 (0.615 -> 0.659 of the floor); `'moe pdl'`: 5
# stages lose at c1 / c8 / verify c4 (41.4 / 221.0 / 120.9 against 37.0-38.4 / 204.3-210.5 / 111.5-112.5).
# Past 512 picks (not measured with the ring) the register loop stays.
STAGES = 4
RING_MAX_PICKS = 512
# Up to GROUP picks of one expert a program (X's rows 0..7) in launches of more than UNGROUPED_MAX_PICKS
# picks, up to GROUPED_MAX_PICKS (moe_pick_groups compares every pair of picks). Same bits as a
# program a pick (column j of the MMA sums as column 0: GPU test). H200, `kernel_configs 'moe
# grouped'` (session 20, register loop past 48 picks; Flash layer, µs, a program a pick / grouped): c8
# (48 picks, the ring) 210.2 / 228.8 (a loss: ~4 repeats of 48 do not pay for the table launch and
# each program's table read), verify c16 407.2 / 386.1, c32 782.3 / 670.9, c64 1527.5 / 1037.5.
GROUP = 8
UNGROUPED_MAX_PICKS = 48
GROUPED_MAX_PICKS = 512
# Programs an SM at 4 warps, <= 128 registers and <= 56 KB of shared memory: a grid of at most this many
# an SM runs in one wave (`pdl_trigger` None).
ONE_WAVE_PROGRAMS_PER_SM = 4


def groups_apply(picks: int) -> bool:
    """Production's rule: the launch's picks are grouped by expert (GROUPED)."""
    return UNGROUPED_MAX_PICKS < picks <= GROUPED_MAX_PICKS


@gluon.jit
def _x_operands(x_at, x_off, x_ok, xe_s, xo_s):
    """Write X_even and X_odd [16, 128] (row j = the even / odd elements of x row j in the decoder's
    order where x_ok [8, 1, 1] holds, else zero; rows 8..15 zero). x_at: the x row of each X row
    ([8, 1, 1] pointers) or of row 0 alone (a scalar). x_off [8, 32, 8]: lane m = (t, c, b) of a
    thread loads the 8 consecutive elements of bytes 32t + 16b + 4c + 0..3 of its row, one 16-byte
    load; byte beta of them sits at q = (beta & 1) * 2 + (beta >> 1) = 2u + e, so beta = (e, u) as
    bits (1, 0)."""
    x8 = gl.load(x_at + x_off, mask=x_ok, other=0.0)  # [8, 32 (t, c, b), 8 (beta, parity)]
    xe, xo = gl.split(gl.reshape(x8, [8, 32, 4, 2]))
    xe = gl.reshape(gl.permute(gl.reshape(xe, [8, 4, 4, 2, 2, 2]), [0, 3, 2, 5, 1, 4]), [8, 128])
    xo = gl.reshape(gl.permute(gl.reshape(xo, [8, 4, 4, 2, 2, 2]), [0, 3, 2, 5, 1, 4]), [8, 128])
    xe_s.slice(0, 8, dim=0).store(xe)  # rows 8..15 stay the zeros written once
    xo_s.slice(0, 8, dim=0).store(xo)


@gluon.jit
def _step(acc, packed, sb, x_at, x_off, x_ok, xe_s, xo_s, a_op: gl.constexpr, lb: gl.constexpr):
    """One K step: decode the bytes into the two A fragments, write X, two wgmma."""
    R: gl.constexpr = 64
    mult = ((sb + 126) * 0x00800080)[:, :, :, None] + gl.zeros([R, 4, 2, 16], gl.int32, lb)
    wa, wb = gl.inline_asm_elementwise(_DECODE_ASM, "=r,=r,=r,=r,r,r,r,r,r", [packed, mult],
                                       dtype=(gl.bfloat16, gl.bfloat16), is_pure=True, pack=4)
    wa = gl.convert_layout(gl.reshape(gl.permute(gl.reshape(wa, [R, 4, 2, 4, 2, 2]), [0, 2, 3, 4, 1, 5]),
                                      [R, 128]), a_op)
    wb = gl.convert_layout(gl.reshape(gl.permute(gl.reshape(wb, [R, 4, 2, 4, 2, 2]), [0, 2, 3, 4, 1, 5]),
                                      [R, 128]), a_op)
    _x_operands(x_at, x_off, x_ok, xe_s, xo_s)
    fence_async_shared()  # generic-proxy stores, then wgmma's async-proxy reads
    barrier()
    acc = warpgroup_mma(wa, xe_s.permute((1, 0)), acc, is_async=True)
    acc = warpgroup_mma(wb, xo_s.permute((1, 0)), acc, is_async=True)
    return warpgroup_mma_wait(num_outstanding=0, deps=(acc, wa, wb))[0]  # the caller's barrier: X read


@gluon.jit
def _k_loop_registers(acc, w_base, s_base, byte_off, s_off, x_row, x_off, x_ok, xe_s, xo_s, K,
                      a_op: gl.constexpr, lb: gl.constexpr, PDL: gl.constexpr):
    """The K loop with the bytes loaded into registers, two steps an iteration: both steps' bytes
    loaded first, so the second step's loads are in flight while the first decodes (a loop-carried
    uint8 buffer would be split into bytes by LLVM). Each iteration's loads wait for the previous
    iteration's MMAs: 16 KB in flight a program at most, none while it decodes. PDL: x is the
    output of the grid launched before this one: wait for it first."""
    if PDL:
        gdc_wait()
    for k0 in range(0, K, 2 * BLOCK_K):
        packed0 = gl.load(w_base + k0 // 2 + byte_off)
        sb0 = gl.load(s_base + k0 // 32 + s_off).to(gl.int32)
        packed1 = gl.load(w_base + (k0 + BLOCK_K) // 2 + byte_off)
        sb1 = gl.load(s_base + (k0 + BLOCK_K) // 32 + s_off).to(gl.int32)
        acc = _step(acc, packed0, sb0, x_row + k0, x_off, x_ok, xe_s, xo_s, a_op, lb)
        barrier()  # both MMAs have read X before the next step's stores
        acc = _step(acc, packed1, sb1, x_row + k0 + BLOCK_K, x_off, x_ok, xe_s, xo_s, a_op, lb)
        barrier()
    return acc


@gluon.jit
def _k_loop_staged(acc, w_steps, s_steps, x_row, x_off, x_ok, xe_s, xo_s, K, a_op: gl.constexpr,
                   lb: gl.constexpr, l3: gl.constexpr, STAGES: gl.constexpr, PDL: gl.constexpr):
    """The K loop with the bytes and scales of STAGES - 1 steps in flight (cp.async into a ring of
    shared-memory stages, one step an iteration): a program keeps loading while it decodes.
    w_steps [64, 128] / s_steps [64, 8]: the pointers of step 0's bytes and scale bytes of the
    program's rows (step k: + 128 k / + 8 k). Iteration i reads stage i % STAGES, then refills
    the stage iteration i - 1 read (every thread has passed that iteration's closing barrier) with
    step i + STAGES - 1, and closes with wait_group(STAGES - 2) and a barrier: step i + 1 has
    landed for every thread (the scales are read by other threads than the ones that copied them)
    and the MMAs have read X. PDL: x is the output of the grid launched before this one: the first
    STAGES - 1 steps of weights are requested, then the program waits for that grid (the weights
    arrive while it finishes), then reads x."""
    R: gl.constexpr = 64
    bytes_s = gl.allocate_shared_memory(gl.uint8, [STAGES, R, 128], gl.SwizzledSharedLayout(16, 1, 2, [1, 0]))
    scales_s = gl.allocate_shared_memory(gl.uint8, [STAGES, R, 8], gl.SwizzledSharedLayout(1, 1, 1, [1, 0]))
    lw: gl.constexpr = gl.DistributedLinearLayout(  # lb's registers over [64 rows, 128 bytes]
        reg_bases=[[0, 1], [0, 2], [0, 4], [0, 8], [0, 16], [8, 0]],
        lane_bases=[[0, 32], [0, 64], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[R, 128])
    ls: gl.constexpr = gl.DistributedLinearLayout(  # l3's registers over [64 rows, 8 scale bytes]
        reg_bases=[[0, 1], [8, 0]], lane_bases=[[0, 2], [0, 4], [1, 0], [2, 0], [4, 0]],
        warp_bases=[[16, 0], [32, 0]], block_bases=[], shape=[R, 8])
    n_steps = K // BLOCK_K
    for s in gl.static_range(STAGES - 1):  # the launcher checks n_steps >= STAGES - 1
        cp_async(bytes_s.index(s), w_steps + 128 * s)
        cp_async(scales_s.index(s), s_steps + 8 * s)
        commit_group()
    if PDL:
        gdc_wait()
    wait_group(STAGES - 2)
    barrier()
    for i in range(n_steps):
        packed = gl.convert_layout(gl.reshape(bytes_s.index(i % STAGES).load(lw), [R, 4, 2, 16]), lb)
        sb = gl.convert_layout(gl.reshape(scales_s.index(i % STAGES).load(ls), [R, 4, 2]), l3).to(gl.int32)
        ahead = i + STAGES - 1
        if ahead < n_steps:
            cp_async(bytes_s.index(ahead % STAGES), w_steps + 128 * ahead)
            cp_async(scales_s.index(ahead % STAGES), s_steps + 8 * ahead)
        commit_group()  # (an empty group past the last step keeps the count)
        acc = _step(acc, packed, sb, x_row + i * BLOCK_K, x_off, x_ok, xe_s, xo_s, a_op, lb)
        wait_group(STAGES - 2)
        barrier()
    return acc


@gluon.jit
def _clamped_swiglu(gate, up, limit, dtype: gl.constexpr):
    """swiglu_triton.clamped_swiglu_f32's roundings: gate and up in bf16 first, silu(gate) rounded."""
    g = gl.minimum(gate.to(dtype).to(gl.float32), limit).to(dtype).to(gl.float32)
    u = gl.minimum(gl.maximum(up.to(dtype).to(gl.float32), -limit), limit).to(dtype).to(gl.float32)
    return ((g / (1.0 + gl.exp(-g))).to(dtype).to(gl.float32) * u).to(dtype)


@gluon.jit
def _store_column0(y_ptr, acc, pick, n0, stride_y, limit, mma: gl.constexpr, OUT: gl.constexpr,
                   SWIGLU: gl.constexpr):
    """Column 0 of acc [64, 16] (the pick's x) is y[pick, n0 .. n0 + OUT]: for the SwiGLU projection
    rows r < 32 are gate and 32 + r up."""
    col = gl.arange(0, 16, layout=gl.SliceLayout(0, mma))[None, :]
    v = gl.sum(gl.where(col == 0, acc, 0.0), axis=1)  # column 0: the pick
    dtype = y_ptr.dtype.element_ty
    if SWIGLU:
        pairs: gl.constexpr = gl.BlockedLayout([1, 2], [32, 1], [4, 1], [1, 0])  # (gate, up) in a thread
        gate, up = gl.split(gl.convert_layout(gl.permute(gl.reshape(v, [2, OUT]), [1, 0]), pairs))
        h = _clamped_swiglu(gate, up, limit, dtype)
        offs = n0 + gl.arange(0, OUT, layout=gl.SliceLayout(1, pairs))
    else:
        h = v.to(dtype)
        offs = n0 + gl.arange(0, OUT, layout=gl.SliceLayout(1, mma))
    gl.store(y_ptr + pick.to(gl.int64) * stride_y + offs, h)


@gluon.jit
def _store_members(y_ptr, acc, members_at, n0, stride_y, limit, mma: gl.constexpr, OUT: gl.constexpr,
                   SWIGLU: gl.constexpr):
    """Column j < 8 of acc [64, 16] is the row of pick members_at[j] (none where it is < 0), as
    _store_column0 stores column 0: the same roundings a value (columns 8..15: X's zero rows)."""
    dtype = y_ptr.dtype.element_ty
    if SWIGLU:  # (gate, up) pairs in a thread, columns over registers and warps
        pairs: gl.constexpr = gl.BlockedLayout([1, 4, 2], [32, 1, 1], [1, 4, 1], [2, 1, 0])
        gate, up = gl.split(gl.convert_layout(gl.permute(gl.reshape(acc, [2, OUT, 16]), [1, 2, 0]), pairs))
        h = _clamped_swiglu(gate, up, limit, dtype)
        lo: gl.constexpr = gl.SliceLayout(2, pairs)
    else:
        h = acc.to(dtype)
        lo: gl.constexpr = mma
    offs = n0 + gl.arange(0, OUT, layout=gl.SliceLayout(1, lo))[:, None]
    col = gl.arange(0, 16, layout=gl.SliceLayout(0, lo))
    to = gl.load(members_at + col, mask=col < 8, other=-1)[None, :]
    gl.store(y_ptr + to.to(gl.int64) * stride_y + offs, h, mask=to >= 0)


@gluon.jit
def _weight_rows(r, n0, N, OUT: gl.constexpr, SWIGLU: gl.constexpr):
    """The weight row of a program's row r (0..63): n0 + r, or for the SwiGLU projection gate rows
    n0 + r for r < 32 and up rows N + n0 + r - 32 (the pair lands in one program)."""
    if SWIGLU:
        return n0 + r % OUT + (r // OUT) * N
    return n0 + r


@gluon.jit
def _mxfp4_moe_mma_gluon_kernel(
    x_ptr, w_ptr, s_ptr, experts_ptr, y_ptr, members_ptr,
    N, K, stride_x, stride_we, stride_wn, stride_se, stride_sn, stride_y, limit, n_rows,
    TOP_K: gl.constexpr, X_PER_TOKEN: gl.constexpr, SWIGLU: gl.constexpr, SKIP_PAST_ROWS: gl.constexpr = False,
    STAGES: gl.constexpr = 0, GROUPED: gl.constexpr = False, PDL: gl.constexpr = False, TRIGGER: gl.constexpr = False,
    WAIT_FIRST: gl.constexpr = False,
):
    """Strides in elements (bytes for the uint8 tensors); N % (32 or 64) == 0, K % 512 == 0.
    SKIP_PAST_ROWS: a pick whose expert id is >= n_rows (the weight's leading dim) computes and
    stores nothing (mxfp4_moe_decode_triton.py's rule).
    STAGES: 0 = the bytes loaded into registers (_k_loop_registers), else a ring of that many
    shared-memory stages filled by cp.async (_k_loop_staged). GROUPED: members_ptr is the launch's
    moe_pick_groups table [P, 8] int32; the program of a pick that leads its group serves all of
    them (X's row j: member j's x), the others store nothing. Else a program a pick, x in X's row 0.
    PDL (the down projection, launched with programmatic dependent launch after gate_up): expert ids,
    the groups table and the first weight stages are read before griddepcontrol.wait (all written
    before gate_up triggered: it waits for its own predecessor first), x after it. WAIT_FIRST
    (gate_up, launched with programmatic dependent launch after the route or the pick-groups table):
    griddepcontrol.wait before anything is read. TRIGGER (gate_up; down when its grid is one wave):
    launch_dependents at once, after that wait, so that the next launch's programs may start (down's
    request weights) while this one's last programs run."""
    R: gl.constexpr = 64
    OUT: gl.constexpr = 32 if SWIGLU else 64
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16])
    a_op: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    lb: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 4], [0, 0, 0, 8], [0, 0, 1, 0], [8, 0, 0, 0]],
        lane_bases=[[0, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [2, 0, 0, 0], [4, 0, 0, 0]],
        warp_bases=[[16, 0, 0, 0], [32, 0, 0, 0]], block_bases=[], shape=[64, 4, 2, 16])
    l3: gl.constexpr = gl.SliceLayout(3, lb)
    sl: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=128, element_bitwidth=16, rank=2)

    if WAIT_FIRST:
        gdc_wait()
    if TRIGGER:  # after the wait: a dependent that reads the expert ids early reads them complete
        gdc_launch_dependents()
    pick = gl.program_id(0)
    e = gl.load(experts_ptr + pick).to(gl.int64)
    if SKIP_PAST_ROWS:
        if e >= n_rows:  # no weight row to read: its row of y keeps what it holds
            return
    n0 = gl.program_id(1) * OUT
    w_base = w_ptr + e * stride_we
    s_base = s_ptr + e * stride_se
    # X's rows in the decoder's order (see _x_operands): x_off [8, 32, 8] = 8 m + j, m = 8t + 2c + b
    xl: gl.constexpr = gl.DistributedLinearLayout(
        reg_bases=[[0, 0, 1], [0, 0, 2], [0, 0, 4], [4, 0, 0]],
        lane_bases=[[0, 1, 0], [0, 2, 0], [0, 4, 0], [0, 8, 0], [0, 16, 0]],
        warp_bases=[[1, 0, 0], [2, 0, 0]], block_bases=[], shape=[8, 32, 8])
    m = gl.arange(0, 32, layout=gl.SliceLayout(0, gl.SliceLayout(2, xl)))[None, :, None]
    jj = gl.arange(0, 8, layout=gl.SliceLayout(0, gl.SliceLayout(1, xl)))[None, None, :]
    x_off = 2 * (32 * (m // 8) + 16 * (m % 2) + 4 * ((m // 2) % 4)) + jj
    members_at = members_ptr + pick.to(gl.int64) * 8
    if GROUPED:  # X's row j: member j's x row
        if gl.load(members_at) < 0:  # another pick's program serves this one
            return
        at = gl.load(members_at + gl.arange(0, 8, layout=gl.SliceLayout(1, gl.SliceLayout(2, xl))))[:, None, None]
        x_ok = at >= 0
        x_row = x_ptr + gl.where(x_ok, at // TOP_K if X_PER_TOKEN else at, 0).to(gl.int64) * stride_x
    else:
        x_ok = gl.arange(0, 8, layout=gl.SliceLayout(1, gl.SliceLayout(2, xl)))[:, None, None] == 0
        x_row = x_ptr + (pick // TOP_K if X_PER_TOKEN else pick).to(gl.int64) * stride_x
    zeros: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [4, 1], [1, 0])
    xe_s = gl.allocate_shared_memory(gl.bfloat16, [16, 128], sl, gl.zeros([16, 128], gl.bfloat16, zeros))
    xo_s = gl.allocate_shared_memory(gl.bfloat16, [16, 128], sl, gl.zeros([16, 128], gl.bfloat16, zeros))
    acc = gl.zeros([R, 16], gl.float32, mma)
    if STAGES == 0:  # each thread's bytes and scale bytes, in lb's layout
        r3 = gl.arange(0, R, layout=gl.SliceLayout(1, gl.SliceLayout(2, l3)))[:, None, None]
        t3 = gl.arange(0, 4, layout=gl.SliceLayout(0, gl.SliceLayout(2, l3)))[None, :, None]
        b3 = gl.arange(0, 2, layout=gl.SliceLayout(0, gl.SliceLayout(1, l3)))[None, None, :]
        ii = gl.arange(0, 16, layout=gl.SliceLayout(0, gl.SliceLayout(1, gl.SliceLayout(2, lb))))[None, None, None, :]
        w_n = _weight_rows(r3, n0, N, OUT, SWIGLU).to(gl.int64)
        byte_off = (w_n * stride_wn + 32 * t3 + 16 * b3)[:, :, :, None] + ii
        s_off = w_n * stride_sn + 2 * t3 + b3
        acc = _k_loop_registers(acc, w_base, s_base, byte_off, s_off, x_row, x_off, x_ok, xe_s, xo_s, K, a_op, lb,
                                PDL)
    else:
        cw: gl.constexpr = gl.BlockedLayout([1, 16], [8, 4], [4, 1], [1, 0])  # a 16-byte cp.async a thread and row
        cs: gl.constexpr = gl.BlockedLayout([1, 4], [16, 2], [4, 1], [1, 0])  # a 4-byte cp.async a thread
        rw = _weight_rows(gl.arange(0, R, layout=gl.SliceLayout(1, cw))[:, None], n0, N, OUT, SWIGLU)
        rs = _weight_rows(gl.arange(0, R, layout=gl.SliceLayout(1, cs))[:, None], n0, N, OUT, SWIGLU)
        w_steps = w_base + rw.to(gl.int64) * stride_wn + gl.arange(0, 128, layout=gl.SliceLayout(0, cw))[None, :]
        s_steps = s_base + rs.to(gl.int64) * stride_sn + gl.arange(0, 8, layout=gl.SliceLayout(0, cs))[None, :]
        acc = _k_loop_staged(acc, w_steps, s_steps, x_row, x_off, x_ok, xe_s, xo_s, K, a_op, lb, l3, STAGES,
                             PDL)
    if GROUPED:
        _store_members(y_ptr, acc, members_at, n0, stride_y, limit, mma, OUT, SWIGLU)
    else:
        _store_column0(y_ptr, acc, pick, n0, stride_y, limit, mma, OUT, SWIGLU)


def gluon_shapes_fit(weight: torch.Tensor, swiglu: bool) -> bool:
    """The kernel's shapes: K % 512 == 0 (two K steps an iteration), N % 32 (gate_up, N = rows / 2)
    or % 64 (down), weight rows 16-byte aligned with unit stride along K."""
    _, n_w, half_k = weight.shape
    n = n_w // 2 if swiglu else n_w
    return (2 * half_k % (2 * BLOCK_K.value) == 0 and n % (32 if swiglu else 64) == 0 and weight.stride(2) == 1
            and weight.stride(1) % 16 == 0 and weight.data_ptr() % 16 == 0)


def gluon_applies(x: torch.Tensor, weight: torch.Tensor, swiglu: bool) -> bool:
    """The kernel runs for this call: compiled CUDA on sm_90 (wgmma; not the interpreter), shapes fit."""
    return (compiled_on_cuda(x.device) and torch.cuda.get_device_capability(x.device) == (9, 0)
            and gluon_shapes_fit(weight, swiglu))


def mxfp4_moe_mma_gluon(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor, experts: torch.Tensor,
                        top_k: int, per_token: bool, swiglu_limit: float | None = None, y: torch.Tensor | None = None,
                        skip_past_rows: bool = False, stages: int | None = None,
                        grouped: bool | None = None, members: torch.Tensor | None = None,
                        pdl_trigger: bool | None = False, pdl_wait: bool = False,
                        pdl_wait_first: bool = False) -> torch.Tensor:
    """`mxfp4_moe_mma_triton`'s contract (`y`, `skip_past_rows` included) on sm_90 CUDA (Gluon does
    not run in the interpreter). stages: the K loop (the kernel's STAGES: 0 = registers, 2 .. K / 256
    + 1 = a cp.async ring); None = production's rule (STAGES up to RING_MAX_PICKS picks, else 0).
    grouped: up to GROUP picks of one expert a program (the kernel's GROUPED); None = production's rule
    (`groups_apply`). members: the launch's `moe_pick_groups(experts, GROUP)` where the caller has it
    (one table for both projections), else made here when grouped. Programmatic dependent launch, where
    the device has it (`pdl_launch`): pdl_wait_first (gate_up) launches this one while the launch before
    it finishes and waits for it before reading anything; pdl_wait (down, launched right after a
    gate_up that triggers) reads only x after waiting for the launch before it (its expert ids and
    `members` must have been written before that launch triggered); pdl_trigger lets the next launch
    start while this one's last programs run (None: when this grid is one wave, ONE_WAVE_PROGRAMS_PER_SM
    programs an SM: the next launch's waiting programs would hold slots a later wave needs)."""
    e, n_w, half_k = weight.shape
    k = 2 * half_k
    swiglu = swiglu_limit is not None
    n = n_w // 2 if swiglu else n_w
    out = 32 if swiglu else 64
    if x.dtype != torch.bfloat16 or x.stride(1) != 1 or scale.stride(2) != 1:
        raise ValueError(f"x must be bf16 with unit stride, the scales unit stride along K, got {x.dtype}, "
                         f"strides {x.stride()} and {scale.stride()}")
    if not gluon_shapes_fit(weight, swiglu):
        raise ValueError(f"K % {2 * BLOCK_K.value} == 0, N % {out} == 0 and weight rows 16-byte aligned with unit "
                         f"stride along K, got K {k}, N {n}, weight strides {weight.stride()}")
    if stages is None:
        stages = STAGES if experts.shape[0] <= RING_MAX_PICKS else 0
    if stages and not 2 <= stages <= k // BLOCK_K.value + 1:
        raise ValueError(f"stages must be 0 or 2 .. {k // BLOCK_K.value + 1} (K {k} in steps of {BLOCK_K.value}), "
                         f"got {stages}")
    if experts.dim() != 1 or not experts.is_contiguous():
        raise ValueError(f"experts must be contiguous [P], got {tuple(experts.shape)}")
    picks = experts.shape[0]
    if grouped is None:
        grouped = groups_apply(picks)
    if grouped and members is None:
        members = moe_pick_groups(experts, GROUP)
    if grouped and (members.shape != (picks, GROUP) or members.dtype != torch.int32 or not members.is_contiguous()):
        raise ValueError(f"members must be moe_pick_groups' contiguous int32 [{picks}, {GROUP}], got "
                         f"{members.dtype} {tuple(members.shape)}")
    if pdl_wait and pdl_wait_first:
        raise ValueError("pdl_wait (x read after the wait) and pdl_wait_first (everything after it) exclude each other")
    y = pick_rows(y, picks, n, x)
    if picks == 0:
        return y
    pdl = pdl_launch(x)  # {PDL, launch_pdl} on sm_90 unless V4SERVE_PDL=0
    grid = (picks, triton.cdiv(n, out))
    if pdl_trigger is None:
        pdl_trigger = grid[0] * grid[1] <= ONE_WAVE_PROGRAMS_PER_SM * sm_count(x.device)
    launch = (pdl if pdl_wait else dict(launch_pdl=True, WAIT_FIRST=True) if pdl_wait_first and pdl else {})
    _mxfp4_moe_mma_gluon_kernel[grid](
        x, weight, scale, experts, y, members if grouped else experts, n, k, x.stride(0), weight.stride(0),
        weight.stride(1), scale.stride(0), scale.stride(1), y.stride(0), float(swiglu_limit) if swiglu else 0.0, e,
        TOP_K=top_k, X_PER_TOKEN=per_token, SWIGLU=swiglu, SKIP_PAST_ROWS=skip_past_rows, STAGES=stages,
        GROUPED=grouped, TRIGGER=pdl_trigger and bool(pdl), num_warps=4, **launch,
    )
    return y
