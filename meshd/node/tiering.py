"""The entry node's tier classifier as a daemon service (docs/tiers.md): the classifier
(``meshd.classify``) and the sentence encoder it reads, loaded in a worker thread on the first
``model = "auto"`` request, used from worker threads.

The embedding model is the semantic cache's when the cache has it loaded (one copy in memory),
else loaded here. When either cannot be loaded (no ``meshd[edge]`` extra, a broken classifier
file), the service is ``off`` with the reason, said once in the log, and ``score`` answers None:
the tier decision then takes the large tier, the safe choice.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from meshd.config import Config

log = logging.getLogger(__name__)


class Tiering:
    def __init__(self, config: Config, cache: Any = None) -> None:
        self.config = config
        self.cache = cache  # meshd.node.edge_cache.EdgeCache, whose embedder we may share
        self.classifier: Any = None  # meshd.classify.TierClassifier once loaded
        self.embedder: Any = None
        self.state, self.reason = "idle", "loads on the first model = auto request"
        self._limiter = trio.CapacityLimiter(1)
        self._load_lock = trio.Lock()
        self.stats = {"scored": 0, "unscored": 0}

    @property
    def threshold(self) -> float:
        t = self.config.tiers.threshold
        if t > 0 or self.classifier is None:
            return t or 0.5
        return float(self.classifier.threshold)

    async def _load(self) -> None:
        async with self._load_lock:
            if self.state != "idle":
                return
            self.state, self.reason = "loading", "the classifier is loading"
            try:
                self.classifier, self.embedder = await trio.to_thread.run_sync(self._open)
                self.state, self.reason = "ready", ""
                log.info("tier classifier ready name=%s threshold=%.3f embedder=%s",
                         self.classifier.name, self.threshold, self.embedder.identity)
            except Exception as e:  # the extra is missing, a file is unusable
                self.state, self.reason = "off", str(e).splitlines()[0][:300]
                log.warning("tier classifier off reason=%s", self.reason)

    def _open(self) -> tuple[Any, Any]:
        from meshd.classify import load_classifier

        clf = load_classifier(self.config.path(self.config.tiers.classifier)
                              if self.config.tiers.classifier else None)
        shared = getattr(getattr(self.cache, "cache", None), "embedder", None)
        if (shared is not None and str(shared.identity).startswith(clf.embedding + "@")
                and getattr(shared, "precision", "fp32") == "fp32"):  # trained on float vectors
            return clf, shared
        from meshd.embed import load_embedder

        return clf, load_embedder(threads=1)

    async def score(self, text: str) -> tuple[Any, str]:
        """``(meshd.classify.Scored, "")``, or ``(None, why)`` when no classifier can be used."""
        if self.state in ("idle", "loading"):
            await self._load()
        if self.classifier is None:
            self.stats["unscored"] += 1
            return None, self.reason
        clf, emb = self.classifier, self.embedder

        def run() -> Any:
            return clf.score(text, emb.embed([text])[0])

        scored = await trio.to_thread.run_sync(run, limiter=self._limiter)
        self.stats["scored"] += 1
        return scored, ""

    def statistics(self) -> dict[str, Any]:
        return {**self.stats, "state": self.state, "reason": self.reason,
                "threshold": round(self.threshold, 4)}
