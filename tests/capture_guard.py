"""A TorchDispatchMode that refuses, on any device, the aten ops that cannot run inside a CUDA-graph
capture: so that a CPU test can tell whether code the decode runner captures would capture.

On CUDA these ops wait for the device (or copy from pageable host memory), which a stream under
capture may not do: the capture is invalidated ("operation failed due to a previous error during
capture") and the runner falls back to eager decoding. On the CPU they run fine, which is why only
this check catches them there.

Refused:
* a device value read by the host: `aten._local_scalar_dense` (`.item()`, `int(t)`, `bool(t)`),
  `aten.is_nonzero`, `aten.equal`;
* ops whose output size depends on the data: `nonzero`, `argwhere`, `masked_select`, `unique*`,
  `bincount`, `repeat_interleave` without `output_size`, and indexing (`index` / `index_put`) with
  a boolean or uint8 mask, which runs `nonzero` inside the kernel;
* a tensor built from host data with more than one element (`torch.tensor(list, device=...)`:
  `aten.lift_fresh`), a pageable host-to-device copy on CUDA. A 0-dim one is allowed: that is how
  `t[i] = 0.5` passes its scalar, which CUDA kernels take as an argument.

Not seen on the CPU: `.tolist()` and `.cpu()` (no aten op, or a same-device copy) are not caught.
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten

_SYNCING = {
    aten._local_scalar_dense, aten.is_nonzero, aten.equal, aten.nonzero, aten.argwhere, aten.masked_select,
    aten.unique_consecutive, aten.unique_dim, aten._unique, aten._unique2, aten.unique_dim_consecutive,
    aten.bincount,
}
_INDEXING = {aten.index, aten.index_put, aten.index_put_, aten._index_put_impl_}


def _mask_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


class CaptureViolation(AssertionError):
    pass


class NoCaptureBreakingOps(TorchDispatchMode):
    """`with NoCaptureBreakingOps(): ...` raises CaptureViolation at the first refused op."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        why = None
        if packet in _SYNCING:
            why = "reads a device value on the host or has a data-dependent size"
        elif func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
            why = "repeat_interleave without output_size (a host sync for the size)"
        elif packet in _INDEXING and _mask_index(args[1] if len(args) > 1 else kwargs.get("indices")):
            why = "boolean-mask indexing (nonzero inside: a host sync)"
        out = func(*args, **kwargs)
        if packet is aten.lift_fresh and isinstance(out, torch.Tensor) and out.numel() > 1:
            why = "a tensor built from host data (torch.tensor(list)): a pageable host-to-device copy on CUDA"
        if why is not None:
            raise CaptureViolation(f"{func}: {why}")
        return out
