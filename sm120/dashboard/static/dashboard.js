// The sm120 dashboard: polls /dashboard/api/snapshot and draws it. No inline code (the page's
// Content-Security-Policy forbids it); charts are uPlot, vendored under static/.
"use strict";

const POLL_MS = 2000;
const LIVE_POINTS = 150;
const live = { times: [], series: new Map() };
let throughputChart = null;
const benchCharts = new Map();
let pendingAction = null;

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value !== undefined && value !== null) node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child !== null && child !== undefined) node.append(child);
  }
  return node;
}

function first(...values) {
  for (const value of values) if (value !== undefined && value !== null) return value;
  return null;
}

function number(value, digits = 1, unit = "") {
  return value === null || value === undefined ? "—" : `${Number(value).toFixed(digits)}${unit}`;
}

function field(name, label, value) {
  return [el("dt", {}, label), el("dd", { "data-field": name }, value === null ? "—" : String(value))];
}

function figures(row) {
  const l = row.live || {};
  const m = row.monitor || {};
  const lastBench = (row.bench || []).at(-1) || {};
  const ttft = first(l.ttft_s, lastBench.ttft_s);
  const prefix = first(row.prefix_cache_hit_rate, l.prefix_cache_hit_rate, l.prefix_hit_rate);
  return {
    decode: first(l.decode_tps, m.decode_tps),
    prefill: first(l.prefill_tps, m.prefill_tps),
    ttft: ttft === null ? null : ttft * 1000,
    // The live view is fresh on every poll; the status row may be a few seconds old.
    running: first(l.running, row.requests_running),
    waiting: first(l.waiting, row.requests_waiting),
    kv: first(l.kv_usage_pct, row.kv_cache_usage_pct),
    prefix: prefix === null ? null : prefix * 100,
    acceptance: l.acceptance_rate === null || l.acceptance_rate === undefined ? null : l.acceptance_rate * 100,
  };
}

function state(row) {
  if (!row.running) return "stopped";
  return row.asleep ? "asleep" : "awake";
}

function actionsFor(row) {
  if (row.action) return [el("span", { class: "busy", "data-field": "action" }, `${row.action}…`)];
  let names = ["relaunch"];
  if (row.running) names = ["stop", "relaunch"];
  if (row.running && row.can_sleep) names.unshift(row.asleep ? "wake" : "sleep");
  return names.map((action) => {
    const button = el("button", { type: "button", "data-action": action, class: action === "stop" ? "danger" : "" }, action);
    button.addEventListener("click", () => ask(action, row.name));
    return button;
  });
}

function card(row) {
  const f = figures(row);
  const aliases = (row.aliases || []).join(", ") || null;
  const gpus = (row.gpu_indices || []).join(", ") || null;
  const queue = f.running === null ? null : `${f.running} running, ${f.waiting ?? 0} waiting`;
  return el("article", { class: `card ${state(row)}`, "data-deployment": row.name },
    el("h3", {}, row.name, " ", el("span", { class: "badge", "data-field": "phase" }, row.phase)),
    el("dl", {},
      // A folder the snapshot could not read says why, in place of the figures it lacks.
      ...(row.error ? field("error", "Problem", row.error) : []),
      ...field("recipe", "Recipe", row.recipe),
      ...field("variant", "Variant", first(row.variant)),
      ...field("endpoint", "Endpoint", row.endpoint),
      ...field("model", "Model", row.served_model_name),
      ...field("aliases", "Aliases", aliases),
      ...field("state", "State", state(row)),
      ...field("gpus", "GPUs", gpus),
      ...field("decode", "Decode", number(f.decode, 1, " tok/s")),
      ...field("prefill", "Prefill", number(f.prefill, 1, " tok/s")),
      ...field("ttft", "TTFT", number(f.ttft, 0, " ms")),
      ...field("queue", "Queue", queue),
      ...field("kv", "KV cache", number(f.kv, 1, " %")),
      ...field("prefix", "Prefix hits", number(f.prefix, 1, " %")),
      ...field("acceptance", "Acceptance", number(f.acceptance, 1, " %")),
    ),
    el("div", { class: "actions" }, ...actionsFor(row)),
  );
}

