"""Every metric is documented in docs/metrics.md, and every metric the Grafana dashboard
(deploy/grafana/meshd.json) queries exists."""

from __future__ import annotations

import json
import re
from pathlib import Path

import trio
from prometheus_client.parser import text_string_to_metric_families

from meshd.api.metrics import Metrics
from meshd.core.request import parse_submit
from meshd.testing.fake_entry import FakeChain, FakeNode

ROOT = Path(__file__).resolve().parents[2]


def exposed() -> tuple[set[str], set[str]]:
    """(metric names as exposed, sample names) of a node that served one request."""
    chain = FakeChain()
    node = FakeNode(chain)
    metrics = Metrics(node)
    chain.observers.append(metrics.requests.observe)
    metrics.requests.http.labels("/v1/models", "200").inc()
    metrics.requests.disconnects.inc()

    async def one() -> None:
        async def emit(kind: str, payload: dict[str, object]) -> None:
            pass

        req = parse_submit({"prompt": "a b", "model": "tiny", "max_tokens": 3, "origin": "http"},
                           lambda: "r1")
        await chain.submit(req, emit)

    trio.run(one)
    names, samples = set(), set()
    for family in text_string_to_metric_families(metrics.render().decode()):
        names.add(family.name + ("_total" if family.type == "counter" else ""))
        samples.update(s.name for s in family.samples)
    return names, samples


def test_every_metric_is_documented() -> None:
    names, _ = exposed()
    doc = (ROOT / "docs" / "metrics.md").read_text()
    documented = set(re.findall(r"^\| `(meshd_[a-z_]+)`", doc, re.M))
    assert names - documented == set(), "undocumented metrics"
    assert documented - names == set(), "documented metrics that do not exist"


def test_every_metric_the_dashboard_queries_exists() -> None:
    _, samples = exposed()
    dash = json.loads((ROOT / "deploy" / "grafana" / "meshd.json").read_text())
    queried = set()
    for panel in dash["panels"]:
        for target in panel["targets"]:
            queried.update(re.findall(r"\b(meshd_[a-z_]+)", target["expr"]))
    for var in dash["templating"]["list"]:
        if isinstance(var.get("query"), dict):
            queried.update(re.findall(r"\b(meshd_[a-z_]+)", var["query"]["query"]))
    assert queried, "the dashboard queries nothing"
    assert queried - samples == set(), "the dashboard queries metrics that do not exist"
