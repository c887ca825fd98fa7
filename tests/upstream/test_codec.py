"""Upstream models' token ids: a reversible packing of text (meshd.upstream.codec)."""

from __future__ import annotations

from types import SimpleNamespace

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshd.errors import BusyError, ErrorCode, PeerGoneError, RemoteError
from meshd.upstream import codec
from meshd.upstream.model import UpstreamModel
from meshd.upstream.stream import http_error as _http_error
from meshd.upstream.stream import text_of as _text_of


@given(st.text(max_size=300), st.text(max_size=100))
def test_a_prompt_and_the_text_streamed_so_far_round_trip(prompt: str, answer: str) -> None:
    ids = codec.encode_text(prompt) + [i for i, _ in codec.piece_ids(answer)]
    d = codec.decode(ids)
    assert (d.kind, d.prompt, d.generated) == (codec.TEXT, prompt, answer)
    assert all(0 <= i < 2**63 for i in ids)


@given(st.lists(st.tuples(st.sampled_from(["system", "user", "assistant"]), st.text(max_size=50)),
                min_size=1, max_size=5))
def test_chat_messages_round_trip(pairs: list[tuple[str, str]]) -> None:
    messages = [{"role": r, "content": c} for r, c in pairs]
    d = codec.decode(codec.encode_chat(messages))
    assert d.kind == codec.CHAT and d.messages() == messages


@given(st.text(min_size=1, max_size=60))
def test_pieces_are_at_most_seven_bytes_and_join_to_the_text(text: str) -> None:
    pieces = codec.piece_ids(text)
    assert "".join(t for _, t in pieces) == text
    assert all(0 < len(t.encode()) <= 7 for _, t in pieces)


def test_a_prompt_counts_about_one_token_per_three_bytes_and_packs_as_u32() -> None:
    from meshd.core.packing import pack_ids, vocab_bound

    ids = codec.encode_text("x" * 300) + codec.encode_chat([{"role": "user", "content": "é" * 99}])
    assert len(codec.encode_text("x" * 300)) == 101
    assert all(0 <= i < 2**32 for i in ids)
    assert pack_ids(ids, vocab_bound(ids, 0))[0] == "u32"


@pytest.mark.parametrize("ids", [[], [5, 6, 7], [codec.PROMPT_BASE + 2 * 8],
                                 codec.encode_text("hi") + [12345]])
def test_foreign_ids_are_refused(ids: list[int]) -> None:
    with pytest.raises(codec.CodecError):
        codec.decode(ids)


CFG = SimpleNamespace(max_tokens=8, temperature=0.0, top_p=0.9, seed=3, stop=("\n",))


def test_the_upstream_call_for_a_completion_and_a_resumed_one() -> None:
    m = UpstreamModel("http://h:1/v1/", "llama")
    path, body = m.request_body(codec.encode_text("Once"), CFG)
    assert path == "/completions"
    assert body == {"model": "llama", "stream": True, "max_tokens": 8, "temperature": 0.0,
                    "top_p": 0.9, "seed": 3, "stop": ["\n"], "prompt": "Once"}
    resumed = codec.encode_text("Once") + [i for i, _ in codec.piece_ids(" upon")]
    assert m.request_body(resumed, CFG)[1]["prompt"] == "Once upon"


def test_the_upstream_call_for_a_chat_and_a_resumed_one() -> None:
    m = UpstreamModel("http://h:1/v1", "llama")
    msgs = [{"role": "user", "content": "Hi"}]
    path, body = m.request_body(codec.encode_chat(msgs), CFG)
    assert path == "/chat/completions" and body["messages"] == msgs
    resumed = codec.encode_chat(msgs) + [i for i, _ in codec.piece_ids("Hello")]
    assert m.request_body(resumed, CFG)[1]["messages"][-1] == {"role": "assistant", "content": "Hello"}
    with pytest.raises(RemoteError) as e:
        m.request_body([1, 2, 3], CFG)  # ids of a real tokenizer
    assert e.value.code == ErrorCode.MALFORMED


def response(status: int, body: dict[str, object], **headers: str) -> httpx.Response:
    return httpx.Response(status, json=body, headers=headers)


def test_upstream_answers_map_to_meshd_errors() -> None:
    err = {"error": {"message": "nope", "code": "context_length_exceeded"}}
    assert isinstance(_http_error(response(503, {}), "u"), PeerGoneError)
    busy = _http_error(response(429, {}, **{"retry-after": "2"}), "u")
    assert isinstance(busy, BusyError) and busy.wait_ms == 2000
    assert _http_error(response(400, err), "u").code == ErrorCode.CONTEXT_LENGTH_EXCEEDED
    assert _http_error(response(404, {}), "u").code == ErrorCode.NO_MODEL
    assert _http_error(response(400, {}), "u").code == ErrorCode.MALFORMED


def test_stream_events_give_their_text() -> None:
    assert _text_of('{"choices":[{"delta":{"content":"a"}}]}', "u") == "a"
    assert _text_of('{"choices":[{"text":"b"}]}', "u") == "b"
    assert _text_of('{"choices":[],"usage":{}}', "u") == ""
    with pytest.raises(PeerGoneError):
        _text_of('{"error":{"message":"boom"}}', "u")
