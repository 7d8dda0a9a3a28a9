// Inline SVG charts, drawn with DOM calls (no library, no markup strings): every label is
// set as text, so a hostile label (a memory type, a metric label) stays text.

const SVG = "http://www.w3.org/2000/svg";

function el(name, attrs = {}, text = null) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, String(v));
  if (text !== null) node.textContent = String(text);
  return node;
}

function frame(width, height, title) {
  const svg = el("svg", {
    viewBox: `0 0 ${width} ${height}`, width, height, role: "img", class: "chart",
  });
  svg.append(el("title", {}, title));
  return svg;
}

function empty(title) {
  const svg = frame(360, 40, title);
  svg.append(el("text", { x: 8, y: 24, class: "muted" }, "no data"));
  return svg;
}

/** Horizontal bars: [{label, value}] -> <svg>. ``marks``: [{at: index-fraction, text}]. */
export function barChart(rows, { title = "", unit = "" } = {}) {
  if (!rows.length) return empty(title);
  const rowH = 22;
  const labelW = 150;
  const barW = 240;
  const height = rows.length * rowH + 8;
  const svg = frame(labelW + barW + 70, height, title);
  const max = Math.max(1, ...rows.map((r) => r.value));
  rows.forEach((r, i) => {
    const y = 4 + i * rowH;
    svg.append(el("text", { x: labelW - 6, y: y + 15, "text-anchor": "end", class: "label" },
      r.label));
    const w = Math.max(r.value > 0 ? 2 : 0, (r.value / max) * barW);
    svg.append(el("rect", { x: labelW, y: y + 3, width: w, height: rowH - 6,
      class: `bar ${r.cls || ""}` }));
    svg.append(el("text", { x: labelW + w + 6, y: y + 15, class: "value" },
      `${+r.value.toFixed(3)}${unit}`));
  });
  return svg;
}

/** Vertical stacked columns: rows [{label, parts: {key: n}}], keys in stacking order. */
export function stackedChart(rows, keys, { title = "" } = {}) {
  if (!rows.length) return empty(title);
  const colW = 34;
  const plotH = 150;
  const left = 36;
  const width = Math.max(left + keys.length * 80 + 20, left + rows.length * colW + 20);
  const svg = frame(width, plotH + 70, title);
  const totals = rows.map((r) => keys.reduce((s, k) => s + (r.parts[k] || 0), 0));
  const max = Math.max(1, ...totals);
  svg.append(el("line", { x1: left, y1: 10, x2: left, y2: plotH + 10, class: "axis" }));
  svg.append(el("text", { x: left - 4, y: 16, "text-anchor": "end", class: "value" }, max));
  svg.append(el("text", { x: left - 4, y: plotH + 10, "text-anchor": "end", class: "value" },
    0));
  rows.forEach((r, i) => {
    const x = left + 6 + i * colW;
    let y = plotH + 10;
    for (const k of keys) {
      const n = r.parts[k] || 0;
      if (!n) continue;
      const h = (n / max) * plotH;
      y -= h;
      const rect = el("rect", { x, y, width: colW - 8, height: h, class: `bar op-${k}` });
      rect.append(el("title", {}, `${r.label}: ${n} ${k}`));
      svg.append(rect);
    }
    svg.append(el("text", { x: x + (colW - 8) / 2, y: plotH + 24, "text-anchor": "middle",
      class: "tick" }, r.label.slice(5)));
  });
  keys.forEach((k, i) => {
    const x = left + i * 80;
    svg.append(el("rect", { x, y: plotH + 40, width: 12, height: 12, class: `swatch op-${k}` }));
    svg.append(el("text", { x: x + 16, y: plotH + 51, class: "label" }, k));
  });
  return svg;
}

/** A latency histogram: per-bucket bars plus the p50 / p99 it gives. */
export function histogramChart(bars, p50, p99, format) {
  const svg = barChart(bars, { title: "retrieval latency" });
  const wrap = document.createElement("figure");
  wrap.append(svg);
  const cap = document.createElement("figcaption");
  cap.textContent = Number.isFinite(p50)
    ? `p50 ≈ ${format(p50)} · p99 ≈ ${format(p99)} (bucket-interpolated)`
    : "no retrievals recorded yet";
  cap.className = "quantiles";
  wrap.append(cap);
  return wrap;
}
