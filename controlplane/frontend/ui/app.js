// The fleet page (issue #25): twine-controld's API, read with a token kept in this tab's
// sessionStorage (never in a URL or a cookie), drawn with uPlot. Every figure comes summed from the
// server (/v1/fleet, /v1/.../usage): the page never asks for every machine of the region, only for
// the machines of one MSB when it is opened. No inline script or style: the page's
// Content-Security-Policy allows none.
"use strict";

const KEY = "twine-token";
const WINDOW = 6 * 3600; // the seconds of history a usage chart shows (the API's since)
const $ = (id) => document.getElementById(id);

function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "style") Object.assign(el.style, v);
    else if (k.startsWith("data-")) el.setAttribute(k, v);
    else if (k === "onclick") el.addEventListener("click", v);
    else el[k] = v;
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

const num = (v, digits = 2) => (v === null || v === undefined ? "-" : String(+Number(v).toFixed(digits)));
const td = (v, k) => h("td", k ? { "data-k": k } : {}, v);
const link = (href, text) => h("a", { href }, text);
const table = (heads, rows) => h("table", {}, h("tr", {}, heads.map((x) => h("th", {}, x))), rows);

function colour(name) {
  if (!name) return "#bbb"; // the free pool
  let x = 0;
  for (const ch of name) x = (x * 31 + ch.charCodeAt(0)) >>> 0;
  return `hsl(${x % 360}, 55%, 55%)`;
}

class Refused extends Error {}

async function api(path) {
  const token = sessionStorage.getItem(KEY);
  const r = await fetch(path, { headers: { Authorization: `Bearer ${token}` }, cache: "no-store" });
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (r.status === 401 || r.status === 403) {
    throw new Refused(`the token was refused (${r.status}): ${body && body.why ? body.why : r.statusText}`);
  }
  if (!r.ok) throw new Error(`${path}: ${r.status} ${body && body.why ? body.why : r.statusText}`);
  return body;
}

function showError(text) {
  const e = $("error");
  e.textContent = text;
  e.hidden = !text;
}

// -- views ---------------------------------------------------------------------------------------

async function regionView(view) {
  const fleet = await api("/v1/fleet?by=dc,msb,entitlement");
  let machines = 0, healthy = 0, maint = 0, reserved = 0, used = 0, cpus = 0;
  const dcs = new Map();
  for (const c of fleet.cells) {
    machines += c.machines; healthy += c.healthy; maint += c.maintenance;
    reserved += c.reserved.cpus; used += c.used.cpus; cpus += c.cpus;
    if (!dcs.has(c.dc)) dcs.set(c.dc, new Map());
    const msbs = dcs.get(c.dc);
    if (!msbs.has(c.msb)) msbs.set(c.msb, []);
    msbs.get(c.msb).push(c);
  }
  view.append(h("h1", {}, "Region"),
    h("p", {}, "machines ", h("b", { "data-k": "machines" }, machines), ", unhealthy ",
      h("b", { "data-k": "unhealthy" }, machines - healthy), ", in maintenance ", h("b", { "data-k": "maintenance" }, maint),
      "; cores reserved ", h("b", { "data-k": "reserved" }, num(reserved)), ", used ", h("b", { "data-k": "used" }, num(used)),
      " of ", h("b", { "data-k": "cpus" }, num(cpus))));
  const ents = [...new Set(fleet.cells.map((c) => c.entitlement))].sort();
  view.append(h("p", { className: "legend" }, ents.map((e) =>
    h("span", {}, h("span", { className: "swatch", style: { background: colour(e) } }), e || "free pool"))));
  for (const [dc, msbs] of [...dcs].sort()) {
    const box = h("div", { className: "dc" }, h("h3", {}, dc));
    for (const [msb, cells] of [...msbs].sort()) {
      const total = cells.reduce((a, c) => a + c.machines, 0);
      const bar = h("div", { className: "bar" }, cells.map((c) => h("span", {
        title: `${c.entitlement || "free pool"}: ${c.machines} machines`,
        style: { width: `${(100 * c.machines) / total}%`, background: colour(c.entitlement) } })));
      const bad = cells.reduce((a, c) => a + c.machines - c.healthy, 0);
      const inMaint = cells.reduce((a, c) => a + c.maintenance, 0);
      const res = cells.reduce((a, c) => a + c.reserved.cpus, 0), use = cells.reduce((a, c) => a + c.used.cpus, 0);
      const row = h("div", { className: "msb" }, link(`#/msb/${encodeURIComponent(dc)}/${encodeURIComponent(msb)}`, msb),
        bar, h("span", { "data-k": `msb-${dc}-${msb}` }, `${total} machines`),
        h("span", {}, `cores ${num(res)} reserved, ${num(use)} used`),
        h("span", { className: "marks" }, bad ? `${bad} unhealthy ` : "", inMaint ? `${inMaint} in maintenance` : ""));
      box.append(row);
    }
    view.append(box);
  }
  view.append(h("h2", {}, "Free pool"), table(["type", "dc", "machines", "usable"],
    fleet.free_pool.map((p) => h("tr", {}, td(p.type), td(p.dc), td(p.machines, `pool-${p.type}-${p.dc}`), td(p.usable)))));
  view.append(h("h2", {}, "Entitlements"), table(["name", "held / quota", "largest task (cores, MiB)", "on held machines"],
    Object.entries(fleet.entitlements).map(([n, e]) => h("tr", {}, td(link(`#/entitlement/${n}`, n)),
      td(`${e.held} / ${e.quota}`, `held-${n}`), td(`${num(e.largest_task.cpus)}, ${e.largest_task.memory_mb}`),
      td(`${num(e.largest_on_held.cpus)}, ${e.largest_on_held.memory_mb}`)))));
}

