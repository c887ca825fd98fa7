"""The launcher's ports for daemons come from below the kernel's ephemeral range, so that the
testnet's own outgoing connections cannot take a port before its daemon binds it."""

import socket

from meshd.testnet.launcher import ephemeral_range, free_port


def test_ports_are_below_the_ephemeral_range_distinct_and_bindable() -> None:
    lo, _ = ephemeral_range()
    ports = [free_port() for _ in range(100)]
    assert all(p < lo for p in ports)
    assert len(set(ports)) == len(ports)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", ports[-1]))

