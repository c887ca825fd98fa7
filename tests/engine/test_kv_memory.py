"""What the engine holds in memory: a KV cache growth copies one layer at a time (the old
buffers of a layer go as soon as they are copied, even while an IO binding held them), the
cache buffers are mappings of their own (handed back when dropped, resident only where
written), the weights file's pages that onnxruntime read to repack the matrices are handed
back, and so are the C heap's free pages."""

from __future__ import annotations

import ctypes
import mmap
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from meshd.engine import Model, kvmem, load_model
from meshd.engine.batch import BatchStage
from meshd.engine.fused import FusedStep
from meshd.modeldir.pages import mapped_ranges, paging_out, trim_heap


def _growth_peak(grow: Callable[[], object]) -> tuple[int, int]:
    """(bytes held after, peak bytes above the start) of the cache buffers while ``grow`` runs,
    as ``kvmem`` counts them: the buffers alone, not the Python objects around them, whose
    count varied with the rest of the process (a full suite's run once went 104 bytes past a
    4 KiB allowance for them)."""
    kvmem.reset_peak()
    before = kvmem.live_bytes()
    grow()
    return kvmem.live_bytes() - before, kvmem.peak_bytes() - before


def test_a_batch_growth_holds_one_layer_twice_not_the_whole_cache(models: dict[str, Model]) -> None:
    model = models["llama"]
    layers = model.num_layers
    assert layers >= 2
    fused = FusedStep(model.stage(0, layers, fused=True))
    main, pre = BatchStage(fused.stage), BatchStage(fused.stage)
    slots = [main.open(200) for _ in range(4)]
    for k, s in enumerate(slots):
        main.step([s], np.array([[5 + k, 6, 7]]))
    p = pre.open(8)
    pre.reserve(4)
    # a fused run binds both stages' buffers to the fused step's own IO binding
    fused.run(main, slots, np.array([[1], [2], [3], [4]]), pre, p, np.array([9, 10]),
              chunk_logits=False)
    old = main.memory_bytes()
    step = main.step
    after, peak = _growth_peak(lambda: main._ensure(150))  # more slots for every row
    new = main.memory_bytes()
    assert new > 2 * old
    # the old buffers are all gone after, and at the peak at most one layer's were still held
    assert after <= new - old
    assert peak <= new - old + old // layers, (peak, new, old)
    # the runs that follow rebind the new buffers: a decode step of the grown batch and a
    # fused run agree with the rows run alone
    out = step(slots, np.array([[11], [12], [13], [14]]))
    whole = model.stage(0, layers, fused=True)
    for k in range(4):
        alone = whole.open_session(32).step(np.array([5 + k, 6, 7, [1, 2, 3, 4][k], 11 + k]),
                                            np.arange(5), last_only=True)
        np.testing.assert_allclose(out[k], alone[0], rtol=0, atol=1e-5)
    fused.run(main, slots, np.array([[1], [2], [3], [4]]), pre, p, np.array([12]),
              chunk_logits=False)


def test_a_session_growth_holds_one_layer_twice(models: dict[str, Model]) -> None:
    model = models["llama"]
    stage = model.stage(0, model.num_layers)
    session = stage.open_session(max_tokens=256)
    ids = np.arange(5, 25)
    session.step(ids, np.arange(len(ids)), last_only=True)
    old = session.memory_bytes()
    after, peak = _growth_peak(lambda: session.reserve(250))
    new = session.memory_bytes()
    assert new > 3 * old
    assert after <= new - old
    assert peak <= new - old + old // model.num_layers, (peak, new, old)
    nxt = session.step(np.array([30]), np.array([len(ids)]), last_only=True)
    want = stage.open_session(64).step(np.append(ids, 30), np.arange(len(ids) + 1),
                                       last_only=True)
    np.testing.assert_allclose(nxt[0], want[0], rtol=0, atol=1e-5)


def test_mapped_ranges_reads_the_lines_of_one_file(tmp_path: Path) -> None:
    f = tmp_path / "weights.bin"
    f.write_bytes(b"x")
    maps = "\n".join([
        f"7f0000000000-7f0000002000 rw-p 00000000 00:2a 12 {f}",
        "7f0000002000-7f0000003000 r--p 00000000 00:2a 13 /usr/lib/libc.so.6",
        f"7f0000004000-7f0000008000 rw-p 00002000 00:2a 12 {f}",
        "7f0000009000-7f000000a000 rw-p 00000000 00:00 0",
        f"7f000000a000-7f000000b000 rw-p 00000000 00:2a 12 {f}.other",
    ])
    assert mapped_ranges(f, maps) == [(0x7F0000000000, 0x7F0000002000),
                                      (0x7F0000004000, 0x7F0000008000)]


