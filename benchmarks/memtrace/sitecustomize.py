"""Dev-only hook for benchmarks/bench_soak.py --memtrace: not part of meshd.

When a Python process starts with this folder on PYTHONPATH and $MESHD_MEMTRACE_DIR set, its
first SIGUSR1 starts tracemalloc ($MESHD_MEMTRACE_FRAMES frames, 4 unless set: starting it at the
start-up would slow the imports so much that a loaded box misses the mesh's start-up deadline, and
25 frames slowed five daemons on a loaded 2-vCPU box until their pings went unanswered and they
dropped each other) and every SIGUSR1 writes a
snapshot to $MESHD_MEMTRACE_DIR/<pid>-<n>.snap. So the last snapshot holds exactly the memory
allocated after the first signal and still alive: the growth. The soak benchmark signals every
daemon at the end of the first minute and at the end of the run.
"""

import os

_DIR = os.environ.get("MESHD_MEMTRACE_DIR")
if _DIR:
    import itertools
    import signal
    import tracemalloc

    _count = itertools.count()

    def _dump(signum, frame):  # noqa: ARG001 - a signal handler's signature
        if not tracemalloc.is_tracing():
            tracemalloc.start(int(os.environ.get("MESHD_MEMTRACE_FRAMES", "4")))
        path = os.path.join(_DIR, f"{os.getpid()}-{next(_count):03d}.snap")
        tracemalloc.take_snapshot().dump(path + ".tmp")
        os.replace(path + ".tmp", path)

    signal.signal(signal.SIGUSR1, _dump)


# --census: SIGUSR2 appends one line to $MESHD_MEMTRACE_CENSUS_DIR/<pid>-census.jsonl: RSS, glibc's
# heap in use (mallinfo2), SQLite's heap, pymalloc's allocated blocks, the live objects per type and the largest
# containers with what holds them. Cheap enough to take every minute of a long run (one walk over
# the gc's objects, no allocation hook), so a structure that keeps growing shows by its length.
_CENSUS = os.environ.get("MESHD_MEMTRACE_CENSUS_DIR")
if _CENSUS:
    import collections
    import ctypes
    import gc
    import json
    import signal
    import sys
    import time
    import types

    class _Mallinfo2(ctypes.Structure):
        _fields_ = [(n, ctypes.c_size_t) for n in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    def _mallinfo() -> dict:
        try:
            f = ctypes.CDLL("libc.so.6").mallinfo2
            f.restype = _Mallinfo2
            m = f()
            return {"heap_in_use": m.uordblks, "heap_free": m.fordblks, "mmapped": m.hblkhd}
        except (OSError, AttributeError):
            return {}

    def _sqlite_memory() -> dict:
        """SQLite's own heap, all connections of the process (sqlite3_status64 MEMORY_USED)."""
        try:
            lib = ctypes.CDLL("libsqlite3.so.0")
            cur, high = ctypes.c_int64(), ctypes.c_int64()
            if lib.sqlite3_status64(0, ctypes.byref(cur), ctypes.byref(high), 0) == 0:
                return {"sqlite_memory": cur.value}
        except (OSError, AttributeError):
            pass
        return {}

    def _owner(obj) -> str:
        """Where a container hangs: Class.attribute, module.name, or a dict's key."""
        for ref in gc.get_referrers(obj):
            if isinstance(ref, dict):
                key = next((k for k, v in ref.items() if v is obj), None)
                if key is None:
                    continue
                for ref2 in gc.get_referrers(ref):
                    if getattr(ref2, "__dict__", None) is ref:
                        return f"{type(ref2).__module__}.{type(ref2).__qualname__}.{key}"
                if "__name__" in ref and isinstance(ref.get("__name__"), str):
                    return f"{ref['__name__']}.{key}"
                return f"dict[{str(key)[:40]!r}]"
            slots = getattr(type(ref), "__slots__", ())
            for k in (slots,) if isinstance(slots, str) else slots:
                if getattr(ref, k, None) is obj:
                    return f"{type(ref).__module__}.{type(ref).__qualname__}.{k}"
        return "?"

    def _sample(obj) -> str:
        try:
            first = next(iter(obj))
        except (StopIteration, RuntimeError, TypeError):
            return ""
        return repr(first)[:60]

    def _census(signum, frame):  # noqa: ARG001 - a signal handler's signature
        objs = gc.get_objects()
        kinds = collections.Counter(type(o).__qualname__ for o in objs)
        big = sorted((o for o in objs if isinstance(o, dict | list | set | collections.deque)),
                     key=len, reverse=True)[:15]
        # containers held as attributes, whether the gc tracks them or not (a dict of str -> int
        # is untracked, so not among ``objs``): Class.attr -> total length over the instances
        attrs: collections.Counter = collections.Counter()
        for o in objs:
            d = None if isinstance(o, type | types.ModuleType) else getattr(o, "__dict__", None)
            if type(d) is dict:
                for k, v in d.items():
                    if isinstance(v, dict | list | set | collections.deque | bytearray):
                        attrs[f"{type(o).__module__}.{type(o).__qualname__}.{k}"] += len(v)
        rss = 0
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
        rec = {"t": time.time(), "rss_kb": rss, "pymalloc_blocks": sys.getallocatedblocks(),
               "gc_objects": len(objs), **_mallinfo(), **_sqlite_memory(),
               "types": dict(kinds.most_common(40)),
               "attrs": {k: n for k, n in attrs.most_common(60) if n >= 50},
               "largest": [{"type": type(o).__name__, "len": len(o), "owner": _owner(o),
                            "sample": _sample(o)}
                           for o in big]}
        del objs, big, attrs
        with open(os.path.join(_CENSUS, f"{os.getpid()}-census.jsonl"), "a") as f:
            f.write(json.dumps(rec) + "\n")

    signal.signal(signal.SIGUSR2, _census)
