// The memory inspector: every datum comes from the worker's JSON API, called with the key
// typed into the page (kept in sessionStorage, sent as X-API-Key, never put in a URL).
// Memory text is hostile data: it is only ever set with textContent, never as HTML.

import { barChart, stackedChart } from "/inspector/charts.js";
import { $, button, cell, chart, fill, num, row, say, short } from "/inspector/dom.js";
import {
  OPS, auditKinds, changeEvents, contextRows, countBy, formatTime, jobsOf, perDay, rowOp,
} from "/inspector/logic.js";
import { loadMetrics } from "/inspector/metrics.js";

const STORE = "memstream.inspector.";
const WAIT_S = 10;  // the API waits this long for the pipeline to apply a correction
const POLL_MS = 400;
const POLL_LIMIT_MS = 30000;

const state = { key: "", tenant: "", user: "", memoryId: null, changes: [],
  changesCursor: null, memoriesCursor: null, audit: {}, generation: 0 };

class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

// --- the API ---------------------------------------------------------------------------
async function call(method, path, body) {
  const headers = { "X-API-Key": state.key, Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
    credentials: "omit", cache: "no-store", referrerPolicy: "no-referrer",
  });
  const type = resp.headers.get("Content-Type") || "";
  const data = type.includes("json") ? await resp.json().catch(() => null) : await resp.text();
  if (!resp.ok) {
    const msg = data && data.error ? `${data.error.code}: ${data.error.message}` : resp.statusText;
    throw new ApiError(resp.status, `${resp.status} ${msg}`);
  }
  return data;
}

const seg = (s) => encodeURIComponent(s);
const userPath = (tail = "") =>
  `/v1/tenants/${seg(state.tenant)}/users/${seg(state.user)}${tail}`;

function memoryCell(m) {
  const td = document.createElement("td");
  td.append(button(m.content, guarded(() => openMemory(m.memory_id)), "open-memory link"));
  return td;
}

// --- views -----------------------------------------------------------------------------
async function loadMemories(append = false) {
  const status = $("status-filter").value;
  const cursor = append && state.memoriesCursor ? `&cursor=${seg(state.memoriesCursor)}` : "";
  const page = await call("GET", userPath(`/memories?limit=100&status=${status}${cursor}`));
  state.memoriesCursor = page.next_cursor;
  const rows = page.memories.map((m) => row([
    memoryCell(m), cell(m.type), cell(m.importance), cell(m.status, `status-${m.status}`),
    cell(m.version), cell(formatTime(m.updated_at)), cell(m.access_count),
  ], { memoryId: m.memory_id }));
  if (append) $("memories").querySelector("tbody").append(...rows);
  else fill("memories", rows);
  $("memories-more").hidden = !page.next_cursor;
  if (!append && status === "active") {
    const types = countBy(page.memories, (m) => m.type);
    chart("chart-types", barChart(Object.entries(types).map(([label, value]) => ({
      label, value, cls: `type-${label}` })), { title: "memory types" }));
  }
  return page.memories;
}

async function search(query) {
  const found = await call("POST", userPath("/search"), { query, k: 10, record_hits: false });
  const rows = found.memories.map((m) => row([
    memoryCell(m), cell(m.type), cell(num(m.score), "score"), cell(num(m.recency)),
    cell(num(m.importance_score)), cell(num(m.relevance)), cell(m.version),
    cell(formatTime(m.updated_at)),
  ], { memoryId: m.memory_id }));
  for (const p of found.procedural || []) {
    rows.push(row([memoryCell(p), cell("procedural rule"), cell("", "score"), cell(""),
      cell(""), cell(""), cell(p.version), cell(formatTime(p.updated_at))],
    { memoryId: p.memory_id }));
  }
  fill("results", rows);
  $("results").hidden = rows.length === 0;
  $("results-empty").hidden = rows.length !== 0;
}