def _resident_kb(path: Path) -> int:
    want, total, cur = str(path.resolve()), 0, ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        parts = line.split()
        if parts and "-" in parts[0] and not parts[0].endswith(":"):
            cur = parts[5] if len(parts) > 5 else ""
        elif parts and parts[0] == "Rss:" and cur == want:
            total += int(parts[1])
    return total


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_a_loaded_model_hands_back_the_weights_file_pages(models: dict[str, Model]) -> None:
    path = models["int4"].path
    weights = path / models["int4"].manifest.weights_file
    again = load_model(path)  # a fresh session: it read every matrix to repack it
    again.stage(0, again.num_layers)
    size_kb = weights.stat().st_size // 1024
    assert size_kb > 512
    assert _resident_kb(weights) < size_kb // 4, (_resident_kb(weights), size_kb)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_paging_out_hands_back_a_mapped_file_while_the_block_runs(tmp_path: Path) -> None:
    f = tmp_path / "weights.bin"
    size = 32 * 2**20
    f.write_bytes(np.random.default_rng(0).integers(0, 255, size, dtype=np.uint8).tobytes())
    with f.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = np.frombuffer(m, np.uint8)
        try:
            total = int(view[::4096].sum())  # every page read: all of them resident
            assert _resident_kb(f) > size // 1024 * 3 // 4
            with paging_out(f, every_s=0.005):
                deadline = time.monotonic() + 20
                while _resident_kb(f) > size // 1024 // 8:
                    assert time.monotonic() < deadline, _resident_kb(f)
                    time.sleep(0.01)
                # a page read again comes back from the file, the same bytes
                assert int(view[::4096].sum()) == total
            assert not any(t.name == "meshd-page-out" for t in threading.enumerate())
        finally:
            del view  # the mapping closes only once nothing points into it


def _mapped(address: int) -> bool:
    """Whether any of this process's mappings covers ``address``."""
    for line in Path("/proc/self/maps").read_text().splitlines():
        lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
        if lo <= address < hi:
            return True
    return False


def _rss_anon_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon in /proc/self/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_kv_buffers_are_mappings_of_their_own_unmapped_when_the_batch_empties(
        models: dict[str, Model]) -> None:
    model = models["llama"]
    stage = BatchStage(model.stage(0, model.num_layers))
    slots = [stage.open(64) for _ in range(3)]
    stage.step(slots, np.array([[5, 6], [7, 8], [9, 10]]))
    session = model.stage(0, model.num_layers).open_session(max_tokens=64)
    session.step(np.array([5, 6]), np.arange(2), last_only=True)
    buffers = stage.cache(0, 3) + session.cache()
    page = mmap.PAGESIZE
    # each buffer starts a mapping of its own: on a page boundary (a heap block starts 16
    # bytes past its header, never on one)
    starts = [a.ctypes.data for a in buffers]
    assert all(lo % page == 0 for lo in starts), [hex(lo) for lo in starts]
    assert all(_mapped(lo) for lo in starts)
    del buffers
    for s in slots:
        stage.close(s)
    session.free()
    assert stage.memory_bytes() == 0
    # and it is unmapped once dropped: the address is no longer in the process
    left = [lo for lo in starts if _mapped(lo)]
    assert not left, f"{len(left)} of {len(starts)} cache buffers still mapped"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_cache_capacity_is_resident_only_where_written(models: dict[str, Model]) -> None:
    model = models["llama"]
    stage = BatchStage(model.stage(0, model.num_layers))
    slots = [stage.open(8192) for _ in range(8)]
    before = _rss_anon_kb()
    stage.reserve(8192)  # room for 8 x 8,192 tokens, none written yet
    grown = _rss_anon_kb() - before
    assert stage.memory_bytes() >= 32 << 20
    assert grown * 1024 < stage.memory_bytes() // 16, (grown, stage.memory_bytes())
    for s in slots:
        stage.close(s)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_trim_heap_hands_back_the_heaps_free_pages() -> None:
    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.malloc.argtypes = [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size, count = 64 << 10, 512  # 32 MiB of heap blocks (under glibc's mmap threshold)
    blocks = [libc.malloc(size) for _ in range(count)]
    fence = libc.malloc(size)  # keeps the freed blocks off the heap's top (trimmed anyway)
    for b in blocks:
        ctypes.memset(b, 1, size)
    for b in blocks:
        libc.free(b)
    held = _rss_anon_kb()
    assert trim_heap()
    handed = held - _rss_anon_kb()
    libc.free(fence)
    assert handed * 1024 >= size * count * 3 // 4, handed
