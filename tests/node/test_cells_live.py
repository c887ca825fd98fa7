"""Cells on real daemons (separate processes) on loopback: 8 daemons in 4 cells.

Each cell is a region (``[gossip] cells = "label"``, the certificate's ``region``) of two
daemons, and each cell serves a model no other cell serves (m0..m3), so a request for another
cell's model can only be served through the summaries and the probes. Checked: every node
routes to every model of the mesh; ``meshd status --json`` shows ``cell`` and ``meshd peers
--json`` each peer's ``cell`` and ``known_by``; a revocation pushed into one cell reaches every
cell; a cell whose nodes all die leaves every node's summaries within the stated bound
(``summary_interval_s x summary_expiry_intervals`` after its last summary, plus one
maintenance tick). Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio

from meshd.core.cert import decode_certificate
from meshd.core.messages import MessageType
from meshd.testnet.children import alive, reap
from meshd.testnet.drive import ask, stream, wait_for
from meshd.testnet.drive import cli as meshd
from meshd.testnet.launcher import NodeSpec, down, up

pytestmark = pytest.mark.slow

CELLS = 4
PER_CELL = 2
SUMMARY_INTERVAL_S = 1.0
EXPIRY_INTERVALS = 3.0
FORM_DEADLINE_S = 120.0
GONE_BOUND_S = SUMMARY_INTERVAL_S * EXPIRY_INTERVALS + 1.0  # + one maintenance tick
GONE_SLACK_S = 4.0  # gossip delay and polling 6 daemons on a shared 2-core box


def status(sock: str) -> dict[str, Any] | None:
    r = ask(sock, MessageType.STATUS_REQ)
    return None if r is None else dict(r["data"])


def peers(sock: str) -> list[dict[str, Any]] | None:
    r = ask(sock, MessageType.PEERS_REQ)
    return None if r is None else list(r["peers"])


def cell_of(name: str) -> str:
    return f"r{int(name[1:]) % CELLS}"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory: pytest.TempPathFactory, tiny_model: Path) -> Iterator[dict[str, Any]]:
    d = tmp_path_factory.mktemp("cells-mesh")
    specs = []
    for i in range(CELLS * PER_CELL):
        s = NodeSpec(name=f"n{i}", region=cell_of(f"n{i}"))
        s.models = [{"path": "default", "name": f"m{i % CELLS}"}]
        s.extra = {"gossip": {"cells": "label", "summary_interval_s": SUMMARY_INTERVAL_S,
                              "summary_expiry_intervals": EXPIRY_INTERVALS, "probe_interval_s": 0.5,
                              "probe_wait_s": 10.0}}
        specs.append(s)
    index = up(d, specs, advert_interval_s=1.0, wait=False)
    try:
        socks = {n["name"]: n["socket"] for n in index["nodes"]}

        def formed() -> bool:
            for sock in socks.values():
                st = status(sock)
                if st is None or len(st["services"]["cells"].get("cells", {})) < CELLS:
                    return False
                ps = peers(sock)
                mates = {p["name"] for p in ps or [] if p["known_by"] == "advert"}
                if len(mates) < PER_CELL - 1:
                    return False
            return True

        wait_for(formed, FORM_DEADLINE_S, "every node to know its cell-mate and all 4 cells")
        yield index
    finally:
        down(d)


def sock(mesh: dict[str, Any], name: str) -> str:
    return str(next(n for n in mesh["nodes"] if n["name"] == name)["socket"])


def test_status_and_peers_show_cells(mesh: dict[str, Any]) -> None:
    for n in mesh["nodes"]:
        st = status(n["socket"])
        assert st is not None and st["cell"] == cell_of(n["name"]), st
        cells_seen = st["services"]["cells"]["cells"]
        assert set(cells_seen) == {f"r{c}" for c in range(CELLS)}
        assert cells_seen[cell_of(n["name"])]["models"].keys() == {f"m{int(n['name'][1:]) % CELLS}"}
        rows = peers(n["socket"])
        assert rows is not None
        for p in rows:
            assert p["cell"] == cell_of(p["name"]), p
            assert p["known_by"] in ("advert", "probe", "summary")
            assert (p["known_by"] == "advert") == (p["cell"] == st["cell"]), p
        assert any(p["known_by"] == "summary" for p in rows), rows
    # the CLI shows the same
    out = json.loads(meshd("peers", "--json", "--socket", sock(mesh, "n0")).stdout)
    assert {p["cell"] for p in out} >= {"r0"} and all("known_by" in p for p in out)
    assert json.loads(meshd("status", "--json", "--socket", sock(mesh, "n0")).stdout)["cell"] == "r0"
    text = meshd("peers", "--socket", sock(mesh, "n0")).stdout
    assert "KNOWN BY" in text and "summary" in text and "advert" in text, text


def test_every_node_routes_to_every_model(mesh: dict[str, Any]) -> None:
    async def one(name: str, model: str) -> tuple[str, str, dict[str, Any]]:
        with trio.fail_after(60):
            r = await stream(sock(mesh, name), {"rid": f"{name}-{model}", "prompt": "Once upon a time",
                                                "model": model, "max_tokens": 2})
        return name, model, r

    async def all_of() -> list[tuple[str, str, dict[str, Any]]]:
        out: list[tuple[str, str, dict[str, Any]]] = []
        for n in mesh["nodes"]:  # one entry node at a time, its 4 models at once
            async with trio.open_nursery() as nursery:
                for c in range(CELLS):
                    async def go(name: str = n["name"], model: str = f"m{c}") -> None:
                        out.append(await one(name, model))
                    nursery.start_soon(go)
        return out

    results = trio.run(all_of)
    assert len(results) == CELLS * PER_CELL * CELLS
    for name, model, r in results:
        assert r["ids"], (name, model, r)
        served_by = r["served"][-1]
        assert cell_of(served_by) == f"r{model[1:]}", (name, model, served_by)  # the model's cell
    probed = [status(n["socket"])["services"]["cells"] for n in mesh["nodes"]]  # type: ignore[index]
    assert all(c["probes_answered"] >= CELLS - 1 for c in probed), probed
    # its own cell's model: the cell is idle, so no other cell can beat it and nobody probes
    assert all(c["probes_skipped"] >= 1 for c in probed), probed


def test_a_revocation_pushed_in_one_cell_reaches_every_cell(mesh: dict[str, Any]) -> None:
    ca = Path(mesh["dir"]) / "ca"
    victim = next(n for n in mesh["nodes"] if n["name"] == "n7")  # cell r3
    serial = decode_certificate((Path(victim["dir"]) / "node.cert").read_bytes()).serial
    meshd("keys", "revoke", str(serial), "--dir", str(ca))
    meshd("keys", "push-revocations", "--dir", str(ca), "--socket", sock(mesh, "n0"), "--json")
    others = [n for n in mesh["nodes"] if n["name"] != "n7"]

    def everywhere() -> bool:
        for n in others:
            st = status(n["socket"])
            if st is None or st["services"]["attestation"]["revocation_version"] != 1:
                return False
        mates = peers(sock(mesh, "n3"))
        return mates is not None and all(p["name"] != "n7" for p in mates if p["known_by"] != "summary")

    wait_for(everywhere, 20, "the list to reach every cell and n3 to drop n7")
    # and no summary published since names n7 (its cell-mate n3 no longer counts it)
    wait_for(lambda: all(p["name"] != "n7" for p in peers(sock(mesh, "n0")) or [{"name": "n7"}]),
             15, "n0 to forget n7 (summaries no longer name it)")


def test_a_cell_that_loses_all_its_nodes_leaves_the_summaries(mesh: dict[str, Any]) -> None:
    dead = [n for n in mesh["nodes"] if cell_of(n["name"]) == "r2"]
    live = [n for n in mesh["nodes"] if cell_of(n["name"]) != "r2" and n["name"] != "n7"]
    for n in live:
        st = status(n["socket"])
        assert st is not None and "r2" in st["services"]["cells"]["cells"]
    t0 = time.monotonic()
    for n in dead:
        os.kill(n["pid"], signal.SIGKILL)
    for n in dead:
        wait_for(lambda n=n: not alive(n["pid"]), 10, f"{n['name']} to die")
        reap(n["pid"])
    gone_at: dict[str, float] = {}

    def gone() -> bool:
        for n in live:
            if n["name"] in gone_at:
                continue
            st = status(n["socket"])
            if st is not None and "r2" not in st["services"]["cells"]["cells"]:
                gone_at[n["name"]] = time.monotonic() - t0
        return len(gone_at) == len(live)

    wait_for(gone, GONE_BOUND_S + GONE_SLACK_S, "every live node to forget cell r2")
    assert max(gone_at.values()) <= GONE_BOUND_S + GONE_SLACK_S, gone_at
    print(f"cell r2 forgotten after {max(gone_at.values()):.1f} s (bound {GONE_BOUND_S:.0f} s + slack)")
    for n in live:  # and its model is no longer offered anywhere
        rows = peers(n["socket"]) or []
        assert all(p["cell"] != "r2" for p in rows if p["known_by"] == "summary"), rows