// What the agent is handed: the context answer's prompt block, as text, and its items.
function contextRequest() {
  const body = { query: $("context-query").value.trim(), record_hits: false };
  const k = Number.parseInt($("context-k").value, 10);
  const budget = Number.parseInt($("context-budget").value, 10);
  if (k > 0) body.k = k;
  if (budget > 0) body.budget_chars = budget;
  return body;
}

async function showContext() {
  const body = contextRequest();
  if (!body.query) return;
  const ctx = await call("POST", userPath("/context"), body);
  $("prompt-block").textContent = ctx.prompt_block;
  const lines = ctx.prompt_block ? ctx.prompt_block.split("\n").length : 0;
  const rules = (ctx.procedural || []).length;
  $("context-note").textContent = `${lines} line(s), ${ctx.prompt_block.length} characters`
    + `${ctx.truncated ? ", cut by the budget" : ""}; ${ctx.memories.length} memories and `
    + `${rules} rule(s) of how to act; query ${short(ctx.query_id)}`;
  const rows = contextRows(ctx).map((r) => {
    const text = r.kind === "memory"
      ? memoryCell({ memory_id: r.id, content: r.text }) : cell(r.text, "content");
    const still = cell(r.note || (r.kind === "memory" ? "live" : ""),
      r.stale ? `still stale stale-${r.stale}` : "still");
    if (r.replacedBy) {
      still.append(" ", button("open", guarded(() => openMemory(r.replacedBy)), "replaced-by"));
    }
    return row([cell(r.label, "kind"), cell(formatTime(r.at), "date"),
      cell(num(r.score), "score"), text, still, cell(r.why, "why"),
      cell(r.line, "line")], { kind: r.kind, stale: r.stale, id: r.id });
  });
  fill("context-items", rows);
  $("context-items").hidden = rows.length === 0;
  $("context-empty").hidden = rows.length !== 0;
  $("context-result").hidden = false;
}

async function openMemory(memoryId) {
  state.memoryId = memoryId;
  const history = await call("GET", userPath(`/memories/${seg(memoryId)}/history`));
  $("detail-id").textContent = memoryId;
  const live = history.versions.find((v) => v.status === "active");
  $("delete").disabled = !live;
  fill("versions", history.versions.map((v) => {
    const lin = v.lineage;
    const where = lin.session_id ? `${lin.session_id} [${lin.from_seq}, ${lin.to_seq})` : "";
    const actions = document.createElement("td");
    actions.append(button("source", guarded(() => showSource(memoryId, v.version)), "source"));
    if (v.status !== "active") {
      actions.append(button(`roll back to v${v.version}`, () => act(
        `Rolling back to version ${v.version}`,
        () => call("POST", userPath(`/memories/${seg(memoryId)}/rollback`), {
          version: v.version, reason: $("delete-reason").value, wait_s: WAIT_S }),
      ), "rollback"));
    }
    return row([cell(v.version), cell(v.status, `status-${v.status}`), cell(v.content, "content"),
      cell(formatTime(v.valid_from)), cell(formatTime(v.valid_to)), cell(lin.kind, "lineage"),
      cell(short(lin.job_id), "job"), cell(lin.reason), cell(where), actions],
    { version: String(v.version), status: v.status });
  }));
  $("source").hidden = true;
  $("detail").hidden = false;
  $("detail").scrollIntoView({ block: "nearest" });
}

async function showSource(memoryId, version) {
  const src = await call("GET", userPath(`/memories/${seg(memoryId)}/source?version=${version}`));
  $("source-range").textContent =
    `v${src.version}: session ${src.session_id}, messages [${src.from_seq}, ${src.to_seq})`;
  $("source-messages").replaceChildren(...src.messages.map((m) => {
    const li = document.createElement("li");
    const who = document.createElement("strong");
    who.textContent = `${m.role} #${m.seq}: `;
    const what = document.createElement("span");
    what.textContent = m.content;
    li.append(who, what);
    return li;
  }));
  $("source-note").textContent = src.retained ? "every message of the range is still kept"
    : "the session window no longer keeps (all of) these messages; the ids are: "
      + src.message_ids.join(", ");
  $("source").hidden = false;
}

