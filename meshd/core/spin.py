"""Whether a CPU inference call should run on a session whose idle threads spin-wait (pure).

onnxruntime's intra-op thread pool either lets its idle threads spin between the operators of
one ``run`` (each parallel operator starts at once) or puts them to sleep (each parallel
operator first wakes a thread: tens of microseconds on a virtual machine, a few hundred times
per sentence embedding). Spinning only pays while the threads have cores to themselves: on a
2-core box it cut a 32-token int8 embedding's p50 by 13-19% with one other process about, and
doubled it with three (docs/embeddings.md, "Speed"). So the embedder
keeps two sessions of one graph and, per call, asks ``spin_pays`` with the number of tasks the
kernel counts as runnable at that moment (the caller's own thread included).
"""

from __future__ import annotations


def spin_pays(runnable: int | None, cores: int, threads: int) -> bool:
    """True when ``threads`` busy threads (the caller's among them) fit on ``cores`` beside
    every other task runnable now, i.e. no thread of ours would wait for a core while another
    spins. ``runnable``: runnable tasks system-wide including the caller (Linux's
    ``/proc/loadavg`` fourth field); ``None`` when unknown, which never spins."""
    if runnable is None or threads < 2 or cores < 2:
        return False
    others = max(runnable - 1, 0)
    return others + threads <= cores
