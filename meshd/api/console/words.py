"""The node page's plain words: the Prometheus metrics read back as sentences, and a summary of
the configuration. Pure: text or a ``Config`` in, JSON-able lists out."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from meshd.config import Config

# always shown, default or not: what an operator asks first
ALWAYS = {
    "node": ("name", "listen", "bootstrap", "max_peers"),
    "api": ("listen", "auth"),
    "gossip": ("advert_interval_s", "cells"),
    "routing": ("strategy", "hedge", "request_timeout_s"),
    "cache": ("enabled",),
}


def _figure(v: float) -> str:
    if not math.isfinite(v):
        return str(v)
    if v == int(v) and abs(v) < 1e15:
        return f"{int(v):,}"
    return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"


def _seconds(v: float) -> str:
    return f"{v * 1000:.1f} ms" if v < 1 else f"{v:.2f} s"


def metrics_in_words(text: str) -> list[dict[str, Any]]:
    """One entry per metric family: ``name``, ``kind``, ``what`` (its help text) and ``values``,
    each ``{"labels": "k=v, ...", "said": "..."}``: a counter or gauge's figure, a histogram's
    count and mean ("5 requests, mean 12.3 ms" for seconds). Series that never moved (a zero
    counter, an empty histogram) are left out; a family with none left is too."""
    out = []
    for fam in text_string_to_metric_families(text):
        values: list[dict[str, Any]] = []
        if fam.type == "histogram":
            count: dict[tuple[tuple[str, str], ...], float] = {}
            total: dict[tuple[tuple[str, str], ...], float] = {}
            for s in fam.samples:
                key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
                if s.name.endswith("_count"):
                    count[key] = s.value
                elif s.name.endswith("_sum"):
                    total[key] = s.value
            for key, n in sorted(count.items()):
                if n <= 0:
                    continue
                mean = total.get(key, 0.0) / n
                shown = _seconds(mean) if fam.name.endswith("_seconds") else _figure(mean)
                values.append({"labels": _labels(key), "said": f"{_figure(n)} observed, mean {shown}"})
        else:
            for s in fam.samples:
                if s.name.endswith("_created"):
                    continue
                if fam.type == "counter" and s.value == 0:
                    continue
                shown = _seconds(s.value) if fam.name.endswith("_seconds") and fam.type == "gauge" \
                    and "uptime" not in fam.name else _figure(s.value)
                values.append({"labels": _labels(tuple(sorted(s.labels.items()))), "said": shown})
        if values:
            out.append({"name": fam.name, "kind": fam.type, "what": fam.documentation,
                        "values": values})
    return out


def _labels(pairs: tuple[tuple[str, str], ...]) -> str:
    return ", ".join(f"{k}={v}" for k, v in pairs)


def config_summary(cfg: Config) -> list[dict[str, Any]]:
    """Each section of ``cfg`` with the keys set away from their defaults (and those of
    ``ALWAYS``): ``[{"section", "keys": [{"key", "value", "default"}]}]``, and one entry per
    ``[[models]]``. Paths are shown as written; the config holds no secret (keys are files)."""
    out: list[dict[str, Any]] = []
    for f in dataclasses.fields(cfg):
        if f.name in ("base_dir", "models"):
            continue
        value = getattr(cfg, f.name)
        default = type(value)()
        keys = []
        for g in dataclasses.fields(value):
            v, d = getattr(value, g.name), getattr(default, g.name)
            if v != d or g.name in ALWAYS.get(f.name, ()):
                keys.append({"key": g.name, "value": _plain(v), "default": v == d})
        if keys:
            out.append({"section": f.name, "keys": keys})
    for i, m in enumerate(cfg.models):
        default_model = type(m)()
        keys = [{"key": g.name, "value": _plain(getattr(m, g.name)),
                 "default": getattr(m, g.name) == getattr(default_model, g.name)}
                for g in dataclasses.fields(m)
                if getattr(m, g.name) != getattr(default_model, g.name) or g.name == "path"]
        out.append({"section": f"models[{i}]", "keys": keys})
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, tuple):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    return v
