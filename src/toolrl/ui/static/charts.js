// Line charts in SVG: one chart per metric, one line per run (or per metric of a family such as stop/*),
// evaluations as dots; hover shows the values at the nearest step.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
// a run's colour (Runs.colorOf): its place in the order the runs started, in 20 colours told apart
const RUN_PALETTE = [...PALETTE, "#4338ca", "#65a30d", "#0f766e", "#9f1239", "#0284c7", "#c026d3", "#92400e",
  "#475569", "#d97706", "#059669", "#6d28d9", "#111827"];
const DASHES = ["", "5 3", "2 2", "8 3 2 3", "1 3", "10 4"]; // a family's keys told apart in several runs' colours
const LEGEND_MAX = 6; // a chart's legend names this many lines at most, then "+N more" (every name in its tooltip)
// A drag across a chart (a zoom being chosen) is under way: the runs view holds its redraws until it ends.
const CHART_DRAG = { active: false };
window.addEventListener("mouseup", () => { // released anywhere: a drag let go outside its chart zooms nothing
  CHART_DRAG.active = false;
  if (CHART_DRAG.release) CHART_DRAG.release();
  CHART_DRAG.release = null;
});

function s(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

// Two values apart by less than their own rounding noise (smoothed rewards 0.3 and 0.30000000000000004) span nothing.
const spansNothing = (lo, hi) => !(hi - lo > 1e-9 * Math.max(Math.abs(lo), Math.abs(hi)));

// Round ticks from lo to hi, about count of them. They are counted by index, not summed: a step below a value's
// resolution had added nothing forever ("Invalid array length" on a zoomed chart of nearly equal values).
function ticks(lo, hi, count = 4) {
  if (spansNothing(lo, hi)) return [lo];
  const step = Math.pow(10, Math.floor(Math.log10((hi - lo) / count)));
  const nice = [1, 2, 5, 10].map((m) => m * step).find((v) => (hi - lo) / v <= count) || step * 10;
  const digits = Math.min(15, Math.max(6, Math.ceil(Math.log10(Math.max(Math.abs(lo), Math.abs(hi)) / nice)) + 2));
  const out = [];
  for (let i = Math.ceil(lo / nice); i * nice <= hi + nice * 1e-9 && out.length <= 2 * count + 2; i += 1) {
    out.push(+(i * nice).toPrecision(digits));
  }
  return out;
}

// Whole ticks from lo to hi, about count of them, at least 1 apart.
function integerTicks(lo, hi, count) {
  const out = ticks(lo, hi, count).filter(Number.isInteger);
  if (out.length >= 2 || Math.floor(hi) - Math.ceil(lo) < 1) return out.length ? out : [Math.round((lo + hi) / 2)];
  return [Math.ceil(lo), Math.floor(hi)];
}

// Ticks of a log-scale axis from 10^lo to 10^hi (lo, hi in decades): powers of ten over two decades or more, else
// 1-2-5 (then 1-9) times them, else round values as on a linear axis: never fewer than two where the values differ
// (a chart of 0.01-0.02 had one tick, "0.01").
function logTicks(lo, hi, count = 4) {
  const inside = (t) => t > 0 && Math.log10(t) >= lo - 1e-9 && Math.log10(t) <= hi + 1e-9;
  const decades = ticks(Math.floor(lo), Math.ceil(hi), count).filter(Number.isInteger).map((e) => 10 ** e).filter(inside);
  if (decades.length >= 3) return decades;
  for (const steps of [[1, 2, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9]]) {
    const out = [];
    for (let e = Math.floor(lo); e <= Math.ceil(hi); e += 1) {
      for (const m of steps) out.push(+(m * 10 ** e).toPrecision(12));
    }
    const kept = out.filter(inside);
    if (kept.length >= 2 && kept.length <= 2 * count + 2) return kept;
  }
  const linear = ticks(10 ** lo, 10 ** hi, count).filter(inside);
  return linear.length ? linear : [10 ** lo];
}

// Labels for ticks, each told from its neighbours: the fewest significant digits (2 or more) that keep them apart
// (0.01, 0.015, 0.02 had all read "0.01").
function tickLabels(values) {
  for (let digits = 2; digits <= 15; digits += 1) {
    const labels = values.map((t) => fmt(t, digits));
    if (new Set(labels).size === labels.length) return labels;
  }
  return values.map(String);
}

// series: [{label, color, points: [[x, y, step]...], dots: bool, faint: bool, run}]; a point whose y is null is a
// gap in its line. opts: {xLabel, range: [lo, hi] (zoom), onZoom(lo, hi) (drag across a chart; double-click
// resets with onZoom(null)), onPick(run, step) (click: that step's trajectories), log (a log-scale y axis: values
// at or below 0 are gaps), onLog(on) (its toggle), hideEmpty (null instead of an empty "not logged" chart)}.
function lineChart(title, metric, series, opts = {}) {
  const W = 300, H = 170, L = 42, R = 8, T = 22, B = 24;
  if (opts.range || opts.log) {
    const [lo, hi] = opts.range || [-Infinity, Infinity];
    const kept = (p) => (opts.log && p[1] !== null && !(p[1] > 0) ? [p[0], null, p[2]] : p);
    series = series.map((one) => ({ ...one, points: one.points.filter((p) => p[0] >= lo && p[0] <= hi).map(kept) }));
  }
  const v = opts.log ? Math.log10 : (y) => y; // the y axis's scale
  let count = 0, x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const one of series) {
    for (const p of one.points) {
      if (p[1] === null) continue;
      count += 1;
      if (p[0] < x0) x0 = p[0];
      if (p[0] > x1) x1 = p[0];
      const y = v(p[1]);
      if (y < y0) y0 = y;
      if (y > y1) y1 = y;
    }
  }
  if (!count && opts.hideEmpty) return null;
  const box = h("div", { class: "chart", dataset: { metric, points: String(count), scale: opts.log ? "log" : "linear" } });
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": title });
  // a long title is cut before the chart's buttons, whole in its tooltip (it had run under the PNG button)
  const shortTitle = title.length > 30 ? `${title.slice(0, 29)}…` : title;
  svg.append(s("text", { x: L, y: 14, class: "chart-title" }, s("title", {}, title), shortTitle));
  box.append(svg);
  if (!count) {
    svg.append(s("text", { x: W / 2, y: H / 2, class: "chart-empty", "text-anchor": "middle" }, "not logged"));
    return box;
  }
  if (spansNothing(x0, x1)) { x0 -= 1; x1 += 1; }
  if (opts.live && !opts.range) x1 += Math.max(1, (x1 - x0) * 0.05); // room for the next steps (extend)
  if (spansNothing(y0, y1)) { y0 -= Math.abs(y0) * 0.1 || 0.5; y1 += Math.abs(y1) * 0.1 || 0.5; }
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => H - B - ((v(y) - y0) / (y1 - y0)) * (H - T - B);
  const yTicks = opts.log ? logTicks(y0, y1) : ticks(y0, y1);
  const shownY = yTicks.filter((t) => v(t) >= y0 - 1e-9 && v(t) <= y1 + 1e-9);
  const yLabels = tickLabels(shownY);
  shownY.forEach((t, i) => {
    svg.append(s("line", { x1: L, x2: W - R, y1: Y(t), y2: Y(t), class: "grid" }));
    svg.append(s("text", { x: L - 4, y: Y(t) + 3, "text-anchor": "end", class: "tick" }, yLabels[i]));
  });
  // an axis of whole numbers (steps, samples) has whole ticks only (a 3-step run had 1, 1.5, 2)
  const whole = series.every((one) => one.points.every((p) => Number.isInteger(p[0])));
  const xTicks = whole ? integerTicks(x0, x1, 5) : ticks(x0, x1, 5);
  const xLabels = tickLabels(xTicks);
  xTicks.forEach((t, i) => {
    // a tick at either edge is anchored inside the chart (the last one had been cut: "500(")
    const anchor = X(t) > W - R - 14 ? "end" : X(t) < L + 8 ? "start" : "middle";
    svg.append(s("text", { x: X(t), y: H - 8, "text-anchor": anchor, class: "tick" }, xLabels[i]));
  });
  if (opts.xLabel && opts.xLabel !== "step") {
    svg.append(s("text", { x: W - R, y: H - 1, "text-anchor": "end", class: "tick" }, opts.xLabel));
  }
  // a line's path: drawn at the chart's resolution (a pixel column's first, lowest, highest and last point; hover
  // reads the whole line), then extended point by point as the run logs more (extend, below)
  const segment = (points, pen) => {
    let d = "";
    for (const [x, y] of points) {
      if (y === null || (opts.log && !(y > 0))) { pen = "M"; continue; }  // the next point starts a new piece of line
      d += `${pen}${X(x).toFixed(1)},${Y(y).toFixed(1)}`;
      pen = "L";
    }
    return [d, pen];
  };
  const ring = (one, x, y) => s("circle", { cx: X(x), cy: Y(y), r: 3.5, fill: "#fff", stroke: one.color, "stroke-width": 1.6, class: "eval-dot" });
  const lines = series.map((one) => {
    if (!one.points.length) return null;
    if (one.dots) {
      // evaluations: hollow rings, not the line's filled colour
      for (const [x, y] of one.points) if (y !== null) svg.append(ring(one, x, y));
      return null;
    }
    const drawn = perPixel(one.points, X);
    const [d, pen] = segment(drawn, "M");
    const width = one.faint ? 1 : 1.6, cls = one.faint ? "series-raw" : "series";
    const path = s("path", { d, stroke: one.color, fill: "none", "stroke-width": width, class: cls, opacity: one.faint ? 0.3 : 1, "data-pieces": String((d.match(/M/g) || []).length), "data-drawn": String(drawn.length) });
    if (one.dash) path.setAttribute("stroke-dasharray", one.dash);
    if (d) svg.append(path);
    return { path, d, pen, drawn: drawn.length };
  });
  // A live run's new points go onto the chart as it is when they fall inside its axes (a live chart's x axis keeps
  // 5% room on the right): its path is extended, nothing else drawn again. Where a point falls outside, or the lines
  // are not the same ones, extend says false and the caller draws the chart anew.
  let had = series.map((one) => one.points.length); // the points drawn of each line (its array may grow in place)
  box.extend = (next) => {
    if (opts.range || next.length !== series.length || lines.some((line, i) => !line && !series[i].dots && next[i].points.length)) return false;
    if (next.some((one, i) => one.label !== series[i].label || one.dots !== series[i].dots || one.faint !== series[i].faint || one.points.length < had[i])) return false;
    const fresh = next.map((one, i) => one.points.slice(had[i]));
    const inside = (p) => p[0] >= x0 && p[0] <= x1 && (p[1] === null || (opts.log && !(p[1] > 0)) || (v(p[1]) >= y0 && v(p[1]) <= y1));
    if (!fresh.every((points) => points.every(inside))) return false;
    next.forEach((one, i) => {
      if (!fresh[i].length) return;
      if (one.dots) { for (const [x, y] of fresh[i]) if (y !== null) svg.insertBefore(ring(one, x, y), cursor); return; }
      const line = lines[i];
      const [d, pen] = segment(fresh[i], line.pen);
      [line.d, line.pen] = [line.d + d, pen];
      line.path.setAttribute("d", line.d);
      line.drawn += fresh[i].length;
      line.path.dataset.drawn = String(line.drawn);
      if (!line.path.isConnected && line.d) svg.insertBefore(line.path, cursor);
    });
    series = next;
    had = series.map((one) => one.points.length);
    box.dataset.points = String(+box.dataset.points + fresh.flat().filter((p) => p[1] !== null).length);
    box.dataset.extended = String(+(box.dataset.extended || 0) + 1);
    return true;
  };
  // a compact legend: LEGEND_MAX lines named, the rest counted (a 12-run legend had been taller than its plot)
  const named = series.filter((o) => o.points.length && !o.faint);
  const head = named.length > LEGEND_MAX ? named.slice(0, LEGEND_MAX - 1) : named, rest = named.slice(head.length);
  const legend = h("div", { class: "legend" }, head.map((one) =>
    h("span", {}, h("i", { class: one.dots ? "ring" : "", style: one.dots ? `border-color:${one.color}`
      : one.dash ? `background:repeating-linear-gradient(90deg, ${one.color} 0 3px, transparent 3px 5px)` : `background:${one.color}` }), one.label)),
    rest.length ? h("span", { class: "more", title: rest.map((one) => one.label).join("\n") }, `+${rest.length} more`) : null);
  box.append(legend);
  const cursor = s("line", { y1: T, y2: H - B, class: "cursor", visibility: "hidden" });
  svg.append(cursor);
  const tip = h("div", { class: "tip", hidden: true });
  box.append(tip);
  svg.addEventListener("mousemove", (event) => {
    const rect = svg.getBoundingClientRect();
    const x = x0 + ((event.clientX - rect.left) * (W / rect.width) - L) / (W - L - R) * (x1 - x0);
    const lines = [];
    let at = null;
    for (const one of series) {
      if (one.faint) continue;
      const best = nearest(one.points, x);
      if (best) { lines.push(`${one.label}: ${fmt(best[1])} (step ${best[2] ?? best[0]})`); at = at ?? best[0]; }
    }
    if (at === null) return;
    cursor.setAttribute("x1", X(at)); cursor.setAttribute("x2", X(at));
    cursor.setAttribute("visibility", "visible");
    tip.textContent = lines.join("\n");
    tip.hidden = false;
  });
  svg.addEventListener("mouseleave", () => { tip.hidden = true; cursor.setAttribute("visibility", "hidden"); });
  const toX = (event) => {
    const rect = svg.getBoundingClientRect();
    return x0 + ((event.clientX - rect.left) * (W / rect.width) - L) / (W - L - R) * (x1 - x0);
  };
  let dragFrom = null;
  const band = s("rect", { y: T, height: H - T - B, class: "zoom-band", visibility: "hidden" });
  svg.append(band);
  const release = () => { dragFrom = null; band.setAttribute("visibility", "hidden"); };
  svg.addEventListener("mousedown", (event) => {
    event.preventDefault(); // a drag chooses a zoom, it does not select the chart's text (which holds the redraws)
    dragFrom = toX(event);
    CHART_DRAG.active = true;
    CHART_DRAG.release = release;
  });
  svg.addEventListener("mousemove", (event) => {
    if (dragFrom === null) return;
    const [a, b] = [dragFrom, toX(event)].sort((p, q) => p - q);
    band.setAttribute("x", X(a)); band.setAttribute("width", Math.max(0, X(b) - X(a)));
    band.setAttribute("visibility", "visible");
  });
  svg.addEventListener("mouseup", (event) => { // (CHART_DRAG ends where the event reaches the window)
    if (dragFrom === null) return;
    const to = toX(event), from = dragFrom;
    release();
    if (Math.abs(X(to) - X(from)) > 6 && opts.onZoom) { opts.onZoom(Math.min(from, to), Math.max(from, to)); return; }
    // a click: the nearest point of a line, then that step's trajectories
    let best = null;
    for (const one of series) {
      if (one.faint || one.dots || !one.run) continue;
      const p = nearest(one.points, to);
      if (p && (!best || Math.abs(p[0] - to) < Math.abs(best.p[0] - to))) best = { p, run: one.run };
    }
    if (best && opts.onPick) opts.onPick(best.run, best.p[2]);
  });
  svg.addEventListener("dblclick", () => { if (opts.onZoom) opts.onZoom(null); });
  const png = h("button", { class: "chart-png", title: "download this chart as PNG", onclick: () => downloadPng(svg, metric) }, "PNG");
  box.append(png);
  if (opts.onLog) {
    box.append(h("button", { class: `chart-log${opts.log ? " on" : ""}`, title: "log scale (values above 0)",
      "aria-pressed": String(Boolean(opts.log)), onclick: () => opts.onLog(!opts.log) }, "log"));
  }
  return box;
}

