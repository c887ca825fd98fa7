"""Handing back pages the process holds but no longer needs: a weights file's that onnxruntime
read once, and the C heap's free ones.

onnxruntime maps a model's external weights file and reads every 4/8-bit matrix once to repack
it into its own kernels' layout (prepacking). The repacked copy is what runs; the file's pages
stay resident, counted in the process's RSS, though nothing reads most of them again. Asking
the kernel to page them out (Linux ``madvise(MADV_PAGEOUT)``, 5.4 and later) drops the clean
ones; a page that is read again (an embedding row, a norm's weights) comes back from the file
on its own. Nothing else changes: a dirty page (none are expected) is not dropped without swap,
and where the call is missing this does nothing. ``paging_out`` does it every few milliseconds
while a session is built, so the pages never pile up: Gemma 3 270M's load peaked at 803 MiB with
the whole file resident, 629-647 MiB so (SmolLM2-135M: 278, 259-266).

The C heap keeps what a library frees for its next allocations rather than returning it:
llguidance's view of a vocabulary (``engine.grammar_vocab``) frees about 4 MiB of working memory
once built (SmolLM2-135M's 49k tokens; Gemma 3's 262k, 18 MiB), all of it counted in the RSS
until something reuses it.
``trim_heap`` asks glibc to hand the free pages back (``malloc_trim``); elsewhere it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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
    ranges = _ranges(path)
    return _advise(ranges) if ranges else 0


def _ranges(path: Path) -> list[tuple[int, int]]:
    if not sys.platform.startswith("linux"):
        return []
    try:
        return mapped_ranges(path, Path("/proc/self/maps").read_text(encoding="utf-8"))
    except OSError:
        return []


@functools.cache
def _madvise() -> Any:
    """The C library's ``madvise``, its argument types set once (None where it is missing)."""
    try:
        madvise = _libc().madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return madvise


def _advise(ranges: list[tuple[int, int]]) -> int:
    madvise = _madvise()
    if madvise is None:
        return 0
    return sum(hi - lo for lo, hi in ranges if madvise(lo, hi - lo, MADV_PAGEOUT) == 0)


# While onnxruntime builds a session it reads each 4/8-bit matrix of the mapped weights file once,
# to repack it; the file's pages are paged out this often meanwhile. The mappings are looked up
# each time (onnxruntime maps each tensor on its own and unmaps it once repacked: an address
# kept from an earlier look could by then hold something else).
PAGE_OUT_EVERY_S = 0.004


@contextlib.contextmanager
def paging_out(path: Path, every_s: float = PAGE_OUT_EVERY_S) -> Iterator[None]:
    """Page out this process's mappings of ``path`` every ``every_s`` seconds while the block
    runs, from a thread of its own (it runs while the block is in native code that lets go of
    the GIL, as onnxruntime's session build does), so the pages a long read leaves behind do not
    pile up: the peak RSS of building a session is then about its repacked weights rather than
    those and the whole file. A page read again after it went comes back from the file. Where
    there is no such call, nothing runs."""
    if not sys.platform.startswith("linux"):
        yield
        return
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(every_s):
            page_out(path)

    worker = threading.Thread(target=loop, name="meshd-page-out", daemon=True)
    worker.start()
    try:
        yield
    finally:
        stop.set()
        worker.join()


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
