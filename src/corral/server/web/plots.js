// corral dashboard: plots of the last hour (GET /v1/history), drawn with uPlot (vendored
// from the npm registry in vendor/uplot). Cluster plots on the board; each card's on a
// node's page. Loaded after app.js, jobs.js and node.js, whose helpers it uses.
"use strict";

const COLORS = ["#2563eb", "#f59e0b", "#16a34a", "#dc2626", "#7c3aed", "#0891b2", "#db2777", "#65a30d"];
const plots = {};  // container id -> its uPlot, replaced on each draw
let plotTimer = null;

// One line per key of ``rows`` (each row a {key: value} of one sample), over ``times``.
// A team's lines share its colour: held solid, "(borrowed)" dotted, "quota" dashed (a
// limit, not a load).
function drawPlot(id, times, rows, { stacked = false, unit = "" } = {}) {
  const box = $(id);
  if (!box || !window.uPlot) return;
  const keys = [...new Set(rows.flatMap((r) => Object.keys(r)))].sort();
  const data = [times, ...keys.map((k) => rows.map((r) => r[k] ?? (stacked ? 0 : null)))];
  const base = (k) => k.replace(/ (quota|\(borrowed\))$/, "");
  const groups = [...new Set(keys.map(base))];
  const dash = (k) => (k.endsWith(" quota") ? [8, 4] : k.endsWith(" (borrowed)") ? [2, 3] : undefined);
  const series = [{}, ...keys.map((k) => ({ label: k, stroke: COLORS[groups.indexOf(base(k)) % COLORS.length], width: 2, dash: dash(k),
    value: (u, v) => (v == null ? "-" : `${Math.round(v * 100) / 100}${unit}`) }))];
  if (plots[id]) plots[id].destroy();
  box.replaceChildren();
  if (!times.length) { box.append(el("p", { class: "muted" }, "No samples yet.")); return; }
  const width = Math.max(240, box.clientWidth || 320);
  plots[id] = new uPlot({ width, height: 160, series, axes: [{}, { size: 50 }], legend: { live: false } }, data, box);
}

async function refreshPlots() {
  if ($("board").hidden) return;
  const seconds = $("plot-range").value;
  const h = await getJson(`/v1/history?seconds=${seconds}`);
  const times = h.samples.map((s) => s.at);
  drawPlot("plot-queue", times, h.samples.map((s) => s.queued), { stacked: true });
  drawPlot("plot-wait", times, h.samples.map((s) =>
    Object.fromEntries(Object.entries(s.waited || {}).map(([c, w]) => [c, w / 60]))), { unit: " min" });
  drawPlot("plot-gpus", times, h.samples.map((s) => {
    const row = { idle: s.idle_gpus };
    for (const [t, v] of Object.entries(s.held)) row[t] = v;
    for (const [t, v] of Object.entries(s.borrowed)) row[`${t} (borrowed)`] = v;
    for (const [t, v] of Object.entries(s.quota || {})) row[`${t} quota`] = v;
    return row;
  }), { stacked: true });
  drawPlot("plot-throughput", times, h.samples.map((s) => ({ ended: (s.ended * 60) / h.sample_s })), { unit: "/min" });
}

// The cards of a node over the last hour: utilisation, temperature, and VRAM in use and
// reserved.
async function nodePlots(name) {
  const h = await getJson(`/v1/history?node=${encodeURIComponent(name)}`);
  const times = h.samples.map((s) => s.at);
  for (const card of document.querySelectorAll("#node-body .gpu-card")) {
    const index = Number(card.dataset.gpu);
    const at = (s) => (s.cards || []).find((c) => c.index === index) || {};
    const utilId = `plot-util-${index}`, vramId = `plot-vram-${index}`, tempId = `plot-temp-${index}`;
    card.append(el("div", { class: "muted" }, "utilisation, last hour"), el("div", { id: utilId, class: "plot" }),
      el("div", { class: "muted" }, "temperature °C, last hour"), el("div", { id: tempId, class: "plot" }),
      el("div", { class: "muted" }, "VRAM GiB, last hour"), el("div", { id: vramId, class: "plot" }));
    drawPlot(utilId, times, h.samples.map((s) => ({ "busy %": at(s).utilization == null ? null : at(s).utilization * 100 })));
    drawPlot(tempId, times, h.samples.map((s) => ({ "°C": at(s).temperature_c ?? null })), { unit: " °C" });
    const gibs = (b) => (b == null ? null : b / 2 ** 30);
    drawPlot(vramId, times, h.samples.map((s) => ({ used: gibs(at(s).vram_used), reserved: gibs(at(s).vram_reserved) })));
  }
}

function followPlots() {
  if (plotTimer) return;
  refreshPlots().catch(() => {});
  plotTimer = setInterval(() => refreshPlots().catch(() => {}), 10_000);
}

$("plot-range").addEventListener("change", () => refreshPlots().catch(() => {}));
window.addEventListener("hashchange", () => refreshPlots().catch(() => {}));
