"""Testnet scenarios: regions, an RTT matrix and nodes, read from a TOML file (pure, no I/O
beyond reading the file in ``load_scenario``).

Every key is documented in docs/testnet.md. Unknown keys and bad values are errors that name the
key and the file. A node's daemon config is built from its entry (``daemon_models`` and
``daemon_config``) and checked with the daemon's own config parser before anything starts.
"""

from __future__ import annotations

import copy
import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshd.config import ModelConfig, parse_config
from meshd.errors import ConfigError

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,31}$")
MAX_NODES = 250  # one /24 per node in the emulated network

_TOP_KEYS = ("name", "description", "advert_interval_s", "seed", "regions", "links", "nodes")
_LINK_KEYS = ("rtt_ms", "jitter_ms", "loss_pct")
_NODE_KEYS = ("name", "region", "labels", "max_decode_tokens_per_s", "models", "config")


@dataclass(frozen=True)
class LinkSpec:
    """A path between two nodes: round-trip time, its jitter (both in ms) and per-packet loss."""

    rtt_ms: float
    jitter_ms: float = 0.0
    loss_pct: float = 0.0


@dataclass(frozen=True)
class Region:
    name: str
    inside: LinkSpec  # between two nodes of this region


@dataclass(frozen=True)
class NodeDef:
    """One daemon. ``models`` and ``config`` hold TOML tables; read them through the methods,
    which return copies."""

    name: str
    region: str
    labels: tuple[tuple[str, str], ...] = ()
    max_decode_tokens_per_s: float = 0.0  # node speed; applied to models that set none
    models: tuple[dict[str, Any], ...] = ({"path": "default"},)
    config: dict[str, Any] = field(default_factory=dict)  # extra daemon config sections

    def daemon_models(self) -> list[dict[str, Any]]:
        """The node's ``[[models]]`` with its speed applied where a model sets none."""
        out = []
        for m in self.models:
            d = copy.deepcopy(m)
            if self.max_decode_tokens_per_s > 0 and "max_decode_tokens_per_s" not in d:
                d["max_decode_tokens_per_s"] = self.max_decode_tokens_per_s
            out.append(d)
        return out

    def daemon_config(self) -> dict[str, Any]:
        return copy.deepcopy(self.config)


@dataclass(frozen=True)
class Scenario:
    name: str
    source: str
    regions: tuple[Region, ...]
    links: tuple[tuple[str, str, LinkSpec], ...]  # (region a, region b) with a < b
    nodes: tuple[NodeDef, ...]
    advert_interval_s: float = 5.0
    seed: int = 1
    description: str = ""

    def region(self, name: str) -> Region:
        for r in self.regions:
            if r.name == name:
                return r
        raise KeyError(name)

    def node(self, name: str) -> NodeDef:
        for n in self.nodes:
            if n.name == name:
                return n
        raise KeyError(name)

    def region_link(self, a: str, b: str) -> LinkSpec:
        if a == b:
            return self.region(a).inside
        lo, hi = sorted((a, b))
        for x, y, spec in self.links:
            if (x, y) == (lo, hi):
                return spec
        raise KeyError((a, b))

    def link(self, node_a: str, node_b: str) -> LinkSpec:
        """The configured path between two nodes (by name)."""
        return self.region_link(self.node(node_a).region, self.node(node_b).region)


def _keys(table: Any, known: tuple[str, ...], where: str, src: str) -> dict[str, Any]:
    if not isinstance(table, dict):
        raise ConfigError(f"{src}: {where} must be a table")
    for k in table:
        if k not in known:
            raise ConfigError(f"unknown key '{k}' in {where} of {src} (known keys: {', '.join(sorted(known))})")
    return table


def _number(v: Any, where: str, src: str, *, lo: float = 0.0, hi: float = math.inf) -> float:
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise ConfigError(f"{src}: {where} must be a number, not {v!r}")
    f = float(v)
    if not lo <= f < hi or math.isnan(f):
        bound = f"in [{lo:g}, {hi:g})" if hi != math.inf else f">= {lo:g}"
        raise ConfigError(f"{src}: {where} must be {bound}, not {v!r}")
    return f


def _name(v: Any, where: str, src: str) -> str:
    if not isinstance(v, str) or not NAME_RE.match(v):
        raise ConfigError(f"{src}: {where} must be a name of letters, digits, '-' and '_' "
                          f"(at most 32), not {v!r}")
    return v


def _link(table: Any, where: str, src: str, extra: tuple[str, ...] = ()) -> LinkSpec:
    t = _keys(table, _LINK_KEYS + extra, where, src)
    if "rtt_ms" not in t:
        raise ConfigError(f"{src}: {where} needs rtt_ms")
    rtt = _number(t["rtt_ms"], f"{where}.rtt_ms", src)
    jitter = _number(t.get("jitter_ms", 0.0), f"{where}.jitter_ms", src)
    if jitter > rtt:
        raise ConfigError(f"{src}: {where}.jitter_ms ({jitter:g}) must not exceed rtt_ms ({rtt:g})")
    loss = _number(t.get("loss_pct", 0.0), f"{where}.loss_pct", src, hi=100.0)
    return LinkSpec(rtt, jitter, loss)


