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


# What a node resumed after ~12 s of SIGSTOP logged through libp2p while it rejoined as usual
# (its peers had dropped it and reset their connections): every one was an ERROR.
PEER = "12D3KooWBSLdvqwPApW3gA9TFjB1nVspfWS8swcG2AwgoLzsmSha"
LOST = [
    ("libp2p.stream_muxer.yamux.yamux",
     f"Error in handle_incoming for peer {PEER}: ConnectionClosedError: TCP connection reset by "
     "remote peer: socket connection broken: [Errno 32] Broken pipe"),
    ("libp2p.protocol_muxer.multiselect_client",
     "MultiselectClient handshake: write failed: fail to write to multiselect communicator"),
    ("libp2p.host.basic_host",
     f"Failed to open stream to peer {PEER}:\n  Error: handshake write failed: fail to write to "
     "multiselect communicator\n  Protocols: ['/meshd/req/1.0.0']\n  Timeout: 30s"),
]


def test_a_broken_connection_is_one_info_line_not_an_error(routed: tuple[Clock, list[str]]) -> None:
    _, lines = routed
    for name, message in LOST:
        logging.getLogger(name).error(message)
    assert [ln.split(" ", 4)[2:4] for ln in lines] == [[name, "INFO"] for name, _ in LOST]
    assert "[Errno 32] Broken pipe" in lines[0]
    assert lines[2].endswith("Failed to open stream to peer " + PEER + ": Error: handshake write "
                             "failed: fail to write to multiselect communicator Protocols: "
                             "['/meshd/req/1.0.0'] Timeout: 30s")  # one line
    logging.getLogger("libp2p.stream_muxer.yamux.yamux").warning(
        "Stream %s: Unexpected error during window update: %s", 3, "Connection reset by peer")
    assert " INFO Stream 3: Unexpected error during window update: Connection reset by peer" in lines[-1]


def test_other_libp2p_errors_stay_errors(routed: tuple[Clock, list[str]]) -> None:
    _, lines = routed
    logging.getLogger("libp2p.stream_muxer.yamux.yamux").error(
        "Received GO_AWAY for peer%s: Protocol error", PEER)
    logging.getLogger("libp2p.host.basic_host").error(
        "Failed to open stream to peer %s: protocol not supported", PEER)
    assert [ln.split(" ", 4)[3] for ln in lines] == ["ERROR", "ERROR"]