function ask(action, name) {
  pendingAction = { action, name };
  document.getElementById("confirm-text").textContent = `${action} ${name}?`;
  document.getElementById("confirm").showModal();
}

async function act() {
  if (!pendingAction) return;
  const { action, name } = pendingAction;
  pendingAction = null;
  showProblem(null);
  const answer = await fetch("/dashboard/api/actions", {
    method: "POST",
    credentials: "same-origin",
    headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ action, deployment: name }),
  });
  if (!answer.ok) {
    const body = await answer.json().catch(() => ({}));
    showProblem(`${action} ${name}: ${body.error || answer.status}`);
  }
  poll();
}

function showProblem(text) {
  const problem = document.getElementById("problem");
  problem.hidden = !text;
  problem.textContent = text || "";
}

function drawDeployments(rows) {
  document.getElementById("no-deployments").hidden = rows.length > 0;
  document.getElementById("deployments").replaceChildren(...rows.map(card));
}

function drawGpus(gpus) {
  document.getElementById("no-gpus").hidden = gpus.length > 0;
  const body = document.querySelector("#gpus tbody");
  body.replaceChildren(...gpus.map((gpu) => el("tr", { "data-gpu": gpu.index },
    el("td", {}, String(gpu.index)),
    el("td", {}, number(gpu.util_pct, 0, " %")),
    el("td", {}, `${number(gpu.power_w, 0)} / ${number(gpu.power_limit_w, 0, " W")}`),
    el("td", {}, `${number(gpu.memory_used_mib, 0)} / ${number(gpu.memory_total_mib, 0, " MiB")}`),
    el("td", {}, number(gpu.temperature_c, 0, " °C")),
    el("td", {}, (gpu.deployments || []).join(", ")),
  )));
}

function drawTuned(results) {
  document.getElementById("no-tuned").hidden = results.length > 0;
  document.querySelector("#tuned tbody").replaceChildren(...results.map((result) => el("tr", { "data-tuned": result.key },
    el("td", {}, result.key),
    el("td", {}, result.objective),
    el("td", {}, number(result.tuned, 1, ` ${result.unit}`)),
    el("td", {}, number(result.default, 1, ` ${result.unit}`)),
    el("td", {}, result.gain),
    el("td", {}, el("code", {}, result.settings.join(" ") || "the default")),
    el("td", { title: result.host }, result.when),
  )));
}

function drawAlerts(rows) {
  const alerts = rows.flatMap((row) => (row.alerts || []).map((alert) => ({ ...alert, deployment: row.name })));
  alerts.sort((a, b) => String(b.at).localeCompare(String(a.at)));
  document.getElementById("no-alerts").hidden = alerts.length > 0;
  document.getElementById("alerts").replaceChildren(...alerts.slice(0, 10).map((alert) => el("li", { class: alert.kind },
    el("time", {}, alert.at), " ", el("strong", {}, alert.deployment), " ",
    alert.failure_id ? el("span", { class: "badge" }, alert.failure_id) : alert.kind, " ",
    alert.message,
    alert.fix ? el("div", { class: "fix" }, `Fix: ${alert.fix}`) : null,
  )));
}

function chartWidth(node) {
  return Math.max(260, node.clientWidth || 600);
}

