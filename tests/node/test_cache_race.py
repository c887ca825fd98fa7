"""The semantic lookup and the model, raced by the request's machine (``RequestLife``, driven by
``meshd.node.forward.Driver``; the lookup fed in by ``meshd.node.entry.cache.pending_lookup``,
a hit served by ``serve_cached``, as the execute step does). Forwarded to a peer, the model
starts while the lookup runs: nothing of it reaches the client before the lookup has decided; a
hit cancels it (or drops its finished answer) and serves the cached one; a miss lets its events
out in order. Served here, the lookup decides first and a hit runs no model. With no route, a
hit still answers and a miss fails with the route's error. Mock clock: the model and the lookup
are fakes that take a set time."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import trio
import trio.testing

from meshd.cache import Lookup
from meshd.core.request import parse_submit
from meshd.core.request_life import Decided, NoRoute, RequestLife, Route
from meshd.errors import ErrorCode
from meshd.node.edge_cache import PendingLookup
from meshd.node.entry.cache import pending_lookup, serve_cached
from meshd.node.entry.context import EntryContext
from meshd.node.forward import Driver, Target

HOST: Any = SimpleNamespace(node_name="n1", peer_id="me",
                            runner=SimpleNamespace(get=lambda model: None, ready=lambda model: False))


def race(lookup_s: float, kind: str, model_s: tuple[float, float], served_by: str | None = "peer2"
         ) -> tuple[EntryContext, list[tuple[float, str, dict[str, Any]]], dict[str, Any]]:
    """The client's events (time, kind, payload) and the journal's kinds (``ctx.extra["j"]``);
    the model's first token comes at ``model_s[0]``, its answer at ``model_s[1]``; the lookup
    answers ``kind`` at ``lookup_s``. ``served_by`` None: the route step found no node."""
    seen: list[tuple[float, str, dict[str, Any]]] = []
    model: dict[str, Any] = {"cancelled": False, "finished": False, "started": -1.0}
    journal: list[str] = []

    async def emit(k: str, payload: dict[str, Any]) -> None:
        seen.append((trio.current_time(), k, payload))

    ctx = EntryContext(parse_submit({"prompt": "In a leap year, how many days?"}, lambda: "r1"),
                       emit, lambda kind, payload: journal.append(kind))
    ctx.model = "tiny"
    ctx.extra["j"] = journal
    pending = PendingLookup()
    ctx.extra["cache_pending"] = ("creq", pending)

    async def start(action: Any, target: Any, resume: list[int], chan: Any) -> None:
        model["started"] = trio.current_time()
        try:
            await trio.sleep(model_s[0])
            await chan.send(("tokens", {"ids": [1], "text": "366 (model)"}))
            await trio.sleep(model_s[1] - model_s[0])
            await chan.send(("done", {"stats": {}}))
            model["finished"] = True
        except trio.Cancelled:
            model["cancelled"] = True
            raise

    async def main() -> None:
        async def answer() -> None:
            await trio.sleep(lookup_s)
            hit = kind == "hit"
            pending.set(Lookup("semantic" if hit else "miss", "", "366 (cached)" if hit else None,
                               7 if hit else None, "p" if hit else None, None, 0.93, 0.97,
                               0.85))

        targets = {} if served_by is None else {served_by: Target(served_by, "n2", served_by == "me")}
        first: Decided | NoRoute = (NoRoute("no node serves tiny") if served_by is None
                                    else Decided(Route((served_by,))))
        driver = Driver(targets, start, emit, entry_name="n1", journal=ctx.journal,
                        life=RequestLife(started_s=trio.current_time()))
        async with trio.open_nursery() as n:
            n.start_soon(answer)
            out = await driver.drive(first, lookup=pending_lookup(ctx), here="me")
        if driver.cached is not None:
            await serve_cached(ctx, HOST, driver.cached.model)
        else:
            ctx.extra["outcome"] = out

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    return ctx, seen, model


def test_a_miss_holds_the_models_events_until_the_lookup_then_lets_them_out_in_order() -> None:
    ctx, seen, model = race(0.05, "miss", (0.01, 0.02))
    assert [k for _, k, _ in seen] == ["route", "tokens"]
    assert all(t == pytest.approx(0.05) for t, _, _ in seen)  # the model was done at 0.02
    assert model["finished"] and ctx.extra["outcome"].error is None
    assert "".join(ctx.extra["outcome"].text) == "366 (model)"
    assert ctx.extra["cache"][1].kind == "miss"  # "remember" stores the model's answer
    assert "cache_overtook" not in ctx.extra["j"]


def test_a_miss_after_a_slow_model_costs_the_first_token_nothing() -> None:
    _, seen, _ = race(0.01, "miss", (0.02, 0.05))
    assert [(round(t, 3), k) for t, k, _ in seen] == [(0.02, "route"), (0.02, "tokens")]


def test_a_hit_cancels_the_model_and_serves_the_cached_answer() -> None:
    ctx, seen, model = race(0.01, "hit", (0.005, 1.0))
    assert model["cancelled"] and not model["finished"]
    assert [(k, p.get("cached"), p.get("text")) for _, k, p in seen] == [
        ("route", True, None), ("tokens", None, "366 (cached)")]  # the model's token never left
    assert ctx.answer is not None and ctx.answer["cached"] and ctx.answer["text"] == "366 (cached)"
    assert ctx.extra["j"][-2:] == ["cache_overtook", "cache_hit"]


def test_a_hit_after_the_model_finished_still_serves_the_cached_answer() -> None:
    ctx, seen, model = race(0.05, "hit", (0.01, 0.02))
    assert model["finished"]
    assert [p.get("text") for _, k, p in seen if k == "tokens"] == ["366 (cached)"]
    assert ctx.answer is not None and ctx.answer["cached"]


def test_served_here_the_lookup_decides_before_the_model_starts() -> None:
    ctx, seen, model = race(0.05, "hit", (0.01, 0.02), served_by="me")
    assert model["started"] == -1.0  # a hit runs no model on this CPU
    assert ctx.answer is not None and ctx.answer["cached"]
    assert "cache_overtook" not in ctx.extra["j"]  # nothing was overtaken
    ctx, seen, model = race(0.05, "miss", (0.01, 0.02), served_by="me")
    assert model["started"] == pytest.approx(0.05) and model["finished"]
    assert [(round(t, 3), k) for t, k, _ in seen] == [(0.06, "route"), (0.06, "tokens")]


def test_with_no_route_a_hit_still_answers_and_a_miss_fails_with_the_routes_error() -> None:
    ctx, seen, _ = race(0.05, "hit", (0.01, 0.02), served_by=None)
    assert ctx.answer is not None and ctx.answer["text"] == "366 (cached)"
    ctx, seen, model = race(0.05, "miss", (0.01, 0.02), served_by=None)
    out = ctx.extra["outcome"]
    assert seen == [] and model["started"] == -1.0
    assert out.error_code == ErrorCode.NO_ROUTE and out.error == "no node serves tiny"
