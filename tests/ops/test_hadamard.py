"""The normalised Walsh-Hadamard transform: the Triton kernel (interpreted on the CPU) and the two
kernels that apply it in their epilogue (the index query's RoPE, the index key's compressor step)
against the torch reference, bit for bit (the kernels run the reference's fp32 butterflies in its
order); the reference itself is checked against the Sylvester matrix in test_references.py."""

import pytest
import torch

from v4serve.formats import row_format
from v4serve.ops.compress_decode import compress_decode
from v4serve.ops.hadamard import hadamard
from v4serve.ops.hadamard_reference import hadamard_reference
from v4serve.ops.kv_pack_reference import store_rows_reference
from v4serve.ops.norm_rope import rms_norm_rope
from v4serve.ops.norm_rope_reference import rms_norm_rope_reference


def _rows(shape, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    # magnitudes over many binades, so the fp32 sums round differently in any other order
    scale = torch.exp2(torch.randint(-8, 8, shape, generator=gen).float())
    return (torch.randn(shape, generator=gen) * scale).to(dtype)


@pytest.mark.parametrize("d", [2, 16, 128])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_kernel_is_bit_identical_to_the_reference(d, dtype):
    x = _rows((7, d), dtype)  # 7 rows: a partial block of rows
    assert torch.equal(hadamard(x, impl="triton"), hadamard_reference(x))


def test_triton_kernel_reads_row_strided_views():
    wide = _rows((5, 3, 64), torch.bfloat16, seed=1)
    x = wide[:, 1]  # row stride 192
    got = hadamard(x, impl="triton")
    assert got.is_contiguous() and torch.equal(got, hadamard_reference(x.contiguous()))


def test_non_power_of_two_dims_are_refused():
    for call in (lambda: hadamard(torch.zeros(2, 48)),
                 lambda: rms_norm_rope(torch.zeros(2, 48), hadamard=True)):
        with pytest.raises(ValueError, match="power-of-two"):
            call()


def _angles(t, pairs, seed=2):
    gen = torch.Generator().manual_seed(seed)
    angles = torch.randint(0, 4000, (t, 1), generator=gen).float() * torch.linspace(0.001, 1, pairs)[None]
    return angles.cos(), angles.sin()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_kernel_applies_the_transform_after_its_rounding(dtype):
    """The index query: [T, H, D] rotated on its last 2R channels, rounded to x's dtype, transformed."""
    x = _rows((3, 4, 32), dtype, seed=3)
    cos, sin = _angles(3, 8)
    got = rms_norm_rope(x, cos=cos, sin=sin, hadamard=True, impl="triton")
    assert torch.equal(got, hadamard_reference(rms_norm_rope_reference(x, cos=cos, sin=sin)))


def _compress_steps(hadamard_rows: bool, pool: torch.Tensor | None, fmt):
    """Four decode steps of 2 sequences through an overlapping ratio-4 compressor (d 32): both
    complete a block at the fourth step. Returns the rows of every step."""
    gen = torch.Generator().manual_seed(4)
    B, r, d = 2, 4, 32
    state = (torch.zeros(3, 2 * r, 2 * d), torch.full((3, 2 * r, 2 * d), float("-inf")))
    bias, weight = torch.randn(r, 2 * d, generator=gen), torch.rand(d, generator=gen) + 0.5
    rows_of = torch.tensor([[0, 1, 0], [0, 0, 3]], dtype=torch.int32)  # blocks 1 and 2 complete: pool rows 1, 3
    out = []
    for step in range(4):
        kv, score = torch.randn(B, 2 * d, generator=gen), torch.randn(B, 2 * d, generator=gen)
        positions = torch.tensor([4, 8]) + step
        cos, sin = _angles(B, 4, seed=step)
        packed = {} if pool is None else dict(pool=pool, row_format=fmt)
        rows, target = compress_decode(kv, score, positions, torch.tensor([2, 0]), bias, state, r, weight, 1e-6, cos,
                                       sin, rows_of, 4, torch.bfloat16, impl="triton", hadamard=hadamard_rows,
                                       **packed)
        out.append((rows, target))
    return out


def test_compressor_step_transforms_and_packs_its_rows():
    """The index key: the kernel's rows with the transform are the reference's transform of its rows
    without it, and the packed pool holds exactly those rows packed (zero rows at the scratch row)."""
    fmt = row_format("fp4_e8m0_b32")
    pool = torch.zeros(5, fmt.row_bytes(32), dtype=torch.uint8)
    plain = _compress_steps(False, None, fmt)
    rotated = _compress_steps(True, pool, fmt)
    expected = torch.zeros_like(pool)
    for (rows, target), (rows_h, target_h) in zip(plain, rotated):
        assert torch.equal(target_h, target)
        assert torch.equal(rows_h, hadamard_reference(rows))
        store_rows_reference(expected, target, hadamard_reference(rows), fmt)
    assert (plain[-1][0] != 0).any(-1).all()  # the last step completed both blocks
    assert torch.equal(pool, expected)


@pytest.mark.gpu
def test_kernels_at_model_shapes_on_gpu():
    """Index queries of 8 tokens x 64 heads x 128 and 2048 prefill key rows, bit for bit."""
    q = _rows((8, 64, 128), torch.bfloat16, seed=5).cuda()
    cos, sin = (t.cuda() for t in _angles(8, 32))
    got = rms_norm_rope(q, cos=cos, sin=sin, hadamard=True)
    assert torch.equal(got, hadamard_reference(rms_norm_rope_reference(q, cos=cos, sin=sin)))
    keys = _rows((2048, 128), torch.bfloat16, seed=6).cuda()
    assert torch.equal(hadamard(keys), hadamard_reference(keys))
