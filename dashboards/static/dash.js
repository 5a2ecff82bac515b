/* fa4-tune dashboard. Every number shown comes from the /v1 REST API and is aggregated here,
 * so the page and any API client see the same data. No build step: plain script + ECharts. */
"use strict";

// Relative to the page, so the dashboard also works behind a proxy that serves it under a prefix.
const API = new URL("v1", document.baseURI).pathname;
const PAGE = 1000; // the largest page /v1/results serves
// Problem fields offered as filters, with the value preferred when the data has it (a problem's
// default): as GET /v1/problem-fields declares them (the study families of the results store),
// never listed here. Knob filters come from /v1/providers/{name}/knobs instead.
let PROBLEM_FILTERS = [];
let PREFERRED = {};
// Fields that are an axis of a view rather than its filter: the head dims label its rows.
const HEAD_DIMS = ["head_dim", "head_dim_v"];
// The timing modes (eager or CUDA-graph launches, cold or warm L2), as GET /v1/timings declares
// them (fa4/timing.py): never listed here. Filled at start; the default mode comes first.
let TIMINGS = [];
const PALETTE = ["#5470c6", "#ee6666", "#3ba272", "#fc8452", "#9a60b4", "#73c0de", "#fac858", "#ea7ccc"];

const CHARTS = {};
window.fa4dash = { charts: CHARTS, views: {} };

// -- API -----------------------------------------------------------------------------------

const cache = new Map();

function getJSON(url) {
  if (!cache.has(url)) {
    const p = fetch(url, { headers: { Accept: "application/json" } }).then(async (r) => {
      const body = await r.json().catch(() => null);
      if (!r.ok) throw new Error((body && body.error) || `${r.status} ${r.statusText}`);
      return body;
    });
    // A failure is not remembered: the next refresh asks again.
    p.catch(() => cache.delete(url));
    cache.set(url, p);
  }
  return cache.get(url);
}

function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== undefined && v !== null && v !== "") q.set(k, String(v));
  }
  return q.toString();
}

function resultsURL(params, offset = 0) {
  return `${API}/results?${query({ ...params, limit: PAGE, offset })}`;
}

async function allResults(params) {
  const items = [];
  for (let offset = 0; ;) {
    const page = await getJSON(resultsURL(params, offset));
    items.push(...page.items);
    offset += page.items.length;
    if (!page.items.length || offset >= page.total) return items;
  }
}

// -- small helpers -------------------------------------------------------------------------

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c);
  return e;
}

