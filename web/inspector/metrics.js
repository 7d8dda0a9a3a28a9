// The worker's metrics: /metrics (Prometheus text, parsed here) as charts, and the health
// figures of /v1/metrics/summary as a table. Both answer to the admin or the metrics key
// only; without one (or on a worker without them) the page says so and carries on.

import { barChart, histogramChart } from "/inspector/charts.js";
import { $, cell, chart, fill, row, say } from "/inspector/dom.js";
import {
  bucketBars, formatSeconds, histogramBuckets, parsePrometheus, quantile, sumBy,
} from "/inspector/logic.js";

export async function loadMetrics(call) {
  $("metrics-charts").hidden = true;
  $("governance").hidden = true;
  let text;
  try {
    text = await call("GET", "/metrics");
  } catch (err) {
    const why = err.status === 401 || err.status === 403
      ? "metrics need the admin or metrics key"
      : err.status === 404 ? "this worker serves no /metrics" : `metrics: ${err.message}`;
    say("metrics-status", why, "info");
    return;
  }
  const samples = parsePrometheus(typeof text === "string" ? text : "");
  const buckets = histogramBuckets(samples, "memstream_retrieval_latency_seconds");
  chart("chart-latency", histogramChart(bucketBars(buckets), quantile(buckets, 0.5),
    quantile(buckets, 0.99), formatSeconds));
  const bars = (obj, cls) => Object.entries(obj).map(([label, value]) => ({
    label: label || "(none)", value, cls: `${cls}-${label}` }));
  chart("chart-ops", barChart(bars(sumBy(samples, "memstream_memory_changes_total", "op"),
    "op"), { title: "changes by op" }));
  chart("chart-triggers", barChart(bars(sumBy(samples, "memstream_jobs_total", "trigger"),
    "trigger"), { title: "jobs by trigger" }));
  say("metrics-status", "from this worker's /metrics (every user of every tenant)");
  $("metrics-charts").hidden = false;
  await loadGovernance(call);
}

const GOVERNANCE = [  // the health figures of SPEC §8, from /v1/metrics/summary
  ["write_volume_per_day", "write volume per day", (x) => x.toFixed(1)],
  ["hit_rate", "hit rate", pct], ["conflict_rate", "conflict rate", pct],
  ["user_deletion_rate", "user deletion rate", pct],
  ["consolidation_per_day", "consolidation merges per day", (x) => x.toFixed(1)],
  ["llm_calls_per_message", "LLM calls per message", (x) => x.toFixed(2)],
];

function pct(x) { return `${(100 * x).toFixed(1)} %`; }

async function loadGovernance(call) {
  let summary;
  try {
    summary = await call("GET", "/v1/metrics/summary");
  } catch {
    $("governance").hidden = true;  // an older worker: the charts above are all there is
    return;
  }
  const g = summary.governance || {};
  const latency = summary.retrieval_latency || {};
  const rows = GOVERNANCE.map(([k, label, format]) => row([cell(label),
    cell(typeof g[k] === "number" ? format(g[k]) : "no data yet")]));
  if (typeof latency.p99_s === "number") {
    rows.push(row([cell("retrieval latency p50 / p99"),
      cell(`${formatSeconds(latency.p50_s)} / ${formatSeconds(latency.p99_s)}`)]));
  }
  fill("governance", rows);
  $("governance").hidden = false;
}
