// The trajectory viewer: the records of a step (training samples or an evaluation), filtered; one record
// turn by turn with model tokens coloured by log-prob, advantage or mismatch (trained tokens underlined: the
// loss mask), tool results and user messages apart, tool calls with arguments, results and latency; and one
// task's records across steps side by side.
"use strict";

const Viewer = {
  briefs: [], // the summaries of the chosen step's records
  current: null,

  // from a point on a curve: that run's step
  openStep(run, kind, step) {
    this.pending = { run, kind, step: String(step) };
    showTab("trajectories");
  },

  filters: { "f-reward-min": "rmin", "f-reward-max": "rmax", "f-success": "success", "f-stop": "stop", "f-errors": "errors" },

  // the trajectory open and the filters, in the URL (a reload or a copied link opens the same trajectory)
  toHash() {
    if (hashTab() !== "trajectories") return;
    const [run, kind, step] = [$("#tr-run").value, $("#tr-kind").value, $("#tr-step").value];
    const c = this.current, open = c && c.run === run && c.kind === kind && String(c.step) === step;
    const params = { run, kind, step, i: open ? c.index : null };
    for (const [id, key] of Object.entries(this.filters)) params[key] = $(`#${id}`).value;
    setHash("trajectories", params);
  },

  async enter() {
    const q = hashParams();
    if (!this.pending && q.get("run")) { // a link to a trajectory: its run, step, record and filters
      this.pending = { run: q.get("run"), kind: q.get("kind") === "eval" ? "eval" : "train", step: q.get("step") || "",
        index: q.has("i") && Number.isInteger(+q.get("i")) ? +q.get("i") : null };
      for (const [id, key] of Object.entries(this.filters)) if (q.has(key)) $(`#${id}`).value = q.get(key);
    }
    await attempt(async () => {
      const runs = UI.runs.length ? UI.runs : await refreshRuns();
      fillSelect($("#tr-run"), runs.map((r) => [r.name, r.name]));
      if (this.pending) { $("#tr-run").value = this.pending.run; $("#tr-kind").value = this.pending.kind; }
      await this.loadSteps(true);
    });
    // a run that trains on adds steps: the list follows (the chosen step's trajectories stay as they are)
    stop("viewer");
    UI.timers.viewer = setInterval(() => attempt(async () => {
      fillSelect($("#tr-run"), (await refreshRuns()).map((r) => [r.name, r.name]));
      await this.loadSteps(false);
    }), 5000);
  },
  leave() { stop("viewer"); },

  async loadSteps(reload) {
    const run = $("#tr-run").value;
    if (!run) return;
    const kind = $("#tr-kind").value;
    const data = await api(`/api/steps?run=${encodeURIComponent(run)}&kind=${kind}`);
    if (run !== $("#tr-run").value || kind !== $("#tr-kind").value) return; // a later choice is loading
    const keys = Object.keys(data.steps).map(Number).sort((a, b) => a - b);
    const label = (k) => data.steps[k].eval ? `${k} (${data.steps[k].eval})` : String(k);
    const previous = $("#tr-step").value;
    fillSelect($("#tr-step"), keys.map((k) => [k, label(k)]));
    if (!keys.map(String).includes(previous) && keys.length) $("#tr-step").value = keys[keys.length - 1]; // the latest
    const index = this.pending ? this.pending.index : null;
    if (this.pending && keys.map(String).includes(this.pending.step)) {
      $("#tr-step").value = this.pending.step;
      reload = true;
    }
    this.pending = null;
    if (reload || $("#tr-step").value !== previous) await this.loadStep();
    if (index !== null && index !== undefined && index < this.briefs.length) await this.open(Number($("#tr-step").value), index);
    this.toHash();
  },

  async loadStep() {
    const run = $("#tr-run").value, kind = $("#tr-kind").value, step = $("#tr-step").value;
    this.briefs = []; // no card of the step before stays clickable while this one loads
    this.list();
    if (!run || step === "") return;
    const data = await api(`/api/briefs?run=${encodeURIComponent(run)}&kind=${kind}&step=${step}`);
    if (run !== $("#tr-run").value || kind !== $("#tr-kind").value || step !== $("#tr-step").value) return;
    this.briefs = data.records;
    const stops = [...new Set(this.briefs.map((r) => r.stop_reason))].sort();
    fillSelect($("#f-stop"), [["", "any"], ...stops.map((x) => [x, x])]);
    this.list();
  },

  passes(r) {
    const min = parseFloat($("#f-reward-min").value), max = parseFloat($("#f-reward-max").value);
    if (!Number.isNaN(min) && r.reward < min) return false;
    if (!Number.isNaN(max) && r.reward > max) return false;
    const success = $("#f-success").value;
    if (success && (success === "yes") !== (r.success >= 0.5)) return false;
    if ($("#f-stop").value && r.stop_reason !== $("#f-stop").value) return false;
    const errors = $("#f-errors").value;
    if (errors && (errors === "yes") !== (r.tool_errors > 0)) return false;
    return true;
  },

  list() {
    const step = $("#tr-step").value;
    const records = this.briefs.map((r, i) => ({ ...r, index: i })).filter((r) => this.passes(r));
    $("#tr-list").replaceChildren(...records.map((r) => h("li", {
      class: "card", dataset: { index: r.index, reward: r.reward },
      onclick: () => attempt(() => this.open(Number(step), r.index)),
    },
    h("div", {}, h("b", {}, `#${r.index}`), r.group !== undefined ? h("span", { class: "muted" }, ` group ${r.group}`) : null,
      " ", h("span", { class: "muted" }, r.task_id)),
    h("div", {}, `reward ${fmt(r.reward)} `,
      r.success !== undefined ? h("span", { class: `badge ${r.success >= 0.5 ? "ok" : "bad"}` }, r.success >= 0.5 ? "success" : "fail") : null,
      " ", h("span", { class: "badge" }, r.stop_reason),
      r.tool_errors ? h("span", { class: "badge bad" }, `${r.tool_errors} tool error${r.tool_errors > 1 ? "s" : ""}`) : null,
      r.segments > 1 ? h("span", { class: "badge segments" }, `${r.segments} segments`) : null,
      h("span", { class: "muted" }, ` ${r.tool_calls} call${r.tool_calls === 1 ? "" : "s"}`)))));
    $("#tr-list").prepend(h("li", { class: "muted count" }, `${records.length} of ${this.briefs.length} trajectories`));
    this.toHash();
  },

  async open(step, index) {
    const run = $("#tr-run").value, kind = $("#tr-kind").value;
    $("#tr-detail").replaceChildren(h("p", { class: "muted" }, "loading…")); // no stale record to act on
    const current = latest("record");
    const record = await api(`/api/record?run=${encodeURIComponent(run)}&kind=${kind}&step=${step}&index=${index}`);
    if (!current()) return; // another card was clicked while this one loaded: that card is shown
    this.current = { run, kind, step, index, record };
    this.toHash();
    $("#tr-detail").replaceChildren(this.render(record, true));
    for (const card of document.querySelectorAll("#tr-list .card")) {
      card.classList.toggle("selected", Number(card.dataset.index) === index);
    }
  },

  render(record, full) {
    const box = h("div", { class: "trajectory", dataset: { task: record.task_id } });
    box.append(h("h3", {}, record.question || record.task_id));
    if (full) {
      box.append(h("p", {}, h("span", { class: "muted" }, "expected: "), String(record.answer ?? ""),
        " ", h("button", { onclick: () => attempt(() => this.compare(record.task_id)), id: "tr-same-task" }, "same task across steps"),
        " ", record.group !== undefined && this.current && this.current.kind === "train"
          ? h("button", { onclick: () => attempt(() => this.group(record.group)), id: "tr-group" }, "its group side by side") : null));
      const rewards = Object.entries(record.rewards || {});
      box.append(h("table", { class: "grid small rewards" },
        h("tr", {}, h("th", {}, "reward"), ...rewards.map(([k]) => h("th", {}, k)), h("th", {}, "stop"), h("th", {}, "turn rewards")),
        h("tr", {}, h("td", {}, fmt(record.reward)), ...rewards.map(([, v]) => h("td", {}, fmt(v))),
          h("td", {}, record.stop_reason), h("td", {}, (record.turn_rewards || []).map((v) => fmt(v, 2)).join(", ")))));
      box.append(h("details", { class: "prompt" }, h("summary", {}, "prompt (system, tools, task: not trained)"),
        h("pre", {}, record.prompt || "")));
      box.append(this.images(record, 0, record.prompt_tokens || 0));
    } else {
      box.append(h("p", {}, `reward ${fmt(record.reward)} · ${record.stop_reason}`));
    }
    for (const segment of record.segments || []) {
      box.append(this.segment(segment));
      if (segment.start !== undefined) box.append(this.images(record, segment.start, segment.end));
    }
    if (full && (record.calls || []).length) box.append(this.calls(record.calls));
    return box;
  },

  // The images whose tokens lie in [start, end) (a vision-language policy's), from RUN/images.
  images(record, start, end) {
    const shown = (record.images || []).filter((im) => im.file && im.start >= start && im.start < end);
    if (!shown.length) return h("span", {});
    const run = encodeURIComponent(this.current ? this.current.run : $("#tr-run").value);
    return h("div", { class: "images" }, shown.map((im) => h("figure", {},
      h("img", { src: `/api/image?run=${run}&path=${encodeURIComponent(im.file)}`, alt: `image at token ${im.start}` }),
      h("figcaption", { class: "muted" }, `${im.size ? im.size.join("x") : ""} · ${im.tokens} image tokens (not trained)`))));
  },

  segment(segment) {
    if (segment.kind === "compaction") { // where a context strategy closed a segment and what the next one kept
      return h("div", { class: "segment compaction" }, h("span", { class: "segment-label" },
        `${segment.strategy} compacted the context after turn ${segment.turn}: segment ${segment.sequence + 1} closed at `
        + `${segment.tokens} tokens; the next starts from ${segment.carried} of them as they were`
        + (segment.written ? ` and ${segment.written} written for it` : "")));
    }
    if (segment.kind === "prompt") { // a later segment's prompt: the first one's, not repeated
      return h("div", { class: "segment prompt" }, h("span", { class: "segment-label" },
        `segment ${segment.sequence + 1} · the prompt again (${segment.end - segment.start} tokens, not trained)`));
    }
    if (segment.kind !== "model" && segment.kind !== "summary") {
      const label = { user: "user", context: "carried or written by the context strategy" }[segment.kind] || "tool result";
      return h("div", { class: `segment ${segment.kind}` }, h("span", { class: "segment-label" }, `${label} · not trained`),
        h("pre", {}, segment.text));
    }
    const heat = $("#tr-heat").value;
    const tokens = (segment.tokens || []).map((token, i) => {
      const lp = segment.logprobs[i];
      const adv = segment.advantages ? segment.advantages[i] : undefined;
      const own = segment.trainer_logprobs ? segment.trainer_logprobs[i] : undefined;
      const version = segment.versions ? segment.versions[i] : undefined;
      const info = [`token ${JSON.stringify(token)} (id ${segment.ids[i]})`, `log-prob ${fmt(lp, 4)} (p ${fmt(Math.exp(lp), 3)})`];
      if (adv !== undefined) info.push(`advantage ${fmt(adv, 4)}`);
      if (own !== undefined) info.push(`trainer log-prob ${fmt(own, 4)} (diff ${fmt(own - lp, 5)})`);
      if (version !== undefined) info.push(`sampled by the weights after ${version} updates`);
      return h("span", {
        class: "tok trained", title: info.join("\n"), style: `background:${this.colour(heat, lp, adv, own)}`,
        dataset: { lp: lp, adv: adv ?? "", version: version ?? "", info: info.join(" · ") },
      }, this.visible(token));
    });
    const label = (segment.kind === "summary" ? "summary for the context strategy · trained (loss mask 1)"
      : "model · trained (loss mask 1)") + this.sampledBy(segment.versions);
    return h("div", { class: `segment ${segment.kind}` }, h("span", { class: "segment-label" }, label),
      h("div", { class: "tokens" }, tokens));
  },

  // the weights' versions that sampled a span: one, or where new weights came mid-turn (partial rollouts) the range
  sampledBy(versions) {
    if (!versions || !versions.length) return "";
    const low = Math.min(...versions), high = Math.max(...versions);
    return low === high ? ` · sampled by version ${low}` : ` · sampled by versions ${low}-${high} (new weights mid-turn)`;
  },

  visible(token) {
    // SentencePiece / byte-level markers shown as the characters they stand for
    return token.replace(/Ġ/g, " ").replace(/Ċ/g, "\n").replace(/▁/g, " ");
  },

  colour(heat, lp, adv, own) {
    if (heat === "logprob") { // red where the token was unlikely
      const t = Math.min(1, -lp / 5);
      return `rgba(220, 38, 38, ${(0.05 + 0.6 * t).toFixed(2)})`;
    }
    if (heat === "advantage" && adv !== undefined) {
      const t = Math.min(1, Math.abs(adv) / 2);
      return adv >= 0 ? `rgba(22, 163, 74, ${(0.1 + 0.6 * t).toFixed(2)})` : `rgba(220, 38, 38, ${(0.1 + 0.6 * t).toFixed(2)})`;
    }
    if (heat === "mismatch" && own !== undefined) {
      const t = Math.min(1, Math.abs(own - lp) * 20);
      return `rgba(147, 51, 234, ${(0.05 + 0.7 * t).toFixed(2)})`;
    }
    return "transparent";
  },

  calls(calls) {
    return h("table", { class: "grid small calls" },
      h("tr", {}, ["tool", "arguments", "outcome", "latency", "result"].map((c) => h("th", {}, c))),
      calls.map((c) => h("tr", { class: c.outcome === "ok" ? "" : "failed" },
        h("td", {}, c.name ?? "(unparsed)"), h("td", {}, h("code", {}, JSON.stringify(c.arguments))),
        h("td", {}, h("span", { class: `badge ${c.outcome === "ok" ? "ok" : "bad"}` }, c.outcome)),
        h("td", {}, `${(c.latency_s * 1000).toFixed(1)} ms`), h("td", {}, h("pre", {}, c.result)))));
  },

  // the samples of one prompt (a GRPO group) side by side: reward, advantage, tool calls, then the turns
  async group(group) {
    const { run, kind, step } = this.current;
    const members = this.briefs.map((r, i) => ({ ...r, index: i })).filter((r) => r.group === group);
    const records = await Promise.all(members.map((r) =>
      api(`/api/record?run=${encodeURIComponent(run)}&kind=${kind}&step=${step}&index=${r.index}`)));
    $("#cmp-title").textContent = `Group ${group} of step ${step}: ${records.length} samples of one prompt`;
    $("#cmp-columns").replaceChildren(...records.map((record, i) => {
      const advantages = (record.segments || []).flatMap((sg) => sg.advantages || []);
      const advantage = advantages.length ? advantages.reduce((a, b) => a + b, 0) / advantages.length : undefined;
      return h("div", { class: "column group-member", dataset: { index: members[i].index, reward: record.reward } },
        h("h4", {}, `#${members[i].index} · reward ${fmt(record.reward)}`
          + (advantage !== undefined ? ` · advantage ${fmt(advantage, 3)}` : "") + ` · ${(record.calls || []).length} tool calls`),
        (record.calls || []).length ? this.calls(record.calls) : null,
        this.render(record, false));
    }));
    $("#tr-compare").hidden = false;
    $("#tr-compare").scrollIntoView();
  },

  async compare(task) {
    const run = $("#tr-run").value;
    const current = latest("task");
    const history = await api(`/api/task?run=${encodeURIComponent(run)}&task=${encodeURIComponent(task)}`);
    const shown = history.records.slice(0, 6);
    const records = await Promise.all(shown.map((r) =>
      api(`/api/record?run=${encodeURIComponent(run)}&kind=${r.kind}&step=${r.step}&index=${r.index}`)));
    if (!current()) return; // another task was asked for meanwhile
    $("#cmp-title").replaceChildren("Task ", h("span", { id: "cmp-task" }, task), " across steps");
    $("#cmp-columns").replaceChildren(...records.map((record, i) => h("div", { class: "column" },
      h("h4", {}, `${shown[i].kind === "eval" ? `eval (${record.eval})` : "training"} · step ${shown[i].step}`),
      this.render(record, false))));
    $("#tr-compare").hidden = false;
    $("#tr-compare").scrollIntoView();
  },
};
UI.tabs.trajectories = Viewer;

