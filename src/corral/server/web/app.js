// corral dashboard: plain JavaScript, no build step. It reads the public HTTP
// API like any client, authenticated by the session cookie that logging in
// sets (HttpOnly: once logged in, this page holds no token, and nothing is
// kept in its storage), and follows /v1/events (SSE over fetch) for live updates.
"use strict";

const $ = (id) => document.getElementById(id);
const state = { loggedIn: false, lastEventId: 0, previews: {}, abort: null };
const CSRF = { "X-Corral-CSRF": "1" };  // asked of cookie-authenticated requests that change things
localStorage.removeItem("corral.token");  // where earlier versions kept the token

// ---- API -------------------------------------------------------------------

async function api(path, options = {}) {
  const headers = { ...CSRF, ...(options.headers || {}) };
  const response = await fetch(path, { ...options, headers, credentials: "same-origin" });
  if (response.status === 401) { logout("Your token was not accepted (or the session ended). Log in again."); throw new Error("401"); }
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(body.message || `${response.status} ${response.statusText}`);
  }
  return response;
}
const getJson = async (path) => (await api(path)).json();

async function imageUrl(path) {
  if (state.previews[path]) return state.previews[path];
  const blob = await (await api(path)).blob();
  state.previews[path] = URL.createObjectURL(blob);
  return state.previews[path];
}

// ---- login -----------------------------------------------------------------

function logout(message = "") {
  fetch("/v1/session", { method: "DELETE", headers: CSRF }).catch(() => {});  // drop the cookie
  state.loggedIn = false;
  if (state.abort) state.abort.abort();
  for (const id of ["board", "jobs-view", "job-view", "node-view", "nav", "logout"]) $(id).hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message;
}

// The token goes to the server once, which answers with the session cookie.
async function login(token) {
  const body = JSON.stringify({ token });
  try {
    await api("/v1/session", { method: "POST", headers: { "Content-Type": "application/json" }, body });
  } catch (e) {
    if (e.message !== "401") logout(`Could not log in: ${e.message}`);
    return;
  }
  await show();
}

async function show() {
  state.loggedIn = true;
  $("token").value = "";  // the cookie holds it now; the page keeps no copy
  $("login").hidden = true; $("nav").hidden = false; $("logout").hidden = false;
  route();  // jobs.js: the view the address names
  // Live updates, plots and panels start together: none waits for another to load.
  follow();
  followPlots();  // plots.js
  followUsage();  // usage.js
  await refresh();
}

// ---- rendering -------------------------------------------------------------

const el = (tag, attrs = {}, ...children) => {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const c of children.flat()) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
};
const gib = (bytes) => `${(bytes / 2 ** 30).toFixed(1)} GiB`;
const bar = (parts) => el("div", { class: "bar" }, parts.map(([frac, cls]) => {
  const span = el("span", { class: cls || "" });  // width set through the DOM: the CSP allows no style attributes
  span.style.width = `${Math.max(0, Math.min(100, frac * 100)).toFixed(1)}%`;
  return span;
}));
const ago = (t) => t ? `${Math.max(0, Math.round(Date.now() / 1000 - t))}s ago` : "never";

function nodeState(n) {
  if (n.state === "lost") return "lost";
  if (n.draining) return "draining";
  return n.paused ? "paused" : "ready";
}

