// live.js: a sandbox's background processes with their output followed
// live, and the screen of a sandbox that has one.

import { call, key, q } from "./api.js";
import { h, badge, errorBox, when } from "./dom.js";

// Stoppers of what the page keeps running (streams, timers).
const running = new Set();
export function stopLive() {
  for (const stop of running) stop();
  running.clear();
}

// followStream reads GET …/processes/{pid}/output?stream=S&follow=1, the
// stream's raw bytes as they come, into out until the stream ends (the
// process exited) or the page changes.
async function followStream(base, pid, stream, out, signal) {
  const resp = await fetch(base + "/processes/" + encodeURIComponent(pid) + "/output" + q({ stream, follow: 1 }), {
    headers: { "Authorization": "Bearer " + key() }, signal
  });
  if (!resp.ok) {
    let m = "HTTP " + resp.status;
    try { m = (await resp.json()).error.message; } catch (_) { /* not JSON */ }
    throw new Error(stream + ": " + m);
  }
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    const text = dec.decode(value, { stream: true });
    out.append(stream === "stderr" ? h("span", { class: "stderrtext" }, text) : text);
    out.scrollTop = out.scrollHeight;
  }
}

// follow follows both streams of a process into out, then shows how it
// exited.
async function follow(base, pid, out, status) {
  const ctl = new AbortController();
  const stop = () => ctl.abort();
  running.add(stop);
  status.replaceChildren(badge("following"));
  try {
    await Promise.all(["stdout", "stderr"].map(st => followStream(base, pid, st, out, ctl.signal)));
    const p = await call(base + "/processes/" + encodeURIComponent(pid));
    status.replaceChildren(p.running ? badge("stream ended")
      : h("span", { "data-test": "proc-exit" }, "exit " + (p.result?.signal || p.result?.exit_code)));
  } catch (e) {
    if (e.name !== "AbortError") status.replaceChildren(errorBox(e));
  } finally {
    running.delete(stop);
  }
}

export function processesCard(base) {
  const list = h("div", { id: "processes" });
  const out = h("pre", { id: "proc-out", class: "follow" });
  const head = h("div", { class: "row" });
  const status = h("span", { id: "proc-status" });
  const load = async () => {
    try {
      const r = await call(base + "/processes");
      const procs = (r.processes || []).slice().reverse();
      list.replaceChildren(procs.length ? h("table", {}, h("tbody", {}, procs.map(p => h("tr", { "data-test": "proc-row", "data-id": p.id },
        h("td", { class: "mono" }, p.id), h("td", {}, p.tag || ""), h("td", {}, p.running ? badge("running") : badge("exited " + (p.result?.exit_code ?? ""))),
        h("td", {}, when(p.started_at)),
        h("td", {}, h("button", {
          type: "button", class: "secondary", "data-follow": p.id, onclick: () => {
            stopLive();
            out.replaceChildren();
            head.replaceChildren(h("b", { class: "mono" }, p.id), status);
            follow(base, p.id, out, status).then(() => { if (out.isConnected) load(); });
          }
        }, "Follow output"))))))
        : h("p", { class: "muted" }, "No background processes (run one with “in the background” above)."));
    } catch (e) { list.replaceChildren(errorBox(e)); }
  };
  queueMicrotask(load);
  return h("div", { class: "card" }, h("h2", {}, "Processes"),
    h("div", { class: "row" }, h("button", { type: "button", class: "secondary", id: "proc-reload", onclick: load }, "Reload")),
    list, head, out);
}

// screenCard shows the screen (GET …/screen, PNG) about once a second. A
// click on the image clicks there; the text box types its text and Enter.
export function screenCard(base, display) {
  const img = h("img", { id: "screen", class: "screen", alt: "the sandbox's screen" });
  const msg = h("div", { id: "screen-msg" });
  const text = h("input", { id: "screen-text", class: "mono", placeholder: "text to type, then Enter", size: 40, autocomplete: "off" });
  let url = "", stopped = false, timer = 0;
  const input = actions => call(base + "/input", { method: "POST", body: { actions } })
    .then(() => msg.replaceChildren(), e => msg.replaceChildren(errorBox(e)));
  const tick = async () => {
    try {
      const resp = await fetch(base + "/screen", { headers: { "Authorization": "Bearer " + key() } });
      if (!resp.ok) {
        let m = "HTTP " + resp.status;
        try { m = (await resp.json()).error.message; } catch (_) { /* not JSON */ }
        throw new Error("screen: " + m);
      }
      const blob = await resp.blob();
      if (stopped) return;
      const next = URL.createObjectURL(blob);
      // Swapped in once decoded, so the image never shows a blank frame.
      const pre = new Image();
      pre.src = next;
      await pre.decode();
      if (stopped) { URL.revokeObjectURL(next); return; }
      img.src = next;
      if (url) URL.revokeObjectURL(url);
      url = next;
      img.dataset.frames = String(Number(img.dataset.frames || 0) + 1);
      if (msg.querySelector("[data-screen]")) msg.replaceChildren();
    } catch (e) { msg.replaceChildren(h("div", { "data-screen": "" }, errorBox(e))); }
    if (!stopped) timer = setTimeout(tick, 1000);
  };
  const stop = () => { stopped = true; clearTimeout(timer); if (url) URL.revokeObjectURL(url); };
  running.add(stop);
  queueMicrotask(tick);
  img.addEventListener("click", ev => {
    if (!img.naturalWidth) return; // no frame yet
    const r = img.getBoundingClientRect();
    const clamp = (v, n) => Math.min(n - 1, Math.max(0, Math.floor(v)));
    const x = clamp((ev.clientX - r.left) * img.naturalWidth / r.width, img.naturalWidth);
    const y = clamp((ev.clientY - r.top) * img.naturalHeight / r.height, img.naturalHeight);
    input([{ type: "click", x, y }]);
  });
  return h("div", { class: "card", id: "screen-card" }, h("h2", {}, "Screen" + (display ? " (" + display.width + "×" + display.height + ")" : "")),
    h("form", {
      class: "row", id: "screen-type", onsubmit: ev => {
        ev.preventDefault();
        const actions = [{ type: "key", keys: "Return" }];
        if (text.value) actions.unshift({ type: "type", text: text.value });
        input(actions);
        text.value = "";
      }
    }, text, h("button", { type: "submit" }, "Type + Enter"),
      h("span", { class: "muted" }, "click the image to click there; refreshed every second")),
    msg, img);
}

// screenSlot is the screen card of a running sandbox with a display. A
// sandbox's display can come up after the page is drawn (a desktop
// toolkit's X server starts with the sandbox and again after a reset): for
// a while, the slot asks again every 2 s and shows the card once there is
// a display.
export function screenSlot(base, s) {
  if (s.display) return screenCard(base, s.display);
  const slot = h("div", { id: "screen-slot", hidden: true });
  let stopped = false, timer = 0;
  const until = Date.now() + 30000;
  const look = async () => {
    try {
      const now = await call(base);
      if (stopped) return;
      if (now.state === "running" && now.display) {
        slot.replaceWith(screenCard(base, now.display));
        return;
      }
    } catch (_) { /* the page shows the sandbox's errors */ }
    if (!stopped && Date.now() < until) timer = setTimeout(look, 2000);
  };
  const stop = () => { stopped = true; clearTimeout(timer); };
  running.add(stop);
  timer = setTimeout(look, 2000);
  return slot;
}