async function msbView(view, dc, msb) {
  const q = new URLSearchParams({ dc, msb });
  const body = await api(`/v1/machines?${q}`);
  view.append(h("h1", {}, `${dc} / ${msb}`), h("p", {}, h("b", { "data-k": "msb-machines" }, body.machines.length), " machines"),
    h("div", { className: "machines" }, body.machines.map((m) => h("span", {
      className: `machine${m.healthy ? "" : " unhealthy"}`, style: { background: colour(m.entitlement) },
      title: `${m.id}: ${m.entitlement || "free pool"}, ${m.healthy ? "healthy" : "unhealthy"}, ` +
        `${num(m.alloc.cpus)}/${m.capacity.cpus} cores reserved` }))),
    table(["machine", "entitlement", "profile", "healthy", "tasks", "cores reserved / all"],
      body.machines.map((m) => h("tr", {}, td(m.id), td(m.entitlement || "(free pool)"), td(m.profile.applied || "-"),
        td(m.healthy ? "yes" : `no: ${m.health_reason}`), td(m.alloc.tasks), td(`${num(m.alloc.cpus)} / ${m.capacity.cpus}`)))));
}

// A chart's x axis is the window asked for, whatever the points: uPlot would scale it to them (a
// thousand days around a single point). `usage.since` is the window's start on the server's clock.
const xWindow = (usage) => ({ time: true, range: () => [usage.since, usage.since + WINDOW] });

function chart(where, usage, extra) {
  const pts = usage.points;
  if (!pts.length || typeof uPlot === "undefined") {
    where.append(h("p", { className: "muted", "data-k": "no-points" },
      "No history in this window yet: a point a minute, kept by the shard's leader."));
    return;
  }
  const xs = pts.map((p) => p[0]);
  const series = [{}, { label: "cores used", stroke: "#1565c0", width: 2 },
    { label: "cores used (peak)", stroke: "#90caf9" }, { label: "cores reserved", stroke: "#e65100", dash: [6, 4], points: { show: false } }];
  const data = [xs, pts.map((p) => p[1]), pts.map((p) => p[2]), pts.map(() => usage.reserved.cpus)];
  for (const [label, value, stroke] of extra || []) {
    series.push({ label, stroke, dash: [2, 4], points: { show: false } });
    data.push(pts.map(() => value));
  }
  const box = h("div", { className: "chart" });
  where.append(box);
  box.chart = new uPlot({ width: 760, height: 240, series, // on its box: what a test reads of its scales
    scales: { x: xWindow(usage), y: { range: (u, lo, hi) => [0, Math.max(hi, 0.1) * 1.1] } } }, data, box);
}

