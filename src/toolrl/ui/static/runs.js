// The runs tab: the list of runs with their state, and live curves of the checked runs, overlaid.
"use strict";

const PANELS = [
  ["reward", "reward"], ["success", "success"], ["tool_calls", "tool calls / trajectory"],
  ["kl", "KL to the reference"], ["entropy", "entropy"], ["response_tokens", "response tokens"],
  ["stop/*", "stop reasons (share)"], ["step_s", "step time (s)"],
  ["suspect_successes", "suspect successes (share rejected by the task's check)"],
  ["curriculum/*", "curriculum: tried tasks by recent pass rate (share)"],
];
const EVAL_PANELS = new Set(["reward", "success", "tool_calls", "response_tokens"]);

const Runs = {
  compared: new Set(),
  metrics: {}, // run -> records (appended as the run writes them)
  focus: null,

  enter() { every("runs", 2000, () => attempt(() => Runs.refresh())); },
  leave() { stop("runs"); },

  async refresh() {
    const runs = await refreshRuns();
    if (!this.compared.size && runs.length) this.compared.add(runs[0].name);
    for (const name of [...this.compared]) if (!runs.some((r) => r.name === name)) this.compared.delete(name);
    this.table(runs);
    await Promise.all([...this.compared].map((name) => this.pull(name)));
    this.draw();
  },

  table(runs) {
    $("#runs-empty").hidden = runs.length > 0;
    $("#runs-table tbody").replaceChildren(...runs.map((run) => h("tr", { dataset: { run: run.name } },
      h("td", {}, h("input", {
        type: "checkbox", checked: this.compared.has(run.name), "aria-label": `compare ${run.name}`,
        onchange: (e) => { e.target.checked ? this.compared.add(run.name) : this.compared.delete(run.name); this.draw(); },
      })),
      h("td", {}, h("a", { href: "#", onclick: (e) => { e.preventDefault(); this.show(run.name); } }, run.name)),
      h("td", { title: run.error || "" }, badge(run.state)),
      h("td", {}, run.env), h("td", { class: "muted" }, run.model),
      h("td", {}, `${run.step}${run.steps ? ` / ${run.steps}` : ""}`),
      h("td", {}, fmt(run.reward)), h("td", {}, percent(run.success)),
      h("td", { class: "muted" }, ago(run.updated_at)),
    )));
  },

  async pull(name) {
    const have = this.metrics[name] || [];
    const data = await api(`/api/metrics?run=${encodeURIComponent(name)}&since=${have.length}`);
    if (data.since === 0 && have.length) return; // the file was rewritten (a resume): next round starts over
    this.metrics[name] = have.concat(data.records);
  },

  draw() {
    const names = [...this.compared];
    const color = (i) => PALETTE[i % PALETTE.length];
    const charts = PANELS.map(([key, title]) => {
      const series = [];
      names.forEach((name, i) => {
        const records = this.metrics[name] || [];
        const steps = records.filter((r) => !("eval" in r) && Number.isInteger(r.step));
        const keys = key.endsWith("*")
          ? [...new Set(steps.flatMap((r) => Object.keys(r).filter((k) => k.startsWith(key.slice(0, -1)) && r[k])))].sort()
          : [key];
        keys.forEach((k, j) => {
          // a step that logged the metric as NaN, inf or null (the server sends null) is a gap in the line
          const points = steps.filter((r) => k in r).map((r) => [r.step, Number.isFinite(r[k]) ? r[k] : null]);
          const label = key.endsWith("*") ? `${names.length > 1 ? `${name} ` : ""}${k.slice(key.length - 1)}` : name;
          series.push({ label, color: key.endsWith("*") ? color(j + i * keys.length) : color(i), points });
        });
        if (EVAL_PANELS.has(key)) {
          const evals = records.filter((r) => "eval" in r && Number.isInteger(r.step) && Number.isFinite(r[key]))
            .map((r) => [r.step, r[key]]);
          series.push({ label: `${name} eval`, color: color(i), points: evals, dots: true });
        }
      });
      return lineChart(title, key, series);
    });
    $("#charts").replaceChildren(...charts);
  },

  async show(name) {
    const run = await api(`/api/run?run=${encodeURIComponent(name)}`);
    const box = $("#run-config");
    box.querySelector("span").textContent = name;
    box.querySelector("pre").textContent = run.config;
    box.open = true;
    const rates = $("#run-pass-rates");
    const tasks = Object.entries((run.pass_rates || {}).tasks || {});
    rates.hidden = !tasks.length;
    rates.querySelector("span").textContent = `${tasks.length} tasks at step ${(run.pass_rates || {}).step}`;
    tasks.sort((a, b) => b[1].weight - a[1].weight || a[0].localeCompare(b[0]));
    const rows = tasks.slice(0, 200).map(([id, r]) => {
      const tr = document.createElement("tr");
      for (const value of [id, r.pass_rate.toFixed(2), r.attempts, r.weight.toFixed(2)]) {
        const td = document.createElement("td");
        td.textContent = value;
        tr.append(td);
      }
      return tr;
    });
    rates.querySelector("tbody").replaceChildren(...rows);
  },
};
UI.tabs.runs = Runs;
