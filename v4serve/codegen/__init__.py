"""Compile-only codegen check: what every registered Triton kernel compiles to, per arch.

Runs with no GPU. ``python -m v4serve.codegen --check`` compiles each kernel of
``registry.KERNELS`` ahead of time for sm_80, sm_90, sm_100 and sm_120 and checks the
registers, spills, shared memory, global load widths and tensor-core instructions against the
entry's expectations. See docs/codegen.md.
"""
from .report import main

__all__ = ["main"]
