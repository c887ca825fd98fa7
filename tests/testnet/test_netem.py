"""The pure part of the link emulator: header parsing and the per-pair delay schedule."""

from __future__ import annotations

import struct

import pytest

from meshd.testnet.netem import OneWay, Schedule, build_links, ip4, ipv4_pair, percentile
from meshd.testnet.netns import plan_network, prefix_for
from meshd.testnet.scenario import LinkSpec

A, B, C = "10.77.1.2", "10.77.2.2", "10.77.3.2"


def packet(src: str, dst: str, payload: bytes = b"", version: int = 4, ihl: int = 5) -> bytes:
    header = struct.pack("!BBHHHBBH4s4s", (version << 4) | ihl, 0, 20 + len(payload), 1, 0, 64, 6, 0,
                         ip4(src), ip4(dst))
    return header + payload


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (packet(A, B), (ip4(A), ip4(B))),
        (packet(B, A, b"xyz"), (ip4(B), ip4(A))),
        (packet(A, B, version=6), None),  # IPv6 (or anything not v4) is not parsed
        (packet(A, B, ihl=4), None),  # a header shorter than 20 bytes is malformed
        (packet(A, B)[:19], None),  # truncated
        (b"", None),
    ],
)
def test_ipv4_pair(data: bytes, expected: tuple[bytes, bytes] | None) -> None:
    assert ipv4_pair(data) == expected


@pytest.mark.parametrize(
    ("spec", "one_way"),
    [
        (LinkSpec(40.0), OneWay(20.0, 0.0, 0.0)),
        (LinkSpec(90.0, 4.0, 1.0), OneWay(45.0, 2.0, 1.0)),  # RTT jitter splits over both ways
        (LinkSpec(0.0), OneWay(0.0, 0.0, 0.0)),
    ],
)
def test_one_way_from_rtt(spec: LinkSpec, one_way: OneWay) -> None:
    assert OneWay.from_link(spec) == one_way


def test_build_links_is_symmetric() -> None:
    links = build_links({"a": A, "b": B}, {("a", "b"): LinkSpec(40.0, 2.0)})
    assert links == {(ip4(A), ip4(B)): OneWay(20.0, 1.0), (ip4(B), ip4(A)): OneWay(20.0, 1.0)}


def schedule(**links: OneWay) -> Schedule:
    table = {}
    for name, one in links.items():
        src, dst = {"ab": (A, B), "ba": (B, A), "ac": (A, C)}[name]
        table[(ip4(src), ip4(dst))] = one
    return Schedule(table, seed=3)


def test_fixed_delay_and_due_order() -> None:
    s = schedule(ab=OneWay(20.0), ac=OneWay(5.0))
    assert s.offer(packet(A, B, b"1"), 1.000) == pytest.approx(1.020)
    assert s.offer(packet(A, C, b"2"), 1.001) == pytest.approx(1.006)
    assert s.next_due() == pytest.approx(1.006)
    assert s.due(1.005) == []
    assert [p[-1:] for _, p in s.due(1.030)] == [b"2", b"1"]  # the nearer peer's packet first
    assert len(s) == 0 and s.next_due() is None
    assert s.stats.delayed == 2


def test_unknown_pairs_and_non_ipv4_pass_at_once() -> None:
    s = schedule(ab=OneWay(20.0))
    assert s.offer(packet(C, A), 5.0) == 5.0
    assert s.offer(b"\x60" + b"\x00" * 39, 5.0) == 5.0
    assert len(s.due(5.0)) == 2
    assert (s.stats.passed, s.stats.not_ipv4, s.stats.delayed) == (1, 1, 0)


def test_jitter_stays_in_bounds_and_is_reproducible() -> None:
    def dues(seed: int) -> list[float]:
        s = Schedule({(ip4(A), ip4(B)): OneWay(20.0, 4.0)}, seed=seed, reorder=True)
        return [s.offer(packet(A, B), float(i)) - i for i in range(2000)]  # type: ignore[operator]

    d = dues(5)
    assert d == dues(5) and d != dues(6)
    assert 0.016 - 1e-9 <= min(d) < 0.0165 and 0.0235 < max(d) <= 0.024 + 1e-9
    assert sum(d) / len(d) == pytest.approx(0.020, abs=0.0003)


def test_fifo_per_pair_unless_reordering_is_allowed() -> None:
    one = OneWay(20.0, 10.0)
    for reorder in (False, True):
        s = Schedule({(ip4(A), ip4(B)): one}, seed=1, reorder=reorder)
        for i in range(200):
            s.offer(packet(A, B, i.to_bytes(2, "big")), i * 0.0001)  # back to back
        order = [int.from_bytes(p[-2:], "big") for _, p in s.due(10.0)]
        assert sorted(order) == list(range(200))
        assert (order == list(range(200))) is (not reorder)


def test_fifo_is_per_pair_not_global() -> None:
    s = schedule(ab=OneWay(50.0), ac=OneWay(1.0))
    s.offer(packet(A, B, b"slow"), 0.0)
    assert s.offer(packet(A, C, b"fast"), 0.0) == pytest.approx(0.001)  # not held behind A->B


def test_loss_rate_is_close_to_the_configured_one() -> None:
    s = Schedule({(ip4(A), ip4(B)): OneWay(1.0, 0.0, 5.0)}, seed=9)
    dropped = sum(s.offer(packet(A, B), 0.0) is None for _ in range(20000))
    assert dropped == s.stats.dropped
    assert 0.04 < dropped / 20000 < 0.06


def test_percentile() -> None:
    assert percentile([], 50) == 0.0
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile(range(101), 99) == 99


def test_network_plan_names_and_addresses(tmp_path: object) -> None:
    plan = plan_network("mdabc123", ["eu-1", "us-1"])
    assert plan.router == "mdabc123-r"
    assert [(n.netns, n.ip, n.router_ip, n.router_veth) for n in plan.nodes] == [
        ("mdabc123-1", "10.77.1.2", "10.77.1.1", "v1"), ("mdabc123-2", "10.77.2.2", "10.77.2.1", "v2")]
    assert plan.address("us-1") == "10.77.2.2"
    assert type(plan).from_json(plan.to_json()) == plan


def test_prefix_is_stable_and_short(tmp_path: object) -> None:
    from pathlib import Path

    p = Path(str(tmp_path))
    assert prefix_for(p) == prefix_for(p / ".") != prefix_for(p / "other")
    assert len(prefix_for(p) + "-250") <= 15  # fits an interface-name-sized namespace name
