"""The runner's side of wait-bounded admission: refuse at once, with an estimate, only when the
request could not start within its bound (meshd.core.admission)."""

from __future__ import annotations

from typing import Any

import pytest
import trio

from meshd.engine import GenerationConfig
from meshd.errors import BusyError
from meshd.node.runner import Runner, Served
from meshd.testing.fake_model import FakeModel

CAP = 20.0  # tokens/s per request: 11 tokens hold a slot for about 0.5 s
GEN = GenerationConfig(max_tokens=11)


def served() -> Served:
    return Served(name="m", model=FakeModel(), layer_start=0, layer_end=4, num_layers=4,
                  max_concurrency=2, max_queue=4, max_decode_tps=CAP)


async def drain(runner: Runner, bound: float | None = None) -> list[Any]:
    return [t async for t in runner.generate("m", [1, 2, 3], GEN, max_wait_ms=bound)]


async def until(cond: Any, timeout_s: float = 10.0) -> None:
    with trio.fail_after(timeout_s):
        while not cond():
            await trio.sleep(0.005)


def test_a_full_node_refuses_a_bounded_request_with_its_wait_and_serves_the_others() -> None:
    runner = Runner()
    s = served()
    runner.add(s)
    results: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as n:
            n.start_soon(drain, runner)
            n.start_soon(drain, runner)
            await until(lambda: s.running == 2)
            with pytest.raises(BusyError) as refused:
                await drain(runner, bound=50.0)
            results["wait_ms"] = refused.value.wait_ms

            async def roomy() -> None:
                results["roomy"] = await drain(runner, bound=5000.0)
            n.start_soon(roomy)

    trio.run(main)
    assert 50.0 < results["wait_ms"] <= 600.0  # the earliest of two ~500 ms requests to end
    assert len(results["roomy"]) == 11  # a bound it can meet: queued and served
    assert s.wait_refusals == 1 and s.busy_refusals == 0 and s.served == 3
    assert not s.ends and s.running == 0 and s.waiting == 0  # nothing left behind


def test_a_free_slot_admits_whatever_the_bound() -> None:
    runner = Runner()
    s = served()
    runner.add(s)
    assert len(trio.run(drain, runner, 0.0)) == 11
    assert s.wait_refusals == 0


def test_served_requests_give_the_measured_service_rate() -> None:
    runner = Runner()
    s = served()
    runner.add(s)
    assert s.service_rate_rps() == 0.0  # nothing served: not measured
    trio.run(drain, runner)
    # 11 tokens at 20/s hold the slot for about 0.5 s: 2 slots complete about 4 requests/s
    assert 0.5 <= s.hold_s < 2.0
    assert s.service_rate_rps() == pytest.approx(2 / s.hold_s)
    assert runner.models["m"].statistics()["service_rate_rps"] > 0