function renderNode(n) {
  const used = {};  // GPU index -> reserved VRAM bytes, from allocations
  for (const a of n.allocations) for (const i of a.gpu_indices) used[i] = (used[i] || 0) + (a.vram_bytes || 0);
  const gpus = n.gpus.map((g) => {
    const reserved = g.vram_free_bytes != null ? g.vram_bytes - g.vram_free_bytes : used[g.index] || 0;
    const util = g.utilization != null ? ` · ${Math.round(g.utilization * 100)}% util` : "";
    return el("div", { class: "gpu" }, `GPU ${g.index} ${g.model}: ${gib(reserved)} / ${gib(g.vram_bytes)}${util}`,
      bar([[g.vram_bytes ? reserved / g.vram_bytes : 0]]));
  });
  const st = nodeState(n);
  const toggle = el("button", {
    class: "toggle", "aria-pressed": String(n.paused), "data-node": n.name,
    title: n.paused ? "resume: accept new work" : "pause: no new work, running work continues",
    onclick: () => api(`/v1/nodes/${encodeURIComponent(n.name)}/${n.paused ? "resume" : "pause"}`, { method: "POST" })
      .then(refresh).catch((e) => alert(e.message)),
  }, n.paused ? "resume" : "pause");
  return el("div", { class: "card node", "data-node": n.name },
    el("h3", {}, el("a", { href: `#node/${encodeURIComponent(n.name)}` }, n.name), el("span", { class: `badge ${st}`, "data-state": st }, st), toggle),
    n.gpus.length ? gpus : el("div", { class: "muted" }, `CPU only · ${n.cpus} slots`),
    el("div", { class: "muted" }, `models loaded: ${n.models_loaded.join(", ") || "none"}`),
    el("div", { class: "muted" }, `models on disk: ${n.models_on_disk.join(", ") || "none"}`),
    el("div", { class: "muted" }, `${n.allocations.length} running · last seen ${ago(n.last_seen)}`),
    n.pause_reason ? el("div", { class: "muted pause-reason" }, n.pause_reason) : "");
}

// "attempt 2 · resumed from step 120" for a job that resumed from a checkpoint.
const resumed = (job) => job.resumed_from_step != null
  ? el("div", { class: "muted resumed" }, `attempt ${job.attempt} · resumed from step ${job.resumed_from_step}`) : "";

// The server's estimate (docs/scheduler.md, "ETA") as a person says it: "starts in ~4 min"
// for a queued job, "ends in ~2 min" for a running one; "" without one (an ended job).
function etaText(job) {
  const e = job.eta;
  if (!e) return "";
  const inText = (at) => {
    const s = at - Date.now() / 1000;
    if (s < 30) return "any moment";
    if (s < 90) return "in ~1 min";
    if (s < 3600) return `in ~${Math.round(s / 60)} min`;
    if (s < 2 * 86400) return `in ~${(s / 3600).toFixed(1).replace(/\.0$/, "")} h`;
    return `in ~${Math.round(s / 86400)} days`;
  };
  if (job.state !== "queued") return e.end_at == null ? "" : `ends ${inText(e.end_at)}`;
  if (e.start_at == null) return e.basis === "never" ? "no node can run it" : "start not foreseen";
  return `starts ${inText(e.start_at)}`;
}

function renderRunning(job) {
  const card = el("div", { class: "card job", "data-job": job.id },
    el("h3", {}, jobLink(job.id), el("span", { class: "badge" }, job.state)),
    el("div", { class: "muted" }, `${job.kind} · ${job.team}/${job.user} · ${job.priority} · ${job.node || "placing"}`),
    bar([[job.progress]]),
    el("div", { class: "muted progress-text" }, `${Math.round(job.progress * 100)}%`),
    el("div", { class: "muted eta" }, etaText(job)), resumed(job));
  const preview = state.previews["job:" + job.id];
  if (preview) showPreview(card, preview);
  return card;
}

async function showPreview(card, path) {
  const url = await imageUrl(path).catch(() => null);
  if (!url) return;
  let img = card.querySelector("img.preview");
  if (!img) { img = el("img", { class: "preview", alt: "preview" }); card.append(img); }
  img.src = url;
}

// A job a client interrupted reads "interrupted" (its state stays succeeded, with what it
// made so far, or cancelled when it had made nothing); "ran": what the agent filled in.
const outcome = (job) => job.interrupted ? "interrupted" : job.state;
const ran = (job) => job.ran
  ? el("div", { class: "muted ran" }, "ran: " + Object.entries(job.ran).map(([k, v]) => `${k}=${v}`).join(", ")) : "";

function renderFinished(job) {
  const card = el("div", { class: "card job", "data-job": job.id },
    el("h3", {}, jobLink(job.id), el("span", { class: `badge ${outcome(job)}`, "data-state": outcome(job) }, outcome(job))),
    el("div", { class: "muted" }, `${job.team}/${job.user} · ${job.error || `${job.result.length} result file(s)`}`),
    resumed(job), ran(job));
  for (const f of job.result.filter((f) => f.content_type.startsWith("image/")).slice(0, 2)) {
    imageUrl(f.url).then((u) => card.append(el("img", { class: "preview", alt: f.name, src: u }))).catch(() => {});
  }
  for (const f of job.result.filter((f) => !f.content_type.startsWith("image/"))) {
    card.append(el("div", { class: "muted" }, `${f.name} (${f.size} bytes)`));
  }
  return card;
}

