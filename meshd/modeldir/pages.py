"""Handing back pages the process holds but no longer needs: a weights file's that onnxruntime
read once, and the C heap's free ones.

onnxruntime maps a model's external weights file and reads every 4/8-bit matrix once to repack
it into its own kernels' layout (prepacking). The repacked copy is what runs; the file's pages
stay resident, counted in the process's RSS, though nothing reads most of them again. Asking
the kernel to page them out (Linux ``madvise(MADV_PAGEOUT)``, 5.4 and later) drops the clean
ones; a page that is read again (an embedding row, a norm's weights) comes back from the file
on its own. Nothing else changes: a dirty page (none are expected) is not dropped without swap,
and where the call is missing this does nothing.

The C heap keeps what a library frees for its next allocations rather than returning it:
llguidance's view of a vocabulary (``engine.grammar_vocab``) frees about 4 MiB of working memory
once built (SmolLM2-135M's 49k tokens; Gemma 3's 262k, 18 MiB), all of it counted in the RSS
until something reuses it.
``trim_heap`` asks glibc to hand the free pages back (``malloc_trim``); elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys
from pathlib import Path

MADV_PAGEOUT = 21  # linux/mman-common.h


def mapped_ranges(path: Path, maps: str) -> list[tuple[int, int]]:
    """The address ranges of ``maps`` (the text of /proc/PID/maps) that map ``path``."""
    want = str(path.resolve())
    out = []
    for line in maps.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5] == want:
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append((lo, hi))
    return out


@functools.cache
def _libc() -> ctypes.CDLL:
    """The C library, found once (``find_library`` runs ``ldconfig``, a few ms each time)."""
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def page_out(path: Path) -> int:
    """Ask the kernel to page out this process's mappings of ``path``; returns the bytes asked
    for (0 where the platform has no such call)."""
    if not sys.platform.startswith("linux"):
        return 0
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8")
        libc = _libc()
    except OSError:
        return 0
    madvise = libc.madvise
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    done = 0
    for lo, hi in mapped_ranges(path, maps):
        if madvise(lo, hi - lo, MADV_PAGEOUT) == 0:
            done += hi - lo
    return done


def trim_heap() -> bool:
    """Hand the C heap's free pages back to the kernel (glibc's ``malloc_trim(0)``, which also
    releases free pages inside the heap, not only at its top); False where there is no such
    call."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        trim = _libc().malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return True
