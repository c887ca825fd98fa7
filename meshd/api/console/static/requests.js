// The Requests tab: the last requests through this node as they end; a click opens the
// explanation (as `meshd explain`) and draws the route on the map.
import { clear, el, fmt } from "./dom.js";
import { getJSON } from "./net.js";

const MAX_ROWS = 200;

export class RequestList {
  constructor(table, empty, explain, onRoute) {
    this.body = table.querySelector("tbody");
    this.empty = empty;
    this.explainBox = explain;
    this.onRoute = onRoute;
    this.rows = []; // newest first
    this.selected = null;
  }

  reset(rows) {
    this.rows = rows.slice().reverse().slice(0, MAX_ROWS);
    this.render();
  }

  add(row) {
    this.rows.unshift(row);
    if (this.rows.length > MAX_ROWS) this.rows.length = MAX_ROWS;
    this.body.prepend(this.line(row));
    if (this.body.children.length > MAX_ROWS) this.body.lastElementChild.remove();
    this.empty.hidden = true;
  }

  render() {
    clear(this.body);
    for (const r of this.rows) this.body.append(this.line(r));
    this.empty.hidden = this.rows.length > 0;
  }

  line(r) {
    const tier = r.tier ? `${r.tier.tier}${r.tier.escalated ? " (up from " + r.tier.wanted + ")" : r.tier.lowered ? " (down from " + r.tier.wanted + ")" : ""}` : "-";
    return el("tr", {
      "data-id": r.id, class: `${r.outcome === "ok" ? "" : "failed"}${r.id === this.selected ? " selected" : ""}`,
      onclick: () => this.open(r.id),
    },
    el("td", { text: fmt.time(r.ts) }),
    el("td", { text: r.model || "-" }),
    el("td", { class: "route-cell", text: r.route.length ? r.route.join(" → ") : "-" }),
    el("td", { text: r.strategy || "-" }),
    el("td", { text: fmt.ms(r.ttft_ms) }),
    el("td", { text: r.tokens_per_s != null ? fmt.num(r.tokens_per_s, 1) : "-" }),
    el("td", { text: r.cache || "-" }),
    el("td", { text: tier }),
    el("td", { text: r.outcome }));
  }

  async open(id) {
    this.selected = id;
    for (const tr of this.body.children) tr.classList.toggle("selected", tr.dataset.id === id);
    const row = this.rows.find((r) => r.id === id);
    if (row) this.onRoute({ names: row.route });
    clear(this.explainBox).append(el("p", { class: "hint", text: `Loading the explanation of ${id}...` }));
    try {
      const got = await getJSON(`/ui/api/requests/${encodeURIComponent(id)}`);
      if (this.selected !== id) return;
      if (got.row) this.onRoute({ names: got.row.route });
      clear(this.explainBox).append(explanation(id, got));
    } catch (err) {
      clear(this.explainBox).append(el("p", { class: "error", text: `No explanation of ${id}: ${err.message}` }));
    }
  }
}

function explanation(id, got) {
  const rec = got.record || {};
  const box = el("div", { class: "card", id: "explain-card" }, el("h2", { text: `Request ${id}` }));
  if (got.row) {
    const r = got.row;
    box.append(el("p", {}, `${r.model || "?"}: ${r.route.join(" → ") || "no route"}, served by ${r.served_by || "-"}; `,
      `strategy ${r.strategy || "-"}, time to first token ${fmt.ms(r.ttft_ms)}, ${r.tokens ?? 0} tokens`,
      r.tokens_per_s != null ? ` at ${fmt.num(r.tokens_per_s, 1)} tok/s` : "",
      `, cache ${r.cache || "not asked"}`, r.retries ? `, ${r.retries} retries` : "", r.hedges ? `, ${r.hedges} hedges` : ""));
  }
  const cands = Array.isArray(rec.candidates) ? rec.candidates : [];
  if (cands.length) {
    const chosen = rec.chosen;
    box.append(el("table", { class: "grid" },
      el("thead", {}, el("tr", {}, ["candidate", "predicted TTFT", "RTT", "queue wait", "prefill", "excluded by"].map((h) => el("th", { text: h })))),
      el("tbody", {}, cands.map((c) => el("tr", { class: c.peer_id === chosen || c.name === chosen ? "chosen" : "" },
        el("td", { text: c.name || c.peer_id }),
        el("td", { text: fmt.ms(c.predicted_ttft_ms) }),
        el("td", { text: `${fmt.ms(c.rtt_ms)}${c.rtt_source ? " " + c.rtt_source : ""}` }),
        el("td", { text: fmt.ms(c.queue_wait_ms) }),
        el("td", { text: fmt.ms(c.prefill_ms) }),
        el("td", { text: c.excluded_by || "" }))))));
  }
  if (got.text) box.append(el("pre", { class: "explain-text", text: got.text }));
  return box;
}