function renderTeams(teams, nodes, running) {
  const teamOfJob = Object.fromEntries(running.map((j) => [j.id, j.team]));
  const usage = {};  // team -> {guaranteed, borrowed} in GPUs
  for (const n of nodes) for (const a of n.allocations) {
    const team = teamOfJob[a.job_ids[0]] || "?";
    const gpus = (a.gpu_milli * a.gpu_indices.length) / 1000;
    usage[team] = usage[team] || { guaranteed: 0, borrowed: 0 };
    usage[team][a.borrowed ? "borrowed" : "guaranteed"] += gpus;
  }
  const total = Math.max(1, nodes.reduce((s, n) => s + n.gpus.length, 0));
  return teams.map((t) => {
    const u = usage[t.name] || { guaranteed: 0, borrowed: 0 };
    return el("div", { class: "team", "data-team": t.name }, el("strong", {}, t.name),
      bar([[u.guaranteed / total], [u.borrowed / total, "borrowed"]]),
      el("span", { class: "muted" }, `${u.guaranteed.toFixed(1)} of ${t.quota_gpus} guaranteed + ${u.borrowed.toFixed(1)} borrowed`));
  });
}

const human = (b) => b >= 2 ** 30 ? gib(b) : b >= 2 ** 20 ? `${(b / 2 ** 20).toFixed(1)} MiB` : `${b} B`;

// Models and where they are cached: "gpu-1 (loaded), gpu-2, gpu-3 (downloading 43%)".
function renderModels(models) {
  const where = (m) => m.cached.map((c) => c.state === "downloading" ? `${c.node} (downloading ${Math.floor((c.progress || 0) * 100)}%)`
    : c.state === "on_disk" ? c.node : `${c.node} (${c.state})`).join(", ") || "not cached yet";
  const head = el("tr", {}, ["model", "kind", "size", "state", "cached on"].map((h) => el("th", {}, h)));
  return [head, ...models.map((m) => el("tr", { "data-model": m.name },
    el("td", {}, el("strong", {}, m.name)), el("td", {}, m.kind + (m.backend ? ` · ${m.backend}` : "")),
    el("td", {}, human(m.size)),
    el("td", {}, m.state === "uploading" && m.uploaded != null ? `uploading ${Math.floor(100 * m.uploaded / m.size)}%` : m.state),
    el("td", { class: "cached" }, where(m))))];
}

// The autoscaler (admin only; hidden when it is off or the token may not see it): each pool's
// machine and provider, its machines launching, joined and draining of min..max, what they
// cost per hour now against its cap, any back-off; the fleet's spend against the overall cap;
// the recent decisions with their reasons; and the waiting jobs the last one did not serve.
function renderAutoscaler(status) {
  const head = el("tr", {}, ["pool", "provider", "machine", "launching", "joined", "draining", "min..max", "cost/h (now / cap)", "back-off"].map((h) => el("th", {}, h)));
  const rows = status.pools.map((p) => {
    const count = (state) => String((p.machines || {})[state] || 0);
    const cap = p.max_spend_per_hour == null ? "no cap" : money(p.max_spend_per_hour);
    return el("tr", { "data-pool": p.name },
      el("td", {}, el("strong", {}, p.name)), el("td", {}, (p.provider || "-") + (p.fixed ? " (fixed)" : "")),
      el("td", {}, p.gpus ? `${p.gpus}x ${p.gpu_model} ${gib(p.vram_bytes)}, ${p.cpus} CPUs` : `${p.cpus} CPUs`),
      el("td", { class: "launching" }, count("launching")), el("td", { class: "joined" }, count("joined")),
      el("td", { class: "draining" }, count("draining") + ((p.machines || {}).terminating ? ` (+${p.machines.terminating} terminating)` : "")),
      el("td", {}, `${p.min_nodes}..${p.max_nodes}`),
      el("td", { class: "cost" }, `${money(p.cost_per_hour)} each · ${money(p.cost_per_hour_now)} / ${cap}`),
      el("td", {}, p.backoff_until ? `until ${new Date(p.backoff_until * 1000).toLocaleTimeString()}` : "-"));
  });
  const s = status.spend;
  const spend = !s ? "" : `spend: ${money(s.cost_per_hour_now)}/h now` +
    (s.max_spend_per_hour == null ? ", no overall cap" : ` of a ${money(s.max_spend_per_hour)}/h cap` +
      (s.cost_per_hour_now >= s.max_spend_per_hour ? " (reached: no launch until it is under)" : "")) +
    `; ${money(s.spent_last_hour)} in the last hour`;
  const decisions = (status.decisions || []).slice(-10).flatMap((d) => d.lines.map((line) =>
    el("li", {}, el("span", { class: "muted" }, new Date(d.at * 1000).toLocaleTimeString() + " "), line)));
  const last = status.last;
  const unmet = !last ? [el("li", { class: "muted" }, "No decision yet.")] : [
    ...last.unmet.slice(0, 20).map((u) => el("li", { class: "error" }, `not served ${u.job_id}: ${u.reason}`)),
    ...(last.unmet.length > 20 ? [el("li", { class: "muted" }, `… and ${last.unmet.length - 20} more waiting jobs not served`)] : []),
  ];
  const lines = [...decisions, ...unmet];
  return [[head, ...rows], spend, lines.length ? lines : [el("li", { class: "muted" }, "Nothing to do yet.")]];
}

