"""The engine's intra-op threads: idle ones spin between the operators of a run, never after it
(onnxruntime's default spins on after every run, about 55 ms of a core, taken from everything
else on a small box)."""

from __future__ import annotations

import resource
import time
from pathlib import Path

from meshd.engine import GenerationConfig, load_model


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def test_idle_threads_do_not_spin_after_a_run(model_dirs: dict[str, Path]) -> None:
    model = load_model(model_dirs["llama"], threads=2)
    cfg = GenerationConfig(max_tokens=4, temperature=0.0)
    list(model.generate_sync("The quick brown fox", cfg))
    burnt = []
    for _ in range(3):
        list(model.generate_sync("The quick brown fox", cfg))
        c0 = _cpu_s()
        time.sleep(0.2)  # a window to watch, not a wait for anything
        burnt.append(_cpu_s() - c0)
    # spinning threads burn about a core for ~55 ms after each run; idle ones next to nothing
    assert min(burnt) < 0.02, f"CPU seconds burnt in 0.2 s after a run: {burnt}"
