"""``serve_request``'s failover and hedging logic, with scripted attempts (no network).

Each target follows a script: wait, send tokens, die, or answer busy. The real daemons' tests
(test_failover_live.py) cover the same paths end to end; these pin down the decisions.
"""

from __future__ import annotations

from typing import Any

import trio

from meshd.core.routing import RouteDecision
from meshd.errors import BusyError, PeerGoneError
from meshd.node.entry import Target, serve_request

GREEDY = list(range(100, 120))  # what any healthy target generates from the prompt


def decision(*order: str) -> RouteDecision:
    return RouteDecision("r1", "meshd", (), tuple(order), (), 0)


def run(order: list[str], scripts: dict[str, Any], *, hedge_after_s: float | None = None,
        first_token_timeout_s: float = 5.0) -> tuple[Any, list[tuple[str, list[int]]], list[str]]:
    targets = {p: Target(p, p, False) for p in order}
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

    return trio.run(main), calls, journal


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


def test_death_after_k_tokens_resumes_elsewhere_with_those_tokens() -> None:
    out, calls, journal = run(["a", "b"], {"a": dies_after(5), "b": healthy()})
    assert out.error is None
    assert out.tokens == GREEDY
    assert calls == [("a", []), ("b", GREEDY[:5])]
    assert out.route == ["entry", "a", "b"] and out.served_by == "b"
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