// Search across steps (and runs): each hit opens its trajectory
const Search = {
  async run() {
    const params = new URLSearchParams();
    for (const [id, key] of [["s-text", "q"], ["s-tool", "tool"], ["s-outcome", "outcome"], ["s-rmin", "rmin"], ["s-rmax", "rmax"], ["s-stop", "stop"]]) {
      if ($(`#${id}`).value) params.set(key, $(`#${id}`).value);
    }
    if ($("#s-scope").value === "run" && $("#tr-run").value) params.set("run", $("#tr-run").value);
    const current = latest("search");
    const found = await api(`/api/search?${params}`);
    if (!current()) return; // searched again meanwhile: the newer search's hits are the ones shown
    $("#s-count").textContent = `${found.hits.length}${found.capped ? "+" : ""} of ${found.looked} trajectories`;
    $("#s-results").replaceChildren(...found.hits.map((hit) => h("li", {
      class: "card hit", dataset: { run: hit.run, step: hit.step, index: hit.index },
      onclick: () => attempt(() => Search.open(hit)),
    }, h("div", {}, h("b", {}, `${hit.run} · ${hit.kind} step ${hit.step} · #${hit.index}`), " ", h("span", { class: "muted" }, hit.task_id || "")),
    h("div", {}, `reward ${fmt(hit.reward)} `, h("span", { class: "badge" }, hit.stop_reason || "")),
    hit.snippet ? h("div", { class: "muted snippet" }, hit.snippet) : null)));
  },

  async open(hit) {
    Viewer.pending = { run: hit.run, kind: hit.kind, step: String(hit.step), index: hit.index };
    $("#tr-run").value = hit.run;
    $("#tr-kind").value = hit.kind;
    await Viewer.loadSteps(true);
  },
};

