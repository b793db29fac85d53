// dom.js: building elements without innerHTML, so nothing from the API
// is ever parsed as markup.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else if (k === "class") el.className = v;
    else if (k === "width") el.style.width = v;
    else el.setAttribute(k, v === true ? "" : v);
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === undefined || c === null || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else el.append(c instanceof Node ? c : String(c));
  }
}

export function badge(text) { return h("span", { class: "badge " + text }, text); }

export function errorBox(e) { return h("div", { class: "error", "data-test": "error" }, String(e.message || e)); }

// bar is a capacity bar: used of total, with an optional measured load
// drawn as a thin line under it.
export function bar(label, used, total, load, unit = "") {
  const pct = total > 0 ? Math.min(100, 100 * used / total) : 0;
  const lpct = total > 0 && load != null ? Math.min(100, 100 * load / total) : null;
  return h("div", {},
    h("div", { class: "barlabel" }, h("span", {}, label),
      h("span", {}, fmt(used) + " / " + fmt(total) + unit + (load != null ? " · load " + fmt(load) + unit : ""))),
    h("div", { class: "bar" + (pct >= 95 ? " full" : "") },
      h("span", { width: pct + "%" }),
      lpct != null ? h("span", { class: "load", width: lpct + "%" }) : null));
}

export function fmt(n) {
  if (n == null) return "–";
  if (typeof n !== "number") return String(n);
  return Number.isInteger(n) ? n.toLocaleString("en") : n.toFixed(2);
}

export function bytes(n) {
  if (n == null) return "–";
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n) + " " + u[i];
}

export function when(t) {
  if (!t) return "–";
  const d = new Date(t);
  return isNaN(d) ? t : d.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}
