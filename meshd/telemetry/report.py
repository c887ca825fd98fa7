"""Report a failing hardware reading once, and its recovery once, however often it is retried.

A reading is retried every advert interval; a broken sensor would otherwise log a line every
few seconds forever. ``FailureReport`` keeps which sources are failing: the first failure of a
source logs one warning (``hardware reading failed source=nvml error='...'``), later failures of
the same source log nothing, and the first good reading after them logs one info line
(``hardware reading recovered source=nvml failures=12``).
"""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class FailureReport:
    def __init__(self, logger: logging.Logger | None = None) -> None:
        self._log = logger or log
        self._failing: dict[str, int] = {}  # source -> failed readings in a row
        self.reported = 0  # warnings logged so far (statistics)

    def failed(self, source: str, error: str) -> None:
        """A reading of ``source`` failed; logs only the first failure in a row."""
        n = self._failing.get(source, 0)
        self._failing[source] = n + 1
        if n == 0:
            self.reported += 1
            self._log.warning("hardware reading failed source=%s error=%r (retried each advert "
                              "interval; reported once)", source, error)

    def ok(self, source: str) -> None:
        """A reading of ``source`` worked; logs once if it had been failing."""
        n = self._failing.pop(source, 0)
        if n:
            self._log.info("hardware reading recovered source=%s failures=%d", source, n)

    def check(self, source: str, error: str) -> None:
        """``failed(source, error)`` when ``error`` is set, else ``ok(source)``."""
        if error:
            self.failed(source, error)
        else:
            self.ok(source)

    @property
    def failing(self) -> tuple[str, ...]:
        """The sources whose last reading failed, sorted."""
        return tuple(sorted(self._failing))

    def statistics(self) -> dict[str, object]:
        return {"failing": dict(sorted(self._failing.items())), "reported": self.reported}