window.addEventListener("DOMContentLoaded", () => {
  $("#tr-run").addEventListener("change", () => attempt(() => Viewer.loadSteps(true)));
  $("#tr-kind").addEventListener("change", () => attempt(() => Viewer.loadSteps(true)));
  $("#tr-step").addEventListener("change", () => attempt(() => Viewer.loadStep()));
  for (const id of ["#f-reward-min", "#f-reward-max", "#f-success", "#f-stop", "#f-errors"]) {
    $(id).addEventListener("input", () => Viewer.list());
  }
  $("#tr-heat").addEventListener("change", () => { if (Viewer.current) $("#tr-detail").replaceChildren(Viewer.render(Viewer.current.record, true)); });
  $("#cmp-close").addEventListener("click", () => { $("#tr-compare").hidden = true; });
  $("#s-form").addEventListener("submit", (event) => { event.preventDefault(); attempt(() => Search.run()); });
  document.addEventListener("mouseover", (event) => {
    const info = $("#token-info");
    if (event.target.classList && event.target.classList.contains("tok")) {
      info.textContent = event.target.dataset.info;
      info.hidden = false;
      // next to the token (below it, or above where the window ends), kept inside the window
      const at = event.target.getBoundingClientRect(), box = info.getBoundingClientRect();
      const below = at.bottom + 6 + box.height <= window.innerHeight;
      info.style.top = `${Math.max(4, below ? at.bottom + 6 : at.top - 6 - box.height)}px`;
      info.style.left = `${Math.max(4, Math.min(at.left, window.innerWidth - box.width - 4))}px`;
    }
  });
});
