// The map: nodes where the node placed them (meshd/api/console/atlas.py: Vivaldi coordinates
// projected to a plane, in the unit square), groups (cells or regions) drawn around their
// members, links coloured by RTT, and the route of the selected request drawn over them.
import { clear, fmt, latencyClass, svg } from "./dom.js";

const W = 1000;
const H = 700;
const R = 20; // node radius

export class MeshMap {
  constructor(root, onSelect) {
    this.root = root;
    this.groups = root.querySelector("#map-groups");
    this.links = root.querySelector("#map-links");
    this.routeLayer = root.querySelector("#map-route");
    this.nodes = root.querySelector("#map-nodes");
    this.onSelect = onSelect;
    this.view = null;
    this.selected = null;
    this.route = null; // {entry: peer id, names: [node names]}
    this.shapes = new Map(); // peer id -> its <g>
  }

  pos(n) {
    return [n.x * W, n.y * H];
  }

  update(view) {
    this.view = view;
    this.render();
  }

  select(id) {
    this.selected = id;
    this.render();
  }

  showRoute(route) {
    this.route = route;
    this.renderRoute();
  }

  render() {
    const view = this.view;
    if (!view) return;
    const byId = new Map(view.nodes.map((n) => [n.id, n]));
    this.renderGroups(view, byId);
    clear(this.links);
    for (const l of view.links) {
      const a = byId.get(l.a);
      const b = byId.get(l.b);
      if (!a || !b) continue;
      const [x1, y1] = this.pos(a);
      const [x2, y2] = this.pos(b);
      const cls = `link lat-${latencyClass(l.ms)}${l.measured ? " measured" : " estimated"}`;
      this.links.append(svg("line", { x1, y1, x2, y2, class: cls },
        svg("title", { text: `${a.name} - ${b.name}: ${fmt.ms(l.ms)} ${l.measured ? "measured" : "Vivaldi estimate"}` })));
      if (l.measured || view.nodes.length <= 6) {
        this.links.append(svg("text", { x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 4, class: "link-label", text: fmt.ms(l.ms) }));
      }
    }
    // nodes are kept from one update to the next (a click or a hover is never lost to a redraw)
    const seen = new Set();
    for (const n of view.nodes) {
      seen.add(n.id);
      let g = this.shapes.get(n.id);
      if (!g) {
        g = this.nodeShape(n);
        this.shapes.set(n.id, g);
      }
      this.updateShape(g, n);
      this.nodes.append(g); // in the view's order
    }
    for (const [id, g] of this.shapes) {
      if (!seen.has(id)) { g.remove(); this.shapes.delete(id); }
    }
    this.renderRoute();
  }

  renderGroups(view, byId) {
    clear(this.groups);
    for (const g of view.groups) {
      const pts = g.nodes.map((id) => byId.get(id)).filter(Boolean).map((n) => this.pos(n));
      if (!pts.length) continue;
      const x0 = Math.max(4, Math.min(...pts.map((p) => p[0])) - R * 3.2);
      const x1 = Math.min(W - 4, Math.max(...pts.map((p) => p[0])) + R * 3.2);
      const y0 = Math.max(4, Math.min(...pts.map((p) => p[1])) - R * 2.6);
      const y1 = Math.min(H - 4, Math.max(...pts.map((p) => p[1])) + R + 44);
      this.groups.append(
        svg("rect", { x: x0, y: y0, width: x1 - x0, height: y1 - y0, rx: 18, class: "group" }),
        svg("text", { x: x0 + 12, y: y0 + 18, class: "group-label", text: g.name || "(no region)" }),
      );
    }
  }

  nodeShape(n) {
    const g = svg("g", {
      "data-id": n.id, tabindex: 0,
      onclick: () => this.onSelect(n.id),
      onkeydown: (e) => { if (e.key === "Enter") this.onSelect(n.id); },
    },
    svg("title"), svg("circle", { r: R }),
    svg("path", { d: `M${-R / 2},${-R / 2} L${R / 2},${R / 2} M${R / 2},${-R / 2} L${-R / 2},${R / 2}`, class: "cross" }),
    svg("text", { y: R + 16, class: "node-name" }),
    svg("text", { y: R + 30, class: "node-sub" }));
    return g;
  }

  updateShape(g, n) {
    const [x, y] = this.pos(n);
    const load = !n.models.length ? "no model: forwards" : n.slots ? `${n.in_flight ?? 0}/${n.slots} slots` : "";
    const queued = n.queue_depth ? ` +${n.queue_depth} queued` : "";
    const speed = n.decode_tps ? ` · ${Math.round(n.decode_tps)} tok/s` : "";
    const sub = n.state === "silent" ? `silent ${fmt.age(n.silent_s)}`
      : n.state === "revoked" ? "revoked" : `${load}${queued}${speed}`;
    g.setAttribute("class", `node st-${n.state}${n.id === this.selected ? " selected" : ""}`);
    g.setAttribute("transform", `translate(${x},${y})`);
    g.setAttribute("data-name", n.name);
    g.setAttribute("data-state", n.state);
    g.querySelector("title").textContent = `${n.name} (${n.state})`;
    g.querySelector(".cross").setAttribute("visibility", n.state === "revoked" ? "visible" : "hidden");
    g.querySelector(".node-name").textContent = n.name;
    g.querySelector(".node-sub").textContent = sub;
  }

  renderRoute() {
    clear(this.routeLayer);
    const view = this.view;
    if (!view || !this.route) return;
    const byName = new Map(view.nodes.map((n) => [n.name, n]));
    const entry = view.nodes.find((n) => n.id === (this.route.entry || view.self));
    const hops = [entry, ...this.route.names.map((name) => byName.get(name))].filter(Boolean);
    for (let i = 0; i + 1 < hops.length; i += 1) {
      const [x1, y1] = this.pos(hops[i]);
      const [x2, y2] = this.pos(hops[i + 1]);
      const d = Math.hypot(x2 - x1, y2 - y1);
      if (d < 1) continue;
      const ux = (x2 - x1) / d;
      const uy = (y2 - y1) / d;
      this.routeLayer.append(svg("line", {
        x1: x1 + ux * R, y1: y1 + uy * R, x2: x2 - ux * (R + 3), y2: y2 - uy * (R + 3),
        class: "route", "marker-end": "url(#arrow)",
      }));
    }
    const served = byName.get(this.route.names[this.route.names.length - 1]);
    if (served) {
      const [x, y] = this.pos(served);
      this.routeLayer.append(svg("circle", { cx: x, cy: y, r: R + 7, class: "route-served" }));
    }
  }
}