const uniqSorted = (xs) => [...new Set(xs)].sort((a, b) => (a < b ? -1 : a > b ? 1 : 0));
const byNumber = (a, b) => a - b;
function compareTuples(a, b) {
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return a[i] - b[i];
  return 0;
}
// Chart tooltips are HTML: every value from the API goes through esc() (provider and study names,
// configs, device names are free text a writer chose). Everything else is set as text nodes (el()).
const ESCAPES = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const esc = (x) => String(x ?? "").replace(/[&<>"']/g, (c) => ESCAPES[c]);
const fmt = (x, d = 1) => (x === null || x === undefined ? "–" : Number(x).toFixed(d));
const configText = (c) => (c ? Object.entries(c).map(([k, v]) => `${k}=${v}`).join(", ") : "(no knobs)");

function selectControl(name, label, options, value, onChange) {
  const s = el("select", { "data-filter": name });
  for (const o of options) {
    const opt = el("option", { value: o.value, text: o.label });
    if (o.value === value) opt.selected = true;
    s.append(opt);
  }
  s.addEventListener("change", () => onChange(s.value));
  return el("label", {}, `${label} `, s);
}

function chart(id) {
  if (!CHARTS[id]) CHARTS[id] = echarts.init(document.getElementById(id), null, { renderer: "canvas" });
  return CHARTS[id];
}

function draw(id, option) {
  const div = document.getElementById(id);
  div.hidden = false;
  const c = chart(id);
  c.resize();
  c.setOption({ animation: false, ...option }, { notMerge: true });
}

function keepMax(map, key, row) {
  const cur = map.get(key);
  if (!cur || row.tflops > cur.tflops) map.set(key, row);
}

window.addEventListener("resize", () => Object.values(CHARTS).forEach((c) => c.resize()));

// -- the view frame: device selector, filters, raw JSON link, empty state ------------------

class View {
  constructor(id) {
    this.id = id;
    this.el = document.getElementById(id);
    this.controls = this.el.querySelector(".controls");
    this.emptyEl = this.el.querySelector(".empty");
    this.rawEl = this.el.querySelector("a.raw");
    this.devices = [];
    this.device = null;
    this.filters = {};
    this.token = 0;
    window.fa4dash.views[id] = this;
  }

  async refresh() {
    const token = ++this.token;
    this.el.dataset.state = "loading";
    try {
      await this.load(() => token !== this.token);
    } catch (e) {
      if (token === this.token) this.empty("error", `Could not load this view: ${e.message}`, []);
    }
    if (token === this.token) writeHash();
  }

  // What the URL hash keeps of this view, and taking it back.
  state() {
    return { device: this.device, ...this.filters };
  }

  restore(saved) {
    const { device, ...filters } = saved;
    if (this.devices.includes(device)) this.device = device;
    this.filters = filters;
  }

  deviceControl() {
    const opts = this.devices.length ? this.devices.map((d) => ({ value: d, label: d }))
      : [{ value: "", label: "(no device has results)" }];
    return selectControl("device", "device", opts, this.device, (v) => {
      this.device = v;
      this.filters = {};
      this.refresh();
    });
  }

  // Problem-field selects from the values present in `rows`; keeps valid choices, else a preferred one.
  problemControls(rows, fields) {
    const out = [];
    for (const f of fields) {
      // Each field offers the values of the rows the fields before it select (a value head dim
      // of the chosen head dim, say), so no choice of one control empties the view by itself.
      if (this.filters[fields[fields.indexOf(f) - 1]] !== undefined) {
        const prev = fields[fields.indexOf(f) - 1];
        const kept = rows.filter((r) => String(r.problem[prev]) === this.filters[prev]);
        if (kept.length) rows = kept;
      }
      const values = uniqSorted(rows.map((r) => r.problem[f])).map(String);
      if (HEAD_DIMS.includes(f)) values.sort((a, b) => Number(a) - Number(b));
      if (!values.length) {
        delete this.filters[f];
        continue;
      }
      if (!values.includes(this.filters[f])) {
        this.filters[f] = values.includes(PREFERRED[f]) ? PREFERRED[f] : values[0];
      }
      out.push(selectControl(f, f.replace("_", " "), values.map((v) => ({ value: v, label: v })),
        this.filters[f], (v) => { this.filters[f] = v; this.refresh(); }));
    }
    return out;
  }

  // The timing-mode select (the modes of GET /v1/timings); keeps a valid choice, else the default.
  // Every chart of measurements compares rows of one mode only, as lookups do.
  timingControls() {
    if (!TIMINGS.length) {
      delete this.filters.timing;
      return [];
    }
    const def = (TIMINGS.find((t) => t.default) || TIMINGS[0]).name;
    if (!TIMINGS.some((t) => t.name === this.filters.timing)) this.filters.timing = def;
    const control = selectControl("timing", "timing", TIMINGS.map((t) => ({ value: t.name, label: t.name })),
      this.filters.timing, (v) => { this.filters.timing = v; this.refresh(); });
    control.setAttribute("title", TIMINGS.map((t) => `${t.name}: ${t.doc}`).join("\n"));
    return [control];
  }

  // fa4-tune's flags for the chosen timing mode ("" for the default mode).
  timingFlags() {
    const t = TIMINGS.find((m) => m.name === this.filters.timing);
    const def = TIMINGS.find((m) => m.default);
    if (!t || !def || t.default) return "";
    return (t.launch !== def.launch ? ` --launch ${t.launch}` : "") + (t.l2 !== def.l2 ? ` --l2 ${t.l2}` : "");
  }

  // The filters among `fields` that are set (a link may carry others, or stale ones).
  pick(fields) {
    return Object.fromEntries(fields.filter((f) => f in this.filters).map((f) => [f, this.filters[f]]));
  }

  setControls(...nodes) {
    this.controls.replaceChildren(this.deviceControl(), ...nodes);
  }

  raw(url) {
    this.rawEl.href = url;
    this.rawEl.hidden = !url;
  }

  charts() {
    return [...this.el.querySelectorAll(".chart")];
  }

  ready() {
    this.emptyEl.hidden = true;
    this.el.dataset.state = "ready";
  }

  // An empty (or failed) view: says why, and which command fills it.
  empty(state, message, commands) {
    for (const c of this.charts()) c.hidden = true;
    const box = [el("p", { text: message })];
    for (const cmd of commands) box.push(el("pre", {}, el("code", { text: cmd })));
    this.emptyEl.replaceChildren(...box);
    this.emptyEl.hidden = false;
    this.el.dataset.state = state;
  }
}

// -- throughput vs seqlen ---------------------------------------------------------------------

class Throughput extends View {
  async load(stale) {
    if (!this.device) {
      this.setControls();
      this.raw(resultsURL({ status: "ok" }));
      return this.empty("empty", "No measurements yet. Tune a shape to fill this view:",
        ["fa4-tune --seqlen 8192 --hdim 128", "fa4-tune --seqlen 8192 --hdim 128 --provider flash-attn-4"]);
    }
    const timing = this.timingControls();
    // Attention rows only: a decode step's throughput is TB/s, and its shape columns match attention filters.
    const base = { device: this.device, status: "ok", kind: "attention", timing: this.filters.timing };
    const all = await allResults(base);
    if (stale()) return;
    this.setControls(...timing, ...this.problemControls(all, PROBLEM_FILTERS));
    const params = { ...base, ...this.pick(PROBLEM_FILTERS) };
    this.raw(resultsURL(params));
    const rows = all.length ? await allResults(params) : [];
    if (stale()) return;
    const series = throughputSeries(rows);
    if (!series.length) {
      return this.empty("empty", `No successful measurements on ${this.device} for these filters. Fill it with:`,
        [`fa4-tune --seqlen 8192 --hdim ${this.filters.head_dim || 128}` +
          (this.filters.causal === "true" ? " --causal" : "") + (this.filters.pass === "bwd" ? " --pass bwd" : "") +
          this.timingFlags()]);
    }
    draw("chart-throughput", {
      color: PALETTE,
      legend: { top: 0 },
      grid: { left: 60, right: 30, top: 70, bottom: 50 },
      tooltip: {
        trigger: "item",
        formatter: (p) => `${esc(p.seriesName)}<br>seqlen ${esc(p.value[0])}: <b>${fmt(p.value[1])}</b> TFLOP/s` +
          `<br>${esc(configText(p.data.config))}<br>measurement #${esc(p.data.measurement_id)}`,
      },
      xAxis: { type: "log", logBase: 2, name: "seqlen", nameLocation: "middle", nameGap: 28 },
      yAxis: { type: "value", name: "TFLOP/s", scale: true },
      series,
    });
    this.ready();
  }
}

// Per provider: the default config's best TFLOP/s per seqlen (solid), and where other configs
// were measured, the best of any config (dashed, same colour).
function throughputSeries(rows) {
  const providers = new Map();
  for (const r of rows) {
    if (r.tflops === null) continue;
    const s = r.problem.seqlen_q;
    if (!providers.has(r.provider)) providers.set(r.provider, { def: new Map(), all: new Map(), tuned: new Set() });
    const e = providers.get(r.provider);
    keepMax(e.all, s, r);
    if (r.is_default) keepMax(e.def, s, r);
    else e.tuned.add(s);
  }
  const point = (r) => ({ value: [r.problem.seqlen_q, r.tflops], measurement_id: r.id, config: r.config });
  const series = [];
  [...providers.keys()].sort().forEach((name, i) => {
    const e = providers.get(name);
    const color = PALETTE[i % PALETTE.length];
    const common = { type: "line", symbolSize: 7, itemStyle: { color }, provider: name };
    if (e.def.size) {
      series.push({ ...common, name: `${name} default`, kind: "default",
        lineStyle: { color, width: 2 },
        data: [...e.def.keys()].sort(byNumber).map((s) => point(e.def.get(s))) });
    }
    if (e.tuned.size) {
      series.push({ ...common, name: `${name} tuned`, kind: "tuned", symbol: "diamond",
        lineStyle: { color, width: 2, type: "dashed" },
        data: [...e.tuned].sort(byNumber).map((s) => point(e.all.get(s))) });
    }
  });
  return series;
}

// -- tuning gain heatmap ----------------------------------------------------------------------

class Gain extends View {
  async load(stale) {
    const fill = ["fa4-tune --seqlen 8192 --hdim 128 --provider fa4",
      "fa4-tune --seqlen 4096 --hdim 64 --provider flash-attn-4"];
    if (!this.device) {
      this.setControls();
      this.raw(resultsURL({ status: "ok" }));
      return this.empty("empty", "No tuning studies yet. Each fa4-tune run measures the default config " +
        "first, then tuned ones; run for example:", fill);
    }
    const timing = this.timingControls();
    const base = { device: this.device, status: "ok", kind: "attention", timing: this.filters.timing };
    const all = await allResults(base);
    if (stale()) return;
    const fields = PROBLEM_FILTERS.filter((f) => !HEAD_DIMS.includes(f));
    this.setControls(...timing, ...this.problemControls(all.filter((r) => r.study_name), fields));
    const params = { ...base, ...this.pick(fields) };
    this.raw(resultsURL(params));
    const rows = all.length ? await allResults(params) : [];
    // The verdicts of this device and mode: what a lookup serves, with its confidence. A service
    // without the route (older) leaves every cell "not re-measured".
    const verdicts = rows.length ? await getJSON(`${API}/verdicts?${query({ device: this.device,
      timing: this.filters.timing })}`).catch(() => []) : [];
    if (stale()) return;
    const cells = gainCells(rows, verdicts);
    if (!cells.length) {
      return this.empty("empty", `No tuning study on ${this.device} with a measured default config for ` +
        "these filters. Run for example:", fill);
    }
    const seqlens = uniqSorted(cells.map((c) => c.seqlen)).sort(byNumber);
    const ys = uniqSorted(cells.map((c) => `${c.provider} hd${c.head_dim}`));
    const gains = cells.map((c) => c.gain);
    const lo = Math.min(1, ...gains);
    const hi = Math.max(lo + 0.01, ...gains);
    draw("chart-gain", {
      grid: { left: 140, right: 30, top: 20, bottom: 110 },
      tooltip: {
        formatter: (p) => `${esc(p.data.provider)} hd${esc(p.data.head_dim)}, seqlen ${esc(p.data.seqlen)}<br>` +
          `study: tuned ${fmt(p.data.best)} / default ${fmt(p.data.default)} TFLOP/s = ` +
          `${fmt(p.data.study_gain, 3)}x<br>served <b>${fmt(p.value[2], 3)}x</b>: ${esc(p.data.confidence)}` +
          `<br>${esc(p.data.study)}`,
      },
      xAxis: { type: "category", data: seqlens.map(String), name: "seqlen", nameLocation: "middle", nameGap: 28 },
      yAxis: { type: "category", data: ys },
      visualMap: { min: lo, max: hi, calculable: true, orient: "horizontal", left: "center", bottom: 0,
        precision: 3, inRange: { color: ["#f7fbff", "#6baed6", "#08306b"] } },
      series: [{
        type: "heatmap", name: "served / default",
        label: { show: true, lineHeight: 15, formatter: (p) => p.data.label },
        data: cells.map((c) => ({
          value: [seqlens.indexOf(c.seqlen), ys.indexOf(`${c.provider} hd${c.head_dim}`), c.gain],
          provider: c.provider, head_dim: c.head_dim, seqlen: c.seqlen, study: c.study,
          best: c.best, default: c.default, study_gain: c.study_gain, confidence: c.confidence, label: c.label,
          verdict: c.verdict ? { significant: c.verdict.significant, gain: c.verdict.gain,
            spread: c.verdict.spread, rounds: c.verdict.rounds } : null,
        })),
      }],
    });
    this.ready();
  }
}

// A signed percentage of a ratio minus 1 (U+2212 for minus), and a spread as a percentage.
const signedPct = (x) => `${x < 0 ? "\u2212" : "+"}${Math.abs(x * 100).toFixed(1)}%`;
const pct = (x) => `${(Number(x) * 100).toFixed(1)}%`;

// Per study: best / default TFLOP/s, both from that study's own run. A cell (provider, head_dim,
// seqlen) shows its latest study (the one with the newest measurement). Where that study's top
// configs were re-measured against the default (a verdict of GET /v1/verdicts), the cell shows what
// a lookup serves instead: 1 + gain when the challenger won beyond the spread, else 1 (the default
// stays), with the confidence next to it; a study's best alone may be a noise winner.
// A problem's head dims as one label: "192/128" where the value head dim differs.
const hdLabel = (p) => (p.head_dim_v && p.head_dim_v !== p.head_dim ? `${p.head_dim}/${p.head_dim_v}` : `${p.head_dim}`);
const newer = (a, b) => a.created_at > b.created_at || (a.created_at === b.created_at && a.id > b.id);
function gainCells(rows, verdicts = []) {
  const studies = new Map();
  for (const r of rows) {
    if (!r.study_name || r.tflops === null) continue;
    if (!studies.has(r.study_name)) {
      studies.set(r.study_name, { study: r.study_name, provider: r.provider, seqlen: r.problem.seqlen_q,
        head_dim: hdLabel(r.problem), best: null, default: null, last: r });
    }
    const s = studies.get(r.study_name);
    s.best = Math.max(s.best ?? r.tflops, r.tflops);
    if (r.is_default) s.default = Math.max(s.default ?? r.tflops, r.tflops);
    if (newer(r, s.last)) s.last = r;
  }
  // The newest verdict of each study (the API lists the newest one per problem and mode).
  const judged = new Map();
  for (const v of verdicts) {
    if (!v.study_name) continue;
    const key = `${v.provider}|${v.study_name}`;
    const cur = judged.get(key);
    if (!cur || v.created_at > cur.created_at || (v.created_at === cur.created_at && v.id > cur.id)) judged.set(key, v);
  }
  const cells = new Map();
  for (const s of studies.values()) {
    if (s.default === null) continue;
    const key = `${s.provider}|${s.head_dim}|${s.seqlen}`;
    const cur = cells.get(key);
    if (!cur || newer(s.last, cur.last)) cells.set(key, servedCell(s, judged.get(`${s.provider}|${s.study}`)));
  }
  return [...cells.values()];
}

function servedCell(s, v) {
  const studyGain = s.best / s.default;
  if (!v) {
    return { ...s, study_gain: studyGain, gain: studyGain, verdict: null,
      label: `${fmt(studyGain, 3)}x\nnot re-measured`,
      confidence: `study best ${fmt(studyGain, 2)}x; not re-measured against the default` };
  }
  const conf = `${signedPct(v.gain)} \u00b1 ${pct(v.spread)} (${v.rounds} rounds)`;
  if (v.significant) {
    const gain = 1 + v.gain;
    return { ...s, study_gain: studyGain, gain, verdict: v, label: `${fmt(gain, 3)}x\n\u00b1${pct(v.spread)}`,
      confidence: `${conf}: challenger kept` };
  }
  return { ...s, study_gain: studyGain, gain: 1, verdict: v, label: `${fmt(1, 3)}x\ndefault kept`,
    confidence: `study best ${fmt(studyGain, 2)}x; re-measured ${conf}: default kept` };
}

// -- deterministic vs non-deterministic backward ----------------------------------------------

class Determinism extends View {
  async load(stale) {
    const fill = ["fa4-tune --seqlen 8192 --hdim 128 --pass bwd",
      "fa4-tune --seqlen 8192 --hdim 128 --pass bwd --deterministic"];
    const timing = this.timingControls();
    // pass=bwd excludes decode rows already (theirs is the column's default, fwd).
    const base = { device: this.device, status: "ok", pass: "bwd", timing: this.filters.timing };
    const all = this.device ? await allResults(base) : [];
    if (stale()) return;
    if (!all.length) {
      this.setControls(...timing);
      this.raw(resultsURL(base));
      return this.empty("empty", `No backward measurements${this.device ? ` on ${this.device}` : ""} yet. ` +
        "Fill this view with fa4-tune --pass bwd [--deterministic]; the ratio needs both modes:", fill);
    }
    const providers = uniqSorted(all.map((r) => r.provider));
    if (!providers.includes(this.filters.provider)) {
      // A ratio needs both modes: start on the first provider measured in both (SDPA has no
      // deterministic backward, so its bars stand alone).
      const both = providers.find((p) => new Set(all.filter((r) => r.provider === p)
        .map((r) => r.problem.deterministic)).size === 2);
      this.filters.provider = both ?? providers[0];
    }
    const provSelect = selectControl("provider", "provider", providers.map((p) => ({ value: p, label: p })),
      this.filters.provider, (v) => { this.filters.provider = v; this.refresh(); });
    const dtypeControls = this.problemControls(all.filter((r) => r.provider === this.filters.provider), ["dtype"]);
    this.setControls(...timing, provSelect, ...dtypeControls);
    const params = { ...base, provider: this.filters.provider, dtype: this.filters.dtype };
    this.raw(resultsURL(params));
    const rows = await allResults(params);
    if (stale()) return;
    const shapes = detShapes(rows);
    draw("chart-determinism", {
      legend: { top: 0 },
      grid: { left: 60, right: 60, top: 40, bottom: 60 },
      tooltip: { trigger: "axis",
        formatter: (ps) => [esc(ps[0]?.axisValue), ...ps.map((p) => `${p.marker}${esc(p.seriesName)}: ` +
          `<b>${fmt(p.value, p.seriesName === "ratio" ? 3 : 1)}</b>`)].join("<br>") },
      xAxis: { type: "category", data: shapes.map((s) => s.label), axisLabel: { interval: 0, rotate: 20 } },
      yAxis: [
        { type: "value", name: "TFLOP/s" },
        // Always wide enough for the reference band and the goal, on round ticks.
        { type: "value", name: "det / non-det", min: (v) => Math.min(0.8, Math.floor((v.min - 0.02) * 20) / 20),
          max: (v) => Math.max(1.0, Math.ceil((v.max + 0.02) * 20) / 20), splitLine: { show: false } },
      ],
      series: [
        { type: "bar", name: "non-deterministic", data: shapes.map((s) => s.nondet), itemStyle: { color: "#5470c6" } },
        { type: "bar", name: "deterministic", data: shapes.map((s) => s.det), itemStyle: { color: "#91cc75" } },
        {
          type: "line", name: "ratio", yAxisIndex: 1, data: shapes.map((s) => s.ratio), connectNulls: false,
          itemStyle: { color: "#ee6666" }, symbolSize: 8,
          markArea: { silent: true, itemStyle: { color: "rgba(250, 200, 88, 0.25)" },
            label: { position: "insideTopLeft", color: "#8a6d00" },
            data: [[{ yAxis: 0.85, name: "FA4 paper 0.85-0.90" }, { yAxis: 0.9 }]] },
          markLine: { silent: true, symbol: "none", lineStyle: { type: "dashed", color: "#3ba272" },
            label: { formatter: "goal 0.95", position: "insideEndTop" }, data: [{ yAxis: 0.95 }] },
        },
      ],
    });
    this.ready();
  }
}

// Per shape (seqlen, head_dim, causal): best TFLOP/s of each mode and det / non-det.
function detShapes(rows) {
  const shapes = new Map();
  for (const r of rows) {
    if (r.tflops === null) continue;
    const p = r.problem;
    const key = `${hdLabel(p)}|${p.causal}|${p.seqlen_q}`;
    if (!shapes.has(key)) {
      shapes.set(key, { order: [p.head_dim, p.head_dim_v || p.head_dim, p.causal ? 1 : 0, p.seqlen_q],
        label: `S${p.seqlen_q} hd${hdLabel(p)}${p.causal ? " causal" : ""}`, nondet: null, det: null });
    }
    const s = shapes.get(key);
    const mode = p.deterministic ? "det" : "nondet";
    s[mode] = Math.max(s[mode] ?? r.tflops, r.tflops);
  }
  // By head_dim, then non-causal before causal, then seqlen.
  const out = [...shapes.values()].sort((a, b) => compareTuples(a.order, b.order));
  for (const s of out) s.ratio = s.det !== null && s.nondet !== null ? s.det / s.nondet : null;
  return out;
}

// -- one study: trial history, failures, parallel coordinates over the knobs -------------------

class StudyView extends View {
  constructor(id) {
    super(id);
    this.knobsEl = this.el.querySelector("a.knobs-link");
    this.knobFiltersEl = this.el.querySelector(".knob-filters");
    this.summaryEl = this.el.querySelector(".summary");
    this.failedEl = this.el.querySelector(".failures");
    this.knobFilter = {};
  }

  state() {
    const knobs = Object.fromEntries(Object.entries(this.knobFilter).map(([k, v]) => [`knob.${k}`, v]));
    return { ...super.state(), ...knobs };
  }

  restore(saved) {
    const plain = {};
    this.knobFilter = {};
    for (const [k, v] of Object.entries(saved)) {
      if (k.startsWith("knob.")) this.knobFilter[k.slice(5)] = v;
      else plain[k] = v;
    }
    super.restore(plain);
  }

  empty(state, message, commands) {
    super.empty(state, message, commands);
    this.knobFiltersEl.replaceChildren();
    this.summaryEl.textContent = "";
    this.failedEl.hidden = true;
    this.knobsEl.hidden = true;
  }

  async load(stale) {
    const fill = ["fa4-tune --seqlen 8192 --hdim 128"];
    const rows = this.device ? await allResults({ device: this.device }) : [];
    if (stale()) return;
    // Newest study first: the one whose latest measurement is newest.
    const latest = new Map();
    for (const r of rows) {
      if (r.study_name && (!latest.has(r.study_name) || newer(r, latest.get(r.study_name)))) latest.set(r.study_name, r);
    }
    const names = [...latest.keys()].sort((a, b) => (newer(latest.get(a), latest.get(b)) ? -1 : 1));
    if (!names.length) {
      this.setControls();
      this.raw(resultsURL({ device: this.device }));
      return this.empty("empty", `No tuning studies${this.device ? ` on ${this.device}` : ""} yet. Start one with:`,
        fill);
    }
    if (!names.includes(this.filters.study)) {
      this.filters.study = names[0];
      this.knobFilter = {};
    }
    this.setControls(selectControl("study", "study", names.map((n) => ({ value: n, label: n })),
      this.filters.study, (v) => { this.filters.study = v; this.knobFilter = {}; this.refresh(); }));
    const studyURL = `${API}/studies/${encodeURIComponent(this.filters.study)}`;
    this.raw(studyURL);
    const study = await getJSON(studyURL);
    if (stale()) return;
    const knobsURL = `${API}/providers/${encodeURIComponent(study.provider)}/knobs`;
    let knobs = [];
    let knobsNote = "";
    try {
      const doc = await getJSON(knobsURL);
      // A decode study's problem has no pass: its knobs are the provider's "decode" pass.
      const pass = study.problem.kind === "decode" ? "decode" : study.problem.pass;
      knobs = (doc.passes[pass] || { knobs: [] }).knobs;
      this.knobsEl.href = knobsURL;
      this.knobsEl.hidden = false;
    } catch (e) {
      knobsNote = ` (knobs unknown here: ${e.message})`;
      this.knobsEl.hidden = true;
    }
    if (stale()) return;
    this.renderKnobFilters(knobs, study);
    const trials = study.trials.filter((t) => knobs.every((k) =>
      this.knobFilter[k.name] === undefined || String(knobValue(t, k)) === this.knobFilter[k.name]));
    this.summary(study, trials, knobsNote);
    this.history(trials);
    this.parallel(trials, knobs);
    this.failures(trials);
    this.ready();
  }

  renderKnobFilters(knobs, study) {
    const nodes = knobs.map((k) => {
      const values = knobValues(k, study.trials);
      const opts = [{ value: "", label: "any" }, ...values.map((v) => ({ value: v, label: v }))];
      return selectControl(`knob:${k.name}`, k.name, opts, this.knobFilter[k.name] ?? "", (v) => {
        if (v === "") delete this.knobFilter[k.name];
        else this.knobFilter[k.name] = v;
        this.refresh();
      });
    });
    nodes.forEach((n, i) => n.setAttribute("title", knobs[i].doc || ""));
    this.knobFiltersEl.replaceChildren(...nodes);
  }

  summary(study, trials, note) {
    const ok = trials.filter((t) => t.status === "ok" && t.tflops !== null);
    const def = study.trials.find((t) => t.is_default && t.status === "ok");
    const best = study.best;
    this.summaryEl.textContent = `${study.provider} on ${study.device}, timed ${study.timing}, ` +
      `${study.n_trials} trials (${study.n_ok} ok)` +
      (best ? `; best ${fmt(best.tflops)} TFLOP/s (trial ${best.trial_number})` : "") +
      (def ? `; default ${fmt(def.tflops)} TFLOP/s` : "") +
      (trials.length !== study.trials.length ? `; ${trials.length} trials (${ok.length} ok) match the knob filters` : "") +
      note;
  }

  history(trials) {
    const ok = trials.filter((t) => t.status === "ok" && t.tflops !== null)
      .map((t, i) => ({ ...t, x: t.trial_number ?? i })).sort((a, b) => a.x - b.x);
    const bestSoFar = [];
    let best = -Infinity;
    for (const t of ok) {
      best = Math.max(best, t.tflops);
      bestSoFar.push([t.x, best]);
    }
    const point = (t) => ({ value: [t.x, t.tflops], config: t.config, status: t.status });
    draw("chart-history", {
      legend: { top: 0 },
      grid: { left: 60, right: 30, top: 40, bottom: 45 },
      tooltip: { trigger: "item",
        formatter: (p) => `trial ${esc(p.value[0])}: <b>${fmt(p.value[1])}</b> TFLOP/s` +
          (p.data.config ? `<br>${esc(configText(p.data.config))}` : "") },
      xAxis: { type: "value", name: "trial", nameLocation: "middle", nameGap: 28, minInterval: 1 },
      yAxis: { type: "value", name: "TFLOP/s", scale: true },
      series: [
        { type: "scatter", name: "TFLOP/s", data: ok.filter((t) => !t.is_default).map(point), symbolSize: 9 },
        { type: "scatter", name: "default config", data: ok.filter((t) => t.is_default).map(point),
          symbol: "diamond", symbolSize: 13, itemStyle: { color: "#fc8452" } },
        { type: "line", name: "best so far", step: "end", data: bestSoFar, showSymbol: false,
          lineStyle: { color: "#3ba272" }, itemStyle: { color: "#3ba272" } },
      ],
    });
  }

  parallel(trials, knobs) {
    const ok = trials.filter((t) => t.status === "ok" && t.tflops !== null);
    const axes = knobs.map((k, i) => ({ dim: i, name: k.name, type: "category", data: knobValues(k, trials) }));
    axes.push({ dim: knobs.length, name: "TFLOP/s", type: "value", scale: true });
    const tf = ok.map((t) => t.tflops);
    draw("chart-parallel", {
      parallel: { left: 50, right: 90, top: 40, bottom: 30 },
      parallelAxis: axes,
      visualMap: { show: false, dimension: knobs.length, min: Math.min(...tf, 0), max: Math.max(...tf, 1),
        inRange: { color: ["#c6dbef", "#2171b5", "#08306b"] } },
      series: [{ type: "parallel", name: "trials", lineStyle: { width: 2, opacity: 0.7 },
        data: ok.map((t) => ({ value: [...knobs.map((k) => String(knobValue(t, k))), t.tflops],
          trial_number: t.trial_number })) }],
    });
  }

  failures(trials) {
    const bad = trials.filter((t) => t.status !== "ok");
    const body = this.failedEl.querySelector("tbody");
    body.replaceChildren(...bad.map((t) => el("tr", { "data-status": t.status },
      el("td", { text: String(t.trial_number ?? "") }), el("td", { text: t.status }),
      el("td", { text: t.reason || "" }), el("td", { text: configText(t.config) }))));
    if (!bad.length) {
      body.append(el("tr", {}, el("td", { colspan: "4", text: "none: every trial shown ran" })));
    }
    this.failedEl.hidden = false;
  }
}

// A knob missing from a stored config (a knob added after it was measured) took its default.
const knobValue = (t, k) => (t.config && k.name in t.config ? t.config[k.name] : k.default);

// The knob's declared choices, plus any stored value no longer among them.
function knobValues(k, trials) {
  const vals = k.choices.map(String);
  for (const t of trials) {
    const v = String(knobValue(t, k));
    if (!vals.includes(v)) vals.push(v);
  }
  return vals;
}

// -- shareable links: every view's device and filters live in the URL hash ---------------------

const ALL_VIEWS = [];

function readHash() {
  const saved = {};
  for (const [key, value] of new URLSearchParams(location.hash.slice(1))) {
    const dot = key.indexOf(".");
    if (dot < 0) continue;
    const view = key.slice(0, dot);
    (saved[view] = saved[view] || {})[key.slice(dot + 1)] = value;
  }
  return saved;
}

function writeHash() {
  const q = new URLSearchParams();
  for (const v of ALL_VIEWS) {
    for (const [k, value] of Object.entries(v.state())) {
      if (value !== null && value !== undefined && value !== "") q.set(`${v.id}.${k}`, value);
    }
  }
  history.replaceState(null, "", `#${q}`);
}

// -- which kernels the numbers are of ----------------------------------------------------------

// Our kernels' rows carry the source fingerprint they were measured with; /v1/providers names the
// running one. When the newest fa4 rows are of other kernels (a shipped demo after a kernel change),
// the page says so: those numbers may not be what today's kernels do.
async function showProvenance() {
  const line = document.getElementById("provenance");
  if (!line) return;
  const providers = await getJSON(`${API}/providers`).catch(() => []);
  const ours = providers.find((p) => p.name === "fa4");
  const running = ours && ours.source_fingerprint;
  const newest = await getJSON(`${API}/results?${query({ provider: "fa4", limit: 1, sort: "-created_at" })}`)
    .catch(() => null);
  if (!running || !newest || !newest.total) return;
  const current = await getJSON(`${API}/results?${query({ provider: "fa4", limit: 1, source_fingerprint: running })}`)
    .catch(() => null);
  const last = newest.items[0];
  const when = String(last.created_at || "").slice(0, 10);
  const older = newest.total - (current ? current.total : 0);
  line.dataset.state = older ? "stale" : "current";
  line.textContent = older
    ? `${older} of ${newest.total} fa4 measurements are of older kernels than the ones running here ` +
      `(newest measured ${when} with source ${last.source_fingerprint || "unknown"}; running ${running}): ` +
      "their numbers may not be today's. Re-tune to refresh them."
    : `All ${newest.total} fa4 measurements are of the running kernels (source ${running}; newest ${when}).`;
  line.hidden = false;
}

// -- start ------------------------------------------------------------------------------------

async function start() {
  const views = [new Throughput("throughput"), new Gain("gain"), new Determinism("determinism"),
    new StudyView("study")];
  ALL_VIEWS.push(...views);
  const saved = readHash();
  let devices;
  try {
    devices = await getJSON(`${API}/devices`);
  } catch (e) {
    views.forEach((v) => v.empty("error", `Could not reach the API: ${e.message}`, ["fa4-serve --demo"]));
    return;
  }
  // Devices with results first; one name may have several software stacks (one entry each).
  const order = [...devices].sort((a, b) => (b.n_results > 0) - (a.n_results > 0) || a.id - b.id);
  const names = [...new Set(order.map((d) => d.name))];
  // Without the modes (an older service) the views show every row, as before modes existed.
  TIMINGS = await getJSON(`${API}/timings`).catch(() => []);
  const fields = await getJSON(`${API}/problem-fields`).catch(() => []);
  PROBLEM_FILTERS = fields.map((f) => f.name);
  PREFERRED = Object.fromEntries(fields.filter((f) => f.default !== null).map((f) => [f.name, String(f.default)]));
  showProvenance();
  for (const v of views) {
    v.devices = names;
    v.device = names[0] || null;
    if (saved[v.id]) v.restore(saved[v.id]);
    v.refresh();
  }
}

document.addEventListener("DOMContentLoaded", start);
