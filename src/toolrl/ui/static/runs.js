// The runs tab: the list of runs with their state, and live curves of the checked runs, overlaid.
"use strict";

const PANELS = [
  ["reward", "reward"], ["success", "success"], ["success/*", "success by task category"],
  ["tool_calls", "tool calls / trajectory"],
  ["kl", "KL to the reference"], ["entropy", "entropy"], ["response_tokens", "response tokens"],
  ["stop/*", "stop reasons (share)"], ["step_s", "step time (s)"],
  ["suspect_successes", "suspect successes (share rejected by the task's check)"],
  ["curriculum/*", "curriculum: tried tasks by recent pass rate (share)"],
  ["env/*/success", "success by environment (a mix)"], ["env/*/reward", "reward by environment (a mix)"],
  ["env/*/share", "prompts by environment (share, a mix)"],
  ["role/*/success", "success by role (roles of one policy)"], ["role/*/reward", "reward by role"],
  ["pass^*", "pass^k at evaluations: all k samples of a task succeed (eval.trials)"],
  ["pass@*", "pass@k at evaluations: any of k samples succeeds (eval.trials)"],
];
const EVAL_PANELS = new Set(["reward", "success", "tool_calls", "response_tokens"]);
const EVAL_ONLY = new Set(["pass^*", "pass@*"]); // logged by evaluations alone: their points, one line per k
const KEEP_ZERO = new Set(["success/*", "env/*/success", "env/*/reward", "role/*/success", "role/*/reward"]); // never solved: a line at 0, not left out
// a panel's key with "*" stands for every metric it matches, the "*" part naming each line: "success/*" (after a
// prefix), "env/*/success" (one environment of a mix)
const PATTERNS = new Map();
const pattern = (key) => {
  if (!PATTERNS.has(key)) {
    const parts = key.split("*").map((part) => part.replace(/[.+?^${}()|[\]\\]/g, "\\$&"));
    PATTERNS.set(key, new RegExp(`^${parts.join("(.+)")}$`));
  }
  return PATTERNS.get(key);
};

const SETTINGS = "toolrl.charts";
const SEARCH_MAX = 40; // the most charts a metric search draws
const saved = (() => { try { return JSON.parse(localStorage.getItem(SETTINGS)) || {}; } catch { return {}; } })();

