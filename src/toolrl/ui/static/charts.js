// Line charts in SVG: one chart per metric, one line per run (or per metric of a family such as stop/*),
// evaluations as dots; hover shows the values at the nearest step.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];

function s(tag, attrs, ...children) {
  const node = document.createElementNS(SVG, tag);
  for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, value);
  for (const child of children) node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  return node;
}

function ticks(lo, hi, count = 4) {
  if (hi === lo) return [lo];
  const step = Math.pow(10, Math.floor(Math.log10((hi - lo) / count)));
  const nice = [1, 2, 5, 10].map((m) => m * step).find((v) => (hi - lo) / v <= count) || step * 10;
  const out = [];
  for (let v = Math.ceil(lo / nice) * nice; v <= hi + 1e-12; v += nice) out.push(+v.toPrecision(6));
  return out;
}

// series: [{label, color, points: [[x, y, step]...], dots: bool, faint: bool, run}]; a point whose y is null is a
// gap in its line. opts: {xLabel, range: [lo, hi] (zoom), onZoom(lo, hi) (drag across a chart; double-click
// resets with onZoom(null)), onPick(run, step) (click: that step's trajectories), log (a log-scale y axis: values
// at or below 0 are gaps), onLog(on) (its toggle), hideEmpty (null instead of an empty "not logged" chart)}.
function lineChart(title, metric, series, opts = {}) {
  const W = 300, H = 170, L = 42, R = 8, T = 22, B = 24;
  const [lo, hi] = opts.range || [-Infinity, Infinity];
  const kept = (p) => (opts.log && p[1] !== null && !(p[1] > 0) ? [p[0], null, p[2]] : p);
  series = series.map((one) => ({ ...one, points: one.points.filter((p) => p[0] >= lo && p[0] <= hi).map(kept) }));
  const all = series.flatMap((one) => one.points).filter((p) => p[1] !== null);
  if (!all.length && opts.hideEmpty) return null;
  const box = h("div", { class: "chart", dataset: { metric, points: String(all.length), scale: opts.log ? "log" : "linear" } });
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: "img", "aria-label": title });
  // a long title is cut before the chart's buttons, whole in its tooltip (it had run under the PNG button)
  const shortTitle = title.length > 30 ? `${title.slice(0, 29)}…` : title;
  svg.append(s("text", { x: L, y: 14, class: "chart-title" }, s("title", {}, title), shortTitle));
  box.append(svg);
  if (!all.length) {
    svg.append(s("text", { x: W / 2, y: H / 2, class: "chart-empty", "text-anchor": "middle" }, "not logged"));
    return box;
  }
  const v = opts.log ? Math.log10 : (y) => y; // the y axis's scale
  let [x0, x1] = [Math.min(...all.map((p) => p[0])), Math.max(...all.map((p) => p[0]))];
  let [y0, y1] = [Math.min(...all.map((p) => v(p[1]))), Math.max(...all.map((p) => v(p[1])))];
  if (x0 === x1) { x0 -= 1; x1 += 1; }
  if (y0 === y1) { y0 -= Math.abs(y0) * 0.1 || 0.5; y1 += Math.abs(y1) * 0.1 || 0.5; }
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const Y = (y) => H - B - ((v(y) - y0) / (y1 - y0)) * (H - T - B);
  const yTicks = opts.log ? ticks(Math.floor(y0), Math.ceil(y1)).filter(Number.isInteger).map((e) => 10 ** e) : ticks(y0, y1);
  for (const t of yTicks.filter((t) => v(t) >= y0 - 1e-9 && v(t) <= y1 + 1e-9)) {
    svg.append(s("line", { x1: L, x2: W - R, y1: Y(t), y2: Y(t), class: "grid" }));
    svg.append(s("text", { x: L - 4, y: Y(t) + 3, "text-anchor": "end", class: "tick" }, fmt(t, 2)));
  }
  const xTicks = ticks(x0, x1, 5);
  for (const t of (xTicks.some((t) => !Number.isInteger(t)) ? xTicks : xTicks.filter(Number.isInteger))) {
    // a tick at either edge is anchored inside the chart (the last one had been cut: "500(")
    const anchor = X(t) > W - R - 14 ? "end" : X(t) < L + 8 ? "start" : "middle";
    svg.append(s("text", { x: X(t), y: H - 8, "text-anchor": anchor, class: "tick" }, fmt(t, 1)));
  }
  if (opts.xLabel && opts.xLabel !== "step") {
    svg.append(s("text", { x: W - R, y: H - 1, "text-anchor": "end", class: "tick" }, opts.xLabel));
  }
  for (const one of series) {
    if (!one.points.length) continue;
    if (one.dots) {
      // evaluations: hollow rings, not the line's filled colour
      for (const [x, y] of one.points) if (y !== null) svg.append(s("circle", { cx: X(x), cy: Y(y), r: 3.5, fill: "#fff", stroke: one.color, "stroke-width": 1.6, class: "eval-dot" }));
    } else {
      let d = "", pen = "M";
      for (const [x, y] of one.points) {
        if (y === null) { pen = "M"; continue; }  // the next point starts a new piece of line
        d += `${pen}${X(x).toFixed(1)},${Y(y).toFixed(1)}`;
        pen = "L";
      }
      const width = one.faint ? 1 : 1.6, cls = one.faint ? "series-raw" : "series";
      if (d) svg.append(s("path", { d, stroke: one.color, fill: "none", "stroke-width": width, class: cls, opacity: one.faint ? 0.3 : 1, "data-pieces": String((d.match(/M/g) || []).length) }));
    }
  }
  const legend = h("div", { class: "legend" }, series.filter((o) => o.points.length && !o.faint).map((one) =>
    h("span", {}, h("i", { class: one.dots ? "ring" : "", style: one.dots ? `border-color:${one.color}` : `background:${one.color}` }), one.label)));
  box.append(legend);
  const cursor = s("line", { y1: T, y2: H - B, class: "cursor", visibility: "hidden" });
  svg.append(cursor);
  const tip = h("div", { class: "tip", hidden: true });
  box.append(tip);
  svg.addEventListener("mousemove", (event) => {
    const rect = svg.getBoundingClientRect();
    const x = x0 + ((event.clientX - rect.left) * (W / rect.width) - L) / (W - L - R) * (x1 - x0);
    const lines = [];
    let nearest = null;
    for (const one of series) {
      if (one.faint) continue;
      let best = null;
      for (const p of one.points) if (p[1] !== null && (!best || Math.abs(p[0] - x) < Math.abs(best[0] - x))) best = p;
      if (best) { lines.push(`${one.label}: ${fmt(best[1])} (step ${best[2] ?? best[0]})`); nearest = nearest ?? best[0]; }
    }
    if (nearest === null) return;
    cursor.setAttribute("x1", X(nearest)); cursor.setAttribute("x2", X(nearest));
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
  svg.addEventListener("mousedown", (event) => { dragFrom = toX(event); });
  svg.addEventListener("mousemove", (event) => {
    if (dragFrom === null) return;
    const [a, b] = [dragFrom, toX(event)].sort((p, q) => p - q);
    band.setAttribute("x", X(a)); band.setAttribute("width", Math.max(0, X(b) - X(a)));
    band.setAttribute("visibility", "visible");
  });
  svg.addEventListener("mouseup", (event) => {
    if (dragFrom === null) return;
    const to = toX(event), from = dragFrom;
    dragFrom = null;
    band.setAttribute("visibility", "hidden");
    if (Math.abs(X(to) - X(from)) > 6 && opts.onZoom) { opts.onZoom(Math.min(from, to), Math.max(from, to)); return; }
    // a click: the nearest point of a line, then that step's trajectories
    let best = null;
    for (const one of series) {
      if (one.faint || one.dots || !one.run) continue;
      for (const p of one.points) if (p[1] !== null && (!best || Math.abs(p[0] - to) < Math.abs(best.p[0] - to))) best = { p, run: one.run };
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