// The points of a line (in x order) that draw it at the chart's width: per pixel column its first, lowest, highest
// and last point, so that a line of 5,000 steps is drawn from at most 4 points a pixel and looks as the whole one
// does (its peaks kept); a gap (y null) is kept where it is.
function perPixel(points, X) {
  const out = [];
  let column = null, bucket = [];
  const flush = () => {
    if (bucket.length <= 4) { out.push(...bucket); bucket = []; return; }
    let lo = bucket[0], hi = bucket[0];
    for (const p of bucket) { if (p[1] < lo[1]) lo = p; if (p[1] > hi[1]) hi = p; }
    const picked = new Set([bucket[0], lo, hi, bucket[bucket.length - 1]]);
    for (const p of bucket) if (picked.has(p)) out.push(p);
    bucket = [];
  };
  for (const p of points) {
    if (p[1] === null) { flush(); out.push(p); column = null; continue; }
    const c = Math.floor(X(p[0]));
    if (c !== column) { flush(); column = c; }
    bucket.push(p);
  }
  flush();
  return out;
}

// The point of a line (in x order) nearest x whose value is not a gap: a binary search, then the nearest valued
// neighbour on either side.
function nearest(points, x) {
  let lo = 0, hi = points.length - 1;
  if (hi < 0) return null;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (points[mid][0] < x) lo = mid + 1; else hi = mid; }
  let left = lo - 1, right = lo;
  while (left >= 0 && points[left][1] === null) left -= 1;
  while (right < points.length && points[right][1] === null) right += 1;
  const [a, b] = [points[left], points[right]];
  if (!a || !b) return a || b || null;
  return Math.abs(a[0] - x) < Math.abs(b[0] - x) ? a : b;
}

