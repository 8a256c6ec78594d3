// The launch tab: a recipe's config edited and validated, a run started as a `toolrl train` process, its
// console log followed, stopped after a step (with a checkpoint) or interrupted, and resumed.
"use strict";

const Launch = {
  recipes: {},
  offset: 0,
  following: null,

  async enter() {
    await attempt(async () => {
      if (!Object.keys(this.recipes).length) {
        this.recipes = (await api("/api/recipes")).recipes;
        fillSelect($("#launch-recipe"), Object.keys(this.recipes).map((k) => [k, k]));
        this.pick();
      }
      await this.runs();
    });
    every("launch", 1500, () => attempt(() => this.poll()));
  },
  leave() { stop("launch"); },

  pick() {
    const name = $("#launch-recipe").value;
    $("#launch-config").value = this.recipes[name] || "";
    const stamp = new Date().toISOString().replace(/[-:]/g, "").replace("T", "-").slice(0, 15);
    $("#launch-name").value = `${name}-${stamp}`;
    $("#launch-check").textContent = "";
  },

  body() {
    return { recipe: $("#launch-recipe").value, config: $("#launch-config").value, name: $("#launch-name").value.trim() };
  },

  async validate() {
    const check = $("#launch-check");
    try {
      const data = await api("/api/validate", this.body());
      check.textContent = `valid: ${data.env}, ${data.steps} steps`;
      check.className = "ok-text";
      return true;
    } catch (err) {
      check.textContent = err.message;
      check.className = "error-text";
      return false;
    }
  },

  async start() {
    if (!(await this.validate())) return;
    const started = await api("/api/launch", this.body());
    $("#launch-check").textContent = `started ${started.name} (process ${started.pid})`;
    this.follow(started.name);
    await this.runs();
  },

  async runs() {
    const runs = await refreshRuns();
    const names = runs.map((r) => [r.name, r.name]);
    if (this.following && !names.some(([n]) => n === this.following)) names.unshift([this.following, this.following]);
    fillSelect($("#follow-run"), names);
    if (this.following) $("#follow-run").value = this.following;
    else if (names.length) this.follow(names[0][0]);
  },

  follow(name) {
    if (this.following !== name) { this.offset = 0; $("#follow-log").textContent = ""; }
    this.following = name;
    $("#follow-run").value = name;
  },

  async poll() {
    const following = this.following;
    if (!following) return;
    const run = encodeURIComponent(following);
    const data = await api(`/api/console?run=${run}&offset=${this.offset}`).catch(() => ({ text: "", offset: this.offset }));
    if (this.following !== following) return; // another run was chosen meanwhile: its log starts over from 0
    if (data.text) {
      const log = $("#follow-log");
      log.textContent += data.text;
      log.scrollTop = log.scrollHeight;
    }
    this.offset = data.offset;
    const runs = await refreshRuns();
    const info = runs.find((r) => r.name === this.following);
    const state = info ? info.state : "starting";
    const note = info && info.note ? ` · ${info.note}` : "";
    $("#follow-state").textContent = info ? `${state} · step ${info.step}${info.steps ? ` / ${info.steps}` : ""}${note}` : state;
    $("#follow-state").className = `badge state-${state}`;
    $("#follow-stop").disabled = $("#follow-kill").disabled = state !== "running";
    // disabled with its reason (a finished run's resume had failed in the log box after the click)
    const blocked = !info ? "the run is starting" : info.resume_blocked;
    $("#follow-resume").disabled = Boolean(blocked);
    $("#follow-resume").title = blocked || "continue from the last checkpoint";
    $("#follow-why").textContent = blocked ? `resume: ${blocked}` : "";
  },

  async stop(now) {
    const data = await api("/api/stop", { run: this.following, now });
    $("#follow-state").textContent = `stopping ${data.stopping}`;
  },

  async resume() {
    await api("/api/resume", { run: this.following });
    $("#follow-log").textContent += "\n";
  },
};
UI.tabs.launch = Launch;

window.addEventListener("DOMContentLoaded", () => {
  $("#launch-recipe").addEventListener("change", () => Launch.pick());
  $("#launch-validate").addEventListener("click", () => Launch.validate());
  $("#launch-start").addEventListener("click", () => attempt(() => Launch.start()));
  $("#follow-run").addEventListener("change", () => Launch.follow($("#follow-run").value));
  $("#follow-stop").addEventListener("click", () => attempt(() => Launch.stop(false)));
  $("#follow-kill").addEventListener("click", () => attempt(() => Launch.stop(true)));
  $("#follow-resume").addEventListener("click", () => attempt(() => Launch.resume()));
});
