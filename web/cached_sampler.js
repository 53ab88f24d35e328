// Cached Sampler: shows what caching did on the Cached Sampler nodes after each run.
//
// The node's UI output carries `text` (a plain summary, also sent live over ComfyUI's progress-text
// channel, so the frontend shows it even without this file) and `cached_sampler` (the numbers). This
// extension renders them in a read-only widget that is never saved: it is left out of the API prompt
// (options.serialize = false) and of the workflow's positional widgets_values (serialize = false, and
// onSerialize drops display-only widgets), so saved workflows load the same with or without it.
//
// While a run goes, the server's live progress text (plain English over the progress-text channel, which
// carries only the node id and the text) is shown in the same widget instead of the frontend's own
// progress box, so the node holds one box that grows to fit, never two stacked boxes spilling over the
// node below. Labels follow the frontend's language setting (Comfy.Locale): the English and Chinese
// strings are in STRINGS below (the frontend does not expose its i18n to extensions); the live text's
// fixed phrases are translated line by line, and a line this file does not know is shown as it came.
// Numbers, node and method names stay as they are.
import { app } from "../../scripts/app.js";
import { api } from "../../scripts/api.js";

const NODE_TYPES = new Set(["CachedSampler", "CachedSamplerAdvanced"]);
const WIDGET_NAME = "cached_sampler_summary";
// The frontend's own progress-text widget; this extension shows the text in its own widget instead.
const PROGRESS_TEXT_WIDGET = "$$node-text-preview";
const COMPUTED = "#43a047";
const SKIPPED = "#fb8c00";
const LINE = 15, STRIP = 18, PAD = 14, FONT = "11px sans-serif";  // px: text line, decision strip, padding

// Every label the node shows, by language. {name} is filled in; numbers and names are never translated.
const STRINGS = {
  en: {
    run: "run {n}: ",
    steps: "steps",
    evaluations: "evaluations ({steps} steps)",
    head: "{computed}/{total} {unit} computed \u00b7 {saved} saved \u00b7 ~{speedup}x",
    acted: "acted: {list}",
    actedNone: "none (nothing was skipped)",
    note: "note: {text}",
    warning: "warning: {text}",
    noRun: "(no sampling run)",
    empty: "No interceptors connected: plain KSampler.",
    cell: "evaluation {i}: {state}",
    computed: "computed",
    skipped: "skipped",
    // the live progress text (nodes/summary/report.py sends it in English)
    liveStep: "step {step}/{total}: {done} computed, {skipped} skipped so far ({pct} skipped)",
    liveDecision: "{metric} {value} {rel} threshold {threshold}: {verdict}",
    liveUnchecked: "computed (not checked: first, last, warm-up or outside start/end percent)",
    metrics: {},
  },
  zh: {
    run: "第 {n} 次运行：",
    steps: "步",
    evaluations: "次评估（{steps} 步）",
    head: "已计算 {computed}/{total} {unit} \u00b7 节省 {saved} \u00b7 约 {speedup}x",
    acted: "生效：{list}",
    actedNone: "无（没有跳过任何计算）",
    note: "注意：{text}",
    warning: "警告：{text}",
    noRun: "（没有采样）",
    empty: "未连接拦截器：普通 KSampler。",
    cell: "第 {i} 次评估：{state}",
    computed: "已计算",
    skipped: "已跳过",
    liveStep: "第 {step}/{total} 步：已计算 {done}，已跳过 {skipped}（跳过 {pct}）",
    liveDecision: "{metric} {value} {rel} 阈值 {threshold}：{verdict}",
    liveUnchecked: "已计算（不做判断：首步、末步、预热或在开始/结束百分比之外）",
    metrics: {
      "evaluations since last compute": "距上次计算的评估次数",
      "residual change (relative L1)": "残差变化（相对 L1）",
      "accumulated predicted change": "累计预测变化",
      "accumulated rescaled change": "累计缩放后变化",
      "accumulated error": "累计误差",
      "guidance: steps / predicted change / disagreement": "引导：步数 / 预测变化 / 不一致度",
      "change metric": "变化指标",
    },
  },
};

