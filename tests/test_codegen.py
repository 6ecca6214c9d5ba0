"""The compile-only codegen check (v4serve.codegen) catches what it is for.

The proof: an unhinted per-column window/compressed gather, ``tl.where(is_win, win_ptr, cmp_ptr)``
with no ``tl.multiple_of``, compiles to 2-byte loads under Triton >= 3.8 and to 16-byte loads
under 3.6; the check must fail on the first and pass on the second. The kernel lives here, not
in the production registry. scripts/codegen_check.sh runs this file in each Triton venv.
"""
import json
import os
import re

import pytest
import triton
import triton.language as tl
from triton.runtime.jit import JITFunction

from v4serve.codegen import check, report, toolchain
from v4serve.codegen.registry import KERNELS, by_name
from v4serve.codegen.report import main
from v4serve.codegen.spec import DEFAULT_ARCHS, Expect, KernelSpec

TRITON = tuple(int(p) for p in triton.__version__.split(".")[:2])


def _window_gather_unhinted(win_ptr, cmp_ptr, idx_ptr, out_ptr, n_window, stride_row,
                            BLOCK_N: tl.constexpr, D: tl.constexpr):
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    idx = tl.load(idx_ptr + cols)
    base = tl.where(cols < n_window, win_ptr, cmp_ptr)  # no tl.multiple_of: the regression
    d = tl.arange(0, D)
    kv = tl.load(base[:, None] + idx[:, None] * stride_row + d[None, :], mask=(idx >= 0)[:, None], other=0.0)
    tl.store(out_ptr + cols[:, None] * D + d[None, :], kv)


# NOTE: wrapped by hand, not with @triton.jit, so it stays compilable under TRITON_INTERPRET=1.
UNHINTED = KernelSpec(
    "test.window_gather_unhinted", JITFunction(_window_gather_unhinted),
    types=dict(win_ptr="*bf16", cmp_ptr="*bf16", idx_ptr="*i32", out_ptr="*bf16", n_window="i32",
               stride_row="i32"),
    aligned=("win_ptr", "cmp_ptr", "idx_ptr", "out_ptr", "stride_row"),
    constexprs=dict(BLOCK_N=32, D=512), num_warps=4, num_stages=1,
    expect=Expect(kv_load_bytes=16, kv_lines=r"kv = tl\.load", max_regs=255),
)


@pytest.mark.parametrize("arch", [90, 120])
def test_unhinted_where_gather_loses_16_byte_loads_from_triton_3_8(arch):
    m = toolchain.measure(UNHINTED, arch)
    found = check.violations(UNHINTED.expect, arch, m)
    if TRITON >= (3, 8):
        # [32, 512] bf16 over 128 threads: 256 B per thread, as 128 x 2 B instead of 16 x 16 B.
        assert m["loads"].get("ld2") == 128 and "ld16" not in m["loads"]
        assert any("KV gather must use 16-byte loads; found 128 x 2-byte ld.global" in v for v in found)
    else:
        assert m["loads"].get("ld16") == 16 and "ld2" not in m["loads"]
        assert found == []


def test_check_message_names_kernel_arch_version(capsys):
    rc = main(["--arch", "90", "--check", "-j", "1"], kernels=(UNHINTED,))
    out = capsys.readouterr().out.splitlines()
    record = json.loads(out[-1])
    assert record["triton"] == triton.__version__ and record["kernels"][0]["arch"] == 90
    fails = [line for line in out if line.startswith("FAIL ")]
    if TRITON >= (3, 8):
        assert rc == 1 and record["violations"] > 0
        assert fails and fails[0].startswith(f"FAIL test.window_gather_unhinted sm_90 triton {triton.__version__}: ")
        assert "2-byte" in fails[0]
    else:
        assert rc == 0 and fails == []


def test_hinted_canary_keeps_16_byte_loads():
    spec = by_name()["canary.window_gather"]
    m = toolchain.measure(spec, 90)
    assert m["loads"].get("ld16") == 16 and "ld2" not in m["loads"]
    assert check.violations(spec.expect, 90, m) == []


