"""Malformed bytes against a RUNNING daemon (a separate process), property tests with Hypothesis.

Targets: every meshd libp2p protocol (``/meshd/req/1.0.0``, and ``/meshd/stage/1.0.0`` once the
daemon registers it), the gossipsub stream (``/meshsub/1.1.0`` and ``1.0.0``: raw garbage, bad
varint lengths, valid protobuf carrying nonsense RPCs, and correctly signed pubsub messages on
the meshd topics whose payloads are garbage), multistream-select negotiation itself, and the
control unix socket (versioned msgpack).

The attacker of the libp2p protocols is an ATTESTED peer: it holds a certificate issued by the
testnet's own CA (``meshd keys issue``), since an unattested peer never gets a stream at all.
It is one libp2p host living in a background thread with its own trio loop, connected once to
the target daemon; every Hypothesis example sends its batch of payloads over fresh streams on
that connection through a trio portal, so an example costs a few milliseconds, not a host.

The property, for every payload: the daemon answers with well-formed frames (an ERROR frame
when the bytes are malformed) or closes that stream within a deadline. After every batch: the
daemon process is alive, a normal ``submit`` through the control socket returns text, and its
peer table still holds exactly the other daemon (the attacker never gets in).
"""

from __future__ import annotations

import contextlib
import os
import struct
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from libp2p.network.stream.exceptions import StreamEOF, StreamError, StreamReset
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.pubsub.gossipsub import PROTOCOL_ID, PROTOCOL_ID_V11
from libp2p.pubsub.pb import rpc_pb2
from libp2p.pubsub.rpc_queue import DefaultMaxMessageSize
from libp2p.pubsub.validators import PUBSUB_SIGNING_PREFIX
from libp2p.utils.varint import encode_uvarint
from multiaddr import Multiaddr

from meshd.core.advert import signing_payload
from meshd.core.messages import (
    ADVERT_TOPIC,
    CONTROL_REPLY_TYPES,
    CONTROL_TYPES,
    CONTROL_VERSION,
    REGISTRY,
    REQUEST_PROTOCOL,
    REQUEST_TYPES,
    REVOCATION_TOPIC,
    STAGE_PROTOCOL,
    STAGE_TYPES,
    F,
    MessageType,
)
from meshd.core.wire import (
    HEADER,
    MAX_CONTROL_FRAME,
    MAX_REQUEST_FRAME,
    MAX_STAGE_FRAME,
    FrameDecoder,
    Message,
    pack,
)
from meshd.errors import MeshdError, ProtocolError
from meshd.net.attest import Attestor, disconnect_all, make_host
from meshd.net.identity import NodeIdentity, load_identity
from meshd.testing.wait import wait_for
from meshd.testnet.children import alive
from meshd.testnet.launcher import NodeSpec, down, up

pytestmark = pytest.mark.slow

