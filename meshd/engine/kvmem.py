"""Memory for KV cache buffers: anonymous mappings of their own, not the C heap.

A cache buffer is large (SmolLM2-135M: 8 rows x 192 slots is 1.1 MiB a layer and a kind) and
is dropped whole when the cache grows, shrinks or empties. From the C heap (numpy's default),
a dropped buffer's pages stay with the process: glibc raises its ``mmap`` threshold to the
size of each mapped block it frees, so later buffers come from the heap, whose free space is
reused for other things but not handed back (on the llama.cpp side-by-side workload the heap
held 109 MiB free at the end, all of it counted in the peak RSS). A buffer that is a mapping
of its own is unmapped when the array and its views are gone, and its pages are the kernel's
zero pages until written: the slots past the longest sequence (capacity kept for growth) cost
address space, not memory.

numpy reports the buffers it allocates to ``tracemalloc``; these are reported too (their own
domain), so a traced peak still counts them. ``live_bytes`` and ``peak_bytes`` count these
buffers alone (the peak since ``reset_peak``), without the Python objects around them.
"""

from __future__ import annotations

import ctypes
import mmap
import threading
import weakref
from math import prod

import numpy as np

TRACE_DOMAIN = 0x6B76  # tracemalloc's domain for these buffers ("kv")

_track = ctypes.pythonapi.PyTraceMalloc_Track
_track.argtypes = [ctypes.c_uint, ctypes.c_size_t, ctypes.c_size_t]
_untrack = ctypes.pythonapi.PyTraceMalloc_Untrack
_untrack.argtypes = [ctypes.c_uint, ctypes.c_size_t]

_lock = threading.Lock()  # a buffer may be dropped on any thread
_live = 0
_peak = 0


def live_bytes() -> int:
    """Bytes of the buffers alive now."""
    return _live


def peak_bytes() -> int:
    """The most bytes alive at once since ``reset_peak``."""
    return _peak


def reset_peak() -> None:
    global _peak
    with _lock:
        _peak = _live


def _count(nbytes: int) -> None:
    global _live, _peak
    with _lock:
        _live += nbytes
        _peak = max(_peak, _live)


def _dropped(address: int, nbytes: int) -> None:
    _untrack(TRACE_DOMAIN, address)
    _count(-nbytes)


def zeros(shape: tuple[int, ...], dtype: type[np.generic] = np.float32) -> np.ndarray:
    """A zero-filled C-contiguous array over an anonymous private mapping of its own,
    unmapped when the array and every view of it are gone. Its pages become resident as
    they are written."""
    nbytes = prod(shape) * np.dtype(dtype).itemsize
    if nbytes == 0:
        return np.zeros(shape, dtype)
    pages = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    out = np.frombuffer(pages, dtype).reshape(shape)
    address = out.ctypes.data
    _track(TRACE_DOMAIN, address, nbytes)  # does nothing unless tracemalloc is tracing
    _count(nbytes)
    weakref.finalize(pages, _dropped, address, nbytes)
    return out
