"""Layer-wise pipelines (docs/pipeline.md): the stage server in-process, then real daemons.

The daemons (separate processes, real libp2p, onnxruntime and SQLite) serve the SHIPPED model
tiny-en (6 layers) under two names, so two chains live in one testnet:

- ``tiny3``: s1 [0, 2), s2 [2, 4), s2b [2, 4) (a spare middle stage), s3 [4, 6);
- ``tiny2``: s1 [0, 4) and s3 [2, 6) (two daemons, overlapping ranges).

No node serves either name whole, and ``entry`` serves nothing at all. Greedy output must be
token for token the engine's own single-process output. One testnet is started for the module;
the test that SIGKILLs a middle stage runs last. Every wait is on a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest
import trio

from meshd.control.client import call, connect, raise_if_error
from meshd.core.messages import MessageType
from meshd.engine import GenerationConfig, default_model_path, load_model
from meshd.node.activations import TensorError, decode_tensor, encode_hidden, encode_ids
from meshd.testing.wait import wait_for
from meshd.testnet.drive import cli as meshd

MODEL = str(default_model_path())
PROMPTS = ["And it came to pass", "In the beginning God created", "Blessed are the",
           "And Moses spake unto the children of Israel, saying"]
TOKENS = 32
STAGE_NODES = ("s1", "s2", "s2b", "s3")


# ---------------------------------------------------------------------------- activations


def test_f16_roundtrip_and_q8_is_close() -> None:
    h = np.random.default_rng(0).standard_normal((3, 192)).astype(np.float32) * 4
    for dtype, tol in (("f16", 5e-3), ("q8", 6e-2), ("f32", 0.0)):
        dt, shape, data = encode_hidden(h, dtype)
        assert shape == [3, 192]
        assert len(data) == {"f16": 3 * 192 * 2, "q8": 3 * 4 + 3 * 192, "f32": 3 * 192 * 4}[dtype]
        back = decode_tensor(dt, shape, data, tokens=3, hidden=192, vocab=4096)
        assert back.dtype == np.float32
        assert np.max(np.abs(back - h)) <= tol * np.max(np.abs(h))
    dt, shape, data = encode_ids([1, 2, 4095])
    assert decode_tensor(dt, shape, data, tokens=3, hidden=None, vocab=4096).tolist() == [1, 2, 4095]


@pytest.mark.parametrize(
    "dtype,shape,data,tokens,hidden,match",
    [
        ("f16", [1, 192], b"\x00" * 10, 1, 192, "needs 384 bytes"),
        ("f16", [1, 191], b"\x00" * 382, 1, 192, "shape"),
        ("f16", [2, 192], b"\x00" * 768, 1, 192, "shape"),
        ("bf16", [1, 192], b"\x00" * 384, 1, 192, "unknown activation dtype"),
        ("f16", [1, 192], np.full((1, 192), np.nan, np.float16).tobytes(), 1, 192, "NaN"),
        ("f32", [1, 192], np.full((1, 192), np.inf, np.float32).tobytes(), 1, 192, "NaN"),
        ("q8", [1, 192], np.float32(np.nan).tobytes() + b"\x01" * 192, 1, 192, "scales"),
        ("i64", [1], np.int64(99999).tobytes(), 1, None, "vocabulary"),
        ("f16", [1], b"\x00" * 8, 1, None, "token ids"),
        ("i64", "x", b"", 1, None, "list of integers"),
        ("i64", [1], "not bytes", 1, None, "binary data"),
        ("i64", [0], b"", 0, None, "positions"),
    ],
)
def test_decode_tensor_rejects_bad_input(dtype: Any, shape: Any, data: Any, tokens: int,
                                         hidden: int | None, match: str) -> None:
    with pytest.raises(TensorError, match=match) as e:
        decode_tensor(dtype, shape, data, tokens=tokens, hidden=hidden, vocab=4096)
    assert e.value.code == "bad_tensor"


# ---------------------------------------------------------------------------- stage server in-process


class _Port:
    """Records what the stage server sends to the entry node."""

    def __init__(self, peer_id: str) -> None:
        self.peer_id = peer_id
        self.frames: list[dict[str, Any]] = []

    @property
    def alive(self) -> bool:
        return True

    async def send(self, mtype: MessageType, fields: dict[str, Any]) -> None:
        self.frames.append({"t": int(mtype), **fields})

    def of(self, t: MessageType) -> list[dict[str, Any]]:
        return [f for f in self.frames if f["t"] == t]


class _NoHost:
    def get_peerstore(self) -> Any:
        raise RuntimeError("no network in this test")

    async def new_stream(self, *a: Any) -> Any:
        raise RuntimeError("no network in this test")


class _Table:
    def get(self, peer_id: str) -> None:
        return None


class _FakeNet:
    peer_id = "local"
    host = _NoHost()
    links = None


async def _until(cond: Callable[[], Any], timeout: float = 5.0) -> None:
    with trio.fail_after(timeout):
        while not cond():
            await trio.sleep(0.01)


def _stage_server(layers: tuple[int, int], *, max_sessions: int = 2) -> Any:
    from meshd.node.daemon import EngineModel
    from meshd.node.runner import Runner, Served
    from meshd.node.stagelinks import StageLinks
    from meshd.node.stages import StageServer

    runner = Runner()
    runner.add(Served(name="tiny", model=EngineModel(load_model(MODEL, layers=layers)),
                      layer_start=layers[0], layer_end=layers[1], num_layers=6,
                      max_concurrency=max_sessions, max_queue=0))
    server = StageServer(runner, "unit")
    links = StageLinks(_FakeNet(), server, _Table())
    server.links = links
    return server, links


def _open(sid: str, start: int, end: int, **extra: Any) -> dict[str, Any]:
    nxt = [] if end == 6 else ["next-peer", sid + "-next"]
    return {"t": int(MessageType.STAGE_OPEN), "rid": sid, "model": "tiny", "layer_start": start,
            "layer_end": end, "deadline_ms": 60_000, "next": nxt, **extra}


def _step(sid: str, pos: list[int], dtype: str, shape: list[int], data: bytes) -> dict[str, Any]:
    return {"t": int(MessageType.STAGE_STEP), "rid": sid, "step": 0, "pos": pos, "dtype": dtype,
            "shape": shape, "data": data}


def _in_trio(layers: tuple[int, int], body: Callable[..., Any], **kw: Any) -> None:
    async def main() -> None:
        server, links = _stage_server(layers, **kw)
        async with trio.open_nursery() as nursery:
            await nursery.start(server.run)
            await nursery.start(links.run)
            await body(server, links)
            nursery.cancel_scope.cancel()

    trio.run(main)


def test_stage_rejects_bad_tensors_with_an_error_frame_and_frees_the_session() -> None:
    async def body(server: Any, links: Any) -> None:
        entry = _Port("entry")
        for i, (dtype, shape, data, why) in enumerate([
            ("f16", [1, 192], np.full((1, 192), np.nan, np.float16).tobytes(), "NaN"),
            ("f16", [1, 100], b"\x00" * 200, "shape"),
            ("f16", [1, 192], b"\x00" * 7, "bytes"),
            ("bf16", [1, 192], b"\x00" * 384, "dtype"),
            ("f16", [1, 192], b"\x00" * 384, "positions"),  # sent at position 5 of an empty session
        ]):
            sid = f"r{i}@2"
            links.dispatch(_open(sid, 2, 4), entry, "entry")
            await _until(lambda sid=sid: any(f["rid"] == sid for f in entry.of(MessageType.STAGE_READY)))
            pos = [5] if why == "positions" else [0]
            links.dispatch(_step(sid, pos, dtype, shape, data), entry, "entry")
            await _until(lambda sid=sid: any(f["rid"] == sid for f in entry.of(MessageType.ERROR)))
            err = [f for f in entry.of(MessageType.ERROR) if f["rid"] == sid][0]
            assert err["code"] == "bad_tensor" and why in err["message"], err
            await _until(lambda: not server.sessions)
        assert server.stats["bad_tensors"] == 5
        assert server.statistics()["kv_bytes"] == 0
        # a step for a session that does not exist is answered, not crashed on
        links.dispatch(_step("nope@2", [0], "f16", [1, 192], b"\x00" * 384), entry, "entry")
        await _until(lambda: any(f["rid"] == "nope@2" for f in entry.of(MessageType.ERROR)))
        assert [f["code"] for f in entry.of(MessageType.ERROR) if f["rid"] == "nope@2"] == ["no_session"]

    _in_trio((2, 4), body)


def test_stage_forwards_or_reports_an_unreachable_next_stage() -> None:
    async def body(server: Any, links: Any) -> None:
        entry = _Port("entry")
        links.dispatch(_open("a@2", 2, 4), entry, "entry")
        await _until(lambda: entry.of(MessageType.STAGE_READY))
        h = np.random.default_rng(1).standard_normal((3, 192)).astype(np.float32)
        links.dispatch(_step("a@2", [0, 1, 2], *encode_hidden(h)), entry, "entry")
        await _until(lambda: entry.of(MessageType.ERROR))
        err = entry.of(MessageType.ERROR)[0]
        assert err["code"] == "peer_gone" and err["peer"] == "next-peer", err
        await _until(lambda: not server.sessions)
        assert server.stats["steps"] == 1  # it computed, then could not forward

    _in_trio((2, 4), body)


def test_stage_sessions_wake_the_advert_loop_when_they_open_and_end() -> None:
    """Open stage sessions count in the advert's in-flight figure; opening and ending one must
    wake the advert loop (runner.changed) so that routers hear the load early."""
    async def body(server: Any, links: Any) -> None:
        entry = _Port("entry")
        opened = server.runner.changed
        links.dispatch(_open("a@4", 4, 6, prompt_ids=[1, 2], gen={}), entry, "entry")
        await _until(lambda: "a@4" in server.sessions)
        assert opened.is_set()
        ended = server.runner.changed
        assert not ended.is_set()
        links.dispatch({"t": int(MessageType.STAGE_FREE), "rid": "a@4"}, entry, "entry")
        await _until(lambda: not server.sessions)
        assert ended.is_set()

    _in_trio((4, 6), body)


def test_stage_capacity_busy_free_idle_and_entry_gone() -> None:
    async def body(server: Any, links: Any) -> None:
        entry = _Port("entry")
        links.dispatch(_open("x@4", 4, 6, prompt_ids=[1, 2, 3], gen={"temperature": 0.0}), entry, "entry")
        # y's idle timeout must outlast the open of z below, which must find both slots taken:
        # at 100 ms a loaded box freed y first and z was admitted
        links.dispatch(_open("y@4", 4, 6, prompt_ids=[1, 2, 3], gen={}, idle_ms=1000), entry, "entry")
        await _until(lambda: len(entry.of(MessageType.STAGE_READY)) == 2)
        links.dispatch(_open("z@4", 4, 6, prompt_ids=[1], gen={}), entry, "entry")
        await _until(lambda: entry.of(MessageType.ERROR))
        assert entry.of(MessageType.ERROR)[0]["code"] == "busy"
        assert server.stats["busy_refusals"] == 1
        # y has a 1 s idle timeout: it is freed and the entry node told
        await _until(lambda: "y@4" not in server.sessions)
        assert any(f["rid"] == "y@4" and f["code"] == "deadline" for f in entry.of(MessageType.ERROR))
        # the last stage samples: a step of hidden states gives a token
        h = np.zeros((3, 192), np.float32)
        links.dispatch(_step("x@4", [0, 1, 2], *encode_hidden(h)), entry, "entry")
        await _until(lambda: entry.of(MessageType.STAGE_OUT))
        out = entry.of(MessageType.STAGE_OUT)[0]
        assert out["rid"] == "x@4" and len(out["ids"]) == 1
        # STAGE_FREE from someone other than the entry node is ignored; from it, frees
        links.dispatch({"t": int(MessageType.STAGE_FREE), "rid": "x@4"}, entry, "intruder")
        await trio.sleep(0.05)
        assert "x@4" in server.sessions
        links.dispatch({"t": int(MessageType.STAGE_FREE), "rid": "x@4"}, entry, "entry")
        await _until(lambda: not server.sessions)
        # a STAGE_FREE that overtakes its STAGE_OPEN: the session is never opened
        links.dispatch(_open("v@4", 4, 6, prompt_ids=[5], gen={}), entry, "entry")
        links.dispatch({"t": int(MessageType.STAGE_FREE), "rid": "v@4"}, entry, "entry")
        await trio.sleep(0.05)
        assert "v@4" not in server.sessions and server.stats["sessions_opened"] == 2
        # the stream a session was opened on ends: the session goes
        links.dispatch(_open("w@4", 4, 6, prompt_ids=[5], gen={}), entry, "entry")
        await _until(lambda: "w@4" in server.sessions and server.sessions["w@4"].kv is not None)
        server.on_port_closed(entry, "stream closed")
        await _until(lambda: not server.sessions)
        st = server.statistics()
        assert st["sessions_open"] == 0 and st["kv_bytes"] == 0
        assert st["freed"] == {"idle": 1, "freed": 1, "entry_gone": 1}

    _in_trio((4, 6), body, max_sessions=2)


# ---------------------------------------------------------------------------- real daemons


@pytest.fixture(scope="module")
def reference() -> Callable[[str, int], list[int]]:
    model = load_model(MODEL)
    cache: dict[tuple[str, int], list[int]] = {}

    def ref(prompt: str, n: int) -> list[int]:
        if (prompt, n) not in cache:
            cfg = GenerationConfig(max_tokens=n, temperature=0.0)
            cache[(prompt, n)] = [e.token_id for e in model.generate_sync(prompt, cfg)]
        return cache[(prompt, n)]

    return ref


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from meshd.testnet.launcher import NodeSpec, down, up

    def rng(name: str, a: int, b: int, **kw: Any) -> dict[str, Any]:
        return {"path": MODEL, "name": name, "layers": [a, b], **kw}

    small = {"max_concurrency": 2, "max_queue": 2}  # room for 4 stage sessions
    specs = [
        NodeSpec(name="entry", models=[]),
        NodeSpec(name="s1", models=[rng("tiny3", 0, 2), rng("tiny2", 0, 4)]),
        NodeSpec(name="s2", models=[rng("tiny3", 2, 4, **small)]),
        NodeSpec(name="s2b", models=[rng("tiny3", 2, 4, **small)]),
        NodeSpec(name="s3", models=[rng("tiny3", 4, 6), rng("tiny2", 2, 6)]),
    ]
    d = tmp_path_factory.mktemp("pipeline")
    index = up(d, specs, advert_interval_s=1.0)
    try:
        yield index
    finally:
        down(d)


def sock(mesh: dict[str, Any], name: str) -> str:
    return next(n["socket"] for n in mesh["nodes"] if n["name"] == name)


def submit(mesh: dict[str, Any], at: str, model: str, prompt: str, n: int = TOKENS) -> dict[str, Any]:
    out = meshd("submit", "--json", "-n", str(n), "--model", model, "--socket", sock(mesh, at), prompt)
    return dict(json.loads(out.stdout))


def stage_stats(mesh: dict[str, Any], name: str) -> dict[str, Any]:
    reply = trio.run(call, sock(mesh, name), MessageType.STATUS_REQ, {})
    return dict(reply["data"]["services"]["stage_server"])


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS)
def test_three_stages_give_single_node_output(mesh: dict[str, Any], reference: Any,
                                              prompt: str) -> None:
    out = submit(mesh, "entry", "tiny3", prompt)
    assert out["token_ids"] == reference(prompt, TOKENS)
    assert len(out["pipeline"]) == 3, out["pipeline"]
    assert {"s1", "s3"} <= set(out["route"]) and {"s2", "s2b"} & set(out["route"]), out["route"]
    assert out["route"][0] == "entry" and out["served_by"] == "s3"


@pytest.mark.slow
@pytest.mark.parametrize("at", ["s1", "s2"])
def test_entry_inside_the_chain(mesh: dict[str, Any], reference: Any, at: str) -> None:
    out = submit(mesh, at, "tiny3", PROMPTS[0])
    assert out["token_ids"] == reference(PROMPTS[0], TOKENS)
    assert {"s1", "s3"} <= set(out["route"]) and out["route"][0] == at


@pytest.mark.slow
@pytest.mark.parametrize("prompt", PROMPTS[:3])
def test_two_overlapping_stages_give_single_node_output(mesh: dict[str, Any], reference: Any,
                                                        prompt: str) -> None:
    out = submit(mesh, "entry", "tiny2", prompt)
    assert out["token_ids"] == reference(prompt, TOKENS)
    assert len(out["pipeline"]) == 2 and set(out["route"]) == {"entry", "s1", "s3"}, out


@pytest.mark.slow
def test_explain_shows_the_chain_and_why(mesh: dict[str, Any]) -> None:
    out = submit(mesh, "entry", "tiny3", PROMPTS[1], n=4)
    text = meshd("explain", out["request_id"], "--socket", sock(mesh, "entry")).stdout
    assert "Split into 3 stages: s1 runs layers 0-1" in text, text
    assert "s3 runs layers 4-5" in text and "Why: the planner chose the pipeline of 3 stages" in text
    rec = json.loads(meshd("explain", "--json", out["request_id"], "--socket", sock(mesh, "entry")).stdout)
    assert [h["name"] for h in rec["plan"]["hops"]][0] == "s1"


@pytest.mark.slow
def test_unservable_model_fails_cleanly(mesh: dict[str, Any]) -> None:
    proc = meshd("submit", "--model", "nothing", "--socket", sock(mesh, "entry"), "hi", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr and "nothing" in proc.stderr


@pytest.mark.slow
def test_an_entry_without_the_model_sends_the_last_stage_packed_ids(mesh: dict[str, Any],
                                                                     reference: Any) -> None:
    """Edge tokenization (docs/edge-tokenization.md): the entry node serves nothing, fetches
    the model's tokenizer from a stage, and the last stage gets the prompt as packed ids."""
    def held() -> Any:
        reply = trio.run(call, sock(mesh, "entry"), MessageType.STATUS_REQ, {})
        return reply["data"]["services"]["tokenizers"]["held"]

    wait_for(held, 30, "the entry node to hold the tokenizer its peers advertise")
    before = stage_stats(mesh, "s3")
    out = submit(mesh, "entry", "tiny3", PROMPTS[2])
    after = stage_stats(mesh, "s3")
    assert out["token_ids"] == reference(PROMPTS[2], TOKENS)
    assert after["prompts_packed"] - before["prompts_packed"] == 1
    assert after["prompts_text"] == before["prompts_text"]


