// The Mesh tab: every node in a table, and the card of the node selected on the map.
import { clear, el, fmt, modelText } from "./dom.js";

const STATE_WORDS = {
  self: "this node", live: "live", stalled: "stalled (a ping went unanswered)",
  silent: "silent (no longer in the peer table)", revoked: "revoked (certificate revoked)",
};

export class MeshPanel {
  constructor(card, table, onSelect) {
    this.card = card;
    this.body = table.querySelector("tbody");
    this.onSelect = onSelect;
    this.view = null;
    this.selected = null;
    this.rows = new Map(); // peer id -> its <tr>
  }

  update(view) {
    this.view = view;
    this.render();
  }

  select(id) {
    this.selected = id;
    this.render();
  }

  render() {
    const view = this.view;
    if (!view) return;
    // rows are kept from one update to the next, like the map's nodes
    const seen = new Set();
    for (const n of view.nodes) {
      seen.add(n.id);
      let tr = this.rows.get(n.id);
      if (!tr) {
        tr = el("tr", { "data-id": n.id, onclick: () => this.onSelect(n.id) },
          ...Array.from({ length: 8 }, () => el("td")));
        this.rows.set(n.id, tr);
      }
      tr.className = `st-${n.state}${n.id === this.selected ? " selected" : ""}`;
      const cells = [
        n.name, n.state, n.group || "-", n.models.map(modelText).join(", ") || "-",
        n.slots && n.models.length ? `${n.queue_depth ?? 0} · ${n.in_flight ?? 0}/${n.slots}` : "-",
        n.decode_tps ? fmt.num(n.decode_tps, 0) : "-",
        n.state === "self" ? "-" : fmt.ms(n.rtt_measured_ms ?? n.rtt_ms),
        n.state === "self" ? "now" : n.state === "silent" ? `silent ${fmt.age(n.silent_s)}` : fmt.age(n.advert_age_s),
      ];
      cells.forEach((text, i) => { if (tr.children[i].textContent !== text) tr.children[i].textContent = text; });
      this.body.append(tr);
    }
    for (const [id, tr] of this.rows) {
      if (!seen.has(id)) { tr.remove(); this.rows.delete(id); }
    }
    const chosen = view.nodes.find((n) => n.id === this.selected);
    clear(this.card);
    if (chosen) this.card.append(nodeCard(chosen));
    else this.card.append(el("p", { class: "hint", text: `${view.nodes.length} nodes known; click one on the map or in the table.` }));
  }
}

function row(label, value) {
  return el("tr", {}, el("th", { text: label }), el("td", { text: value }));
}

export function nodeCard(n) {
  const hw = n.hardware || {};
  const rows = [
    row("state", STATE_WORDS[n.state] || n.state),
    row("peer id", n.id),
    row("region / cell", `${n.region || "-"} / ${n.cell || "-"}`),
    row("models", n.models.map(modelText).join("; ") || "none: it forwards every request"),
    row("queue", n.slots && n.models.length ? `${n.queue_depth ?? 0} waiting, ${n.in_flight ?? 0} running of ${n.slots} slots` : "-"),
    row("speed", `${fmt.num(n.decode_tps, 1)} tok/s decode, ${fmt.num(n.prefill_tps, 0)} tok/s prefill`),
  ];
  if (n.state !== "self") {
    rows.push(row("RTT", n.rtt_measured_ms != null ? `${fmt.ms(n.rtt_measured_ms)} measured`
      : `${fmt.ms(n.rtt_ms)} (${n.rtt_source || "unknown"})`));
    rows.push(row(n.state === "silent" ? "silent for" : "advert age",
      fmt.age(n.state === "silent" ? n.silent_s : n.advert_age_s)));
  }
  rows.push(row("CPU", `${hw.kind || "?"}, ${hw.cpu_cores ?? "?"} cores, load ${fmt.num(hw.cpu_load_1m, 2)}`));
  rows.push(row("memory", `${fmt.bytes(hw.memory_available_bytes)} free of ${fmt.bytes(hw.memory_total_bytes)}`));
  for (const [i, g] of (hw.gpus || []).entries()) {
    const parts = [
      `${fmt.bytes(g.memory_used_bytes)} of ${fmt.bytes(g.memory_total_bytes)} used`,
      g.temperature_c != null ? `${fmt.num(g.temperature_c, 0)} °C` : null,
      g.power_w != null ? `${fmt.num(g.power_w, 0)} W${g.power_limit_w ? ` of ${fmt.num(g.power_limit_w, 0)}` : ""}` : null,
      g.throttle.length ? `throttled: ${g.throttle.join(", ")}` : "not throttled",
    ].filter(Boolean);
    rows.push(row(`GPU ${i} ${g.name || ""}`, parts.join(", ")));
  }
  rows.push(row("power", hw.power_w != null ? `${fmt.num(hw.power_w, 0)} W` : "not measured"));
  rows.push(row("hottest zone", hw.hottest_c != null ? `${fmt.num(hw.hottest_c, 0)} °C` : "-"));
  if ((hw.throttle || []).length) rows.push(row("throttled", hw.throttle.join(", ")));
  if ((hw.failing || []).length) rows.push(row("failing readers", hw.failing.join(", ")));
  const labels = Object.entries(n.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
  if (labels) rows.push(row("labels", labels));
  return el("div", { class: `card st-${n.state}` }, el("h2", { text: n.name }), el("table", { class: "facts" }, rows));
}
