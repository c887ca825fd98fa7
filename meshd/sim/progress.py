"""A progress bar on stderr: redrawn in place on a terminal, a line per 10% otherwise."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class ProgressBar:
    def __init__(self, total_runs: int, stream: TextIO | None = None, width: int = 30) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.total = max(total_runs, 1)
        self.width = width
        self.done_runs = 0
        self.current = ""
        self.last_decile = -1
        self.t0 = time.monotonic()
        self.run_t0 = self.t0

    def __call__(self, name: str, frac: float) -> None:
        if name != self.current:
            if self.current and self.tty:
                self.stream.write("\n")
            self.current = name
            self.last_decile = -1
            self.run_t0 = time.monotonic()
        frac = min(max(frac, 0.0), 1.0)
        elapsed = time.monotonic() - self.run_t0
        if self.tty:
            n = int(frac * self.width)
            bar = "#" * n + "-" * (self.width - n)
            self.stream.write(f"\r{name:<13} [{bar}] {frac * 100:5.1f}%  {elapsed:6.1f}s")
            self.stream.flush()
        else:
            decile = int(frac * 10)
            if decile != self.last_decile:
                self.last_decile = decile
                self.stream.write(f"{name}: {decile * 10}% ({elapsed:.1f}s)\n")
                self.stream.flush()
        if frac >= 1.0 and name == self.current:
            self.done_runs += 1

    def close(self) -> None:
        if self.tty and self.current:
            self.stream.write("\n")
            self.stream.flush()
