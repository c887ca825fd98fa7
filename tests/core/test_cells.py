"""Cells, summaries and probe picks (``meshd.core.cells``, ``.summary``, ``.summary_table``,
``.probes``): table tests of the pure parts the daemon and the simulator share."""

from __future__ import annotations

import random
from collections import Counter

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.core import cells, probes
from meshd.core.advert_check import AdvertChecker, Rejected
from meshd.core.cert import issue_certificate, peer_id_of, public_key_bytes
from meshd.core.messages import MessageType
from meshd.core.summary import (
    MAX_SUMMARY_BYTES,
    CellSummary,
    ModelSummary,
    Rep,
    check_summary,
    claimed_author,
    decode_summary,
    seal_summary,
)
from meshd.core.summary_table import SummaryTable
from meshd.core.wire import encode_message
from meshd.errors import ProtocolError

NOW = 1_750_000_000.0
CA = Ed25519PrivateKey.generate()


def member(name: str, region: str, serial: int) -> tuple[Ed25519PrivateKey, bytes, str]:
    key = Ed25519PrivateKey.generate()
    pub = public_key_bytes(key)
    cert = issue_certificate(ca_private_key=CA, serial=serial, name=name, node_public_key=pub,
                             not_before=int(NOW) - 60, not_after=int(NOW) + 3600,
                             labels={"region": region})
    return key, cert, peer_id_of(pub)


ALICE = member("alice", "eu", 2)
BOB = member("bob", "us", 3)
CHECKER = AdvertChecker("local", public_key_bytes(CA))


def by_region(pid: str, labels: dict[str, str]) -> str | None:
    return cells.cell_of(cells.LABEL, pid, labels)


def summary(author: str, cell: str = "eu", period: int = 7, ts: float = NOW, members: int = 3,
            models: int = 1) -> CellSummary:
    ms = tuple(ModelSummary(f"model-{i}", 2.5, 120.0, 1.0, 3.0, (author, "p2", "p3"))
               for i in range(models))
    reps = (Rep(author, "alice", ("/ip4/127.0.0.1/tcp/4001",)), Rep("p2", "b", ()), Rep("p3", "c", ()))
    return CellSummary(cell, author, period, ts, members, ms, reps, (1.0, 2.0))


# ------------------------------------------------------------------------------ assignment


def test_label_cells_come_from_the_certificate_label_and_are_topic_safe() -> None:
    assert cells.cell_of(cells.LABEL, "p", {"region": "eu-west"}) == "eu-west"
    assert cells.cell_of(cells.LABEL, "p", {"site": "a b/c"}, label_key="site") == "a_b_c"
    assert cells.cell_of(cells.LABEL, "p", {}) == cells.NO_LABEL
    assert cells.cell_of(cells.OFF, "p", {"region": "eu"}) is None
    assert cells.advert_topic(None) == "meshd/adverts/1"
    assert cells.advert_topic("eu") == "meshd/adverts/1/eu"


@pytest.mark.parametrize(("mesh", "size", "count"), [(0, 32, 1), (32, 32, 1), (33, 32, 2),
                                                     (40, 10, 4), (1_000_000, 32, 31_250)])
def test_cell_count(mesh: int, size: int, count: int) -> None:
    assert cells.cell_count(mesh, size) == count


def test_hash_cells_are_balanced_and_growth_moves_few_nodes() -> None:
    ids = [f"peer-{i}" for i in range(4000)]
    four = {p: cells.hash_cell(p, 4) for p in ids}
    sizes = Counter(four.values())
    assert set(sizes) == {"h0", "h1", "h2", "h3"} and min(sizes.values()) > 850
    five = {p: cells.hash_cell(p, 5) for p in ids}
    moved = sum(1 for p in ids if four[p] != five[p])
    assert 0.15 * len(ids) < moved < 0.25 * len(ids)  # about 1/5, not most of them
    assert all(five[p] == "h4" for p in ids if four[p] != five[p])


def test_the_summariser_rotates_and_skips_the_dead() -> None:
    members = [f"p{i}" for i in range(8)]
    picked = [cells.summariser(members, period) for period in range(200)]
    assert set(picked) == set(members)  # the duty rotates over every member
    assert cells.summariser(members, 5) == cells.summariser(list(reversed(members)), 5)
    dead = cells.summariser(members, 5)
    assert cells.summariser([m for m in members if m != dead], 5) != dead
    assert cells.summariser([], 5) is None


