"""``EdgeCache.start_lookup``: the semantic lookup's worker thread starts at once when no other
cache work holds the worker, and waits for it otherwise; a hit's counters are written once its
answer went out (``served``), not beside it. A real ``SemanticCache`` on a SQLite file, with the
fake embedder and a fake verifier (the decision itself is tested in tests/cache)."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import trio
import trio.testing

from meshd.cache import CacheRequest, Calibration
from meshd.config import parse_config
from meshd.node.edge_cache import EdgeCache
from meshd.testing.fake_embedder import FakeEmbedder

REQ = CacheRequest(model="m@1", tenant="t", client="alice", prompt="what is the capital of france")
PARA = CacheRequest(model="m@1", tenant="t", client="alice",
                    prompt="What is the capital of France?")
CAL = Calibration(0.5, 1000, (0.99, 0.99, 0.99, 0.99, 0.9, 0.6))  # a hit must score above 0.9


def same_words(cached: str, query: str) -> float:
    a, b = (set(t.lower().strip("?").split()) for t in (cached, query))
    return len(a & b) / len(a | b)


class HeldEmbedder(FakeEmbedder):
    """Once ``hold`` is set, each ``embed`` says it ``entered`` and waits for ``release``."""

    def __init__(self) -> None:
        super().__init__()
        self.hold, self.entered, self.release = (threading.Event() for _ in range(3))

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        if self.hold.is_set():
            self.entered.set()
            assert self.release.wait(10)
        return super().embed(texts)


def test_a_lookup_starts_its_thread_at_once_and_a_busy_worker_delays_it(tmp_path: Path) -> None:
    cache = EdgeCache(parse_config({"node": {"data_dir": str(tmp_path)},
                                    "cache": {"enabled": True}}))
    emb = HeldEmbedder()
    seen: dict[str, Any] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(cache.run)
            store = cache.store
            store.attach(emb, same_words, CAL)
            store.insert(REQ, "Paris")
            emb.hold.set()
            # a free worker: the thread is embedding before this task has yielded once
            pending = cache.start_lookup(PARA)
            seen["embedding_before_a_yield"] = emb.entered.wait(10)
            emb.release.set()
            got = await pending.result()
            seen["free"] = (got.kind, got.answer)
            seen["before_served"] = (store.pending_touches, cache._flush_pending)
            cache.served("r1", got)  # the answer went out: now the flush
            seen["served"] = cache._flush_pending
            with trio.fail_after(10):
                while store.pending_touches:
                    await trio.sleep(0.001)
            # a busy worker (held as an insert holds it): the lookup waits for it
            async with cache._limiter:
                pending = cache.start_lookup(PARA)
                await trio.testing.wait_all_tasks_blocked()
                seen["began_while_busy"] = pending.began
            got = await pending.result()
            seen["busy"] = (got.kind, got.answer)
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert seen["embedding_before_a_yield"]
    assert seen["free"] == ("semantic", "Paris")
    assert seen["before_served"] == (1, False)  # the hit's counters wait for its answer
    assert seen["served"]
    assert seen["began_while_busy"] is None
    assert seen["busy"] == ("semantic", "Paris")


def test_remember_keeps_the_answers_token_ids_and_a_failed_tokenizer_loses_nothing(
        tmp_path: Path) -> None:
    """``remember`` tokenizes the answer with its write, so that a hit serves the ids kept;
    a tokenizer that fails (the model went away meanwhile) still stores the answer, without
    ids (a hit then tokenizes it)."""
    cache = EdgeCache(parse_config({"node": {"data_dir": str(tmp_path)},
                                    "cache": {"enabled": True}}))
    bob = CacheRequest(model="m@1", tenant="t", client="bob", prompt=REQ.prompt)
    seen: dict[str, Any] = {}

    def gone(text: str) -> list[int]:
        raise RuntimeError("model unloaded")

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(cache.run)
            store = cache.store
            cache.remember(REQ, "Paris", None, "r1", lambda text: [len(text), 7])
            cache.remember(bob, "Paris", None, "r2", gone)
            with trio.fail_after(10):
                while store.statistics()["inserts"] < 2:
                    await trio.sleep(0.001)
            seen["ids"] = [store.lookup_exact(r).answer_ids for r in (REQ, bob)]
            seen["answers"] = [store.lookup_exact(r).answer for r in (REQ, bob)]
            nursery.cancel_scope.cancel()

    trio.run(main)
    assert seen["ids"] == [(5, 7), None]
    assert seen["answers"] == ["Paris", "Paris"]
