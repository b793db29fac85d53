// app.js: the dashboard's router and pages. Every page reads the /v1 API
// with the signed-in key; nothing is cached beyond the page on screen.

import { call, key, setKey, clearKey, whoami, q } from "./api.js";
import { h, badge, errorBox, bar, fmt, bytes, when } from "./dom.js";
import { terminalCard, closeTerminal } from "./terminal.js";
import { processesCard, screenSlot, stopLive } from "./live.js";

const main = document.getElementById("main");
const session = { admin: null }; // learnt from GET /v1/nodes after sign-in
let flash = ""; // the outcome of an action, shown once on the page it re-renders
let refreshTimer = 0; // the overview's next refresh

function route() {
  const raw = location.hash.replace(/^#\/?/, "");
  const [path, query] = raw.split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  return { name: parts[0] || "overview", args: parts.slice(1), params: new URLSearchParams(query || "") };
}

function go(hash) { location.hash = hash; }

async function render() {
  const r = route();
  clearTimeout(refreshTimer);
  closeTerminal();
  stopLive();
  if (!key() && r.name !== "signin") return go("#/signin");
  document.getElementById("top").hidden = r.name === "signin";
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === r.name);
  const page = pages[r.name] || notFound;
  main.replaceChildren(h("p", { class: "muted" }, "Loading…"));
  try {
    if (r.name !== "signin" && session.admin === null) {
      const me = await whoami();
      session.admin = me.admin;
    }
    for (const el of document.querySelectorAll(".admin-only")) el.hidden = !session.admin;
    document.getElementById("who").textContent = session.admin ? "admin key" : (session.admin === false ? "tenant key" : "");
    const content = await page(r);
    if (route().name === r.name) main.replaceChildren(...[].concat(content));
  } catch (e) {
    if (e.status === 401) return; // call() has sent us to sign-in
    main.replaceChildren(errorBox(e));
  }
}

// ---- sign-in ---------------------------------------------------------------

function signin(r) {
  const input = h("input", { type: "password", id: "key", placeholder: "dsec_…", autocomplete: "off", required: true });
  const msg = h("div");
  if (r.params.get("expired")) msg.append(errorBox("The key was refused (unknown, revoked or malformed). Sign in again."));
  const form = h("form", {
    class: "card signin", id: "signin", onsubmit: async ev => {
      ev.preventDefault();
      setKey(input.value.trim());
      session.admin = null;
      try {
        session.admin = (await whoami()).admin;
        go("#/overview");
      } catch (e) {
        // A 401 also sends us to #/signin?expired=1; say it here in case
        // the hash was that already.
        msg.replaceChildren(errorBox(e.status === 401 ? "The key was refused (unknown, revoked or malformed)." : e));
      }
    }
  },
    h("h1", {}, "Sign in to dsec"),
    h("p", { class: "muted" }, "Paste an API key. It is kept in this browser tab only (sessionStorage)."),
    input, msg, h("button", { type: "submit" }, "Sign in"));
  return form;
}

// ---- overview ----------------------------------------------------------------

function kpis(title, counts) {
  const entries = Object.entries(counts).sort();
  return h("div", { class: "card" }, h("h2", {}, title),
    h("div", { class: "kpis" }, entries.length ? entries.map(([k, v]) =>
      h("div", { class: "kpi", "data-test": "count-" + k }, h("b", {}, fmt(v)), badge(k))) : h("span", { class: "muted" }, "none")));
}

function nodeCard(n) {
  const c = n.capacity || {}, lim = n.limit || c, a = n.allocated || {}, l = n.load || {};
  return h("div", { class: "card node", "data-test": "node", "data-id": n.id },
    h("div", { class: "row" }, h("b", {}, n.id), badge(n.state), n.pool ? badge("pool " + n.pool) : null,
      h("span", { class: "muted" }, (n.backends || []).join(", "))),
    bar("CPU allocated (of cores × overcommit)", a.cpu || 0, lim.cpu || 0, l.sandbox_cpu),
    bar("CPU busy (of cores)", l.cpu || 0, c.cpu || 0, null),
    bar("Memory allocated", a.memory_mb || 0, lim.memory_mb || c.memory_mb || 0, l.memory_mb, " MiB"),
    h("div", { class: "muted" }, fmt(n.sandboxes || 0) + " sandboxes · " + fmt(n.cached_layers || 0) +
      " cached layers · last seen " + when(n.last_seen)));
}

