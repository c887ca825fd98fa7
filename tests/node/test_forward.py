"""``serve_request``'s failover and hedging logic, with scripted attempts (no network).

Each target follows a script: wait, send tokens, die, or answer busy. The real daemons' tests
(test_failover_live.py) cover the same paths end to end; these pin down the decisions.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest
import trio
import trio.testing

from meshd.core.messages import MessageType
from meshd.core.routing import RouteDecision
from meshd.core.wire import MAX_REQUEST_FRAME, FrameDecoder
from meshd.errors import BusyError, PeerGoneError
from meshd.node.coalesce import FrameBatcher
from meshd.node.forward import Target, serve_request

GREEDY = list(range(100, 120))  # what any healthy target generates from the prompt


def decision(*order: str) -> RouteDecision:
    return RouteDecision("r1", "meshd", (), tuple(order), (), 0)


def run(order: list[str], scripts: dict[str, Any], *, hedge_after_s: float | None = None,
        first_token_timeout_s: float = 5.0, targets: dict[str, Target] | None = None,
        ) -> tuple[Any, list[tuple[str, list[int]]], list[str]]:
    targets = targets or {p: Target(p, p, False) for p in order}
    calls: list[tuple[str, list[int]]] = []
    journal: list[str] = []

    async def start_attempt(target: Target, resume: list[int], chan: Any) -> None:
        calls.append((target.name, list(resume)))
        await scripts[target.name](resume, chan)

    async def sink(kind: str, payload: dict[str, Any]) -> None:
        pass

    async def main() -> Any:
        return await serve_request(
            decision(*order), targets, start_attempt, sink, entry_name="entry",
            hedge_after_s=hedge_after_s, first_token_timeout_s=first_token_timeout_s,
            journal=lambda kind, payload: journal.append(kind),
        )

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)), calls, journal


def healthy(delay_s: float = 0.0, per_token_s: float = 0.0) -> Any:
    async def script(resume: list[int], chan: Any) -> None:
        await trio.sleep(delay_s)
        for tok in GREEDY[len(resume):]:
            await chan.send(("tokens", {"ids": [tok], "text": f"<{tok}>"}))
            await trio.sleep(per_token_s)
        await chan.send(("done", {"stats": {}}))
    return script


def dies_after(k: int, delay_s: float = 0.0) -> Any:
    async def script(resume: list[int], chan: Any) -> None:
        await trio.sleep(delay_s)
        for tok in GREEDY[len(resume):len(resume) + k]:
            await chan.send(("tokens", {"ids": [tok], "text": f"<{tok}>"}))
            await trio.sleep(0.01)
        raise PeerGoneError("killed")
    return script


def busy() -> Any:
    async def script(resume: list[int], chan: Any) -> None:
        raise BusyError("queue full")
    return script


def refuses_then_serves(wait_ms: float) -> Any:
    """Answers busy (with its wait) to a bounded attempt, serves an unbounded one."""
    async def script(resume: list[int], chan: Any) -> None:
        if script.bounded:  # type: ignore[attr-defined]
            raise BusyError("cannot start in time", wait_ms=wait_ms)
        await healthy()(resume, chan)
    script.bounded = True  # type: ignore[attr-defined]
    return script


def bounded(**predicted: float) -> dict[str, Target]:
    """Targets in the given order; all but the last carry a wait bound, as wait_bounds gives."""
    names = list(predicted)
    return {p: Target(p, p, False, max_wait_ms=50.0 if i < len(names) - 1 else None,
                      predicted_ms=ms, known_ms=5.0) for i, (p, ms) in enumerate(predicted.items())}


def test_death_after_k_tokens_resumes_elsewhere_with_those_tokens() -> None:
    out, calls, journal = run(["a", "b"], {"a": dies_after(5), "b": healthy()})
    assert out.error is None
    assert out.tokens == GREEDY
    assert calls == [("a", []), ("b", GREEDY[:5])]
    # the route is the path of the node that served, not of the one that died (issue 13, 9)
    assert out.route == ["entry", "b"] and out.served_by == "b"
    assert "retry" in journal


def test_busy_moves_on_to_the_next_candidate() -> None:
    out, calls, _ = run(["a", "b"], {"a": busy(), "b": healthy()})
    assert out.tokens == GREEDY and [c[0] for c in calls] == ["a", "b"]
    assert out.retries[0]["busy"] is True


def test_every_candidate_failing_is_an_error_not_a_hang() -> None:
    out, _, _ = run(["a", "b"], {"a": busy(), "b": dies_after(0)})
    assert out.error is not None and out.error_code is not None


def test_hedge_wins_when_the_primary_is_slow() -> None:
    out, calls, journal = run(["a", "b"], {"a": healthy(delay_s=2.0), "b": healthy()},
                              hedge_after_s=0.05)
    assert out.tokens == GREEDY and out.served_by == "b"
    assert [c[0] for c in calls] == ["a", "b"] and "hedge" in journal


def test_hedge_loser_is_kept_for_failover_when_the_winner_dies() -> None:
    # a is slow to start so b is hedged; a then answers first (b is slower still) and dies after
    # 3 tokens: the request must fail over to b, the copy that lost the race, not give up
    out, calls, _ = run(["a", "b"], {"a": dies_after(3, delay_s=0.1), "b": healthy(delay_s=1.0)},
                        hedge_after_s=0.05)
    assert out.error is None, out.error
    assert out.tokens == GREEDY
    assert calls[-1] == ("b", GREEDY[:3])


def test_no_first_token_in_time_tries_the_next() -> None:
    out, calls, _ = run(["a", "b"], {"a": healthy(delay_s=5.0), "b": healthy()},
                        first_token_timeout_s=0.1)
    assert out.tokens == GREEDY and out.served_by == "b"
    assert out.retries and "first token" in out.retries[0]["reason"]


# --- FrameBatcher: the serving side's coalescing of every request on one stream --------------


class _Recorder:
    """Stands in for a FramedStream: keeps each write as (time, frames in it)."""

    def __init__(self, fail: bool = False) -> None:
        self.writes: list[tuple[float, list[dict[str, Any]]]] = []
        self.fail = fail
        self.stats: dict[str, int] = {}  # the batcher's counters

    async def send_raw(self, data: bytes) -> None:
        if self.fail:
            raise PeerGoneError("stream write failed")
        dec = FrameDecoder(MAX_REQUEST_FRAME)
        dec.feed(data)
        self.writes.append((trio.current_time(), list(dec.messages())))
        assert dec.pending_bytes == 0  # whole frames only


def _batched(producers: dict[str, int], per_token_s: float, interval_s: float,
             **kw: Any) -> _Recorder:
    """Run one batcher fed by one task per request; each sends its tokens then DONE."""
    rec = _Recorder()

    async def produce(b: FrameBatcher, rid: str, n: int) -> None:
        for k in range(n):
            b.token(rid, k, f"<{k}>")
            await trio.sleep(per_token_s)
        b.finish(rid, MessageType.DONE, {"rid": rid, "stats": {}})

    async def main() -> None:
        b = FrameBatcher(rec, interval_s, stats=rec.stats, **kw)
        async with trio.open_nursery() as nursery:
            await nursery.start(b.run)
            async with trio.open_nursery() as producers_nursery:
                for rid, n in producers.items():
                    producers_nursery.start_soon(produce, b, rid, n)
            await trio.testing.wait_all_tasks_blocked()
            assert b.pending() == 0
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return rec


def _per_request(rec: _Recorder) -> dict[str, list[Any]]:
    """Each request's token ids in arrival order, then "DONE"."""
    got: dict[str, list[Any]] = {}
    for _, frames in rec.writes:
        for f in frames:
            if f["t"] == MessageType.TOKENS:
                assert f["text"] == "".join(f"<{k}>" for k in f["ids"])
                got.setdefault(f["rid"], []).extend(f["ids"])
            else:
                assert f["t"] == MessageType.DONE
                got.setdefault(f["rid"], []).append("DONE")
    return got


