// terminal.js: a terminal in the sandbox, in xterm.js (vendored, loaded by
// index.html as the globals Terminal and FitAddon). A browser cannot set a
// header on a WebSocket, so the page asks for a signed one-minute URL with
// its key (POST …/terminal/url) and opens that.

import { call } from "./api.js";
import { h, errorBox } from "./dom.js";

// The terminal open on the page, closed when the page changes.
let open = null;

export function closeTerminal() {
  if (open) { open(); open = null; }
}

export function terminalCard(base) {
  const box = h("div", { id: "terminal", class: "term" });
  const msg = h("div", { id: "terminal-msg" });
  const btn = h("button", { type: "button", id: "terminal-open", onclick: () => start() }, "Open terminal");
  const start = async () => {
    closeTerminal();
    msg.replaceChildren();
    box.replaceChildren();
    btn.disabled = true;
    let signed;
    try {
      signed = await call(base + "/terminal/url", { method: "POST" });
    } catch (e) {
      btn.disabled = false;
      msg.replaceChildren(errorBox(e));
      return;
    }
    const term = new window.Terminal({ cursorBlink: true, fontSize: 13, convertEol: false, scrollback: 2000 });
    const fit = new window.FitAddon.FitAddon();
    term.loadAddon(fit);
    term.open(box);
    fit.fit();
    const ws = new WebSocket(signed.url + "&rows=" + term.rows + "&cols=" + term.cols);
    ws.binaryType = "arraybuffer";
    const enc = new TextEncoder();
    ws.onmessage = ev => {
      if (typeof ev.data !== "string") { term.write(new Uint8Array(ev.data)); return; }
      try {
        const m = JSON.parse(ev.data);
        if (m.type === "exit") {
          term.write("\r\n[exited " + (m.signal || m.exit_code) + "]\r\n");
          box.dataset.exit = String(m.exit_code);
        }
      } catch (_) { /* not ours */ }
    };
    ws.onclose = ev => {
      btn.disabled = false;
      btn.textContent = "Open a new terminal";
      if (ev.code !== 1000) msg.replaceChildren(errorBox("The terminal closed: " + (ev.reason || "code " + ev.code)));
    };
    ws.onopen = () => { box.dataset.state = "open"; term.focus(); };
    term.onData(d => ws.readyState === WebSocket.OPEN && ws.send(enc.encode(d)));
    term.onResize(({ rows, cols }) => ws.readyState === WebSocket.OPEN && ws.send(JSON.stringify({ type: "resize", rows, cols })));
    const onWin = () => fit.fit();
    window.addEventListener("resize", onWin);
    window.dsecTerminal = term; // for tests and the console
    open = () => { window.removeEventListener("resize", onWin); ws.close(1000); term.dispose(); };
  };
  return h("div", { class: "card" }, h("h2", {}, "Terminal"),
    h("div", { class: "row" }, btn, h("span", { class: "muted" }, "a shell in the sandbox (xterm.js); it closes when you leave the page")),
    msg, box);
}