def test_unsupported_arch_is_reported_not_raised(capsys):
    rc = main(["--arch", "999", "--check", "-k", "canary.gather_rows", "-j", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "arch unsupported" in out


def test_unsupported_default_arch_fails_the_check(monkeypatch, capsys):
    """A default arch that this Triton cannot build fails --check, naming the arch and the Triton
    version; any other arch is only noted. The toolchain's verdict is injected, so the test does
    not depend on which archs the installed Triton supports."""
    reason = "RuntimeError: ptxas fatal: unknown gpu-name"
    monkeypatch.setattr(report, "_arch_reason", lambda arch: reason)
    rc = main(["--arch", "100,86", "--check", "-k", "^canary.gather_rows$", "-j", "1"])
    out = capsys.readouterr().out.splitlines()
    assert rc == 1 and json.loads(out[-1])["violations"] == 1
    assert [line for line in out if line.startswith("FAIL ")] == [
        f"FAIL canary.gather_rows sm_100 triton {triton.__version__}: arch unsupported by this Triton, "
        f"but sm_100 is a default arch ({reason})"]
    assert f"NOTE canary.gather_rows sm_86 triton {triton.__version__}: arch unsupported ({reason})" in out


def test_registry_entries_match_their_kernels():
    assert len(by_name()) == len(KERNELS)
    for spec in KERNELS:
        fn = spec.load_fn()
        sig = spec.signature(fn.arg_names)
        assert sig.keys() == set(fn.arg_names), spec.name
        assert spec.num_warps in (1, 2, 4, 8, 16), spec.name


def test_register_bounds_name_every_arch_an_entry_compiles_for():
    """A per-arch bound that leaves out an arch would check that arch against 255: no bound."""
    for spec in KERNELS:
        if isinstance(spec.expect.max_regs, dict):
            assert set(spec.archs or DEFAULT_ARCHS) <= spec.expect.max_regs.keys(), spec.name


def test_registry_entry_mismatch_is_a_clear_error():
    bad = KernelSpec("bad", UNHINTED.fn, types={"win_ptr": "*bf16"}, constexprs={"nope": 1})
    with pytest.raises(ValueError, match="registry entry does not match"):
        bad.signature(bad.load_fn().arg_names)


def _measured(local_ops: int) -> dict:
    """A `toolchain.measure` record of a clean kernel, with `local_ops` STL/LDL instructions."""
    return dict(local_bytes=4 * local_ops, local_ops=local_ops, shared=1024, regs=128, tensor_cores={},
                load_sites=[])


def test_spill_budget():
    """Spills fail an entry that states no budget, and only beyond the budget where one is stated."""
    assert check.violations(Expect(), 90, _measured(0)) == []
    assert "expected none" in check.violations(Expect(), 90, _measured(2))[0]
    assert check.violations(Expect(max_spill_ops=96), 90, _measured(80)) == []
    assert "at most 96 STL/LDL" in check.violations(Expect(max_spill_ops=96), 90, _measured(97))[0]



# ---- the verify compressor's bits: its two kernels reduce in the decode kernel's thread layouts ----

def _sum_layouts(spec: KernelSpec) -> list[tuple[str, int, int, int]]:
    """How every fp32 sum in the kernel's TTGIR spreads what it adds: (what, elements a thread
    holds in a block, lanes, warps) along the summed axis: "rows" for a [rows, channels] tile summed
    down its rows (the pooling), "row" for a row summed whole (kv_norm; a row sliced out of a tile
    keeps the tile's channel axis, its row warps hold copies). Equal tuples add the same values in
    the same order: within a thread, then across lanes, then across warps."""
    ir = toolchain.compile_spec(spec, 90).asm["ttgir"]
    blocked = dict(re.findall(r"^(#\w+) = #ttg\.blocked<\{(.*)\}>$", ir, re.M))
    found = []
    for shape, layout in re.findall(r"arith\.addf [^\n]*\n\s*tt\.reduce\.return [^\n]*\n\s*\}\) : "
                                    r"\(tensor<([0-9x]+)xf32, (#ttg\.slice<\{[^}]*\}>|#\w+)>\)", ir):
        sliced = re.fullmatch(r"#ttg\.slice<\{dim = 0, parent = (#\w+)\}>", layout)
        fields = {k: [int(v) for v in vs.split(",")]
                  for k, vs in re.findall(r"(\w+) = \[([0-9, ]+)\]", blocked[sliced.group(1) if sliced else layout])}
        axis = 0 if "x" in shape else -1
        found.append(("rows" if "x" in shape else "row", *(fields[k][axis] for k in
                                                            ("sizePerThread", "threadsPerWarp", "warpsPerCTA"))))
    return found


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                    reason="the kernels' @jit helpers stay interpreted: run with --noconftest (scripts/codegen_check.sh)")
def test_verify_compressor_sums_in_the_decode_kernels_layouts():
    """The pooling's column sums (per channel, down the 2r candidates) and the finish's kv_norm sum
    over d run in the decode kernel's layouts at V4-Flash's CSA and indexer shapes, so the verify
    kernels reproduce its bits (ops/compress_verify_triton.py, `launch_warps`)."""
    import dataclasses

    from v4serve.formats import row_format
    from v4serve.ops.kv_pack_triton import packed_constexprs

    specs = by_name()
    csa = specs["compress_decode.csa_fp8kv"]
    index = dataclasses.replace(csa, name="compress_decode.index_fp4", constexprs=dict(
        csa.constexprs, BLOCK_D=128, HADAMARD=True, LOG2_D=7, **packed_constexprs(row_format("fp4_e8m0_b32"), 128)),
        aligned=tuple(a for a in csa.aligned if a != "stride_pool"))
    for decode, pool, finish in ((csa, "compress_verify.csa_pool", "compress_verify.finish_fp8kv"),
                                 (index, "compress_verify.index_pool", "compress_verify.finish_index_fp4")):
        *columns, norm = _sum_layouts(decode)
        assert len(columns) == 4 and norm[0] == "row", decode.name  # 4 sums over the 2r candidates, the norm
        assert _sum_layouts(specs[pool]) == columns, decode.name
        assert _sum_layouts(specs[finish]) == [norm], decode.name
