// corral dashboard: the views' routing, the jobs list (#jobs) and one job's page (#job/<id>). Loaded after
// app.js, whose helpers ($, el, api, getJson, bar, imageUrl, outcome, ran) it uses.
"use strict";

const TERMINAL = ["succeeded", "failed", "cancelled"];
const when = (t) => t ? new Date(t * 1000).toLocaleString() : "-";
const jobLink = (id) => el("a", { href: `#job/${encodeURIComponent(id)}` }, id);
const views = { board: "board", jobs: "jobs-view", job: "job-view", node: "node-view", groups: "groups-view", group: "group-view" };
const jobView = { abort: null, cursor: null };

// ---- routing ---------------------------------------------------------------

// Which view the hash names: "" the cluster board, "#jobs" the list, "#job/<id>" one job,
// "#groups" the pipelines and arrays, "#pipeline/<id>" or "#array/<id>" one of them (groups.js).
function route() {
  if (!state.loggedIn) return;
  if (jobView.abort) { jobView.abort.abort(); jobView.abort = null; }  // stop the last job's stream
  const hash = location.hash.slice(1);
  const group = hash.match(/^(pipeline|array)\/(.+)$/);
  const [name, arg] = hash.startsWith("job/") ? ["job", decodeURIComponent(hash.slice(4))]
    : hash.startsWith("node/") ? ["node", decodeURIComponent(hash.slice(5))]
    : group ? ["group", decodeURIComponent(group[2])]
    : [["jobs", "groups"].includes(hash) ? hash : "board", null];
  for (const [view, id] of Object.entries(views)) $(id).hidden = view !== name;
  for (const a of document.querySelectorAll("#nav a")) {
    if (a.dataset.view === name) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  if (name === "jobs") listJobs(false).catch((e) => showError("jobs-error", e));
  if (name === "job") showJob(arg).catch((e) => showError("job-error", e));
  if (name === "node") showNode(arg).catch((e) => showError("node-error", e));  // node.js
  if (name === "groups") listGroups().catch((e) => showError("groups-error", e));  // groups.js
  if (name === "group") showGroup(group[1], arg).catch((e) => showError("group-error", e));
}
const showError = (id, e) => { if (e.message !== "401") $(id).textContent = e.message; };
window.addEventListener("hashchange", route);

// ---- the list --------------------------------------------------------------

// Filters go to the API as they are (state, team, user, kind, priority, node, model, submitted
// since, id prefix); paging follows the API's
// cursor (keyset: each page costs the same however many jobs the database holds).
async function listJobs(more) {
  $("jobs-error").textContent = "";
  const f = new FormData($("job-filters"));
  const query = new URLSearchParams({ limit: "50" });
  for (const key of ["state", "team", "user", "kind", "priority", "node", "model", "q"]) if (f.get(key)) query.set(key, f.get(key).trim());
  if (f.get("since")) query.set("since", String(Date.now() / 1000 - Number(f.get("since"))));
  if (more && jobView.cursor) query.set("cursor", jobView.cursor);
  const page = await getJson(`/v1/jobs?${query}`);
  jobView.cursor = page.next_cursor;
  const rows = page.jobs.map((j) => el("tr", { "data-job": j.id },
    el("td", {}, jobLink(j.id)),
    el("td", {}, el("span", { class: `badge ${outcome(j)}`, "data-state": outcome(j) }, outcome(j))),
    el("td", {}, j.kind + (j.backend ? ` · ${j.backend}` : "")), el("td", {}, `${j.team}/${j.user}`),
    el("td", {}, j.priority), el("td", {}, j.node || "-"), el("td", {}, when(j.submitted_at))));
  const head = el("tr", {}, ["job", "state", "kind", "team/user", "priority", "node", "submitted"].map((h) => el("th", { scope: "col" }, h)));
  if (more) $("jobs-table").append(...rows);
  else $("jobs-table").replaceChildren(head, ...(rows.length ? rows : [el("tr", {}, el("td", { colspan: "7", class: "muted" }, "No jobs match."))]));
  $("jobs-more").hidden = !page.next_cursor;
}

$("job-filters").addEventListener("submit", (e) => {
  e.preventDefault();
  listJobs(false).catch((err) => showError("jobs-error", err));
});
$("jobs-more").addEventListener("click", () => listJobs(true).catch((e) => showError("jobs-error", e)));

// ---- one job ---------------------------------------------------------------

async function showJob(id) {
  $("job-error").textContent = "";
  $("job-body").replaceChildren();  // never another job's page under this one's error
  jobView.drawn = null;
  const job = await getJson(`/v1/jobs/${encodeURIComponent(id)}`);
  $("job-body").replaceChildren(el("div", { id: "job-summary" }), el("div", { id: "job-preview" }),
    el("section", {}, el("h3", {}, "Timeline"), el("ol", { id: "job-timeline", class: "timeline" })),
    el("section", {}, el("h3", {}, "Logs"), el("pre", { id: "job-logs", class: "logs", tabindex: "0" })),
    el("section", {}, el("h3", {}, "Request"),
      el("pre", { class: "payload", tabindex: "0" }, JSON.stringify({ payload: job.payload, resources: job.resources, model: job.model,
        models: job.models, node_selector: job.node_selector, replicas: job.replicas, timeout_s: job.timeout_s }, null, 2))));
  renderJob(job);
  jobView.abort = new AbortController();
  followJob(job.id, jobView.abort.signal).catch(() => {});
}

// What changes as it runs: state, actions, why it waits, progress, results.
function renderJob(job) {
  // Drawn again only when it changed: a button must not be replaced under a click, nor the
  // edit form under the user's typing. The ETA moves every few seconds: its line alone is
  // updated in place.
  const drawn = JSON.stringify([job.id, job.state, job.interrupted, job.attempt, job.node, job.placement, job.result, job.queue, job.error,
    job.held, job.priority, job.timeout_s, job.labels, Boolean(etaText(job))]);
  if (drawn === jobView.drawn && $("job-summary").hasChildNodes()) {
    if ($("job-eta")) $("job-eta").textContent = etaText(job);
    return;
  }
  jobView.drawn = drawn;
  // What the user is typing in the edit form survives a redraw (the queue's explanation moves
  // on every cycle); it is dropped once saved.
  const form = $("job-edit");
  const typed = form && form.dataset.typing === job.id ? [...new FormData(form)] : null;
  const done = TERMINAL.includes(job.state);
  $("job-summary").replaceChildren(
    el("h2", {}, `Job ${job.id} `, el("span", { class: `badge ${outcome(job)}`, "data-state": outcome(job), id: "job-state" }, outcome(job))),
    el("p", { class: "muted" }, `${job.kind}${job.backend ? " · " + job.backend : ""} · ${job.team}/${job.user} · priority ${job.priority}` +
      ` · attempt ${job.attempt} of ${job.max_attempts}${job.node ? " · on " + job.node : ""} · submitted ${when(job.submitted_at)}`),
    memberOf(job),
    el("div", { class: "actions", role: "group", "aria-label": "actions" }, actions(job, done)),
    job.state === "queued" ? editForm(job) : "",
    etaText(job) ? el("p", { class: "eta", id: "job-eta" }, etaText(job)) : "",
    queueExplanation(job),
    placement(job),
    labelList(job),
    job.webhook ? el("section", { id: "job-webhook" }, el("h3", {}, "Webhook"),
      el("p", { class: "muted" }, `${job.webhook.url} (${job.webhook.events === "all" ? "every state change" : "when it ends"})`),
      el("ul", { id: "job-deliveries" })) : "",
    el("section", {}, el("h3", {}, "Progress"), bar([[job.progress]]),
      el("div", { class: "muted", id: "job-progress" }, `${Math.round(job.progress * 100)}%`),
      job.error ? el("p", { class: "error" }, job.error) : "", resumed(job), ran(job)),
    el("section", {}, el("h3", {}, "Results"), results(job)));
  const again = $("job-edit");
  if (typed && again) {
    for (const [name, value] of typed) if (again.elements.namedItem(name)) again.elements.namedItem(name).value = value;
    again.dataset.typing = job.id;
  }
  if (job.webhook) showDeliveries(job.id).catch(() => {});
}

// A queued job's class, time limit and labels, changed in place (PATCH /v1/jobs/{id}).
function editForm(job) {
  const labels = Object.entries(job.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ");
  const field = (label, attrs) => el("label", {}, label + " ", el("input", attrs));
  const form = el("form", { id: "job-edit", class: "edit", "aria-label": "edit the queued job" },
    field("priority", { name: "priority", value: job.priority, size: "10" }),
    field("time limit (s)", { name: "timeout_s", type: "number", min: "1", value: job.timeout_s ?? "", size: "8" }),
    field("labels", { name: "labels", value: labels, placeholder: "key=value, ...", size: "24" }),
    field(`${job.user}'s weight`, { name: "user_weight", type: "number", min: "0.001", step: "any", placeholder: "admin", size: "6" }),
    el("button", { type: "submit", "data-action": "save" }, "save"));
  form.addEventListener("input", () => { form.dataset.typing = job.id; });
  form.addEventListener("submit", (e) => {
    e.preventDefault();
    const data = new FormData(form);
    delete form.dataset.typing;
    const change = { priority: data.get("priority") };
    if (data.get("timeout_s")) change.timeout_s = Number(data.get("timeout_s"));
    if (data.get("user_weight")) change.user_weight = Number(data.get("user_weight"));  // a new policy version
    change.labels = Object.fromEntries(String(data.get("labels")).split(",").map((p) => p.trim()).filter(Boolean)
      .map((p) => [p.split("=")[0].trim(), p.split("=").slice(1).join("=").trim()]));
    edit(job, change).catch((err) => { $("job-error").textContent = err.message; });
  });
  return form;
}

async function edit(job, change) {
  const r = await api(`/v1/jobs/${encodeURIComponent(job.id)}`, { method: "PATCH", headers: { "Content-Type": "application/json" }, body: JSON.stringify(change) });
  renderJob(await r.json());
}

function labelList(job) {
  const entries = Object.entries(job.labels || {});
  if (!entries.length) return "";
  return el("p", { id: "job-labels", class: "muted" }, "labels: ", entries.map(([k, v]) => el("code", {}, `${k}=${v} `)));
}

// Each webhook call: the event it reports, where it stands, the receiver's last answer.
// ``path``: a job's, pipeline's or array's (/v1/{jobs,pipelines,arrays}/<id>); the list's element id.
async function showDeliveries(id, path = `/v1/jobs/${encodeURIComponent(id)}`, listId = "job-deliveries") {
  const found = (await getJson(`${path}/deliveries`)).deliveries;
  const list = $(listId);
  if (!list) return;
  list.replaceChildren(...found.map((d) => el("li", { "data-state": d.state },
    `${d.kind}: ${d.state} after ${d.attempts} attempt(s)` + (d.last_status ? ` · HTTP ${d.last_status}` : d.last_error ? ` · ${d.last_error}` : ""))));
}

// Where it runs: each allocation (a gang's replicas in rank order), its GPUs and their links.
function placement(job) {
  const placed = job.placement || [];
  if (!placed.length) return "";
  return el("section", { id: "job-placement" }, el("h3", {}, "Placement"), el("ul", {}, placed.map((p) =>
    el("li", {}, `${placed.length > 1 ? "rank " + p.replica + ": " : ""}`, el("a", { href: `#node/${encodeURIComponent(p.node)}` }, p.node),
      ` · ${p.topology || (p.gpu_indices.length ? "GPUs " + p.gpu_indices.join(",") : "no GPU")} · ${p.cpus} CPU(s)${p.memory_bytes ? " · " + gib(p.memory_bytes) + " memory" : ""} · ${p.observed}`))));
}

// The pipeline step or array element a job is, linked to its group's page.
function memberOf(job) {
  if (job.pipeline) return el("p", { id: "job-group" }, "step ", el("strong", {}, job.pipeline.step), " of pipeline ",
    el("a", { href: `#pipeline/${encodeURIComponent(job.pipeline.id)}` }, job.pipeline.id));
  if (job.array) return el("p", { id: "job-group" }, `element ${job.array.index} of array `,
    el("a", { href: `#array/${encodeURIComponent(job.array.id)}` }, job.array.id));
  return "";
}

const reload = (id) => getJson(`/v1/jobs/${encodeURIComponent(id)}`).then(renderJob);

// Cancel ends it now; interrupt keeps what it made so far; hold keeps a queued job from
// being placed until released; top makes it its user's next job; retry submits the same
// request again as a new job; delete removes a finished one with its results.
function actions(job, done) {
  const act = (label, title, run) => el("button", { "data-action": label, title, onclick: () => run().catch((e) => { $("job-error").textContent = e.message; }) }, label);
  const post = (verb) => async () => { renderJob(await (await api(`/v1/jobs/${encodeURIComponent(job.id)}/${verb}`, { method: "POST" })).json()); };
  const out = [];
  if (!done) out.push(act("cancel", "end it now; running work is told to stop", post("cancel")));
  if (job.state === "queued") {
    out.push(job.held
      ? act("release", "let it be placed again", () => edit(job, { hold: false }))
      : act("hold", "keep it queued but do not place it", () => edit(job, { hold: true })));
    out.push(act("top", "make it its user's next job", () => edit(job, { top: true })));
  }
  if (job.state === "running" || job.state === "placed") out.push(act("interrupt", "stop early and keep what it made so far", post("interrupt")));
  if (done) {
    out.push(act("retry", "submit the same request again as a new job", async () => {
      const created = await (await api("/v1/jobs", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(resubmission(job)) })).json();
      location.hash = `job/${encodeURIComponent(created.id)}`;
    }));
    out.push(act("delete", "delete it with its results", async () => {
      if (!confirm(`Delete ${job.id} and its results?`)) return;
      await api(`/v1/jobs/${encodeURIComponent(job.id)}`, { method: "DELETE" });
      location.hash = "jobs";
    }));
  }
  return out;
}

function resubmission(job) {
  const r = job.resources;
  const gpus = r.gpus ? r.gpus : r.gpu_milli / 1000;
  return { kind: job.kind, payload: job.payload, priority: job.priority, team: job.team, user: job.user,
    resources: { gpus, vram: r.vram_bytes || null, cpus: r.cpus, gpu_models: r.gpu_models, cpu_fallback: r.cpu_fallback, memory: r.memory_bytes || null },
    node_selector: job.node_selector, replicas: job.replicas, gang_label: job.gang_label, model: job.model, models: job.models,
    backend: job.backend, batch_key: job.batch_key, preemptible: job.preemptible, timeout_s: job.timeout_s, max_attempts: job.max_attempts };
}

// While it waits: its place in the queue and the scheduler's reasons, with the remedy.
function queueExplanation(job) {
  if (job.state !== "queued" || !job.queue) return "";
  const q = job.queue;
  return el("section", { id: "job-queue" }, el("h3", {}, "Why it waits"),
    el("p", {}, `position ${q.position + 1} in the queue: ${q.summary || "waiting for the next cycle"}`),
    el("ul", {}, q.reasons.map((r) => el("li", { "data-code": r.code }, r.nodes ? `${r.nodes} node(s): ${r.message}` : r.message))),
    q.remedy ? el("p", { class: "remedy", "data-remedy": q.remedy }, q.advice || REMEDIES[q.remedy] || q.remedy) : "");
}

// The scheduler's remedy codes (scheduler/api.py Remedy), said as what to do.
const REMEDIES = {
  wait: "It runs when a node that fits frees up.",
  preempt: "Lower-priority or borrowed work will be preempted to make room.",
  none: "No node can ever run it as it is: add a node that fits (to try, start an agent with --fake-gpus), or change its request.",
};

function results(job) {
  if (!job.result.length) return el("p", { class: "muted" }, TERMINAL.includes(job.state) ? "No result files." : "Not finished yet.");
  return el("ul", { class: "results" }, job.result.map((f) => {
    const item = el("li", { "data-file": f.name }, el("a", { href: f.url, download: f.name }, f.name), ` ${f.content_type}, ${f.size} bytes`);
    if (f.content_type.startsWith("image/")) {
      imageUrl(f.url).then((u) => item.append(el("img", { class: "preview", alt: `result ${f.name}`, src: u }))).catch(() => {});
    }
    return item;
  }));
}

// The job's own event stream from its first event: the timeline, progress, previews and
// logs, live until it ends (the server closes the stream after its final event).
async function followJob(id, signal) {
  const response = await fetch(`/v1/jobs/${encodeURIComponent(id)}/events?after=0`, { signal, credentials: "same-origin" });
  if (!response.ok) return;
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end); buffer = buffer.slice(end + 2);
      const data = frame.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5).trim()).join("");
      if (data) onJobEvent(id, JSON.parse(data));
    }
  }
  if (!signal.aborted) reload(id).catch(() => {});  // it ended: show its results
}

