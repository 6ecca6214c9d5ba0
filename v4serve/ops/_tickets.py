"""Zeroed int32 counters for kernels whose last-arriving program reduces the others' partials."""

import torch

_BUFFERS: dict = {}


def tickets(device: torch.device, n: int) -> torch.Tensor:
    """At least n zeroed int32 counters, one buffer per (device, stream). A kernel that takes a
    ticket resets it to 0 before it exits, so one buffer serves every launch and graph replay on
    that stream."""
    stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0
    key = (str(device), stream)
    buf = _BUFFERS.get(key)
    if buf is None or buf.numel() < n:
        buf = torch.zeros(max(n, 1024), dtype=torch.int32, device=device)
        _BUFFERS[key] = buf
    return buf
