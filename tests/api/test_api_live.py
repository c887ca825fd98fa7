"""Acceptance of the HTTP API: the official ``openai`` client against a real 3-daemon testnet.

Every node serves a tiny random Llama with a chat template, as ``tiny``; n3 also serves it as
``tiny-solo``, so a request for that model at n1 is served by a peer. Decoding is capped at 40
tokens/s so a long request stays in flight long enough to hit a quota or be cancelled.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from meshd.testnet.drive import cli as meshd
from meshd.testnet.drive import wait_for
from meshd.testnet.launcher import NodeSpec, down, up

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))

from hf_fixtures import CHAT_TEMPLATE, make_checkpoint  # noqa: E402

from meshd.engine import import_hf  # noqa: E402

from .openai_client import client, listed_models

pytestmark = pytest.mark.slow

CAPPED = {"path": "default", "max_decode_tokens_per_s": 40.0, "max_concurrency": 4}
# 8 tokens/s: the longest request the context allows (~250 tokens) runs about 30 s
SOLO = {**CAPPED, "name": "tiny-solo", "max_decode_tokens_per_s": 8.0}


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    root = tmp_path_factory.mktemp("api-mesh")
    make_checkpoint(root / "hf", layers=4, hidden=32, seed=7, chat_template=CHAT_TEMPLATE)
    import_hf(root / "hf", root / "model", stages=1, name="tiny")
    specs = [NodeSpec(name="n1", models=[CAPPED], extra={"routing": {"quotas": {"alice": 1}}}),
             NodeSpec(name="n2", models=[CAPPED]), NodeSpec(name="n3", models=[CAPPED, SOLO])]
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MESHD_DEFAULT_MODEL", str(root / "model"))
        index = up(root / "net", specs, advert_interval_s=1.0)
    try:
        index["key"] = Path(index["api_key_file"]).read_text().strip()
        alice = meshd("keys", "api-key", "create", "alice", "--file",
                      str(root / "net" / "api-keys")).stdout.strip()
        index["alice"] = alice
        n1 = index["nodes"][0]
        wait_for(lambda: {"tiny", "tiny-solo"} <= set(listed_models(n1["api_url"], index["key"])),
                 30, "n1 to list every model of the mesh")
        yield index
    finally:
        down(root / "net")


def node(mesh: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in mesh["nodes"] if n["name"] == name)


def status(n: dict[str, Any]) -> dict[str, Any]:
    """A node's status, asked in-process (a CLI process per poll is slow on a loaded box)."""
    import trio

    from meshd.control.client import call
    from meshd.core.messages import MessageType

    out: dict[str, Any] = trio.run(call, n["socket"], MessageType.STATUS_REQ, {})["data"]
    return out


HELLO = [{"role": "user", "content": "Once upon a time"}]


def test_models_lists_every_model_of_the_mesh(mesh: dict[str, Any]) -> None:
    for n in mesh["nodes"]:
        listed = client(n["api_url"], mesh["key"]).models.list()
        assert {"tiny", "tiny-solo"} <= {m.id for m in listed}
        assert all(m.object == "model" for m in listed)


def test_a_chat_completion_and_its_headers(mesh: dict[str, Any]) -> None:
    n1 = node(mesh, "n1")
    raw = client(n1["api_url"], mesh["key"]).chat.completions.with_raw_response.create(
        model="tiny", messages=HELLO, max_tokens=8, temperature=0)
    r = raw.parse()
    rid = raw.headers["x-request-id"]
    assert r.id == f"chatcmpl-{rid}" and r.object == "chat.completion" and r.model == "tiny"
    assert r.choices[0].message.role == "assistant" and r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage is not None and r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 0
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    assert raw.headers["x-meshd-served-by"] in {"n1", "n2", "n3"}
    assert raw.headers["x-meshd-route"]
    explained = json.loads(meshd("explain", rid, "--socket", n1["socket"], "--json").stdout)
    assert explained  # the same audit record as a `meshd submit`


def test_a_streamed_chat_with_usage(mesh: dict[str, Any]) -> None:
    c = client(node(mesh, "n2")["api_url"], mesh["key"])
    chunks = list(c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] in ("stop", "length")
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens > 0
    plain = c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=8, temperature=0)
    assert plain.choices[0].message.content == text  # greedy: the same answer either way