function usageBlock(view, usage, extra) {
  const cur = usage.current;
  view.append(h("p", {}, "now: cores used ", h("b", { "data-k": "used-cpus" }, cur ? num(cur.cpus, 3) : "-"),
    " of ", h("b", { "data-k": "reserved-cpus" }, num(usage.reserved.cpus, 3)), " reserved; memory ",
    h("b", { "data-k": "used-memory" }, cur ? cur.memory_mb : "-"), " of ", usage.reserved.memory_mb, " MiB; ",
    cur ? cur.tasks_reporting : 0, " tasks reporting"));
  chart(view, usage, extra);
}

async function entitlementView(view, name) {
  const [ent, usage, fleet] = await Promise.all([api(`/v1/entitlements/${name}`),
    api(`/v1/entitlements/${name}/usage?since=${WINDOW}`), api("/v1/fleet?by=entitlement,type")]);
  const cells = fleet.cells.filter((c) => c.entitlement === name);
  const perMachine = cells.reduce((a, c) => a + c.cpus, 0) / Math.max(1, cells.reduce((a, c) => a + c.machines, 0));
  view.append(h("h1", {}, `Entitlement ${name}`),
    h("p", {}, `type ${ent.machine_type}, profile ${ent.profile || "none"}, quota `, h("b", { "data-k": "quota" }, ent.quota),
      " machines, holds ", h("b", { "data-k": "held" }, ent.held), ", shard ", ent.shard));
  usageBlock(view, usage, perMachine ? [["quota (cores)", ent.quota * perMachine, "#2e7d32"]] : []);
  const jobs = (await api(`/v1/jobs?entitlement=${name}`)).jobs;
  view.append(h("h2", {}, "Jobs"), table(["job", "tasks", "cores a task", "state"], jobs.map((j) =>
    h("tr", {}, td(link(`#/job/${j.handle}`, j.handle)), td(j.count), td(j.task.cpus), td(j.state)))));
  view.append(h("h2", {}, "Machines"), h("p", {}, (ent.machines || []).map((id) => h("span", {}, `${id} `))),
    h("p", { className: "muted" }, "Their profile, health and load: open their MSB in the region view."));
}

async function jobView(view, handle) {
  const [job, usage] = await Promise.all([api(`/v1/jobs/${handle}`),
    api(`/v1/jobs/${handle}/usage?since=${WINDOW}`)]);
  view.append(h("h1", {}, `Job ${handle}`),
    h("p", {}, "tasks ", h("b", { "data-k": "count" }, job.count), `, spec version ${job.spec_version}, ${job.state}: `,
      h("span", { "data-k": "summary" }, Object.entries(job.summary || {}).map(([k, n]) => `${n} ${k}`).join(", ") || "no task"),
      job.message ? ` (${job.message})` : ""));
  usageBlock(view, usage, []);
  if (job.autoscale) autoscaleBlock(view, job, usage, await api(`/v1/jobs/${handle}/autoscale`));
  view.append(h("h2", {}, "Tasks"), table(["task", "machine", "state", "spec version", "discovery"],
    (job.tasks || []).map((t) => h("tr", {}, td(t.index), td(t.machine || "-"), td(t.state), td(t.spec_version),
      td(t.discovery ? "on" : "off")))));
}