function money(x) {
  return (Math.round(x * 100) / 100).toString();
}

// The board's panels, each drawn from its own requests as they answer: one slow or failing
// request never holds the others. A panel that could not load says so on the board and is
// asked again a second later, so a server that was briefly busy heals without a reload.
const PANELS = {
  nodes: async () => {
    const [nodes, teams, running] = await Promise.all([
      getJson("/v1/nodes"), getJson("/v1/teams").catch(() => []),
      getJson("/v1/jobs?state=running&state=placed&limit=100"),
    ]);
    $("nodes-count").textContent = `(${nodes.length})`;
    $("nodes").replaceChildren(...(nodes.length ? nodes.map(renderNode) : [el("p", { class: "muted" }, "No agent has connected yet.")]));
    $("running").replaceChildren(...(running.jobs.length ? running.jobs.map(renderRunning) : [el("p", { class: "muted" }, "Nothing running.")]));
    $("teams").replaceChildren(...renderTeams(teams, nodes, running.jobs));
  },
  queue: async () => {
    const queue = await getJson("/v1/queue");
    $("queue-count").textContent = `(${queue.total})`;
    $("queue").replaceChildren(...queue.entries.map((e) => el("li", { "data-job": e.job.id },
      el("strong", {}, jobLink(e.job.id)), ` ${e.job.priority} · ${e.job.team}/${e.job.user} — `,
      etaText(e.job) ? el("span", { class: "eta" }, `${etaText(e.job)} · `) : "",
      el("span", { class: "muted" }, e.queue.summary || "waiting for the next cycle"),
      e.queue.advice ? el("div", { class: "remedy" }, e.queue.advice) : "")));
  },
  finished: async () => {
    const finished = await getJson("/v1/jobs?state=succeeded&state=failed&state=cancelled&limit=12");
    $("finished").replaceChildren(...finished.jobs.map(renderFinished));
  },
  autoscaler: async () => {
    const scaling = await getJson("/v1/autoscaler").catch(() => null);  // 403 for a team token
    $("autoscaler-section").hidden = !(scaling && scaling.enabled);
    if (scaling && scaling.enabled) {
      const [table, spend, lines] = renderAutoscaler(scaling);
      $("pools").replaceChildren(...table);
      $("autoscaler-spend").textContent = spend;
      $("autoscaler-last").replaceChildren(...lines);
    }
  },
  models: async () => {
    const models = await getJson("/v1/models").catch(() => []);
    $("models-count").textContent = `(${models.length})`;
    $("models").replaceChildren(...(models.length ? renderModels(models) : [el("tr", {}, el("td", { class: "muted" }, "No models registered (corral model add).") )]));
  },
};
const failedPanels = new Map();  // panel -> why it did not load