def test_legacy_completions_plain_and_streamed(mesh: dict[str, Any]) -> None:
    c = client(node(mesh, "n1")["api_url"], mesh["key"])
    r = c.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0)
    assert r.object == "text_completion" and r.choices[0].text
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0, stream=True))
    assert streamed == r.choices[0].text


def test_an_unknown_model_is_404(mesh: dict[str, Any]) -> None:
    with pytest.raises(openai.NotFoundError) as e:
        client(node(mesh, "n1")["api_url"], mesh["key"]).chat.completions.create(
            model="no-such-model", messages=HELLO)
    assert e.value.code == "model_not_found"


def test_a_prompt_too_long_for_the_context_is_400(mesh: dict[str, Any]) -> None:
    long = " ".join(["Once upon a time"] * 400)
    with pytest.raises(openai.BadRequestError) as e:
        client(node(mesh, "n1")["api_url"], mesh["key"]).chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": long}], max_tokens=8)
    assert e.value.code == "context_length_exceeded"


def test_max_tokens_over_the_context_is_400_quoting_what_was_sent(mesh: dict[str, Any]) -> None:
    """The same message as on the control socket: the value sent and the clamp it got."""
    with pytest.raises(openai.BadRequestError) as e:
        client(node(mesh, "n1")["api_url"], mesh["key"]).chat.completions.create(
            model="tiny", messages=HELLO, max_tokens=10**9)
    assert e.value.code == "context_length_exceeded"
    assert "max_tokens is 1000000000 (clamped to 4096, the most one request may ask for)" \
        in e.value.message


def test_an_unsupported_field_is_400_naming_it(mesh: dict[str, Any]) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        client(node(mesh, "n1")["api_url"], mesh["key"]).chat.completions.create(
            model="tiny", messages=HELLO, n=9)  # meshd decodes at most 8 choices together
    assert e.value.param == "n"


def test_a_bad_key_is_401(mesh: dict[str, Any]) -> None:
    with pytest.raises(openai.AuthenticationError):
        client(node(mesh, "n1")["api_url"], "meshd-not-a-key").models.list()


def test_a_request_served_by_a_peer_says_so(mesh: dict[str, Any]) -> None:
    # a completion: the text travels and n3 tokenizes it (chat messages are rendered by a node
    # that holds the model's template, so n1 would refuse them for a model only n3 serves)
    raw = client(node(mesh, "n1")["api_url"], mesh["key"]).completions.with_raw_response.create(
        model="tiny-solo", prompt="Once upon a time", max_tokens=4, temperature=0)  # text, not an end
    assert raw.headers["x-meshd-served-by"] == "n3"
    assert raw.headers["x-meshd-route"].split(",")[-1] == "n3"
    assert raw.parse().choices[0].text


def raw_stream(url: str, key: str, body: dict[str, Any],
               path: str = "/v1/chat/completions") -> socket.socket:
    """A streamed request on a raw socket; returns the socket, the request sent."""
    host, port = url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=30)
    data = json.dumps(body).encode()
    s.sendall(f"POST {path} HTTP/1.1\r\n".encode() + b"host: x\r\ncontent-type: application/json\r\n"
              + f"authorization: Bearer {key}\r\ncontent-length: {len(data)}\r\n\r\n".encode() + data)
    return s


def test_sse_framing_on_the_wire(mesh: dict[str, Any]) -> None:
    s = raw_stream(node(mesh, "n1")["api_url"], mesh["key"],
                   {"model": "tiny", "messages": HELLO, "max_tokens": 5, "stream": True})
    raw = b""
    with s:
        while not raw.endswith(b"0\r\n\r\n"):  # the chunked body's last chunk
            got = s.recv(65536)
            assert got, raw
            raw += got
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"content-type: text/event-stream" in head.lower()
    assert b"transfer-encoding: chunked" in head.lower()
    payload = b""
    while True:  # de-chunk
        size, _, rest = body.partition(b"\r\n")
        n = int(size, 16)
        if n == 0:
            break
        payload, body = payload + rest[:n], rest[n + 2:]
    events = payload.decode().split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    for ev in events[:-2]:
        assert ev.startswith("data: {") and "\n" not in ev
        assert json.loads(ev[6:])["object"] == "chat.completion.chunk"