async def _stream(socket: str, fields: dict[str, Any],
                  on_token: Callable[[int, dict[str, Any]], Any] | None = None) -> dict[str, Any]:
    route: dict[str, Any] = {}
    n = 0
    async with connect(socket) as framed:
        await framed.send(MessageType.SUBMIT, fields)
        while True:
            with trio.fail_after(60):
                msg = await framed.recv()
            assert msg is not None, "the daemon closed the connection"
            raise_if_error(msg)
            if msg["t"] == MessageType.ROUTE:
                route = msg
            elif msg["t"] == MessageType.TOKENS:
                n += len(msg["ids"])
                if on_token is not None:
                    on_token(n, route)
            elif msg["t"] == MessageType.DONE:
                return {**msg["stats"], "last_route": route}


def _fields(prompt: str, n: int, model: str = "tiny3") -> dict[str, Any]:
    return {"rid": os.urandom(8).hex(), "prompt": prompt, "model": model, "max_tokens": n,
            "temperature": 0.0}


@pytest.mark.slow
def test_eight_concurrent_requests_complete_and_stages_return_to_baseline(
        mesh: dict[str, Any], reference: Any) -> None:
    before = {n: stage_stats(mesh, n)["sessions_opened"] for n in STAGE_NODES}
    busy_before = sum(stage_stats(mesh, n)["busy_refusals"] for n in ("s2", "s2b"))
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(8)]
    results: list[dict[str, Any]] = []

    async def main() -> None:
        async def one(p: str) -> None:
            results.append({"prompt": p, **await _stream(sock(mesh, "entry"), _fields(p, 24))})

        async with trio.open_nursery() as nursery:
            for p in prompts:
                nursery.start_soon(one, p)

    trio.run(main)
    assert len(results) == 8
    for r in results:
        assert r["token_ids"] == reference(r["prompt"], 24)
    opened = {n: stage_stats(mesh, n)["sessions_opened"] - before[n] for n in STAGE_NODES}
    assert opened["s2"] + opened["s2b"] == 8 and max(opened["s2"], opened["s2b"]) <= 8, opened
    # the 8 were planned on one snapshot, so onto one middle stage, which holds 4 at most: the
    # rest were answered busy and replanned onto the other (their first sessions on s1 and s3
    # were opened too, then freed)
    busy = sum(stage_stats(mesh, n)["busy_refusals"] for n in ("s2", "s2b")) - busy_before
    assert busy >= 1 and sum(r["replans"] for r in results) == busy, (busy, results)
    assert opened["s1"] == 8 + busy and opened["s3"] == 8 + busy, opened

    def baseline() -> bool:
        return all(s["sessions_open"] == 0 and s["kv_bytes"] == 0
                   for s in (stage_stats(mesh, n) for n in STAGE_NODES))

    wait_for(baseline, 10, lambda: f"stage sessions to close: {[stage_stats(mesh, n) for n in STAGE_NODES]}")


