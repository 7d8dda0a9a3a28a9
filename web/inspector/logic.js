// The inspector's pure functions: no DOM, no network. Parsing the Prometheus text format,
// histogram quantiles, and turning a user's change log (version records) into change
// events, jobs and per-day counts. The browser test calls them directly.

const METRIC_LINE = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?$/;
const LABEL = /([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"/g;

function unescapeLabel(value) {
  return value.replace(/\\(.)/g, (_, c) => (c === "n" ? "\n" : c));
}

function parseValue(raw) {
  if (raw === "+Inf") return Infinity;
  if (raw === "-Inf") return -Infinity;
  return Number(raw);
}

/** Prometheus text exposition -> [{name, labels, value}] (comments and bad lines skipped). */
export function parsePrometheus(text) {
  const samples = [];
  for (const line of String(text).split("\n")) {
    const trimmed = line.trim();
    if (!trimmed || trimmed.startsWith("#")) continue;
    const m = METRIC_LINE.exec(trimmed);
    if (!m) continue;
    const labels = {};
    for (const l of (m[2] || "").matchAll(LABEL)) labels[l[1]] = unescapeLabel(l[2]);
    const value = parseValue(m[3]);
    if (!Number.isNaN(value)) samples.push({ name: m[1], labels, value });
  }
  return samples;
}

/** Sum of a metric's samples by one label: {labelValue: total} (other labels summed over). */
export function sumBy(samples, name, label) {
  const out = {};
  for (const s of samples) {
    if (s.name !== name) continue;
    const key = s.labels[label] ?? "";
    out[key] = (out[key] || 0) + s.value;
  }
  return out;
}

/** A histogram's cumulative buckets [{le, count}] sorted by le, summed over other labels. */
export function histogramBuckets(samples, name) {
  const byLe = new Map();
  for (const s of samples) {
    if (s.name !== `${name}_bucket` || s.labels.le === undefined) continue;
    const le = parseValue(s.labels.le);
    byLe.set(le, (byLe.get(le) || 0) + s.value);
  }
  return [...byLe.entries()].sort((a, b) => a[0] - b[0]).map(([le, count]) => ({ le, count }));
}

/** histogram_quantile as Prometheus computes it: linear inside the bucket; NaN if empty. */
export function quantile(buckets, q) {
  if (!buckets.length) return NaN;
  const total = buckets[buckets.length - 1].count;
  if (!(total > 0)) return NaN;
  const rank = q * total;
  let prevLe = 0;
  let prevCount = 0;
  for (const { le, count } of buckets) {
    if (count >= rank) {
      if (le === Infinity) return prevLe;  // beyond the last finite bound: that bound
      if (count === prevCount) return le;
      return prevLe + (le - prevLe) * ((rank - prevCount) / (count - prevCount));
    }
    prevLe = le;
    prevCount = count;
  }
  return prevLe;
}

/** Cumulative buckets -> per-bucket counts [{label, value}] for a bar chart. */
export function bucketBars(buckets) {
  let prev = 0;
  return buckets.map(({ le, count }) => {
    const bar = { label: le === Infinity ? "+Inf" : `≤${formatSeconds(le)}`, value: count - prev };
    prev = count;
    return bar;
  });
}

export function formatSeconds(s) {
  if (!Number.isFinite(s)) return String(s);
  return s < 1 ? `${+(s * 1000).toPrecision(3)} ms` : `${+s.toPrecision(3)} s`;
}

/**
 * The change events in a page of version records (a ChangePage's ``changes``).
 * A record opened at ``valid_from`` by ``lineage.job_id`` (add for version 1 or after a
 * delete, else update) and, once closed, closed at ``valid_to`` by ``closed_by_job``:
 * deleted -> delete, archived -> archive; superseded is the other half of an update.
 */
export function changeEvents(records) {
  const closedAs = new Map(records.map((r) => [`${r.memory_id}#${r.version}`, r.status]));
  const events = [];
  for (const r of records) {
    const lin = r.lineage || {};
    const before = closedAs.get(`${r.memory_id}#${r.version - 1}`);
    const reopened = before === "deleted" || before === "archived";
    events.push({
      at: r.valid_from, op: r.version === 1 || reopened ? "add" : "update",
      job: lin.job_id || "", kind: lin.kind || "", reason: lin.reason || "",
      trigger: lin.trigger || "",
      memory_id: r.memory_id, version: r.version, content: r.content,
    });
    if (r.valid_to !== null && r.valid_to !== undefined) {
      const op = { deleted: "delete", archived: "archive" }[r.status] || "supersede";
      events.push({
        at: r.valid_to, op, job: lin.closed_by_job || "", kind: "", reason: "",
        memory_id: r.memory_id, version: r.version, content: r.content,
      });
    }
  }
  return events.sort((a, b) => b.at - a.at);
}

/** The op a change-log row stands for: its closing if closed, else its opening. */
export function rowOp(record) {
  const closed = record.valid_to !== null && record.valid_to !== undefined;
  if (closed) return { deleted: "delete", archived: "archive" }[record.status] || "supersede";
  return record.version === 1 ? "add" : "update";
}

export const OPS = ["add", "update", "delete", "archive"];

/** Events per UTC day, stacked by op: [{label: "YYYY-MM-DD", parts: {op: n}}], oldest first.
 * A supersede is the closing half of an update: not counted twice. */
export function perDay(events) {
  const days = new Map();
  for (const e of events) {
    if (e.op === "supersede" || !Number.isFinite(e.at)) continue;
    const day = new Date(e.at * 1000).toISOString().slice(0, 10);
    const parts = days.get(day) || {};
    parts[e.op] = (parts[e.op] || 0) + 1;
    days.set(day, parts);
  }
  return [...days.entries()].sort((a, b) => (a[0] < b[0] ? -1 : 1))
    .map(([label, parts]) => ({ label, parts }));
}

/**
 * Jobs, newest first: the events grouped by job id, with the job's kind (the lineage kind
 * of the versions it opened; for a job that only closed versions, the audit log's kind
 * when given ``audit``: {job_id: {kind, actor}}) and, for extraction, its trigger.
 */
export function jobsOf(events, audit = {}) {
  const jobs = new Map();
  for (const e of events) {
    if (!e.job) continue;
    const job = jobs.get(e.job) || {
      job: e.job, at: e.at, kind: "", actor: "", ops: {}, reasons: [], memories: new Set(),
    };
    job.at = Math.max(job.at, e.at);
    if (e.kind && !job.kind) job.kind = e.kind;
    // what triggered an extraction job (threshold, explicit, session_end, idle)
    if (e.trigger && e.trigger !== "tool" && !job.trigger) job.trigger = e.trigger;
    if (e.op !== "supersede") job.ops[e.op] = (job.ops[e.op] || 0) + 1;
    if (e.reason && !job.reasons.includes(e.reason)) job.reasons.push(e.reason);
    job.memories.add(e.memory_id);
    jobs.set(e.job, job);
  }
  for (const job of jobs.values()) {
    const known = audit[job.job];
    if (known) {
      job.kind = job.kind || known.kind || "";
      job.actor = known.actor || "";
    }
  }
  return [...jobs.values()].sort((a, b) => b.at - a.at);
}

/** {key(item): count} of a list. */
export function countBy(items, key) {
  const out = {};
  for (const item of items) {
    const k = key(item);
    out[k] = (out[k] || 0) + 1;
  }
  return out;
}

/** An epoch-seconds time as "YYYY-MM-DD HH:MM:SS" (UTC); "" for none. */
export function formatTime(t) {
  if (t === null || t === undefined || !Number.isFinite(t)) return "";
  return new Date(t * 1000).toISOString().replace("T", " ").slice(0, 19);
}

/** The audit log's entries as {job_id: {kind, actor}} (the first, i.e. newest, wins). */
export function auditKinds(entries) {
  const out = {};
  for (const e of entries) {
    if (e.job_id && !out[e.job_id]) out[e.job_id] = { kind: e.kind || "", actor: e.actor || "" };
  }
  return out;
}

/** An epoch-seconds time as "YYYY-MM-DD" (UTC); "" for none. */
export function formatDay(t) {
  return formatTime(t).slice(0, 10);
}

const STALE_WORDS = { superseded: "replaced", deleted: "deleted", expired: "expired" };

/**
 * What an item of a context answer says about itself being out of date: "" while what it
 * states is still true (or the API does not say), else e.g.
 * "replaced 2026-02-21 by: Lives in Munich", "deleted 2026-02-21", "expired 2026-03-01".
 * ``stale``, ``valid_to`` and ``superseded_by`` are read when present, ignored when absent.
 */
export function staleNote(item) {
  const stale = item.stale;
  if (!stale) return "";
  const word = STALE_WORDS[stale] || String(stale);
  const when = formatDay(item.valid_to);
  const by = item.superseded_by;
  const what = by && typeof by.content === "string" ? ` by: ${by.content}` : "";
  return `${word}${when ? ` ${when}` : ""}${stale === "superseded" ? what : ""}`;
}

/**
 * A context answer (``POST .../context``) as the rows of the inspector's table, in the
 * answer's order: for each item its kind, date (event time), score, text, whether it is
 * still true, why it is there (a memory's score components, a turn's session and the turn
 * it answered) and the prompt-block line it became (``line``, when the API gives it).
 */
export function contextRows(ctx) {
  const scored = new Map((ctx.memories || []).map((m) => [m.memory_id, m]));
  return (ctx.items || []).map((item) => {
    const memory = item.kind === "memory" ? scored.get(item.id) : undefined;
    const why = [];
    if (memory) {
      why.push(`live memory: recency ${fixed(memory.recency)}, importance `
        + `${fixed(memory.importance_score)}, relevance ${fixed(memory.relevance)}`);
    } else if (item.kind === "memory") {
      why.push("memory");
    }
    if (item.kind === "turn") {
      why.push(`said in session ${item.session_id}`);
      if (item.context && item.context.content) {
        why.push(`after [${item.context.role}] ${item.context.content}`);
      }
    }
    const by = item.superseded_by;
    return {
      kind: item.kind, id: item.id, role: item.role || "",
      label: item.kind === "turn" && item.role ? `turn [${item.role}]` : item.kind,
      at: item.event_time, score: item.score, text: item.content,
      stale: item.stale || "", note: staleNote(item), why: why.join("; "),
      line: typeof item.line === "string" ? item.line : "",
      replacedBy: by && by.memory_id ? by.memory_id : "",
    };
  });
}

function fixed(x) {
  return typeof x === "number" ? x.toFixed(2) : "?";
}