// One chart as a PNG: the SVG drawn on a canvas at twice its size, styles inlined.
function downloadPng(svg, metric) {
  const copy = svg.cloneNode(true);
  copy.setAttribute("xmlns", SVG);
  const style = document.createElementNS(SVG, "style");
  style.textContent = ".grid{stroke:#eef0f3}.tick{font-size:9px;fill:#6b7280}.chart-title{font-size:11px;font-weight:600}" +
    ".cursor,.zoom-band{display:none}";
  copy.prepend(style);
  const [w, h2] = [300, 170];
  const image = new Image();
  image.onload = () => {
    const canvas = document.createElement("canvas");
    canvas.width = w * 2; canvas.height = h2 * 2;
    const ctx = canvas.getContext("2d");
    ctx.fillStyle = "#fff"; ctx.fillRect(0, 0, canvas.width, canvas.height);
    ctx.drawImage(image, 0, 0, canvas.width, canvas.height);
    download(canvas.toDataURL("image/png"), `${metric.replace(/[^\w.-]+/g, "_")}.png`);
  };
  image.src = "data:image/svg+xml;charset=utf-8," + encodeURIComponent(new XMLSerializer().serializeToString(copy));
}

function download(url, name) {
  const link = h("a", { href: url, download: name });
  document.body.append(link);
  link.click();
  link.remove();
}