@pytest.mark.slow
def test_killed_middle_stage_fails_over_with_identical_output(mesh: dict[str, Any],
                                                               reference: Any) -> None:
    """Runs last: it leaves one middle stage dead."""
    from meshd.testnet.children import alive, reap

    seed = int(os.environ.get("MESHD_TEST_SEED", str(int(time.time()) % 10_000)))
    kill_at = random.Random(seed).randint(2, 20)
    prompt, n = PROMPTS[3], 48
    pids = {x["name"]: x["pid"] for x in mesh["nodes"]}
    killed: list[tuple[str, float]] = []

    def on_token(count: int, route: dict[str, Any]) -> None:
        if count >= kill_at and not killed:
            victim = next(r for r in route["route"] if r in ("s2", "s2b"))
            os.kill(pids[victim], signal.SIGKILL)
            killed.append((victim, time.monotonic()))

    out = trio.run(_stream, sock(mesh, "entry"), _fields(prompt, n), on_token)
    assert killed, f"never reached token {kill_at} (seed {seed})"
    victim = killed[0][0]
    wait_for(lambda: not alive(pids[victim]), 10, f"{victim} to die of SIGKILL", poll_s=0.05)
    reap(pids[victim])
    assert out["token_ids"] == reference(prompt, n), f"seed {seed}, killed {victim} at {kill_at}"
    assert out["replans"] >= 1, out
    spare = "s2b" if victim == "s2" else "s2"
    assert victim in out["route"] and spare in out["route"], out["route"]
    assert any(f"{spare}[2,4)" == h for h in out["pipeline"]), out["pipeline"]
    rec = json.loads(meshd("explain", "--json", out["request_id"], "--socket", sock(mesh, "entry")).stdout)
    replans = [e for e in rec["events"] if e["kind"] == "replan"]
    assert replans and victim in replans[0]["payload"]["lost"], rec["events"]
    assert replans[0]["payload"]["layers"] == [[2, 4]]
    text = meshd("explain", out["request_id"], "--socket", sock(mesh, "entry")).stdout
    assert "Replanned the route" in text and victim in text


