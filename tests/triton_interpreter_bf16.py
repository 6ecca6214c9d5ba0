"""Make Triton's CPU interpreter compute bf16 like the GPU does (fp32 math, RNE back to bf16).

The interpreter stores bf16 as uint16 and applies numpy to the raw bits, so bf16 arithmetic,
compares, dots, reductions and int/fp16 casts are wrong, and fp32 -> bf16 truncates. `apply()`
wraps the builder methods that touch values: bf16 operands are widened to fp32, the op runs in
fp32, and a bf16 result is rounded back with round-to-nearest-even (NaN -> 0x7FC0).

It relies on private interpreter internals: tested with triton 3.6.0 only (pinned in pyproject).
"""

import numpy as np
import triton
import triton.language as tl
from triton.runtime import interpreter as interp

TESTED_TRITON = "3.6.0"


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(np.asarray(x, dtype=np.float32)), np.uint16(0x7FC0), rounded)


def _is_bf16(handle) -> bool:
    return handle.dtype.scalar == tl.bfloat16


def _widen(handle) -> np.ndarray:
    return bf16_bits_to_f32(handle.data) if _is_bf16(handle) else handle.data


def _narrow_if_float(data: np.ndarray) -> np.ndarray:
    return f32_to_bf16_bits(data) if np.issubdtype(np.asarray(data).dtype, np.floating) else data


def _binary_op(original):
    def binary_op(self, lhs, rhs, op):
        if not (_is_bf16(lhs) or _is_bf16(rhs)):
            return original(self, lhs, rhs, op)
        return interp.TensorHandle(_narrow_if_float(op(_widen(lhs), _widen(rhs))), lhs.dtype.scalar)

    return binary_op


def _unary_op(original):
    def unary_op(self, arg, op):
        if not _is_bf16(arg):
            return original(self, arg, op)
        return interp.TensorHandle(_narrow_if_float(op(_widen(arg))), arg.dtype.scalar)

    return unary_op


def _fma(original):
    def create_fma(self, x, y, z):
        if not any(_is_bf16(h) for h in (x, y, z)):
            return original(self, x, y, z)
        out = _widen(x) * _widen(y) + _widen(z)
        return interp.TensorHandle(_narrow_if_float(out) if _is_bf16(z) else out, z.dtype.scalar)

    return create_fma


def _dot(original):
    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        if not (_is_bf16(a) or _is_bf16(b) or _is_bf16(d)):
            return original(self, a, b, d, input_precision, max_num_imprecise_acc)
        out = np.matmul(_widen(a).astype(np.float32), _widen(b).astype(np.float32)) + _widen(d)
        return interp.TensorHandle(_narrow_if_float(out) if _is_bf16(d) else out.astype(np.float32), d.dtype.scalar)

    return create_dot


def _cast(original):
    def cast_impl(self, src, dst_type):
        to_bf16 = dst_type.scalar == tl.bfloat16
        if not (_is_bf16(src) or to_bf16):
            return original(self, src, dst_type)
        wide = _widen(src).astype(np.float32) if _is_bf16(src) or to_bf16 else src.data
        data = f32_to_bf16_bits(wide) if to_bf16 else wide.astype(interp._get_np_dtype(dst_type))
        return interp.TensorHandle(data, dst_type.scalar)

    return cast_impl


def _fp_to_fp(original):
    def create_fp_to_fp(self, src, dst_type, rounding_mode):
        if _is_bf16(src) or dst_type.scalar == tl.bfloat16:
            return self.cast_impl(src, dst_type)
        return original(self, src, dst_type, rounding_mode)

    return create_fp_to_fp


def _reduce_sum(original):
    def sum(self, input):
        if input.dtype.scalar != tl.bfloat16:
            return original(self, input)
        total = np.sum(bf16_bits_to_f32(input.handle.data), axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(f32_to_bf16_bits(total), input.dtype)

    return sum


def _reduce_min_max(original):
    def min_max(self, input, val_reduce_op, idx_reduce_op=None):
        value = input[0] if isinstance(input, tuple) else input
        if value.dtype.scalar != tl.bfloat16:
            return original(self, input, val_reduce_op, idx_reduce_op)
        wide = bf16_bits_to_f32(value.handle.data)
        kw = dict(axis=self.axis, keepdims=self.keep_dims)
        val = self.to_tensor(f32_to_bf16_bits(val_reduce_op(wide, **kw)), value.dtype) if val_reduce_op else None
        idx = self.to_tensor(idx_reduce_op(wide, **kw), tl.int32) if idx_reduce_op else None
        return (val, idx) if val is not None and idx is not None else (val if val is not None else idx)

    return min_max


_PATCHES = {
    (interp.InterpreterBuilder, "binary_op"): _binary_op,
    (interp.InterpreterBuilder, "unary_op"): _unary_op,
    (interp.InterpreterBuilder, "create_fma"): _fma,
    (interp.InterpreterBuilder, "create_dot"): _dot,
    (interp.InterpreterBuilder, "cast_impl"): _cast,
    (interp.InterpreterBuilder, "create_fp_to_fp"): _fp_to_fp,
    (interp.ReduceOps, "sum"): _reduce_sum,
    (interp.ReduceOps, "min_max"): _reduce_min_max,
}


def apply() -> None:
    """Patch the interpreter in place (idempotent). Refuses any triton other than the tested one."""
    if triton.__version__ != TESTED_TRITON:
        raise RuntimeError(f"triton_interpreter_bf16 is tested with triton {TESTED_TRITON}, found {triton.__version__}")
    for (cls, name), wrap in _PATCHES.items():
        current = getattr(cls, name)
        if not getattr(current, "_v4serve_bf16", False):
            patched = wrap(current)
            patched._v4serve_bf16 = True
            setattr(cls, name, patched)
