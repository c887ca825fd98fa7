"""UpstreamModel against a fake server (meshd.testing.fake_upstream): what the probe makes of
llama-server, vLLM and a plain OpenAI API, ids in and out, and a server that answers garbage,
hangs or drops the connection: a clear PeerGoneError, and the model not ready until a probe
succeeds again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import trio

from meshd.errors import PeerGoneError
from meshd.testing.fake_upstream import FakeUpstream, decode, encode, next_ids
from meshd.upstream import facts as F
from meshd.upstream.model import UpstreamModel

CFG = SimpleNamespace(max_tokens=5, temperature=0.0, top_k=0, top_p=1.0, repetition_penalty=1.0,
                      seed=None, stop=())


@pytest.fixture
def llama() -> Iterator[FakeUpstream]:
    with FakeUpstream("llama.cpp").running() as f:
        yield f


async def _gen(m: UpstreamModel, ids: list[int]) -> list[int]:
    return [p.token_id async for p in m.generate(ids, CFG)]


def test_llama_server_without_its_file_tokenizes_through_it(llama: FakeUpstream) -> None:
    async def main() -> None:
        m = UpstreamModel(llama.base_url, "fake", timeout_s=5)
        with pytest.raises(PeerGoneError, match="not ready: not probed yet"):
            await m.aencode_prompt("x")
        assert await m.probe_once()
        st = m.statistics()
        assert (st["mode"], st["tokenizer"], m.context_length, m.vocab_size) == ("ids", "server", 512, 259)
        assert "not readable on this host" in st["tokenizer_note"]
        assert m.model_identity == "llama.cpp:fake.gguf:1000:4000:F32"
        assert m.tokenizer_identity() == F.server_tokenizer_identity(m.model_identity)
        assert not m.tokenizer_shareable and not m.tokenizes_here and m.tokenizer_bundle() is None
        ids = await m.aencode_prompt("Hi")
        assert ids == encode("Hi")
        chat = await m.aencode_messages([{"role": "user", "content": "Hi"}])
        assert decode(chat) == "<user>Hi<assistant>"
        assert await _gen(m, ids) == next_ids(ids, 5)
        # a resumed request continues from prompt + the ids so far, as an uninterrupted one
        assert await _gen(m, ids + next_ids(ids, 2)) == next_ids(ids, 7)[2:]

    trio.run(main)


def test_a_configured_context_caps_the_servers(llama: FakeUpstream) -> None:
    async def main() -> None:
        m = UpstreamModel(llama.base_url, "fake", timeout_s=5, context_length=300)
        assert m.context_length == 300
        await m.probe_once()
        assert m.context_length == 300
        m.configured_context = 0
        assert m.context_length == 512

    trio.run(main)


@pytest.mark.parametrize(("answer", "match"), [
    ("garbage", "not JSON|not llama-server's"),
    ("hang", "timed out"),
    ("cut", "ended the stream before its last chunk|failed: RemoteProtocolError"),
])
def test_a_bad_answer_is_a_clear_error_and_the_model_waits_for_a_probe(answer: str, match: str) -> None:
    async def main() -> None:
        with FakeUpstream("llama.cpp", answer).running() as fake:
            m = UpstreamModel(fake.base_url, "fake", timeout_s=1.5)
            assert await m.probe_once()
            with pytest.raises(PeerGoneError, match=match):
                await _gen(m, encode("Hi"))
            assert not m.ready and m.statistics()["errors_by_kind"] == {"peer_gone": 1}
            with pytest.raises(PeerGoneError, match="not ready: the last call failed"):
                await _gen(m, encode("Hi"))
            assert await m.probe_once()  # the server still answers its probe
            assert m.ready

    trio.run(main)


def test_vllm_ids_in_and_out() -> None:
    async def main() -> None:
        with FakeUpstream("vllm").running() as fake:
            m = UpstreamModel(fake.base_url, "fake", timeout_s=5)
            assert await m.probe_once()
            assert (m.mode, m.context_length, m.model_identity) == ("ids", 512, "hf:org/fake-model")
            ids = await m.aencode_messages([{"role": "user", "content": "Hi"}])
            assert decode(ids) == "<user>Hi<assistant>"
            assert await _gen(m, ids) == next_ids(ids, 5)

    trio.run(main)


def test_a_plain_openai_server_gets_packed_text() -> None:
    async def main() -> None:
        with FakeUpstream("openai").running() as fake:
            m = UpstreamModel(fake.base_url, "fake", timeout_s=5)
            assert await m.probe_once()
            assert (m.mode, m.context_length, m.tokenizer_identity()) == ("text", None, "")
            assert m.model_identity == f"upstream:fake@127.0.0.1:{fake.port}"
            assert m.tokenizes_here and m.vocab_size is None
            ids = m.encode_prompt("Hi")
            text = "".join([p.text async for p in m.generate(ids, CFG)])
            assert text == "cdefg"  # the fake's letters from the 3rd on, after "Hi"
            assert "POST /v1/completions" in fake.calls

    trio.run(main)


def test_a_server_that_is_not_there_is_not_ready() -> None:
    async def main() -> None:
        with FakeUpstream().running() as fake:
            url = fake.base_url
        m = UpstreamModel(url, "fake", timeout_s=2)
        assert not await m.probe_once()
        assert not m.ready and "unreachable" in m.probe_error
        assert m.statistics()["probe_error"] == m.probe_error

    trio.run(main)


def test_only_a_gguf_file_the_server_names_is_read(tmp_path: Path) -> None:
    """The path comes from the server: a file of this host that is not a GGUF file is neither
    read nor hashed (its digest would otherwise be advertised as the model's identity)."""
    secret = tmp_path / "secret.txt"
    secret.write_text("not a model")

    async def main() -> None:
        with FakeUpstream("llama.cpp", model_path=str(secret)).running() as fake:
            m = UpstreamModel(fake.base_url, "fake", timeout_s=5)
            assert await m.probe_once()
            assert m.model_identity == "llama.cpp:secret.txt:1000:4000:F32"
            assert "not a GGUF file" in m.statistics()["tokenizer_note"]

    trio.run(main)