def _node(t: Any, i: int, regions: set[str], src: str) -> NodeDef:
    where = f"[[nodes]][{i}]"
    t = _keys(t, _NODE_KEYS, where, src)
    for req in ("name", "region"):
        if req not in t:
            raise ConfigError(f"{src}: {where} needs {req}")
    name = _name(t["name"], f"{where}.name", src)
    where = f"node {name!r}"
    region = t["region"]
    if region not in regions:
        raise ConfigError(f"{src}: {where}.region {region!r} is not a region in [regions] "
                          f"({', '.join(sorted(regions)) or 'none'})")
    labels = t.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise ConfigError(f"{src}: {where}.labels must be a table of strings")
    if "region" in labels:
        raise ConfigError(f"{src}: {where}.labels.region is set from the node's region; remove it")
    speed = _number(t.get("max_decode_tokens_per_s", 0.0), f"{where}.max_decode_tokens_per_s", src)
    models = t.get("models", [{"path": "default"}])
    if not isinstance(models, list) or not models:
        raise ConfigError(f"{src}: {where}.models must be a non-empty array of tables")
    known_model = tuple(f for f in ModelConfig.__dataclass_fields__)
    for j, m in enumerate(models):
        _keys(m, known_model, f"{where}.models[{j}]", src)
    config = t.get("config", {})
    if not isinstance(config, dict):
        raise ConfigError(f"{src}: {where}.config must be a table of daemon config sections")
    if "models" in config:
        raise ConfigError(f"{src}: {where}.config.models: give models in {where}.models")
    node = NodeDef(name=name, region=region, labels=tuple(sorted(labels.items())),
                   max_decode_tokens_per_s=speed, models=tuple(copy.deepcopy(m) for m in models),
                   config=copy.deepcopy(config))
    # the daemon's own parser checks every model and config key now, not when the node starts
    parse_config({**node.daemon_config(), "models": node.daemon_models()}, f"{src} {where}")
    return node


def parse_scenario(data: dict[str, Any], src: str = "<scenario>") -> Scenario:
    _keys(data, _TOP_KEYS, "the top level", src)
    regions_t = data.get("regions")
    if not isinstance(regions_t, dict) or not regions_t:
        raise ConfigError(f"{src}: [regions] must name at least one region ([regions.NAME])")
    regions = tuple(
        Region(_name(r, f"[regions.{r}]", src), _link(body, f"[regions.{r}]", src))
        for r, body in sorted(regions_t.items())
    )
    names = {r.name for r in regions}
    links: dict[tuple[str, str], LinkSpec] = {}
    raw_links = data.get("links", [])
    if not isinstance(raw_links, list):
        raise ConfigError(f"{src}: links must be an array of tables ([[links]])")
    for i, lt in enumerate(raw_links):
        where = f"[[links]][{i}]"
        spec = _link(lt, where, src, extra=("between",))
        between = lt.get("between")
        if (not isinstance(between, list) or len(between) != 2 or between[0] == between[1]
                or not all(b in names for b in between)):
            raise ConfigError(f"{src}: {where}.between must name two different regions of [regions], "
                              f"not {between!r}")
        key = (min(between), max(between))
        if key in links:
            raise ConfigError(f"{src}: {where} repeats the link between {key[0]} and {key[1]}")
        links[key] = spec
    raw_nodes = data.get("nodes")
    if not isinstance(raw_nodes, list) or not raw_nodes:
        raise ConfigError(f"{src}: [[nodes]] must list at least one node")
    if len(raw_nodes) > MAX_NODES:
        raise ConfigError(f"{src}: at most {MAX_NODES} nodes, not {len(raw_nodes)}")
    nodes = tuple(_node(t, i, names, src) for i, t in enumerate(raw_nodes))
    seen: set[str] = set()
    for n in nodes:
        if n.name in seen:
            raise ConfigError(f"{src}: node name {n.name!r} is used twice")
        seen.add(n.name)
    used = sorted({n.region for n in nodes})
    for i, a in enumerate(used):
        for b in used[i + 1:]:
            if (a, b) not in links:
                raise ConfigError(f"{src}: no [[links]] entry between regions {a} and {b} "
                                  f"(both have nodes)")
    name = data.get("name", Path(src).stem)
    if not isinstance(name, str):
        raise ConfigError(f"{src}: name must be a string")
    desc = data.get("description", "")
    if not isinstance(desc, str):
        raise ConfigError(f"{src}: description must be a string")
    seed = data.get("seed", 1)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"{src}: seed must be an integer, not {seed!r}")
    advert = _number(data.get("advert_interval_s", 5.0), "advert_interval_s", src)
    if advert <= 0:
        raise ConfigError(f"{src}: advert_interval_s must be > 0")
    return Scenario(name=name, source=src, regions=regions,
                    links=tuple((a, b, s) for (a, b), s in sorted(links.items())),
                    nodes=nodes, advert_interval_s=advert, seed=seed, description=desc)


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ConfigError(f"cannot read scenario file {p}: {e.strerror}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{p}: not valid TOML: {e}") from None
    return parse_scenario(data, str(p))