// The frontend's language setting: the settings store in newer frontends, app.ui.settings in older ones.
function locale() {
  let value;
  try {
    value = app.extensionManager?.setting?.get?.("Comfy.Locale");
  } catch (e) { /* not ready yet */ }
  if (!value) {
    try {
      value = app.ui?.settings?.getSettingValue?.("Comfy.Locale");
    } catch (e) { /* older or newer frontend without it */ }
  }
  return String(value || navigator.language || "en");
}

function strings() {
  return locale().toLowerCase().startsWith("zh") ? STRINGS.zh : STRINGS.en;
}

function fill(template, values) {
  return template.replace(/\{(\w+)\}/g, (m, k) => (k in values ? String(values[k]) : m));
}

// The live progress text's fixed phrases in the UI language. Lines it does not recognise stay as sent.
const LIVE_STEP = /^step (\d+)\/(\d+): (\d+) computed, (\d+) skipped so far \((\d+%) skipped\)$/;
const LIVE_DECISION = /^(.+) (\S+) (<|>=) threshold (\S+): (skipped|computed)$/;
const LIVE_UNCHECKED = "computed (not checked: first, last, warm-up or outside start/end percent)";

function translateProgress(text, t = strings()) {
  if (t === STRINGS.en) return text;
  return String(text).split("\n").map((line) => {
    let m = LIVE_STEP.exec(line);
    if (m) return fill(t.liveStep, { step: m[1], total: m[2], done: m[3], skipped: m[4], pct: m[5] });
    m = LIVE_DECISION.exec(line);
    if (m) {
      return fill(t.liveDecision, { metric: t.metrics[m[1]] ?? m[1], value: m[2], rel: m[3], threshold: m[4],
        verdict: t[m[5]] });
    }
    if (line === LIVE_UNCHECKED) return t.liveUnchecked;
    if (line === "skipped" || line === "computed") return t[line];
    return line;
  }).join("\n");
}

function isDisplayOnly(widget) {
  return !!widget && (widget.name === WIDGET_NAME || widget.name === PROGRESS_TEXT_WIDGET ||
    widget.serialize === false);
}

function el(tag, style, text) {
  const node = document.createElement(tag);
  if (style) Object.assign(node.style, style);
  if (text !== undefined) node.textContent = text;
  return node;
}

function pct(x) {
  return `${Math.round(x * 100)}%`;
}

function decisionStrip(decisions, t) {
  const strip = el("div", { display: "flex", gap: "1px", height: "10px", margin: "4px 0", width: "100%" });
  for (const [i, d] of [...decisions].entries()) {
    const cell = el("div", { flex: "1 1 0", minWidth: "1px", borderRadius: "1px",
      background: d === "s" ? SKIPPED : COMPUTED });
    cell.dataset.decision = d === "s" ? "skipped" : "computed";
    cell.title = fill(t.cell, { i: i + 1, state: d === "s" ? t.skipped : t.computed });
    strip.appendChild(cell);
  }
  return strip;
}

// Wrapped text lines: each item is a string and whether it may wrap anywhere.
const TEXT = { whiteSpace: "pre-wrap", overflowWrap: "anywhere", wordBreak: "break-word" };

function runParts(run, index, total, t) {
  const unit = run.evaluations === run.steps ? t.steps : fill(t.evaluations, { steps: run.steps });
  const head = (total > 1 ? fill(t.run, { n: index + 1 }) : "") + fill(t.head, {
    computed: run.computed, total: run.evaluations, unit, saved: pct(run.work_saved),
    speedup: run.speedup.toFixed(2) });
  const branches = Object.entries(run.branches || {}).map(([name, [done, seen]]) => `${name} ${done}/${seen}`);
  return {
    head,
    counts: [...branches, `${run.seconds.toFixed(2)} s`].join(" \u00b7 "),
    acted: fill(t.acted, { list: run.acted.length ? run.acted.join(", ") : t.actedNone }),
    notes: (run.notes || []).map((n) => fill(t.note, { text: n })),
  };
}