# ------------------------------------------------------------------------------ summaries


def test_a_summary_round_trips_and_checks() -> None:
    key, cert, pid = ALICE
    s = summary(pid)
    data = seal_summary(s, key.sign, cert)
    assert claimed_author(data) == pid
    out = check_summary(data, pid, NOW, CHECKER, by_region)
    assert out == s


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("other cell", "wrong_cell"),
        ("relayed as another author", "author_mismatch"),
        ("signed by another key", "bad_signature"),
        ("revoked", "unattested:revoked"),
        ("stale", "stale"),
        ("garbage", "malformed"),
    ],
)
def test_bad_summaries_are_rejected(case: str, reason: str) -> None:
    key, cert, pid = ALICE
    author, revoked = pid, frozenset[int]()
    if case == "other cell":
        data = seal_summary(summary(pid, cell="us"), key.sign, cert)
    elif case == "relayed as another author":
        data = seal_summary(summary(BOB[2], cell="eu"), key.sign, cert)
    elif case == "signed by another key":
        data = seal_summary(summary(pid), BOB[0].sign, cert)
    elif case == "revoked":
        data, revoked = seal_summary(summary(pid), key.sign, cert), frozenset({2})
    elif case == "stale":
        data = seal_summary(summary(pid, ts=NOW - 3600), key.sign, cert)
    else:
        data = encode_message(MessageType.ADVERT, {"body": b"\xc1", "sig": bytes(64), "cert": cert})
    out = check_summary(data, author, NOW, CHECKER, by_region, revoked=revoked)
    assert isinstance(out, Rejected) and out.reason == reason, out


def test_a_summary_is_capped_by_dropping_its_last_models() -> None:
    s = summary("a" * 52, models=16)
    s = CellSummary(s.cell, s.author, s.period, s.ts, s.members,
                    tuple(ModelSummary(m.name * 4, 1.0, 1.0, 0.0, 0.0,
                                       tuple(f"{m.name}-node-{j:02d}-" + "x" * 40 for j in range(8)))
                          for m in s.models),
                    tuple(Rep(f"{m.name}-node-{j:02d}-" + "x" * 40, "n", ("/ip4/10.0.0.1/tcp/4001",) * 2)
                          for m in s.models for j in range(2)), s.coord)
    body = s.encode()
    assert len(body) <= MAX_SUMMARY_BYTES
    back = decode_summary(body)
    assert 0 < len(back.models) < 16 and back.models[0] == s.models[0]


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=600))
def test_summary_decoding_raises_only_protocol_errors(data: bytes) -> None:
    try:
        decode_summary(data)
    except ProtocolError:
        pass
    assert claimed_author(data) is None or isinstance(claimed_author(data), str)


def test_the_summary_table_keeps_the_newest_and_forgets_a_silent_cell() -> None:
    t = SummaryTable(ttl_s=3.0)
    assert t.apply(summary("a", period=7), b"7", now=100.0, wall_now=NOW)
    assert not t.apply(summary("a", period=6), b"6", now=100.5, wall_now=NOW)  # older period
    assert t.apply(summary("b", period=7, members=4), b"7b", now=100.5, wall_now=NOW)  # more members
    assert t.apply(summary("a", cell="us", period=8), b"8", now=101.0, wall_now=NOW)
    assert t.signed() == [b"7b", b"8"]
    # handed over 2 s after it was published: it lives 1 s more, not 3
    assert t.apply(summary("c", cell="ap", period=8, ts=NOW), b"ap", now=102.0, wall_now=NOW + 2.0)
    assert t.expire(now=103.1) == ["ap"]
    assert t.expire(now=103.4) == []
    assert t.expire(now=103.6) == ["eu"]  # last published at 100.5
    assert t.expire(now=104.1) == ["us"]
    assert len(t) == 0
    assert not t.apply(summary("a", ts=NOW - 10), b"old", now=200.0, wall_now=NOW)  # too old


# ------------------------------------------------------------------------------ probes