def test_concurrent_requests_share_writes_and_keep_their_order() -> None:
    reqs = {"a": 200, "b": 200, "c": 200, "d": 200}
    rec = _batched(reqs, per_token_s=0.0005, interval_s=0.01)
    assert _per_request(rec) == {rid: [*range(n), "DONE"] for rid, n in reqs.items()}
    assert rec.stats == {"token_writes": len(rec.writes), "tokens_sent": 800,
                         "token_frames": sum(len(frames) for _, frames in rec.writes)}
    # 800 tokens over 0.1 s: one write per 10 ms plus the first tokens and ends of the four,
    # not one per request per interval (40) nor one per token (800).
    assert len(rec.writes) <= 0.1 / 0.01 + 4 + 4 + 1, len(rec.writes)
    shared = [frames for _, frames in rec.writes if len({f["rid"] for f in frames}) == 4]
    assert len(shared) >= 5


def test_first_tokens_go_at_once_then_at_most_one_write_per_interval() -> None:
    rec = _batched({"a": 50}, per_token_s=0.001, interval_s=0.01)
    times = [t for t, _ in rec.writes]
    assert times[0] == 0.0 and rec.writes[0][1][0]["ids"] == [0]  # the first token, unbatched
    gaps = [b - a for a, b in itertools.pairwise(times[:-1])]  # the last write is the DONE
    assert gaps and min(gaps) >= 0.01 - 1e-9
    assert _per_request(rec) == {"a": [*range(50), "DONE"]}


