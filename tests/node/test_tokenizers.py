"""The tokenizer fetch-and-cache service (meshd.node.tokenizers) in-process, with the real
engine Tokenizer and a fake peer: bundles checked against their identity (a tampered one from a
peer or on disk is refused and never used), cached on disk, loaded back; a silent peer costs a
request at most its wait. And the serving side's reading of a REQ's prompt."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import trio

from meshd.config import Config, NodeConfig, RoutingConfig
from meshd.core.advert import Advert, ModelAdvert
from meshd.core.messages import MessageType
from meshd.core.packing import pack_ids
from meshd.core.peertable import PeerTable
from meshd.core.tokident import TokenizerMeta, chunks, encode_bundle, tokenizer_identity
from meshd.engine import default_model_path
from meshd.engine.manifest import read_manifest
from meshd.engine.tokenizer import Tokenizer
from meshd.errors import ProtocolError, RemoteError
from meshd.node.runner import Runner, Served
from meshd.node.serve import RequestServer
from meshd.node.tokenizers import SUFFIX, TokenizerService
from meshd.testing.fake_model import FakeModel

MODEL = default_model_path()
MANIFEST = read_manifest(MODEL)
JSON = (MODEL / MANIFEST.tokenizer.file).read_bytes()
T = MANIFEST.tokenizer
META = TokenizerMeta(T.bos_token_id, tuple(T.eos_token_ids), T.bos_token, T.eos_token, T.chat_template)
IDENT = tokenizer_identity(JSON, META)
GOOD = encode_bundle(JSON, META)
TAMPERED = encode_bundle(JSON.replace(b'"beginning"', b'"BEGINNING"', 1)
                         if b'"beginning"' in JSON else JSON[:-2] + b" }", META)


class _Chan:
    def __init__(self, bundle: bytes | None) -> None:
        self.bundle = bundle  # None: never answers
        self.asked = 0

    async def request(self, fields: dict[str, Any], *, mtype: MessageType,
                      ends: Callable[[dict[str, Any]], bool]) -> AsyncIterator[dict[str, Any]]:
        assert mtype == MessageType.TOK_REQ and fields["tok"] == IDENT
        self.asked += 1
        if self.bundle is None:
            await trio.sleep_forever()
        assert self.bundle is not None
        for off, data in chunks(self.bundle, 64 << 10):  # several chunks
            yield {"t": int(MessageType.TOK_PART), "rid": fields["rid"], "offset": off,
                   "total": len(self.bundle), "data": data}


class _Links:
    def __init__(self, chans: dict[str, _Chan]) -> None:
        self.chans = chans

    async def channel(self, peer_id: str) -> _Chan:
        return self.chans[peer_id]


class _Node:
    def __init__(self, data_dir: Path, chans: dict[str, _Chan]) -> None:
        self.config = Config(node=NodeConfig(data_dir=str(data_dir)), routing=RoutingConfig())
        self.runner = Runner()
        self.table = PeerTable("me", expiry_s=1e9)
        self.membership = self  # what the service reads of membership: the table
        self.links = _Links(chans)
        for name in chans:
            adv = Advert(peer_id=name, name=name, seq=1, ts=time.time(),
                         models=(ModelAdvert("tiny-en", 6, 0, 6, context_length=256, tokenizer=IDENT),))
            self.table.apply(adv, 0.0, time.time())


def _with_service(node: _Node, body: Callable[[TokenizerService], Any]) -> TokenizerService:
    svc = TokenizerService(node)

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(svc.run)
            with trio.fail_after(30):
                await body(svc)
            nursery.cancel_scope.cancel()

    trio.run(main)
    return svc


def _reference() -> Tokenizer:
    return Tokenizer(MODEL / T.file, T)


def test_a_fetched_tokenizer_is_checked_cached_and_tokenizes_as_the_model_does(tmp_path: Path) -> None:
    node = _Node(tmp_path, {"peer-a": _Chan(GOOD)})
    got: dict[str, Any] = {}

    async def body(svc: TokenizerService) -> None:
        assert svc.advertised("tiny-en") == IDENT and svc.advertised("other") == ""
        got["tok"], got["why"] = await svc.get(IDENT, 20)

    svc = _with_service(node, body)
    tok, ref = got["tok"], _reference()
    assert tok is not None and got["why"] == ""
    for text in ("In the beginning God created the heaven and the earth.", "def f(x): return x",
                 "Καὶ εἶπεν ὁ θεός", "一二三"):
        assert tok.encode_prompt(text) == ref.encode_prompt(text)
        assert tok.encode_prompt(text, chat=True) == ref.encode_prompt(text, chat=True)
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Who?"}]
    assert tok.encode_chat(msgs) == ref.encode_chat(msgs) and tok.vocab_size == ref.vocab_size
    assert svc.stats["fetched"] == 1 and svc.stats["bytes_fetched"] == len(GOOD)
    cached = tmp_path / "tokenizers" / f"{IDENT}{SUFFIX}"
    assert cached.read_bytes() == GOOD
    # a restarted node loads it from disk, asking nobody
    chan = _Chan(GOOD)
    again: dict[str, Any] = {}

    async def body2(svc: TokenizerService) -> None:
        again["tok"], _ = await svc.get(IDENT, 20)

    svc2 = _with_service(_Node(tmp_path, {"peer-a": chan}), body2)
    assert again["tok"] is not None and chan.asked == 0
    assert svc2.stats["cache_loads"] == 1 and svc2.stats["fetched"] == 0


def test_a_tampered_tokenizer_from_a_peer_is_refused_and_never_cached(tmp_path: Path) -> None:
    assert TAMPERED != GOOD
    evil = _Chan(TAMPERED)
    node = _Node(tmp_path, {"peer-evil": evil})
    got: dict[str, Any] = {}

    async def body(svc: TokenizerService) -> None:
        got["first"] = await svc.get(IDENT, 20)
        got["again"] = await svc.get(IDENT, 20)  # within RETRY_AFTER_S: not asked again

    svc = _with_service(node, body)
    tok, why = got["first"]
    assert tok is None and "hash mismatch" in why and "peer-evil" in why
    assert got["again"][0] is None and "failed" in got["again"][1]
    assert evil.asked == 1 and svc.stats["hash_rejected"] == 1 and svc.stats["fetch_failures"] == 1
    assert not svc.loaded and not (tmp_path / "tokenizers" / f"{IDENT}{SUFFIX}").exists()


def test_a_tampered_peer_is_skipped_for_an_honest_one(tmp_path: Path) -> None:
    evil, good = _Chan(TAMPERED), _Chan(GOOD)
    node = _Node(tmp_path, {"a-evil": evil, "b-good": good})  # the evil one is asked first
    got: dict[str, Any] = {}

    async def body(svc: TokenizerService) -> None:
        got["tok"], got["why"] = await svc.get(IDENT, 20)

    svc = _with_service(node, body)
    assert got["tok"] is not None and evil.asked == 1 and good.asked == 1
    assert svc.stats["hash_rejected"] == 1 and svc.stats["fetched"] == 1


def test_a_tampered_cache_file_is_refused_and_fetched_again(tmp_path: Path) -> None:
    cached = tmp_path / "tokenizers" / f"{IDENT}{SUFFIX}"
    cached.parent.mkdir(parents=True)
    cached.write_bytes(TAMPERED)
    chan = _Chan(GOOD)
    got: dict[str, Any] = {}

    async def body(svc: TokenizerService) -> None:
        got["tok"], _ = await svc.get(IDENT, 20)

    svc = _with_service(_Node(tmp_path, {"peer-a": chan}), body)
    assert got["tok"] is not None and chan.asked == 1
    assert svc.stats["cache_rejected"] == 1 and svc.stats["cache_loads"] == 0
    assert cached.read_bytes() == GOOD


def test_a_silent_peer_costs_a_request_at_most_its_wait(tmp_path: Path) -> None:
    got: dict[str, Any] = {}

    async def body(svc: TokenizerService) -> None:
        t0 = trio.current_time()
        got["tok"], got["why"] = await svc.get(IDENT, 0.3)
        got["took"] = trio.current_time() - t0
        got["fetching"] = svc.statistics()["fetching"]

    _with_service(_Node(tmp_path, {"peer-a": _Chan(None)}), body)
    assert got["tok"] is None and "tokenizer_wait_s = 0.3 s" in got["why"]
    assert got["took"] < 1.5 and got["fetching"] == [IDENT[:12]]  # it goes on in the background


# ---------------------------------------------------------------------------- serving side


class _IdentModel(FakeModel):
    def tokenizer_identity(self) -> str:
        return "aa" * 32


def _server() -> RequestServer:
    runner = Runner()
    runner.add(Served(name="m", model=_IdentModel(vocab=1000), layer_start=0, layer_end=4,
                      num_layers=4, max_concurrency=1, max_queue=1))
    return RequestServer(runner, "srv", max_hops=4)


def _req(**prompt: Any) -> dict[str, Any]:
    return {"rid": "r", "model": "m", "deadline_ms": 1000, "hops": 1, "prompt_ids": [], **prompt}


def test_the_server_reads_packed_ids_lists_and_text() -> None:
    srv = _server()
    dtype, data = pack_ids([3, 999, 0], 1000)
    assert srv.prompt_ids(_req(prompt_packed=data, prompt_dtype=dtype, tok="aa" * 32)) == [3, 999, 0]
    assert srv.prompt_ids(_req(prompt_packed=data, prompt_dtype=dtype)) == [3, 999, 0]
    assert srv.prompt_ids(_req(prompt_packed=data, prompt_dtype=dtype, tok="aa" * 8)) == [3, 999, 0]
    assert srv.prompt_ids(_req(prompt_ids=[5, 6])) == [5, 6]  # an older entry node
    assert srv.prompt_ids(_req(prompt="hi")) == [ord("h"), ord("i")]
    assert {k: srv.stats[k] for k in ("prompts_packed", "prompts_ids", "prompts_text")} == {
        "prompts_packed": 3, "prompts_ids": 1, "prompts_text": 1}


@pytest.mark.parametrize(("prompt", "code", "says"), [
    ({"prompt_packed": b"\x01\x00", "prompt_dtype": "u16", "tok": "bb" * 32}, "no_model",
     "tokenized with tokenizer bbbb"),
    ({"prompt_packed": b"\x01\x00", "prompt_dtype": "u16", "tok": "bb" * 8}, "no_model",
     "tokenized with tokenizer bbbb"),
    ({"prompt_packed": b"\x01\x00", "prompt_dtype": "u16", "tok": "aaaa"}, "malformed",
     "16 to 64 lowercase hex"),
    ({"prompt_packed": pack_ids([1000], 4096)[1], "prompt_dtype": "u16"}, "malformed",
     "outside the vocabulary"),
    ({"prompt_packed": b"\x01\x00\x02", "prompt_dtype": "u16"}, "malformed", "whole number"),
    ({"prompt_packed": b"\x01\x00", "prompt_dtype": "f16"}, "malformed", "u16 or u32"),
    ({}, "malformed", "neither"),
])
def test_the_server_refuses_bad_prompts(prompt: dict[str, Any], code: str, says: str) -> None:
    with pytest.raises(RemoteError, match=says) as e:
        _server().prompt_ids(_req(**prompt))
    assert e.value.code == code
    if code == "malformed":
        assert isinstance(e.value, ProtocolError)
