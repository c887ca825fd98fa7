// The Node tab: this node's identity and certificate, its status, configuration, the audit
// trail's latest events and its Prometheus metrics in words. Read while the tab is open.
import { clear, el, fmt } from "./dom.js";
import { getJSON } from "./net.js";

const REFRESH_MS = 10000;

export class NodePage {
  constructor(box) {
    this.box = box;
    this.timer = null;
  }

  show() {
    this.load();
    clearInterval(this.timer);
    this.timer = setInterval(() => this.load(), REFRESH_MS);
  }

  hide() {
    clearInterval(this.timer);
    this.timer = null;
  }

  async load() {
    try {
      const [node, metrics] = await Promise.all([getJSON("/ui/api/node"), getJSON("/ui/api/metrics")]);
      clear(this.box).append(...render(node, metrics.metrics));
    } catch (err) {
      clear(this.box).append(el("p", { class: "error", text: `cannot read the node: ${err.message}` }));
    }
  }
}

function facts(rows) {
  return el("table", { class: "facts" }, rows.map(([k, v]) => el("tr", {}, el("th", { text: k }), el("td", { text: v }))));
}

function render(node, metrics) {
  const id = node.identity;
  const cert = id.certificate;
  const st = node.status;
  const left = cert.not_after - node.now;
  const expiry = left < 0 ? `EXPIRED ${fmt.age(-left)} ago` : `in ${fmt.age(left)}`;
  const out = [
    el("h2", { text: `${id.name}` }),
    facts([
      ["peer id", id.peer_id],
      ["addresses", id.addrs.join(" ") || "-"],
      ["certificate", `serial ${cert.serial}, CA key ${cert.ca_key_id}`],
      ["roles", cert.roles.join(", ") || "-"],
      ["labels", Object.entries(cert.labels).map(([k, v]) => `${k}=${v}`).join(", ") || "-"],
      ["valid", `${fmt.date(cert.not_before)} to ${fmt.date(cert.not_after)} (expires ${expiry})`],
      ["uptime", fmt.age(st.uptime_s)],
      ["peers", String(st.peers)],
      ["queue", `${st.queue_depth} waiting, ${st.in_flight} running`],
      ["strategy", st.strategy],
      ["API", st.api_url || "-"],
      ...(st.models || []).map((m) => [`model ${m.model}`,
        `layers ${m.layers[0]}-${m.layers[1]} of ${m.num_layers}: served ${m.served}, failed ${m.failed}, busy ${m.busy_refusals}, decode ${fmt.num(m.decode_tps, 1)} tok/s`]),
    ]),
    el("h3", { text: "Configuration (keys set away from their defaults, and the main ones)" }),
  ];
  for (const sec of node.config) {
    out.push(el("table", { class: "facts config" },
      el("caption", { text: `[${sec.section}]` }),
      sec.keys.map((k) => el("tr", { class: k.default ? "default" : "set" },
        el("th", { text: k.key }), el("td", { text: JSON.stringify(k.value) })))));
  }
  out.push(el("h3", { text: "Audit trail (latest first)" }));
  if (!node.audit.length) out.push(el("p", { class: "hint", text: "no audit events" }));
  else {
    out.push(el("table", { class: "grid" },
      el("thead", {}, el("tr", {}, ["time", "kind", "peer", "reason", "detail"].map((h) => el("th", { text: h })))),
      el("tbody", {}, node.audit.map((e) => el("tr", {},
        el("td", { text: fmt.date(e.ts) }), el("td", { text: e.kind }),
        el("td", { text: e.peer_id ? `${e.peer_id.slice(0, 8)}..${e.peer_id.slice(-6)}` : "-" }),
        el("td", { text: e.reason || "" }),
        el("td", { class: "detail", text: typeof e.detail === "object" && e.detail ? Object.entries(e.detail).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`).join(" ") : String(e.detail || "") }))))));
  }
  out.push(el("h3", { text: "Metrics (what /metrics says, in words)" }));
  const list = el("dl", { class: "metrics" });
  for (const m of metrics) {
    list.append(el("dt", { text: m.what }, el("code", { text: ` ${m.name}` })));
    for (const v of m.values) list.append(el("dd", { text: v.labels ? `${v.said} (${v.labels})` : v.said }));
  }
  out.push(list);
  return out;
}
