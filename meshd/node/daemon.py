"""Assemble a node from its config and run it until SIGTERM/SIGINT: the body of `meshd run`."""

from __future__ import annotations

import dataclasses
import logging
import signal
import time
from pathlib import Path
from typing import Any

import trio

from meshd.api.server import serve_api
from meshd.config import Config
from meshd.control.server import prepare_socket_path
from meshd.errors import ConfigError, KeyFileError, ModelError
from meshd.net import speedups
from meshd.net.identity import load_identity, load_revocation_list
from meshd.net.liblog import route_libp2p_logs
from meshd.net.listen import (
    check_addresses,
    ensure_listening,
    install_exclusive_listen,
    parse_listen,
    probe_listen,
)
from meshd.node.audit import record_start, store_sink
from meshd.node.autoplace import initial_range
from meshd.node.console import ConsoleFacts
from meshd.node.engine_model import EngineModel, default_model_dir, load_engine_model
from meshd.node.hwmon import HardwareMonitor, build_monitor, host_source, kv_memory_of
from meshd.node.node import Node
from meshd.node.runner import Runner, Served
from meshd.node.sdnotify import notify
from meshd.paths import control_socket_path
from meshd.store import AsyncStore, Store
from meshd.store.retention import Retention, run_pruner
from meshd.telemetry.report import FailureReport

log = logging.getLogger(__name__)

__all__ = ["EngineModel", "build_node", "default_model_dir", "load_runner", "run_daemon"]


def load_runner(cfg: Config) -> Runner:
    runner = Runner(batching=cfg.engine.batching, fused_prefill=cfg.engine.fused_prefill)
    for m in cfg.models:
        if m.upstream:  # served by an OpenAI-compatible server (meshd/upstream)
            runner.add(upstream_served(cfg, m))
    if all(m.upstream for m in cfg.models):
        return runner  # a relay/router-only node: do not even import onnxruntime (~20 MB)
    for i, m in enumerate(cfg.models):
        if m.upstream:
            continue
        path = default_model_dir() if m.path == "default" else cfg.path(m.path)
        if not Path(path).is_dir():
            raise ConfigError(f"[[models]][{i}].path: model directory {path} does not exist")
        layers: tuple[int, int] | None = None
        if isinstance(m.layers, tuple):
            layers = (int(m.layers[0]), int(m.layers[1]))
        elif m.layers == "auto":  # [0, capacity) until the node has heard the mesh (autoplace.py)
            layers = initial_range(Path(path), m.max_layers)
        try:
            model = load_engine_model(cfg, Path(path), layers)
        except ModelError as err:  # the config names an unusable model: a config error (78)
            where = str(err) if str(path) in str(err) else f"{path}: {err}"
            raise ConfigError(f"[[models]][{i}].path: {where}") from None
        n = int(model.num_layers)
        start, end = (0, n) if layers is None else layers
        if end > n:
            raise ModelError(f"[[models]][{i}].layers: [{start}, {end}) is outside the model's {n} layers")
        name = m.name or model.manifest.name
        adapted = EngineModel(model)
        adapted.tokenizer_identity()  # hashed now, not on the event loop at the first advert
        runner.add(Served(name=name, model=adapted, layer_start=start, layer_end=end,
                          num_layers=n, max_concurrency=m.max_concurrency, max_queue=m.max_queue,
                          max_decode_tps=m.max_decode_tokens_per_s,
                          max_prefill_tps=m.max_prefill_tokens_per_s,
                          tier=m.tier or model.manifest.tier,
                          quality=m.quality or model.manifest.quality))
        log.info("model loaded name=%s layers=%d-%d provider=%s", name, start, end,
                 getattr(model, "provider", "?"))
    return runner


def upstream_served(cfg: Config, m: Any) -> Served:
    from meshd.upstream.model import UpstreamModel

    key = cfg.path(m.upstream_key_file) if m.upstream_key_file else None
    model = UpstreamModel.from_config(m, key)
    log.info("upstream model name=%s url=%s upstream_model=%s", m.name, m.upstream, m.upstream_model)
    return Served(name=m.name, model=model, layer_start=0, layer_end=1, num_layers=1,
                  max_concurrency=m.max_concurrency, max_queue=m.max_queue,
                  max_decode_tps=m.max_decode_tokens_per_s, tier=m.tier, quality=m.quality)