STREAM_DEADLINE_S = 10.0  # the daemon must answer or close a stream within this
GOSSIP_SETTLE_S = 0.3  # how long a (long-lived) gossip stream is watched after our half-close
HEALTH_DEADLINE_S = 20.0
MODEL = "tiny"  # the name the conftest's tiny model is imported under
FUZZ = settings(
    max_examples=int(os.environ.get("MESHD_FUZZ_EXAMPLES", "40")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ============================================================================ the testnet


@dataclass
class Target:
    """The daemon under attack (n1) and its witness (n2)."""

    dir: Path
    pid: int
    sock: str
    addr: str
    name: str
    witness_sock: str
    witness_name: str
    log: Path


def _issue_attacker(ca_dir: Path, out: Path) -> NodeIdentity:
    import contextlib as cl
    import io

    from meshd.cli.main import main

    with cl.redirect_stdout(io.StringIO()):
        rc = main(["keys", "issue", "fuzzer", "--dir", str(ca_dir), "--out", str(out),
                   "--days", "1", "--label", "region=local"])
    assert rc == 0, "meshd keys issue failed for the attacker"
    return load_identity(out, now=time.time())


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[Target]:
    d = tmp_path_factory.mktemp("fuzz-mesh")
    index = up(d, [NodeSpec(name="n1"), NodeSpec(name="n2")], advert_interval_s=1.0)
    try:
        n1, n2 = index["nodes"]
        yield Target(dir=d, pid=n1["pid"], sock=n1["socket"], addr=n1["addr"], name="n1",
                     witness_sock=n2["socket"], witness_name="n2",
                     log=Path(n1["dir"]) / "meshd.log")
    finally:
        down(d)


# ============================================================================ the attacker


class Attacker:
    """An attested libp2p host in a background thread, connected to the target daemon.

    ``call(fn, *args)`` runs ``await fn(*args)`` in the attacker's trio loop and returns its
    result to the (synchronous) Hypothesis test body.
    """

    def __init__(self, identity: NodeIdentity, target_addr: str) -> None:
        self.identity = identity
        self.info = info_from_p2p_addr(Multiaddr(target_addr))
        self.peer = self.info.peer_id
        self.host: Any = None
        self.token: trio.lowlevel.TrioToken | None = None
        self._ready = threading.Event()
        self._stop: trio.Event | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._thread_main, name="attacker", daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30):
            raise AssertionError("the attacker host did not start within 30 s")
        if self._error is not None:
            raise AssertionError(f"the attacker host failed: {self._error!r}")

    def _thread_main(self) -> None:
        try:
            trio.run(self._main)
        except BaseException as e:  # reported to the test thread
            self._error = e
            self._ready.set()

    async def _main(self) -> None:
        self._stop = trio.Event()
        attestor = Attestor(self.identity.ca_public_key)
        self.host = make_host(self.identity, attestor, dial_retries=0)
        async with self.host.run([Multiaddr("/ip4/127.0.0.1/tcp/0")]):
            # The daemon's pubsub opens its own gossip stream to us: read and drop it.
            for proto in (PROTOCOL_ID_V11, PROTOCOL_ID):
                self.host.set_stream_handler(proto, _drain)
            with trio.fail_after(10):
                await self.host.connect(self.info)
            self.token = trio.lowlevel.current_trio_token()
            self._ready.set()
            await self._stop.wait()
            await disconnect_all(self.host)

    def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        assert self.token is not None
        return trio.from_thread.run(fn, *args, trio_token=self.token)

    def attack(self, t: Target, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        """``call``, but a failure to reach the daemon at all is reported as what it means."""
        try:
            return self.call(fn, *args)
        except Exception as e:
            if not alive(t.pid):
                raise AssertionError(f"the daemon died; its log ends:\n{_tail(t.log)}") from None
            raise AssertionError(f"cannot reach the daemon ({type(e).__name__}: {e}); "
                                 f"its log ends:\n{_tail(t.log)}") from None

    def stop(self) -> None:
        if self.token is not None and self._stop is not None:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(self._stop.set, trio_token=self.token)
        self._thread.join(15)

    # ---------------------------------------------------------------- probes

    async def supports(self, proto: str) -> bool:
        try:
            with trio.fail_after(STREAM_DEADLINE_S):
                stream = await self.host.new_stream(self.peer, [proto])
        except trio.TooSlowError:
            raise
        except Exception:
            return False
        await _quiet_reset(stream)
        return True

    async def probe(self, proto: str | None, payload: bytes, mode: str, wait_s: float) -> Outcome:
        """Send ``payload`` on a fresh stream; ``mode``: "half_close" (then read what comes back
        until the daemon ends the stream) or "reset" (abort right after writing)."""
        with trio.fail_after(STREAM_DEADLINE_S):
            if proto is None:  # a raw muxed stream: garbage inside multistream-select itself
                stream = await self.host.get_network().new_stream(self.peer)
            else:
                stream = await self.host.new_stream(self.peer, [proto])
        out = Outcome()
        t0 = trio.current_time()
        try:
            try:
                with trio.fail_after(STREAM_DEADLINE_S):
                    if payload:
                        await stream.write(payload)
                    if mode == "reset":
                        await stream.reset()
                        out.end = "we_reset"
                        return out
                    await stream.close_write()
            except StreamError:
                pass  # the daemon already gave up on the stream; reading tells how
            with trio.move_on_after(wait_s):
                while True:
                    try:
                        chunk = await stream.read(1 << 16)
                    except StreamEOF:
                        out.end = "eof"
                        break
                    except StreamReset:
                        out.end = "reset"
                        break
                    except StreamError as e:
                        out.end = f"error:{type(e).__name__}"
                        break
                    if not chunk:
                        out.end = "eof"
                        break
                    out.data += chunk
            return out
        finally:
            out.elapsed_s = trio.current_time() - t0
            if os.environ.get("MESHD_FUZZ_TRACE"):
                print(f"probe proto={proto} mode={mode} bytes={len(payload)} end={out.end} "
                      f"elapsed={out.elapsed_s:.3f} head={payload[:24]!r}")
            await _quiet_reset(stream)

    async def probe_batch(
        self, proto: str | None, batch: list[tuple[bytes, str]], wait_s: float
    ) -> list[Outcome]:
        return [await self.probe(proto, payload, mode, wait_s) for payload, mode in batch]

    def sign(self, topic: str, data: bytes, seqno: bytes) -> rpc_pb2.Message:
        """A pubsub message exactly as a py-libp2p publisher signs it (strict signing)."""
        msg = rpc_pb2.Message(
            data=data, topicIDs=[topic], from_id=self.identity.peer_id.to_bytes(), seqno=seqno
        )
        sig = self.identity.key_pair.private_key.sign(
            PUBSUB_SIGNING_PREFIX.encode() + msg.SerializeToString()
        )
        msg.key = self.identity.key_pair.public_key.serialize()
        msg.signature = sig
        return msg


@dataclass
class Outcome:
    end: str | None = None  # "eof", "reset", "we_reset", "error:..."; None: still open at the deadline
    data: bytes = b""
    elapsed_s: float = 0.0


async def _drain(stream: Any) -> None:
    with contextlib.suppress(Exception):
        while await stream.read(1 << 16):
            pass


async def _quiet_reset(stream: Any) -> None:
    with trio.move_on_after(1), contextlib.suppress(Exception):
        await stream.reset()


@pytest.fixture(scope="module")
def attacker(target: Target, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Attacker]:
    identity = _issue_attacker(target.dir / "ca", tmp_path_factory.mktemp("attacker"))
    a = Attacker(identity, target.addr)
    a.start()
    try:
        yield a
    finally:
        a.stop()


# ============================================================================ health checks


def _control(sock: str, mtype: MessageType, fields: dict[str, Any]) -> Message:
    from meshd.control.client import call

    async def go() -> Message:
        with trio.fail_after(HEALTH_DEADLINE_S):
            return await call(sock, mtype, fields)

    return trio.run(go)


def _submit(sock: str, prompt: str) -> dict[str, Any]:
    """A normal submit through the control socket, as `meshd submit` does it."""
    from meshd.control.client import connect, raise_if_error

    async def go() -> dict[str, Any]:
        text: list[str] = []
        with trio.fail_after(HEALTH_DEADLINE_S):
            async with connect(sock) as framed:
                await framed.send(MessageType.SUBMIT, {"rid": os.urandom(8).hex(), "prompt": prompt,
                                                       "max_tokens": 8, "temperature": 0.0})
                while True:
                    msg = await framed.recv()
                    assert msg is not None, "the daemon closed a normal submit without an answer"
                    raise_if_error(msg)
                    if msg["t"] == MessageType.TOKENS:
                        text.append(msg.get("text", ""))
                    elif msg["t"] == MessageType.DONE:
                        return {"text": "".join(text), **(msg.get("stats") or {})}

    return trio.run(go)


def _tail(path: Path, n: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def assert_healthy(t: Target) -> None:
    assert alive(t.pid), f"the daemon died; its log ends:\n{_tail(t.log)}"
    try:
        out = _submit(t.sock, "Once upon a time")
    except (MeshdError, trio.TooSlowError) as e:
        raise AssertionError(f"a normal submit failed after the batch: {e}\n{_tail(t.log)}") from None
    assert out["text"].strip() and out["tokens"] == 8, out  # greedy: the same text every time
    seen: dict[str, set[str]] = {}

    def intact() -> bool:
        seen["names"] = {p["name"] for p in _control(t.sock, MessageType.PEERS_REQ, {})["peers"]}
        seen["back"] = {p["name"] for p in _control(t.witness_sock, MessageType.PEERS_REQ, {})["peers"]}
        # the attacker never advertised anything valid: it must never be in the table
        assert "fuzzer" not in seen["names"], seen["names"]
        return seen["names"] == {t.witness_name} and t.name in seen["back"]

    wait_for(intact, HEALTH_DEADLINE_S, lambda: f"intact peer tables: {t.name} sees "
             f"{seen.get('names')}, {t.witness_name} sees {seen.get('back')}")
    assert alive(t.pid), f"the daemon died; its log ends:\n{_tail(t.log)}"


def _status(sock: str) -> dict[str, Any]:
    return dict(_control(sock, MessageType.STATUS_REQ, {})["data"])


# ============================================================================ strategies: frames

flat = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=24)
    | st.binary(max_size=48)
)
def _containers(c: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.lists(c, max_size=6) | st.dictionaries(st.text(max_size=8), c, max_size=5)


msgpack_values = st.recursive(flat, _containers, max_leaves=12)  # named: see raw_pb_fields


def _field_value(kind: F) -> st.SearchStrategy[Any]:
    """A value of the right wire type, with nonsense content (negative, huge, empty, odd)."""
    ints = st.integers(min_value=-(2**63), max_value=2**63 - 1) | st.sampled_from([0, -1, 1, 2**31])
    return {
        F.INT: ints,
        F.NUM: ints | st.floats(allow_nan=True, allow_infinity=True),
        F.STR: st.text(max_size=24) | st.sampled_from(["", MODEL, "tiny-solo", "\x00", "n1"]),
        F.BIN: st.binary(max_size=96),
        F.BOOL: st.booleans(),
        F.LIST: st.lists(msgpack_values, max_size=4),
        F.MAP: st.dictionaries(st.text(max_size=8), msgpack_values, max_size=4),
        F.INTS: st.lists(ints, max_size=8),
        F.STRS: st.lists(st.text(max_size=8), max_size=4),
    }[kind]


@st.composite
def schema_valid(draw: st.DrawFn, types: frozenset[int]) -> dict[str, Any]:
    """A message that passes the schema check but means nothing (or something odd)."""
    t = draw(st.sampled_from(sorted(types)))
    spec = REGISTRY[t]
    msg: dict[str, Any] = {"t": t}
    for f in spec.fields:
        if not f.required and draw(st.booleans()):
            continue
        msg[f.name] = draw(_field_value(f.kind))
    if t in (MessageType.REQ, MessageType.SUBMIT):
        # a request for real work is bounded, so a batch never waits on a long generation
        msg["max_tokens"] = draw(st.integers(min_value=-3, max_value=6))
    if draw(st.booleans()):
        msg.update(draw(st.dictionaries(st.text(max_size=6), msgpack_values, max_size=3)))
        msg["t"] = t
    return msg


def framed(body: bytes) -> bytes:
    return HEADER.pack(len(body)) + body


def _pack_any(obj: Any) -> bytes:
    try:
        return pack(obj)
    except (OverflowError, ValueError, TypeError):
        return b"\xc1"  # never-used msgpack byte


def frame_payloads(types: frozenset[int], cap: int) -> st.SearchStrategy[bytes]:
    """One frame-level payload: garbage, bad lengths, wrong shapes, or valid-schema nonsense."""
    one = st.one_of(
        st.binary(max_size=512),  # raw garbage
        st.integers(min_value=cap + 1, max_value=2**32 - 1).map(HEADER.pack),  # over the cap
        st.tuples(st.integers(min_value=cap + 1, max_value=2**32 - 1), st.binary(max_size=64))
        .map(lambda x: HEADER.pack(x[0]) + x[1]),
        st.tuples(st.integers(min_value=1, max_value=4096), st.binary(max_size=64))  # truncated
        .map(lambda x: HEADER.pack(x[0] + len(x[1])) + x[1]),
        st.binary(max_size=256).map(framed),  # a frame of garbage msgpack
        msgpack_values.map(_pack_any).map(framed),  # msgpack, but not a message
        st.dictionaries(st.text(max_size=6), msgpack_values, max_size=4)
        .map(lambda d: {**d, "t": d.get("t", 9999)})
        .map(_pack_any)
        .map(framed),
        st.tuples(st.sampled_from(sorted(REGISTRY)), st.dictionaries(
            st.sampled_from(["rid", "n", "model", "prompt", "prompt_ids", "deadline_ms", "hops",
                             "code", "message", "v", "crl", "ids", "step", "data"]),
            msgpack_values, max_size=6))
        .map(lambda x: framed(_pack_any({**x[1], "t": x[0]}))),  # a known type, wrong fields
        schema_valid(frozenset(REGISTRY)).map(lambda m: framed(_pack_any(m))),  # maybe not allowed here
        schema_valid(types).map(lambda m: framed(_pack_any(m))),  # allowed here, valid schema
    )
    return st.lists(one, min_size=1, max_size=4).map(b"".join)


def local_verdict(payload: bytes, cap: int, allowed: frozenset[int]) -> str:
    """What the daemon's own decoder makes of the payload: "malformed", "partial" or "ok"."""
    d = FrameDecoder(cap, allowed)
    try:
        d.feed(payload)
        for _ in d.messages():
            pass
    except ProtocolError:
        return "malformed"
    return "partial" if d.pending_bytes else "ok"


def decode_replies(data: bytes, cap: int, allowed: frozenset[int]) -> list[Message]:
    """The daemon's replies; it must itself speak only well-formed, allowed frames."""
    d = FrameDecoder(cap, allowed)
    d.feed(data)
    return list(d.messages())


modes = st.sampled_from(["half_close", "half_close", "half_close", "reset"])


def check_frame_outcome(payload: bytes, mode: str, out: Outcome, cap: int,
                        accepted: frozenset[int], replies_allowed: frozenset[int]) -> None:
    if mode == "reset":
        return  # nothing to read; the batch's health check is the property
    assert out.end is not None, (
        f"the daemon neither answered nor closed the stream within {STREAM_DEADLINE_S} s "
        f"(payload {payload[:64]!r}..., {len(payload)} bytes)")
    replies = decode_replies(out.data, cap, replies_allowed)
    if local_verdict(payload, cap, accepted) == "malformed":
        # An ERROR frame, or the stream closed. (The daemon sends ERROR and then resets the
        # stream; py-libp2p's yamux drops data still buffered when the RST arrives, so the
        # reader may see only the reset.)
        errors = [m for m in replies if m["t"] == MessageType.ERROR]
        assert errors or out.end in ("reset", "eof"), (payload[:64], out)
        if errors:
            assert errors[-1]["code"] in ("malformed", "too_large"), errors[-1]


# ============================================================================ request protocol


REQUEST_REPLIES = REQUEST_TYPES  # the daemon must itself speak only its own protocol


@FUZZ
@given(batch=st.lists(st.tuples(frame_payloads(REQUEST_TYPES, MAX_REQUEST_FRAME), modes),
                      min_size=1, max_size=6))
def test_request_protocol_survives_malformed_frames(
    target: Target, attacker: Attacker, batch: list[tuple[bytes, str]]
) -> None:
    outcomes = attacker.attack(target, attacker.probe_batch, REQUEST_PROTOCOL, batch, STREAM_DEADLINE_S)
    for (payload, mode), out in zip(batch, outcomes, strict=True):
        check_frame_outcome(payload, mode, out, MAX_REQUEST_FRAME, REQUEST_TYPES, REQUEST_REPLIES)
    assert_healthy(target)


def test_request_protocol_answers_malformed_frame_with_error(
    target: Target, attacker: Attacker
) -> None:
    """The fixed example behind the property: garbage gets ERROR(malformed) and the stream ends."""
    before = _status(target.sock)["services"]["request_server"]["malformed"]
    out = attacker.attack(target, attacker.probe, REQUEST_PROTOCOL, framed(b"\xc1garbage"), "half_close",
                        STREAM_DEADLINE_S)
    assert out.end in ("eof", "reset")
    replies = decode_replies(out.data, MAX_REQUEST_FRAME, REQUEST_REPLIES)
    # ERROR(malformed), unless the reset that follows it overtook it (see check_frame_outcome)
    assert [m["code"] for m in replies if m["t"] == MessageType.ERROR] in (["malformed"], [])
    assert replies or out.end == "reset"
    ok = attacker.attack(target, attacker.probe, REQUEST_PROTOCOL,
                       framed(pack({"t": int(MessageType.PING), "n": 7})), "half_close",
                       STREAM_DEADLINE_S)
    pongs = decode_replies(ok.data, MAX_REQUEST_FRAME, REQUEST_REPLIES)
    assert [(m["t"], m["n"]) for m in pongs] == [(MessageType.PONG, 7)]
    assert _status(target.sock)["services"]["request_server"]["malformed"] == before + 1
    assert_healthy(target)


async def _abandon_generation(a: Attacker, prompt_ids: list[int]) -> str:
    """Ask for a long generation and reset the stream as soon as the first tokens arrive:
    "abandoned" (it was still running), "finished" (DONE or ERROR came first) or "stuck" (no
    token within the deadline: the model has no free slot)."""
    req = framed(pack({"t": int(MessageType.REQ), "rid": os.urandom(4).hex(), "model": MODEL,
                       "prompt_ids": prompt_ids, "deadline_ms": 60_000, "hops": 0,
                       "max_tokens": 4096, "temperature": 0.0}))
    with trio.fail_after(STREAM_DEADLINE_S):
        stream = await a.host.new_stream(a.peer, [REQUEST_PROTOCOL])
    try:
        await stream.write(req)
        d = FrameDecoder(MAX_REQUEST_FRAME, REQUEST_TYPES)
        with trio.move_on_after(STREAM_DEADLINE_S):
            while True:
                d.feed(await stream.read(1 << 16))
                types = [m["t"] for m in d.messages()]
                if MessageType.DONE in types or MessageType.ERROR in types:
                    return "finished"
                if MessageType.TOKENS in types:
                    return "abandoned"
        return "stuck"
    finally:
        await _quiet_reset(stream)


def _in_flight(t: Target) -> tuple[int, int]:
    models = _status(t.sock)["models"]
    return sum(m["in_flight"] for m in models), sum(m["queue_depth"] for m in models)


def test_abandoned_requests_release_model_capacity(target: Target, attacker: Attacker) -> None:
    """Found by the property above (a REQ whose stream ends mid-generation): the cancelled
    generation never gave its slot back (the runner's async generator was left suspended and
    finalized later in another task, where releasing the CapacityLimiter fails), so after
    ``max_concurrency`` abandoned requests the model served nothing any more."""
    abandoned = 0
    for i in range(12):
        got = attacker.attack(target, _abandon_generation, attacker, [5 + i, 17, 42, 7, 99])
        assert got != "stuck", (
            f"no free model slot after {abandoned} abandoned requests: "
            f"(in_flight, queued) = {_in_flight(target)}")
        abandoned += got == "abandoned"
    assert abandoned >= 3, "could not abandon a running generation; the test proves nothing"
    wait_for(lambda: _in_flight(target) == (0, 0), STREAM_DEADLINE_S,
             lambda: f"free model slots (leaked? (in_flight, queued) = {_in_flight(target)} "
                     f"after {abandoned} abandoned requests)", poll_s=0.05)
    assert_healthy(target)


# ============================================================================ stage protocol

STAGE_REPLIES = frozenset(STAGE_TYPES)


@FUZZ
@given(batch=st.lists(st.tuples(frame_payloads(STAGE_TYPES, MAX_STAGE_FRAME), modes),
                      min_size=1, max_size=6))
def test_stage_protocol_survives_malformed_frames(
    target: Target, attacker: Attacker, stage_supported: None, batch: list[tuple[bytes, str]]
) -> None:
    outcomes = attacker.attack(target, attacker.probe_batch, STAGE_PROTOCOL, batch, STREAM_DEADLINE_S)
    for (payload, mode), out in zip(batch, outcomes, strict=True):
        check_frame_outcome(payload, mode, out, MAX_STAGE_FRAME, STAGE_TYPES, STAGE_REPLIES)
    assert_healthy(target)


@pytest.fixture(scope="module")
def stage_supported(attacker: Attacker) -> None:
    if not attacker.call(attacker.supports, STAGE_PROTOCOL):
        pytest.skip(f"the daemon does not register {STAGE_PROTOCOL} (yet)")


# ============================================================================ multistream-select


@FUZZ
@given(batch=st.lists(st.tuples(
    st.one_of(
        st.binary(max_size=256),
        st.binary(max_size=200).map(lambda b: encode_uvarint(len(b)) + b),
        st.sampled_from([b"/multistream/1.0.0\n", b"/meshd/req/1.0.0\n"])
        .flatmap(lambda p: st.binary(max_size=64).map(lambda g: encode_uvarint(len(p)) + p + g)),
        st.binary(min_size=1, max_size=16).map(lambda b: b"\xff" * 11 + b),
    ),
    modes), min_size=1, max_size=6))
def test_protocol_negotiation_survives_garbage(
    target: Target, attacker: Attacker, batch: list[tuple[bytes, str]]
) -> None:
    """Garbage before any protocol is chosen (inside multistream-select itself)."""
    outcomes = attacker.attack(target, attacker.probe_batch, None, batch, STREAM_DEADLINE_S)
    for (payload, mode), out in zip(batch, outcomes, strict=True):
        if mode != "reset":
            assert out.end is not None, f"negotiation of {payload[:40]!r} neither ended nor closed"
    assert_healthy(target)


# ============================================================================ gossipsub

TOPICS = st.sampled_from([ADVERT_TOPIC, REVOCATION_TOPIC]) | st.text(max_size=20)


def _rpc_bytes(rpc: rpc_pb2.RPC) -> bytes:
    return bytes(rpc.SerializeToString())


def lp(body: bytes) -> bytes:
    return bytes(encode_uvarint(len(body))) + body


@st.composite
def nonsense_rpcs(draw: st.DrawFn) -> bytes:
    """Valid protobuf RPCs whose content is nonsense: unknown topics, forged or unsigned
    messages, bogus keys, control messages for anything, odd numbers."""
    rpc = rpc_pb2.RPC()
    for _ in range(draw(st.integers(0, 3))):
        rpc.subscriptions.add(subscribe=draw(st.booleans()), topicid=draw(TOPICS))
    for _ in range(draw(st.integers(0, 3))):
        m = rpc.publish.add()
        m.from_id = draw(st.binary(max_size=40) | st.just(ID(b"").to_bytes()))
        m.data = draw(st.binary(max_size=200))
        m.seqno = draw(st.binary(max_size=12))
        m.topicIDs.extend(draw(st.lists(TOPICS, max_size=3)))
        if draw(st.booleans()):
            m.signature = draw(st.binary(min_size=1, max_size=80))
        if draw(st.booleans()):
            m.key = draw(st.binary(min_size=1, max_size=60))
    if draw(st.booleans()):
        c = rpc.control
        for _ in range(draw(st.integers(0, 2))):
            c.ihave.add(topicID=draw(TOPICS),
                        messageIDs=draw(st.lists(st.binary(max_size=40), max_size=4)))
        for _ in range(draw(st.integers(0, 2))):
            c.iwant.add(messageIDs=draw(st.lists(st.binary(max_size=40), max_size=4)))
        for _ in range(draw(st.integers(0, 2))):
            c.graft.add(topicID=draw(TOPICS))
        for _ in range(draw(st.integers(0, 2))):
            p = c.prune.add(topicID=draw(TOPICS), backoff=draw(st.integers(0, 2**64 - 1)))
            for _ in range(draw(st.integers(0, 2))):
                p.peers.add(peerID=draw(st.binary(max_size=40)),
                            signedPeerRecord=draw(st.binary(max_size=60)))
        for _ in range(draw(st.integers(0, 2))):
            c.idontwant.add(messageIDs=draw(st.lists(st.binary(max_size=40), max_size=3)))
    if draw(st.booleans()):
        rpc.senderRecord = draw(st.binary(max_size=100))
    return _rpc_bytes(rpc)


def _pb_varint(n: int) -> bytes:
    return bytes(encode_uvarint(n))


# Named functions, not lambdas: Hypothesis describes a lambda by parsing its source with
# ``ast.parse``, and under the recursive strategy's deep stack CPython 3.11 raised SystemError
# ("AST constructor recursion depth mismatch") inside that, failing a CI run as a flaky test.
def _varint_field(x: tuple[int, int]) -> bytes:
    return _pb_varint(x[0] << 3 | 0) + _pb_varint(x[1])


def _bytes_field(x: tuple[int, bytes]) -> bytes:
    return _pb_varint(x[0] << 3 | 2) + lp(x[1])


def _odd_wire_type_field(x: tuple[int, int, bytes]) -> bytes:
    return _pb_varint(x[0] << 3 | x[1]) + x[2]


def _nested_field(x: tuple[int, list[bytes]]) -> bytes:
    return _pb_varint(x[0] << 3 | 2) + lp(b"".join(x[1]))


def _nested(children: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return st.tuples(st.integers(1, 8), st.lists(children, max_size=4)).map(_nested_field)


raw_pb_fields = st.recursive(
    st.one_of(
        st.tuples(st.integers(1, 8), st.integers(0, 2**64 - 1)).map(_varint_field),
        st.tuples(st.integers(1, 8), st.binary(max_size=60)).map(_bytes_field),
        st.tuples(st.integers(1, 8), st.sampled_from([1, 3, 4, 5, 6, 7]), st.binary(max_size=8))
        .map(_odd_wire_type_field),
    ),
    _nested,
    max_leaves=10,
)


@st.composite
def advert_garbage(draw: st.DrawFn, attacker_cert: bytes, sign: Callable[[bytes], bytes]) -> bytes:
    """The meshd payload of a gossip message: garbage, or ADVERT/REVOCATION-shaped nonsense
    (with the attacker's real certificate and a valid signature over a garbage body)."""
    kind = draw(st.sampled_from(["raw", "msgpack", "advert_signed", "advert_bad", "revocation"]))
    if kind == "raw":
        return draw(st.binary(max_size=300))
    if kind == "msgpack":
        return _pack_any(draw(msgpack_values))
    if kind == "advert_signed":
        body = draw(st.binary(max_size=200) | msgpack_values.map(_pack_any)
                    | st.dictionaries(st.text(max_size=8), msgpack_values, max_size=8).map(_pack_any))
        return pack({"t": int(MessageType.ADVERT), "body": body, "sig": sign(body),
                     "cert": attacker_cert})
    if kind == "advert_bad":
        return pack({"t": int(MessageType.ADVERT), "body": draw(st.binary(max_size=100)),
                     "sig": draw(st.binary(max_size=80)),
                     "cert": draw(st.binary(max_size=200) | st.just(attacker_cert))})
    return pack({"t": int(MessageType.REVOCATION), "crl": draw(st.binary(max_size=300))})


@dataclass
class GossipPayload:
    data: bytes
    kind: str
    signed: int = 0  # signed meshd-topic messages in it (these reach the daemon's validators)


@st.composite
def gossip_payloads(draw: st.DrawFn, a: Attacker) -> GossipPayload:
    kind = draw(st.sampled_from(
        ["garbage", "bad_varint", "too_large", "truncated", "raw_pb", "nonsense_rpc", "signed"]))
    if kind == "garbage":
        return GossipPayload(draw(st.binary(min_size=1, max_size=400)), kind)
    if kind == "bad_varint":  # more than 10 continuation bytes: not a 64-bit varint
        return GossipPayload(b"\xff" * draw(st.integers(10, 20)) + draw(st.binary(max_size=20)),
                             kind)
    if kind == "too_large":  # a length far over pubsub's cap on one RPC
        n = draw(st.integers(min_value=64 << 20, max_value=2**63))
        return GossipPayload(_pb_varint(n) + draw(st.binary(max_size=40)), kind)
    if kind == "truncated":
        body = draw(st.binary(max_size=60))
        return GossipPayload(_pb_varint(len(body) + draw(st.integers(1, 5000))) + body, kind)
    if kind == "raw_pb":
        return GossipPayload(lp(b"".join(draw(st.lists(raw_pb_fields, max_size=4)))), kind)
    if kind == "nonsense_rpc":
        return GossipPayload(b"".join(lp(r) for r in draw(st.lists(nonsense_rpcs(), min_size=1,
                                                                     max_size=3))), kind)
    cert = a.identity.certificate_bytes

    def sign_body(body: bytes) -> bytes:
        return bytes(a.identity.key_pair.private_key.sign(signing_payload(body)))

    rpc = rpc_pb2.RPC()
    n = draw(st.integers(1, 4))
    for _ in range(n):
        topic = draw(st.sampled_from([ADVERT_TOPIC, REVOCATION_TOPIC]))
        payload = draw(advert_garbage(cert, sign_body))
        rpc.publish.append(a.sign(topic, payload, os.urandom(8)))
    return GossipPayload(lp(_rpc_bytes(rpc)), kind, signed=n)


def gossip_must_close(data: bytes) -> bool:
    """Whether the daemon's pubsub reader must give up on these bytes (and drop the stream):
    a varint longer than 64 bits, a length over its cap, or a complete RPC that does not parse.
    A truncated tail is not one of them: the reader waits for more until our half-close."""
    i = 0
    while i < len(data):
        n = shift = 0
        for k in range(10):
            if i + k >= len(data):
                return False  # a truncated varint
            b = data[i + k]
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        else:
            return True  # over-long varint
        i += k + 1
        if n > DefaultMaxMessageSize:
            return True
        if i + n > len(data):
            return False  # a truncated RPC
        try:
            rpc_pb2.RPC().ParseFromString(data[i : i + n])
        except Exception:
            return True
        i += n
    return False


@pytest.mark.parametrize("proto", [PROTOCOL_ID_V11, PROTOCOL_ID])
@FUZZ
@given(data=st.data())
def test_gossip_stream_survives_malformed_bytes(
    target: Target, attacker: Attacker, proto: str, data: st.DataObject
) -> None:
    batch = data.draw(st.lists(st.tuples(gossip_payloads(attacker), modes), min_size=1, max_size=6))
    outcomes = attacker.attack(target, attacker.probe_batch, proto,
                             [(p.data, mode) for p, mode in batch], GOSSIP_SETTLE_S)
    for (p, mode), out in zip(batch, outcomes, strict=True):
        if mode != "reset" and gossip_must_close(p.data):
            # the gossip stream is long-lived; give a stream that must be dropped its full deadline
            if out.end is None:
                out = attacker.attack(target, attacker.probe, proto, p.data, mode, STREAM_DEADLINE_S)
            assert out.end is not None, f"{p.kind} payload {p.data[:40]!r} did not close the stream"
    assert_healthy(target)


def test_gossip_message_with_undecodable_key_is_dropped(target: Target, attacker: Attacker) -> None:
    """Found by the property above: a published message on a meshd topic whose ``from`` is not
    a peer ID the key can be extracted from, with a ``key`` field that is not a protobuf key.
    py-libp2p's signature check raises DecodeError inside pubsub's push_msg task, which took
    down the pubsub service and the whole daemon."""
    rpc = rpc_pb2.RPC()
    m = rpc.publish.add()
    m.from_id = b"\x00not-a-peer-id"
    m.data = b"x"
    m.seqno = os.urandom(8)
    m.topicIDs.append(ADVERT_TOPIC)
    m.signature = b"s"
    m.key = b"\xff\xff\xff"
    attacker.attack(target, attacker.probe, PROTOCOL_ID_V11, lp(_rpc_bytes(rpc)), "half_close",
                    GOSSIP_SETTLE_S)
    assert_healthy(target)


def test_signed_garbage_reaches_the_validators_and_is_rejected(
    target: Target, attacker: Attacker
) -> None:
    """Not vacuous: correctly signed gossip from the attested attacker reaches the daemon's topic
    validators, which reject every garbage payload, and no advert of the attacker is accepted."""
    before = _status(target.sock)["services"]["node"]["adverts_rejected"]
    cert = attacker.identity.certificate_bytes
    body = pack({"name": "fuzzer", "seq": 1})
    payloads = [
        b"\xc1",
        pack({"t": int(MessageType.ADVERT), "body": body, "cert": cert,
              "sig": bytes(attacker.identity.key_pair.private_key.sign(signing_payload(body)))}),
        pack({"t": int(MessageType.REVOCATION), "crl": b"not a list"}),
    ]
    rpc = rpc_pb2.RPC()
    for i, p in enumerate(payloads):
        rpc.publish.append(attacker.sign(REVOCATION_TOPIC if i == 2 else ADVERT_TOPIC, p,
                                         os.urandom(8)))
    attacker.attack(target, attacker.probe, PROTOCOL_ID_V11, lp(_rpc_bytes(rpc)), "half_close",
                  GOSSIP_SETTLE_S)
    wait_for(lambda: _status(target.sock)["services"]["node"]["adverts_rejected"]
             >= before + len(payloads), STREAM_DEADLINE_S,
             "the signed garbage to reach the validators", poll_s=0.05)
    assert_healthy(target)


# ============================================================================ control socket


async def control_probe(sock: str, payload: bytes) -> Outcome:
    out = Outcome()
    with trio.fail_after(STREAM_DEADLINE_S):
        stream = await trio.open_unix_socket(sock)
    try:
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            with trio.fail_after(STREAM_DEADLINE_S):
                await stream.send_all(payload)
                await stream.send_eof()
        with trio.move_on_after(STREAM_DEADLINE_S):
            while True:
                try:
                    chunk = await stream.receive_some(1 << 16)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    out.end = "reset"
                    break
                if not chunk:
                    out.end = "eof"
                    break
                out.data += chunk
    finally:
        await stream.aclose()
    return out


def hello(v: int = CONTROL_VERSION) -> bytes:
    return framed(pack({"t": int(MessageType.HELLO), "v": v, "client": "fuzz"}))


control_payloads = st.one_of(
    frame_payloads(CONTROL_TYPES, MAX_CONTROL_FRAME),  # garbage where HELLO must be
    st.tuples(st.integers(-3, 5), frame_payloads(CONTROL_TYPES, MAX_CONTROL_FRAME))
    .map(lambda x: hello(x[0]) + x[1]),  # a HELLO of some version, then anything
    frame_payloads(CONTROL_TYPES, MAX_CONTROL_FRAME).map(lambda p: hello() + p),
    schema_valid(CONTROL_TYPES).map(lambda m: hello() + framed(_pack_any(m))),
)


def first_frame(payload: bytes) -> str:
    """What the control server must make of the first frame: "partial", "bad" (not a HELLO the
    daemon speaks: it must answer ERROR and nothing else) or "hello"."""
    d = FrameDecoder(MAX_CONTROL_FRAME, CONTROL_TYPES)
    if len(payload) < HEADER.size:
        return "partial"
    (n,) = struct.unpack_from(">I", payload)
    if n > MAX_CONTROL_FRAME:
        return "bad"
    if len(payload) < HEADER.size + n:
        return "partial"
    try:
        d.feed(payload[: HEADER.size + n])
        msg = next(d.messages())
    except ProtocolError:
        return "bad"
    if msg["t"] != MessageType.HELLO or msg["v"] != CONTROL_VERSION:
        return "bad"
    return "hello"


@FUZZ
@given(batch=st.lists(control_payloads, min_size=1, max_size=6))
def test_control_socket_survives_malformed_frames(target: Target, batch: list[bytes]) -> None:
    for payload in batch:
        out = trio.run(control_probe, target.sock, payload)
        assert out.end is not None, f"the control server kept {payload[:64]!r} open past the deadline"
        replies = decode_replies(out.data, MAX_CONTROL_FRAME, CONTROL_REPLY_TYPES)
        verdict = first_frame(payload)
        if verdict == "bad":
            assert [m["t"] for m in replies] == [MessageType.ERROR], replies
        elif verdict == "hello" and replies:
            assert replies[0]["t"] in (MessageType.HELLO_OK, MessageType.ERROR), replies
        elif verdict == "partial":
            assert replies == [], replies
    assert_healthy(target)


def test_control_socket_answers_garbage_with_error(target: Target) -> None:
    out = trio.run(control_probe, target.sock, framed(b"\xc1"))
    replies = decode_replies(out.data, MAX_CONTROL_FRAME, CONTROL_REPLY_TYPES)
    assert [(m["t"], m["code"]) for m in replies] == [(MessageType.ERROR, "malformed")]
    out = trio.run(control_probe, target.sock, hello(CONTROL_VERSION + 1))
    replies = decode_replies(out.data, MAX_CONTROL_FRAME, CONTROL_REPLY_TYPES)
    assert [(m["t"], m["code"]) for m in replies] == [(MessageType.ERROR, "unsupported")]
    out = trio.run(control_probe, target.sock, hello() + framed(pack({"t": 999})))
    replies = decode_replies(out.data, MAX_CONTROL_FRAME, CONTROL_REPLY_TYPES)
    assert [m["t"] for m in replies] == [MessageType.ERROR]  # eager decode: no HELLO_OK first
    assert_healthy(target)
