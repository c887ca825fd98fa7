"""Link emulation, the pure part: IPv4 header parsing and a per-pair delay schedule.

The forwarder (``meshd.testnet.forwarder``) reads every packet between two testnet nodes from a
TUN device, offers it here with the current time, and writes back whatever ``due`` returns. No
I/O and no clock reads here: time is passed in, randomness comes from a seeded RNG, so the
schedule is reproducible and table-testable.

Semantics (per direction, like netem's ``delay D J loss L``):
- each packet is delayed ``delay_ms`` plus a uniform sample in ``[-jitter_ms, +jitter_ms]``
  (never below zero);
- it is dropped with probability ``loss_pct / 100``;
- packets of one (source, destination) pair leave in the order they came (a packet is never
  released before the one ahead of it), unless ``reorder`` is on; so with jitter, back-to-back
  packets may wait a little longer than their own sample.
"""

from __future__ import annotations

import heapq
import ipaddress
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from meshd.testnet.scenario import LinkSpec

IPV4_MIN_HEADER = 20


@dataclass(frozen=True)
class OneWay:
    """One direction of a link."""

    delay_ms: float
    jitter_ms: float = 0.0
    loss_pct: float = 0.0

    @classmethod
    def from_link(cls, spec: LinkSpec) -> OneWay:
        """Half the round trip each way; jitter ``j`` of the RTT is ``j / 2`` each way, so a round
        trip stays within ``rtt_ms +- jitter_ms``."""
        return cls(spec.rtt_ms / 2.0, spec.jitter_ms / 2.0, spec.loss_pct)


def ip4(text: str) -> bytes:
    """Dotted IPv4 address to the 4 bytes found in a header."""
    return ipaddress.IPv4Address(text).packed


def ipv4_pair(packet: bytes) -> tuple[bytes, bytes] | None:
    """(source, destination) addresses of an IPv4 packet, or None if it is not one."""
    if len(packet) < IPV4_MIN_HEADER or packet[0] >> 4 != 4 or (packet[0] & 0x0F) < 5:
        return None
    return bytes(packet[12:16]), bytes(packet[16:20])


@dataclass
class Stats:
    received: int = 0
    delayed: int = 0
    dropped: int = 0
    passed: int = 0  # not between two known nodes: sent on at once
    not_ipv4: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(self.__dict__)


@dataclass
class Schedule:
    """Packets waiting for their time, in a heap of (due, seq, packet)."""

    links: Mapping[tuple[bytes, bytes], OneWay]
    seed: int = 1
    reorder: bool = False
    stats: Stats = field(default_factory=Stats)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._heap: list[tuple[float, int, bytes]] = []
        self._seq = 0
        self._last_due: dict[tuple[bytes, bytes], float] = {}

    def __len__(self) -> int:
        return len(self._heap)

    def delay_s(self, link: OneWay) -> float:
        """One packet's delay (seconds) drawn for ``link``."""
        d = link.delay_ms
        if link.jitter_ms > 0.0:
            d += self._rng.uniform(-link.jitter_ms, link.jitter_ms)
        return max(d, 0.0) / 1000.0

    def offer(self, packet: bytes, now: float) -> float | None:
        """Take a packet read at ``now``: returns the time it is due, or None if dropped."""
        self.stats.received += 1
        pair = ipv4_pair(packet)
        link = self.links.get(pair) if pair is not None else None
        if link is None:
            if pair is None:
                self.stats.not_ipv4 += 1
            else:
                self.stats.passed += 1
            due = now
        else:
            if link.loss_pct > 0.0 and self._rng.random() * 100.0 < link.loss_pct:
                self.stats.dropped += 1
                return None
            due = now + self.delay_s(link)
            self.stats.delayed += 1
        if pair is not None and not self.reorder:
            due = max(due, self._last_due.get(pair, due))
            self._last_due[pair] = due
        self._seq += 1
        heapq.heappush(self._heap, (due, self._seq, packet))
        return due

    def next_due(self) -> float | None:
        return self._heap[0][0] if self._heap else None

    def due(self, now: float) -> list[tuple[float, bytes]]:
        """Pop every packet due by ``now``, in due order (ties: arrival order), with its due time."""
        out = []
        while self._heap and self._heap[0][0] <= now:
            d, _, p = heapq.heappop(self._heap)
            out.append((d, p))
        return out


def build_links(addresses: Mapping[str, str], link_of: Mapping[tuple[str, str], LinkSpec]
                ) -> dict[tuple[bytes, bytes], OneWay]:
    """Directed pair table: node addresses by name, and each unordered pair's ``LinkSpec``."""
    out: dict[tuple[bytes, bytes], OneWay] = {}
    for (a, b), spec in link_of.items():
        one = OneWay.from_link(spec)
        out[(ip4(addresses[a]), ip4(addresses[b]))] = one
        out[(ip4(addresses[b]), ip4(addresses[a]))] = one
    return out


def percentile(values: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100]) of a non-empty collection; 0.0 if empty."""
    xs = sorted(values)
    if not xs:
        return 0.0
    k = max(0, min(len(xs) - 1, int(round(q / 100.0 * (len(xs) - 1)))))
    return xs[k]