// chart draws one rate of GET /v1/stats as a small SVG line over the hour.
function chart(title, samples, field) {
  const NS = "http://www.w3.org/2000/svg", W = 300, H = 60;
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
  svg.setAttribute("class", "chart");
  const vals = samples.map(x => x[field] || 0);
  const top = Math.max(...vals, 0.1);
  if (vals.length > 1) {
    const line = document.createElementNS(NS, "polyline");
    line.setAttribute("points", vals.map((v, i) => `${(i * W / (vals.length - 1)).toFixed(1)},${(H - 2 - v * (H - 4) / top).toFixed(1)}`).join(" "));
    svg.append(line);
  }
  const now = vals.length ? vals[vals.length - 1] : 0;
  return h("div", { class: "card", "data-test": "chart-" + field }, h("div", { class: "barlabel" }, h("span", {}, title),
    h("span", {}, "now " + fmt(now) + "/s · max " + fmt(Math.max(...vals, 0)) + "/s")), svg,
    vals.length < 2 ? h("div", { class: "muted" }, "collecting (a sample every 10 s)…") : null);
}

// overview is the cluster at a glance; it refreshes itself every 10 s
// (#/overview?every=N: N s) while on screen, with four calls, none of
// which lists sandboxes.
const OVERVIEW_REFRESH_MS = 10000;

async function overview() {
  const n = Number(route().params.get("every"));
  const every = n >= 1 ? n * 1000 : OVERVIEW_REFRESH_MS;
  const started = performance.now();
  const out = [h("h1", {}, "Overview")];
  if (session.admin) {
    const { nodes } = await call("/v1/nodes");
    out.push(h("h2", {}, "Nodes (" + nodes.length + ")"),
      h("div", { class: "grid", id: "nodes" }, nodes.map(nodeCard)));
    const st = await call("/v1/stats");
    const smp = st.samples || [];
    out.push(h("h2", {}, "This server, last hour"), h("div", { class: "grid", id: "stats" },
      chart("Creates", smp, "creates_per_s"), chart("Execs", smp, "execs_per_s"), chart("Errors (5xx)", smp, "errors_per_s")));
  } else {
    out.push(h("p", { class: "muted" }, "A tenant key: nodes and other tenants are not shown."));
  }
  const c = await call("/v1/sandboxes:count" + q({ all_tenants: session.admin ? 1 : "" }));
  out.push(h("h2", {}, (session.admin ? "Sandboxes of every tenant: " : "Your tenant's sandboxes: ") + fmt(c.total)),
    h("div", { class: "grid", id: "counts" }, kpis("By state", c.by_state), kpis("By backend", c.by_backend)));
  const ms = Math.round(performance.now() - started);
  out.push(h("p", { class: "muted", id: "updated", "data-ms": ms, "data-at": Date.now() },
    "Updated " + new Date().toLocaleTimeString() + " in " + ms + " ms; refreshes every " + every / 1000 + " s."));
  refreshTimer = setTimeout(refreshOverview, every);
  return out;
}

// refreshOverview redraws the overview in place (no "Loading…" flash),
// if it is still the page on screen.
async function refreshOverview() {
  if (route().name !== "overview") return;
  try {
    const content = await overview();
    if (route().name === "overview") main.replaceChildren(...content);
    else clearTimeout(refreshTimer);
  } catch (e) {
    if (e.status === 401) return;
    refreshTimer = setTimeout(refreshOverview, OVERVIEW_REFRESH_MS);
  }
}

// ---- sandboxes ---------------------------------------------------------------

