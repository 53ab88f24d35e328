// Cached Sampler: shows what caching did on the Cached Sampler nodes after each run.
//
// The node's UI output carries `text` (a plain summary, also sent live over ComfyUI's progress-text
// channel, so the frontend shows it even without this file) and `cached_sampler` (the numbers). This
// extension renders them in a read-only widget that is never saved: it is left out of the API prompt
// (options.serialize = false) and of the workflow's positional widgets_values (serialize = false, and
// onSerialize drops display-only widgets), so saved workflows load the same with or without it.
import { app } from "../../scripts/app.js";

const NODE_TYPES = new Set(["CachedSampler", "CachedSamplerAdvanced"]);
const WIDGET_NAME = "cached_sampler_summary";
// The frontend's own progress-text widget; this extension replaces it with the summary once a run ends.
const PROGRESS_TEXT_WIDGET = "$$node-text-preview";
const COMPUTED = "#43a047";
const SKIPPED = "#fb8c00";
const LINE = 15, STRIP = 18, PAD = 14;  // px: text line, decision strip with margins, padding

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

function decisionStrip(decisions) {
  const strip = el("div", { display: "flex", gap: "1px", height: "10px", margin: "4px 0", width: "100%" });
  for (const [i, d] of [...decisions].entries()) {
    const cell = el("div", { flex: "1 1 0", minWidth: "1px", borderRadius: "1px",
      background: d === "s" ? SKIPPED : COMPUTED });
    cell.title = `evaluation ${i + 1}: ${d === "s" ? "skipped" : "computed"}`;
    strip.appendChild(cell);
  }
  return strip;
}

function renderRun(run, index, total) {
  const box = el("div", { marginTop: "4px" });
  const unit = run.evaluations === run.steps ? "steps" : `evaluations (${run.steps} steps)`;
  const head = el("div", { fontWeight: "600" },
    `${total > 1 ? `run ${index + 1}: ` : ""}${run.computed}/${run.evaluations} ${unit} computed` +
    ` \u00b7 ${pct(run.work_saved)} saved \u00b7 ~${run.speedup.toFixed(2)}x`);
  box.appendChild(head);
  if (run.decisions) box.appendChild(decisionStrip(run.decisions));
  const branches = Object.entries(run.branches || {}).map(([name, [done, seen]]) => `${name} ${done}/${seen}`);
  box.appendChild(el("div", { opacity: "0.8" },
    [...branches, `${run.seconds.toFixed(2)} s`].join(" \u00b7 ")));
  box.appendChild(el("div", { opacity: "0.8" },
    `acted: ${run.acted.length ? run.acted.join(", ") : "none (nothing was skipped)"}`));
  for (const n of run.notes || []) box.appendChild(el("div", { color: "#ffb74d" }, `note: ${n}`));
  return box;
}

function render(element, message) {
  element.replaceChildren();
  element.style.opacity = "1";
  const data = message?.cached_sampler?.[0];
  const text = message?.text?.[0] ?? "";
  // Returns the height the content needs (px), estimated from its lines (wrapping at ~48 characters).
  const lines = (s) => Math.max(1, Math.ceil(String(s).length / 48));
  if (!data) {
    element.appendChild(el("div", { whiteSpace: "pre-wrap" }, text));
    return text.split("\n").reduce((n, l) => n + lines(l), 0) * LINE + PAD;
  }
  if (data.empty) {
    element.appendChild(el("div", { opacity: "0.7" }, text || "No interceptors connected: plain KSampler."));
    return LINE + PAD;
  }
  element.appendChild(el("div", { opacity: "0.8" }, data.methods));
  let height = lines(data.methods) * LINE;
  data.runs.forEach((run, i) => {
    element.appendChild(renderRun(run, i, data.runs.length));
    height += 4 + 3 * LINE + STRIP + lines(`acted: ${run.acted.join(", ")}`) * LINE;
    for (const n of run.notes || []) height += lines(`note: ${n}`) * LINE;
  });
  if (!data.runs.length) {
    element.appendChild(el("div", {}, "(no sampling run)"));
    height += LINE;
  }
  for (const w of data.warnings || []) {
    element.appendChild(el("div", { color: "#ffb74d" }, `warning: ${w}`));
    height += lines(`warning: ${w}`) * LINE;
  }
  return height + PAD;
}

function summaryWidget(node) {
  let widget = node.widgets?.find((w) => w.name === WIDGET_NAME);
  if (widget) return widget;
  const element = el("div", {
    fontSize: "11px", lineHeight: "15px", padding: "4px 6px", boxSizing: "border-box", overflow: "hidden",
    color: "var(--input-text, #ddd)", background: "var(--comfy-input-bg, #222)", borderRadius: "6px",
    userSelect: "text",
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
  widget.show = (message) => {
    value = message?.text?.[0] ?? "";
    height = render(element, message);
  };
  return widget;
}

function removeProgressText(node) {
  const i = node.widgets?.findIndex((w) => w.name === PROGRESS_TEXT_WIDGET) ?? -1;
  if (i < 0) return;
  node.widgets[i].onRemove?.();
  node.widgets.splice(i, 1);
}

app.registerExtension({
  name: "cached_sampler.summary",
  async beforeRegisterNodeDef(nodeType, nodeData) {
    if (!NODE_TYPES.has(nodeData?.name)) return;

    const onExecuted = nodeType.prototype.onExecuted;
    nodeType.prototype.onExecuted = function (message) {
      onExecuted?.apply(this, arguments);
      try {
        if (!message?.text && !message?.cached_sampler) return;
        removeProgressText(this);
        summaryWidget(this).show(message);
        const size = this.computeSize();
        this.setSize([Math.max(this.size[0], size[0]), Math.max(this.size[1], size[1])]);
        this.setDirtyCanvas?.(true, true);
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