let measurer;
// How many lines `text` takes in `width` px (the summary's font), with a margin for word wrapping.
function wrappedLines(text, width) {
  measurer ??= document.createElement("canvas").getContext("2d");
  measurer.font = FONT;
  return String(text).split("\n").reduce((n, line) => {
    const w = measurer.measureText(line).width * 1.08;
    return n + Math.max(1, Math.ceil(w / Math.max(width, 40)));
  }, 0);
}

// Fills the element and returns the height its content needs (px) at the given content width.
function render(element, message, width) {
  const t = strings();
  element.replaceChildren();
  element.style.opacity = "1";
  element.dataset.state = "summary";
  element.lang = t === STRINGS.zh ? "zh" : "en";
  const data = message?.cached_sampler?.[0];
  const text = message?.text?.[0] ?? "";
  const lines = (s) => wrappedLines(s, width);
  const add = (parent, style, s) => parent.appendChild(el("div", { ...TEXT, ...style }, s));
  if (!data) {
    add(element, {}, text);
    return lines(text) * LINE + PAD;
  }
  if (data.empty) {
    add(element, { opacity: "0.7" }, t.empty);
    return lines(t.empty) * LINE + PAD;
  }
  add(element, { opacity: "0.8" }, data.methods);
  let height = lines(data.methods) * LINE;
  data.runs.forEach((run, i) => {
    const parts = runParts(run, i, data.runs.length, t);
    const box = el("div", { marginTop: "4px" });
    add(box, { fontWeight: "600" }, parts.head);
    if (run.decisions) box.appendChild(decisionStrip(run.decisions, t));
    add(box, { opacity: "0.8" }, parts.counts);
    add(box, { opacity: "0.8" }, parts.acted);
    for (const n of parts.notes) add(box, { color: "#ffb74d" }, n);
    element.appendChild(box);
    height += 4 + (run.decisions ? STRIP : 0) +
      [parts.head, parts.counts, parts.acted, ...parts.notes].reduce((h, s) => h + lines(s) * LINE, 0);
  });
  if (!data.runs.length) {
    add(element, {}, t.noRun);
    height += LINE;
  }
  for (const w of data.warnings || []) {
    const s = fill(t.warning, { text: w });
    add(element, { color: "#ffb74d" }, s);
    height += lines(s) * LINE;
  }
  return height + PAD;
}

function renderLive(element, text, width) {
  const shown = translateProgress(text);
  element.replaceChildren();
  element.style.opacity = "1";
  element.dataset.state = "live";
  element.appendChild(el("div", TEXT, shown));
  return wrappedLines(shown, width) * LINE + PAD;
}

// The widget's content width: the node's width less LiteGraph's widget margins and the padding.
function contentWidth(node) {
  return (node.size?.[0] ?? 300) - 2 * 15 - 12;
}

