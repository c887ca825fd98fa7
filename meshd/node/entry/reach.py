"""Entry step "reach" (cells on): probe other cells before routing (docs/gossip-at-scale.md).

A node with cells holds full adverts of its own cell only. Before it routes a model it asks a few
nodes of the best-looking other cells for a fresh signed advert (``meshd.node.cells.Cells.reach``:
at most one round per model per ``probe_interval_s``, in the background); their answers join the
peer table, so the route step's snapshot holds the cell's members plus the probed nodes, as the
simulator's does. A request for a model that no member of the cell serves (none that the request's residency
allows) waits for the answers (at most ``probe_wait_s``): without them the mesh would not know
a node that may serve it at all.
"""

from __future__ import annotations

from meshd.node.entry.context import EntryContext, EntryNode
from meshd.node.view import labels_allow


async def reach(ctx: EntryContext, node: EntryNode) -> None:
    cells = node.cells
    if cells is None:
        return
    # the tier step may have chosen the model (model "auto"); else the one asked, else ours
    model = ctx.model or ctx.req.model or node.runner.default_model() or ""
    if not model:
        return
    residency = ctx.req.residency
    m = node.membership
    served_here = (node.runner.get(model) is not None and labels_allow(m.labels, residency)) or any(
        x.name == model and labels_allow(e.advert.labels, residency)
        for e in m.table.live() for x in e.advert.models
    )
    await cells.reach(model, need=not served_here, residency=residency)
