// The tools tab: load a tool config file, see its servers and tools, call one through a form made from its
// JSON schema. Values are sent as JSON data; the server calls the tool through the run's executor.
"use strict";

const Tools = {
  tools: [],
  chosen: null,

  async enter() {
    await attempt(async () => {
      const data = await api("/api/tools");
      fillSelect($("#tools-suggestions"), data.suggestions.map((p) => [p, p]), false);
      if (data.file) { $("#tools-file").value = data.file; this.show(data); }
    });
  },

  async load() {
    const data = await api("/api/tools/load", { file: $("#tools-file").value.trim() });
    this.show(data);
  },

  show(data) {
    this.tools = data.tools;
    $("#tools-servers").replaceChildren(...Object.entries(data.servers).map(([name, status]) =>
      h("p", { class: "server", dataset: { server: name } }, h("b", {}, name), " ",
        h("span", { class: `badge ${status === "ok" ? "ok" : "bad"}` }, status))));
    $("#tools-list").replaceChildren(...this.tools.map((tool) => h("li", {
      class: "card", dataset: { tool: tool.name }, onclick: () => this.choose(tool),
    }, h("b", {}, tool.name), h("div", { class: "muted" }, tool.description))));
  },

  choose(tool) {
    latest("tool-call"); // a call of the tool chosen before, still running, is not shown under this one
    this.chosen = tool;
    $("#tools-form-box").hidden = false;
    $("#tools-result").hidden = true;
    $("#tools-name").textContent = `${tool.name}  (timeout ${tool.timeout_s} s)`;
    $("#tools-description").textContent = tool.description;
    const props = (tool.parameters && tool.parameters.properties) || {};
    const required = new Set((tool.parameters && tool.parameters.required) || []);
    $("#tools-form").replaceChildren(...Object.entries(props).map(([name, schema]) =>
      h("label", { class: "field" }, h("span", {}, `${name}${required.has(name) ? " *" : ""}`,
        h("small", { class: "muted" }, ` ${schema.type || "any"}${schema.description ? ` · ${schema.description}` : ""}`)),
        this.input(name, schema))));
    for (const card of document.querySelectorAll("#tools-list .card")) {
      card.classList.toggle("selected", card.dataset.tool === tool.name);
    }
  },

  input(name, schema) {
    const attrs = { name, dataset: { type: schema.type || "json" } };
    if (schema.enum) return h("select", attrs, schema.enum.map((v) => h("option", { value: JSON.stringify(v) }, String(v))));
    if (schema.type === "boolean") return h("input", { ...attrs, type: "checkbox", checked: schema.default === true });
    if (schema.type === "integer" || schema.type === "number") {
      return h("input", { ...attrs, type: "number", step: schema.type === "integer" ? "1" : "any", value: schema.default ?? "" });
    }
    if (schema.type === "string") return h("input", { ...attrs, type: "text", value: schema.default ?? "", size: 50 });
    return h("textarea", { ...attrs, rows: 3, placeholder: "JSON" }, schema.default !== undefined ? JSON.stringify(schema.default) : "");
  },

  // The form as a JSON object: empty optional fields are left out; JSON fields are parsed, never evaluated.
  values() {
    const out = {};
    for (const field of $("#tools-form").elements) {
      const type = field.dataset.type;
      if (field.tagName === "SELECT") { out[field.name] = JSON.parse(field.value); continue; }
      if (type === "boolean") { out[field.name] = field.checked; continue; }
      if (field.value === "") continue;
      if (type === "integer" || type === "number") out[field.name] = Number(field.value);
      else if (type === "string") out[field.name] = field.value;
      else {
        try { out[field.name] = JSON.parse(field.value); } catch (err) { throw new Error(`${field.name}: not valid JSON (${err.message})`); }
      }
    }
    return out;
  },

  async call() {
    const current = latest("tool-call");
    const result = await api("/api/tools/call", { name: this.chosen.name, arguments: this.values() });
    if (!current()) return; // called again, or another tool chosen, meanwhile
    $("#tools-result").hidden = false;
    $("#tools-outcome").textContent = result.outcome;
    $("#tools-outcome").className = `badge ${result.outcome === "ok" ? "ok" : "bad"}`;
    $("#tools-latency").textContent = `${(result.latency_s * 1000).toFixed(1)} ms`;
    $("#tools-output").textContent = result.result;
    $("#tools-images").replaceChildren(...(result.images || []).map((src) => h("img", { src, alt: "image the tool returned" })));
  },
};
UI.tabs.tools = Tools;

window.addEventListener("DOMContentLoaded", () => {
  $("#tools-load").addEventListener("click", () => attempt(() => Tools.load()));
  $("#tools-call").addEventListener("click", () => attempt(() => Tools.call()));
  $("#tools-form").addEventListener("submit", (e) => { e.preventDefault(); attempt(() => Tools.call()); });
});