async function sandboxes(r) {
  const p = r.params;
  const label = p.get("label") || "", state = p.get("state") || "", limit = p.get("limit") || "50";
  const node = p.get("node") || "", backend = p.get("backend") || "";
  const token = p.get("page_token") || "";
  const trail = (p.get("trail") || "").split(",").filter(Boolean); // tokens of the pages before
  const list = await call("/v1/sandboxes" + q({ label: label.split(/\s+/).filter(Boolean), state, node, backend, limit, page_token: token }));
  const nodeIn = h("input", { name: "node", placeholder: "node", value: node, size: 10 });
  const backendIn = h("select", { name: "backend" },
    ["", "container", "microvm", "fullvm"].map(b => h("option", { value: b, selected: b === backend }, b || "any backend")));
  const labelIn = h("input", { name: "label", placeholder: "label key=value …", value: label });
  const stateIn = h("select", { name: "state" },
    ["", "creating", "running", "paused", "lost", "failed", "deleted", "failed,deleted"].map(s =>
      h("option", { value: s, selected: s === state }, s || "live (default)")));
  const nav = (tok, tr) => "#/sandboxes" + q({ label, state, node, backend, limit, page_token: tok, trail: tr.join(",") });
  const rows = (list.sandboxes || []).map(s => h("tr", { "data-test": "sandbox-row", "data-id": s.id },
    h("td", {}, h("a", { href: "#/sandbox/" + encodeURIComponent(s.id), class: "mono" }, s.id)),
    h("td", {}, badge(s.state)), h("td", {}, s.backend), h("td", {}, s.node || "–"),
    h("td", {}, Object.entries(s.labels || {}).map(([k, v]) => h("span", { class: "badge" }, k + "=" + v))),
    h("td", { class: "num" }, fmt(s.resources?.cpu)), h("td", { class: "num" }, fmt(s.resources?.memory_mb)),
    h("td", {}, when(s.created_at))));
  return [
    h("h1", {}, "Sandboxes"),
    h("form", {
      class: "row", id: "filter", onsubmit: ev => {
        ev.preventDefault();
        go("#/sandboxes" + q({ label: labelIn.value.trim(), state: stateIn.value, node: nodeIn.value.trim(), backend: backendIn.value, limit }));
      }
    }, labelIn, stateIn, nodeIn, backendIn, h("button", { type: "submit" }, "Filter")),
    h("table", { id: "sandboxes" },
      h("thead", {}, h("tr", {}, ["ID", "State", "Backend", "Node", "Labels"].map(x => h("th", {}, x)),
        h("th", { class: "num" }, "CPU"), h("th", { class: "num" }, "MiB"), h("th", {}, "Created"))),
      h("tbody", {}, rows.length ? rows : h("tr", {}, h("td", { colspan: 8, class: "muted" }, "No sandboxes match.")))),
    h("div", { class: "row" },
      trail.length || token ? h("a", { href: nav(trail[trail.length - 1] || "", trail.slice(0, -1)), id: "prev" }, "← previous") : null,
      list.next_page_token ? h("a", { href: nav(list.next_page_token, [...trail, token]), id: "next" }, "next →") : null,
      h("span", { class: "muted" }, (list.sandboxes || []).length + " on this page")),
  ];
}

// ---- one sandbox -----------------------------------------------------------