// Figure 15 of the paper: the load (in tasks at the policy's target), the job's size and the SRM's
// recommendation over time; the size and recommendation change in steps (history: [t, size, recommended]).
function autoscaleBlock(view, job, usage, a) {
  const p = a.policy;
  view.append(h("h2", {}, "Autoscaling"),
    h("p", {}, "size ", h("b", { "data-k": "autoscale-size" }, a.size), ", recommended ",
      h("b", { "data-k": "autoscale-recommended" }, a.recommended ?? "-"), ` (${p.min} to ${p.max} tasks): `,
      h("span", { "data-k": "autoscale-reason" }, a.reason), a.clamped ? ` (clamped: ${a.clamped})` : ""));
  const perTask = p.target_cpu * job.task.cpus;
  const steps = a.history;
  const at = (t) => { let v = null; for (const s of steps) { if (s[0] <= t) v = s; else break; } return v; };
  const xs = [...new Set([...usage.points.map((q) => q[0]), ...steps.map((s) => s[0]), Math.floor(Date.now() / 1000)])]
    .sort((x, y) => x - y);
  if (xs.length > 1 && typeof uPlot !== "undefined") {
    const load = new Map(usage.points.map((q) => [q[0], q[1] / perTask]));
    const data = [xs, xs.map((t) => (load.has(t) ? load.get(t) : null)), xs.map((t) => at(t)?.[1] ?? null),
      xs.map((t) => at(t)?.[2] ?? null)];
    const series = [{}, { label: "load (tasks at target)", stroke: "#1565c0", width: 2, spanGaps: true },
      { label: "size", stroke: "#e65100", width: 2, paths: uPlot.paths.stepped({ align: 1 }) },
      { label: "recommended", stroke: "#2e7d32", dash: [6, 4], paths: uPlot.paths.stepped({ align: 1 }) }];
    const box = h("div", { className: "chart", "data-k": "autoscale-chart" });
    view.append(box);
    box.chart = new uPlot({ width: 760, height: 240, series,
      scales: { x: xWindow(usage), y: { range: (u, lo, hi) => [0, Math.max(hi, 1) * 1.1] } } }, data, box);
  }
  const when = (t) => new Date(t * 1000).toISOString().replace(".000", "");
  view.append(h("h3", {}, "Resizes"), table(["at", "from", "to", "reason"], a.events.slice().reverse().map((e) =>
    h("tr", { "data-k": "resize" }, td(when(e.at)), td(e.was), td(e.to),
      td(e.reason + (e.stopped ? ` (stopping ${e.stopped.join(", ")})` : ""))))));
}

async function listView(view, what) {
  if (what === "entitlements") {
    const body = await api("/v1/entitlements");
    view.append(h("h1", {}, "Entitlements"), table(["name", "type", "quota", "held", "profile"], body.entitlements.map((e) =>
      h("tr", {}, td(link(`#/entitlement/${e.name}`, e.name)), td(e.machine_type), td(e.quota), td(e.held), td(e.profile || "-")))));
  } else {
    const body = await api("/v1/jobs");
    view.append(h("h1", {}, "Jobs"), table(["job", "tasks", "state"], body.jobs.map((j) =>
      h("tr", {}, td(link(`#/job/${j.handle}`, j.handle)), td(j.count), td(j.state)))));
  }
}

async function eventsView(view) {
  const [events, maint] = await Promise.all([api("/v1/events"), api("/v1/maintenance")]);
  const when = (t) => (t ? new Date(t * 1000).toISOString().replace(".000", "") : "-");
  view.append(h("h1", {}, "Events"), table(["kind", "machines", "start", "end", "reason"], events.events.map((e) =>
    h("tr", {}, td(e.kind), td(e.machines.join(", ")), td(when(e.start)), td(when(e.end)), td(e.reason)))));
  view.append(h("h2", {}, "Maintenance"), table(["id", "scope", "phase", "start", "deadline"], maint.maintenance.map((m) =>
    h("tr", {}, td(m.id), td(m.scope), td(m.phase), td(when(m.start)), td(when(m.deadline))))));
}