function summaryWidget(node) {
  let widget = node.widgets?.find((w) => w.name === WIDGET_NAME);
  if (widget) return widget;
  const element = el("div", {
    fontSize: "11px", lineHeight: "15px", padding: "4px 6px", boxSizing: "border-box", overflow: "hidden",
    fontFamily: "sans-serif", color: "var(--input-text, #ddd)", background: "var(--comfy-input-bg, #222)",
    borderRadius: "6px", userSelect: "text",
  });
  element.className = "cached-sampler-summary";
  element.dataset.cachedSamplerSummary = "";
  let value = "";
  let height = 3 * LINE + PAD;
  widget = node.addDOMWidget(WIDGET_NAME, "cached_sampler_summary", element, {
    serialize: false,
    hideOnZoom: false,
    getValue: () => value,
    setValue: (v) => { value = typeof v === "string" ? v : ""; },
    getMinHeight: () => height,
    getMaxHeight: () => height + 24,
  });
  widget.serialize = false;
  widget.serializeValue = () => undefined;
  // The frontend sizes a DOM widget's box from widget.width when one is set, else from the node's width.
  // Drawing the widget elsewhere (the properties side panel, a selection) sets widget.width to that place's
  // width and leaves it there, so the box in the node took another width (down to its text's) and kept it:
  // the summary always takes the node's width.
  Object.defineProperty(widget, "width", { configurable: true, get: () => undefined, set: () => {} });
  // Grows the node to hold the widget, then checks what the browser laid out: if the text still needs
  // more room than estimated (another font, a narrower box), the widget and the node grow to it.
  const fit = () => {
    const size = node.computeSize();
    node.setSize([Math.max(node.size[0], size[0]), Math.max(node.size[1], size[1])]);
    node.setDirtyCanvas?.(true, true);
    requestAnimationFrame(() => {
      const extra = element.scrollHeight - element.clientHeight;
      if (element.isConnected && element.clientHeight > 0 && extra > 1) {
        height += extra;
        const grown = node.computeSize();
        node.setSize([Math.max(node.size[0], grown[0]), Math.max(node.size[1], grown[1])]);
        node.setDirtyCanvas?.(true, true);
      }
    });
  };
  widget.show = (message) => {
    value = message?.text?.[0] ?? "";
    height = render(element, message, contentWidth(node));
    fit();
  };
  widget.live = (text) => {
    height = Math.max(height, renderLive(element, text, contentWidth(node)));
    fit();
  };
  return widget;
}

function removeProgressText(node) {
  const i = node.widgets?.findIndex((w) => w.name === PROGRESS_TEXT_WIDGET) ?? -1;
  if (i < 0) return;
  node.widgets[i].onRemove?.();
  node.widgets.splice(i, 1);
}

function samplerNode(nodeId) {
  // An execution id inside a subgraph reads "outer:inner"; the node on the canvas is the last one.
  const id = String(nodeId).split(":").pop();
  for (const graph of [app.canvas?.graph, app.graph]) {
    const node = graph?.getNodeById?.(Number(id)) ?? graph?.getNodeById?.(id);
    if (node && NODE_TYPES.has(node.comfyClass ?? node.type)) return node;
  }
  return null;
}

// The live text goes into the summary widget, and the frontend's own progress box (which its handler for
// the same event adds or updates) is taken off again: a microtask runs after every listener of this
// event, whatever their order, and before the canvas draws.
function onProgressText(event) {
  const { nodeId, text } = event.detail ?? {};
  if (!nodeId || !text) return;
  const node = samplerNode(nodeId);
  if (!node) return;
  queueMicrotask(() => {
    try {
      removeProgressText(node);
      // The summary of a run just ended is sent too: the node's UI output shows it in full right after.
      if (String(text).split("\n").some((l) => LIVE_STEP.test(l))) summaryWidget(node).live(text);
    } catch (e) {
      console.warn("Cached Sampler: could not show the progress text", e);
    }
  });
}

app.registerExtension({
  name: "cached_sampler.summary",
  setup() {
    api.addEventListener("progress_text", onProgressText);
  },
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODE_TYPES.has(nodeData?.name)) return;

    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      try {
        if (!message?.text && !message?.cached_sampler) return;
        removeProgressText(this);
        summaryWidget(this).show(message);
      } catch (e) {
        console.warn("Cached Sampler: could not show the run summary", e);
      }
    };

    const onExecutionStart = nodeType.prototype.onExecutionStart;
    nodeType.prototype.onExecutionStart = function () {
      onExecutionStart?.apply(this, arguments);
      const widget = this.widgets?.find((w) => w.name === WIDGET_NAME);
      if (widget?.element) widget.element.style.opacity = "0.45";  // the previous run's numbers
    };

    // widgets_values are positional: keep display-only widgets out of saved workflows.
    const onSerialize = nodeType.prototype.onSerialize;
    nodeType.prototype.onSerialize = function (o) {
      onSerialize?.apply(this, arguments);
      if (!Array.isArray(o?.widgets_values) || !this.widgets) return;
      const values = [];
      for (const [i, w] of this.widgets.entries()) {
        if (!isDisplayOnly(w) && i in o.widgets_values) values.push(o.widgets_values[i]);
      }
      o.widgets_values = values;
    };
  },
});