function onJobEvent(id, e) {
  const d = e.data || {};
  if (e.kind === "job.progress") {
    const frac = d.fraction ?? d.progress ?? 0;
    const span = document.querySelector("#job-body .bar > span");
    if (span) span.style.width = `${(frac * 100).toFixed(1)}%`;
    $("job-progress").textContent = `${Math.round(frac * 100)}%`;
    return;
  }
  if (e.kind === "job.preview") {
    imageUrl(d.url).then((u) => $("job-preview").replaceChildren(el("h3", {}, "Latest preview"), el("img", { class: "preview", alt: "latest preview", src: u }))).catch(() => {});
    return;
  }
  if (e.kind === "job.log") {
    const logs = $("job-logs");
    logs.append((d.lines || []).join("\n") + "\n");
    logs.scrollTop = logs.scrollHeight;  // follow
    return;
  }
  reloadSoon(id);  // a change of state: new actions, results, reasons
  const shown = Object.entries(d).filter(([k]) => !["allocations", "state"].includes(k)).map(([k, v]) => `${k}=${typeof v === "object" ? JSON.stringify(v) : v}`);
  $("job-timeline").append(el("li", { "data-kind": e.kind }, el("time", {}, new Date(e.at * 1000).toLocaleTimeString()), " ",
    el("strong", {}, e.kind.replace("job.", "")), e.node ? ` on ${e.node}` : "", shown.length ? ` · ${shown.join(", ")}` : ""));
}

// A replayed history arrives as a burst of events: one reload for all of them.
let reloadTimer = null;
function reloadSoon(id) {
  if (reloadTimer) return;
  reloadTimer = setTimeout(() => { reloadTimer = null; if (location.hash === `#job/${encodeURIComponent(id)}`) reload(id).catch(() => {}); }, 300);
}
