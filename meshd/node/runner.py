"""The local model runner: the models this node serves, their queues and measured speeds.

It admits a request only while the model's queue has room (else ``BusyError``: the entry node
tries another), runs at most ``max_concurrency`` generations at once, and keeps exponentially
weighted averages of prefill and decode speed that go into the node's adverts.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import trio

from meshd.core import predict
from meshd.core.admission import slot_wait_ms
from meshd.errors import BusyError, ErrorCode, ModelError, RemoteError

log = logging.getLogger(__name__)

EWMA = 0.3


@dataclass(slots=True)
class Token:
    """One generated token: its id and the text it adds; with logprobs asked for, ``lp`` (the
    engine's ``TokenEvent.logprob``); ``choice`` is its choice's index (n > 1)."""

    id: int
    text: str
    lp: list[Any] | None = None
    choice: int = 0


class ModelLike(Protocol):
    """What the runner needs of an engine model (``meshd.engine.Model`` conforms)."""

    num_layers: int
    hidden_size: int

    def encode_prompt(self, text: str, *, chat: bool = False) -> list[int]: ...

    def generate(self, prompt: list[int], cfg: Any) -> AsyncIterator[Any]: ...


@dataclass(slots=True)
class Served:
    name: str
    model: Any  # meshd.engine.Model (or a fake in unit tests)
    layer_start: int
    layer_end: int
    num_layers: int
    max_concurrency: int
    max_queue: int
    tier: str = ""  # meshd.core.tiers: "micro", "small", "large" ("" = no tier)
    quality: float = 0.0
    limiter: trio.CapacityLimiter = field(init=False)
    waiting: int = 0
    running: int = 0
    served: int = 0
    failed: int = 0
    busy_refusals: int = 0
    prefill_tps: float = 0.0
    decode_tps: float = 0.0
    ttft_ms: float = 0.0  # EWMA of the time from taking a slot to the first token
    max_decode_tps: float = 0.0  # config's max_decode_tokens_per_s: per-request pacing, 0 = none
    max_prefill_tps: float = 0.0  # config's max_prefill_tokens_per_s: the same for prefill
    hold_s: float = 0.0  # EWMA of how long a completed request held its slot (0: none yet)
    wait_refusals: int = 0  # requests that could not start within the wait their entry node allowed
    ends: dict[int, float] = field(default_factory=dict)  # running request -> expected end (trio clock)
    _next_key: int = 0

    def __post_init__(self) -> None:
        self.limiter = trio.CapacityLimiter(self.max_concurrency)

    def service_rate_rps(self) -> float:
        """Requests/s these slots complete when all are busy, from the requests served (0: none
        served yet). Gossiped in the advert: routers take it for the turnover of the queue."""
        return self.max_concurrency / self.hold_s if self.hold_s > 0 else 0.0

    def decode_rate(self) -> float:
        """Tokens/s one request decodes at here (the cap, or the measured speed; 0: unknown)."""
        rates = [r for r in (self.max_decode_tps, self.decode_tps) if r > 0]
        return min(rates) if rates else 0.0

    def service_s(self, prompt_tokens: int, max_tokens: int) -> float:
        """How long a request holds a slot, at most: its prefill and every token it may make."""
        rate = self.decode_rate()
        if rate <= 0:
            return math.inf
        pre = predict.prefill_s(prompt_tokens, self.prefill_tps) if self.prefill_tps > 0 else 0.0
        return pre + predict.decode_s(max(max_tokens - 1, 0), rate)

    def wait_ms(self, now: float, prompt_tokens: int, max_tokens: int) -> float:
        """How long a request arriving now would wait for a slot (meshd.core.admission)."""
        return slot_wait_ms(now, list(self.ends.values()), self.waiting, self.max_concurrency,
                            self.service_s(prompt_tokens, max_tokens) * 1000.0)

    @property
    def whole(self) -> bool:
        return self.layer_start == 0 and self.layer_end == self.num_layers

    def statistics(self) -> dict[str, Any]:
        return {
            "model": self.name,
            "layers": [self.layer_start, self.layer_end],
            "num_layers": self.num_layers,
            "queue_depth": self.waiting,
            "in_flight": self.running,
            "max_concurrency": self.max_concurrency,
            "max_queue": self.max_queue,
            "served": self.served,
            "failed": self.failed,
            "busy_refusals": self.busy_refusals,
            "wait_refusals": self.wait_refusals,
            "prefill_tps": round(self.prefill_tps, 1),
            "decode_tps": round(self.decode_tps, 1),
            "ttft_ms": round(self.ttft_ms, 1),
            "service_rate_rps": round(self.service_rate_rps(), 3),
            **({"batch": batcher.statistics()} if (batcher := self.batcher()) is not None else {}),
            **({"prefix_cache": px} if (px := self.prefix_cache()) is not None else {}),
        }

    def prefix_cache(self) -> dict[str, Any] | None:
        """The model's KV prefix cache figures (None: it keeps none, or is not an engine model)."""
        f = getattr(self.model, "prefix_cache_statistics", None)
        return f() if f is not None else None

    def batcher(self) -> Any:
        """The model's running batch scheduler (None: not batched here)."""
        b = getattr(self.model, "batcher", None) if self.whole else None
        return b if b is not None and getattr(b, "running", False) else None


def _ewma(old: float, new: float) -> float:
    return new if old <= 0 else (1 - EWMA) * old + EWMA * new


class Runner:
    def __init__(self, *, batching: bool = True, fused_prefill: bool = True) -> None:
        self.batching = batching  # [engine] batching: start the local models' batch schedulers
        self.fused_prefill = fused_prefill  # [engine] fused_prefill: chunks inside decode steps
        self.models: dict[str, Served] = {}
        self.changed = trio.Event()  # set when queue figures move (for early adverts)

    def add(self, served: Served) -> None:
        self.models[served.name] = served

    def get(self, name: str) -> Served | None:
        return self.models.get(name)

    def whole(self, name: str) -> Served | None:
        s = self.models.get(name)
        return s if s is not None and s.whole else None

    def default_model(self) -> str | None:
        for s in self.models.values():
            if s.whole:
                return s.name
        return next(iter(self.models), None)

    def queue_depth(self) -> int:
        return sum(s.waiting for s in self.models.values())

    def in_flight(self) -> int:
        return sum(s.running for s in self.models.values())

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Run the batch scheduler of every local whole model (meshd.engine.scheduler): while
        it runs, the model's generations decode together, one onnxruntime call per step. A
        model swapped in later (autoplace) gets its scheduler when the runner is poked. With
        ``batching`` off it starts none: each request runs its own one-sequence loop."""
        started: set[int] = set()
        async with trio.open_nursery() as nursery:
            for s in list(self.models.values()):  # upstream models probe their servers
                run = getattr(s.model, "run", None)
                if run is not None:
                    await nursery.start(run)
            task_status.started()
            if not self.batching:
                log.info("batching off: each request runs its own decode loop")
                return
            while True:
                changed = self.changed
                for s in list(self.models.values()):
                    batcher = getattr(s.model, "batcher", None) if s.whole else None
                    if batcher is not None and id(batcher) not in started:
                        started.add(id(batcher))
                        batcher.sched.use_fused = self.fused_prefill
                        await nursery.start(batcher.run)
                await changed.wait()

    def poke(self) -> None:
        self.changed.set()
        self.changed = trio.Event()

    def encode(self, model: str, text: str, *, chat: bool = False) -> list[int]:
        s = self.models.get(model)
        if s is None:
            raise ModelError(f"this node does not serve model {model!r}")
        ids: list[int] = s.model.encode_prompt(text, chat=chat)
        return ids

    async def aencode(self, model: str, text: str, *, chat: bool = False) -> list[int]:
        """``encode``, for a model that may tokenize through its server (an upstream model
        without a local tokenizer: ``meshd.upstream.model``)."""
        s = self.models.get(model)
        f = getattr(s.model, "aencode_prompt", None) if s is not None else None
        if f is None:
            return self.encode(model, text, chat=chat)
        ids: list[int] = await f(text, chat=chat)
        return ids

    async def aencode_messages(self, model: str, messages: list[Any], *,
                               tools: list[Any] | None = None) -> list[int]:
        s = self.models.get(model)
        f = getattr(s.model, "aencode_messages", None) if s is not None else None
        if f is None:
            return self.encode_messages(model, messages, tools=tools)
        ids: list[int] = await f(messages, tools=tools) if tools else await f(messages)
        return ids

    def tokenizes_here(self, model: str) -> bool:
        """Whether ``encode`` works without awaiting (not for an upstream model whose server
        tokenizes: ``aencode``)."""
        s = self.models.get(model)
        return s is not None and bool(getattr(s.model, "tokenizes_here", True))

    def ready(self, model: str) -> bool:
        """Whether ``model`` is served here and can take requests now (an upstream model is not
        until its server answered a probe: it is neither advertised nor used meanwhile)."""
        s = self.models.get(model)
        return s is not None and bool(getattr(s.model, "ready", True))

    def encode_messages(self, model: str, messages: list[Any], *,
                        tools: list[Any] | None = None) -> list[int]:
        """Token ids of chat ``messages`` through the model's chat template (with ``tools``: a
        template with tool syntax renders them, meshd.api.tool_template)."""
        s = self.models.get(model)
        if s is None:
            raise ModelError(f"this node does not serve model {model!r}")
        ids: list[int] = (s.model.encode_messages(messages, tools=tools) if tools
                          else s.model.encode_messages(messages))
        return ids

    def vocab_size(self, model: str) -> int | None:
        """The model's vocabulary size (None when the model does not say): the bound of the token
        ids a request may carry."""
        s = self.models.get(model)
        n = getattr(s.model, "vocab_size", None) if s is not None else None
        return int(n) if n else None

    def tokenizer_identity(self, model: str) -> str:
        """The identity of the model's tokenizer (meshd.core.tokident; "" when unknown)."""
        s = self.models.get(model)
        f = getattr(s.model, "tokenizer_identity", None) if s is not None else None
        return str(f()) if f is not None else ""

    def advertised_tokenizer(self, model: str) -> str:
        """The tokenizer identity to advertise: the model's, when peers can fetch it here ("" for
        an upstream model whose ids only its server makes: entry nodes then send text)."""
        s = self.models.get(model)
        if s is None or not getattr(s.model, "tokenizer_shareable", True):
            return ""
        return self.tokenizer_identity(model)

    def prefix_sketch(self, model: str) -> bytes:
        """What the advert says of the prefixes this node's KV prefix cache holds for the model
        (meshd.core.prefix_names.sketch; empty: none, or no cache)."""
        s = self.models.get(model)
        f = getattr(s.model, "prefix_sketch", None) if s is not None else None
        return bytes(f(s.layer_start, s.layer_end)) if f is not None and s is not None else b""

    def prefix_reserved_bytes(self) -> int:
        """Host memory the models' KV prefix caches may still take: their budgets less what
        they hold ([engine] prefix_cache_mb; the advert's free memory leaves it out)."""
        total = 0
        for s in self.models.values():
            px = s.prefix_cache()
            if px is not None:
                total += max(0, int(px["budget_bytes"]) - int(px["bytes"]))
        return total

    def model_identity(self, model: str) -> str:
        """What the model really is (meshd.core.modelid; "" when unknown)."""
        s = self.models.get(model)
        if s is None:
            return ""
        mid = getattr(s.model, "model_identity", None)
        if isinstance(mid, str):
            return mid
        manifest = getattr(s.model, "manifest", None)
        if manifest is None:
            return ""
        from meshd.core.modelid import of_manifest

        return of_manifest(getattr(manifest, "source", {}) or {}, str(manifest.content_hash))

    def tokenizer_bundle(self, identity: str) -> bytes | None:
        """The bundle of a tokenizer of a model served here, by identity (reads a file: call it
        from a worker thread); None when no model here has it."""
        for name, s in list(self.models.items()):
            if self.tokenizer_identity(name) == identity:
                bundle: bytes | None = s.model.tokenizer_bundle()
                return bundle
        return None

    def batch_curve(self, model: str) -> tuple[int, tuple[float, ...]]:
        """How many streams the model decodes in one batch here (0: it is not batched) and the
        aggregate decode tokens/s measured at batch sizes 1, 2, 4, ... (the advert's
        ``batch``/``batch_tps``)."""
        s = self.models.get(model)
        batcher = s.batcher() if s is not None else None
        if s is None or batcher is None:
            return 0, ()
        return s.max_concurrency, tuple(batcher.sched.curve(s.max_concurrency))

    def context_length(self, model: str) -> int | None:
        """The model's context in tokens (None when the model does not say)."""
        s = self.models.get(model)
        n = getattr(s.model, "context_length", None) if s is not None else None
        return int(n) if n else None

    async def generate(
        self, model: str, prompt_ids: list[int], gen: Any, *, max_wait_ms: float | None = None
    ) -> AsyncIterator[Token]:
        """Generate on the local model; raises ``BusyError`` at once if the queue is full, or
        if the request would wait for a slot longer than ``max_wait_ms`` (when given)."""
        s = self.whole(model)
        if s is None:
            raise RemoteError(f"this node does not serve the whole of model {model!r}", ErrorCode.NO_MODEL)
        if s.waiting >= s.max_queue and s.limiter.available_tokens == 0:
            s.busy_refusals += 1
            raise BusyError(f"queue of {model} is full ({s.waiting} waiting)")
        max_tokens = int(getattr(gen, "max_tokens", 1))
        if max_wait_ms is not None and s.limiter.available_tokens == 0:
            wait = s.wait_ms(trio.current_time(), len(prompt_ids), max_tokens)
            if wait > max_wait_ms:
                s.wait_refusals += 1
                shown = "unknown" if math.isinf(wait) else f"{wait:.0f} ms"
                raise BusyError(f"{model} cannot start within {max_wait_ms:.0f} ms (wait {shown})",
                                wait_ms=None if math.isinf(wait) else wait)
        key = s._next_key
        s._next_key += 1
        s.waiting += 1
        self.poke()
        acquired = False
        try:
            await s.limiter.acquire()
            acquired = True
            s.waiting -= 1
            s.running += 1
            s.ends[key] = trio.current_time() + s.service_s(len(prompt_ids), max_tokens)
            self.poke()
            t0 = time.perf_counter()
            first: float | None = None
            n = 0
            async for ev in s.model.generate(prompt_ids, gen):
                if first is None:
                    # the prompt's tokens this node computed: not those its prefix cache held,
                    # or a node that often reuses prefixes would advertise a prefill it lacks
                    computed = predict.uncached_tokens(len(prompt_ids),
                                                       int(getattr(ev, "cached_tokens", 0)))
                    if s.max_prefill_tps > 0:  # prefill no faster than the cap
                        await trio.sleep(max(0.0, t0 + computed / s.max_prefill_tps
                                             - time.perf_counter()))
                    first = time.perf_counter()
                    s.prefill_tps = _ewma(s.prefill_tps, computed / max(first - t0, 1e-6))
                    s.ttft_ms = _ewma(s.ttft_ms, (first - t0) * 1000.0)
                elif s.max_decode_tps > 0:  # pace token n+1 to no earlier than first + n / cap
                    await trio.sleep(max(0.0, first + n / s.max_decode_tps - time.perf_counter()))
                n += 1
                rate = s.decode_rate()
                if rate > 0:  # the end of this request, as it stands
                    s.ends[key] = trio.current_time() + predict.decode_s(max(max_tokens - n, 0), rate)
                yield Token(int(ev.token_id), ev.text, getattr(ev, "logprob", None),
                            getattr(ev, "choice", 0))
            end = time.perf_counter()
            if first is not None and n > 1:
                s.decode_tps = _ewma(s.decode_tps, (n - 1) / max(end - first, 1e-6))
            s.hold_s = _ewma(s.hold_s, max(end - t0, 1e-6))
            s.served += 1
        except BaseException:
            s.failed += 1
            raise
        finally:
            if acquired:
                s.running -= 1
                s.ends.pop(key, None)
                s.limiter.release()
            else:
                s.waiting -= 1
            self.poke()