async function loadChanges(append = false) {
  const cursor = append && state.changesCursor ? `&cursor=${seg(state.changesCursor)}` : "";
  const page = await call("GET", userPath(`/changes?limit=200${cursor}`));
  state.changes = append ? state.changes.concat(page.changes) : page.changes;
  state.changesCursor = page.next_cursor;
  $("changes-more").hidden = !page.next_cursor;
  fill("changes", state.changes.map((c) => {
    const op = rowOp(c);
    const opened = op === "add" || op === "update";
    // a closed row stands for its closing: the closing job's kind comes from the audit log,
    // its reason is not in the API (the opening's reason would mislead)
    const job = opened ? c.lineage.job_id : c.lineage.closed_by_job;
    const kind = opened ? c.lineage.kind : (state.audit[job] || {}).kind;
    return row([cell(formatTime(c.valid_to ?? c.valid_from)), cell(op, `op op-${op}`),
      cell(c.content, "content"), cell(c.version), cell(c.status, `status-${c.status}`),
      cell(kind), cell(short(job), "job"), cell(opened ? c.lineage.reason : "")]);
  }));
  drawJobsAndDays();
}

function drawJobsAndDays() {
  const events = changeEvents(state.changes);
  chart("chart-days", stackedChart(perDay(events), OPS, { title: "changes per day" }));
  fill("jobs", jobsOf(events, state.audit).slice(0, 50).map((j) => {
    const undo = document.createElement("td");
    undo.append(button("undo", () => act(`Undoing job ${short(j.job)}`,
      () => call("POST", userPath(`/jobs/${seg(j.job)}/undo`), {
        reason: $("delete-reason").value || "undone from the inspector", wait_s: WAIT_S })),
    "undo"));
    const ops = Object.entries(j.ops).map(([op, n]) => `${n} ${op}`).join(", ");
    const kind = j.kind || "(closing only)";
    const trigger = j.trigger ? `${kind}: ${j.trigger}` : kind;
    return row([cell(formatTime(j.at)), cell(trigger, "trigger"),
      cell(short(j.job), "job"), cell(ops), cell(j.memories.size), cell(j.reasons.join("; ")),
      cell(j.actor), undo], { job: j.job });
  }));
}

async function loadAudit() {
  try {
    const page = await call("GET",
      `/v1/tenants/${seg(state.tenant)}/audit?user=${seg(state.user)}&limit=500`);
    state.audit = auditKinds(page.entries);
  } catch {
    state.audit = {};  // the triggers of closing-only jobs stay unnamed
  }
}

async function refresh() {
  const generation = ++state.generation;
  await loadMemories();
  if (generation !== state.generation) return;
  await loadAudit();
  const reopen = state.memoryId ? openMemory(state.memoryId).catch(() => {
    state.memoryId = null;  // erased by a forget-me
    $("detail").hidden = true;
  }) : null;
  await Promise.all([loadChanges(), loadMetrics(call), reopen]);
  const query = $("query").value.trim();
  if (query) await search(query);
  if (!$("context-result").hidden) await showContext();
}

// --- actions: each a job of the user in the pipeline ------------------------------------
async function applied(jobId) {
  const page = await call("GET", userPath("/changes?limit=200"));
  return page.changes.some((c) => c.lineage.job_id === jobId
    || c.lineage.closed_by_job === jobId);
}

