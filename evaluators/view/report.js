// rayeval's report page: renders the JSON in #report-data (a run, a sweep or a comparison). No network, no
// libraries: the page works from file://, a static folder on object storage, or a CI artifact.
"use strict";

const DATA = JSON.parse(document.getElementById("report-data").textContent);
const PAGE_SIZE = 50;

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) {
    if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function fmt(value, digits = 4) {
  if (value === null || value === undefined) return "n/a";
  if (typeof value === "number") return value.toFixed(digits);
  return String(value);
}

function count(value) {
  return value === null || value === undefined ? "n/a" : String(value);
}

function section(title, id) {
  const body = el("section", { id });
  body.append(el("h2", { text: title }));
  document.getElementById("main").append(body);
  return body;
}

function table(headers, rows, attrs = {}) {
  const head = el("tr", {}, ...headers.map((h) => el("th", { text: h })));
  return el("table", attrs, el("thead", {}, head), el("tbody", {}, ...rows));
}

// ---------- a run ----------

function renderRun() {
  const facts = section("Run", "facts");
  facts.append(table(["setting", "value"], Object.entries(DATA.facts).map(([k, v]) =>
    el("tr", {}, el("td", { text: k }), el("td", { text: Number.isInteger(v) ? String(v) : fmt(v, 2) })))));
  const results = section("Results", "results-section");
  const rows = [];
  for (const task of DATA.tasks) {
    for (const m of task.metrics) {
      const passk = Object.entries(m.pass_at_k || {}).map(([k, v]) => `${k} ${fmt(v.mean ?? v)}`).join(", ");
      rows.push(el("tr", { "data-task": task.name, "data-metric": m.key },
        el("td", { text: task.name + (task.judge ? ` (judge ${task.judge})` : "") }),
        el("td", { title: m.definition, class: "metric", text: m.key }),
        el("td", { "data-col": "mean", text: fmt(m.mean) }),
        el("td", { "data-col": "sem", text: fmt(m.sem) }),
        el("td", { "data-col": "ci95", text: `[${fmt(m.ci95[0])}, ${fmt(m.ci95[1])}]` }),
        el("td", { "data-col": "n", text: count(m.n) }),
        el("td", { "data-col": "questions", text: count(m.questions) }),
        el("td", { "data-col": "failed", text: count(task.failed) }),
        el("td", { "data-col": "pass_at_k", text: passk || "-" })));
    }
  }
  results.append(table(["task", "metric", "mean", "SEM", "CI95", "N", "questions", "failed", "pass@k"], rows,
    { id: "results" }));
  renderSamples(section("Samples", "samples-section"));
  const config = section("Config", "config");
  config.append(el("pre", { text: DATA.config }));
  const timeline = section("Timeline", "timeline");
  timeline.append(table(["moment", "seconds after start"], Object.entries(DATA.timeline).map(([k, v]) =>
    el("tr", {}, el("td", { text: k }), el("td", { text: fmt(v, 3) })))));
  const engines = section("Engines", "engines");
  const keys = ["name", "node_id", "pid", "start_s", "dtype", "vllm_version", "max_num_seqs"];
  engines.append(table(keys, DATA.engines.map((e) => el("tr", {}, ...keys.map((k) =>
    el("td", { text: fmt(e[k], 2) }))))));
}

function firstScore(record) {
  const values = Object.values(record.scores || {});
  return values.length ? values[0] : null;
}

function sampleDetails(record) {
  const box = el("div", { class: "details" });
  const part = (label, text, cls) => box.append(el("h4", { text: label }), el("pre", { class: cls, text }));
  part("prompt", record.prompt, "prompt");
  part("output", record.output, "output");
  part("target", record.target, "target");
  part("scores", JSON.stringify(record.scores, null, 1), "scores");
  if (record.error) part("failure", record.error, "failure");
  for (const [order, verdict] of Object.entries(record.verdicts || {})) {
    part(`judge verdict (${order})`, verdict, "verdict");
    part(`judge rationale (${order})`, (record.judge_outputs || {})[order] || "", "rationale");
  }
  return box;
}

function sampleRow(task, record) {
  const failed = Boolean(record.error);
  const row = el("div", { class: "sample" + (failed ? " failed" : ""), "data-task": task, "data-doc": record.doc_id,
    "data-index": record.sample_index, "data-failed": failed ? "1" : "0" });
  const summary = el("div", { class: "summary" },
    el("span", { class: "doc", text: `#${record.doc_id}.${record.sample_index}` }),
    el("span", { class: "score", text: failed ? "failed" : fmt(firstScore(record), 3) }),
    el("span", { class: "snippet", text: (record.output || "").slice(0, 140) }));
  summary.addEventListener("click", () => {
    const open = row.querySelector(".details");
    if (open) open.remove(); else row.append(sampleDetails(record));
  });
  row.append(summary);
  return row;
}

function pager(container, items, renderItem, counter) {
  let page = 0;
  const list = el("div", { class: "list" });
  const info = el("span", { class: "page-info" });
  const prev = el("button", { id: "prev-page", text: "previous", onclick: () => { page -= 1; draw(); } });
  const next = el("button", { id: "next-page", text: "next", onclick: () => { page += 1; draw(); } });
  function draw() {
    const pages = Math.max(1, Math.ceil(items.length / PAGE_SIZE));
    page = Math.min(Math.max(page, 0), pages - 1);
    list.replaceChildren(...items.slice(page * PAGE_SIZE, (page + 1) * PAGE_SIZE).map(renderItem));
    info.textContent = `page ${page + 1} of ${pages}`;
    counter.textContent = `${items.length} match`;
    prev.disabled = page === 0;
    next.disabled = page >= pages - 1;
  }
  container.replaceChildren(list, el("div", { class: "pager" }, prev, info, next));
  draw();
}

function renderSamples(body) {
  const tasks = Object.keys(DATA.samples);
  const taskSelect = el("select", { id: "task-select" }, ...tasks.map((t) => el("option", { value: t, text: t })));
  const failedOnly = el("input", { id: "failed-only", type: "checkbox" });
  const minScore = el("input", { id: "min-score", type: "number", step: "any", placeholder: "score ≥" });
  const maxScore = el("input", { id: "max-score", type: "number", step: "any", placeholder: "score ≤" });
  const index = el("input", { id: "sample-index", type: "number", min: "0", placeholder: "sample index" });
  const search = el("input", { id: "search", type: "search", placeholder: "text in prompt, output or target" });
  const sort = el("select", { id: "sort" }, ...[["doc", "question"], ["score-asc", "score, lowest first"],
    ["score-desc", "score, highest first"], ["length", "output length"]].map(([v, t]) =>
    el("option", { value: v, text: t })));
  const counter = el("span", { id: "match-count" });
  const holder = el("div", { id: "samples" });
  body.append(el("div", { class: "filters" }, taskSelect, el("label", {}, failedOnly, " failed only"), minScore,
    maxScore, index, search, sort, counter), holder);
  let timer = null;
  function apply() {
    const task = taskSelect.value;
    const needle = search.value.toLowerCase();
    const low = minScore.value === "" ? null : Number(minScore.value);
    const high = maxScore.value === "" ? null : Number(maxScore.value);
    const wanted = index.value === "" ? null : Number(index.value);
    let items = (DATA.samples[task] || []).filter((r) => {
      if (failedOnly.checked && !r.error) return false;
      if (wanted !== null && r.sample_index !== wanted) return false;
      const score = firstScore(r);
      if (low !== null && (score === null || score < low)) return false;
      if (high !== null && (score === null || score > high)) return false;
      if (needle && !`${r.prompt}\n${r.output}\n${r.target}`.toLowerCase().includes(needle)) return false;
      return true;
    });
    const key = { "score-asc": (r) => firstScore(r) ?? -1, "score-desc": (r) => -(firstScore(r) ?? -1),
      length: (r) => -(r.output || "").length }[sort.value];
    if (key) items = items.slice().sort((x, y) => key(x) - key(y));
    pager(holder, items, (r) => sampleRow(task, r), counter);
  }
  for (const control of [taskSelect, failedOnly, sort, minScore, maxScore, index]) control.addEventListener("change", apply);
  search.addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(apply, 150); });
  apply();
}