function drawThroughput(data) {
  const now = Date.now() / 1000;
  live.times.push(now);
  for (const row of data.deployments) {
    if (!live.series.has(row.name)) live.series.set(row.name, live.times.slice(0, -1).map(() => null));
  }
  for (const [name, values] of live.series) {
    const row = data.deployments.find((r) => r.name === name);
    values.push(row ? figures(row).decode : null);
  }
  if (live.times.length > LIVE_POINTS) {
    live.times.shift();
    for (const values of live.series.values()) values.shift();
  }
  const names = [...live.series.keys()];
  const key = names.join("\n");
  const node = document.getElementById("throughput");
  if (!throughputChart || throughputChart.key !== key) {
    if (throughputChart) throughputChart.destroy();
    const series = [{}, ...names.map((name, i) => ({ label: name, stroke: palette(i), spanGaps: false }))];
    throughputChart = new uPlot({ width: chartWidth(node), height: 200, series, scales: { y: { range: (u, lo, hi) => [0, Math.max(1, hi)] } } }, [live.times, ...live.series.values()], node);
    throughputChart.key = key;
    node.replaceChildren(throughputChart.root);
  } else {
    throughputChart.setData([live.times, ...live.series.values()]);
  }
}

function drawBench(rows) {
  const withRuns = rows.filter((row) => (row.bench || []).length > 0);
  document.getElementById("no-bench").hidden = withRuns.length > 0;
  const holder = document.getElementById("bench");
  for (const row of withRuns) {
    const runs = row.bench;
    const signature = JSON.stringify(runs.map((r) => r.time));
    const known = benchCharts.get(row.name);
    if (known && known.signature === signature) continue;
    if (known) known.chart.destroy();
    const box = el("figure", { "data-bench": row.name }, el("figcaption", {}, `${row.name}: decode tok/s per run`));
    const x = runs.map((_, i) => i + 1);
    const series = [{ label: "run" },
      { label: "measured", stroke: palette(0), points: { show: true } },
      { label: "published", stroke: palette(2), dash: [6, 4] },
      { label: "roofline", stroke: palette(3), dash: [2, 4] }];
    const data = [x, runs.map((r) => r.decode_tok_s), runs.map((r) => r.published_decode_tok_s), runs.map((r) => r.roofline_decode_tok_s)];
    const scales = { x: { time: false }, y: { range: (u, lo, hi) => [0, Math.max(1, hi * 1.1)] } };
    const axes = [{ label: "run", incrs: [1, 2, 5, 10] }, { label: "tok/s" }];
    const chart = new uPlot({ width: chartWidth(holder), height: 220, series, scales, axes }, data, box);
    const old = holder.querySelector(`[data-bench="${CSS.escape(row.name)}"]`);
    if (old) old.replaceWith(box); else holder.append(box);
    benchCharts.set(row.name, { chart, signature });
  }
}

function palette(i) {
  return ["#2b7bb9", "#d1495b", "#3f9e4d", "#8d6cab", "#e08e0b"][i % 5];
}

async function poll() {
  let answer;
  try {
    answer = await fetch("/dashboard/api/snapshot", { credentials: "same-origin", cache: "no-store" });
  } catch (error) {
    showProblem(`cannot reach sm120: ${error.message}`);
    return;
  }
  if (answer.status === 401) {
    window.location.assign("/dashboard");
    return;
  }
  const data = await answer.json();
  showProblem(null);
  document.getElementById("updated").textContent = `updated ${data.updated}`;
  const gateway = data.gateway;
  document.getElementById("gateway").textContent = gateway && gateway.running ? `gateway ${gateway.endpoint}` : "";
  drawDeployments(data.deployments);
  drawGpus(data.gpus);
  drawAlerts(data.deployments);
  drawThroughput(data);
  drawBench(data.deployments);
  drawTuned(data.tuned || []);
  document.body.dataset.ready = "true";
}

document.getElementById("confirm").addEventListener("close", (event) => {
  if (event.target.returnValue === "ok") act(); else pendingAction = null;
});
window.addEventListener("resize", () => {
  const charts = [throughputChart, ...[...benchCharts.values()].map((known) => known.chart)];
  for (const chart of charts.filter(Boolean)) {
    chart.setSize({ width: chartWidth(chart.root.parentNode), height: 200 });
  }
});
poll();
setInterval(poll, POLL_MS);
