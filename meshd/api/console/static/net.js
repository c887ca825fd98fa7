// Calls to this node: the API key (kept in sessionStorage, sent as a bearer header), JSON reads
// and server-sent events read from fetch (EventSource cannot send the header).
const KEY = "meshd-console-key";

export const key = {
  get: () => sessionStorage.getItem(KEY),
  set: (k) => sessionStorage.setItem(KEY, k),
  forget: () => sessionStorage.removeItem(KEY),
};

export class HttpError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export function headers(extra = {}) {
  const h = { ...extra };
  const k = key.get();
  if (k) h.Authorization = `Bearer ${k}`;
  return h;
}

async function errorOf(response) {
  try {
    const body = await response.json();
    return new HttpError(response.status, body?.error?.message || response.statusText);
  } catch {
    return new HttpError(response.status, response.statusText || `HTTP ${response.status}`);
  }
}

export async function getJSON(path, signal) {
  const r = await fetch(path, { headers: headers(), cache: "no-store", signal });
  if (!r.ok) throw await errorOf(r);
  return r.json();
}

export async function postStream(path, body, signal) {
  const r = await fetch(path, {
    method: "POST", signal, cache: "no-store",
    headers: headers({ "content-type": "application/json", accept: "text/event-stream" }),
    body: JSON.stringify(body),
  });
  if (!r.ok) throw await errorOf(r);
  return r;
}

// The events of a text/event-stream response, as {event, data, comment}: data lines joined
// with "\n", a comment line (": ...") as its own item.
export async function* sseEvents(response) {
  const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += value;
    let cut;
    while ((cut = buffer.search(/\r?\n\r?\n/)) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut).replace(/^\r?\n\r?\n/, "");
      let event = "message";
      const data = [];
      for (const line of block.split(/\r?\n/)) {
        if (line.startsWith(":")) yield { comment: line.slice(1).trim() };
        else if (line.startsWith("event:")) event = line.slice(6).trim();
        else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
      }
      if (data.length) yield { event, data: data.join("\n") };
    }
  }
}

// Keep one event stream open, reconnecting with backoff; onState("live" | "retrying" | "key").
export function openStream(path, onEvent, onState) {
  let stopped = false;
  let controller = null;
  (async () => {
    let wait = 1000;
    while (!stopped) {
      controller = new AbortController();
      try {
        const r = await fetch(path, {
          headers: headers({ accept: "text/event-stream" }), cache: "no-store",
          signal: controller.signal,
        });
        if (r.status === 401) { onState("key"); return; }
        if (!r.ok) throw await errorOf(r);
        onState("live");
        wait = 1000;
        for await (const ev of sseEvents(r)) {
          if (ev.data !== undefined) onEvent(ev.event, JSON.parse(ev.data));
        }
      } catch (err) {
        if (stopped) return;
      }
      onState("retrying");
      await new Promise((done) => setTimeout(done, wait));
      wait = Math.min(wait * 2, 15000);
    }
  })();
  return () => { stopped = true; controller?.abort(); };
}