def test_a_full_buffer_is_written_before_the_interval() -> None:
    rec = _batched({"a": 40}, per_token_s=0.0001, interval_s=1.0, max_batch_tokens=8)
    assert [len(f["ids"]) for _, frames in rec.writes for f in frames if "ids" in f] == [1, 8, 8, 8, 8, 7]
    assert rec.writes[-1][0] < 1.0  # never waited for the interval


def test_a_failed_stream_stops_the_batcher_quietly() -> None:
    rec = _Recorder(fail=True)

    async def main() -> None:
        b = FrameBatcher(rec, 0.01)
        with trio.fail_after(5):  # run() must return, not keep going
            async with trio.open_nursery() as nursery:
                nursery.start_soon(b.run)
                b.token("a", 1, "x")
        with pytest.raises(PeerGoneError):  # the request stops generating for nobody
            b.token("a", 2, "y")
        b.finish("a", MessageType.DONE, {"rid": "a"})  # dropped quietly
        assert b.pending() == 0 and rec.writes == []

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))



@pytest.mark.parametrize(
    ("predicted", "waits", "want_calls", "want_bounds"),
    [
        # a and b refuse; c is predicted slower than going back to a (30 + 5 ms): back to a
        ({"a": 20.0, "b": 30.0, "c": 200.0}, {"a": 30.0, "b": 500.0}, ["a", "b", "a"],
         [50.0, 50.0, None]),
        # c is predicted sooner than either refuser: c, checked against a's wait (35 - 5 ms,
        # never under the 50 ms floor), and it starts in time
        ({"a": 20.0, "b": 30.0, "c": 20.0}, {"a": 30.0, "b": 500.0}, ["a", "b", "c"],
         [50.0, 50.0, 50.0]),
        # c's advert said free but it would wait 2 s: it refuses the check, back to a (unbounded)
        ({"a": 20.0, "b": 30.0, "c": 20.0}, {"a": 300.0, "b": 500.0, "c": 2000.0},
         ["a", "b", "c", "a"], [50.0, 50.0, 300.0, None]),
        # b, the last (planned unbounded), is checked against a's wait and turns out full (busy
        # with no estimate): back to a, which only refused
        ({"a": 20.0, "b": 30.0}, {"a": 300.0, "b": None}, ["a", "b", "a"], [50.0, 300.0, None]),
    ],
)
def test_wait_refusals_move_on_then_go_where_it_is_soonest(
    predicted: dict[str, float], waits: dict[str, float | None], want_calls: list[str],
    want_bounds: list[float | None],
) -> None:
    order = list(predicted)
    scripts: dict[str, Any] = {p: healthy() for p in order}
    for p, w in waits.items():
        scripts[p] = busy() if w is None else refuses_then_serves(w)
    bounds: list[float | None] = []
    calls: list[str] = []

    async def start(target: Target, resume: list[int], chan: Any) -> None:
        calls.append(target.name)
        bounds.append(target.max_wait_ms)
        script = scripts[target.name]
        if hasattr(script, "bounded"):
            script.bounded = target.max_wait_ms is not None
        await script(resume, chan)

    async def sink(kind: str, payload: dict[str, Any]) -> None:
        pass

    async def main() -> Any:
        return await serve_request(
            decision(*order), bounded(**predicted), start, sink, entry_name="entry",
            hedge_after_s=None, first_token_timeout_s=5.0, journal=lambda kind, payload: None,
        )

    out = trio.run(main)
    assert out.error is None and out.tokens == GREEDY
    assert calls == want_calls
    assert bounds == want_bounds  # where it was served back at a refuser: without a bound
    assert len(out.retries) == len(want_calls) - 1


# ---------------------------------------------------------------------------- a new decision


