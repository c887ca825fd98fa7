"""Liveness of linked peers: whom to ping now, and who has stalled. Pure: time is passed in.

py-libp2p spends ~0.6 ms of CPU per frame at each end, so a ping per peer every 2 s was most of
an idle node's CPU. Here every frame a peer sends us counts as proof of life (a PONG, a frame on
either request stream, a gossip RPC), and a peer is pinged only when

* its RTT sample is due: every ``ping_interval_s`` (jittered, so pings spread out), which keeps
  Vivaldi and the measured-RTT routing input fed; or
* requests of ours wait on it and it has been silent for ``busy_silence_s``: a server that froze
  mid-request is found within about ``busy_silence_s + stall_timeout_s``.

A peer is stalled when a ping has been unanswered for ``stall_timeout_s`` and nothing at all has
come from it for as long (a SIGSTOPped peer keeps its TCP connection and never answers), or when
a ping stays unanswered for ``UNANSWERED_FACTOR`` times that even though other frames arrive
(its request stream is wedged).
"""

from __future__ import annotations

import random
from collections.abc import Collection
from dataclasses import dataclass

UNANSWERED_FACTOR = 4.0


@dataclass(slots=True)
class _Peer:
    heard_at: float  # last frame of any kind from the peer
    ping_due: float  # next RTT ping
    ping_sent: float | None = None  # the unanswered ping, if any


@dataclass(frozen=True, slots=True)
class Decision:
    ping: tuple[str, ...]  # peers to ping now
    stalled: tuple[tuple[str, str], ...]  # (peer, reason) to close; every reason says "stalled"


class Liveness:
    def __init__(
        self,
        *,
        ping_interval_s: float,
        busy_silence_s: float,
        stall_timeout_s: float,
        jitter: float = 0.25,
        rng: random.Random | None = None,
    ) -> None:
        self.ping_interval_s = ping_interval_s
        self.busy_silence_s = busy_silence_s
        self.stall_timeout_s = stall_timeout_s
        self.jitter = jitter
        self._rng = rng or random.Random()
        self._peers: dict[str, _Peer] = {}

    def __contains__(self, peer: str) -> bool:
        return peer in self._peers

    def __len__(self) -> int:
        return len(self._peers)

    def track(self, peer: str, now: float) -> None:
        """A new link: its first ping is due at once (an RTT sample for routing straight away)."""
        if peer not in self._peers:
            self._peers[peer] = _Peer(heard_at=now, ping_due=now)

    def forget(self, peer: str) -> None:
        self._peers.pop(peer, None)

    def heard(self, peer: str, now: float) -> None:
        """Any frame from ``peer`` arrived."""
        p = self._peers.get(peer)
        if p is not None:
            p.heard_at = now

    def answered(self, peer: str, now: float) -> None:
        """A PONG from ``peer`` arrived."""
        p = self._peers.get(peer)
        if p is not None:
            p.heard_at = now
            p.ping_sent = None

    def ping_sent(self, peer: str, now: float) -> None:
        p = self._peers.get(peer)
        if p is not None:
            p.ping_sent = now
            spread = self._rng.uniform(1.0 - self.jitter, 1.0 + self.jitter)
            p.ping_due = now + self.ping_interval_s * spread

    def decide(self, now: float, busy: Collection[str] = ()) -> Decision:
        """Whom to ping and who has stalled at ``now``; ``busy``: peers our requests wait on."""
        ping: list[str] = []
        stalled: list[tuple[str, str]] = []
        for peer in sorted(self._peers):
            p = self._peers[peer]
            silent = now - p.heard_at
            if p.ping_sent is not None:
                waited = now - p.ping_sent
                if waited >= self.stall_timeout_s and silent >= self.stall_timeout_s:
                    stalled.append((peer, f"stalled: no answer for {silent:.1f} s"))
                elif waited >= UNANSWERED_FACTOR * self.stall_timeout_s:
                    stalled.append((peer, f"stalled: ping unanswered for {waited:.1f} s"))
                continue
            if now >= p.ping_due or (peer in busy and silent >= self.busy_silence_s):
                ping.append(peer)
        return Decision(tuple(ping), tuple(stalled))

    def next_check(self, now: float, busy: Collection[str] = ()) -> float:
        """The earliest time ``decide`` can answer differently if nothing new arrives (inf with
        no peers): a ping due, a silent busy peer's ping, an unanswered ping's stall."""
        at = float("inf")
        for peer, p in self._peers.items():
            if p.ping_sent is not None:
                stall = self.stall_timeout_s
                at = min(at, max(p.ping_sent, p.heard_at) + stall,
                         p.ping_sent + UNANSWERED_FACTOR * stall)
                continue
            at = min(at, p.ping_due)
            if peer in busy:
                at = min(at, p.heard_at + self.busy_silence_s)
        return max(at, now)
