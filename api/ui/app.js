/* Raylane's web page: plain JS, no build step, no network beyond this server.
 *
 * Every number comes from the same API the SDK and CLI use (fetch /v1/...). The
 * token comes from ?token= (then kept in localStorage and removed from the URL)
 * or the token box, and goes out as "Authorization: Bearer <token>".
 * Views (hash routes): #/jobs (its filters and page in the hash: #/jobs?status=RUNNING&cursor=...),
 * #/jobs/<id> (with cancel, resubmit, the log and its follow), #/schedules, #/nodes, #/costs.
 * Actions go to the same API with the page's token: the server decides what the caller may do.
 * Beside any view, a banner says when the server cannot reach Ray (GET /readyz,
 * public: it shows before a token is given too).
 */
"use strict";

const POLL_MS = 3000;          // live status: how often an open view re-reads the API
const RAY_POLL_MS = 10000;     // Ray's reachability: the server itself re-checks about this often
const TOKEN_KEY = "raylane_token";
const TERMINAL = new Set(["SUCCEEDED", "FAILED", "CANCELLED"]);
const STATUSES = ["PENDING", "DISPATCHING", "RUNNING", "RETRYING", "CANCELLING", "SUCCEEDED", "FAILED", "CANCELLED"];
const SVG_NS = "http://www.w3.org/2000/svg";

let pollTimer = null;
let viewSeq = 0;  // a view's async work stops drawing once another view is shown

// Token ---------------------------------------------------------------------

(function takeTokenFromUrl() {
  const url = new URL(window.location.href);
  const t = url.searchParams.get("token");
  if (t) {
    localStorage.setItem(TOKEN_KEY, t);
    url.searchParams.delete("token");
    history.replaceState(null, "", url.pathname + url.search + url.hash);
  }
})();

function token() { return localStorage.getItem(TOKEN_KEY) || ""; }

// Ray's dashboard under /ray takes an HttpOnly session cookie instead of a header
// (a link must open it): signing in trades the token for one, on every page load
// (the cookie is short-lived) and whenever the token changes.
function refreshSession(previous) {
  const t = token() || previous;
  if (!t) return Promise.resolve(null);
  return fetch("/v1/session", { method: token() ? "POST" : "DELETE", headers: { "Authorization": "Bearer " + t } })
    .catch(() => null);
}

refreshSession();

function showTokenState() {
  document.getElementById("token-state").textContent = token() ? "token set" : "no token";
}

document.getElementById("token-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  const input = document.getElementById("token-input");
  const previous = token();
  if (input.value.trim()) localStorage.setItem(TOKEN_KEY, input.value.trim());
  else localStorage.removeItem(TOKEN_KEY);
  input.value = "";
  refreshSession(previous);
  showTokenState();
  hideBanner();
  route();
});

// API -----------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : (Array.isArray(detail) ? detail.map(d => d.msg).join("; ") : `HTTP ${status}`));
    this.status = status;
  }
}

async function api(path, opts = {}) {
  const headers = { "Accept": "application/json" };
  if (token()) headers["Authorization"] = "Bearer " + token();
  const init = { headers, method: opts.method || "GET" };
  if (opts.body !== undefined) { headers["Content-Type"] = "application/json"; init.body = JSON.stringify(opts.body); }
  const r = await fetch(path, init);
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    if (r.status === 401) showBanner("This server needs an API token: paste one in the box above (or open the page with ?token=...).");
    throw new ApiError(r.status, body && body.detail);
  }
  return body;
}

// The job kinds come from the server's traits table (GET /v1/kinds), read once per
// page; a failed read is asked again by the next view that needs it.
let kindsRead = null;
function kinds() {
  if (!kindsRead) kindsRead = api("/v1/kinds").catch(e => { kindsRead = null; throw e; });
  return kindsRead;
}

// DOM helpers ---------------------------------------------------------------

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    // Through the CSSOM: the page's CSP (style-src 'self') blocks style attributes, not this.
    else if (k === "style") el.style.cssText = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

// Replace an element's children as h() adds them: a null, undefined or false is
// left out and arrays are flattened (the DOM's replaceChildren writes a null as
// the text "null": the stray "null" before Resubmit, "nullnull" under the jobs).
function fill(el, ...children) {
  el.replaceChildren(...children.flat().filter(c => c !== null && c !== undefined && c !== false));
  return el;
}

function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
  for (const c of children.flat()) if (c) el.appendChild(c instanceof Node ? c : document.createTextNode(String(c)));
  return el;
}

function badge(status) { return h("span", { class: `badge s-${status}` }, status); }
function showBanner(text) { const b = document.getElementById("banner"); b.textContent = text; b.hidden = false; }
function hideBanner() { document.getElementById("banner").hidden = true; }
// As the CLI writes money: cents, and below a cent two significant digits ($0.0014, never $0.0000).
function money(x) {
  if (x === null || x === undefined) return "-";
  const a = Math.abs(x);
  return "$" + (a && a < 0.01 ? x.toFixed(1 - Math.floor(Math.log10(a))) : x.toFixed(2));
}
function pct(x) { return x === null || x === undefined ? "-" : (100 * x).toFixed(1) + "%"; }
function num(x, d = 2) { return x === null || x === undefined ? "-" : Number(x).toFixed(d).replace(/\.?0+$/, "") || "0"; }
function when(iso) { return iso ? new Date(iso).toLocaleString() : "-"; }
function ago(iso) {
  if (!iso) return "-";
  const secs = Math.max(0, (Date.now() - new Date(iso).getTime()) / 1000);
  for (const [u, n] of [["d", 86400], ["h", 3600], ["m", 60]]) if (secs >= n) return Math.floor(secs / n) + u + " ago";
  return Math.floor(secs) + "s ago";
}
function res(d) { return Object.entries(d || {}).map(([k, v]) => k === "memory" ? `memory ${(v / 2 ** 30).toFixed(1)} GB` : `${k} ${num(v)}`).join(", ") || "-"; }
function panel(title, ...body) { return h("section", { class: "panel" }, title ? h("h2", {}, title) : null, ...body); }
function errorBox(e) { return h("div", { class: "panel error" }, e.message || String(e)); }