async function act(what, send, check = applied) {
  say("action-status", `${what}: sent; the pipeline applies it as a job of this user…`, "busy");
  try {
    const result = await send();
    if (result.status === "failed") {
      say("action-status", `${what}: failed: ${result.error || "nothing changed"}`, "error");
      return;
    }
    if (result.status === "queued") {
      say("action-status", `${what}: queued (job ${short(result.job_id)}); waiting for the `
        + "pipeline to apply it…", "busy");
      const deadline = Date.now() + POLL_LIMIT_MS;
      while (!(await check(result.job_id))) {
        if (Date.now() > deadline) {
          say("action-status", `${what}: still queued after ${POLL_LIMIT_MS / 1000} s; it `
            + "will be applied when the user's earlier jobs are done. Refresh later.", "error");
          return;
        }
        await new Promise((r) => { setTimeout(r, POLL_MS); });
      }
    }
    say("action-status", `${what}: done (job ${short(result.job_id)}, `
      + `${(result.changes || []).length} change(s)).`, "ok");
    await refresh();
  } catch (err) {
    say("action-status", `${what}: ${err.message}`, "error");
  }
}

// --- wiring ----------------------------------------------------------------------------
function clearData() {
  for (const id of ["results", "memories", "versions", "jobs", "changes", "governance",
    "context-items"]) {
    fill(id, []);
  }
  $("prompt-block").textContent = "";
  $("context-note").textContent = "";
  $("context-result").hidden = true;
  for (const id of ["chart-days", "chart-types", "chart-latency", "chart-ops",
    "chart-triggers", "source-messages"]) $(id).replaceChildren();
  Object.assign(state, { memoryId: null, changes: [], audit: {}, changesCursor: null });
  $("detail").hidden = true;
  $("main").hidden = true;
}

async function connect(event) {
  event.preventDefault();
  clearData();
  Object.assign(state, { key: $("key").value.trim(), tenant: $("tenant").value.trim(),
    user: $("user").value.trim() });
  sessionStorage.setItem(`${STORE}key`, state.key);
  sessionStorage.setItem(`${STORE}tenant`, state.tenant);
  sessionStorage.setItem(`${STORE}user`, state.user);
  say("status", "loading…", "busy");
  try {
    await refresh();
  } catch (err) {
    clearData();
    say("status", `Cannot open ${state.tenant}/${state.user}: ${err.message}`, "error");
    return;
  }
  $("main").hidden = false;
  say("status", `${state.tenant} / ${state.user}`, "ok");
  $("forget-confirm").value = "";
  $("forget").disabled = true;
}

function guarded(fn) {
  return (event) => {
    if (event) event.preventDefault();
    fn().catch((err) => say("action-status", err.message, "error"));
  };
}

function init() {
  for (const name of ["key", "tenant", "user"]) {
    $(name).value = sessionStorage.getItem(`${STORE}${name}`) || "";
  }
  $("connect").addEventListener("submit", connect);
  $("forget-key").addEventListener("click", () => {
    sessionStorage.removeItem(`${STORE}key`);
    $("key").value = "";
    state.key = "";
    clearData();
    say("status", "The key is removed from this tab.");
  });
  $("search-form").addEventListener("submit", guarded(async () => {
    const query = $("query").value.trim();
    if (query) await search(query);
  }));
  $("context-form").addEventListener("submit", guarded(showContext));
  $("status-filter").addEventListener("change", guarded(() => loadMemories()));
  $("memories-more").addEventListener("click", guarded(() => loadMemories(true)));
  $("changes-more").addEventListener("click", guarded(() => loadChanges(true)));
  $("detail-close").addEventListener("click", () => {
    state.memoryId = null;
    $("detail").hidden = true;
  });
  $("delete").addEventListener("click", () => {
    const id = state.memoryId;
    act("Deleting the memory", () => call("DELETE", userPath(`/memories/${seg(id)}`), {
      reason: $("delete-reason").value, wait_s: WAIT_S }));
  });
  $("forget-confirm").addEventListener("input", () => {
    $("forget").disabled = $("forget-confirm").value !== state.user;
  });
  $("forget").addEventListener("click", () => {
    if ($("forget-confirm").value !== state.user) return;
    act(`Forgetting user ${state.user}`, () => call("POST", userPath("/forget"), {
      reason: $("forget-reason").value, wait_s: WAIT_S }), async () => {
      const page = await call("GET", userPath("/memories?limit=1"));
      return page.memories.length === 0;
    });
  });
}

init();
