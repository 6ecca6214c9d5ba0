"""Shared argument checks for the ops' dispatching functions, and the launch options they share."""

import functools
import os

import torch
import triton

IMPLS = ("auto", "torch", "triton")


def use_triton(impl: str, *tensors: torch.Tensor) -> bool:
    """True when the op should run its Triton kernel: `impl="triton"`, or `"auto"` on CUDA tensors."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "auto":
        return all(t.is_cuda for t in tensors)
    return impl == "triton"


@functools.lru_cache
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """The streaming multiprocessors of CUDA `device` (cached per device)."""
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())


def check_16_byte_aligned(name: str, t: torch.Tensor) -> None:
    """Pools are gathered with 16-byte loads: the base pointer and the row stride must allow it."""
    row_bytes = t.stride(0) * t.element_size()
    if t.data_ptr() % 16 or row_bytes % 16 or t.stride(-1) != 1:
        raise ValueError(
            f"{name} must be 16-byte aligned with contiguous rows (data_ptr % 16 = {t.data_ptr() % 16}, "
            f"row stride {row_bytes} B, last-dim stride {t.stride(-1)})"
        )


@functools.lru_cache
def triton_at_least(major: int, minor: int) -> bool:
    """The installed Triton is major.minor or newer (tile configs that differ across releases);
    cached: launch paths ask on every call and the answer cannot change within a process."""
    return tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (major, minor)


def compiled_on_cuda(device: torch.device) -> bool:
    """Kernels on `device` run compiled on a GPU: CUDA, and not the interpreter (TRITON_INTERPRET)."""
    return device.type == "cuda" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")


def pdl_supported(device: torch.device) -> bool:
    """Programmatic dependent launch: CUDA (not the interpreter) on sm_90 or newer."""
    return compiled_on_cuda(device) and torch.cuda.get_device_capability(device)[0] >= 9


def fp8_conversion_supported(device: torch.device) -> bool:
    """Hardware e4m3 conversions (cvt.*.e4m3x2, Triton's float8e4nv): CUDA (not the interpreter) on
    sm_89 or newer."""
    return compiled_on_cuda(device) and torch.cuda.get_device_capability(device) >= (8, 9)


def pdl_launch(t: torch.Tensor) -> dict:
    """Launch options for programmatic dependent launch on sm_90+ CUDA (not the interpreter): the
    kernel is launched while its predecessor finishes and waits for it in its first statement
    (`if PDL: gdc_wait()`). On the H200 it trims the inter-kernel gaps of a decode step a little
    (docs/performance.md, Engine). V4SERVE_PDL=0 turns it off (to measure it)."""
    if os.environ.get("V4SERVE_PDL", "1") == "0" or not pdl_supported(t.device):
        return {}
    return dict(PDL=True, launch_pdl=True)
