"""py-libp2p's log lines through meshd's logging, rate limited.

py-libp2p 0.8.1 detaches its ``libp2p`` logger (no handler, ``propagate = False``) unless
``LIBP2P_DEBUG`` is set, so its warnings and errors reach Python's last-resort handler and are
printed bare: no time, no level, no logger name. An outsider that redials every 2 s (a node of
another mesh bootstrapping to us) then prints ``failed to upgrade security for peer ...`` every
2 s. ``route_libp2p_logs`` hands those records to the root logger (meshd's format) through a
``RateLimit``: the first record of a kind is logged, then at most one per ``interval_s``, which
says how many like it were left out. The same limit is put on meshd's own ``peer rejected``
lines (meshd/net/attest.py), one kind per reason and peer; the audit table keeps every refusal.

A connection that breaks under the library is not an error of meshd's: a peer that was frozen
(SIGSTOP) for a while and resumes finds its connections reset by the peers that gave up on it,
and py-libp2p logs that at ERROR (yamux's ``Error in handle_incoming ... Broken pipe``, then
the failed stream opens on the dead connection: multistream-select's ``write failed`` and the
host's six-line ``Failed to open stream``), while meshd redials and the peer rejoins as usual
(meshd.node.links logs the drop itself). ``LostConnectionFilter`` turns such records into one
INFO line each.

``RateLimit`` is the pure decision (the time is passed in); the logging classes are the thin
wrapper around it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field

INTERVAL_S = 60.0  # at most one line of a kind this often (after the first)
MAX_KEYS = 1024  # kinds remembered; past that the oldest are forgotten


@dataclass
class _Slot:
    last_logged: float
    suppressed: int = 0


@dataclass
class RateLimit:
    """Per key: the first event passes, then one per ``interval_s``; ``allow`` returns whether
    this one passes and, when it does, how many of its kind were held back since the last."""

    interval_s: float = INTERVAL_S
    max_keys: int = MAX_KEYS
    _slots: dict[Hashable, _Slot] = field(default_factory=dict)

    def allow(self, key: Hashable, now: float) -> tuple[bool, int]:
        slot = self._slots.get(key)
        if slot is None:
            if len(self._slots) >= self.max_keys:
                oldest = min(self._slots, key=lambda k: self._slots[k].last_logged)
                del self._slots[oldest]
            self._slots[key] = _Slot(now)
            return True, 0
        if now - slot.last_logged >= self.interval_s:
            held, slot.suppressed, slot.last_logged = slot.suppressed, 0, now
            return True, held
        slot.suppressed += 1
        return False, 0


Key = Callable[[logging.LogRecord], Hashable | None]  # None: not limited


def by_template(record: logging.LogRecord) -> Hashable:
    """A kind is the logger, the message template and its first argument (for libp2p's lines,
    the peer or address)."""
    first = record.args[0] if isinstance(record.args, tuple) and record.args else None
    return record.name, str(record.msg), str(first)


class RateLimitFilter(logging.Filter):
    """Drops records over the limit; a record let through after some were dropped gets
    `` suppressed=N`` appended (N: how many of its kind were dropped since the last one)."""

    def __init__(self, limit: RateLimit | None = None, key: Key = by_template,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.limit = limit or RateLimit()
        self.key = key
        self.clock = clock

    def filter(self, record: logging.LogRecord) -> bool:
        key = self.key(record)
        if key is None:
            return True
        ok, held = self.limit.allow(key, self.clock())
        if ok and held:
            record.msg = f"{record.getMessage()} suppressed={held}"
            record.args = None
        return ok


LOST_CONNECTION = ("broken pipe", "connection reset", "fail to write to multiselect communicator")
"""What libp2p's messages about a connection that broke under them say (lower case)."""


class LostConnectionFilter(logging.Filter):
    """A libp2p WARNING or ERROR about a connection that broke (``LOST_CONNECTION``) becomes an
    INFO record on one line; every other record passes unchanged."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING or record.levelno > logging.ERROR:
            return True
        message = record.getMessage()
        if not any(m in message.lower() for m in LOST_CONNECTION):
            return True
        record.levelno, record.levelname = logging.INFO, logging.getLevelName(logging.INFO)
        record.msg, record.args = " ".join(message.split()), None
        return True


class _ToRoot(logging.Handler):
    """Passes a record on to the root logger's handlers (meshd's format and destination)."""

    def emit(self, record: logging.LogRecord) -> None:
        logging.getLogger().handle(record)


def route_libp2p_logs(*, interval_s: float = INTERVAL_S,
                      clock: Callable[[], float] = time.monotonic) -> bool:
    """Route ``libp2p`` warnings and errors to the root logger, rate limited, those about a
    broken connection as INFO (``LostConnectionFilter``), and rate limit meshd's ``peer
    rejected`` lines. Leaves libp2p alone when ``LIBP2P_DEBUG`` is set (its own logging setup
    is then what the user asked for); returns whether it routed."""
    attest = logging.getLogger("meshd.net.attest")
    if not any(isinstance(f, RateLimitFilter) for f in attest.filters):
        attest.addFilter(RateLimitFilter(RateLimit(interval_s), key=_rejection_kind, clock=clock))
    if os.environ.get("LIBP2P_DEBUG"):
        return False
    import libp2p  # noqa: F401 - its import sets up (detaches) the "libp2p" logger first

    lib = logging.getLogger("libp2p")
    for h in list(lib.handlers):
        if isinstance(h, _ToRoot):
            lib.removeHandler(h)
    handler = _ToRoot(level=logging.WARNING)
    handler.addFilter(LostConnectionFilter())
    handler.addFilter(RateLimitFilter(RateLimit(interval_s), clock=clock))
    lib.addHandler(handler)
    lib.setLevel(logging.WARNING)
    lib.propagate = False  # through the handler above, not twice
    return True


def _rejection_kind(record: logging.LogRecord) -> Hashable | None:
    """meshd.net.attest: ``peer rejected`` lines, one kind per (reason, peer); others pass."""
    if not str(record.msg).startswith("peer rejected") or not isinstance(record.args, tuple):
        return None
    args = record.args
    return str(record.msg), str(args[0]), str(args[2]) if len(args) > 2 else ""
