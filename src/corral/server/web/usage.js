// corral dashboard: each team's GPU use against its quota (GET /v1/usage, per hour over the
// last 24 hours or per day over 30 days), and the policy in force, read only (GET /v1/policy,
// admin; hidden for a team token). Loaded after app.js and plots.js, whose helpers it uses.
"use strict";

const USAGE_RANGES = { day: { seconds: 86400, by: "hour", bucket: 3600 }, month: { seconds: 30 * 86400, by: "day", bucket: 86400 } };
let usageTimer = null;

// GPUs in use on average in each bucket, per team, and each team's quota as a line beside it.
async function refreshUsage() {
  if ($("board").hidden) return;
  const range = USAGE_RANGES[$("usage-range").value] || USAGE_RANGES.day;
  const from = Math.floor(Date.now() / 1000) - range.seconds;
  const [report, teams] = await Promise.all([
    getJson(`/v1/usage?by=team,${range.by}&from=${from}`), getJson("/v1/teams").catch(() => []),
  ]);
  const quota = Object.fromEntries(teams.map((t) => [t.name, t.quota_gpus]));
  const buckets = new Map();
  for (const r of report.rows) {
    const at = Date.parse(range.by === "day" ? `${r.day}T00:00:00Z` : r.hour) / 1000;
    const row = buckets.get(at) || {};
    row[r.team] = (row[r.team] || 0) + r.gpu_seconds / range.bucket;
    buckets.set(at, row);
  }
  const times = [...buckets.keys()].sort((a, b) => a - b);
  const seen = new Set(report.rows.map((r) => r.team));
  drawPlot("plot-usage", times, times.map((at) => {
    const row = { ...buckets.get(at) };
    for (const team of seen) if (quota[team]) row[`${team} quota`] = quota[team];
    return row;
  }), { unit: " GPUs" });
}

async function refreshPolicy() {
  const policy = await getJson("/v1/policy").catch(() => null);  // 403 for a team token
  $("policy-section").hidden = !policy;
  if (!policy) return;
  $("policy-version").textContent = policy.version ? `(version ${policy.version}, ${policy.applied_by}, ${new Date(policy.applied_at * 1000).toLocaleString()})` : "(built in)";
  const head = el("tr", {}, ["class", "rank", "preemptible", "may preempt", "other teams", "CPU offload", "time limit", "who may use it"].map((h) => el("th", {}, h)));
  const yes = (b) => (b ? "yes" : "-");
  const rows = policy.policy.classes.map((c) => el("tr", {},
    el("td", {}, el("strong", {}, c.name)), el("td", {}, String(c.rank)), el("td", {}, yes(c.preemptible)),
    el("td", {}, yes(c.may_preempt)), el("td", {}, yes(c.preempt_other_teams)), el("td", {}, yes(c.cpu_offload)),
    el("td", {}, c.default_time_limit_s == null ? "-" : `${c.default_time_limit_s} s`),
    el("td", {}, c.allowed == null ? "everyone" : [...c.allowed.teams.map((t) => `team ${t}`), ...c.allowed.users.map((u) => `user ${u}`)].join(", ") || "nobody")));
  $("policy-classes").replaceChildren(head, ...rows);
  $("policy-document").textContent = policy.document;
}

function followUsage() {
  if (usageTimer) return;
  const both = () => { refreshUsage().catch(() => {}); refreshPolicy().catch(() => {}); };
  both();
  usageTimer = setInterval(both, 60_000);
}

$("usage-range").addEventListener("change", () => refreshUsage().catch(() => {}));
window.addEventListener("hashchange", () => refreshUsage().catch(() => {}));
