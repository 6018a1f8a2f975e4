// corral dashboard: pipelines and job arrays (#groups, #pipeline/<id>, #array/<id>). Loaded after
// app.js and jobs.js, whose helpers ($, el, getJson, bar, jobLink, when, showDeliveries) it uses.
"use strict";

const groupView = { timer: null };
const SVG = "http://www.w3.org/2000/svg";
const BOX = { w: 170, h: 46, dx: 60, dy: 18 };  // a step's box and the gaps between boxes

const svg = (tag, attrs = {}, ...children) => {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
};
const groupLink = (g) => el("a", { href: `#${g.kind}/${encodeURIComponent(g.id)}` }, g.id);

// The newest pipelines and arrays, each with its state and aggregate progress.
async function listGroups() {
  $("groups-error").textContent = "";
  const [pipes, arrays] = await Promise.all([getJson("/v1/pipelines?limit=20"), getJson("/v1/arrays?limit=20")]);
  const all = [...pipes.items, ...arrays.items].sort((a, b) => b.created_at - a.created_at);
  const head = el("tr", {}, ["id", "kind", "state", "progress", "jobs", "team/user", "created"].map((h) => el("th", { scope: "col" }, h)));
  const rows = all.map((g) => el("tr", { "data-group": g.id },
    el("td", {}, groupLink(g)), el("td", {}, g.kind),
    el("td", {}, el("span", { class: `badge ${g.state}`, "data-state": g.state }, g.state)),
    el("td", {}, `${Math.round(g.progress * 100)}%`), el("td", {}, String(g.size)),
    el("td", {}, `${g.team}/${g.user}`), el("td", {}, when(g.created_at))));
  $("groups-table").replaceChildren(head, ...(rows.length ? rows : [el("tr", {}, el("td", { colspan: "7", class: "muted" }, "No pipelines or arrays yet."))]));
}

// One pipeline (its steps as a graph) or array (its elements), read again every 2 s while it runs.
async function showGroup(kind, id) {
  clearTimeout(groupView.timer);
  $("group-error").textContent = "";
  const g = await getJson(`/v1/${kind}s/${encodeURIComponent(id)}`);
  const counts = Object.entries(g.counts).map(([s, n]) => `${n} ${s}`).join(", ");
  $("group-body").replaceChildren(
    el("h2", {}, `${g.kind === "pipeline" ? "Pipeline" : "Array"} ${g.id} `,
      el("span", { class: `badge ${g.state}`, "data-state": g.state, id: "group-state" }, g.state)),
    el("p", { class: "muted" }, `${g.team}/${g.user} · ${g.size} jobs (${counts}) · created ${when(g.created_at)}`),
    el("div", { class: "actions", role: "group", "aria-label": "actions" },
      g.state === "running" ? el("button", { "data-action": "cancel", onclick: () => cancelGroup(g) }, "cancel all") : ""),
    bar([[g.progress]]), el("div", { class: "muted", id: "group-progress" }, `${Math.round(g.progress * 100)}%`),
    g.webhook ? el("section", { id: "group-webhook" }, el("h3", {}, "Webhook"),
      el("p", { class: "muted" }, `${g.webhook.url} (${g.webhook.events === "all" ? "when it ends and on each job's change" : "when every job has ended"})`),
      el("ul", { id: "group-deliveries" })) : "",
    g.steps ? stepGraph(g.steps) : elements(g.jobs));
  if (g.webhook) showDeliveries(g.id, `/v1/${kind}s/${encodeURIComponent(id)}`, "group-deliveries").catch(() => {});
  if (g.state === "running" && location.hash.startsWith(`#${kind}/`)) {
    groupView.timer = setTimeout(() => showGroup(kind, id).catch((e) => showError("group-error", e)), 2000);
  }
}

async function cancelGroup(g) {
  await api(`/v1/${g.kind}s/${encodeURIComponent(g.id)}/cancel`, { method: "POST" });
  await showGroup(g.kind, g.id);
}

// Steps in columns by depth (the longest chain of steps before each), an arrow per dependency.
function stepGraph(steps) {
  const byName = Object.fromEntries(steps.map((s) => [s.name, s]));
  const depth = {};
  const depthOf = (s) => depth[s.name] ??= Math.max(-1, ...s.after.filter((a) => byName[a]).map((a) => depthOf(byName[a]))) + 1;
  steps.forEach(depthOf);
  const rows = {};
  const at = {};
  for (const s of steps) {
    const col = depth[s.name];
    const row = rows[col] = (rows[col] ?? -1) + 1;
    at[s.name] = { x: 10 + col * (BOX.w + BOX.dx), y: 10 + row * (BOX.h + BOX.dy) };
  }
  const width = 20 + (Math.max(...Object.values(depth)) + 1) * (BOX.w + BOX.dx);
  const height = 20 + (Math.max(...Object.values(rows)) + 1) * (BOX.h + BOX.dy);
  const marker = svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 10, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto" },
    svg("path", { d: "M0,0 L10,5 L0,10 z", class: "edge-head" }));
  const edges = steps.flatMap((s) => s.after.filter((a) => at[a]).map((a) => svg("line", {
    class: "edge", "data-from": a, "data-to": s.name, "marker-end": "url(#arrow)",
    x1: at[a].x + BOX.w, y1: at[a].y + BOX.h / 2, x2: at[s.name].x, y2: at[s.name].y + BOX.h / 2 })));
  const boxes = steps.map((s) => {
    const { x, y } = at[s.name];
    const link = svg("a", { href: `#job/${encodeURIComponent(s.job_id)}` },
      svg("rect", { x, y, width: BOX.w, height: BOX.h, rx: 6 }),
      svg("text", { x: x + 8, y: y + 18, class: "step-name" }, s.name),
      svg("text", { x: x + 8, y: y + 36, class: "step-state" }, `${s.state} ${Math.round(s.progress * 100)}%`));
    return svg("g", { class: `step ${s.state}`, "data-step": s.name, "data-state": s.state }, link, svg("title", {}, s.error || s.state));
  });
  const graph = svg("svg", { id: "pipeline-graph", width, height, viewBox: `0 0 ${width} ${height}`, role: "group", "aria-label": "the pipeline's steps" },
    svg("defs", {}, marker), ...edges, ...boxes);
  const errors = steps.filter((s) => s.error).map((s) => el("li", {}, el("strong", {}, s.name), `: ${s.error}`));
  return el("section", {}, el("h3", {}, "Steps"), el("div", { class: "scroll" }, graph), errors.length ? el("ul", { class: "error" }, errors) : "");
}

// An array's elements: index, state, progress, job.
function elements(jobs) {
  const head = el("tr", {}, ["index", "state", "priority", "progress", "job"].map((h) => el("th", { scope: "col" }, h)));
  const rows = jobs.map((j) => el("tr", { "data-index": String(j.array?.index ?? "") },
    el("td", {}, String(j.array?.index ?? "")),
    el("td", {}, el("span", { class: `badge ${j.state}`, "data-state": j.state }, j.state)),
    el("td", {}, j.priority), el("td", {}, `${Math.round(j.progress * 100)}%`), el("td", {}, jobLink(j.id))));
  return el("section", {}, el("h3", {}, "Elements"), el("div", { class: "scroll" }, el("table", { class: "models" }, head, ...rows)));
}
