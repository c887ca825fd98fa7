"""The stage server: this node's share of other requests' pipelines (docs/pipeline.md).

A ``STAGE_OPEN`` opens a stage session: the KV cache of layers ``[layer_start, layer_end)`` of
one request, on a model range this node has loaded. The session has a deadline and an idle
timeout, and is freed when the entry node sends ``STAGE_FREE`` (the request ended or was
cancelled), when the stream it was opened on ends (the entry node died or went away), at its
deadline, after ``idle_ms`` without a step, or when a step fails. At capacity (sessions or KV
tokens) it answers ``busy`` and the entry node plans around it.

Each session runs its steps in order in its own task; the steps of every session on one stage
run together (``meshd.engine.stagebatch``): one onnxruntime call per round for every session
that has a one-token step waiting, plus one chunk of at most one prompt. A step's tensor is checked
(``meshd.node.activations``): a malformed, wrong-shape or non-finite tensor gets an ``ERROR``
with code ``bad_tensor`` to the entry node, never a crash. A middle stage sends its output
(fp16 by default) straight to the next stage; the last stage samples the next token with the
engine's ``Generation`` (greedy, or the request's sampling settings) and sends ``STAGE_OUT`` to
the entry node.

Prefix reuse (docs/engine.md, "Prefix cache"): a ``STAGE_OPEN`` with ``px`` (the prompt's block
names, which the entry node computes: a middle stage never sees the token ids) restores this
stage's layers' longest cached prefix of them, and ``STAGE_READY`` says how many tokens
(``reused``). The entry node starts the first step at the least of its stages' figures; a stage
that restored more cuts back to that position. A session freed with ``px`` keeps the blocks of
the prompt it prefilled for the next request.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import trio

from meshd.core.messages import MessageType
from meshd.core.packing import unpack_ids
from meshd.core.prefix_names import BLOCK_TOKENS, HASH_BYTES
from meshd.core.tokident import names
from meshd.core.wire import Message
from meshd.errors import ErrorCode, MeshdError, PeerGoneError, RemoteError
from meshd.node.activations import WIRE_DTYPES, decode_tensor, encode_hidden
from meshd.node.gen_config import gen_config_from
from meshd.node.runner import Runner, Served

log = logging.getLogger(__name__)

DEFAULT_IDLE_S = 30.0
INBOX = 256
EARLY_FREE_MEMORY = 1024
EWMA = 0.2


@dataclass(eq=False)
class _Session:
    sid: str
    model: str
    start: int
    end: int
    entry: str  # the peer that opened it (its reply port's peer)
    reply: Port
    next_peer: str | None
    next_sid: str | None
    wire_dtype: str
    reserved: int  # KV tokens reserved against the budget
    served: Served
    px: list[bytes] | None = None  # the prompt's block names (STAGE_OPEN px): reused, kept
    reused: int = 0  # prompt tokens restored from the prefix cache at open
    kv: Any = None  # engine StageSession
    gen: Any = None  # engine Generation on the last stage
    is_first: bool = False
    is_last: bool = False
    hidden: int = 0
    vocab: int = 0
    idle_s: float = DEFAULT_IDLE_S
    deadline: float = float("inf")
    steps: int = 0
    reason: str = ""
    scope: trio.CancelScope = field(default_factory=trio.CancelScope)
    inbox: Any = None  # send side of the step queue (frames in)
    queue: Any = None  # receive side (the session's task)


@dataclass
class _Speed:
    prefill_ms_per_layer_token: float = 0.0
    decode_ms_per_layer: float = 0.0

    def note(self, ms: float, layers: int, tokens: int) -> None:
        per = ms / max(layers * tokens, 1)
        if tokens == 1:
            old = self.decode_ms_per_layer
            self.decode_ms_per_layer = per if old <= 0 else (1 - EWMA) * old + EWMA * per
        else:
            old = self.prefill_ms_per_layer_token
            self.prefill_ms_per_layer_token = per if old <= 0 else (1 - EWMA) * old + EWMA * per


class Port(Protocol):
    """Where frames for one peer go: its stage stream, or this node itself
    (``meshd.node.stagelinks``: ``StreamPort``, ``LocalPort``)."""

    peer_id: str

    @property
    def alive(self) -> bool: ...

    async def send(self, mtype: MessageType, fields: dict[str, Any]) -> None: ...


class Ports(Protocol):
    """The ports to other stages (``meshd.node.stagelinks.StageLinks``)."""

    async def port(self, peer_id: str) -> Port: ...

    def statistics(self) -> dict[str, Any]: ...


class StageServer:
    def __init__(self, runner: Runner, node_name: str) -> None:
        self.runner = runner
        self.node_name = node_name
        self.links: Ports | None = None  # set by whoever builds the stage links
        self.sessions: dict[str, _Session] = {}
        self.speeds: dict[str, _Speed] = {}
        self._nursery: trio.Nursery | None = None
        self._early_free: dict[tuple[str, str], None] = {}  # insertion-ordered, bounded
        self.batchers: dict[tuple[str, int, int], Any] = {}  # (model, start, end) -> StageBatcher
        self.stats: dict[str, Any] = {
            "sessions_opened": 0, "busy_refusals": 0, "bad_tensors": 0, "steps": 0,
            "errors": 0, "activation_bytes_in": 0, "activation_bytes_out": 0,
            "activation_frames_out": 0, "freed": {},
            "prompts_packed": 0, "prompts_text": 0,  # how last stages got their prompt
            "prefix_reused_tokens": 0,  # prompt tokens a first step skipped (cached prefix)
        }

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            nursery.start_soon(self.warm_up)
            await trio.sleep_forever()

    async def warm_up(self) -> None:
        """Run each loaded range once (a short prefill and two decode steps) so that the first
        real request, or a failover onto a freshly started node, does not pay onnxruntime's
        first runs; the steps also give the adverts measured per-layer speeds."""
        for s in list(self.runner.models.values()):
            engine_model = getattr(s.model, "model", None)
            if engine_model is None or not hasattr(engine_model, "stage"):
                continue
            try:
                await trio.to_thread.run_sync(self._warm, s, engine_model,
                                              limiter=engine_model.limiter)
            except Exception as e:  # a model that cannot run will say so on its first request
                log.warning("stage warm-up failed model=%s error=%r", s.name, e)

    def _warm(self, s: Served, engine_model: Any) -> None:
        stage = engine_model.stage(s.layer_start, s.layer_end)
        for measured in (False, True):  # the first pass pays the first runs, the second counts
            kv = stage.open_session(max_tokens=16)
            try:
                for t in (8, 1, 1):
                    x = (np.ones(t, np.int64) if stage.is_first
                         else np.zeros((t, engine_model.hidden_size), np.float32))
                    t0 = time.perf_counter()
                    kv.step(x, np.arange(kv.length, kv.length + t, dtype=np.int64),
                            last_only=stage.is_last)
                    if measured:
                        self.speed(s.name).note((time.perf_counter() - t0) * 1000,
                                                s.layer_end - s.layer_start, t)
            finally:
                kv.free()

    # ------------------------------------------------------------------ capacity

    def max_sessions(self, s: Served) -> int:
        return max(1, s.max_concurrency + s.max_queue)

    def kv_budget(self, s: Served) -> int:
        ctx = int(getattr(getattr(s.model, "model", None), "context_length", 0) or 2048)
        return self.max_sessions(s) * ctx

    def free_kv_tokens(self, model: str) -> int:
        s = self.runner.get(model)
        if s is None:
            return 0
        used = sum(x.reserved for x in self.sessions.values() if x.model == model)
        return max(0, self.kv_budget(s) - used)

    def speed(self, model: str) -> _Speed:
        return self.speeds.setdefault(model, _Speed())

    # ------------------------------------------------------------------ frames in

    def _spawn(self, fn: Any, *args: Any) -> None:
        assert self._nursery is not None
        self._nursery.start_soon(fn, *args)

    def on_open(self, msg: Message, port: Port, from_peer: str) -> None:
        self._spawn(self._open, msg, port, from_peer)

    def on_step(self, msg: Message, port: Port, from_peer: str) -> None:
        sess = self.sessions.get(msg["rid"])
        if sess is None:
            self._spawn(_reply_error, port, msg["rid"], ErrorCode.NO_SESSION,
                        f"{self.node_name} holds no open stage session {msg['rid']}", None)
            return
        try:
            sess.inbox.send_nowait(msg)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            self._end(sess, "overrun")

    def on_free(self, sid: str, from_peer: str) -> None:
        sess = self.sessions.get(sid)
        if sess is None:  # its STAGE_OPEN may still be on its way in: do not open it then
            self._early_free[(sid, from_peer)] = None
            while len(self._early_free) > EARLY_FREE_MEMORY:
                del self._early_free[next(iter(self._early_free))]
        elif sess.entry == from_peer:
            self._end(sess, "freed")

    def on_port_closed(self, port: Port, reason: str) -> None:
        """The stream a session was opened on ended: its entry node went away."""
        for sess in list(self.sessions.values()):
            if sess.reply is port:
                self._end(sess, "entry_gone")

    def on_downstream_error(self, msg: Message, from_peer: str) -> None:
        """The next stage rejected what we sent it: tell our entry node and stop."""
        for sess in list(self.sessions.values()):
            if sess.next_sid == msg.get("rid") and sess.next_peer == from_peer:
                self._spawn(_reply_error, sess.reply, sess.sid, msg["code"], msg["message"],
                            msg.get("peer") or from_peer)
                self._end(sess, "downstream_error")

    def _end(self, sess: _Session, reason: str) -> None:
        if not sess.reason:
            sess.reason = reason
        sess.scope.cancel()

    # ------------------------------------------------------------------ open

    async def _open(self, msg: Message, port: Port, from_peer: str) -> None:
        try:
            await self._open_session(msg, port, from_peer)
        except Exception:  # a bug must cost this request, never the node
            self.stats["errors"] += 1
            log.exception("stage open failed sid=%s", msg.get("rid"))
            self.sessions.pop(msg["rid"], None)
            await _reply_error(port, msg["rid"], ErrorCode.INTERNAL,
                               f"internal error on stage node {self.node_name}", None)

    async def _open_session(self, msg: Message, port: Port, from_peer: str) -> None:
        sid = msg["rid"]
        if self._early_free.pop((sid, from_peer), 0) is None:
            return  # freed before it was opened
        try:
            sess = self._admit(msg, port, from_peer)
        except RemoteError as e:
            await _reply_error(port, sid, e.code, str(e), None)
            return
        sess.inbox, sess.queue = trio.open_memory_channel[Message](INBOX)
        self.sessions[sid] = sess
        self.runner.poke()  # stage sessions count in the advert's in-flight figure
        self.stats["sessions_opened"] += 1
        try:
            await self._build(sess, msg)
        except (MeshdError, ValueError) as e:
            self.sessions.pop(sid, None)
            code = getattr(e, "code", ErrorCode.NO_MODEL)
            await _reply_error(port, sid, code, f"{self.node_name}: {e}", None)
            return
        self._spawn(self._serve, sess)
        ready: dict[str, Any] = {"rid": sid, "free_kv_tokens": self.free_kv_tokens(sess.model)}
        if sess.px is not None:
            ready["reused"] = sess.reused
        if sess.is_last and not msg.get("prompt_ids") and msg.get("prompt_packed") is None:
            ready["prompt_ids"] = list(sess.gen.prompt_ids)
        try:
            await port.send(MessageType.STAGE_READY, ready)
        except (PeerGoneError, trio.TooSlowError):
            self._end(sess, "entry_gone")

    def _admit(self, msg: Message, port: Port, from_peer: str) -> _Session:
        sid, model = msg["rid"], msg["model"]
        start, end = msg["layer_start"], msg["layer_end"]
        if sid in self.sessions:
            raise RemoteError(f"stage session {sid} is already open", ErrorCode.MALFORMED)
        s = self.runner.get(model)
        if s is None:
            raise RemoteError(f"{self.node_name} does not serve model {model!r}", ErrorCode.NO_MODEL)
        if not (s.layer_start <= start < end <= s.layer_end):
            raise RemoteError(f"{self.node_name} serves layers [{s.layer_start}, {s.layer_end}) "
                              f"of {model}, not [{start}, {end})", ErrorCode.NO_MODEL)
        wire = msg.get("wire_dtype") or "f16"
        if wire not in WIRE_DTYPES:
            raise RemoteError(f"unknown activation dtype {wire!r}", ErrorCode.BAD_TENSOR)
        nxt = msg.get("next") or []
        last = end == s.num_layers
        if not last and not (len(nxt) == 2 and all(isinstance(x, str) for x in nxt)):
            raise RemoteError("a stage that is not the last needs next = [peer id, session id]",
                              ErrorCode.MALFORMED)
        open_here = [x for x in self.sessions.values() if x.model == model]
        want = int(msg.get("max_tokens") or 0)
        ctx = self.kv_budget(s) // self.max_sessions(s)
        reserved = min(want, ctx) if want > 0 else ctx
        if len(open_here) >= self.max_sessions(s) or reserved > self.free_kv_tokens(model):
            self.stats["busy_refusals"] += 1
            raise RemoteError(f"{self.node_name} is at capacity ({len(open_here)} stage sessions "
                              f"of {model}, {self.free_kv_tokens(model)} KV tokens free)", ErrorCode.BUSY)
        deadline_ms = max(int(msg["deadline_ms"]), 1)
        idle_ms = int(msg.get("idle_ms") or DEFAULT_IDLE_S * 1000)
        return _Session(
            sid=sid, model=model, start=start, end=end, entry=from_peer, reply=port,
            next_peer=None if last else nxt[0], next_sid=None if last else nxt[1],
            wire_dtype=wire, reserved=reserved, served=s, is_first=start == 0, is_last=last,
            idle_s=max(idle_ms, 1) / 1000.0, deadline=trio.current_time() + deadline_ms / 1000.0,
        )

    async def _build(self, sess: _Session, msg: Message) -> None:
        engine_model = sess.served.model.model
        stage = await trio.to_thread.run_sync(engine_model.stage, sess.start, sess.end)
        ctx = engine_model.context_length
        want = int(msg.get("max_tokens") or 0)
        sess.kv = self._batcher(sess, stage).open(min(want, ctx) if want > 0 else ctx)
        sess.hidden = engine_model.hidden_size
        sess.vocab = engine_model.vocab_size
        px = msg.get("px")
        if px:
            if len(px) % HASH_BYTES:
                raise RemoteError(f"px must be whole {HASH_BYTES}-byte block names",
                                  ErrorCode.MALFORMED)
            sess.px = [px[i:i + HASH_BYTES] for i in range(0, len(px), HASH_BYTES)][
                :sess.kv.max_tokens // BLOCK_TOKENS]
            sess.reused = await sess.kv.reuse(names=sess.px)
        if sess.is_last:
            from meshd.engine.generation import Generation  # only here: it loads the engine

            tok, mine = msg.get("tok"), self.runner.tokenizer_identity(sess.model)
            if tok is not None and mine and not names(tok, mine):
                raise RemoteError(f"the prompt was tokenized with tokenizer {tok[:12]}; "
                                  f"{sess.model} here uses {mine[:12]}", ErrorCode.NO_MODEL)
            if msg.get("prompt_packed") is not None:
                self.stats["prompts_packed"] += 1
                ids = unpack_ids(msg["prompt_packed"], msg.get("prompt_dtype"), sess.vocab)
            else:
                ids = list(msg.get("prompt_ids") or [])
            if not ids:
                if not msg.get("prompt"):
                    raise RemoteError("the last stage needs prompt_ids or prompt", ErrorCode.MALFORMED)
                self.stats["prompts_text"] += 1
                ids = engine_model.encode_prompt(msg["prompt"], chat=bool(msg.get("chat")))
            if not ids or len(ids) >= ctx:
                raise RemoteError(f"the prompt has {len(ids)} tokens; the context is {ctx}",
                                  ErrorCode.MALFORMED)
            gen = dict(msg.get("gen") or {})
            after = gen.get("after")
            cfg = gen_config_from(gen, after=[int(t) for t in after]
                                  if isinstance(after, list) else None)
            if cfg is None:
                raise RemoteError("nothing left to generate", ErrorCode.MALFORMED)
            sess.gen = Generation(ids, cfg, engine_model.tokenizer,
                                  max_new_tokens=min(cfg.max_tokens, ctx - len(ids)))

    def _batcher(self, sess: _Session, stage: Any) -> Any:
        """The stage's batcher, started in this server's nursery on first use."""
        key = (sess.model, sess.start, sess.end)
        b = self.batchers.get(key)
        if b is None or b.stage is not stage:  # a reloaded model (autoplace) has new stages
            from meshd.engine.stagebatch import StageBatcher  # only here: it loads the engine

            b = self.batchers[key] = StageBatcher(stage)
            self._spawn(b.run)
        return b

    # ------------------------------------------------------------------ steps

    async def _serve(self, sess: _Session) -> None:
        try:
            with sess.scope:
                sess.scope.deadline = sess.deadline
                while True:
                    with trio.move_on_after(sess.idle_s) as idle:
                        msg = await sess.queue.receive()
                    if idle.cancelled_caught:
                        sess.reason = sess.reason or "idle"
                        break
                    if not await self._step(sess, msg):
                        break
            if sess.scope.cancelled_caught and not sess.reason:
                sess.reason = "deadline"
        except Exception:  # a bug must cost this session, never the node
            self.stats["errors"] += 1
            log.exception("stage session failed sid=%s", sess.sid)
            sess.reason = "error"
            await _reply_error(sess.reply, sess.sid, ErrorCode.INTERNAL,
                               f"internal error on stage node {self.node_name}", None)
        finally:
            self._release(sess)
        if sess.reason in ("idle", "deadline"):
            await _reply_error(sess.reply, sess.sid, ErrorCode.DEADLINE,
                               f"stage session on {self.node_name} expired ({sess.reason})", None)

    def _release(self, sess: _Session) -> None:
        self.sessions.pop(sess.sid, None)
        self.runner.poke()
        if sess.kv is not None:
            sess.kv.free(names=sess.px)  # with px: the prompt's blocks are kept
        sess.inbox.close()
        reason = sess.reason or "done"
        freed = self.stats["freed"]
        freed[reason] = freed.get(reason, 0) + 1
        log.debug("stage session freed sid=%s reason=%s steps=%d", sess.sid, reason, sess.steps)

    async def _step(self, sess: _Session, msg: Message) -> bool:
        """Run one step; False ends the session (finished, or failed and reported)."""
        pos = msg["pos"]
        if not sess.steps and pos and 0 <= pos[0] < sess.kv.length:
            # the first step starts where every stage of the chain holds the prompt's prefix
            sess.kv.truncate(pos[0])
        if not sess.steps and pos and pos[0] == sess.kv.length:
            self.stats["prefix_reused_tokens"] += pos[0]
        try:
            if len(pos) < 1 or pos[0] != sess.kv.length or pos != list(
                range(pos[0], pos[0] + len(pos))
            ):
                raise RemoteError(f"positions must run {sess.kv.length}..; got {pos[:4]}...",
                                  ErrorCode.BAD_TENSOR)
            x = decode_tensor(msg["dtype"], msg["shape"], msg["data"], tokens=len(pos),
                              hidden=None if sess.is_first else sess.hidden, vocab=sess.vocab)
        except RemoteError as e:
            self.stats["bad_tensors"] += 1
            log.info("stage step rejected sid=%s error=%s", sess.sid, e)
            sess.reason = "bad_tensor"
            await _reply_error(sess.reply, sess.sid, e.code, f"{self.node_name}: {e}", None)
            return False
        self.stats["activation_bytes_in"] += len(msg["data"])
        t0 = time.perf_counter()
        try:
            out = await sess.kv.step(x, np.asarray(pos, dtype=np.int64), last_only=sess.is_last)
        except MeshdError as e:
            self.stats["errors"] += 1
            sess.reason = "error"
            await _reply_error(sess.reply, sess.sid, ErrorCode.INTERNAL, f"{self.node_name}: {e}", None)
            return False
        self.speed(sess.model).note((time.perf_counter() - t0) * 1000, sess.end - sess.start,
                                    len(pos))
        sess.steps += 1
        self.stats["steps"] += 1
        if sess.is_last:
            return await self._emit(sess, msg["step"], out)
        return await self._forward(sess, msg["step"], pos, out)

    async def _forward(self, sess: _Session, step: int, pos: list[int], out: np.ndarray) -> bool:
        assert self.links is not None and sess.next_peer is not None
        dtype, shape, data = encode_hidden(out, sess.wire_dtype)
        try:
            port = await self.links.port(sess.next_peer)
            await port.send(MessageType.STAGE_STEP, {"rid": sess.next_sid, "step": step,
                                                     "pos": pos, "dtype": dtype, "shape": shape,
                                                     "data": data})
        except (PeerGoneError, trio.TooSlowError) as e:
            sess.reason = "next_gone"
            await _reply_error(sess.reply, sess.sid, ErrorCode.PEER_GONE,
                               f"{self.node_name} cannot reach the next stage: {e}",
                               sess.next_peer)
            return False
        self.stats["activation_bytes_out"] += len(data)
        self.stats["activation_frames_out"] += 1
        return True

    async def _emit(self, sess: _Session, step: int, logits: np.ndarray) -> bool:
        ev = sess.gen.feed(logits[-1])
        fields: dict[str, Any] = {"rid": sess.sid, "step": step, "ids": [int(ev.token_id)],
                                  "text": ev.text}
        if ev.finish_reason is not None:
            fields["finish"] = ev.finish_reason
        if ev.logprob is not None:
            fields["lp"] = [ev.logprob]
        try:
            await sess.reply.send(MessageType.STAGE_OUT, fields)
        except (PeerGoneError, trio.TooSlowError):
            sess.reason = "entry_gone"
            return False
        if ev.finish_reason is not None:
            sess.reason = "finished"
            return False
        return True

    # ------------------------------------------------------------------ status

    def statistics(self) -> dict[str, Any]:
        live = list(self.sessions.values())
        models = {}
        for name in self.runner.models:
            sp = self.speed(name)
            models[name] = {
                "sessions_open": sum(1 for x in live if x.model == name),
                "free_kv_tokens": self.free_kv_tokens(name),
                "prefill_ms_per_layer_token": round(sp.prefill_ms_per_layer_token, 4),
                "decode_ms_per_layer": round(sp.decode_ms_per_layer, 4),
            }
        return {
            **{k: v for k, v in self.stats.items() if k != "freed"},
            "freed": dict(self.stats["freed"]),
            "sessions_open": len(live),
            "kv_bytes": sum(x.kv.memory_bytes() for x in live if x.kv is not None),
            "models": models,
            "links": self.links.statistics() if self.links is not None else {},
            "batches": {f"{m}[{a},{b})": x.statistics() for (m, a, b), x in self.batchers.items()},
        }


async def _reply_error(port: Port, sid: str, code: str, message: str, peer: str | None) -> None:
    fields: dict[str, Any] = {"rid": sid, "code": code, "message": message[:1000]}
    if peer:
        fields["peer"] = peer
    with trio.move_on_after(2):
        try:
            await port.send(MessageType.ERROR, fields)
        except Exception:
            pass
