// toolrl ui: shared helpers (elements built from text only, never from HTML), the API, tabs and polling.
"use strict";

const UI = { tabs: {}, timers: {}, busy: new Set(), asked: {}, runs: [] };

// The access token came in the URL and is now a cookie: keep it out of the address bar and the history.
if (new URLSearchParams(location.search).has("token")) {
  history.replaceState(null, "", location.pathname + location.hash);
}

function h(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (key === "dataset") Object.assign(node.dataset, value);
    else node.setAttribute(key, value === true ? "" : value);
  }
  for (const child of children.flat()) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function $(selector) { return document.querySelector(selector); }

function showError(message) {
  const box = $("#error");
  box.textContent = message || "";
  box.hidden = !message;
}

async function api(path, body) {
  const options = body === undefined ? {} : {
    method: "POST",
    headers: { "Content-Type": "application/json", "X-Toolrl": "1" },
    body: JSON.stringify(body),
  };
  const response = await fetch(path, options);
  // the token this page had is no longer good (the UI started again with a new one): the token page, view kept
  if (response.status === 401 && UI.hadAccess) { location.reload(); return new Promise(() => {}); }
  if (response.ok) UI.hadAccess = true;
  const data = await response.json().catch(() => ({ error: `${response.status} ${response.statusText}` }));
  if (!response.ok) throw new Error(data.error || `${response.status}`);
  return data;
}

// A request of `kind` begins: the check it returns stays true until the next one of that kind begins. An answer
// that arrives after a newer request's (a slow server, a second click) is dropped, never shown over the newer one.
function latest(kind) {
  const n = (UI.asked[kind] = (UI.asked[kind] || 0) + 1);
  return () => UI.asked[kind] === n;
}

// Run an async action, showing its one-line error at the top of the page.
async function attempt(action) {
  try {
    const result = await action();
    showError("");
    return result;
  } catch (err) {
    showError(err.message);
    return undefined;
  }
}

// A number with `digits` significant digits (trailing zeros dropped); below 0.001 or from 10^digits on, as long as
// it takes to keep them: 0.000123 -> "1.23e-4", 1234.567 -> "1235", 0.5 -> "0.5". Fixed decimals had shown two
// learning rates, 0.000123 and 0.000456, both as "0.000".
function fmt(value, digits = 3) {
  if (value === undefined || value === null) return "";
  if (typeof value !== "number") return String(value);
  if (Number.isInteger(value) || !Number.isFinite(value)) return String(value);
  const size = Math.abs(value);
  if (size < 1e-3) return value.toExponential(digits - 1).replace(/\.?0+e/, "e");
  if (size >= 10 ** digits) return String(Math.round(value));
  return String(Number(value.toPrecision(digits)));
}

function percent(value) { return value === undefined || value === null ? "" : `${(100 * value).toFixed(1)}%`; }

function ago(seconds) {
  const s = Date.now() / 1000 - seconds;
  if (s < 60) return `${Math.max(0, Math.round(s))} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  return `${Math.round(s / 3600)} h ago`;
}

function badge(state) { return h("span", { class: `badge state-${state}` }, state); }

function fillSelect(select, values, keep = true) {
  const previous = select.value;
  select.replaceChildren(...values.map(([value, label]) => h("option", { value }, label)));
  if (keep && values.some(([value]) => String(value) === previous)) select.value = previous;
}

// Polling: one named timer per view; a view stops its own when it is left.
// `fn` now and every `ms` after; a tick while its last call still waits on the server is skipped (two polls of a
// run's metrics from the same offset had both appended the same records)
function every(name, ms, fn) {
  clearInterval(UI.timers[name]);
  const tick = async () => {
    if (UI.busy.has(name)) return;
    UI.busy.add(name);
    try { await fn(); } finally { UI.busy.delete(name); }
  };
  tick();
  UI.timers[name] = setInterval(tick, ms);
}
function stop(name) { clearInterval(UI.timers[name]); delete UI.timers[name]; }

// Each view's state lives in the URL's hash, `#tab?key=value&...`: a reload, or the link opened in another browser
// (after its token), shows the same view. replaceState: no history entry per click, and no hashchange event.
function hashTab() { return location.hash.slice(1).split("?")[0]; }
function hashParams() { return new URLSearchParams(location.hash.slice(1).split("?")[1] || ""); }
function setHash(tab, params) {
  const kept = Object.entries(params).filter(([, v]) => v !== undefined && v !== null && v !== "" && !(Array.isArray(v) && !v.length));
  const query = new URLSearchParams(kept.map(([k, v]) => [k, Array.isArray(v) ? v.join(",") : String(v)])).toString();
  const hash = `#${tab}${query ? `?${query}` : ""}`;
  if (location.hash !== hash) history.replaceState(null, "", location.pathname + hash);
}

function showTab(name) {
  for (const button of document.querySelectorAll("#tabs button")) {
    button.classList.toggle("active", button.dataset.tab === name);
  }
  for (const section of document.querySelectorAll("section.tab")) section.hidden = section.id !== `tab-${name}`;
  for (const [tab, view] of Object.entries(UI.tabs)) if (tab !== name && view.leave) view.leave();
  if (UI.tabs[name] && UI.tabs[name].enter) UI.tabs[name].enter();
  if (hashTab() !== name) history.replaceState(null, "", `#${name}`); // the tab's own state stays in its hash
}

async function refreshRuns() {
  const data = await api("/api/runs");
  UI.runs = data.runs;
  $("#root").textContent = data.root;
  return data.runs;
}

window.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("#tabs button")) {
    button.addEventListener("click", () => showTab(button.dataset.tab));
  }
  const fromHash = () => { const name = hashTab(); showTab(UI.tabs[name] ? name : "runs"); };
  window.addEventListener("hashchange", fromHash);
  fromHash();
});
