"""Parsing of PTX, SASS and cuobjdump output (v4serve.codegen.parse) on small fixed strings."""
from v4serve.codegen import parse

PTX = """
\t.loc\t1 12 20                          // k.py:12:20
\t// begin inline asm
\t.loc\t1 12 20                          // k.py:12:20
\tmov.u32 %r1, 0x0;
\t.loc\t1 13 20                          // k.py:13:20
\tld.global.b32 { %r1 }, [ %rd1 + 0 ];
\t// end inline asm
\t.loc\t1 15 9
\t@%p1 ld.global.L1::evict_last.v4.b32 { %r2, %r3, %r4, %r5 }, [ %rd2 + 0 ];
\tld.global.nc.v2.b32 { %r6, %r7 }, [ %rd3 + 0 ];
\tld.global.b16 { %rs1 }, [ %rd4 + 0 ];
\tld.global.u8 %rs2, [%rd5];
\tld.global.v2.b64 { %rd6, %rd7 }, [ %rd8 + 0 ];
\tld.param.b64 %rd9, [k_param_0];
\tld.shared.v4.b32 { %r8, %r9, %r10, %r11 }, [ %r12 + 0 ];
\tcp.async.cg.shared.global [ %r13 + 0 ], [ %rd10 + 0 ], 0x10, %r14;
\tcp.async.ca.shared.global [ %r15 + 0 ], [ %rd11 + 0 ], 0x4, %r16;
\twgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {...};
\t.file\t1 "/src/k.py"
"""

SASS = """
\t\tFunction : k
        /*0000*/                   LDC R1, c[0x0][0x28] ;                   /* 0x00000a00ff017b82 */
        /*0010*/              @!P0 LDG.E.128 R4, desc[UR4][R2.64] ;          /* 0x0000000402047981 */
        /*0020*/               @P1 LDG.E.U16 R8, desc[UR4][R6.64] ;          /* 0x0000000406087981 */
        /*0030*/                   HGMMA.64x64x16.F32.BF16 R24, gdesc[UR8], RZ ;  /* 0x00000000081879f0 */
        /*0040*/                   STL [R1], R3 ;                           /* 0x0000000301007387 */
        /*0050*/                   LDL R3, [R1] ;                           /* 0x0000000001037983 */
        /*0060*/                   EXIT ;                                   /* 0x000000000000794d */
        /*0070*/                   BRA 0x70;                                /* 0xfffffffc00fc7947 */
        /*0080*/                   NOP;                                     /* 0x0000000000007918 */
"""

RES = """
Resource usage:
 Common:
  GLOBAL:0
 Function k:
  REG:108 STACK:8 SHARED:1024 LOCAL:16 CONSTANT[0]:584 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


def test_ptx_loads_widths_and_lines():
    loads = parse.ptx_loads(PTX)
    assert [(ld.kind, ld.nbytes) for ld in loads] == [
        ("ld", 4), ("ld", 16), ("ld", 8), ("ld", 2), ("ld", 1), ("ld", 16), ("cp.async", 16), ("cp.async", 4)]
    # The .loc that LLVM puts inside an inline-asm block (line + 1) must not move the load.
    assert (loads[0].file, loads[0].line) == ("/src/k.py", 12)
    assert loads[1].line == 15
    assert parse.load_histogram(loads) == {"cp4": 1, "cp16": 1, "ld1": 1, "ld2": 1, "ld4": 1, "ld8": 1, "ld16": 2}


def test_ptx_tensor_core_and_files():
    assert parse.ptx_tensor_core_ops(PTX) == {"wgmma.mma_async": 1}
    assert parse.ptx_files('\t.file\t2 "/a/b" "c.py"\n') == {"2": "/a/b/c.py"}
    assert not parse.ptx_uses_tma(PTX)


def test_sass_opcodes():
    ops = parse.sass_opcodes(SASS)
    assert ops["LDG.E.128"] == 1 and ops["LDG.E.U16"] == 1 and ops["HGMMA.64x64x16.F32.BF16"] == 1
    assert parse.sass_instruction_count(ops) == 8  # NOP padding is not counted
    assert parse.sass_tensor_core_ops(ops) == {"HGMMA": 1}
    assert parse.sass_local_memory_ops(ops) == 2


def test_resource_usage():
    assert parse.resource_usage(RES) == {"REG": 108, "STACK": 8, "SHARED": 1024, "LOCAL": 16}