async function rebalanceView(view) {
  const st = await api("/v1/rebalance");
  const when = (t) => (t ? new Date(t * 1000).toISOString().replace(/\.\d+Z$/, "Z") : "-");
  const mode = st.continuous.all ? "on for every entitlement"
    : st.continuous.entitlements.length ? `on for ${st.continuous.entitlements.join(", ")}` : "off";
  view.append(h("h1", {}, "Rebalancing"),
    h("p", {}, "continuous mode ", h("b", { "data-k": "rebalance-mode" }, mode), "; ",
      h("b", { "data-k": "rebalance-requested" }, st.requested), " move(s) requested, not begun"));
  view.append(h("h2", {}, "Moving now (make-before-break)"), table(["task", "from", "to", "since", "why"],
    st.moving.map((m) => h("tr", { "data-k": "moving" }, td(link(`#/job/${m.job}`, `${m.job}#${m.index}`)),
      td(m.source), td(m.target), td(when(m.since)), td(m.why)))));
  view.append(h("h2", {}, "Recent moves"), table(["task", "to", "at", "outcome"],
    st.recent.map((r) => h("tr", { "data-k": "moved" }, td(link(`#/job/${r.job}`, `${r.job}#${r.index}`)),
      td(r.target || "-"), td(when(r.at)), td(r.outcome)))));
}

async function rolloutsView(view) {
  // each entitlement's profile rollout: its machines grouped by the profile version they hold
  const ents = await api("/v1/entitlements");
  view.append(h("h1", {}, "Profile rollouts"));
  for (const e of ents.entitlements.filter((e) => e.rollout_state)) {
    const r = await api(`/v1/entitlements/${encodeURIComponent(e.name)}/rollout`);
    const versions = {};
    for (const m of r.machines) (versions[m.holds] = versions[m.holds] || []).push(m);
    view.append(h("h2", { "data-k": "rollout" }, link(`#/entitlement/${e.name}`, e.name), ": ",
      h("b", { "data-k": "rollout-state" }, r.state.replace("_", " ")), ` ${r.from} \u2192 ${r.to}`,
      r.why ? ` (${r.why})` : ""));
    view.append(table(["profile version held", "machines", "phase in the rollout"],
      Object.entries(versions).map(([v, ms]) => h("tr", { "data-k": "rollout-version" }, td(v),
        td(ms.map((m) => m.id).join(", ")), td(ms.map((m) => m.phase || "-").join(", "))))));
  }
}

// Opportunistic capacity (issue #37), per machine type and dc: what guaranteed and opportunistic
// entitlements hold, what is free and the failure-domain buffer, over the week kept (an hour a point,
// /v1/capacity/history) and on into the next 24 hours (/v1/capacity/forecast: expected and offered).
const CAPACITY_WINDOW = 7 * 86400;

async function capacityView(view) {
  // the forecast and the history come from etcd through a process with the scheduler role: without
  // them the reclaims are still shown
  const kept = (p) => api(p).catch((e) => {
    if (e instanceof Refused) throw e;
    return { error: e.message, groups: [], since: Math.floor(Date.now() / 3600000) * 3600 - CAPACITY_WINDOW };
  });
  const [cap, fc, past] = await Promise.all([api("/v1/capacity"), kept("/v1/capacity/forecast"),
    kept(`/v1/capacity/history?since=${CAPACITY_WINDOW}`)]);
  view.append(h("h1", {}, "Capacity"),
    h("p", {}, "reclaims ", h("b", { "data-k": "cap-reclaims" }, cap.paused ? "paused" : "on"), "; ",
      h("b", { "data-k": "cap-open" }, cap.open.length), " open; the SLO offered is the 99 % line less the ",
      "failure-domain buffer"),
    [fc, past].filter((b) => b.error).map((b) => h("p", { className: "muted" }, b.error)));
  const hours = new Map(past.groups.map((g) => [g.group, g.hours]));
  const figures = ["machines", "guaranteed", "opportunistic", "free", "reclaiming", "available", "buffer"];
  const shown = fc.groups.filter((g) => g.now.machines);
  view.append(table(["machine type/dc", ...figures, "offered next hour"], shown.map((g) => h("tr", {}, td(g.group),
    figures.map((k) => td(g.now[k] ?? 0, `cap-${g.group}-${k}`)),
    td(g.hours.length ? g.hours[0].offered ?? "-" : "-", `cap-${g.group}-offered`)))));
  for (const g of fc.groups.filter((g) => g.now.machines || hours.has(g.group))) {
    view.append(h("h2", {}, g.group));
    capacityChart(view, g, hours.get(g.group) || [], past.since);
  }
  const when = (t) => (t ? new Date(t * 1000).toISOString().replace(/\.\d+Z$/, "Z") : "-");
  view.append(h("h2", {}, "Reclaims open"), table(["id", "from", "to", "cause", "machines", "left", "deadline", "phase"],
    cap.open.map((r) => h("tr", { "data-k": "cap-reclaim" }, td(r.id), td(r.entitlement), td(r.heir || "(reserve)"), td(r.cause),
      td(r.machines.length), td(r.left), td(when(r.deadline)), td(r.phase)))));
}