function poll(fn) {
  clearTimeout(pollTimer);
  const seq = viewSeq;
  const tick = async () => {
    if (seq !== viewSeq) return;
    if (!document.hidden) {
      try { if ((await fn()) === false) return; } catch (e) { /* fn showed it */ }
    }
    if (seq === viewSeq) pollTimer = setTimeout(tick, POLL_MS);
  };
  pollTimer = setTimeout(tick, POLL_MS);
}

// Router --------------------------------------------------------------------

let viewAbort = new AbortController();  // streams of the shown view (a followed log) end with it

function route() {
  viewSeq += 1;
  clearTimeout(pollTimer);
  viewAbort.abort();
  viewAbort = new AbortController();
  const view = document.getElementById("view");
  view.replaceChildren();
  const hash = window.location.hash || "#/jobs";
  const [path, query] = hash.replace(/^#\/?/, "").split("?");
  const parts = path.split("/");
  document.querySelectorAll("[data-nav]").forEach(a => a.classList.toggle("active", a.dataset.nav === parts[0]));
  if (parts[0] === "jobs" && parts[1]) return jobView(view, decodeURIComponent(parts[1]));
  if (parts[0] === "schedules") return schedulesView(view);
  if (parts[0] === "nodes") return nodesView(view);
  if (parts[0] === "costs") return costsView(view);
  return jobsView(view, new URLSearchParams(query || ""));
}

window.addEventListener("hashchange", route);

// Jobs list -----------------------------------------------------------------

// The list's state lives in the hash, so a filtered page is a link (and Back works).
const FILTER_KEYS = ["status", "kind", "name_prefix", "node_group", "project", "label"];

function groupTag(j) {
  const arr = j.labels && j.labels["raylane.array"];
  if (arr) return h("a", { href: `#/jobs?label=${encodeURIComponent("raylane.array=" + arr)}`, class: "tag", title: "array " + arr },
    `array #${j.labels["raylane.array.index"]}`);
  const deps = (j.spec && j.spec.depends_on) || [];
  if (deps.length) return h("span", { class: "tag", title: deps.map(d => d.job).join(", ") }, `after ${deps.length}`);
  const sch = j.labels && j.labels["raylane.schedule"];
  if (sch) return h("span", { class: "tag", title: "schedule " + sch }, "scheduled");
  return "";
}

function jobsView(view, params) {
  const filters = Object.fromEntries(FILTER_KEYS.map(k => [k, params.get(k) || ""]));
  const cursor = params.get("cursor") || "";
  const statusSel = h("select", { id: "f-status", "aria-label": "status" }, h("option", { value: "" }, "any status"),
    STATUSES.map(x => h("option", { value: x, selected: filters.status === x }, x)));
  const kindSel = h("select", { id: "f-kind", "aria-label": "kind" }, h("option", { value: "" }, "any kind"));
  kinds().then(ks => kindSel.append(...ks.map(k =>
    h("option", { value: k.name, title: k.summary, selected: filters.kind === k.name }, k.name)))).catch(() => {});
  const nameIn = h("input", { id: "f-name", placeholder: "name starts with", value: filters.name_prefix, size: 14 });
  const groupIn = h("input", { id: "f-group", placeholder: "node group", value: filters.node_group, size: 10 });
  const projectIn = h("input", { id: "f-project", placeholder: "project", value: filters.project, size: 10 });
  const labelIn = h("input", { id: "f-label", placeholder: "label k=v", value: filters.label, size: 14 });
  const count = h("span", { class: "muted", id: "count" });
  const body = h("tbody");
  const pager = h("div", { class: "pager" });
  const table = h("table", { id: "jobs" },
    h("thead", {}, h("tr", {}, ["ID", "Name", "Status", "Project", "Kind", "Group", "Created", "Reason"].map(c => h("th", {}, c)))), body);

  const go = (over) => {
    const q = new URLSearchParams();
    const next = { ...filters, ...over };
    for (const k of [...FILTER_KEYS, "cursor"]) if (next[k]) q.set(k, next[k]);
    const target = "#/jobs" + (q.toString() ? "?" + q : "");
    if (target === window.location.hash) route(); else window.location.hash = target;
  };
  const apply = () => go({ status: statusSel.value, kind: kindSel.value, name_prefix: nameIn.value.trim(),
    node_group: groupIn.value.trim(), project: projectIn.value.trim(), label: labelIn.value.trim(), cursor: "" });
  [statusSel, kindSel].forEach(el => el.addEventListener("change", apply));
  [nameIn, groupIn, projectIn, labelIn].forEach(el => el.addEventListener("keydown", ev => { if (ev.key === "Enter") apply(); }));

  view.append(h("h1", {}, "Jobs"),
    h("div", { class: "filters" }, statusSel, kindSel, nameIn, groupIn, projectIn, labelIn,
      h("button", { onclick: apply }, "Filter"), count, h("span", { class: "muted" }, `live: every ${POLL_MS / 1000}s`)),
    panel(null, h("div", { class: "scroll" }, table), pager));

  const seq = viewSeq;
  async function load() {
    const q = new URLSearchParams({ limit: "50" });
    for (const [k, v] of Object.entries(filters)) if (v) q.set(k, v);
    if (cursor) q.set("cursor", cursor);
    let page;
    try { page = await api("/v1/jobs?" + q); } catch (e) {
      if (seq === viewSeq) fill(body, h("tr", {}, h("td", { colspan: 8, class: "error" }, e.message)));
      throw e;
    }
    if (seq !== viewSeq) return;
    count.textContent = `${page.items.length}${page.next_cursor ? "+" : ""} jobs${cursor ? " (older page)" : ""}`;
    fill(pager, 
      cursor ? h("button", { class: "secondary", id: "page-first", onclick: () => go({ cursor: "" }) }, "\u2190 newest") : null,
      page.next_cursor ? h("button", { class: "secondary", id: "page-next", onclick: () => go({ cursor: page.next_cursor }) }, "older \u2192") : null);
    if (!page.items.length) { fill(body, h("tr", {}, h("td", { colspan: 8, class: "empty" }, "No jobs match."))); return; }
    fill(body, ...page.items.map(j => h("tr", { class: "clickable", "data-job": j.id, onclick: (ev) => { if (!ev.target.closest("a")) window.location.hash = "#/jobs/" + j.id; } },
      h("td", {}, h("a", { href: "#/jobs/" + j.id, class: "mono" }, j.id.slice(0, 12) + "\u2026")),
      // Status beside the name: on a phone it is in sight, the rest a sideways scroll of the table away.
      h("td", {}, j.name), h("td", {}, badge(j.status)), h("td", {}, j.project), h("td", {}, j.kind),
      h("td", {}, j.placement ? j.placement.node_group : "-", " ", groupTag(j)), h("td", { title: when(j.created_at) }, ago(j.created_at)),
      h("td", { class: "reason", title: j.status_reason || "" }, j.status_reason || ""))));
  }
  load().catch(() => {});
  poll(load);
}

// One job -------------------------------------------------------------------

function trialsChart(trials, metric, mode) {
  // x: trial number (in trial id order, i.e. the order Tune created them); y: the metric.
  const pts = trials.map((t, i) => ({ i, t, y: t.metrics ? t.metrics[metric] : undefined }))
    .filter(p => typeof p.y === "number" && isFinite(p.y));
  const W = 1100, H = 300, L = 64, R = 16, T = 14, B = 38;
  const svg = s("svg", { class: "chart", id: "trials-chart", viewBox: `0 0 ${W} ${H}`, role: "img",
    "aria-label": `${metric} over ${pts.length} trials` });
  if (!pts.length) {
    svg.appendChild(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, `no trial reported ${metric} yet`));
    return svg;
  }
  const n = trials.length;
  let lo = Math.min(...pts.map(p => p.y)), hi = Math.max(...pts.map(p => p.y));
  if (lo === hi) { lo -= 1; hi += 1; }
  const pad = (hi - lo) * 0.08; lo -= pad; hi += pad;
  const x = i => L + (n === 1 ? (W - L - R) / 2 : (i / (n - 1)) * (W - L - R));
  const y = v => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
  for (let k = 0; k <= 4; k++) {
    const v = lo + (k / 4) * (hi - lo);
    svg.appendChild(s("line", { class: "grid", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    svg.appendChild(s("text", { x: L - 6, y: y(v) + 4, "text-anchor": "end" }, Math.abs(v) < 1e-3 || Math.abs(v) >= 1e4 ? v.toExponential(1) : v.toPrecision(3)));
  }
  svg.appendChild(s("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  svg.appendChild(s("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  const step = Math.max(1, Math.ceil(n / 12));  // at most ~12 labels, on whole steps
  for (let i = 0; i < n; i += step) svg.appendChild(s("text", { x: x(i), y: H - B + 16, "text-anchor": "middle" }, String(i + 1)));
  svg.appendChild(s("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle" }, "trial"));
  svg.appendChild(s("text", { x: 12, y: T + (H - T - B) / 2, transform: `rotate(-90 12 ${T + (H - T - B) / 2})`, "text-anchor": "middle" }, metric));
  // Best so far, as a step line: where the sweep stood after each trial.
  const better = (a, b) => mode === "max" ? a > b : a < b;
  let best = null, d = "";
  for (const p of pts) {
    if (best === null || better(p.y, best)) best = p.y;
    d += (d ? " L" : "M") + x(p.i).toFixed(1) + " " + y(best).toFixed(1);
  }
  svg.appendChild(s("path", { class: "best-line", d }));
  const bestVal = best;
  for (const p of pts) {
    const cls = "pt" + (p.y === bestVal ? " best" : "") + (p.t.status === "ERROR" ? " err" : "");
    svg.appendChild(s("circle", { class: cls, cx: x(p.i).toFixed(1), cy: y(p.y).toFixed(1), r: 4.5, "data-trial": p.t.trial_id },
      s("title", {}, `trial ${p.i + 1} (${p.t.trial_id}): ${metric} = ${p.y}\n${JSON.stringify(p.t.config)}`)));
  }
  return svg;
}

function headers(accept) {
  const hd = { "Accept": accept };
  if (token()) hd["Authorization"] = "Bearer " + token();
  return hd;
}

// What the job holds at once, as placed: a sweep of 8 concurrent trials of 1 CPU
// holds 8 CPUs (placement.num_workers is its concurrency), plus the driver.
function held(job) {
  const p = job.placement, r = job.spec.resources;
  if (!p) return `${r.num_workers} x CPU ${num(r.cpus_per_worker)}` + (r.gpus_per_worker ? `, GPU ${num(r.gpus_per_worker)}` : "") + " (not placed yet)";
  const unit = p.num_workers === 1 ? "worker" : (job.kind === "sweep" ? "concurrent trials" : "workers");
  return `${p.num_workers} ${unit} x ${res(p.worker_resources)} \u00b7 total ${res(p.total)}` +
    (p.driver_resources && Object.keys(p.driver_resources).length ? ` (driver ${res(p.driver_resources)})` : "");
}

// A result of any size: wrapped, its first lines shown, and the whole a click away.
const RESULT_SHOWN = 600;
function resultBox(result) {
  const whole = JSON.stringify(result, null, 2);
  const pre = h("pre", { class: "result", id: "result" }, whole.length > RESULT_SHOWN ? whole.slice(0, RESULT_SHOWN) + "\u2026" : whole);
  if (whole.length <= RESULT_SHOWN) return pre;
  const more = h("button", { class: "secondary", id: "result-all" }, `Show all (${whole.length} characters)`);
  more.addEventListener("click", () => {
    const open = more.dataset.open !== "1";
    pre.textContent = open ? whole : whole.slice(0, RESULT_SHOWN) + "\u2026";
    pre.classList.toggle("open", open);
    more.dataset.open = open ? "1" : "0";
    more.textContent = open ? "Show less" : `Show all (${whole.length} characters)`;
  });
  return h("div", {}, pre, more);
}

// The log panel: the last lines at once, again on demand, or followed live (NDJSON from
// /v1/jobs/<id>/logs?follow=true; the server sends heartbeats and ends the stream
// once the job has ended and its log is read out).
function logPanel(id) {
  const pre = h("pre", { class: "log", id: "log" });
  const state = h("span", { class: "muted", id: "log-state" });
  let ctrl = null;
  const followBtn = h("button", { id: "log-follow" }, "Follow");
  const show = (text) => { pre.textContent = text; pre.scrollTop = pre.scrollHeight; };
  async function tail() {
    state.textContent = "reading\u2026";
    try {
      const r = await fetch(`/v1/jobs/${encodeURIComponent(id)}/logs`, { headers: headers("text/plain"), signal: viewAbort.signal });
      const text = await r.text();
      if (r.status === 404 || r.status === 409) { state.textContent = "no log yet"; return; }
      if (!r.ok) { state.textContent = `HTTP ${r.status}: ${text.slice(0, 200)}`; return; }
      const lines = text.split("\n");
      show(lines.slice(-200).join("\n"));
      state.textContent = text ? `last ${Math.min(200, lines.length)} lines` : "no log yet";
    } catch (e) { if (e.name !== "AbortError") state.textContent = e.message; }
  }
  async function follow() {
    if (ctrl) { ctrl.abort(); return; }
    ctrl = new AbortController();
    viewAbort.signal.addEventListener("abort", () => ctrl && ctrl.abort());
    followBtn.textContent = "Stop";
    pre.textContent = "";
    state.textContent = "following\u2026";
    try {
      const r = await fetch(`/v1/jobs/${encodeURIComponent(id)}/logs?follow=true`,
        { headers: headers("application/x-ndjson"), signal: ctrl.signal });
      if (!r.ok) { state.textContent = `HTTP ${r.status}: ${(await r.text()).slice(0, 200)}`; return; }
      const reader = r.body.getReader(), dec = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += dec.decode(value, { stream: true });
        let i;
        while ((i = buf.indexOf("\n")) >= 0) {
          const line = buf.slice(0, i); buf = buf.slice(i + 1);
          if (!line) continue;  // a heartbeat
          const msg = JSON.parse(line);
          if (msg.text) { pre.append(msg.text); pre.scrollTop = pre.scrollHeight; }
        }
      }
      state.textContent = "the job has ended: end of log";
    } catch (e) {
      state.textContent = e.name === "AbortError" ? "stopped following" : e.message;
    } finally {
      ctrl = null;
      followBtn.textContent = "Follow";
    }
  }
  followBtn.addEventListener("click", follow);
  tail();  // the log's last lines as soon as the page opens, not after a click
  return panel("Log", h("div", { class: "filters" },
    h("button", { class: "secondary", id: "log-tail", onclick: tail }, "Last 200 lines"), followBtn, state), pre);
}

function jobView(view, id) {
  const seq = viewSeq;
  const head = h("div", { id: "job-head" });
  const actions = h("div", { class: "filters", id: "actions" });
  const facts = panel("Job");
  const placement = panel("Placement");
  const cost = panel("Cost");
  const related = h("div", { id: "related" });
  const attemptsP = panel("Attempts");
  const trialsP = h("div");
  const eventsP = panel("Events");
  view.append(h("p", {}, h("a", { href: "#/jobs" }, "\u2190 all jobs")), head, actions,
    h("div", { class: "grid2" }, facts, h("div", {}, placement, cost)), related, attemptsP, trialsP, logPanel(id), eventsP);
  let trialsShownFor = null;
  let relatedShownFor = null;
  const actionMsg = h("span", { class: "muted", id: "action-msg" });

  async function act(what, fn) {
    actionMsg.textContent = what + "\u2026";
    try { actionMsg.textContent = await fn(); } catch (e) { actionMsg.textContent = `${what} refused: ${e.message}`; actionMsg.className = "error"; return; }
    actionMsg.className = "muted";
    load().catch(() => {});
  }

  function drawActions(job) {
    fill(actions, ...[
      TERMINAL.has(job.status) ? null : h("button", { id: "cancel", onclick: () => act("cancel", async () => {
        const r = await api(`/v1/jobs/${encodeURIComponent(id)}/cancel`, { method: "POST" });
        return r.message;
      }) }, "Cancel"),
      h("button", { class: "secondary", id: "resubmit", onclick: () => act("resubmit", async () => {
        const spec = { ...job.spec, project: job.project };
        const created = await api("/v1/jobs", { method: "POST", body: spec });
        window.location.hash = "#/jobs/" + created.id;
        return "resubmitted as " + created.id;
      }) }, "Resubmit"),
      actionMsg]);
  }

  async function drawRelated(job) {
    const parts = [];
    const arr = job.labels && job.labels["raylane.array"];
    if (arr) {
      const a = await api(`/v1/arrays/${encodeURIComponent(arr)}`).catch(() => null);
      if (a) parts.push(panel(`Array ${a.name}: member ${job.labels["raylane.array.index"]} of ${a.size}`,
        h("p", { id: "array-counts" }, Object.entries(a.counts).flatMap(([st, n]) => [badge(st), ` ${n} `]),
          a.held ? h("span", { class: "muted" }, ` \u00b7 ${a.held} held (at most ${a.max_parallel} at once)`) : null),
        h("a", { href: `#/jobs?label=${encodeURIComponent("raylane.array=" + arr)}` }, "all members \u2192")));
    }
    const deps = job.spec.depends_on || [];
    if (deps.length) {
      const parents = await Promise.all(deps.map(d => api(`/v1/jobs/${encodeURIComponent(d.job)}`).catch(() => null)));
      parts.push(panel("Pipeline: runs after", h("ul", { id: "parents" }, deps.map((d, i) => h("li", {},
        parents[i] ? [h("a", { href: "#/jobs/" + d.job }, parents[i].name), " ", badge(parents[i].status)] : h("span", { class: "mono" }, d.job),
        h("span", { class: "muted" }, ` \u00b7 needs it to ${d.on === "finished" ? "finish" : d.on === "failed" ? "fail" : "succeed"}`))))));
    }
    if (seq === viewSeq) fill(related, ...parts);
  }

  async function load() {
    let job;
    try { job = await api(`/v1/jobs/${encodeURIComponent(id)}`); } catch (e) {
      if (seq === viewSeq) fill(head, errorBox(e));
      throw e;
    }
    const [events, attempts, costs] = await Promise.all([
      api(`/v1/jobs/${id}/events`), api(`/v1/jobs/${id}/attempts`), api(`/v1/jobs/${id}/cost`).catch(() => null)]);
    if (seq !== viewSeq) return;
    drawActions(job);
    if (relatedShownFor !== job.status) { relatedShownFor = job.status; drawRelated(job).catch(() => {}); }
    fill(head, h("h1", {}, job.name, " ", badge(job.status)),
      h("p", { class: "muted", id: "status-reason" }, job.status_reason || ""));
    fill(facts, h("h2", {}, "Job"), h("dl", { class: "facts" },
      h("dt", {}, "ID"), h("dd", { class: "mono" }, job.id),
      h("dt", {}, "Kind"), h("dd", {}, job.kind),
      h("dt", {}, "Project"), h("dd", { id: "job-project" }, `${job.project} \u00b7 priority ${job.priority}`),
      h("dt", {}, "Entrypoint"), h("dd", { class: "mono" }, job.spec.entrypoint),
      h("dt", {}, "Resources"), h("dd", { id: "job-resources" }, held(job)),
      h("dt", {}, "Attempts"), h("dd", {}, `${job.attempts} of ${job.max_attempts}` + (job.preemptions ? `, ${job.preemptions} preempted` : "")),
      job.failure_cause ? [h("dt", {}, "Cause"), h("dd", {}, job.failure_cause)] : null,
      h("dt", {}, "Created"), h("dd", {}, when(job.created_at)),
      h("dt", {}, "Started"), h("dd", {}, when(job.started_at)),
      h("dt", {}, "Finished"), h("dd", {}, when(job.finished_at)),
      h("dt", {}, "Ray"), h("dd", {}, job.dashboard_url
        ? h("a", { href: job.dashboard_url, target: "_blank", rel: "noopener", id: "ray-link" }, "open in Ray's dashboard \u2197")
        : h("span", { class: "muted" }, "not on Ray yet")),
      job.result ? [h("dt", {}, "Result"), h("dd", {}, resultBox(job.result))] : null));
    const p = job.placement;
    fill(placement, h("h2", {}, "Placement"), ...(p ? [
      h("p", {}, h("b", {}, p.node_group), ` (${p.market}), ${p.strategy}${p.colocate ? ", co-located" : ""}, ${p.num_workers} x ${res(p.worker_resources)}`,
        p.borrowed ? [" ", h("span", { class: "badge", id: "borrowed", title: "beyond its project's guaranteed share: preempted first when the share's owner needs it" }, "borrowed")] : null),
      h("div", { class: "muted" }, "Why:"), h("ul", { class: "reasons", id: "reasons" }, p.reasons.map(r => h("li", {}, r)))]
      : [h("p", { class: "muted" }, "Not routed yet (no cluster profile attached).")]));
    fill(cost, h("h2", {}, "Cost"), costs ? h("div", { class: "stats" },
      h("div", {}, h("span", { class: "muted" }, "cost"), h("span", { class: "big", id: "job-cost" }, money(costs.cost))),
      h("div", {}, h("span", { class: "muted" }, "on demand"), h("span", { class: "big" }, money(costs.on_demand_cost))),
      h("div", {}, h("span", { class: "muted" }, "spot savings"), h("span", { class: "big" }, money(costs.spot_savings))))
      : h("p", { class: "muted" }, "unavailable"));
    fill(attemptsP, h("h2", {}, "Attempts"), attempts.length ? h("table", { id: "attempts" },
      h("thead", {}, h("tr", {}, ["#", "Group", "Market", "Ray status", "Started", "Ended", "Cause", "Cost", "Ray"].map(c => h("th", {}, c)))),
      h("tbody", {}, attempts.map(a => {
        const c = costs && costs.attempts.find(x => x.number === a.number);
        return h("tr", {}, h("td", {}, a.number), h("td", {}, a.node_group || "-"), h("td", {}, a.market || "-"), h("td", {}, a.status),
          h("td", {}, when(a.started_at)), h("td", {}, when(a.ended_at)), h("td", { title: a.message || "" }, a.cause || "",
            a.preempt_for ? h("div", { class: "muted preempt" }, a.cause ? `for job ${a.preempt_for}` : `being preempted for job ${a.preempt_for}, stopped by ${when(a.preempt_deadline)}`) : null),
          h("td", { class: "num" }, c ? money(c.cost) : "-"),
          h("td", {}, a.dashboard_url ? h("a", { href: a.dashboard_url, target: "_blank", rel: "noopener" }, "dashboard \u2197") : "-"));
      }))) : h("p", { class: "muted" }, "No attempt yet."));
    fill(eventsP, h("h2", {}, "Events"), h("ol", { class: "timeline", id: "events" }, events.map(e => h("li", {},
      h("div", {}, e.from_status && e.from_status !== e.to_status ? [badge(e.from_status), " \u2192 "] : null, badge(e.to_status),
        e.attempt ? h("span", { class: "muted" }, ` attempt ${e.attempt}`) : null),
      h("div", {}, e.reason || ""), h("div", { class: "when" }, `${when(e.at)} \u00b7 ${e.actor}`)))));
    // A running sweep's trials arrive as they finish: read them each poll until it ends.
    const key = TERMINAL.has(job.status) ? job.status + ":" + job.updated_at : Date.now();
    if (job.spec.sweep && trialsShownFor !== key) {  // trials come from the spec's sweep section
      trialsShownFor = key;
      await loadTrials(job);
    }
    return !TERMINAL.has(job.status);  // a finished job stops polling
  }

  async function loadTrials(job) {
    const trials = await api(`/v1/jobs/${id}/trials`);
    if (seq !== viewSeq) return;
    const metric = job.spec.sweep.metric, mode = job.spec.sweep.mode;
    const inOrder = [...trials].sort((a, b) => a.trial_id < b.trial_id ? -1 : a.trial_id > b.trial_id ? 1 : 0);
    const params = [...new Set(trials.flatMap(t => Object.keys(t.config || {})))].sort();
    fill(trialsP, 
      panel(`Trials: ${metric} (${mode}) over ${trials.length} trials`, trialsChart(inOrder, metric, mode),
        h("div", { class: "legend" }, h("span", {}, h("i", { style: "background:#2f6fed" }), "trial"),
          h("span", {}, h("i", { style: "background:#1f9d55" }), `best so far (${mode})`),
          h("span", {}, h("i", { style: "background:#d64545" }), "errored"))),
      panel("Trials, best first", trials.length ? h("table", { id: "trials" },
        h("thead", {}, h("tr", {}, h("th", {}, "#"), h("th", {}, "trial"), h("th", { class: "num" }, metric),
          params.map(p => h("th", { class: "num" }, p)), h("th", {}, "status"), h("th", {}, "node group"))),
        h("tbody", {}, trials.map((t, i) => h("tr", {}, h("td", {}, i + 1), h("td", { class: "mono" }, t.trial_id),
          h("td", { class: "num" }, typeof t.metrics[metric] === "number" ? String(Number(t.metrics[metric].toPrecision(5))) : "-"),
          params.map(p => h("td", { class: "num" }, typeof t.config[p] === "number" ? Number(t.config[p].toPrecision(4)) : String(t.config[p] ?? "-"))),
          h("td", {}, t.status), h("td", {}, t.node_group || "-")))))
        : h("p", { class: "muted" }, "No trials reported yet.")));
  }

  load().catch(() => {});
  poll(load);
}

// Schedules -----------------------------------------------------------------

function schedulesView(view) {
  const body = h("div", { id: "schedules" });
  const msg = h("span", { class: "muted", id: "schedule-msg" });
  view.append(h("h1", {}, "Schedules"), h("p", { class: "muted" }, "Specs submitted at the ticks of a cron expression (POST /v1/schedules)."), msg, body);
  const seq = viewSeq;
  async function toggle(sch) {
    try { await api(`/v1/schedules/${sch.id}/${sch.paused ? "resume" : "pause"}`, { method: "POST" }); msg.textContent = ""; }
    catch (e) { msg.textContent = e.message; msg.className = "error"; }
    load().catch(() => {});
  }
  async function load() {
    let list;
    try { list = await api("/v1/schedules"); } catch (e) { if (seq === viewSeq) fill(body, errorBox(e)); throw e; }
    if (seq !== viewSeq) return;
    fill(body, panel(null, list.length ? h("div", { class: "scroll" }, h("table", { id: "schedule-table" },
      h("thead", {}, h("tr", {}, ["Name", "Project", "Cron", "Next run", "Policies", "", ""].map(c => h("th", {}, c)))),
      h("tbody", {}, list.map(x => h("tr", { "data-schedule": x.id },
        h("td", {}, h("b", {}, x.name)), h("td", {}, x.project), h("td", { class: "mono" }, `${x.cron} (${x.timezone})`),
        h("td", {}, x.paused ? h("span", { class: "muted" }, "paused") : when(x.next_runs[0])),
        h("td", { class: "muted" }, `overlap ${x.overlap}, missed ${x.missed}`),
        h("td", {}, h("a", { href: `#/jobs?label=${encodeURIComponent("raylane.schedule=" + x.id)}` }, "its jobs")),
        h("td", {}, h("button", { class: "secondary", onclick: () => toggle(x) }, x.paused ? "Resume" : "Pause")))))))
      : h("p", { class: "empty" }, "No schedules.")));
  }
  load().catch(() => {});
  poll(load);
}

// Node groups ---------------------------------------------------------------

function capBar(used, cap) {
  if (!cap) return h("span", { class: "muted" }, used ? `${num(used)} used, no capacity` : "-");
  const frac = Math.min(1, used / cap);
  return h("div", {}, h("div", { class: "bar" + (frac > 0.85 ? " hot" : ""), title: `${num(used)} of ${num(cap)}` },
    h("span", { style: `width:${(frac * 100).toFixed(1)}%` })), h("span", { class: "muted" }, `${num(used)} / ${num(cap)}`));
}

// A fleet of several clusters (GET /v1/fleet): each cluster, its tier and state, what runs there, its groups.
function fleetPanel(f) {
  if (!f || f.clusters.length < 2) return null;
  const note = f.dispatching
    ? `Jobs are placed across the clusters${f.placing ? `; ${f.placing} waiting to be placed` : ""}.`
    : "Jobs run on the attached cluster alone: the fleet file lacks the other clusters' reach.";
  return panel(`Fleet ${f.name}`, h("p", { class: "muted" }, note), h("table", { id: "fleet" },
    h("thead", {}, h("tr", {}, ["Cluster", "Tier", "State", "Jobs", "Groups", "Cost"].map(c => h("th", {}, c)))),
    h("tbody", {}, f.clusters.map(c => h("tr", { "data-cluster": c.name },
      h("td", {}, h("b", {}, c.name), c.attached ? h("span", { class: "muted" }, " (attached)") : null),
      h("td", {}, c.tier), h("td", { class: "cluster-" + c.state.replace(/ /g, "-") }, c.state),
      h("td", {}, `${c.active_jobs} active, ${c.queued_jobs} queued`),
      h("td", {}, c.groups.map(g => `${g.name}${g.gpus ? ` (${g.gpus} GPU)` : ""} ${g.min_nodes}-${g.max_nodes}`).join(", ")),
      h("td", {}, c.cost.model === "fixed" ? `${money(c.cost.per_hour)}/h fixed` : "per node-hour"))))));
}

function nodesView(view) {
  const body = h("div", { id: "node-groups" });
  const fleetBox = h("div", { id: "fleet-box" });
  view.append(h("h1", {}, "Node groups"), fleetBox, h("p", { class: "muted" }, "Capacity from Ray's live node list; use is what Raylane's active jobs hold."), body);
  const seq = viewSeq;
  async function loadFleet() {
    let f;
    try { f = await api("/v1/fleet"); } catch (e) { return; }  // the groups below say what is wrong
    if (seq !== viewSeq) return;
    const p = fleetPanel(f);
    if (p) fill(fleetBox, p); else fill(fleetBox);
  }
  async function load() {
    loadFleet();  // beside the groups, on the same poll
    let groups;
    try { groups = await api("/v1/node-groups"); } catch (e) {
      if (seq !== viewSeq) return;
      if (e.status === 422) {
        fill(body, panel("No Ray cluster attached", h("p", { id: "no-ray" }, e.message),
          h("p", { class: "muted" }, "Jobs are still accepted and queued; they are dispatched once a cluster is attached.")));
        return;
      }
      fill(body, errorBox(e));
      throw e;
    }
    if (seq !== viewSeq) return;
    fill(body, panel(null, h("table", {},
      h("thead", {}, h("tr", {}, ["Group", "Market", "Accelerator", "Nodes", "CPU", "GPU", "Jobs", "$/node-h"].map(c => h("th", {}, c)))),
      h("tbody", {}, groups.map(g => h("tr", {},
        h("td", {}, h("b", {}, g.name), g.role === "head" ? h("span", { class: "muted" }, " (head)") : null),
        h("td", {}, g.market), h("td", {}, g.accelerator ? `${g.accelerator.count} x ${g.accelerator.type}` : "-"),
        h("td", {}, `${g.alive_nodes} up (${g.min_nodes}-${g.max_nodes})` + (g.draining_nodes ? `, ${g.draining_nodes} draining` : "")),
        h("td", {}, capBar(g.used_by_raylane.CPU || 0, g.capacity.CPU || 0)),
        h("td", {}, capBar(g.used_by_raylane.GPU || 0, g.capacity.GPU || 0)),
        h("td", {}, `${g.active_jobs} active, ${g.queued_jobs} queued`), h("td", { class: "num" }, num(g.price_per_hour))))))));
  }
  load().catch(() => {});
  poll(load);
}

// Costs ---------------------------------------------------------------------

const costState = { span: "7d", group_by: "project" };
const SPANS = { "24h": 86400e3, "7d": 7 * 86400e3, "30d": 30 * 86400e3 };

function costChart(rows) {
  const W = 1100, rowH = 30, L = 170, R = 110, T = 8;
  const H = T + rows.length * rowH + 8;
  const max = Math.max(1e-9, ...rows.map(r => r.on_demand_cost), ...rows.map(r => r.cost));
  const svg = s("svg", { class: "chart", id: "cost-chart", viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "cost per group" });
  rows.forEach((r, k) => {
    const y = T + k * rowH;
    const wOd = (r.on_demand_cost / max) * (W - L - R), wC = (r.cost / max) * (W - L - R);
    svg.appendChild(s("text", { x: L - 8, y: y + 17, "text-anchor": "end" }, r.key.length > 22 ? r.key.slice(0, 21) + "\u2026" : r.key));
    svg.appendChild(s("rect", { x: L, y: y + 4, width: Math.max(0, wOd).toFixed(1), height: 18, fill: "#d9e3fb", rx: 3 },
      s("title", {}, `${r.key}: on demand ${money(r.on_demand_cost)}`)));
    svg.appendChild(s("rect", { x: L, y: y + 4, width: Math.max(1, wC).toFixed(1), height: 18, fill: "#2f6fed", rx: 3, class: "cost-bar" },
      s("title", {}, `${r.key}: ${money(r.cost)}`)));
    svg.appendChild(s("text", { x: L + Math.max(wOd, wC) + 6, y: y + 17 }, money(r.cost)));
  });
  return svg;
}

function costsView(view) {
  const spanSel = h("select", { id: "c-span", "aria-label": "window" }, Object.keys(SPANS).map(k => h("option", { value: k, selected: costState.span === k }, "last " + k)));
  const bySel = h("select", { id: "c-group-by", "aria-label": "group by" }, ["project", "node_group", "kind"].map(k => h("option", { value: k, selected: costState.group_by === k }, "by " + k.replace("_", " "))));
  const body = h("div", { id: "costs" });
  const change = () => { costState.span = spanSel.value; costState.group_by = bySel.value; load(); };
  spanSel.addEventListener("change", change); bySel.addEventListener("change", change);
  view.append(h("h1", {}, "Costs and utilisation"), h("div", { class: "filters" }, spanSel, bySel), body);
  const seq = viewSeq;

  async function load() {
    const end = new Date(), start = new Date(end.getTime() - SPANS[costState.span]);
    const w = new URLSearchParams({ start: start.toISOString(), end: end.toISOString() });
    let costs, report;
    try {
      [costs, report] = await Promise.all([api(`/v1/costs?group_by=${costState.group_by}&${w}`), api(`/v1/report?${w}`)]);
    } catch (e) { if (seq === viewSeq) fill(body, errorBox(e)); throw e; }
    if (seq !== viewSeq) return;
    const t = costs.total;
    fill(body, 
      panel(null, h("div", { class: "stats" },
        h("div", {}, h("span", { class: "muted" }, "cost"), h("span", { class: "big", id: "total-cost" }, money(t.cost))),
        h("div", {}, h("span", { class: "muted" }, "on demand would be"), h("span", { class: "big" }, money(t.on_demand_cost))),
        h("div", {}, h("span", { class: "muted" }, "spot savings"), h("span", { class: "big" }, money(t.spot_savings))),
        h("div", {}, h("span", { class: "muted" }, "attempts / jobs"), h("span", { class: "big" }, `${t.attempts} / ${t.jobs}`)))),
      panel(`Cost by ${costState.group_by.replace("_", " ")}`, costs.rows.length ? [costChart(costs.rows),
        h("div", { class: "legend" }, h("span", {}, h("i", { style: "background:#2f6fed" }), "cost"), h("span", {}, h("i", { style: "background:#d9e3fb" }), "same on on-demand nodes")),
        h("table", {}, h("thead", {}, h("tr", {}, ["", "cost", "on demand", "spot savings", "attempts", "jobs", "CPU-h", "GPU-h"].map((c, i) => h("th", { class: i ? "num" : "" }, c)))),
          h("tbody", {}, costs.rows.map(r => h("tr", {}, h("td", {}, r.key), h("td", { class: "num" }, money(r.cost)), h("td", { class: "num" }, money(r.on_demand_cost)),
            h("td", { class: "num" }, money(r.spot_savings)), h("td", { class: "num" }, r.attempts), h("td", { class: "num" }, r.jobs),
            h("td", { class: "num" }, num(r.cpu_hours)), h("td", { class: "num" }, num(r.gpu_hours))))))]
        : h("p", { class: "empty" }, "No attempt held resources in this window.")),
      panel("GPU groups: own or rent?", report.gpu_groups.length ? h("table", { id: "gpu-decisions" },
        h("thead", {}, h("tr", {}, ["group", "utilisation", "", "break-even", "verdict", "advice"].map(c => h("th", {}, c)))),
        h("tbody", {}, report.gpu_groups.map(g => h("tr", {}, h("td", {}, g.node_group),
          h("td", {}, capBar(g.gpu_hours_used, g.gpu_hours_available)), h("td", {}, pct(g.utilisation)), h("td", {}, pct(g.break_even)),
          h("td", { class: "verdict-" + g.verdict }, g.verdict), h("td", {}, g.advice)))))
        : h("p", { class: "muted" }, "The profile has no GPU group.")),
      panel("Utilisation of every group", h("table", {},
        h("thead", {}, h("tr", {}, ["group", "market", "fleet", "CPU", "GPU"].map(c => h("th", {}, c)))),
        h("tbody", {}, report.utilisation.map(u => h("tr", {}, h("td", {}, u.node_group), h("td", {}, u.market),
          h("td", {}, `${u.nodes} node(s) (${u.basis})`),
          h("td", {}, u.cpu_hours_available ? [capBar(u.cpu_hours_used, u.cpu_hours_available), " ", pct(u.cpu_utilisation)] : "-"),
          h("td", {}, u.gpu_hours_available ? [capBar(u.gpu_hours_used, u.gpu_hours_available), " ", pct(u.gpu_utilisation)] : "-")))))),
      panel("Placements that could have been cheaper", report.cheaper_placements.length ? h("table", { id: "cheaper" },
        h("thead", {}, h("tr", {}, ["job", "kind", "ran on", "why", "cost", "cheaper on", "saving"].map(c => h("th", {}, c)))),
        h("tbody", {}, report.cheaper_placements.map(c => h("tr", {},
          h("td", {}, h("a", { href: "#/jobs/" + c.job_id }, c.name), h("span", { class: "muted" }, ` #${c.attempt}`)),
          h("td", {}, c.kind), h("td", {}, `${c.node_group} (${c.market})`), h("td", {}, c.reason),
          h("td", { class: "num" }, money(c.cost)), h("td", {}, c.cheaper_node_group), h("td", { class: "num" }, money(c.saving))))))
        : h("p", { class: "muted" }, "None found in this window.")),
      h("p", { class: "muted" }, report.notes.join(" \u00b7 ")));
  }
  load().catch(() => {});
}

// Ray's reachability ---------------------------------------------------------

async function checkRay() {
  const b = document.getElementById("ray-banner");
  if (!document.hidden) {
    try {
      const r = await fetch("/readyz", { headers: { "Accept": "application/json" } });
      const ray = (await r.json()).ray;
      b.textContent = ray && ray.state === "unreachable"
        ? `${ray.reason}: jobs are accepted and wait; they start when Ray is back.` : "";
      b.hidden = !b.textContent;
    } catch (e) { /* the server itself did not answer: the open view says so */ }
  }
  setTimeout(checkRay, RAY_POLL_MS);
}

showTokenState();
route();
checkRay();
