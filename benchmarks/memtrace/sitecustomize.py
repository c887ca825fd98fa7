"""Dev-only hook for benchmarks/bench_soak.py --memtrace: not part of meshd.

When a Python process starts with this folder on PYTHONPATH and $MESHD_MEMTRACE_DIR set, its
first SIGUSR1 starts tracemalloc (25 frames; starting it at the start-up would slow the imports
so much that a loaded box misses the mesh's start-up deadline) and every SIGUSR1 writes a
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
            tracemalloc.start(25)
        path = os.path.join(_DIR, f"{os.getpid()}-{next(_count):03d}.snap")
        tracemalloc.take_snapshot().dump(path + ".tmp")
        os.replace(path + ".tmp", path)

    signal.signal(signal.SIGUSR1, _dump)
