"""Giving freed heap memory back to the system after a large request.

A large body's strings (raw bytes, decoded text, the parsed value, the encoded prompt: ~4x the
body) are freed when the request ends, but glibc's malloc keeps freed chunks of a worker
thread's arena for reuse: without a trim, a 7 MB refused prompt leaves the process ~40 MiB
larger. `malloc_trim(0)` returns the free pages of every arena. Elsewhere (not glibc) this is a no-op.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools


@functools.cache
def _malloc_trim():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):
        return None


def release_free_memory() -> None:
    trim = _malloc_trim()
    if trim is not None:
        trim(0)