// ---------- a sweep ----------

function curveSvg(name, points) {
  const width = 640, height = 240, pad = 40;
  const steps = points.map((p) => p.step);
  const values = points.flatMap((p) => [p.low ?? p.mean, p.high ?? p.mean]).filter((v) => v !== null);
  const x0 = Math.min(...steps), x1 = Math.max(...steps), y0 = Math.min(...values), y1 = Math.max(...values);
  const x = (s) => pad + (x1 === x0 ? 0.5 : (s - x0) / (x1 - x0)) * (width - 2 * pad);
  const y = (v) => height - pad - (y1 === y0 ? 0.5 : (v - y0) / (y1 - y0)) * (height - 2 * pad);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
  svg.setAttribute("class", "curve");
  svg.setAttribute("data-curve", name);
  const shape = (tag, attrs) => {
    const node = document.createElementNS(ns, tag);
    for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
    return node;
  };
  const band = points.map((p) => `${x(p.step)},${y(p.high ?? p.mean)}`)
    .concat(points.slice().reverse().map((p) => `${x(p.step)},${y(p.low ?? p.mean)}`)).join(" ");
  svg.append(shape("polygon", { points: band, class: "band" }));
  svg.append(shape("polyline", { points: points.map((p) => `${x(p.step)},${y(p.mean)}`).join(" "), class: "line" }));
  for (const p of points) {
    const link = shape("a", { href: p.page || "#", class: "point", "data-step": p.step });
    const dot = shape("circle", { cx: x(p.step), cy: y(p.mean), r: 5 });
    const tip = shape("title", {});
    tip.textContent = `step ${p.step}: ${fmt(p.mean)} [${fmt(p.low)}, ${fmt(p.high)}], N=${p.n}`;
    dot.append(tip);
    link.append(dot);
    svg.append(link);
  }
  for (const [value, label] of [[y0, fmt(y0, 3)], [y1, fmt(y1, 3)]]) {
    const text = shape("text", { x: 2, y: y(value) + 4, class: "axis" });
    text.textContent = label;
    svg.append(text);
  }
  return svg;
}

