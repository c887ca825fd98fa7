"""The daemon's own addresses, checked before libp2p touches them, and an exclusive TCP listener.

py-libp2p 0.8.1 opens its TCP listeners with ``SO_REUSEPORT`` (for hole punching, which meshd
does not use), so a second daemon configured with a running node's port starts anyway and the
kernel hands it about half of the inbound connections; and a listen that fails is only logged at
debug level (``Swarm.listen`` returns False and the node runs deaf). Here:

* ``check_addresses`` parses ``[node] listen`` and ``[node] bootstrap`` and raises
  ``ConfigError`` naming the key and the value (a malformed bootstrap address used to be only
  logged);
* ``probe_listen`` binds each TCP listen address with a plain socket (no ``SO_REUSEPORT``): a port
  held by another process, or an address this host does not have, is a ``ConfigError`` before
  anything starts;
* ``install_exclusive_listen`` makes libp2p's listener set ``SO_REUSEADDR`` only, so that even
  two daemons starting at the same instant cannot share a port, and ``ensure_listening`` turns a
  listen that libp2p skipped into a ``ConfigError``.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Sequence
from typing import Any

import multiaddr

from meshd.errors import ConfigError

log = logging.getLogger(__name__)

_MARK = "_meshd_exclusive"


def parse_listen(addrs: Sequence[str]) -> list[multiaddr.Multiaddr]:
    out = []
    for i, a in enumerate(addrs):
        try:
            m = multiaddr.Multiaddr(a)
            port = m.value_for_protocol("tcp")
        except Exception as err:
            raise ConfigError(f"[node] listen[{i}] = {a!r} is not a TCP multiaddr "
                              f"(like /ip4/0.0.0.0/tcp/4001): {_first_line(err)}") from None
        if port is None:
            raise ConfigError(f"[node] listen[{i}] = {a!r} has no /tcp/PORT")
        out.append(m)
    if not out:
        raise ConfigError("[node] listen is empty: a node needs at least one address")
    return out


def parse_bootstrap(addrs: Sequence[str]) -> list[Any]:
    """``PeerInfo`` of each bootstrap address, which must end in /p2p/<peer id>."""
    from libp2p.peer.peerinfo import info_from_p2p_addr

    out = []
    for i, a in enumerate(addrs):
        try:
            out.append(info_from_p2p_addr(multiaddr.Multiaddr(a)))
        except Exception as err:
            raise ConfigError(f"[node] bootstrap[{i}] = {a!r} is not a multiaddr ending in "
                              f"/p2p/<peer id>: {_first_line(err)}") from None
    return out


def check_addresses(listen: Sequence[str], bootstrap: Sequence[str]) -> None:
    parse_listen(listen)
    parse_bootstrap(bootstrap)


def _bind_target(m: multiaddr.Multiaddr) -> tuple[int, str, int] | None:
    """(family, host, port) to probe, or None for an address a plain bind cannot check (DNS)."""
    port = int(m.value_for_protocol("tcp"))
    for proto, family in (("ip4", socket.AF_INET), ("ip6", socket.AF_INET6)):
        try:
            host = m.value_for_protocol(proto)
        except Exception:
            continue
        if host is not None:
            return family, host, port
    return None


def probe_listen(addrs: Sequence[str]) -> None:
    """Bind each fixed TCP listen port with a plain socket (no ``SO_REUSEPORT``) and let go at
    once; raise ``ConfigError`` when the kernel refuses (in use by another process, or not an
    address of this host). Port 0 (any free port) needs no probe."""
    for i, m in enumerate(parse_listen(addrs)):
        target = _bind_target(m)
        if target is None or target[2] == 0:
            continue
        family, host, port = target
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT is no conflict
            try:
                s.bind((host, port))
            except OSError as err:
                if err.errno == errno.EADDRINUSE:
                    raise ConfigError(f"[node] listen[{i}] = {str(m)!r}: port {port} is already in "
                                      "use (another meshd daemon?); refusing to share it") from None
                raise ConfigError(f"[node] listen[{i}] = {str(m)!r}: cannot bind "
                                  f"({err.strerror})") from None


def install_exclusive_listen() -> bool:
    """Make py-libp2p's TCP listeners (and its hole-punch dials, unused by meshd) set
    ``SO_REUSEADDR`` only, never ``SO_REUSEPORT``; idempotent. False if the library changed."""
    try:
        from libp2p.transport.tcp import tcp
    except ImportError:  # pragma: no cover - the library moved
        return False
    original = getattr(tcp, "_set_reuse_flags", None)
    if original is None:  # pragma: no cover
        log.warning("exclusive listen not installed: py-libp2p changed")
        return False
    if getattr(original, _MARK, False):
        return True

    def reuse_addr_only(sock: Any) -> None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        except OSError:
            pass

    setattr(reuse_addr_only, _MARK, True)
    tcp._set_reuse_flags = reuse_addr_only
    return True


def ensure_listening(host: Any, listen: Sequence[multiaddr.Multiaddr]) -> None:
    """After ``host.run(listen)``: raise ``ConfigError`` for every address libp2p did not open
    (it logs that at debug level only and carries on)."""
    opened = getattr(host.get_network(), "listeners", None)
    if opened is None:  # pragma: no cover - the library changed; nothing to check against
        return
    missing = [str(m) for m in listen if str(m) not in opened]
    if missing:
        raise ConfigError(f"[node] listen: cannot listen on {', '.join(missing)} "
                          "(port in use by another process?)")


def _first_line(err: BaseException) -> str:
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