const Runs = {
  compared: new Set(),
  metrics: {}, // run -> records (appended as the run writes them)
  focus: null,
  runs: [],
  extra: new Set(saved.extra || []), // metrics chosen beside the default panels (any key a run logs)
  xaxis: saved.xaxis || "step", // step | wall (minutes, the steps' step_s summed) | samples (trajectories)
  smooth: saved.smooth || 0, // exponential moving average weight, as TensorBoard's slider
  logScale: new Set(saved.log || []), // metrics whose chart has a log-scale y axis
  zoom: null, // [lo, hi] on the x axis, from a drag across a chart
  drewGroups: false,
  groupKey: "", // a config key: the charts draw one line per value of it (the mean of its runs), the runs faint
  sort: { key: "updated_at", dir: -1 },
  query: "", // the metric search: the charts whose metric (or title) has every word of it
  wide: Boolean(saved.wide), // the runs table with every column above the charts, not the narrow list beside them
  waiting: 0, // new steps logged while the charts were held (a drag across one, text selected in them)

  enter() {
    if (!this.wired) this.wire();
    this.fromHash();
    // a link pasted into this tab: its ticked runs, sort and filter shown in the table too, not only in the charts
    if (this.runs.length) { this.table(this.runs); this.draw(); }
    every("runs", 2000, () => attempt(() => Runs.refresh()));
  },

  // the view as the URL says it (over the choices kept in the browser): ticked runs, axis, smoothing, zoom, metrics,
  // log-scale charts, sort, filter
  fromHash() {
    const q = hashParams(), list = (key) => (q.get(key) || "").split(",").filter(Boolean);
    if (q.has("runs")) this.compared = new Set(list("runs"));
    if (["step", "wall", "samples"].includes(q.get("x"))) this.xaxis = q.get("x");
    if (q.has("smooth") && Number.isFinite(+q.get("smooth"))) this.smooth = Math.min(0.99, Math.max(0, +q.get("smooth")));
    const zoom = list("zoom").map(Number);
    this.zoom = zoom.length === 2 && zoom.every(Number.isFinite) ? zoom : this.zoom;
    if (q.has("metrics")) this.extra = new Set(list("metrics"));
    if (q.has("log")) this.logScale = new Set(list("log"));
    const [key, dir] = (q.get("sort") || "").split(":");
    if (key) this.sort = { key, dir: dir === "1" ? 1 : -1 };
    if (q.has("filter")) $("#runs-filter").value = q.get("filter");
    this.groupKey = q.get("group") || "";
    this.query = q.get("q") || "";
    $("#metric-search").value = this.query;
    $("#chart-x").value = this.xaxis;
    this.showSmooth();
  },

  showSmooth() {
    $("#chart-smooth").value = this.smooth;
    $("#chart-smooth-value").value = this.smooth ? this.smooth.toFixed(2) : "off";
  },

  toHash() {
    if (hashTab() !== "runs") return;
    setHash("runs", { runs: [...this.compared], x: this.xaxis === "step" ? null : this.xaxis, smooth: this.smooth || null,
      zoom: this.zoom ? this.zoom.map((v) => +v.toPrecision(6)) : null, metrics: [...this.extra], log: [...this.logScale],
      sort: `${this.sort.key}:${this.sort.dir}`, filter: $("#runs-filter").value, group: this.groupKey || null,
      q: this.query || null });
  },

  wire() {
    this.wired = true;
    $("#chart-x").value = this.xaxis;
    this.showSmooth();
    this.widen(this.wide);
    $("#chart-x").addEventListener("change", (e) => { this.xaxis = e.target.value; this.zoom = null; this.save(); this.draw(); });
    $("#chart-smooth").addEventListener("input", (e) => { this.smooth = +e.target.value; this.showSmooth(); this.save(); this.draw(); });
    $("#metric-search").addEventListener("input", (e) => { this.query = e.target.value.trim(); this.draw(); });
    $("#runs-widen").addEventListener("click", () => { this.widen(!this.wide); this.save(); });
    // what waited while the charts were held is drawn once the drag ends or the selection is gone
    window.addEventListener("mouseup", () => { if (this.dirty) setTimeout(() => this.drawWhenIdle(), 0); });
    document.addEventListener("selectionchange", () => { if (this.dirty && !this.selectionInCharts()) this.drawWhenIdle(); });
    $("#runs-filter").addEventListener("input", () => this.table(this.runs));
    $("#chart-reset-zoom").addEventListener("click", () => { this.zoom = null; this.draw(); });
    $("#chart-csv").addEventListener("click", () => this.csv());
    $("#compare-group").addEventListener("change", (e) => { this.groupKey = e.target.value; this.compareTable(); this.draw(); });
    for (const th of document.querySelectorAll("#run-pass-rates th[data-key]")) {
      th.addEventListener("click", () => {
        const { sort } = this.passRates;
        this.passRates.sort = { key: th.dataset.key, dir: sort.key === th.dataset.key ? -sort.dir : th.dataset.key === "task" ? 1 : -1 };
        this.drawPassRates();
      });
    }
    $("#pr-prev").addEventListener("click", () => { this.passRates.page -= 1; this.drawPassRates(); });
    $("#pr-next").addEventListener("click", () => { this.passRates.page += 1; this.drawPassRates(); });
    $("#meta-save").addEventListener("click", () => attempt(() => this.saveMeta($("#run-meta").dataset.run)));
    for (const th of document.querySelectorAll("#runs-table th[data-sort]")) {
      th.addEventListener("click", () => {
        const key = th.dataset.sort;
        this.sort = { key, dir: this.sort.key === key ? -this.sort.dir : (key === "name" ? 1 : -1) };
        this.table(this.runs);
      });
    }
  },

  save() {
    localStorage.setItem(SETTINGS, JSON.stringify({ extra: [...this.extra], xaxis: this.xaxis, smooth: this.smooth,
      log: [...this.logScale], wide: this.wide }));
  },

  widen(on) {
    this.wide = on;
    $("#runs-layout").classList.toggle("wide", on);
    $("#runs-widen").setAttribute("aria-pressed", String(on));
  },
  leave() { stop("runs"); },

  async refresh() {
    const runs = await refreshRuns();
    const before = this.compared.size;
    // a first visit shows the newest run; a user who unticks every run is left with none (it had come back at the
    // next poll, re-ticked under the user's click)
    if (!this.compared.size && runs.length && !this.ticked) this.compared.add(runs[0].name);
    this.ticked = this.ticked || this.compared.size > 0;
    for (const name of [...this.compared]) if (!runs.some((r) => r.name === name)) this.compared.delete(name);
    const listed = JSON.stringify(runs);
    if (listed !== this.listed) { this.listed = listed; this.table(runs); } // else the rows stay (a selection too)
    else for (const cell of document.querySelectorAll("#runs-table td.ago")) cell.textContent = ago(+cell.dataset.at);
    await this.compare();
    const torn = () => Object.values(this.brokenLines).reduce((n, lines) => n + lines.length, 0);
    const broken = torn();
    const pulled = await Promise.all([...this.compared].map((name) => this.pull(name)));
    if (torn() !== broken) this.table(runs); // a torn line met: named in its run's row
    const fresh = pulled.reduce((n, p) => n + p.steps, 0);
    if (pulled.some((p) => p.changed) || this.compared.size !== before || this.dirty) this.drawWhenIdle(fresh);
  },

  selectionInCharts() {
    const selection = window.getSelection && window.getSelection();
    return Boolean(selection && String(selection) && $("#charts").contains(selection.anchorNode));
  },

  // Charts are redrawn when a run logged something new: a hovered chart's lines are extended in place (its tooltip
  // stays). Only a drag across a chart (a zoom being chosen) or text selected in them holds the redraw, and the
  // page says how many new steps wait (a pointer resting on one of 40 charts had held them 20 s, unseen).
  drawWhenIdle(fresh = 0) {
    if (CHART_DRAG.active || this.selectionInCharts()) {
      this.dirty = true;
      this.waiting += fresh;
      this.showHeld();
      return;
    }
    this.dirty = false;
    this.waiting = 0;
    this.showHeld();
    this.draw({ append: true });
  },

  showHeld() {
    const held = $("#charts-held");
    held.hidden = !this.dirty;
    const why = CHART_DRAG.active ? "a drag across a chart" : "text selected in the charts";
    held.textContent = this.dirty
      ? `${this.waiting} new step${this.waiting === 1 ? "" : "s"} wait${this.waiting === 1 ? "s" : ""}: held while ${why}; drawn when it ends`
      : "";
  },

  // each run's colour, the same in every chart whatever else is ticked: by the order the runs started in (a new run
  // takes the next colour), from a palette of 20
  colorOf(name) {
    if (this.colorsFor !== this.listed || !this.colorIndex) {
      this.colorsFor = this.listed;
      const at = (r) => (Number.isFinite(r.started_at) ? r.started_at : Infinity);
      const order = [...(this.runs || [])].sort((a, b) => (at(a) < at(b) ? -1 : at(a) > at(b) ? 1 : a.name.localeCompare(b.name)));
      this.colorIndex = new Map(order.map((r, i) => [r.name, i]));
    }
    let index = this.colorIndex.get(name);
    if (index === undefined) index = [...name].reduce((n, ch) => (n * 31 + ch.codePointAt(0)) >>> 0, 7);
    return RUN_PALETTE[index % RUN_PALETTE.length];
  },

  table(runs) {
    this.runs = runs;
    this.toHash(); // a sort or a filter
    $("#runs-empty").hidden = runs.length > 0;
    const words = $("#runs-filter").value.toLowerCase().split(/\s+/).filter(Boolean);
    const shown = runs.filter((run) => {
      const text = [run.name, run.env, run.model, run.state, ...(run.tags || [])].join(" ").toLowerCase();
      return words.every((w) => text.includes(w));
    });
    const { key, dir } = this.sort;
    const value = (run) => run[key] ?? (typeof runs.find((r) => r[key] != null)?.[key] === "string" ? "" : -Infinity);
    shown.sort((a, b) => { const [x, y] = [value(a), value(b)]; return (x < y ? -1 : x > y ? 1 : 0) * dir; });
    for (const th of document.querySelectorAll("#runs-table th[data-sort]")) {
      th.dataset.order = th.dataset.sort === key ? (dir > 0 ? "asc" : "desc") : "";
    }
    $("#runs-table tbody").replaceChildren(...shown.map((run) => h("tr", { dataset: { run: run.name } },
      h("td", {}, h("input", {
        type: "checkbox", checked: this.compared.has(run.name), "aria-label": `compare ${run.name}`,
        onchange: (e) => { e.target.checked ? this.compared.add(run.name) : this.compared.delete(run.name); this.draw(); attempt(() => this.compare()); },
      }), h("span", { class: "swatch", style: `background:${this.colorOf(run.name)}`, title: "this run's colour in the charts" })),
      h("td", {}, h("a", { href: "#", onclick: (e) => { e.preventDefault(); this.show(run.name); } }, run.name),
        ...(run.tags || []).map((t) => h("span", { class: "tag" }, t))),
      h("td", { title: [run.error, run.note, ...this.problemsOf(run)].filter(Boolean).join("\n") },
        badge(run.state), this.problemsOf(run).length ? h("span", { class: "warn" }, ` ⚠ ${this.problemsOf(run).length}`) : ""),
      h("td", { class: "wide-only" }, run.env), h("td", { class: "muted wide-only" }, run.model),
      h("td", {}, `${run.step}${run.steps ? ` / ${run.steps}` : ""}`,
        run.live ? h("div", { class: "muted live", title: "the step running now (RUN/live.json)" }, livePhase(run.live)) : ""),
      h("td", {}, fmt(run.reward)), h("td", { class: "wide-only" }, percent(run.success)),
      h("td", { class: "muted ago wide-only", dataset: { at: String(run.updated_at) } }, ago(run.updated_at)),
    )));
  },

  offsets: {}, // run -> byte offset in its metrics.jsonl after the records the page has (the server reads on from it)

  // the run's new metrics records: whether there were any (or the file was rewritten), and how many new steps
  async pull(name) {
    const have = this.metrics[name] || [];
    const at = this.offsets[name] === undefined ? "" : `&offset=${this.offsets[name]}`;
    const data = await api(`/api/metrics?run=${encodeURIComponent(name)}&since=${have.length}${at}`);
    const restarted = data.since === 0 && have.length > 0; // the file was rewritten (a resume): start over
    if (restarted) { this.metrics[name] = []; this.brokenLines[name] = []; }
    this.metrics[name] = (this.metrics[name] || []).concat(data.records);
    this.offsets[name] = data.offset;
    this.brokenLines[name] = (this.brokenLines[name] || []).concat(data.problems || []);
    const steps = data.records.filter((r) => Number.isInteger(r.step) && !("eval" in r)).length;
    return { changed: restarted || data.records.length > 0, steps };
  },

  chartBoxes: new Map(), // metric -> its chart on the page
  lines: {}, // run -> its metrics as lines (linesOf), kept as its records arrive

  // a run's metrics as lines on the chosen x axis: per key its [x, y, step] points (y null: a gap in the line) and
  // the evaluations' apart. x is the step, the wall time so far (minutes, the steps' step_s summed) or the
  // trajectories so far. Records that arrived since the last call are appended; an axis change or a rewritten file
  // (a resume) starts over. (Each chart had filtered every record again at every poll: 324 ms at 5,000 steps.)
  linesOf(name) {
    const records = this.metrics[name] || [];
    let c = this.lines[name];
    if (!c || c.axis !== this.xaxis || c.count > records.length || c.first !== records[0]) {
      c = this.lines[name] = { axis: this.xaxis, count: 0, first: records[0], x: new Map([[0, 0]]), wall: 0, samples: 0,
        train: new Map(), evals: new Map(), nonzero: new Set() };
    }
    const add = (map, key, point) => (map.get(key) || map.set(key, []).get(key)).push(point);
    for (; c.count < records.length; c.count += 1) {
      const r = records[c.count];
      if (!Number.isInteger(r.step)) continue;
      if ("eval" in r) {
        const x = c.x.get(r.step);
        if (x !== undefined) for (const [k, v] of Object.entries(r)) if (k !== "step" && Number.isFinite(v)) add(c.evals, k, [x, v, r.step]);
        continue;
      }
      c.wall += Number.isFinite(r.step_s) ? r.step_s / 60 : 0;
      c.samples += Number.isFinite(r.trajectories) ? r.trajectories : 0;
      const x = this.xaxis === "wall" ? +c.wall.toFixed(3) : this.xaxis === "samples" ? c.samples : r.step;
      c.x.set(r.step, x);
      for (const [k, v] of Object.entries(r)) {
        if (k === "step" || !(typeof v === "number" || v === null)) continue;
        // a step that logged the metric as NaN, inf or null (the server sends null) is a gap in the line
        add(c.train, k, [x, Number.isFinite(v) ? v : null, r.step]);
        if (v) c.nonzero.add(k);
      }
    }
    return c;
  },

  // every numeric metric the compared runs log, grouped by its prefix (reward/..., time/..., the rest)
  metricKeys() {
    const keys = new Set();
    for (const name of this.compared) for (const k of this.linesOf(name).train.keys()) keys.add(k);
    const groups = {};
    for (const k of [...keys].sort()) (groups[k.includes("/") ? k.split("/")[0] : "run"] ||= []).push(k);
    return groups;
  },

  pickers() {
    const groups = this.metricKeys();
    const box = $("#chart-metrics div");
    const signature = JSON.stringify(groups) + [...this.extra].join() + this.query;
    if (box.dataset.signature === signature) return;
    box.dataset.signature = signature;
    const match = this.searched() || (() => true);
    box.replaceChildren(...Object.entries(groups).map(([group, keys]) => h("fieldset", { hidden: !keys.some(match) },
      h("legend", {}, `${group} (${keys.length})`),
      keys.map((k) => h("label", { class: "metric-pick", hidden: !match(k) }, h("input", {
        type: "checkbox", value: k, checked: this.extra.has(k) || PANELS.some(([p]) => p === k),
        disabled: PANELS.some(([p]) => p === k),
        onchange: (e) => { e.target.checked ? this.extra.add(k) : this.extra.delete(k); this.save(); this.draw(); },
      }), k)))));
  },

  smoothed(points) {
    if (!this.smooth) return points;
    let mean = 0, weight = 0;
    return points.map(([x, y, step]) => {
      if (y === null) return [x, null, step];
      mean = this.smooth * mean + (1 - this.smooth) * y;
      weight = this.smooth * weight + (1 - this.smooth);
      return [x, mean / weight, step];
    });
  },

  // the ticked runs by the value of the config key they are grouped by ([label, runs] in the comparison's order),
  // or null where they are not grouped (no key, or a key the ticked runs do not differ in)
  groups() {
    const c = this.comparison, key = (c?.keys || []).find((k) => k.key === this.groupKey);
    if (!key) return null;
    const groups = new Map();
    for (const name of this.compared) {
      const v = key.values[name];
      const label = `${this.groupKey}=${v === null || v === undefined ? "–" : typeof v === "number" ? fmt(v) : String(v)}`;
      (groups.get(label) || groups.set(label, []).get(label)).push(name);
    }
    return [...groups.entries()];
  },

  // a group's line: at each step, the mean of its runs' values there (x from the first run that has the step)
  groupMean(names, key) {
    const at = new Map();
    for (const name of names) {
      for (const [x, y, step] of this.linesOf(name).train.get(key) || []) {
        if (y === null) continue;
        const e = at.get(step) || at.set(step, [x, 0, 0]).get(step);
        e[1] += y;
        e[2] += 1;
      }
    }
    return [...at.entries()].sort((a, b) => a[0] - b[0]).map(([step, [x, sum, n]]) => [x, sum / n, step]);
  },

  // every metric of a family panel (stop/*) that any of `names` logs, in one order: a key's place gives its dash
  familyKeys(key, names) {
    return [...new Set(names.flatMap((name) => [...this.linesOf(name).train.keys()].filter((k) => pattern(key).test(k))))].sort();
  },

  // the metric search as a test of a name (every word typed in it, any case), or null when nothing is typed
  searched() {
    const words = this.query.toLowerCase().split(/\s+/).filter(Boolean);
    return words.length ? (text) => words.every((w) => text.toLowerCase().includes(w)) : null;
  },

  // the charts to draw: the default panels and the metrics chosen beside them; with a metric search, those of them
  // that match it and every other metric the ticked runs log that matches it (at most SEARCH_MAX charts)
  panels() {
    const chosen = [...PANELS, ...[...this.extra].filter((k) => !PANELS.some(([p]) => p === k)).map((k) => [k, k])];
    const matches = this.searched();
    if (!matches) { this.matched = null; return chosen; }
    const logged = Object.values(this.metricKeys()).flat();
    const names = [...this.compared];
    const shown = chosen.filter(([key, title]) => matches(`${key} ${title}`)
      || (key.includes("*") && this.familyKeys(key, names).some(matches)));
    const covered = (k) => shown.some(([key]) => key === k || (key.includes("*") && pattern(key).test(k)));
    const more = logged.filter((k) => matches(k) && !covered(k)).map((k) => [k, k]);
    const all = [...shown, ...more];
    this.matched = { count: all.length, shown: Math.min(all.length, SEARCH_MAX) };
    return all.slice(0, SEARCH_MAX);
  },

  showMatched(drawn) {
    const m = this.matched;
    $("#metric-search-count").textContent = !m ? ""
      : m.count > m.shown ? `${drawn} charts of ${m.count} metrics that match: narrow the search`
      : `${drawn} chart${drawn === 1 ? "" : "s"} match${drawn === 1 ? "es" : ""}`;
  },

  // every chart drawn anew (a setting changed), or, with {append: true} (a poll brought new steps), each chart's
  // lines extended where the new points fit its axes
  draw({ append = false } = {}) {
    this.toHash();
    const names = [...this.compared];
    const live = names.some((name) => this.runs.find((r) => r.name === name)?.state === "running");
    const color = (i) => PALETTE[i % PALETTE.length]; // a group's, or a family's lines (stop/*): by their order
    this.pickers();
    $("#chart-reset-zoom").hidden = !this.zoom;
    const xLabel = { step: "step", wall: "wall time (min)", samples: "samples" }[this.xaxis];
    this.drawn = [];
    const groups = this.groups();
    this.drewGroups = groups !== null;
    const charts = this.panels().map(([key, title]) => {
      const series = [];
      // a family's metrics over several runs, once for the panel: each one's dash (none for a single run)
      const family = key.includes("*") && names.length > 1 ? this.familyKeys(key, names) : null;
      if (groups && !key.includes("*")) {
        // grouped: each group's mean as its line, its runs faint beside it in the group's colour
        groups.forEach(([label, members], i) => {
          for (const name of members) {
            const points = this.linesOf(name).train.get(key) || [];
            series.push({ label: name, color: color(i), points, faint: true, run: name });
            this.drawn.push({ run: name, metric: key, points });
          }
          series.push({ label: `${label} (${members.length} run${members.length > 1 ? "s" : ""})`, color: color(i), points: this.smoothed(this.groupMean(members, key)) });
        });
      } else names.forEach((name, i) => {
        const lines = this.linesOf(name);
        const evalOnly = EVAL_ONLY.has(key);
        const source = evalOnly ? lines.evals : lines.train;
        const keys = key.includes("*")
          ? [...source.keys()].filter((k) => pattern(key).test(k) && (evalOnly || lines.nonzero.has(k) || KEEP_ZERO.has(key)))
            .sort((a, b) => (parseInt(a.match(pattern(key))[1], 10) || 0) - (parseInt(b.match(pattern(key))[1], 10) || 0) || a.localeCompare(b))
          : [key];
        keys.forEach((k, j) => {
          const raw = source.get(k) || [];
          const label = key.includes("*") ? `${names.length > 1 ? `${name} ` : ""}${evalOnly ? k : k.match(pattern(key))[1]}` : name;
          // a family's lines: one run's by their key's colour; several runs' in each run's own colour, a key by its
          // dash (the same key's dash in every run), so that no run changes colour as others are ticked
          const byRun = family !== null && !evalOnly;
          const c = key.includes("*") && !byRun && keys.length > 1 ? color(j + i * keys.length) : this.colorOf(name);
          const dash = byRun ? DASHES[family.indexOf(k) % DASHES.length] : null;
          if (this.smooth && !evalOnly) series.push({ label, color: c, dash, points: raw, faint: true, run: name });
          series.push({ label, color: c, dash, points: evalOnly ? raw : this.smoothed(raw), run: name, dots: evalOnly });
          this.drawn.push({ run: name, metric: k, points: raw });
        });
        if (EVAL_PANELS.has(key)) series.push({ label: `${name} eval`, color: this.colorOf(name), points: lines.evals.get(key) || [], dots: true });
      });
      const old = this.chartBoxes.get(key);
      if (append && !groups && old && old.extend && old.extend(series)) return old; // a group's mean moves as its runs log
      return lineChart(title, key, series, {
        xLabel, range: this.zoom, hideEmpty: true, log: this.logScale.has(key), live,
        onLog: (on) => { on ? this.logScale.add(key) : this.logScale.delete(key); this.save(); this.draw(); },
        onZoom: (lo, hi) => { this.zoom = lo === null ? null : [lo, hi]; this.draw(); },
        onPick: (run, step) => Viewer.openStep(run, "train", step),
      });
    });
    // a metric none of the runs logged has no panel (11 empty ones had shown). A chart drawn anew takes its old one's
    // place; the others stay as they are (extended)
    const shown = charts.filter(Boolean);
    for (const chart of shown) {
      const old = this.chartBoxes.get(chart.dataset.metric);
      if (old && old !== chart && old.isConnected) old.replaceWith(chart);
    }
    this.chartBoxes = new Map(shown.map((chart) => [chart.dataset.metric, chart]));
    const now = [...$("#charts").children];
    if (now.length !== shown.length || now.some((chart, i) => chart !== shown[i])) $("#charts").replaceChildren(...shown);
    $("#charts-empty").hidden = shown.length > 0 || !names.length || Boolean(this.matched);
    this.showMatched(shown.length);
  },

  // the charts' data as CSV: one row per run, metric and step (x as the axis shows it)
  csv() {
    const rows = [["run", "metric", "step", this.xaxis, "value"]];
    for (const { run, metric, points } of this.drawn || []) {
      for (const [x, y, step] of points) rows.push([run, metric, step, x, y === null ? "" : y]);
    }
    const text = rows.map((r) => r.map((v) => (/[",\n]/.test(String(v)) ? `"${String(v).replace(/"/g, '""')}"` : v)).join(",")).join("\n");
    download(URL.createObjectURL(new Blob([text + "\n"], { type: "text/csv" })), "metrics.csv");
  },

  brokenLines: {}, // run -> "metrics.jsonl:3: not a JSON object, skipped" lines met while reading its metrics

  // what in a run's folder was not read: its files' problems and its metrics' torn lines
  problemsOf(run) {
    return [...(run.problems || []), ...(this.brokenLines[run.name] || [])];
  },

  // the ticked runs side by side: each config key that differs between them, their last metrics, their tags;
  // sorted by any column, grouped by a key's value
  compareSort: { key: "run", dir: 1 },

  async compare() {
    const names = [...this.compared];
    const wanted = names.join("\n");
    if (wanted === this.comparedFor && !this.compareStale) return;
    this.comparedFor = wanted;
    this.compareStale = false;
    const query = names.map((n) => `run=${encodeURIComponent(n)}`).join("&");
    const current = latest("compare");
    let comparison;
    try {
      comparison = names.length ? await api(`/api/compare?${query}`) : { runs: [], keys: [], final: {}, meta: {} };
    } catch (err) {
      if (current()) this.comparedFor = null; // the next refresh asks again
      throw err;
    }
    // ticks made while this answer was on its way asked again: an older answer arriving last must not replace the
    // newer one (CI: the table of lr-a alone stayed, after lr-b was ticked, with no train.lr column)
    if (!current()) return;
    this.comparison = comparison;
    this.compareTable();
  },

  compareTable() {
    const c = this.comparison || { runs: [], keys: [], final: {}, meta: {} };
    const group = $("#compare-group");
    const grouped = this.groups() !== null;
    fillSelect(group, [["", "(none)"], ...c.keys.map((k) => [k.key, k.key])]);
    group.value = grouped ? this.groupKey : "";
    if (grouped !== this.drewGroups) this.draw(); // the key the URL named is among the ticked runs' now
    const columns = ["run", "tags", ...c.keys.map((k) => k.key), "reward", "success"];
    const value = (run, col) => col === "run" ? run : col === "tags" ? (c.meta[run] || {}).tags?.join(" ") || ""
      : col in (c.final[run] || {}) ? c.final[run][col] : (c.keys.find((k) => k.key === col) || { values: {} }).values[run];
    const cell = (v) => (v === null || v === undefined ? "–" : typeof v === "number" ? fmt(v) : String(v));
    const order = (a, b) => {
      const [x, y] = [value(a, this.compareSort.key), value(b, this.compareSort.key)];
      return (x === y ? 0 : x === undefined || x === null ? 1 : y === undefined || y === null ? -1 : x < y ? -1 : 1) * this.compareSort.dir;
    };
    let rows = [...c.runs].sort(order);
    if (group.value) rows = rows.sort((a, b) => String(value(a, group.value)).localeCompare(String(value(b, group.value))));
    $("#compare-table thead").replaceChildren(h("tr", {}, ...columns.map((col) => h("th", {
      class: "sortable", title: "sort by this column",
      onclick: () => { this.compareSort = { key: col, dir: this.compareSort.key === col ? -this.compareSort.dir : 1 }; this.compareTable(); },
    }, col))));
    const body = [];
    let last;
    for (const run of rows) {
      const g = group.value ? cell(value(run, group.value)) : null;
      if (g !== null && g !== last) body.push(h("tr", { class: "group" }, h("td", { colspan: String(columns.length) }, `${group.value} = ${g}`)));
      last = g;
      body.push(h("tr", { dataset: { compared: run } }, ...columns.map((col) => h("td", {}, cell(value(run, col))))));
    }
    $("#compare-table tbody").replaceChildren(...body);
    $("#run-compare").hidden = c.runs.length < 2;
  },

  async saveMeta(name) {
    const tags = $("#meta-tags").value.split(/[\s,]+/).filter(Boolean);
    const saved = await api("/api/run/meta", { run: name, tags, note: $("#meta-note").value });
    $("#meta-saved").textContent = `saved: ${saved.tags.length} tags`;
    this.compareStale = true;
    this.listed = null; // the runs list shows the new tags on its next poll
  },

  async show(name) {
    const current = latest("run");
    const run = await api(`/api/run?run=${encodeURIComponent(name)}`);
    if (!current()) return; // another run's name was clicked while this one loaded: that run is shown
    $("#run-meta").hidden = false;
    $("#run-meta").dataset.run = name;
    $("#meta-tags").value = (run.tags || []).join(", ");
    $("#meta-note").value = run.user_note || "";
    $("#meta-saved").textContent = "";
    const problems = this.problemsOf(run);
    $("#run-problems").hidden = !problems.length;
    $("#run-problems").textContent = problems.length ? `${name}: ${problems.join("; ")}` : "";
    const box = $("#run-config");
    box.querySelector("span").textContent = name;
    box.querySelector("pre").textContent = run.config;
    box.open = true;
    const rates = $("#run-pass-rates");
    const tasks = Object.entries((run.pass_rates || {}).tasks || {});
    rates.hidden = !tasks.length;
    rates.querySelector("span").textContent = `${tasks.length} tasks at step ${(run.pass_rates || {}).step}`;
    this.passRates.tasks = tasks;
    this.passRates.page = 0;
    this.drawPassRates();
  },

  // a curriculum's per-task pass rates: sorted by any column (the heaviest first by default), 50 a page
  passRates: { tasks: [], sort: { key: "weight", dir: -1 }, page: 0 },

  drawPassRates() {
    const PAGE = 50, state = this.passRates, { key, dir } = state.sort;
    const value = ([id, r]) => (key === "task" ? id : r[key]);
    const rows = [...state.tasks].sort((a, b) => (value(a) < value(b) ? -dir : value(a) > value(b) ? dir : a[0].localeCompare(b[0])));
    const pages = Math.max(1, Math.ceil(rows.length / PAGE));
    state.page = Math.min(Math.max(0, state.page), pages - 1);
    $("#run-pass-rates tbody").replaceChildren(...rows.slice(state.page * PAGE, (state.page + 1) * PAGE).map(([id, r]) =>
      h("tr", {}, ...[id, r.pass_rate.toFixed(2), r.attempts, r.weight.toFixed(2)].map((v) => h("td", {}, String(v))))));
    $("#pr-page").textContent = `page ${state.page + 1} of ${pages} (${rows.length} tasks, by ${key} ${dir > 0 ? "↑" : "↓"})`;
    $("#pr-prev").disabled = state.page === 0;
    $("#pr-next").disabled = state.page >= pages - 1;
  },
};
UI.tabs.runs = Runs;

// the running step's phase as a line: "step 3: rollout 5/8 trajectories · 40 s · eta 30 s"
function livePhase(live) {
  const secs = (s) => (s < 120 ? `${Math.round(s)} s` : `${(s / 60).toFixed(1)} min`);
  const since = Number.isFinite(live.phase_started_at) ? ` · ${secs(Date.now() / 1000 - live.phase_started_at)}` : "";
  const count = live.total ? ` ${live.done}/${live.total} ${live.unit}` : "";
  const eta = Number.isFinite(live.phase_eta_s) ? ` · eta ${secs(live.phase_eta_s)}` : "";
  return `step ${live.step}: ${live.phase}${count}${since}${eta}`;
}
