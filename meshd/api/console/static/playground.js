// The Playground tab: a chat through this node's own POST /v1/chat/completions (stream: true),
// the entry path every OpenAI client takes; the answer streams in and the reply's headers say
// where it was served (x-meshd-served-by, x-meshd-route), which the map then draws.
import { clear, el } from "./dom.js";
import { getJSON, postStream, sseEvents } from "./net.js";

export class Playground {
  constructor(onServed, onOpenRequest) {
    this.form = document.getElementById("chat-form");
    this.model = document.getElementById("chat-model");
    this.max = document.getElementById("chat-max");
    this.log = document.getElementById("chat-log");
    this.input = document.getElementById("chat-input");
    this.send = document.getElementById("chat-send");
    this.state = document.getElementById("chat-state");
    this.onServed = onServed;
    this.onOpenRequest = onOpenRequest;
    this.messages = [];
    this.busy = null;
    this.form.addEventListener("submit", (e) => { e.preventDefault(); this.ask(); });
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); this.ask(); }
    });
    document.getElementById("chat-clear").addEventListener("click", () => {
      this.busy?.abort();
      this.messages = [];
      clear(this.log);
    });
  }

  async loadModels() {
    try {
      const got = await getJSON("/v1/models");
      const keep = this.model.value;
      clear(this.model).append(el("option", { value: "auto", text: "auto (the tier the prompt needs)" }));
      for (const m of got.data) this.model.append(el("option", { value: m.id, text: `${m.id} (${m.meshd?.nodes ?? "?"} nodes)` }));
      if ([...this.model.options].some((o) => o.value === keep)) this.model.value = keep;
    } catch (err) {
      this.state.textContent = `cannot list models: ${err.message}`;
    }
  }

  async ask() {
    const text = this.input.value.trim();
    if (!text || this.busy) return;
    this.input.value = "";
    this.messages.push({ role: "user", content: text });
    this.log.append(el("div", { class: "msg user" }, el("p", { text })));
    const answer = el("p", { class: "answer" });
    const where = el("div", { class: "where hint", text: "routing..." });
    this.log.append(el("div", { class: "msg assistant" }, answer, where));
    this.busy = new AbortController();
    this.send.disabled = true;
    this.state.textContent = "";
    const body = {
      model: this.model.value, messages: this.messages, stream: true,
      max_tokens: Number(this.max.value) || 64,
    };
    let said = "";
    try {
      const r = await postStream("/v1/chat/completions", body, this.busy.signal);
      const rid = r.headers.get("x-request-id");
      let route = (r.headers.get("x-meshd-route") || "").split(",").filter(Boolean);
      let served = r.headers.get("x-meshd-served-by") || route[route.length - 1] || "?";
      const show = () => {
        clear(where).append(`served by ${served}`, route.length > 1 ? ` via ${route.join(" → ")}` : "",
          r.headers.get("x-meshd-cache") ? " from its semantic cache" : "", " · ",
          el("a", { href: "#", class: "request-link", "data-id": rid, text: `request ${rid}`,
            onclick: (e) => { e.preventDefault(); this.onOpenRequest(rid); } }));
        this.onServed({ names: route.length ? route : [served] });
      };
      show();
      for await (const ev of sseEvents(r)) {
        if (ev.comment && ev.comment.startsWith("route ")) { // a failover after the first tokens
          const m = /served_by=(\S+) route=(\S*)/.exec(ev.comment);
          if (m) { served = m[1]; route = m[2].split(",").filter(Boolean); show(); }
          continue;
        }
        if (!ev.data || ev.data === "[DONE]") continue;
        const chunk = JSON.parse(ev.data);
        if (chunk.error) throw new Error(chunk.error.message);
        const piece = chunk.choices?.[0]?.delta?.content;
        if (piece) { said += piece; answer.textContent = said; this.log.scrollTop = this.log.scrollHeight; }
      }
      this.messages.push({ role: "assistant", content: said });
      answer.classList.add("done");
    } catch (err) {
      if (err.name !== "AbortError") {
        answer.classList.add("error");
        answer.textContent = said || `error: ${err.message}`;
        where.textContent = said ? `stopped: ${err.message}` : "";
      }
      this.messages.pop(); // the question goes unanswered: leave it out of the next turn
    } finally {
      this.busy = null;
      this.send.disabled = false;
    }
  }
}
