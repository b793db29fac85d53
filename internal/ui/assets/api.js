// api.js: the /v1 API as the signed-in key sees it. The key lives in
// sessionStorage only (gone when the tab closes); a 401 from any call
// signs out and goes back to the sign-in page.

const KEY = "dsec.key";

export function key() { return sessionStorage.getItem(KEY) || ""; }
export function setKey(k) { sessionStorage.setItem(KEY, k); }
export function clearKey() { sessionStorage.removeItem(KEY); }

export class APIError extends Error {
  constructor(status, code, message) {
    super(message || code || ("HTTP " + status));
    this.status = status;
    this.code = code;
  }
}

// call sends one request. opts: method, body (object → JSON; string or
// Blob sent as is), raw (return the Response's text instead of JSON).
export async function call(path, opts = {}) {
  const headers = { "Authorization": "Bearer " + key() };
  let body = opts.body;
  if (body !== undefined && !(body instanceof Blob) && typeof body !== "string") {
    body = JSON.stringify(body);
    headers["Content-Type"] = "application/json";
  }
  const resp = await fetch(path, { method: opts.method || "GET", headers, body });
  if (resp.status === 401) {
    clearKey();
    location.hash = "#/signin?expired=1";
    throw new APIError(401, "unauthenticated", "the key was refused: sign in again");
  }
  if (!resp.ok) {
    let code = "", msg = "";
    try {
      const e = (await resp.json()).error || {};
      code = e.code; msg = e.message;
    } catch (_) { /* not JSON */ }
    throw new APIError(resp.status, code, msg);
  }
  if (resp.status === 204) return null;
  if (opts.raw) return await resp.text();
  return await resp.json();
}

// whoami tells an admin key from a tenant key: GET /v1/nodes is an admin
// route, so a tenant key gets 403 there.
export async function whoami() {
  try {
    const r = await call("/v1/nodes");
    return { admin: true, nodes: r.nodes || [] };
  } catch (e) {
    if (e.status === 403) return { admin: false, nodes: null };
    throw e;
  }
}

export function q(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (Array.isArray(v)) v.forEach(x => x !== "" && u.append(k, x));
    else if (v !== undefined && v !== null && v !== "") u.set(k, v);
  }
  const s = u.toString();
  return s ? "?" + s : "";
}
