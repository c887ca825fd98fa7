"""libp2p's log lines go through meshd's logging, rate limited (issue 13, defect 12)."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from meshd.net.liblog import RateLimit, route_libp2p_logs

# (times of events of one kind, interval) -> what each event gets: None = dropped, else the
# number of dropped events it reports
TABLE = [
    ([0.0], 60.0, [0]),
    ([0.0, 2.0, 4.0, 6.0], 60.0, [0, None, None, None]),
    ([0.0, 2.0, 4.0, 60.0, 62.0, 121.0], 60.0, [0, None, None, 2, None, 1]),
    ([0.0, 60.0, 120.0], 60.0, [0, 0, 0]),
    ([0.0, 0.5, 1.0], 1.0, [0, None, 1]),
]


@pytest.mark.parametrize(("times", "interval", "expect"), TABLE)
def test_rate_limit_table(times: list[float], interval: float, expect: list[int | None]) -> None:
    rl = RateLimit(interval)
    got = []
    for t in times:
        ok, held = rl.allow("k", t)
        got.append(held if ok else None)
    assert got == expect


def test_kinds_are_limited_apart_and_the_table_is_bounded() -> None:
    rl = RateLimit(60.0, max_keys=2)
    assert rl.allow("a", 0.0) == (True, 0)
    assert rl.allow("b", 1.0) == (True, 0)
    assert rl.allow("a", 2.0) == (False, 0)
    assert rl.allow("c", 3.0) == (True, 0)  # forgets "a", the oldest
    assert len(rl._slots) == 2
    assert rl.allow("a", 4.0) == (True, 0)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def routed(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Clock, list[str]]]:
    monkeypatch.delenv("LIBP2P_DEBUG", raising=False)
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect()
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    lib = logging.getLogger("libp2p")
    attest = logging.getLogger("meshd.net.attest")
    saved = (lib.handlers[:], lib.level, lib.propagate, attest.filters[:], root.level)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    clock = Clock()
    try:
        assert route_libp2p_logs(interval_s=60.0, clock=clock)
        yield clock, lines
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[4])
        lib.handlers[:] = saved[0]
        lib.setLevel(saved[1])
        lib.propagate = saved[2]
        attest.filters[:] = saved[3]


def test_libp2p_lines_get_meshd_format_and_a_rate_limit(routed: tuple[Clock, list[str]]) -> None:
    clock, lines = routed
    swarm = logging.getLogger("libp2p.network.swarm")  # the logger of the bare line in the issue
    for _ in range(30):  # an outsider redialling every 2 s for a minute
        swarm.error("failed to upgrade security for peer %s: %s", "12D3KooWOutsider",
                    "handshake failed when upgrading to secure connection")
        clock.now += 2.0
    swarm.error("failed to upgrade security for peer %s: %s", "12D3KooWOutsider", "again")
    assert len(lines) == 2, lines
    assert all(" libp2p.network.swarm ERROR failed to upgrade security" in ln for ln in lines)
    assert lines[0][:4].isdigit()  # timestamped
    assert lines[1].endswith("again suppressed=29")
    swarm.debug("not shown")
    assert len(lines) == 2


def test_peer_rejected_lines_are_limited_per_reason_and_peer(
        routed: tuple[Clock, list[str]]) -> None:
    _, lines = routed
    attest = logging.getLogger("meshd.net.attest")
    for peer in ("A", "B"):
        for _ in range(5):
            attest.warning("peer rejected reason=%s direction=%s peer_id=%s address=%s detail=%r",
                           "wrong_ca", "inbound", peer, "-", "x")
    attest.info("peer attested peer_id=%s", "C")
    attest.info("peer attested peer_id=%s", "C")
    assert [ln.split(" peer_id=")[1][0] for ln in lines if "rejected" in ln] == ["A", "B"]
    assert sum("attested" in ln for ln in lines) == 2
