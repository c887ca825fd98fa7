// The console's page: asks for the API key once (unless the node needs none), then keeps one
// event stream open (the map at the advert rate, requests as they end) and drives the tabs.
import { MeshMap } from "./map.js";
import { MeshPanel } from "./mesh.js";
import { getJSON, key, openStream } from "./net.js";
import { NodePage } from "./node.js";
import { Playground } from "./playground.js";
import { RequestList } from "./requests.js";

const $ = (id) => document.getElementById(id);
let stopStream = null;

function select(id) {
  map.select(id);
  mesh.select(id);
}

const map = new MeshMap($("map"), (id) => { select(id); tab("mesh"); });
const mesh = new MeshPanel($("node-card"), $("node-table"), select);
const requests = new RequestList($("request-table"), $("requests-empty"), $("explain"), (route) => map.showRoute(route));
const node = new NodePage($("node-facts"));
const playground = new Playground((route) => map.showRoute(route), (rid) => { tab("requests"); requests.open(rid); });

function tab(name) {
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("on", b.dataset.tab === name);
  for (const t of document.querySelectorAll(".tab")) t.hidden = t.id !== `tab-${name}`;
  if (name === "node") node.show(); else node.hide();
  if (name === "playground") playground.loadModels();
}

for (const b of document.querySelectorAll("#tabs button")) b.addEventListener("click", () => tab(b.dataset.tab));

function linkState(state) {
  const s = $("link-state");
  s.className = `state ${state}`;
  s.textContent = { live: "live", retrying: "reconnecting...", key: "key refused" }[state] || state;
  if (state === "key") askKey("The node refused the key.");
}

function onEvent(kind, data) {
  if (kind === "mesh") {
    map.update(data);
    mesh.update(data);
    $("map-caption").textContent = `${data.nodes.length} nodes, updated ${new Date(data.t * 1000).toLocaleTimeString()} (every ${data.interval_s} s)`;
  } else if (kind === "requests") requests.reset(data);
  else if (kind === "request") requests.add(data);
}

function askKey(why) {
  stopStream?.();
  $("console").hidden = true;
  $("key-form").hidden = false;
  $("key-error").textContent = why || "";
  $("key-input").focus();
}

async function start() {
  let who;
  try {
    who = await getJSON("/ui/api/whoami");
  } catch (err) {
    $("link-state").textContent = `cannot reach the node: ${err.message}`;
    return;
  }
  if (!who.ok) {
    askKey(key.get() ? who.why : "");
    return;
  }
  $("key-form").hidden = true;
  $("console").hidden = false;
  $("node-name").textContent = who.node;
  document.title = `meshd console: ${who.node}`;
  $("who").textContent = who.auth === "none" ? "no key needed (loopback)" : `as ${who.client}`;
  $("forget-key").hidden = who.auth === "none";
  stopStream?.();
  stopStream = openStream("/ui/api/events", onEvent, linkState);
}

$("key-form").addEventListener("submit", (e) => {
  e.preventDefault();
  key.set($("key-input").value.trim());
  $("key-input").value = "";
  start();
});
$("forget-key").addEventListener("click", () => { key.forget(); askKey(""); });

start();