# ---------------------------------------------------------------------------- layers = "auto"


def test_heard_coverage_counts_replicas_per_layer() -> None:
    from meshd.core.advert import Advert, ModelAdvert
    from meshd.node.autoplace import heard_coverage

    def adv(name: str, *ranges: tuple[str, int, int, int]) -> Advert:
        return Advert(peer_id=name, name=name, seq=1, ts=0.0,
                      models=tuple(ModelAdvert(m, n, a, b) for m, n, a, b in ranges))

    ads = [adv("a", ("m", 6, 0, 2)), adv("b", ("m", 6, 1, 4), ("other", 6, 0, 6)),
           adv("c", ("m", 8, 0, 8))]  # another depth is another model
    assert heard_coverage(ads, "m", 6) == [1.0, 2.0, 1.0, 1.0, 0.0, 0.0]


@pytest.fixture(scope="module")
def auto_mesh(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from meshd.testnet.launcher import NodeSpec, down, up

    model = {"path": MODEL, "name": "tinyauto", "layers": "auto", "max_layers": 2}
    specs = [NodeSpec(name=f"auto{i}", models=[dict(model)]) for i in range(1, 4)]
    d = tmp_path_factory.mktemp("auto")
    index = up(d, specs, advert_interval_s=1.0)
    try:
        yield index
    finally:
        down(d)


@pytest.mark.slow
def test_auto_layers_spread_over_the_model_settle_and_serve(auto_mesh: dict[str, Any],
                                                            reference: Any) -> None:
    names = [n["name"] for n in auto_mesh["nodes"]]

    def placement() -> dict[str, dict[str, Any]]:
        out = {}
        for n in names:
            reply = trio.run(call, sock(auto_mesh, n), MessageType.STATUS_REQ, {})
            out[n] = reply["data"]["services"]["placement"]
        return out

    def ranges(p: dict[str, dict[str, Any]]) -> list[tuple[int, int]]:
        return sorted(tuple(p[n]["auto_models"]["tinyauto"]["layers"]) for n in names)

    first = placement()
    assert all(p["auto_models"]["tinyauto"]["capacity_layers"] == 2 for p in first.values())
    def covered() -> dict[str, Any] | None:
        q = placement()
        return q if ranges(q) == [(0, 2), (2, 4), (4, 6)] else None

    p = wait_for(covered, 60, lambda: f"auto placement to cover the model: {placement()}",
                 poll_s=0.3)
    moves = {n: p[n]["moves"] for n in names}
    # at most three moves a node: on a loaded box adverts arrive late and a node can move on a
    # picture that is already out of date (7 and 8 moves were seen); flapping is checked below
    assert 1 <= sum(moves.values()) <= 3 * len(names), moves
    # adverts carry the new ranges: a pipeline over the three runs and matches one node
    def served() -> dict[str, Any] | None:
        proc = meshd("submit", "--json", "-n", "16", "--model", "tinyauto", "--socket",
                     sock(auto_mesh, "auto1"), PROMPTS[0], check=False)
        return json.loads(proc.stdout) if proc.returncode == 0 else None

    out = wait_for(served, 20, "a pipeline over the auto-placed ranges", poll_s=0.5)
    assert out["token_ids"] == reference(PROMPTS[0], 16)
    assert len(out["pipeline"]) == 3, out
    # settled: each node decides twice more on the same picture and none moves (no flapping)
    seen = {n: p[n]["decisions"] for n in names}
    def decided_twice_more() -> dict[str, Any] | None:
        q = placement()
        return q if all(q[n]["decisions"] >= seen[n] + 2 for n in names) else None

    later = wait_for(decided_twice_more, 20,
                     lambda: f"two more placement decisions each: {placement()}", poll_s=0.3)
    assert {n: later[n]["moves"] for n in names} == moves
    assert ranges(later) == [(0, 2), (2, 4), (4, 6)]
