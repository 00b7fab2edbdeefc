/* The sign-in page a dashboard link leads to when the browser has no /ray session
 * (api/rayproxy.py sends it here): trade the API token for the session cookie,
 * then go back to the link. A script file: the page's CSP allows no inline script. */
"use strict";
// Where to go back to: only a page of this server's /ray (never another site);
// the dashboard link's #/jobs/... came along in location.hash.
const TOKEN_KEY = "raylane_token";  // the same key as app.js: /ui signs in with it too
const asked = new URLSearchParams(location.search).get("next") || "";
const next = (/^\/([\w.-]+\/)*ray\/[\w./-]*$/.test(asked) && !asked.includes("..") && !asked.startsWith("//"))
  ? asked : "../ray/";
const target = next + location.hash;
document.getElementById("signin-next").textContent = target;
const state = document.getElementById("signin-state");

async function signIn(token) {
  const r = await fetch("../v1/session", { method: "POST", headers: { "Authorization": "Bearer " + token } });
  if (!r.ok) {
    let why = "";
    try { why = (await r.json()).detail; } catch (e) { why = r.statusText; }
    throw new Error(`the server refused the token (${r.status}): ${why}`);
  }
  localStorage.setItem(TOKEN_KEY, token);
  location.replace(target);
}

document.getElementById("signin-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  state.textContent = "signing in\u2026";
  signIn(document.getElementById("signin-token").value.trim()).catch(e => {
    state.textContent = e.message; state.className = "error";
  });
});

// A token this browser already has (from /ui): its session ran out; renew it without asking.
const known = localStorage.getItem(TOKEN_KEY);
if (known) {
  state.textContent = "signing in with this browser's token\u2026";
  signIn(known).catch(e => { localStorage.removeItem(TOKEN_KEY); state.textContent = e.message + "; give a token"; });
}