function renderSweep() {
  const curves = section("Curves (mean, CI95 band; a point opens its step)", "curves");
  for (const [name, points] of Object.entries(DATA.curves)) {
    curves.append(el("h3", { text: name }), curveSvg(name, points));
  }
  const steps = section("Steps", "steps");
  const names = Object.keys(DATA.curves);
  const rows = DATA.steps.map((step) => el("tr", { "data-step": step }, el("td", {},
    el("a", { href: (Object.values(DATA.curves)[0].find((p) => p.step === step) || {}).page || "#", text: step })),
    ...names.map((n) => { const p = DATA.curves[n].find((q) => q.step === step); return el("td", { text: p ? fmt(p.mean) : "-" }); })));
  steps.append(table(["step", ...names], rows, { id: "steps-table" }));
}

// ---------- a comparison ----------

function renderCompare() {
  const c = DATA.comparison;
  const body = section(`B - A: ${c.b.run_id} against ${c.a.run_id}`, "comparison");
  body.append(el("p", { text: `${c.se_method}; ${c.multiple_comparisons}` }));
  const rows = c.metrics.map((m) => el("tr", { "data-task": m.task, "data-metric": m.metric },
    el("td", { text: m.task }), el("td", { text: m.metric }), el("td", { "data-col": "mean_a", text: fmt(m.mean_a) }),
    el("td", { "data-col": "mean_b", text: fmt(m.mean_b) }), el("td", { "data-col": "difference", text: fmt(m.difference) }),
    el("td", { "data-col": "sem", text: fmt(m.sem) }), el("td", { text: `[${fmt(m.ci95[0])}, ${fmt(m.ci95[1])}]` }),
    el("td", { text: fmt(m.p_value) }), el("td", { "data-col": "p_adjusted", text: fmt(m.p_adjusted) }),
    el("td", { text: m.beyond_noise ? "yes" : "no" }), el("td", { text: m.better || "-" }),
    el("td", { "data-col": "questions", text: count(m.questions) + (m.questions_in_one_run_only
      ? ` (+${m.questions_in_one_run_only} in one run only)` : "") })));
  body.append(table(["task", "metric", "A", "B", "B - A", "SE", "CI95", "p", "p (Holm)", "beyond noise", "better",
    "questions paired"], rows, { id: "results" }));
  const diff = section("Questions where the two differ", "differing");
  const counter = el("span", { id: "match-count" });
  const holder = el("div", { id: "samples" });
  diff.append(counter, holder);
  pager(holder, DATA.differing, (d) => el("div", { class: "pair", "data-task": d.task, "data-doc": d.doc_id },
    el("h4", { text: `${d.task} #${d.doc_id}` }), el("pre", { class: "prompt", text: d.a.prompt }),
    el("div", { class: "side-by-side" },
      el("div", {}, el("h5", { text: `A (${fmt(firstScore(d.a), 3)})` }), el("pre", { class: "output-a", text: d.a.output })),
      el("div", {}, el("h5", { text: `B (${fmt(firstScore(d.b), 3)})` }), el("pre", { class: "output-b", text: d.b.output })))), counter);
}

document.title = DATA.title;
document.getElementById("title").textContent = DATA.title;
({ run: renderRun, sweep: renderSweep, compare: renderCompare })[DATA.kind]();
document.body.setAttribute("data-ready-ms", String(Math.round(performance.now())));  // interactive after this
document.body.setAttribute("data-ready", "1");
