// Small DOM helpers of the inspector. Text only: every value is set with textContent, so
// memory text (hostile data) can never become markup.

export const $ = (id) => document.getElementById(id);

export function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
  if (cls) td.className = cls;
  return td;
}

export function button(text, onClick, cls = "") {
  const b = document.createElement("button");
  b.type = "button";
  b.textContent = text;
  if (cls) b.className = cls;
  b.addEventListener("click", onClick);
  return b;
}

export function say(id, text, kind = "") {
  const node = $(id);
  node.textContent = text;
  node.dataset.kind = kind;
}

export const short = (id) => (id ? `${id.slice(0, 10)}…` : "");
export const num = (x) => (typeof x === "number" ? x.toFixed(3) : "");

export function fill(tableId, rows) {
  const body = $(tableId).querySelector("tbody");
  body.replaceChildren(...rows);
}

export function row(cells, attrs = {}) {
  const tr = document.createElement("tr");
  tr.append(...cells);
  for (const [k, v] of Object.entries(attrs)) tr.dataset[k] = v;
  return tr;
}

export function chart(id, svg) { $(id).replaceChildren(svg); }
