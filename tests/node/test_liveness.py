"""Liveness decisions (meshd/node/liveness.py): whom to ping, who stalled. Pure; time is passed in."""

from __future__ import annotations

import random

import pytest

from meshd.config import GossipConfig, parse_config
from meshd.errors import ConfigError
from meshd.node.liveness import UNANSWERED_FACTOR, Liveness

INTERVAL, BUSY, STALL = 10.0, 1.0, 3.0


def make(jitter: float = 0.0) -> Liveness:
    return Liveness(ping_interval_s=INTERVAL, busy_silence_s=BUSY, stall_timeout_s=STALL,
                    jitter=jitter, rng=random.Random(1))


def test_a_new_link_is_pinged_at_once_then_only_every_interval() -> None:
    lv = make()
    lv.track("p", 0.0)
    assert lv.decide(0.0).ping == ("p",)
    lv.ping_sent("p", 0.0)
    lv.answered("p", 0.002)
    for t in (0.5, 2.0, 5.0, 9.9):
        assert lv.decide(t).ping == (), t
    assert lv.decide(10.0).ping == ("p",)


def test_an_idle_link_costs_one_ping_per_interval_over_a_minute() -> None:
    lv = make(jitter=0.25)
    lv.track("p", 0.0)
    pings = 0
    t = 0.0
    while t < 60.0:
        if lv.decide(t).ping:
            pings += 1
            lv.ping_sent("p", t)
            lv.answered("p", t + 0.002)
        t += 0.25
    # the old scheme pinged every 2 s (30 a minute); jitter keeps the mean at the interval
    assert 5 <= pings <= 8, pings


@pytest.mark.parametrize(
    ("heard_at", "now", "busy", "expect_ping"),
    [
        (0.0, 0.5, True, False),  # a busy peer heard half a second ago: no ping
        (0.0, 1.0, True, True),  # ... silent for busy_silence_s: ping it
        (0.0, 1.0, False, False),  # an idle peer silent as long: its RTT ping is not due
        (4.0, 4.9, True, False),  # frames keep arriving from a busy peer (tokens): no ping
    ],
)
def test_busy_peers_are_pinged_when_silent(heard_at: float, now: float, busy: bool,
                                            expect_ping: bool) -> None:
    lv = make()
    lv.track("p", -1.0)
    lv.ping_sent("p", -1.0)
    lv.answered("p", -0.999)
    lv.heard("p", heard_at)
    assert (lv.decide(now, {"p"} if busy else ()).ping == ("p",)) is expect_ping


def test_a_frozen_peer_stalls_after_the_timeout_of_an_unanswered_ping() -> None:
    lv = make()
    lv.track("p", 0.0)
    lv.ping_sent("p", 0.0)  # ... and no answer ever comes
    assert lv.decide(STALL - 0.01).stalled == ()
    (peer, reason), = lv.decide(STALL).stalled
    assert peer == "p" and "stalled" in reason
    # no second ping while one is unanswered
    assert lv.decide(STALL + 5).ping == ()


def test_any_frame_after_the_ping_keeps_a_slow_peer_alive() -> None:
    lv = make()
    lv.track("p", 0.0)
    lv.ping_sent("p", 0.0)
    lv.heard("p", 2.5)  # a gossip frame: the peer is alive, only slow to answer
    assert lv.decide(4.0).stalled == ()
    assert lv.decide(5.5).stalled != ()  # silent for stall_timeout_s since


def test_a_peer_that_never_answers_pings_stalls_even_if_other_frames_arrive() -> None:
    lv = make()
    lv.track("p", 0.0)
    lv.ping_sent("p", 0.0)
    limit = UNANSWERED_FACTOR * STALL
    t = 0.0
    while t < limit:
        lv.heard("p", t)  # gossip keeps coming, the request stream is wedged
        assert lv.decide(t).stalled == (), t
        t += 0.5
    lv.heard("p", limit)
    (_, reason), = lv.decide(limit).stalled
    assert "unanswered" in reason


def test_a_pong_clears_the_stall_and_forgotten_peers_are_ignored() -> None:
    lv = make()
    lv.track("p", 0.0)
    lv.track("q", 0.0)
    lv.ping_sent("p", 0.0)
    lv.ping_sent("q", 0.0)
    lv.answered("p", 2.0)
    lv.forget("q")
    lv.heard("q", 1.0)  # unknown now: no effect, no error
    d = lv.decide(10.0)
    assert d.stalled == () and "q" not in lv and len(lv) == 1


def test_decisions_are_sorted_so_ties_are_deterministic() -> None:
    lv = make()
    for p in ("c", "a", "b"):
        lv.track(p, 0.0)
    assert lv.decide(0.0).ping == ("a", "b", "c")


@pytest.mark.parametrize(("gossip", "key"), [
    ({"ping_interval_s": 0.0}, "ping_interval_s"),
    ({"busy_ping_after_s": -1.0}, "busy_ping_after_s"),
    ({"stall_timeout_s": 0.0}, "stall_timeout_s"),
    ({"ping_interval_s": 30.0}, "stream_idle_timeout_s"),  # 60 s < 3 x 30 s
    ({"stream_idle_timeout_s": 20.0}, "stream_idle_timeout_s"),  # < 3 x 10 s
])
def test_bad_liveness_settings_are_config_errors_naming_the_key(gossip: dict[str, float], key: str) -> None:
    with pytest.raises(ConfigError, match=key):
        parse_config({"gossip": gossip}, "meshd.toml")


def test_the_default_liveness_settings_are_valid_and_stall_is_no_longer_tied_to_the_interval() -> None:
    g = parse_config({"gossip": {"ping_interval_s": 10.0, "stall_timeout_s": 3.0}}, "meshd.toml").gossip
    assert g == GossipConfig()


def test_next_check_is_the_first_moment_a_decision_can_change() -> None:
    lv = make()
    assert lv.next_check(5.0) == float("inf")  # no peers: nothing falls due
    lv.track("p", 0.0)
    lv.ping_sent("p", 0.0)
    lv.answered("p", 0.01)
    lv.track("q", 0.0)
    lv.ping_sent("q", 0.0)
    lv.answered("q", 0.01)
    assert lv.next_check(1.0) == INTERVAL  # the next RTT pings
    assert lv.next_check(1.0, busy={"q"}) == 0.01 + BUSY  # a silent peer a request waits on
    assert lv.decide(0.01 + BUSY, busy={"q"}).ping == ("q",)
    assert lv.decide(0.01 + BUSY - 1e-6, busy={"q"}).ping == ()
    lv.ping_sent("q", 2.0)  # unanswered: its stall is next
    lv.ping_sent("p", 2.0)
    lv.heard("p", 2.5)
    assert lv.next_check(2.1) == 2.0 + STALL
    assert lv.decide(2.0 + STALL).stalled[0][0] == "q"
    lv.forget("q")
    assert lv.next_check(2.1) == 2.5 + STALL  # p was heard after its ping: its silence counts
    assert lv.next_check(100.0) == 100.0  # overdue: now
    # every instant before next_check decides the same as the one before
    for t in (2.2, 3.0, 4.0, 5.49):
        assert lv.decide(t) == lv.decide(2.2)