function kv(obj) {
  return h("dl", { class: "kv" }, Object.entries(obj).filter(([, v]) => v !== undefined && v !== "" && v !== null)
    .map(([k, v]) => [h("dt", {}, k), h("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v))]));
}

async function sandbox(r) {
  const id = r.args[0];
  const base = "/v1/sandboxes/" + encodeURIComponent(id);
  const s = await call(base);
  const msg = h("div", { id: "action-msg" }, flash ? h("span", { class: "muted" }, flash) : null);
  flash = "";
  const act = (name, label, cls, fn) => h("button", {
    type: "button", class: cls, "data-action": name, onclick: async () => {
      if (name === "destroy" && !confirm("Destroy " + id + "?")) return;
      try { await fn(); flash = label + ": done"; render(); } catch (e) { msg.replaceChildren(errorBox(e)); }
    }
  }, label);
  const live = ["creating", "running", "paused"].includes(s.state);
  // Only what the API takes in this state (docs/api.md, Reset, pause, resume).
  const actions = [
    (s.state === "running" || s.state === "paused") && act("reset", "Reset", "secondary", () => call(base + "/reset", { method: "POST" })),
    s.state === "running" && act("pause", "Pause", "secondary", () => call(base + "/pause", { method: "POST" })),
    s.state === "paused" && act("resume", "Resume", "secondary", () => call(base + "/resume", { method: "POST" })),
    live && act("renew", "Renew lease", "secondary", () => call(base + "/renew", { method: "POST" })),
    s.state !== "deleted" && s.state !== "failed" && act("destroy", "Destroy", "danger", () => call(base, { method: "DELETE" })),
  ].filter(Boolean);
  const out = [
    h("h1", {}, "Sandbox ", h("span", { class: "mono", id: "sandbox-id" }, s.id), " ", badge(s.state)),
    h("div", { class: "row", id: "actions" }, actions), msg,
    h("div", { class: "grid" },
      h("div", { class: "card" }, h("h2", {}, "Spec"), kv({
        backend: s.backend, node: s.node, resources: s.resources, network: s.network?.mode, labels: s.labels,
        env: s.env, phase: s.phase, profile: s.profile, created: when(s.created_at), expires: when(s.expires_at),
        "last active": when(s.last_active_at), "idle timeout (s)": s.idle_timeout_seconds, error: s.error,
      })),
      h("div", { class: "card" }, h("h2", {}, "Layers"), s.snapshot ? kv({ snapshot: s.snapshot }) : kv(s.layers || {}))),
  ];
  if (s.state === "running") {
    out.push(screenSlot(base, s));
    out.push(terminalCard(base), execCard(base), processesCard(base), filesCard(base));
  }
  else out.push(h("p", { class: "muted" }, "Commands and files need a running sandbox."));
  return out;
}

function decode(text, enc) {
  if (enc !== "base64") return text;
  try { return atob(text); } catch (_) { return text; }
}

function execCard(base) {
  const cmd = h("input", { id: "exec-cmd", class: "mono", placeholder: "shell command, e.g. uname -a", size: 60 });
  const bg = h("input", { type: "checkbox", id: "exec-bg" });
  const out = h("div", { id: "exec-out" });
  return h("div", { class: "card" }, h("h2", {}, "Run a command"),
    h("form", {
      class: "row", id: "exec", onsubmit: async ev => {
        ev.preventDefault();
        out.replaceChildren(h("span", { class: "muted" }, "running…"));
        try {
          if (bg.checked) {
            const r = await call(base + "/exec", { method: "POST", body: { shell: cmd.value, background: true } });
            out.replaceChildren(h("span", { id: "exec-bg-started" }, "started " + (r.process?.id || "") + " in the background: see Processes"));
            document.getElementById("proc-reload")?.click();
            return;
          }
          const r = await call(base + "/exec", { method: "POST", body: { shell: cmd.value, timeout_ms: 60000 } });
          out.replaceChildren(
            h("div", { class: "row" }, h("span", { id: "exit-code" }, "exit " + r.exit_code), r.signal ? badge(r.signal) : null,
              h("span", { class: "muted" }, r.duration_ms + " ms"), r.truncated ? badge("truncated") : null),
            h("div", { class: "muted" }, "stdout"), h("pre", { id: "stdout" }, decode(r.stdout, r.encoding)),
            h("div", { class: "muted" }, "stderr"), h("pre", { id: "stderr", class: "stderr" }, decode(r.stderr, r.encoding)));
        } catch (e) { out.replaceChildren(errorBox(e)); }
      }
    }, h("span", { class: "mono" }, "$ /bin/sh -c"), cmd, h("label", {}, bg, " in the background"),
      h("button", { type: "submit" }, "Run")), out);
}

function filesCard(base) {
  const path = h("input", { id: "file-path", class: "mono", value: "/tmp", size: 40 });
  const view = h("div", { id: "file-view" });
  const upload = h("input", { type: "file", id: "file-upload" });
  const upPath = h("input", { id: "upload-path", class: "mono", placeholder: "/tmp/name (default: the file's name in the directory above)", size: 40 });
  const fpath = p => base + "/files" + q({ path: p });
  const show = async p => {
    path.value = p;
    try {
      let list = null;
      try { list = await call(base + "/files" + q({ path: p, list: 1 })); } catch (e) { if (e.status !== 400) throw e; }
      if (list) {
        const up = p.replace(/\/[^/]*$/, "") || "/";
        view.replaceChildren(h("table", { id: "file-list" },
          h("tbody", {}, p !== "/" ? h("tr", {}, h("td", {}, h("a", { href: "javascript:void 0", onclick: () => show(up) }, "..")), h("td"), h("td")) : null,
            (list.entries || []).map(e => {
              const child = (p === "/" ? "" : p) + "/" + e.name;
              return h("tr", {}, h("td", {}, e.type === "dir" || e.type === "file"
                ? h("a", { href: "javascript:void 0", "data-file": child, onclick: () => show(child) }, e.name + (e.type === "dir" ? "/" : ""))
                : h("span", {}, e.name + (e.target ? " → " + e.target : ""))),
                h("td", { class: "num" }, bytes(e.size)), h("td", { class: "mono" }, "0" + (e.mode & 0o7777).toString(8)));
            }))));
      } else {
        const text = await call(fpath(p), { raw: true });
        view.replaceChildren(h("div", { class: "muted" }, p + " · " + bytes(text.length)), h("pre", { id: "file-content" }, text));
      }
    } catch (e) { view.replaceChildren(errorBox(e)); }
  };
  queueMicrotask(() => show(path.value));
  return h("div", { class: "card" }, h("h2", {}, "Files"),
    h("form", { class: "row", id: "file-open", onsubmit: ev => { ev.preventDefault(); show(path.value); } },
      path, h("button", { type: "submit" }, "Open")),
    h("form", {
      class: "row", id: "file-put", onsubmit: async ev => {
        ev.preventDefault();
        const f = upload.files[0];
        if (!f) return;
        const dest = upPath.value.trim() || ((path.value.replace(/\/$/, "") || "") + "/" + f.name);
        try { await call(fpath(dest), { method: "PUT", body: f }); await show(dest); } catch (e) { view.replaceChildren(errorBox(e)); }
      }
    }, upload, upPath, h("button", { type: "submit" }, "Upload")),
    view);
}

// ---- layers ------------------------------------------------------------------

async function layers() {
  const { layers } = await call("/v1/layers");
  return [h("h1", {}, "Layers"), h("table", { id: "layers" },
    h("thead", {}, h("tr", {}, ["Ref", "Kind", "Size", "Public", "Digest", "Parents", "Created"].map(x => h("th", {}, x)))),
    h("tbody", {}, (layers || []).map(l => h("tr", { "data-test": "layer-row" },
      h("td", {}, h("a", { class: "mono", href: "#/layer/" + encodeURIComponent(l.ref) }, l.ref)), h("td", {}, badge(l.kind)), h("td", { class: "num" }, bytes(l.size)),
      h("td", {}, l.public ? "yes" : ""), h("td", { class: "mono" }, (l.digest || "").slice(0, 19) + "…"),
      h("td", { class: "mono" }, (l.parents || []).map(d => d.slice(7, 19)).join(" → ")), h("td", {}, when(l.created_at))))))];
}

// layer is one layer's page: what it costs after dedup, what it shares,
// who runs on it, where it sits among snapshots.
async function layerPage(r) {
  const ref = r.args[0];
  const l = await call("/v1/layers/" + ref.split("/").map(encodeURIComponent).join("/") + q({ usage: 1 }));
  const u = l.usage || {};
  const pct = (a, b) => b > 0 ? " (" + Math.round(100 * a / b) + "%)" : "";
  const node = (n, here) => h("li", {},
    n.ref ? h("a", { class: "mono", href: "#/layer/" + encodeURIComponent(n.ref) }, n.ref) : h("span", { class: "mono muted" }, n.digest.slice(0, 19) + "…"),
    n.kind ? [" ", badge(n.kind)] : null, here ? [" ", badge("this layer")] : null,
    n.children?.length ? h("ul", {}, n.children.map(c => node(c))) : null);
  // The lineage as one tree: the ancestors, this layer, what stacks on it.
  let tree = h("li", { "data-test": "lineage-self" }, h("b", { class: "mono" }, l.ref), " ", badge(l.kind), " ", badge("this layer"),
    u.lineage?.descendants?.length ? h("ul", {}, u.lineage.descendants.map(c => node(c))) : null);
  for (const a of [...(u.lineage?.ancestors || [])].reverse()) tree = h("li", {}, node(a).childNodes[0], h("ul", {}, tree));
  return [
    h("h1", {}, "Layer ", h("span", { class: "mono", id: "layer-ref" }, l.ref), " ", badge(l.kind)),
    h("div", { class: "grid" },
      h("div", { class: "card", id: "layer-usage" }, h("h2", {}, "Storage"), kv({
        digest: l.digest.slice(0, 23) + "…", "image size": bytes(l.size), public: l.public ? "yes" : "no", created: when(l.created_at),
        "distinct chunks": fmt(u.chunks), "bytes after dedup": bytes(u.dedup_bytes),
        "stored (compressed)": u.stored_bytes != null ? bytes(u.stored_bytes) : "–",
        "chunks shared with other layers": fmt(u.shared_chunks) + pct(u.shared_chunks, u.chunks),
        "bytes shared": bytes(u.shared_bytes), "freed if removed (at most)": bytes((u.dedup_bytes || 0) - (u.shared_bytes || 0)),
      }), u.truncated ? h("p", { class: "muted" }, "Partial: a bound on layers compared or sandboxes listed was hit.") : null),
      h("div", { class: "card" }, h("h2", {}, "Snapshot lineage"), h("ul", { class: "tree", id: "lineage" }, tree))),
    h("div", { class: "grid" },
      h("div", { class: "card" }, h("h2", {}, "Shares chunks with"),
        (u.shared_with || []).length ? h("table", { id: "layer-shares" }, h("thead", {}, h("tr", {}, h("th", {}, "Layer"), h("th", { class: "num" }, "Chunks"), h("th", { class: "num" }, "Bytes"))),
          h("tbody", {}, u.shared_with.map(s => h("tr", { "data-test": "share-row" },
            h("td", {}, h("a", { class: "mono", href: "#/layer/" + encodeURIComponent(s.ref) }, s.ref)),
            h("td", { class: "num" }, fmt(s.chunks)), h("td", { class: "num" }, bytes(s.bytes))))))
          : h("p", { class: "muted" }, "No other layer you can see holds its chunks.")),
      h("div", { class: "card" }, h("h2", {}, "Live sandboxes on it (" + (u.sandboxes || []).length + ")"),
        h("ul", { id: "layer-sandboxes" }, (u.sandboxes || []).map(id => h("li", {}, h("a", { class: "mono", href: "#/sandbox/" + encodeURIComponent(id) }, id)))))),
  ];
}

// ---- trajectories -----------------------------------------------------------

async function trajectories(r) {
  const id = r.params.get("id") || "";
  const input = h("input", { id: "trajectory-id", class: "mono", value: id, placeholder: "trajectory id, e.g. job-7/ep-3", size: 40 });
  const out = [h("h1", {}, "Trajectories"),
  h("form", { class: "row", id: "trajectory-open", onsubmit: ev => { ev.preventDefault(); go("#/trajectories" + q({ id: input.value.trim() })); } },
    input, h("button", { type: "submit" }, "Open"))];
  if (!id) return out;
  let t;
  try { t = await call("/v1/trajectories/" + id.split("/").map(encodeURIComponent).join("/")); } catch (e) {
    if (e.status === 404) return [...out, errorBox("No trajectory " + id + " for this key's tenant.")];
    throw e;
  }
  const cps = new Map((t.checkpoints || []).map(c => [c.step, c]));
  const steps = t.steps || [];
  out.push(h("div", { class: "card" },
    h("div", { class: "row" }, h("b", { class: "mono" }, t.id), h("span", { class: "muted" }, steps.length + " steps"),
      t.checkpoint_every ? badge("checkpoint every " + t.checkpoint_every) : null),
    h("ol", { class: "timeline", id: "timeline" }, steps.map(s => {
      const dur = s.recorded_at ? (new Date(s.recorded_at) - new Date(s.started_at)) : null;
      const fail = s.exit_code != null && s.exit_code !== 0;
      const cp = cps.get(s.step);
      return h("li", { class: s.state === "running" ? "running" : (fail ? "fail" : ""), "data-test": "step", "data-step": s.step },
        h("div", { class: "row" }, h("b", {}, "step " + s.step), badge(s.state),
          s.exit_code != null ? h("span", { "data-test": "step-exit" }, "exit " + s.exit_code) : null,
          dur != null ? h("span", { class: "muted" }, dur + " ms") : null,
          s.replays ? h("span", { class: "badge replayed", "data-test": "step-replayed", title: "last " + when(s.replayed_at) }, "replayed ×" + s.replays)
            : h("span", { class: "badge ran", "data-test": "step-ran" }, "ran"),
          cp ? badge("checkpoint") : null),
        h("div", { class: "muted mono" }, "in ", h("a", { href: "#/sandbox/" + encodeURIComponent(s.sandbox) }, s.sandbox),
          " · started " + when(s.started_at) + " · fingerprint " + (s.fingerprint || "").slice(0, 12)));
    }))));
  return out;
}

// ---- tenants and keys (admin) ------------------------------------------------

async function tenants(r) {
  if (!session.admin) return [h("h1", {}, "Tenants & keys"), errorBox("This page needs an admin key.")];
  const sel = r.args[0];
  const { tenants } = await call("/v1/tenants");
  const name = h("input", { id: "tenant-name", placeholder: "new tenant name" });
  const msg = h("div");
  const out = [h("h1", {}, "Tenants & keys"),
  h("form", {
    class: "row", id: "tenant-create", onsubmit: async ev => {
      ev.preventDefault();
      try { const t = await call("/v1/tenants", { method: "POST", body: { name: name.value.trim() } }); go("#/tenants/" + t.id); } catch (e) { msg.replaceChildren(errorBox(e)); }
    }
  }, name, h("button", { type: "submit" }, "Create tenant")), msg,
  h("table", { id: "tenants" }, h("thead", {}, h("tr", {}, ["ID", "Name", "Created"].map(x => h("th", {}, x)))),
    h("tbody", {}, tenants.map(t => h("tr", { "data-test": "tenant-row" },
      h("td", {}, h("a", { href: "#/tenants/" + t.id, class: "mono" }, t.id)), h("td", {}, t.name), h("td", {}, when(t.created_at))))))];
  if (sel) out.push(await tenantCard(sel));
  return out;
}

async function tenantCard(id) {
  const t = await call("/v1/tenants/" + encodeURIComponent(id));
  const { keys } = await call("/v1/tenants/" + encodeURIComponent(id) + "/keys");
  const quota = t.quota || {}, usage = t.usage || {};
  const adminBox = h("input", { type: "checkbox", id: "key-admin" });
  const msg = h("div", { id: "key-msg" });
  return h("div", { class: "card", id: "tenant" }, h("h2", {}, "Tenant " + t.name + " (" + t.id + ")"),
    bar("Sandboxes", usage.sandboxes || 0, quota.sandboxes || 0, null),
    bar("CPU", usage.cpu || 0, quota.cpu || 0, null),
    bar("Memory", usage.memory_mb || 0, quota.memory_mb || 0, null, " MiB"),
    h("div", { class: "muted" }, "A quota of 0 is unlimited."),
    h("h2", {}, "Keys"),
    h("table", { id: "keys" }, h("tbody", {}, keys.map(k => h("tr", { "data-test": "key-row" },
      h("td", { class: "mono" }, k.id), h("td", {}, k.admin ? badge("admin") : ""), h("td", {}, when(k.created_at)),
      h("td", {}, h("button", {
        type: "button", class: "danger", onclick: async () => {
          if (!confirm("Revoke key " + k.id + "?")) return;
          try { await call("/v1/keys/" + encodeURIComponent(k.id), { method: "DELETE" }); render(); } catch (e) { msg.replaceChildren(errorBox(e)); }
        }
      }, "Revoke")))))),
    h("form", {
      class: "row", id: "key-create", onsubmit: async ev => {
        ev.preventDefault();
        try {
          const k = await call("/v1/tenants/" + encodeURIComponent(id) + "/keys", { method: "POST", body: { admin: adminBox.checked } });
          await render();
          document.getElementById("key-msg")?.replaceChildren(h("div", { class: "secret" }, "New key (shown once): ", h("code", { id: "new-key" }, k.secret)));
        } catch (e) { msg.replaceChildren(errorBox(e)); }
      }
    }, h("label", {}, adminBox, " admin"), h("button", { type: "submit" }, "Create key")), msg);
}

function notFound() { return errorBox("No such page."); }

const pages = { signin, overview, sandboxes, sandbox, layers, layer: layerPage, trajectories, tenants };

document.getElementById("signout").addEventListener("click", () => { clearKey(); session.admin = null; go("#/signin"); });
window.addEventListener("hashchange", render);
render();