// The past (an hour a point) and the forecast after it, on an x axis from the window's start to the
// forecast's last hour, whatever points there are.
function capacityChart(where, g, hours, since) {
  if (typeof uPlot === "undefined") return;
  const ahead = g.hours, end = ahead.length ? ahead[ahead.length - 1].hour + 3600 : since + CAPACITY_WINDOW;
  const xs = [...hours.map((r) => r.hour), ...ahead.map((r) => r.hour)];
  const col = (k, future) => [...hours.map((r) => r[k]), ...ahead.map(future)];
  const data = [xs, col("guaranteed", () => null), col("opportunistic", () => null), col("free", () => null),
    col("available", (r) => r.expected), col("buffer", (r) => r.buffer), col("offered", (r) => r.offered)];
  const series = [{}, { label: "guaranteed", stroke: "#e65100", width: 2 }, { label: "opportunistic", stroke: "#6a1b9a", width: 2 },
    { label: "free", stroke: "#9e9e9e" }, { label: "available (then expected)", stroke: "#1565c0", width: 2 },
    { label: "buffer", stroke: "#c62828", dash: [6, 4] }, { label: "offered", stroke: "#2e7d32", dash: [2, 4], width: 2 }];
  const box = h("div", { className: "chart", "data-k": `cap-chart-${g.group}` });
  where.append(box);
  box.chart = new uPlot({ width: 760, height: 240, series,
    scales: { x: { time: true, range: () => [since, end] }, y: { range: (u, lo, hi) => [0, Math.max(hi, 1) * 1.1] } } },
  data, box);
}

// -- the page ------------------------------------------------------------------------------------

async function route() {
  const view = $("view");
  view.replaceChildren();
  if (!sessionStorage.getItem(KEY)) {
    $("login").hidden = false;
    $("nav").hidden = true;
    return;
  }
  $("login").hidden = true;
  $("nav").hidden = false;
  const parts = (location.hash.replace(/^#\/?/, "") || "region").split("/").map(decodeURIComponent);
  try {
    if (parts[0] === "entitlement") await entitlementView(view, encodeURIComponent(parts[1]));
    else if (parts[0] === "job") await jobView(view, `${encodeURIComponent(parts[1])}/${encodeURIComponent(parts[2])}`);
    else if (parts[0] === "msb") await msbView(view, parts[1], parts[2]);
    else if (parts[0] === "entitlements" || parts[0] === "jobs") await listView(view, parts[0]);
    else if (parts[0] === "events") await eventsView(view);
    else if (parts[0] === "rebalance") await rebalanceView(view);
    else if (parts[0] === "rollouts") await rolloutsView(view);
    else if (parts[0] === "capacity") await capacityView(view);
    else await regionView(view);
    showError("");
    view.setAttribute("data-ready", parts[0]);
  } catch (e) {
    if (e instanceof Refused) {
      sessionStorage.removeItem(KEY);
      $("login").hidden = false;
      $("nav").hidden = true;
    }
    showError(e.message);
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $("token").value.trim());
    $("token").value = "";
    route();
  });
  $("logout").addEventListener("click", () => { sessionStorage.removeItem(KEY); route(); });
  window.addEventListener("hashchange", route);
  route();
});