def preflight(cfg: Config) -> None:
    """What can be checked before anything starts, so that it fails at once, in one line, with
    exit 78: the listen and bootstrap addresses parse, each fixed listen port is free (not
    shared with a running node through SO_REUSEPORT), the control socket path is usable and
    not served by another daemon."""
    check_addresses(cfg.node.listen, cfg.node.bootstrap)
    probe_listen(cfg.node.listen)
    prepare_socket_path(control_socket_path(cfg))


def build_node(cfg: Config, config_file: str | Path | None = None) -> Node:
    route_libp2p_logs()  # libp2p's bare lines get meshd's format and a rate limit
    speedups.install()  # py-libp2p CPU fixes (yamux credit, service task lookup): see the module
    install_exclusive_listen()  # no SO_REUSEPORT: a second daemon cannot share our port
    preflight(cfg)
    keys_dir = cfg.path(".")
    identity = load_identity(
        keys_dir,
        now=time.time(),
        key_file=cfg.path(cfg.keys.identity),
        cert_file=cfg.path(cfg.keys.certificate),
        ca_file=cfg.path(cfg.keys.ca),
    )
    revocation = None
    data_dir = cfg.path(cfg.node.data_dir)
    persisted = data_dir / "revocations.bin"
    for p in ([cfg.path(cfg.keys.revocations)] if cfg.keys.revocations else []) + [persisted]:
        if p.exists():
            _, data = load_revocation_list(p, ca_public_key=identity.ca_public_key)
            revocation = data if revocation is None else revocation
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise KeyFileError(f"cannot create data_dir {data_dir}: {e.strerror}") from None
    runner = load_runner(cfg)
    monitor = hardware_monitor(cfg, runner)
    store = open_store(data_dir / "meshd.db")
    node = Node(cfg, identity, runner, store=store, revocation=revocation, monitor=monitor)
    node.attestor.audit = store_sink(store)  # refusals, revocations: the audit table
    record_start(node.attestor.audit, cfg, identity, config_file, node.attestor.revocation_list)
    return node


def hardware_monitor(cfg: Config, runner: Runner) -> HardwareMonitor:
    """The hardware monitor with its first reading taken (docs/telemetry.md)."""
    report = FailureReport()
    source, root = host_source(report)
    providers = [str(getattr(getattr(s.model, "model", None), "provider", "")) for s in runner.models.values()]
    monitor = build_monitor(report, source, root, interval_s=cfg.gossip.advert_interval_s,
                            on_reading=lambda hw: None, kv_memory=kv_memory_of(providers))
    monitor.first = dataclasses.replace(source.read(), kv_memory=monitor.kv_memory)
    return monitor


def open_store(path: Path) -> AsyncStore:
    return AsyncStore(Store(path))


async def run_daemon(node: Node) -> None:
    store = node.store
    console = ConsoleFacts(node)  # the web console's view: remembers peers from the first advert
    async with trio.open_nursery() as nursery:
        if store is not None:
            await nursery.start(store.run)
            await nursery.start(run_pruner, store, Retention.from_config(node.config.store))
        await nursery.start(node.run)
        ensure_listening(node.host, parse_listen(node.config.node.listen))
        # the HTTP API and /metrics (meshd/api); None when [api] listen = ""
        node.api_url = await nursery.start(serve_api, node, node.config, console)
        notify("READY=1")
        print(f"meshd: node {node.node_name} ready, peer id {node.peer_id}", flush=True)
        print(f"meshd: listening on {', '.join(node.addrs)}", flush=True)
        print(f"meshd: control socket {node.socket_path()}", flush=True)
        if node.api_url:
            print(f"meshd: HTTP API {node.api_url}", flush=True)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for sig in signals:
                log.warning("shutting down signal=%s", signal.Signals(sig).name)
                notify("STOPPING=1")
                break
        if store is not None:
            with trio.move_on_after(5) as scope:
                scope.shield = True
                await store.flush()
        nursery.cancel_scope.cancel()
    if store is not None:
        store.close()
