"""A fake upstream inference server for tests: llama-server's, vLLM's or a plain OpenAI API.

It runs in a thread (``http.server``) on a free loopback port, so both in-process tests and
daemons can call it. Its tokenizer is UTF-8 bytes: byte ``b`` is id ``b + 3`` (0-2 are special;
2 is the end of sequence), and it generates the letters ``a`` to ``z`` in turn, starting from the
prompt's length, so a resumed request continues exactly as an uninterrupted one would.

``answer`` says how it generates: ``"ok"``, ``"garbage"`` (a 200 stream of bytes that are not
events of its protocol), ``"hang"`` (headers, then nothing until the test ends it) or ``"cut"``
(two chunks, then the connection closes).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VOCAB = 259
EOS = 2
KINDS = ("llama.cpp", "vllm", "openai")
ANSWERS = ("ok", "garbage", "hang", "cut")


def encode(text: str) -> list[int]:
    return [b + 3 for b in text.encode()]


def decode(ids: list[int]) -> str:
    return bytes(i - 3 for i in ids if i >= 3).decode(errors="replace")


def next_ids(prompt: list[int], n: int) -> list[int]:
    """The ids the fake generates after ``prompt``: letters, from the prompt's length on."""
    return [ord("a") + (len(prompt) + k) % 26 + 3 for k in range(n)]


class FakeUpstream:
    def __init__(self, kind: str = "llama.cpp", answer: str = "ok", *, n_ctx: int = 512,
                 model_path: str = "/nowhere/fake.gguf") -> None:
        assert kind in KINDS and answer in ANSWERS
        self.kind, self.answer, self.n_ctx, self.model_path = kind, answer, n_ctx, model_path
        self.calls: list[str] = []
        self.release = threading.Event()  # ends a "hang"
        self._server: ThreadingHTTPServer | None = None

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @contextmanager
    def running(self) -> Iterator[FakeUpstream]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                fake.calls.append("GET " + self.path)
                fake._get(self)

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                body = json.loads(self.rfile.read(n) or b"{}")
                fake.calls.append("POST " + self.path)
                fake._post(self, body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        t = threading.Thread(target=self._server.serve_forever, daemon=True)
        t.start()
        try:
            yield self
        finally:
            self.release.set()
            self._server.shutdown()
            self._server.server_close()

    # ---------------------------------------------------------------- answers

    def _get(self, h: BaseHTTPRequestHandler) -> None:
        if h.path == "/props" and self.kind == "llama.cpp":
            return _json(h, {"default_generation_settings": {"n_ctx": self.n_ctx, "params": {}},
                             "total_slots": 1, "model_alias": "fake", "model_ftype": "F32",
                             "model_path": self.model_path, "chat_template": "", "build_info": "fake"})
        if h.path == "/v1/models":
            meta = {"n_vocab": VOCAB, "n_ctx": self.n_ctx, "n_params": 1000, "size": 4000}
            row: dict[str, Any] = {"id": "fake", "object": "model"}
            if self.kind == "llama.cpp":
                row["meta"] = meta
            if self.kind == "vllm":
                row.update(root="org/fake-model", max_model_len=self.n_ctx)
            return _json(h, {"object": "list", "data": [row]})
        return _json(h, {"error": {"message": "not found"}}, 404)

    def _post(self, h: BaseHTTPRequestHandler, body: dict[str, Any]) -> None:
        if h.path == "/tokenize" and self.kind == "llama.cpp":
            return _json(h, {"tokens": encode(str(body.get("content", "")))})
        if h.path == "/apply-template" and self.kind == "llama.cpp":
            text = "".join(f"<{m['role']}>{m['content']}" for m in body["messages"]) + "<assistant>"
            return _json(h, {"prompt": text})
        if h.path == "/tokenize" and self.kind == "vllm":
            prompt = body.get("prompt")
            if prompt is None:
                prompt = "".join(f"<{m['role']}>{m['content']}" for m in body["messages"]) + "<assistant>"
            ids = encode(str(prompt))
            return _json(h, {"count": len(ids), "max_model_len": self.n_ctx, "tokens": ids})
        if h.path == "/completion" and self.kind == "llama.cpp":
            return self._stream(h, body["prompt"], int(body.get("n_predict", 8)), native=True)
        if h.path == "/v1/completions" and self.kind == "vllm" and isinstance(body.get("prompt"), list):
            if not body.get("stream"):
                ids = next_ids(body["prompt"], 1)
                return _json(h, {"choices": [{"text": decode(ids), "token_ids": ids}]})
            return self._stream(h, body["prompt"], int(body.get("max_tokens", 8)), native=False)
        if h.path in ("/v1/completions", "/v1/chat/completions"):
            prompt = encode(str(body.get("prompt", "")) or json.dumps(body.get("messages")))
            return self._stream(h, prompt, int(body.get("max_tokens", 8)), native=False, text=True,
                                chat="chat" in h.path)
        return _json(h, {"error": {"message": "not found"}}, 404)

    def _stream(self, h: BaseHTTPRequestHandler, prompt: list[int], n: int, *, native: bool,
                text: bool = False, chat: bool = False) -> None:
        h.send_response(200)
        h.send_header("content-type", "text/event-stream")
        h.send_header("connection", "close")
        h.end_headers()
        if self.answer == "garbage":
            h.wfile.write(b"\x00\xffnot an event at all\r\n{{{{\n\ndata: <html>oops</html>\n\n")
            h.wfile.flush()
            return
        if self.answer == "hang":
            h.wfile.flush()
            self.release.wait(120)
            return
        ids = next_ids(prompt, n)
        for k, i in enumerate(ids):
            if self.answer == "cut" and k == 2:
                return
            if native:
                event: dict[str, Any] = {"content": decode([i]), "tokens": [i], "stop": False}
            elif text:
                piece = decode([i])
                event = {"choices": [{"delta": {"content": piece}} if chat else {"text": piece}]}
            else:
                event = {"choices": [{"text": decode([i]), "token_ids": [i]}]}
            h.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
            h.wfile.flush()
        if native:
            last = {"content": "", "tokens": [], "stop": True, "stop_type": "limit",
                    "timings": {"prompt_ms": 1.0, "predicted_per_second": 100.0}}
            h.wfile.write(b"data: " + json.dumps(last).encode() + b"\n\n")
        else:
            h.wfile.write(b"data: [DONE]\n\n")
        h.wfile.flush()


def _json(h: BaseHTTPRequestHandler, obj: Any, status: int = 200) -> None:
    data = json.dumps(obj).encode()
    h.send_response(status)
    h.send_header("content-type", "application/json")
    h.send_header("content-length", str(len(data)))
    h.end_headers()
    h.wfile.write(data)


__all__ = ["EOS", "VOCAB", "FakeUpstream", "decode", "encode", "next_ids"]