def test_a_client_over_its_quota_gets_429(mesh: dict[str, Any]) -> None:
    n1 = node(mesh, "n1")
    c = client(n1["api_url"], mesh["alice"])
    # greedy: this model's sampled answer may end at once (its end token is 1 in 320), greedy's
    # runs to the context's end
    stream = c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=200, stream=True,
                                       temperature=0)
    try:
        next(iter(stream))  # alice's first request is in flight
        with pytest.raises(openai.RateLimitError) as e:
            c.chat.completions.create(model="tiny", messages=HELLO, max_tokens=2)
        assert e.value.response.headers["retry-after"]
        assert e.value.code == "rate_limit_exceeded"
        other = client(n1["api_url"], mesh["key"]).chat.completions.create(
            model="tiny", messages=HELLO, max_tokens=2)  # another client is not held back
        assert other.choices
    finally:
        stream.close()


def test_a_client_that_goes_away_cancels_the_request_on_the_serving_node(mesh: dict[str, Any]) -> None:
    n1, n3 = node(mesh, "n1"), node(mesh, "n3")
    solo = lambda: next(m for m in status(n3)["models"] if m["model"] == "tiny-solo")  # noqa: E731
    wait_for(lambda: solo()["in_flight"] == 0, 30, "n3 to be idle")
    # 200 tokens (the context is 256) at 8 tokens/s: 25 s if nobody stopped it; greedy, because
    # a sampled answer of this model ends at its first token about one time in fifty
    s = raw_stream(n1["api_url"], mesh["key"], {"model": "tiny-solo", "prompt": "Once upon a time",
                                                 "max_tokens": 200, "stream": True, "cache": False,
                                                 "temperature": 0},
                   path="/v1/completions")
    got = s.recv(65536)
    assert got.startswith(b"HTTP/1.1 200"), got
    while got.count(b'"text":"') < 2:  # two chunks with text
        assert b'"finish_reason":"' not in got, got  # the answer ended before the client left
        got += s.recv(65536)
    assert solo()["in_flight"] == 1
    t0 = time.monotonic()
    s.close()
    wait_for(lambda: solo()["in_flight"] == 0, 10, "n3 to stop generating and free the slot",
             poll_s=0.05)
    assert time.monotonic() - t0 < 10


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    import urllib.request

    text = urllib.request.urlopen(url.removesuffix("/v1") + "/metrics", timeout=10).read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_move_as_requests_are_served(mesh: dict[str, Any]) -> None:
    n2 = node(mesh, "n2")
    ok = ("meshd_requests_total", (("origin", "http"), ("outcome", "ok"), ("strategy", "meshd")))
    tokens = ("meshd_generated_tokens_total", (("origin", "http"),))
    before = scrape(n2["api_url"])
    client(n2["api_url"], mesh["key"]).chat.completions.create(model="tiny", messages=HELLO,
                                                               max_tokens=3, temperature=0)
    after = scrape(n2["api_url"])
    assert after[ok] == before.get(ok, 0) + 1
    assert after[tokens] > before.get(tokens, 0)
    assert after[("meshd_peers", (("state", "live"),))] == 2
    assert ("meshd_time_to_first_token_seconds_count", (("origin", "http"),)) in after


def test_health_readiness_and_status(mesh: dict[str, Any]) -> None:
    import urllib.request

    n1 = node(mesh, "n1")
    root = n1["api_url"].removesuffix("/v1")
    assert json.loads(urllib.request.urlopen(root + "/healthz", timeout=10).read()) == {"status": "ok"}
    assert json.loads(urllib.request.urlopen(root + "/readyz", timeout=10).read())["ready"] is True
    assert status(n1)["api_url"] == n1["api_url"]


def test_auth_none_is_refused_off_loopback(tmp_path: Path) -> None:
    cfg = tmp_path / "meshd.toml"
    cfg.write_text('[api]\nlisten = "0.0.0.0:0"\nauth = "none"\n')
    r = subprocess.run([sys.executable, "-m", "meshd", "run", "--config", str(cfg)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 78  # the config exit code
    assert 'auth = "none" is allowed only on a loopback listener' in r.stderr
    assert "Traceback" not in r.stderr
