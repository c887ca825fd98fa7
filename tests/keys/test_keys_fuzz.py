"""Decoders raise only AttestationError/ProtocolError on ANY input (Hypothesis)."""

from __future__ import annotations

import contextlib

import msgpack
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keys_helpers import NOW, new_ca
from libp2p.peer.id import ID

from meshd.core import cert as C
from meshd.core import crl as R
from meshd.core import signed as S
from meshd.errors import AttestationError, ProtocolError
from meshd.net import attest as A

CA = new_ca()
NODE = CA.issue("fuzz-node")
VALID_CERT = NODE.certificate_bytes
VALID_CRL = R.sign_revocation_list(
    R.RevocationList(
        version=3, issued_at=NOW, ca_key_id=C.ca_key_id(CA.public_key), serials=frozenset({1, 2})
    ),
    CA.private_key,
)
FUZZ = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

flat_values = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=40)
    | st.binary(max_size=80)
)
msgpack_values = st.recursive(
    flat_values,
    lambda children: (
        st.lists(children, max_size=12) | st.dictionaries(st.text(max_size=8), children, max_size=6)
    ),
    max_leaves=15,
)


def _envelope(kind: str) -> st.SearchStrategy[bytes]:
    field = flat_values | st.lists(
        flat_values | st.lists(st.text(max_size=8), max_size=2), max_size=3
    )
    body = st.lists(field, min_size=8, max_size=11).map(
        lambda xs: msgpack.packb(xs, use_bin_type=True)
    )
    return st.tuples(
        st.sampled_from([kind, C.CERT_KIND, "x"]),
        st.sampled_from([1, 0, 2, "1"]),
        body,
        st.binary(min_size=0, max_size=70),
    ).map(lambda t: msgpack.packb(list(t), use_bin_type=True))


def _mutations(valid: bytes) -> st.SearchStrategy[bytes]:
    def mutate(data: tuple[int, int, int]) -> bytes:
        pos, value, cut = data
        b = bytearray(valid)
        b[pos % len(b)] = value
        return bytes(b[: max(1, len(b) - cut)])

    return st.tuples(st.integers(0, 10_000), st.integers(0, 255), st.integers(0, 40)).map(mutate)


def _all_decoders(data: bytes) -> None:
    for call in (
        lambda: C.decode_certificate(data),
        lambda: C.verify_certificate(
            data, ca_public_key=CA.public_key, remote_peer_id=NODE.peer_id.to_base58(), now=NOW
        ),
        lambda: R.decode_revocation_list(data),
        lambda: R.verify_revocation_list(data, ca_public_key=CA.public_key),
    ):
        with contextlib.suppress(AttestationError, ProtocolError):
            call()
    assert S.detect_kind(data) in (None, C.CERT_KIND, R.CRL_KIND)


@FUZZ
@given(st.binary(max_size=600))
def test_random_bytes(data: bytes) -> None:
    _all_decoders(data)


@FUZZ
@given(msgpack_values)
def test_random_msgpack(value: object) -> None:
    _all_decoders(msgpack.packb(value, use_bin_type=True))


@FUZZ
@given(st.one_of(_envelope(C.CERT_KIND), _envelope(R.CRL_KIND)))
def test_envelope_shaped(data: bytes) -> None:
    _all_decoders(data)


@FUZZ
@given(st.one_of(_mutations(VALID_CERT), _mutations(VALID_CRL)))
def test_mutated_valid_encodings(data: bytes) -> None:
    _all_decoders(data)


class _FakeSecureConn:
    """Just enough of ISecureConn for the certificate exchange: scripted reads."""

    def __init__(self, incoming: bytes, remote: ID) -> None:
        self._incoming = incoming
        self._remote = remote
        self.written = bytearray()

    def get_remote_peer(self) -> ID:
        return self._remote

    async def read(self, n: int | None = None) -> bytes:
        await trio.lowlevel.checkpoint()
        n = len(self._incoming) if n is None else n
        chunk, self._incoming = self._incoming[:n], self._incoming[n:]
        return chunk

    async def write(self, data: bytes) -> None:
        await trio.lowlevel.checkpoint()
        self.written += data


@FUZZ
@given(
    st.one_of(
        st.binary(max_size=200),
        st.tuples(st.integers(0, 3), st.integers(0, 2**32 - 1), st.binary(max_size=100)).map(
            lambda t: A.FRAME_MAGIC + bytes([t[0]]) + t[1].to_bytes(4, "big") + t[2]
        ),
        _mutations(
            A.encode_frame(A.FRAME_CERT, VALID_CERT) + A.encode_frame(A.FRAME_VERDICT, b"ok")
        ),
    )
)
def test_exchange_on_garbage_raises_only_attestation_failure(incoming: bytes) -> None:
    attestor = A.Attestor(CA.public_key)
    transport = A.AttestedNoiseTransport(NODE.key_pair, VALID_CERT, attestor, clock=lambda: NOW)
    conn = _FakeSecureConn(incoming, NODE.peer_id)

    async def main() -> None:
        try:
            await transport._exchange(conn)  # type: ignore[arg-type]
        except A.AttestationFailure as failure:
            assert failure.reason in A.ALL_REASONS

    trio.run(main)