async function refresh() {
  await Promise.all(Object.entries(PANELS).map(([name, draw]) => draw().then(
    () => { failedPanels.delete(name); },
    (e) => { if (e.message !== "401") failedPanels.set(name, e.message); })));
  $("board-error").textContent = [...failedPanels].map(([name, why]) => `${name}: ${why}`).join(" · ")
    + (failedPanels.size ? " (retrying)" : "");
  if (failedPanels.size && state.loggedIn) refreshSoon();
}

// ---- live updates ----------------------------------------------------------

// Throttle, not debounce: a job reporting progress every 50 ms must not
// postpone the refresh forever. At most one refresh a second: a busy server
// sends hundreds of events a second, and each refresh asks it six questions
// (progress and previews still update at once, from the events themselves).
const REFRESH_MS = 1000;
let refreshTimer = null;
function refreshSoon() {
  if (refreshTimer) return;
  refreshTimer = setTimeout(() => { refreshTimer = null; refresh().catch(() => {}); }, REFRESH_MS);
}

function onEvent(kind, data) {
  const card = document.querySelector(`#running [data-job="${CSS.escape(data.job_id || "")}"]`);
  if (kind === "job.progress" && card) {
    const frac = data.data.fraction ?? data.data.progress ?? 0;
    card.querySelector(".bar > span").style.width = `${(frac * 100).toFixed(1)}%`;
    card.querySelector(".progress-text").textContent = `${Math.round(frac * 100)}%`;
    return;
  }
  if (kind === "job.preview") {
    state.previews["job:" + data.job_id] = data.data.url;
    if (card) showPreview(card, data.data.url);
    return;
  }
  if (kind !== "job.log") refreshSoon();
}

async function follow() {
  state.abort = new AbortController();
  for (let delay = 500; state.loggedIn; delay = Math.min(delay * 2, 10000)) {
    try {
      const headers = {};
      if (state.lastEventId) headers["Last-Event-ID"] = String(state.lastEventId);
      const response = await fetch("/v1/events", { headers, signal: state.abort.signal, credentials: "same-origin" });
      if (response.status === 401) return logout("Your token was not accepted.");
      if (response.status === 429) {  // this token holds its limit of open streams: wait as told
        const wait = Number(response.headers.get("Retry-After")) || 5;
        $("live").textContent = "reconnecting"; $("live").className = "badge off";
        await new Promise((r) => setTimeout(r, wait * 1000));
        continue;
      }
      $("live").textContent = "live"; $("live").className = "badge on";
      delay = 500;
      await readSse(response.body.getReader());
    } catch (e) {
      if (e.name === "AbortError") return;
    }
    $("live").textContent = "reconnecting"; $("live").className = "badge off";
    await new Promise((r) => setTimeout(r, delay));
  }
}

async function readSse(reader) {
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const frame = buffer.slice(0, end); buffer = buffer.slice(end + 2);
      let kind = "message", data = "";
      for (const line of frame.split("\n")) {
        if (line.startsWith("id:")) state.lastEventId = Number(line.slice(3).trim());
        else if (line.startsWith("event:")) kind = line.slice(6).trim();
        else if (line.startsWith("data:")) data += line.slice(5).trim();
      }
      if (data) onEvent(kind, JSON.parse(data));
    }
  }
}

// ---- start -----------------------------------------------------------------

$("login-form").addEventListener("submit", (e) => { e.preventDefault(); login($("token").value.trim()); });
$("logout").addEventListener("click", () => logout());
// A link with #token=... (as `corral up` prints) logs in once; the hash is cleared first.
function loginFromHash() {
  const fromHash = new URLSearchParams(location.hash.slice(1)).get("token");
  if (!fromHash) return false;
  history.replaceState(null, "", location.pathname);  // never kept in history
  login(fromHash);
  return true;
}
// Also when the link is opened in a tab already showing the page: only the hash changes.
window.addEventListener("hashchange", loginFromHash);
// The first view starts once every script has run (they load deferred, in order, and a
// quick answer to the session check could otherwise arrive before plots.js or usage.js).
document.addEventListener("DOMContentLoaded", () => {
  if (!loginFromHash()) fetch("/v1/session").then((r) => (r.ok ? show() : logout())).catch(() => logout("Could not reach the server."));
});
