"""Reading a scenario: from a TOML file, through checked tables, to a ``Scenario``.

``load_scenario`` reads a file; unknown keys and wrong types raise ``ConfigError`` naming the
key and the file. The key list lives here (docs/sim.md mirrors it). A file may start with
``base = "other.toml"``: it is read first and this file's tables are laid over it key by key
(arrays of tables are replaced whole), which is how sensitivity variants stay a few lines long.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from meshd.core.snapshot import Policy
from meshd.core.tiers import AUTO, TIERS
from meshd.errors import ConfigError
from meshd.sim.chat import mean_sizes
from meshd.sim.scenario import (
    ArrivalSpec,
    ChatSpec,
    EventSpec,
    GossipSettings,
    Hardware,
    LatencySettings,
    LengthDist,
    ModelSpec,
    NodeGroup,
    RegionSpec,
    RunSettings,
    Scenario,
    ServeSpec,
    TierSettings,
    VivaldiSettings,
    policy_fields,
)
from meshd.sim.toml_table import Table, deep_merge

PROCESSES = ("poisson", "bursty", "diurnal", "chat")
DISTS = ("fixed", "uniform", "lognormal")
ACTIONS = ("fail", "join")


def _read(path: Path, depth: int = 0) -> dict[str, Any]:
    if depth > 4:
        raise ConfigError(f"{path}: 'base' chain is too deep")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such scenario file") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}") from None
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: 'base' must be a file name")
    return deep_merge(_read(path.parent / base, depth + 1), data)


def load_scenario(path: str | Path) -> Scenario:
    """Read and check one scenario file (following its ``base`` chain)."""
    p = Path(path)
    root = Table(_read(p), "", p)
    return parse_scenario(root, p)


def scenario_from_dict(data: dict[str, Any], file: str = "<dict>") -> Scenario:
    """Build a scenario from an already-parsed TOML document (tests use this)."""
    return parse_scenario(Table(dict(data), "", Path(file)), Path(file))


def parse_scenario(root: Table, path: Path) -> Scenario:
    name = root.text("name", path.stem)
    run = _run(root.table("sim"))
    gossip = _gossip(root.table("gossip"))
    viv = _vivaldi(root.table("vivaldi"))
    hardware = _hardware(root.tables("hardware"))
    models = _models(root.tables("model"))
    regions = tuple(_region(t, hardware, models) for t in root.tables("region"))
    if not regions:
        raise ConfigError(f"{path}: a scenario needs at least one [[region]]")
    region_names = [r.name for r in regions]
    if len(set(region_names)) != len(region_names):
        raise ConfigError(f"{path}: region names must be unique")
    latency = _latency(root.table("latency"), set(region_names))
    policy = _policy(root.table("policy"))
    chat = _chat(root.table("chat"))
    arrivals = tuple(_arrival(t, set(region_names), models, chat)
                     for t in root.tables("arrivals"))
    if not arrivals:
        raise ConfigError(f"{path}: a scenario needs at least one [[arrivals]] stream")
    events = tuple(_event(t, set(region_names), hardware, models) for t in root.tables("events"))
    tiers = _tiers(root.table("tiers"))
    root.done()
    return Scenario(
        name=name,
        file=str(path),
        run=run,
        gossip=gossip,
        vivaldi=viv,
        latency=latency,
        policy=policy,
        hardware=hardware,
        models=models,
        regions=regions,
        arrivals=arrivals,
        events=events,
        tiers=tiers,
    )


def _tiers(t: Table) -> TierSettings:
    d = TierSettings()
    s = TierSettings(
        threshold=t.number("threshold", d.threshold, min_value=0.0),
        small_below=t.number("small_below", d.small_below, min_value=0.0),
        max_ttft_ms=t.number("max_ttft_ms", d.max_ttft_ms, min_value=0.001),
        scores=t.text("scores", d.scores),
    )
    if s.scores not in ("shipped", "perfect"):
        raise t.error("scores", "must be shipped or perfect")
    t.done()
    return s


def _run(t: Table) -> RunSettings:
    d = RunSettings()
    r = RunSettings(
        duration_s=t.number("duration_s", d.duration_s, min_value=0.001),
        drain_s=t.number("drain_s", d.drain_s, min_value=0.0),
        seed=t.integer("seed", d.seed),
        timeout_s=t.number("timeout_s", d.timeout_s, min_value=0.001),
        max_attempts=t.integer("max_attempts", d.max_attempts, min_value=1),
        failure_detect_s=t.number("failure_detect_s", d.failure_detect_s, min_value=0.0),
        warmup_s=t.number("warmup_s", d.warmup_s, min_value=0.0),
    )
    t.done()
    return r


def _gossip(t: Table) -> GossipSettings:
    d = GossipSettings()
    g = GossipSettings(
        advert_interval_s=t.number("advert_interval_s", d.advert_interval_s, min_value=0.01),
        early_adverts=t.flag("early_adverts", d.early_adverts),
        min_advert_gap_s=t.number("min_advert_gap_s", d.min_advert_gap_s, min_value=0.0),
        advert_settle_s=t.number("advert_settle_s", d.advert_settle_s, min_value=0.0),
        advert_delay_ms=t.range("advert_delay_ms", d.advert_delay_ms),
        advert_loss=t.number("advert_loss", d.advert_loss, min_value=0.0),
        advert_ttl_s=t.number("advert_ttl_s", d.advert_ttl_s, min_value=0.0),
        cell_size=t.integer("cell_size", d.cell_size, min_value=1),
        summary_interval_s=t.number("summary_interval_s", d.summary_interval_s, min_value=0.01),
        summary_delay_ms=t.number("summary_delay_ms", d.summary_delay_ms, min_value=0.0),
        summary_top_k=t.integer("summary_top_k", d.summary_top_k, min_value=0),
        summary_fanout=t.integer("summary_fanout", d.summary_fanout, min_value=2),
        probes=t.integer("probes", d.probes, min_value=0),
        probe_interval_s=t.number("probe_interval_s", d.probe_interval_s, min_value=0.01),
        advert_bytes=t.integer("advert_bytes", d.advert_bytes, min_value=1),
        summary_bytes=t.integer("summary_bytes", d.summary_bytes, min_value=1),
        probe_bytes=t.integer("probe_bytes", d.probe_bytes, min_value=1),
        gossip_degree=t.integer("gossip_degree", d.gossip_degree, min_value=1),
    )
    if g.advert_loss >= 1.0:
        raise t.error("advert_loss", "must be below 1")
    t.done()
    return g


def _vivaldi(t: Table) -> VivaldiSettings:
    d = VivaldiSettings()
    v = VivaldiSettings(
        mode=t.text("mode", d.mode),
        warmup_rounds=t.integer("warmup_rounds", d.warmup_rounds, min_value=0),
        measured_ttl_s=t.number("measured_ttl_s", d.measured_ttl_s, min_value=0.0),
    )
    if v.mode not in ("vivaldi", "oracle"):
        raise t.error("mode", f"must be 'vivaldi' or 'oracle', not {v.mode!r}")
    t.done()
    return v


def _latency(t: Table, regions: set[str]) -> LatencySettings:
    d = LatencySettings()
    matrix: dict[tuple[str, str], float] = {}
    m = t.table("inter_region_ms")
    for key in m.all_keys():
        a, sep, b = key.partition("/")
        if not sep or a not in regions or b not in regions or a == b:
            raise m.error(key, "must be 'regionA/regionB' naming two different regions")
        ms = m.number(key, min_value=0.0)
        matrix[(a, b)] = matrix[(b, a)] = ms
    m.done()
    lat = LatencySettings(
        intra_region_ms=t.range("intra_region_ms", d.intra_region_ms),
        access_ms=t.range("access_ms", d.access_ms),
        jitter_ms=t.number("jitter_ms", d.jitter_ms, min_value=0.0),
        default_inter_region_ms=t.number(
            "default_inter_region_ms", d.default_inter_region_ms, min_value=0.0
        ),
        inter_region_ms=matrix,
    )
    t.done()
    return lat


def _policy(t: Table) -> Policy:
    kwargs: dict[str, Any] = {}
    fields = policy_fields()
    for key in t.all_keys():
        if key not in fields:
            raise ConfigError(f"{t.file}: unknown key 'policy.{key}'")
        default = getattr(Policy(), key)
        if isinstance(default, bool):
            kwargs[key] = t.flag(key)
        elif isinstance(default, int):
            kwargs[key] = t.integer(key)
        elif isinstance(default, float):
            kwargs[key] = t.number(key)
        elif isinstance(default, frozenset):
            kwargs[key] = frozenset(t.str_list(key))
        elif isinstance(default, str):
            kwargs[key] = t.text(key)
        elif isinstance(default, dict):
            sub = t.table(key)
            kwargs[key] = {k: sub.integer(k) for k in sub.all_keys()}
        else:
            raise t.error(key, "cannot be set from a scenario")
    return Policy(**kwargs)


def _hardware(tables: list[Table]) -> dict[str, Hardware]:
    out: dict[str, Hardware] = {}
    for t in tables:
        hw = Hardware(
            name=t.text("name"),
            prefill_tps=t.number("prefill_tps", min_value=0.001),
            decode_tps=t.number("decode_tps", min_value=0.001),
            concurrency=t.integer("concurrency", 1, min_value=1),
            max_queue=t.integer("max_queue", 64, min_value=0),
            cost_per_hour=t.number("cost_per_hour", 0.0, min_value=0.0),
            power_w=t.number("power_w", 0.0, min_value=0.0),
            batch_tps=_batch_tps(t),
            prefix_cache_tokens=t.integer("prefix_cache_tokens", 0, min_value=0),
            keep_answers=t.flag("keep_answers", True),
        )
        if hw.name in out:
            raise t.error("name", f"repeats hardware class {hw.name!r}")
        t.done()
        out[hw.name] = hw
    if not out:
        raise ConfigError("a scenario needs at least one [[hardware]] class")
    return out


def _batch_tps(t: Table) -> tuple[float, ...]:
    raw = t.raw("batch_tps", [])
    if not isinstance(raw, list) or len(raw) > 12 or not all(
            isinstance(x, int | float) and not isinstance(x, bool) and x >= 0 for x in raw):
        raise t.error("batch_tps", "must be a list of at most 12 speeds >= 0 (tokens/s at "
                      "batch 1, 2, 4, ...)")
    return tuple(float(x) for x in raw)


def _models(tables: list[Table]) -> dict[str, ModelSpec]:
    out: dict[str, ModelSpec] = {}
    for t in tables:
        m = ModelSpec(name=t.text("name"), num_layers=t.integer("num_layers", min_value=1),
                      tier=t.text("tier", ""), quality=t.number("quality", 0.0, min_value=0.0),
                      context_length=t.integer("context_length", 0, min_value=0))
        if m.tier and m.tier not in TIERS:
            raise t.error("tier", f"must be one of {', '.join(TIERS)}, not {m.tier!r}")
        if m.name in out:
            raise t.error("name", f"repeats model {m.name!r}")
        t.done()
        out[m.name] = m
    if not out:
        raise ConfigError("a scenario needs at least one [[model]]")
    return out


def parse_serve(t: Table, key: str, item: str, models: dict[str, ModelSpec]) -> ServeSpec:
    """``"model"`` (whole) or ``"model:START-END"`` (layers START..END-1)."""
    name, sep, rng = item.partition(":")
    if name not in models:
        raise t.error(key, f"names unknown model {name!r}")
    n = models[name].num_layers
    if not sep:
        return ServeSpec(name, 0, n)
    lo, dash, hi = rng.partition("-")
    try:
        start, end = int(lo), int(hi)
    except ValueError:
        start, end = -1, -1
    if not dash or not 0 <= start < end <= n:
        raise t.error(key, f"has bad layer range {item!r} (want 'model:START-END', END <= {n})")
    return ServeSpec(name, start, end)


def _region(t: Table, hardware: dict[str, Hardware], models: dict[str, ModelSpec]) -> RegionSpec:
    name = t.text("name")
    groups = []
    for g in t.tables("nodes"):
        hw = g.text("hardware")
        if hw not in hardware:
            raise g.error("hardware", f"names unknown hardware class {hw!r}")
        serve = tuple(parse_serve(g, "serve", s, models) for s in g.str_list("serve"))
        if not serve:
            raise g.error("serve", "must name at least one model")
        groups.append(
            NodeGroup(
                hardware=hw,
                count=g.integer("count", min_value=0),
                serve=serve,
                labels=frozenset(g.str_list("labels", ())),
            )
        )
        g.done()
    t.done()
    return RegionSpec(name=name, groups=tuple(groups))


def _length(t: Table) -> LengthDist:
    dist = t.text("dist")
    if dist not in DISTS:
        raise t.error("dist", f"must be one of {', '.join(DISTS)}, not {dist!r}")
    d = LengthDist(
        dist=dist,
        mean=t.number("mean", 0.0, min_value=0.0),
        sigma=t.number("sigma", 0.0, min_value=0.0),
        low=t.integer("min", 1, min_value=1),
        high=t.integer("max", 1 << 20, min_value=1),
    )
    if d.low > d.high:
        raise t.error("min", "must not exceed max")
    if dist != "uniform" and d.mean < 1:
        raise t.error("mean", "must be at least 1")
    t.done()
    return d


def _chat(t: Table) -> ChatSpec:
    """``[chat]``: the conversations of ``process = "chat"`` streams (meshd.sim.chat)."""
    d = ChatSpec()
    c = ChatSpec(
        mean_turns=t.number("mean_turns", d.mean_turns, min_value=1.0),
        user_tokens=_length(t.table("user_tokens")) if t.has("user_tokens") else d.user_tokens,
        answer_tokens=(_length(t.table("answer_tokens")) if t.has("answer_tokens")
                       else d.answer_tokens),
        system_tokens=(_length(t.table("system_tokens")) if t.has("system_tokens")
                       else d.system_tokens),
        shared_prompts=t.integer("shared_prompts", d.shared_prompts, min_value=0),
        shared_share=t.number("shared_share", d.shared_share, min_value=0.0),
        think_s=t.number("think_s", d.think_s, min_value=0.001),
        answer_tps=t.number("answer_tps", d.answer_tps, min_value=0.001),
        context_tokens=t.integer("context_tokens", d.context_tokens, min_value=2),
    )
    if c.shared_share > 1.0:
        raise t.error("shared_share", "must be between 0 and 1")
    t.done()
    return c


def _arrival(t: Table, regions: set[str], models: dict[str, ModelSpec],
             chat: ChatSpec) -> ArrivalSpec:
    d = ArrivalSpec("", "", "poisson", 0.0, LengthDist("fixed", 1), LengthDist("fixed", 1))
    region = t.text("region")
    if region != "*" and region not in regions:
        raise t.error("region", f"names unknown region {region!r}")
    model = t.text("model")
    if model == AUTO and not any(m.tier for m in models.values()):
        raise t.error("model", "is auto, but no [[model]] has a tier")
    if model not in models and model != AUTO:
        raise t.error("model", f"names unknown model {model!r}")
    process = t.text("process", "poisson")
    if process not in PROCESSES:
        raise t.error("process", f"must be one of {', '.join(PROCESSES)}, not {process!r}")
    if process == "chat":
        if region == "*" or model == AUTO:
            raise t.error("process", "chat needs one region and one model (not '*' or auto)")
        for key in ("prompt_tokens", "output_tokens"):
            if t.has(key):
                raise t.error(key, "is drawn by the chat workload ([chat]), not given")
        # the requests' mean sizes, for capacity and summaries (meshd.sim.chat)
        prompt, output = mean_sizes(chat)
        sizes = (LengthDist("fixed", mean=prompt), LengthDist("fixed", mean=output))
    else:
        sizes = (_length(t.table("prompt_tokens")), _length(t.table("output_tokens")))
    a = ArrivalSpec(
        region=region,
        model=model,
        process=process,
        rate_per_s=t.number("rate_per_s", min_value=0.0),
        prompt_tokens=sizes[0],
        output_tokens=sizes[1],
        chat=chat if process == "chat" else None,
        residency=t.text("residency", None),
        complex_share=t.number("complex_share", 0.0, min_value=0.0),
        burst_factor=t.number("burst_factor", d.burst_factor, min_value=1.0),
        burst_mean_s=t.number("burst_mean_s", d.burst_mean_s, min_value=0.001),
        calm_mean_s=t.number("calm_mean_s", d.calm_mean_s, min_value=0.001),
        period_s=t.number("period_s", d.period_s, min_value=0.001),
        amplitude=t.number("amplitude", d.amplitude, min_value=0.0),
        phase_s=t.number("phase_s", d.phase_s),
    )
    if a.amplitude > 1.0:
        raise t.error("amplitude", "must be between 0 and 1")
    t.done()
    return a


def _event(
    t: Table, regions: set[str], hardware: dict[str, Hardware], models: dict[str, ModelSpec]
) -> EventSpec:
    action = t.text("action")
    if action not in ACTIONS:
        raise t.error("action", f"must be one of {', '.join(ACTIONS)}, not {action!r}")
    region = t.text("region", None)
    if region is not None and region not in regions:
        raise t.error("region", f"names unknown region {region!r}")
    hw = t.text("hardware", None)
    if hw is not None and hw not in hardware:
        raise t.error("hardware", f"names unknown hardware class {hw!r}")
    serve = tuple(parse_serve(t, "serve", s, models) for s in t.str_list("serve", ()))
    e = EventSpec(
        at_s=t.number("at_s", min_value=0.0),
        action=action,
        fraction=t.number("fraction", 0.0, min_value=0.0),
        count=t.integer("count", 0, min_value=0),
        region=region,
        hardware=hw,
        serve=serve,
    )
    if e.fraction > 1.0:
        raise t.error("fraction", "must be between 0 and 1")
    if action == "join" and (hw is None or region is None or not serve or e.count < 1):
        raise ConfigError(
            f"{t.file}: '{t.where}' a join needs region, hardware, serve and count >= 1"
        )
    if action == "fail" and e.count == 0 and e.fraction == 0.0:
        raise ConfigError(f"{t.file}: '{t.where}' a fail needs count or fraction")
    t.done()
    return e
