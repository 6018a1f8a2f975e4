// corral dashboard: one node's page (#node/<name>). Loaded after app.js and jobs.js,
// whose helpers ($, el, api, getJson, bar, gib, ago, nodeState, jobLink) it uses.
"use strict";

async function showNode(name) {
  $("node-error").textContent = "";
  renderNodePage(await getJson(`/v1/nodes/${encodeURIComponent(name)}`));
  await nodePlots(name);  // plots.js
}

// Each GPU with what it holds, the models, the node's own failures, and its controls.
function renderNodePage(n) {
  const st = nodeState(n);
  $("node-body").replaceChildren(
    el("h2", {}, `Node ${n.name} `, el("span", { class: `badge ${st}`, "data-state": st, id: "node-state" }, st)),
    el("p", { class: "muted" }, `${n.gpus.length} GPU(s) · ${n.cpus} CPU slots · ${n.memory_bytes ? gib(n.memory_bytes) : "no"} memory for jobs · backends: ${n.backends.join(", ") || "none"} · ` +
      `labels: ${Object.entries(n.labels).map(([k, v]) => `${k}=${v}`).join(", ") || "none"} · last seen ${ago(n.last_seen)}`),
    el("div", { class: "actions", role: "group", "aria-label": "node actions" }, nodeActions(n)),
    n.pause_reason ? el("p", { class: "error pause-reason" }, n.pause_reason) : "",
    n.failure_streak ? el("p", { class: "error" }, `${n.failure_streak} job(s) failed here in a row`) : "",
    el("section", {}, el("h3", {}, "GPUs"), el("div", { class: "cards" },
      n.gpus.length ? n.gpus.map((g) => gpuCard(g, n.allocations)) : [el("p", { class: "muted" }, "CPU only.")])),
    el("section", {}, el("h3", {}, "On CPU"), cpuWork(n.allocations)),
    el("section", {}, el("h3", {}, "Models"),
      el("p", {}, `loaded: ${n.models_loaded.join(", ") || "none"}`),
      el("p", {}, `on disk: ${n.models_on_disk.join(", ") || "none"}`)));
}

function gpuCard(g, allocations) {
  const here = allocations.filter((a) => !a.on_cpu && a.gpu_indices.includes(g.index));
  const reserved = here.reduce((s, a) => s + (a.vram_bytes || 0), 0);
  const used = g.vram_free_bytes != null ? g.vram_bytes - g.vram_free_bytes : null;
  const util = (g.utilization != null ? `${Math.round(g.utilization * 100)}% busy` : "utilisation not reported") +
    (g.temperature_c != null ? ` · ${Math.round(g.temperature_c)} °C` : "");
  return el("div", { class: "card gpu-card", "data-gpu": String(g.index) },
    el("h4", {}, `GPU ${g.index} · ${g.model}`),
    el("div", { class: "muted" }, util),
    g.utilization != null ? bar([[g.utilization]]) : "",
    el("div", { class: "muted" }, `VRAM reserved ${gib(reserved)}${used != null ? ` · in use ${gib(used)}` : ""} of ${gib(g.vram_bytes)}`),
    bar([[g.vram_bytes ? reserved / g.vram_bytes : 0]]),
    el("ul", { class: "allocations" }, here.length ? here.map(allocationItem) : [el("li", { class: "muted" }, "idle")]));
}

const allocationItem = (a) => el("li", { "data-allocation": a.id },
  ...a.job_ids.map((id) => jobLink(id)), ` · ${a.gpu_milli < 1000 ? `${a.gpu_milli / 1000} of the card` : "whole card"}` +
  ` · ${a.observed}${a.borrowed ? " · borrowed" : ""} · ${Math.round(a.progress * 100)}%`);

function cpuWork(allocations) {
  const on = allocations.filter((a) => a.on_cpu || !a.gpu_indices.length);
  return on.length ? el("ul", { class: "allocations" }, on.map(allocationItem)) : el("p", { class: "muted" }, "nothing");
}

// Pause: no new work, running work continues. Drain: no new work, and it may be removed
// once empty. Resume: takes new work again.
function nodeActions(n) {
  const act = (verb, title) => el("button", { "data-action": verb, title, onclick: () =>
    api(`/v1/nodes/${encodeURIComponent(n.name)}/${verb}`, { method: "POST" })
      .then((r) => r.json()).then((node) => { renderNodePage(node); return nodePlots(node.name); }).catch((e) => { $("node-error").textContent = e.message; }) }, verb);
  const out = [];
  if (!n.paused && !n.draining) out.push(act("pause", "no new work; running work continues"));
  if (!n.draining) out.push(act("drain", "no new work; it can be removed once empty"));
  if (n.paused || n.draining) out.push(act("resume", "take new work again"));
  return out;
}