def test_typical_wait_grows_with_the_queue() -> None:
    idle = probes.typical_wait_ms(0, 0, 2, 1000.0, 50.0, (100, 50))
    assert idle == pytest.approx(100.0)  # the prefill only
    assert probes.typical_wait_ms(0, 2, 2, 1000.0, 50.0, (100, 50)) > idle
    assert probes.typical_wait_ms(4, 2, 2, 1000.0, 50.0, (100, 50)) > probes.typical_wait_ms(
        1, 2, 2, 1000.0, 50.0, (100, 50))


def test_summarise_cell_names_the_least_loaded_per_model() -> None:
    rows = [(30.0, "c", ["m1"]), (10.0, "b", ["m1", "m2"]), (10.0, "a", ["m1"]), (5.0, "d", ["m2"])]
    top, best_of, best = probes.summarise_cell(rows, 2)
    assert top == {"m1": ["a", "b"], "m2": ["d", "b"]}
    assert best_of == {"m1": 10.0, "m2": 5.0} and best == 5.0
    assert probes.summarise_cell([], 2) == ({}, {}, float("inf"))


def test_rank_cells_keeps_the_near_best_and_at_least_four_per_probe() -> None:
    scored = [(float(i * 100), f"c{i}") for i in range(10)] + [(20.0, "near"), (49.0, "edge")]
    assert probes.rank_cells(scored, 1) == ["c0", "near", "edge", "c1"]
    assert probes.rank_cells(scored, 2) == ["c0", "near", "edge", "c1", "c2", "c3", "c4", "c5"]
    many = [(1.0 + i / 100, f"x{i:02d}") for i in range(40)]  # all within the slack
    assert len(probes.rank_cells(many, 1)) == 40
    assert probes.rank_cells([], 4) == []


def test_pick_probes_draws_cells_and_nodes_without_repeats() -> None:
    named = {f"c{i}": [f"c{i}-n{j}" for j in range(4)] for i in range(8)}
    rng = random.Random(3)
    seen: Counter[str] = Counter()
    for _ in range(400):
        picks = probes.pick_probes(list(named), named, 3, rng)
        assert len(picks) == 3 == len({p.split("-")[0] for p in picks})
        assert picks == sorted(picks)
        seen.update(picks)
    assert len(seen) == 32  # every node of every cell gets probed sometimes
    assert probes.pick_probes(["c0"], named, 4, rng)[0].startswith("c0-")
    assert probes.pick_probes([], named, 4, rng) == []


def test_pick_probes_prefers_linked_nodes_within_a_cell() -> None:
    named = {f"c{i}": [f"c{i}-n{j}" for j in range(4)] for i in range(4)}
    linked = {"c0-n2", "c1-n1", "c1-n3"}
    rng = random.Random(5)
    seen: Counter[str] = Counter()
    for _ in range(300):
        picks = probes.pick_probes(list(named), named, 4, rng, linked)
        assert len(picks) == 4
        seen.update(picks)
    assert {p for p in seen if p.startswith(("c0-", "c1-"))} == linked  # only the linked ones
    assert len([p for p in seen if p.startswith(("c2-", "c3-"))]) == 8  # no link: any named node


def test_worth_probing_only_when_another_cell_beats_ours_by_the_slack() -> None:
    slack = probes.PROBE_SLACK_MS
    assert not probes.worth_probing(20.0, [15.0, 400.0])  # a free member here: no probe
    assert not probes.worth_probing(20.0 + slack, [20.0])  # exactly the slack: not enough
    assert probes.worth_probing(20.0 + slack + 1, [20.0])
    assert probes.worth_probing(float("inf"), [900.0])  # our cell does not serve it
    assert not probes.worth_probing(float("inf"), [])  # nobody else does either


@pytest.mark.parametrize(
    ("members", "best"),
    [
        ([(0.0, 40.0), (12.0, 5.0)], 17.0),  # a free neighbour beats a busy self
        ([(0.0, 3.0), (12.0, 5.0)], 3.0),  # itself, at RTT 0
        ([], float("inf")),  # no member serves the model whole
    ],
)
def test_local_best_is_the_best_rtt_plus_wait_of_the_cell(
        members: list[tuple[float, float]], best: float) -> None:
    # the daemon's probe gate (meshd.node.cells) and the simulator's (meshd.sim.views) call it
    assert probes.local_best_ms(members) == best
    assert probes.local_best_ms(iter(members)) == best
