// Small DOM helpers: every text goes in as text (textContent), never as HTML.
const SVG_NS = "http://www.w3.org/2000/svg";

export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  return fill(node, attrs, children);
}

export function svg(tag, attrs = {}, ...children) {
  const node = document.createElementNS(SVG_NS, tag);
  return fill(node, attrs, children);
}

function fill(node, attrs, children) {
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat()) {
    if (c === undefined || c === null || c === false) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

export function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
  return node;
}

export const fmt = {
  num(v, digits = 1) {
    return typeof v === "number" && isFinite(v) ? v.toFixed(digits) : "-";
  },
  ms(v) {
    if (typeof v !== "number" || !isFinite(v)) return "-";
    return v < 10 ? `${v.toFixed(2)} ms` : v < 1000 ? `${v.toFixed(0)} ms` : `${(v / 1000).toFixed(2)} s`;
  },
  bytes(v) {
    if (typeof v !== "number" || !isFinite(v)) return "-";
    const units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let i = 0;
    while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
    return `${v.toFixed(i ? 1 : 0)} ${units[i]}`;
  },
  age(s) {
    if (typeof s !== "number" || !isFinite(s)) return "-";
    if (s < 60) return `${s.toFixed(s < 10 ? 1 : 0)} s`;
    if (s < 3600) return `${Math.floor(s / 60)} min`;
    if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
    return `${(s / 86400).toFixed(1)} d`;
  },
  time(ts) {
    return typeof ts === "number" ? new Date(ts * 1000).toLocaleTimeString() : "-";
  },
  date(ts) {
    return typeof ts === "number" ? new Date(ts * 1000).toLocaleString() : "-";
  },
};

// 0..3: the latency class of a round-trip time, as the legend names them
export function latencyClass(ms) {
  if (typeof ms !== "number") return 3;
  return ms < 5 ? 0 : ms < 30 ? 1 : ms < 100 ? 2 : 3;
}

export function modelText(m) {
  const layers = Array.isArray(m.layers) && m.num_layers ? ` [${m.layers[0]}-${m.layers[1]} of ${m.num_layers}]` : "";
  const extra = [m.tier, m.fmt].filter(Boolean).join(" ");
  return `${m.name}${layers}${extra ? " " + extra : ""}`;
}