class _Hop:
    def __init__(self, peer_id: str, start: int, end: int) -> None:
        self.peer_id = self.name = peer_id
        self.layer_start, self.layer_end = start, end


class _Plan:
    def __init__(self, *hops: _Hop) -> None:
        self.hops = hops


def drive(first: Any, scripts: dict[str, Any], decisions: list[Any],
          ) -> tuple[Any, list[tuple[str, list[int]]], list[Any]]:
    """The daemon's trio loop around the request's machine, with scripted attempts (a plan's
    script is keyed by its chain, "s1 -> s2") and scripted new decisions."""
    from meshd.core.decide import Decision
    from meshd.core.request_life import Decided, RequestLife, SendPlan
    from meshd.node.forward import Driver, route_from

    calls: list[tuple[str, list[int]]] = []
    asked: list[Any] = []

    def targets(order: tuple[str, ...]) -> dict[str, Target]:
        return {p: Target(p, p, False) for p in order}

    async def start(action: Any, target: Any, resume: list[int], chan: Any) -> None:
        name = (" -> ".join(h.name for h in action.plan.hops) if isinstance(action, SendPlan)
                else target.name)
        calls.append((name, list(resume)))
        await scripts[name](resume, chan)

    async def redecide(a: Any, plan: Any, failed: Any, tokens: int) -> Any:
        asked.append((a.exclude, failed is not None, tokens))
        if not decisions:
            from meshd.errors import RoutingError
            raise RoutingError("nothing left")
        d = decisions.pop(0)
        return (Decision("meshd", plan=d) if isinstance(d, _Plan)
                else Decision("meshd", route=decision(*d))), targets(() if isinstance(d, _Plan) else d)

    async def sink(kind: str, payload: dict[str, Any]) -> None:
        pass

    async def main() -> Any:
        if isinstance(first, _Plan):
            ts: dict[str, Target] = {}
            ev = Decided(plan=first)
        else:
            ts = targets(first)
            ev = Decided(route_from(first, ts, None))
        d = Driver(ts, start, sink, entry_name="entry", journal=lambda k, p: None,
                   life=RequestLife(started_s=trio.current_time()), redecide=redecide)
        return await d.drive(ev)

    return trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0)), calls, asked


def stage_dies_after(k: int, culprit: str) -> Any:
    async def script(resume: list[int], chan: Any) -> None:
        from meshd.node.forward import StageFailure

        await chan.send(("route", {"served_by": "s2", "route": ["entry", "s1", "s2"]}))
        for tok in GREEDY[len(resume):len(resume) + k]:
            await chan.send(("tokens", {"ids": [tok], "text": f"<{tok}>"}))
        raise StageFailure(f"stage peer {culprit} gone", {culprit})
    return script


def test_when_the_order_is_spent_the_daemon_decides_again_without_the_nodes_tried() -> None:
    out, calls, asked = drive(("a", "b"), {"a": dies_after(4), "b": busy(), "c": healthy()},
                              [("c",)])
    assert out.error is None and out.tokens == GREEDY and out.served_by == "c"
    assert calls == [("a", []), ("b", GREEDY[:4]), ("c", GREEDY[:4])]
    assert asked == [(frozenset({"a", "b"}), False, 4)]


def test_no_new_route_fails_with_no_route_naming_the_last_failure() -> None:
    out, _, asked = drive(("a",), {"a": dies_after(2)}, [])
    assert out.error_code == "no_route" and "killed" in out.error and "nothing left" in out.error
    assert len(asked) == 1


def test_a_failed_stage_may_go_on_along_one_whole_model_node_with_the_tokens_so_far() -> None:
    chain = _Plan(_Hop("s1", 0, 2), _Hop("s2", 2, 4))
    out, calls, asked = drive(chain, {"s1 -> s2": stage_dies_after(6, "s2"), "w": healthy()},
                              [("w",)])
    assert out.error is None and out.tokens == GREEDY and out.served_by == "w"
    assert calls == [("s1 -> s2", []), ("w", GREEDY[:6])]
    assert asked == [(frozenset({"s2"}), True, 6)]  # the blamed stage is left out


def test_three_failures_end_the_request_with_the_last_error() -> None:
    out, calls, _ = drive(("a", "b", "c", "d"), {p: dies_after(1) for p in "abcd"}, [])
    assert [c[0] for c in calls] == ["a", "b", "c"]
    assert out.error_code == "peer_gone" and out.tokens == GREEDY[:3]
