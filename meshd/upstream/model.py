"""A model served by forwarding to an OpenAI-compatible server (``[[models]] upstream = URL``).

``UpstreamModel`` is what the runner needs of a model (``meshd.node.runner.ModelLike``). It first
asks the server what it is (``meshd.upstream.probe``; again every ``PROBE_INTERVAL_S``, and at
once after a failure) and serves in one of two ways:

- **ids** (llama-server; vLLM when its stream returns token ids): requests move through the mesh
  as the model's real token ids, exactly as for a native model. The ids come from the GGUF's own
  tokenizer when the file llama-server loaded is readable here (identity shared with a native
  import of that file, so edge tokenization, the context check and failover to a native node
  all work) or else from the server's ``/tokenize`` (``aencode_*``; entry nodes elsewhere then
  forward text). Generation sends ids and streams ids back (llama-server's ``/completion``), so
  usage counts are the server's own and a resumed request continues from the very ids.
- **text** (any other server): the prompt travels as packed text (``meshd.upstream.codec``) and
  goes to ``/completions`` or ``/chat/completions``; counts are approximate (one per 3 bytes).

Until its first probe succeeds, and after a failure until a probe succeeds again, the model is
not ``ready``: the node does not advertise it and refuses requests for it (``PeerGoneError``),
so entry nodes route around it. Failures map to meshd's errors so the entry node fails over
exactly as for a dead peer: unreachable, reset, timed out, a 5xx or an answer that is not the
server's protocol is ``PeerGoneError``; 429 is ``BusyError``; a 4xx is a ``RemoteError`` whose
code says why (the request itself was refused).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from pathlib import Path
from typing import Any

import httpx
import trio

from meshd.errors import ErrorCode, LocalError, MeshdError, PeerGoneError, RemoteError
from meshd.upstream import codec, probe
from meshd.upstream import facts as F
from meshd.upstream.stream import Piece, stream_events, text_of, vllm_ids
from meshd.upstream.stream import completion_ids as llama_ids

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 30.0
RETRY_MAX_S = 30.0
TOKENIZERS = ("auto", "server", "text")  # [[models]] upstream_tokenizer

__all__ = ["Piece", "UpstreamModel"]


class UpstreamModel:
    num_layers = 1
    hidden_size = 0

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout_s: float = 30.0, context_length: int = 0,
                 tokenizer: str = "auto") -> None:
        self.base_url = base_url.rstrip("/")
        self.root = F.root_url(self.base_url)
        self.model = model
        self.api_key = api_key
        self.timeout_s = timeout_s
        self.configured_context = context_length
        self.tokenizer_choice = tokenizer
        self._client: httpx.AsyncClient | None = None
        self.facts: F.ServerFacts | None = None
        self.mode = ""  # "ids" or "text" once probed
        self.gguf: probe.GgufTokenizer | None = None  # the exact tokenizer, from the GGUF file
        self.gguf_note = ""  # why there is none
        self.mid = ""  # model identity (meshd.upstream.facts.model_identity)
        self.ready = False
        self.probe_error = "not probed yet"
        self._wake = trio.Event()
        self.stats: dict[str, Any] = {"requests": 0, "errors": 0, "in_flight": 0, "probes": 0,
                                      "probe_failures": 0, "errors_by_kind": {},
                                      "last_error": None}

    @classmethod
    def from_config(cls, m: Any, key_path: Path | None) -> UpstreamModel:
        key = None
        if key_path is not None:
            try:
                key = key_path.read_text().strip()
            except OSError as e:
                raise LocalError(f"cannot read upstream_key_file {key_path}: {e.strerror}") from None
        return cls(m.upstream, m.upstream_model, api_key=key, timeout_s=m.upstream_timeout_s,
                   context_length=m.context_length,
                   tokenizer=getattr(m, "upstream_tokenizer", "auto"))

    # ------------------------------------------------------------------ what the node reads

    @property
    def context_length(self) -> int | None:
        """The server's context (one slot's for llama-server), or the config's when the server
        does not say; the smaller of the two when both do."""
        server = self.facts.context_length if self.facts is not None else 0
        both = [n for n in (server, self.configured_context) if n > 0]
        return min(both) if both else None

    @property
    def vocab_size(self) -> int | None:
        if self.gguf is not None:
            return int(self.gguf.tokenizer.vocab_size)
        if self.mode == "ids" and self.facts is not None and self.facts.n_vocab:
            return self.facts.n_vocab
        return None

    @property
    def tokenizer(self) -> Any:
        """The engine tokenizer of the model when it is held here (from the GGUF), else None."""
        return self.gguf.tokenizer if self.gguf is not None else None

    @property
    def tokenizes_here(self) -> bool:
        """Whether ``encode_*`` works without the server (``aencode_*`` always does)."""
        return self.gguf is not None or self.mode == "text"

    @property
    def tokenizer_shareable(self) -> bool:
        """Whether peers can fetch this model's tokenizer from this node (edge tokenization)."""
        return self.gguf is not None

    def tokenizer_identity(self) -> str:
        """The GGUF tokenizer's identity; for ids only the server makes, an identity no other
        tokenizer shares (``facts.server_tokenizer_identity``); "" for packed text."""
        if self.gguf is not None:
            return self.gguf.identity
        if self.mode == "ids" and self.mid:
            return F.server_tokenizer_identity(self.mid)
        return ""

    def tokenizer_bundle(self) -> bytes | None:
        return self.gguf.bundle if self.gguf is not None else None

    @property
    def model_identity(self) -> str:
        return self.mid

    def statistics(self) -> dict[str, Any]:
        return {"upstream": self.base_url, "upstream_model": self.model, "ready": self.ready,
                "mode": self.mode or None, "model_identity": self.mid or None,
                "tokenizer": ("gguf" if self.gguf is not None else "server" if self.mode == "ids"
                              else "text" if self.mode else None),
                **({"tokenizer_note": self.gguf_note} if self.gguf_note else {}),
                **({"probe_error": self.probe_error} if not self.ready else {}),
                "server": self.facts.statistics() if self.facts is not None else None,
                **self.stats, "errors_by_kind": dict(self.stats["errors_by_kind"])}

    # ------------------------------------------------------------------ probing

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            headers = {"authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(
                headers=headers, timeout=httpx.Timeout(self.timeout_s, connect=min(self.timeout_s, 5.0)))
        return self._client

    async def run(self, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
        """Probe the server now, every ``PROBE_INTERVAL_S`` and at once after a failure (with
        backoff while it keeps failing); started by the runner."""
        task_status.started()
        backoff = 1.0
        while True:
            ok = await self.probe_once()
            backoff = 1.0 if ok else min(backoff * 2, RETRY_MAX_S)
            with trio.move_on_after(PROBE_INTERVAL_S if ok else backoff):
                await self._wake.wait()
            self._wake = trio.Event()

    async def probe_once(self) -> bool:
        self.stats["probes"] += 1
        try:
            with trio.fail_after(self.timeout_s + 5.0):
                facts = await probe.probe(self._http(), self.base_url, self.model)
            await self._adopt(facts)  # HTTP calls under httpx's timeouts; reading a GGUF file
        except (MeshdError, OSError, trio.TooSlowError) as e:
            why = "the probe timed out" if isinstance(e, trio.TooSlowError) else probe.describe(e)
            self.stats["probe_failures"] += 1
            if self.ready or why != self.probe_error:
                log.warning("upstream not ready url=%s model=%s error=%s", self.base_url,
                            self.model, why)
            self.ready, self.probe_error = False, why
            return False
        if not self.ready:
            log.info("upstream ready url=%s model=%s kind=%s mode=%s tokenizer=%s identity=%s "
                     "context=%s", self.base_url, self.model, facts.kind, self.mode,
                     self.statistics()["tokenizer"], self.mid, self.context_length)
        self.ready, self.probe_error = True, ""
        return True

    async def _adopt(self, facts: F.ServerFacts) -> None:
        """Take a probe's facts: the mode, the tokenizer and the model identity."""
        gguf: probe.GgufTokenizer | None = None
        note = ""
        digest = ""
        mode = "text" if self.tokenizer_choice == "text" or facts.kind == F.OPENAI else "ids"
        if facts.kind == F.LLAMA_CPP and mode == "ids":
            gguf, note = await self._gguf_tokenizer(facts.model_path)
            if gguf is not None:
                digest = gguf.sha256
            elif facts.model_path and probe.file_stamp(facts.model_path) is not None:
                digest = await trio.to_thread.run_sync(probe.gguf_digest_only, facts.model_path)
        elif facts.kind == F.VLLM and mode == "ids":
            ids = await self._server_tokenize("Hi", chat=False, kind=facts.kind)
            if not await probe.vllm_returns_ids(self._http(), self.base_url, self.model, ids):
                mode, note = "text", "this vLLM does not return token ids (return_token_ids)"
        self.facts, self.mode, self.gguf, self.gguf_note = facts, mode, gguf, note
        self.mid = F.model_identity(facts, self.base_url, self.model, digest)

    async def _gguf_tokenizer(self, path: str) -> tuple[probe.GgufTokenizer | None, str]:
        if self.tokenizer_choice == "server":
            return None, "upstream_tokenizer = \"server\""
        if not path or probe.file_stamp(path) is None:
            return None, (f"the GGUF file {path or '(none named)'} is not readable on this host "
                          "(or not a GGUF file)")
        held = self.gguf
        if held is None or held.path != path or held.stamp != probe.file_stamp(path):
            try:
                held = await trio.to_thread.run_sync(probe.load_gguf_tokenizer, path)
            except (MeshdError, OSError) as e:
                return None, probe.describe(e)
        why = await probe.verify(self._http(), self.root, held.tokenizer)
        if why:
            log.warning("GGUF tokenizer differs from the server's url=%s first=%s", self.root, why)
            return None, f"the GGUF tokenizer differs from the server's /tokenize: {why}"
        return held, ""

    def _suspect(self, err: RemoteError) -> None:
        """A call failed as a dead server would: not ready until a probe says otherwise."""
        if isinstance(err, PeerGoneError):
            self.ready, self.probe_error = False, f"the last call failed: {err}"
            self._wake.set()

    # ------------------------------------------------------------------ tokenizing

    def _need_ready(self) -> None:
        if not self.ready:
            raise PeerGoneError(f"upstream {self.base_url} is not ready: {self.probe_error}")

    def encode_prompt(self, text: str, *, chat: bool = False) -> list[int]:
        self._need_ready()
        if self.gguf is not None:
            return list(self.gguf.tokenizer.encode_prompt(text, chat=chat))
        if self.mode == "ids":
            raise RemoteError(f"upstream model {self.model} tokenizes through its server: "
                              "use aencode_prompt", ErrorCode.INTERNAL)
        if chat:
            return codec.encode_chat([{"role": "user", "content": text}])
        return codec.encode_text(text)

    def encode_messages(self, messages: list[Any], *, tools: list[Any] | None = None) -> list[int]:
        self._need_ready()
        if self.gguf is not None:
            return list(self.gguf.tokenizer.encode_chat(list(messages), tools=tools))
        if tools:  # the API renders tools in the generic format for a model without a template
            raise RemoteError(f"upstream model {self.model} cannot render tools in its chat "
                              "template", ErrorCode.UNSUPPORTED)
        if self.mode == "ids":
            raise RemoteError(f"upstream model {self.model} tokenizes through its server: "
                              "use aencode_messages", ErrorCode.INTERNAL)
        return codec.encode_chat(list(messages))

    async def aencode_prompt(self, text: str, *, chat: bool = False) -> list[int]:
        """``encode_prompt``, through the server's ``/tokenize`` when only it has the tokenizer."""
        self._need_ready()
        if self.gguf is None and self.mode == "ids":
            if chat:
                return await self.aencode_messages([{"role": "user", "content": text}])
            return await self._server_tokenize(text, chat=False)
        return self.encode_prompt(text, chat=chat)

    async def aencode_messages(self, messages: list[Any], *,
                               tools: list[Any] | None = None) -> list[int]:
        self._need_ready()
        if self.gguf is None and self.mode == "ids" and not tools:
            return await self._server_tokenize(list(messages), chat=True)
        return self.encode_messages(messages, tools=tools)

    async def _server_tokenize(self, what: Any, *, chat: bool, kind: str = "") -> list[int]:
        from meshd.upstream import llamacpp

        kind = kind or (self.facts.kind if self.facts is not None else "")
        client = self._http()
        try:
            with trio.fail_after(self.timeout_s):
                if kind == F.LLAMA_CPP:
                    if chat:  # the server's own chat template, then its tokenizer
                        r = await client.post(self.root + "/apply-template", json={"messages": what})
                        r.raise_for_status()
                        what = str(r.json()["prompt"])
                    body = llamacpp.tokenize_body(what, add_special=True)
                elif chat:
                    body = {"model": self.model, "messages": what, "add_generation_prompt": True}
                else:
                    body = {"model": self.model, "prompt": what, "add_special_tokens": True}
                r = await client.post(self.root + "/tokenize", json=body)
                r.raise_for_status()
                return llamacpp.token_list(r.json(), self.root)
        except (trio.TooSlowError, httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            err = PeerGoneError(f"upstream {self.root} could not tokenize: {type(e).__name__}: {e}")
            self._failed(err)
            raise err from None

    # ------------------------------------------------------------------ generating

    def request_body(self, ids: list[int], cfg: Any) -> tuple[str, dict[str, Any]]:
        """(path, JSON body) of a text-mode call for prompt ``ids`` (with any text already
        generated, for a resumed request) and the generation config."""
        try:
            d = codec.decode(ids)
        except codec.CodecError as e:
            raise RemoteError(f"upstream model {self.model}: {e}", ErrorCode.MALFORMED) from None
        body: dict[str, Any] = {"model": self.model, "stream": True,
                                "max_tokens": int(cfg.max_tokens)}
        for key in ("temperature", "top_p", "seed"):
            v = getattr(cfg, key, None)
            if v is not None:
                body[key] = v
        if getattr(cfg, "stop", ()):
            body["stop"] = list(cfg.stop)
        if d.kind == codec.CHAT:
            messages = d.messages()
            if d.generated:  # a resumed answer: the upstream continues the assistant's turn
                messages.append({"role": "assistant", "content": d.generated})
            body["messages"] = messages
            return "/chat/completions", body
        body["prompt"] = d.prompt + d.generated
        return "/completions", body

    async def generate(self, ids: list[int], cfg: Any) -> AsyncIterator[Piece]:
        self._need_ready()
        self.stats["requests"] += 1
        self.stats["in_flight"] += 1
        t0 = time.perf_counter()
        try:
            with trio.fail_after(self.timeout_s * 4 + float(cfg.max_tokens)):  # a stuck stream
                async with aclosing(self._pieces(ids, cfg)) as pieces:
                    async for piece in pieces:
                        yield piece
        except (RemoteError, trio.TooSlowError) as e:
            err = e if isinstance(e, RemoteError) else PeerGoneError(
                f"upstream {self.base_url} stalled mid-answer")
            self._failed(err)
            self._suspect(err)
            raise err from None
        finally:
            self.stats["in_flight"] -= 1
            log.debug("upstream call done model=%s ms=%.1f", self.model,
                      (time.perf_counter() - t0) * 1000)

    def _pieces(self, ids: list[int], cfg: Any) -> AsyncGenerator[Piece, None]:
        client, kind = self._http(), self.facts.kind if self.facts is not None else ""
        if self.mode == "ids" and kind == F.LLAMA_CPP:
            return llama_ids(client, self.root, ids, cfg, self.vocab_size)
        if self.mode == "ids" and kind == F.VLLM:
            return vllm_ids(client, self.base_url, self.model, ids, cfg, self.vocab_size)
        return self._text_pieces(ids, cfg)

    async def _text_pieces(self, ids: list[int], cfg: Any) -> AsyncGenerator[Piece, None]:
        path, body = self.request_body(ids, cfg)
        async with aclosing(stream_events(self._http(), self.base_url + path, body)) as events:
            async for data in events:
                if data.strip() == "[DONE]":
                    return
                text = text_of(data, self.base_url)
                for pid, part in codec.piece_ids(text):
                    yield Piece(pid, part)
        raise PeerGoneError(f"upstream {self.base_url} ended the stream without [DONE]")

    def _failed(self, err: RemoteError) -> None:
        kind = str(err.code)
        self.stats["errors"] += 1
        self.stats["errors_by_kind"][kind] = self.stats["errors_by_kind"].get(kind, 0) + 1
        self.stats["last_error"] = str(err)[:300]
        log.warning("upstream failed url=%s model=%s code=%s error=%s", self.base_url, self.model,
                    kind, err)

