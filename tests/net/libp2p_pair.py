"""Two REAL py-libp2p hosts on 127.0.0.1 (Noise + yamux, one connection per peer), connected."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from libp2p import new_host
from libp2p.crypto.x25519 import create_new_key_pair
from libp2p.custom_types import TProtocol
from libp2p.network.config import ConnectionConfig
from libp2p.peer.peerinfo import info_from_p2p_addr
from libp2p.security.noise.transport import PROTOCOL_ID as NOISE_ID
from libp2p.security.noise.transport import Transport as NoiseTransport
from libp2p.stream_muxer.yamux.yamux import PROTOCOL_ID as YAMUX_ID
from libp2p.stream_muxer.yamux.yamux import Yamux
from multiaddr import Multiaddr

from meshd.net.identity import generate_node_key_pair


def _host() -> Any:
    kp = generate_node_key_pair()
    noise = NoiseTransport(kp, noise_privkey=create_new_key_pair().private_key)
    return new_host(key_pair=kp, sec_opt={NOISE_ID: noise}, muxer_opt={TProtocol(YAMUX_ID): Yamux},
                    connection_config=ConnectionConfig(max_connections_per_peer=1))


@asynccontextmanager
async def pair() -> AsyncIterator[tuple[Any, Any]]:
    """Hosts ``a`` and ``b``, running, ``a`` connected to ``b``."""
    a, b = _host(), _host()
    async with a.run([Multiaddr("/ip4/127.0.0.1/tcp/0")]), b.run([Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        await a.connect(info_from_p2p_addr(b.get_addrs()[0]))
        yield a, b
