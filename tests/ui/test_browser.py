"""The pack in a real ComfyUI server and a real browser (headless Chromium driven by playwright-core).

Starts ``main.py`` with the pack in a temporary custom_nodes folder, loads every example workflow from
the server's template endpoint the way the template browser does (no missing node types, the same widget
values read back), queues the tiny-model one, and checks that the Cached Sampler node shows the run
summary and its decision strip, that the tuning plot reached its Preview Image node, that progress text
arrived while it ran, that the summary is not saved in the workflow and that nothing of the pack logged an
error. It queues the sampler a second time and measures the node during and after that run (the live text in
the summary box, no second progress box, nothing below the node's bottom or over the node below, no text cut),
in English and with the frontend's language set to Chinese. It opens every node's documentation the way a user
does (1.35: the node library's help button; 1.49: the selection toolbox's Info button) and finds the pack's own
page, and opens every template with no missing-node card and every model file it names listed with its download
address (no "Unknown"). After the runs, a click selecting the sampler and the properties side panel (where the
frontend has one) leave the summary box as wide as it was. The same checks hold with the older (1.35) and the
newer (1.49) frontend; every test runs with the frontend the ComfyUI's Python has installed and again with the
newest frontend package (NEWEST_FRONTEND, served with --front-end-root). Everything it starts is stopped, and
bounded in time.
Installs nothing: ``bash tools/setup.sh --browser`` provides Chromium and playwright-core (in ``.browser/``) and
the newest frontend (in ``.frontend/``).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

from cached_sampler_dev.devkit.comfy_harness import PACK_DIR_NAME, find_comfyui  # noqa: E402

pytestmark = pytest.mark.slow

CHROMIUM = os.environ.get("CHROMIUM_PATH", "/usr/bin/chromium")
PLAYWRIGHT = ROOT / ".browser" / "node_modules"
WORKFLOW = "tiny_digits_tuning_plot"
EXAMPLES = sorted(p.stem for p in (ROOT / "example_workflows").glob("*.json"))
MODEL_FILES = (".safetensors", ".ckpt", ".pt", ".pth", ".bin", ".sft", ".gguf")
ARTIFACTS = ROOT / "artifacts"
SERVER_START_S, BROWSER_S = 180, 240
# The newest frontend package that installs, run besides the one the ComfyUI under test has installed:
# `bash tools/setup.sh --browser` extracts its wheel into the git-ignored .frontend/, and the server is started
# with --front-end-root pointing at it.
NEWEST_FRONTEND = "1.58.1"
NEWEST_FRONTEND_ROOT = (ROOT / ".frontend" / f"comfyui_frontend_package-{NEWEST_FRONTEND}" / "comfyui_frontend_package"
                        / "static")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def skip_loudly(reason: str):
    message = f"BROWSER TEST SKIPPED: {reason} (run `bash tools/setup.sh --browser`)"
    warnings.warn(message)
    print(f"\n!!! {message} !!!", file=sys.stderr)
    pytest.skip(message)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop(process: subprocess.Popen, grace: float = 10.0) -> None:
    """Stop a process group this test started: SIGTERM, then SIGKILL after ``grace`` seconds."""
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace)
    except (subprocess.TimeoutExpired, ProcessLookupError):
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait(timeout=grace)


DRIVER = r"""
import { createRequire } from "module";
const [modules, url, profile, shot, workflowName, module] = process.argv.slice(2);
const { chromium } = createRequire(modules + "/")("playwright-core");
const FLAGS = JSON.parse(process.env.BROWSER_FLAGS);
const result = { console: [] };
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM, headless: true, args: FLAGS, viewport: { width: 1600, height: 1000 },
});
try {
  const page = context.pages()[0] ?? await context.newPage();
  // Where a message came from (the script's address) and an error's stack, so the pack's are told apart.
  page.on("console", (m) => {
    if (m.type() === "error" || m.type() === "warning") result.console.push(`${m.text()} @ ${m.location()?.url ?? ""}`);
  });
  page.on("pageerror", (e) => result.console.push("pageerror: " + (e.stack || e.message)));
  result.failed = [];  // the console names no address for a failed request: keep them to check the pack's
  page.on("response", (r) => { if (r.status() >= 400) result.failed.push(`${r.status()} ${r.url()}`); });
  result.views = [];  // images the page fetched from the server's /view
  page.on("response", (r) => { if (r.url().includes("/view?")) result.views.push(`${r.status()} ${r.url()}`); });
  const full = process.env.MODE !== "without-extension";
  const zh = process.env.MODE === "zh";
  if (!full) await context.route("**/extensions/" + module + "/**", (route) => route.abort());
  await page.goto(url, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(() => window.comfyAPI?.app?.app?.graph && window.LiteGraph, null, { timeout: 90000 });
  await page.waitForTimeout(1500);
  if (zh) {  // the user's language setting, as the settings dialog sets it
    await page.evaluate(async () => {
      const app = window.comfyAPI.app.app;
      if (app.extensionManager?.setting?.set) await app.extensionManager.setting.set("Comfy.Locale", "zh");
      else await app.ui.settings.setSettingValueAsync("Comfy.Locale", "zh");
    });
    await page.waitForTimeout(1000);
  }
  result.extensions = await page.evaluate(() =>
    window.comfyAPI.app.app.extensions.map((e) => e.name).filter((n) => n.startsWith("cached_sampler")));
  // Every example loads with no missing node types, and the frontend reads back the same widget values.
  result.examples = {};
  for (const name of full && !zh ? JSON.parse(process.env.EXAMPLES) : []) {
    const before = result.console.length;
    result.examples[name] = await page.evaluate(async ([name, module]) => {
      const app = window.comfyAPI.app.app, api = window.comfyAPI.api.api;
      const wf = await (await api.fetchApi(`/workflow_templates/${module}/${name}.json`)).json();
      await app.loadGraphData(wf, true, true, name, { openSource: "template" });
      const saved = app.graph.serialize();
      // A node without widgets: [] in the file; newer frontends save no widgets_values for it at all.
      const values = (node) => JSON.stringify(node?.widgets_values ?? []);
      const changed = wf.nodes.filter((n) => {
        const now = saved.nodes.find((m) => m.id === n.id);
        return !now || values(now) !== values(n);
      }).map((n) => `${n.type}: ${JSON.stringify(n.widgets_values)} -> ` +
        JSON.stringify(saved.nodes.find((m) => m.id === n.id)?.widgets_values));
      return {
        missing: app.graph.nodes.filter((n) => !window.LiteGraph.registered_node_types[n.type]).map((n) => n.type),
        nodes: app.graph.nodes.length, expected: wf.nodes.length, links: saved.links.length,
        expectedLinks: wf.links.length, changed,
      };
    }, [name, module]);
    result.examples[name].console = result.console.slice(before);
    const clip = await page.evaluate(async () => {  // fit the whole graph below the toolbars, then clip to it
      const app = window.comfyAPI.app.app, rect = app.canvas.canvas.getBoundingClientRect();
      const title = window.LiteGraph.NODE_TITLE_HEIGHT, ds = app.canvas.ds;
      const gx = app.graph.nodes.flatMap((n) => [n.pos[0], n.pos[0] + n.size[0]]);
      const gy = app.graph.nodes.flatMap((n) => [n.pos[1] - title, n.pos[1] + n.size[1]]);
      const [left, top] = [Math.min(...gx), Math.min(...gy)];
      const [w, h] = [Math.max(...gx) - left, Math.max(...gy) - top];
      const [areaX, areaY] = [70 - rect.left, 100 - rect.top];
      ds.scale = Math.min((rect.width - areaX - 20) / w, (rect.height - areaY - 20) / h, 1);
      ds.offset = [areaX / ds.scale - left, areaY / ds.scale - top];
      app.canvas.setDirty(true, true);
      await new Promise((r) => setTimeout(r, 400));
      const xs = [], ys = [];
      for (const n of app.graph.nodes) {
        const [x0, y0] = ds.convertOffsetToCanvas([n.pos[0], n.pos[1] - title]);
        const [x1, y1] = ds.convertOffsetToCanvas([n.pos[0] + n.size[0], n.pos[1] + n.size[1]]);
        xs.push(x0, x1); ys.push(y0, y1);
      }
      const x = Math.max(rect.left, rect.left + Math.min(...xs) - 12), y = Math.max(rect.top, rect.top + Math.min(...ys) - 12);
      return { x, y, width: Math.min(rect.right, rect.left + Math.max(...xs) + 12) - x,
               height: Math.min(rect.bottom, rect.top + Math.max(...ys) + 12) - y };
    });
    await page.screenshot({ path: `${process.env.SHOTS}/example_${name}.png`, clip });
  }
  // Load the example as the template browser does: fetch it from the template endpoint, loadGraphData.
  result.loaded = await page.evaluate(async ([workflowName, module]) => {
    const app = window.comfyAPI.app.app, api = window.comfyAPI.api.api;
    const list = await (await api.fetchApi("/workflow_templates")).json();
    const wf = await (await api.fetchApi(`/workflow_templates/${module}/${workflowName}.json`)).json();
    await app.loadGraphData(wf, true, true, workflowName, { openSource: "template" });
    const missing = app.graph.nodes.filter((n) => !window.LiteGraph.registered_node_types[n.type]).map((n) => n.type);
    const sampler = app.graph.nodes.find((n) => n.type === "CachedSampler");
    window.__progress = [];
    api.addEventListener("progress_text", (e) => window.__progress.push(e.detail));
    // The frontend's own progress text on the sampler as it shows it after each message (read once every
    // listener of the message has run): newer frontends take it off the nodes when the job ends.
    window.__previewAtEnd = null;
    api.addEventListener("progress_text", () => queueMicrotask(() => {
      const preview = sampler.widgets?.find((w) => w.name === "$$node-text-preview");
      if (preview?.value) window.__previewAtEnd = preview.value;
    }));
    window.__done = null;
    api.addEventListener("execution_success", () => { window.__done = "success"; });
    // The sampler's layout, measured a little after each progress text while a layout check is on: the
    // frontend's own progress box must be gone, the widgets inside the node, the node above the next one
    // and no text of the summary cut.
    window.__layout = () => {
      const app = window.comfyAPI.app.app, ds = app.canvas.ds, title = window.LiteGraph.NODE_TITLE_HEIGHT;
      const node = app.graph.nodes.find((n) => n.type === "CachedSampler");
      const rect = app.canvas.canvas.getBoundingClientRect();
      const bottom = node.pos[1] + node.size[1];
      const below = app.graph.nodes.filter((n) => n !== node && n.pos[1] - title >= node.pos[1] &&
        n.pos[0] < node.pos[0] + node.size[0] && n.pos[0] + n.size[0] > node.pos[0])
        .sort((a, b) => a.pos[1] - b.pos[1])[0];
      const summary = document.querySelector(".cached-sampler-summary");
      const box = summary?.getBoundingClientRect();
      const screenBottom = rect.top + ds.convertOffsetToCanvas([0, bottom])[1];
      const cut = summary ? [summary, ...summary.querySelectorAll("div")].filter((e) =>
        e.scrollWidth > e.clientWidth + 1 || e.scrollHeight > e.clientHeight + 1).map((e) =>
        `${e.textContent.slice(0, 60)}: ${e.scrollWidth}x${e.scrollHeight} in ${e.clientWidth}x${e.clientHeight}`) : [];
      const widgets = node.widgets.map((w) => ({ name: w.name, y: w.last_y ?? w.y ?? 0,
        h: w.computedHeight ?? (w.computeSize?.(node.size[0])?.[1] ?? window.LiteGraph.NODE_WIDGET_HEIGHT) }));
      return {
        state: summary?.dataset.state ?? null, text: summary?.innerText ?? null,
        progressBox: node.widgets.some((w) => w.name === "$$node-text-preview"),
        nodeBottom: bottom, nextTop: below ? below.pos[1] - title : null, next: below?.title ?? null,
        outside: widgets.filter((w) => w.y + w.h > node.size[1] + 1).map((w) => `${w.name} ${w.y}+${w.h} > ${node.size[1]}`),
        summaryBottom: box ? box.bottom : null, screenBottom, cut,
      };
    };
    window.__samples = [];
    window.__sampling = false;
    api.addEventListener("progress_text", () => {
      if (window.__sampling) setTimeout(() => window.__samples.push(window.__layout()), 30);
    });
    api.addEventListener("execution_error", (e) => { window.__done = "error: " + JSON.stringify(e.detail).slice(0, 2000); });
    return { templates: list[module] ?? [], missing, nodes: app.graph.nodes.length, samplerId: String(sampler.id),
             savedValues: wf.nodes.find((n) => n.type === "CachedSampler").widgets_values,
             widgetsBefore: sampler.widgets.map((w) => w.name) };
  }, [workflowName, module]);
  await page.evaluate(async ([samplerId, seed]) => {  // each mode its own seed: ComfyUI would reuse a cached run
    const app = window.comfyAPI.app.app;
    app.graph.getNodeById(Number(samplerId)).widgets.find((w) => w.name === "seed").value = seed;
    await app.queuePrompt(0, 1);
  }, [result.loaded.samplerId, full ? 0 : 1]);
  await page.waitForFunction(() => window.__done !== null, null, { timeout: 150000 });
  result.done = await page.evaluate(() => window.__done);
  const summaryShown = () => page.waitForFunction(() =>
    document.querySelector(".cached-sampler-summary")?.dataset.state === "summary", null, { timeout: 20000 }
  ).catch(() => {});
  await summaryShown();
  if (full && result.done === "success") {  // a second run, over the first run's summary
    result.first = await page.evaluate(() => window.__layout());
    await page.evaluate(async ([samplerId]) => {
      const app = window.comfyAPI.app.app;
      const seed = app.graph.getNodeById(Number(samplerId)).widgets.find((w) => w.name === "seed");
      const kept = seed.value;
      seed.value = 7;
      window.__done = null;
      window.__sampling = true;
      await app.queuePrompt(0, 1);
      seed.value = kept;  // the prompt is queued: the workflow reads as it was loaded again
    }, [result.loaded.samplerId]);
    await page.waitForFunction(() => window.__done !== null, null, { timeout: 150000 });
    result.done = await page.evaluate(() => window.__done);
    await summaryShown();
    await page.waitForTimeout(500);
    result.samples = await page.evaluate(() => { window.__sampling = false; return window.__samples; });
    result.second = await page.evaluate(() => window.__layout());
    // The summary box's width, then after a click on the node's title selects it, then with the properties
    // side panel open (where the frontend has one) and closed again: the box keeps the node's width.
    const summaryWidth = () => page.evaluate(() =>
      document.querySelector(".cached-sampler-summary")?.getBoundingClientRect().width ?? null);
    const title = await page.evaluate((samplerId) => {
      const app = window.comfyAPI.app.app, node = app.graph.getNodeById(Number(samplerId));
      document.querySelectorAll(".p-dialog-mask, .p-toast").forEach((e) => e.remove());  // 1.35's dialogs
      app.canvas.deselectAll?.();
      app.canvas.setDirty(true, true);
      const rect = app.canvas.canvas.getBoundingClientRect();
      const [x, y] = app.canvas.ds.convertOffsetToCanvas([node.pos[0] + node.size[0] / 2,
                                                          node.pos[1] - window.LiteGraph.NODE_TITLE_HEIGHT / 2]);
      return { x: rect.left + x, y: rect.top + y };
    }, result.loaded.samplerId);
    await page.waitForTimeout(500);
    result.width = { before: await summaryWidth() };
    await page.mouse.click(title.x, title.y);
    await page.waitForTimeout(1000);
    result.width.selected = await summaryWidth();
    result.width.selectedNodes = await page.evaluate(() => {
      const canvas = window.comfyAPI.app.app.canvas;
      return canvas.selectedItems ? [...canvas.selectedItems].map((item) => String(item.id))
        : Object.keys(canvas.selected_nodes ?? {});
    });
    const panel = page.locator('button[aria-label="Toggle properties panel"]');
    if (await panel.count()) {
      await panel.first().click();
      await page.waitForTimeout(1500);
      result.width.panel = await summaryWidth();
      await panel.first().click();
      await page.waitForTimeout(1000);
      result.width.panelClosed = await summaryWidth();
    }
    await page.evaluate(() => { window.comfyAPI.app.app.canvas.deselectAll?.(); });
  }
  result.after = await page.evaluate((samplerId) => {
    const app = window.comfyAPI.app.app;
    const sampler = app.graph.getNodeById(Number(samplerId));
    const summary = document.querySelector(".cached-sampler-summary");
    const saved = app.graph.serialize();
    return {
      summaryText: summary ? summary.innerText : null,
      previewText: sampler.widgets.find((w) => w.name === "$$node-text-preview")?.value ?? null,
      previewAtEnd: window.__previewAtEnd,
      frontend: window.__COMFYUI_FRONTEND_VERSION__ ?? null,
      summaryVisible: !!summary && summary.getBoundingClientRect().height > 20,
      strip: summary ? [...summary.querySelectorAll("[data-decision]")].map((c) => c.dataset.decision) : [],
      cellTitles: summary ? [...summary.querySelectorAll("[data-decision]")].map((c) => c.title) : [],
      plot: (() => {  // the tuning plot as the Preview Image node shows it
        const node = app.graph.nodes.find((n) => n.title === "Tuning plot");
        return { outputs: app.nodeOutputs?.[String(node.id)]?.images ?? null };
      })(),
      widgets: sampler.widgets.map((w) => w.name),
      savedValues: saved.nodes.find((n) => String(n.id) === samplerId).widgets_values,
      savedJson: JSON.stringify(saved),
      progress: window.__progress.filter((p) => String(p.nodeId) === samplerId).map((p) => p.text),
    };
  }, result.loaded.samplerId);
  const prompt = await page.evaluate(async () => (await window.comfyAPI.app.app.graphToPrompt()).output);
  result.promptInputs = prompt[result.loaded.samplerId]?.inputs ?? null;
  // Frame the sampler, its summary and the previews for the screenshot.
  await page.evaluate((samplerId) => {
    const app = window.comfyAPI.app.app;
    document.querySelectorAll(".p-dialog-mask, .p-toast").forEach((e) => e.remove());
    const ds = app.canvas.ds;
    ds.scale = 0.72; ds.offset = [90, 75];
    app.canvas.setDirty(true, true);
  }, result.loaded.samplerId);
  await page.waitForTimeout(1000);
  await page.screenshot({ path: shot });
  if (zh) {  // back to English for any later run (both frontends rebuild their nodes on a change of language)
    await page.evaluate(async () => {
      const app = window.comfyAPI.app.app;
      if (app.extensionManager?.setting?.set) await app.extensionManager.setting.set("Comfy.Locale", "en");
      else await app.ui.settings.setSettingValueAsync("Comfy.Locale", "en");
    });
  }
} catch (e) {
  result.error = String(e && e.stack || e);
} finally {
  await context.close();
}
console.log("RESULT " + JSON.stringify(result));
"""


DOCS_DRIVER = r"""
import { createRequire } from "module";
const [modules, url, profile, module] = process.argv.slice(2);
const { chromium } = createRequire(modules + "/")("playwright-core");
const NODES = JSON.parse(process.env.NODES), TEMPLATES = JSON.parse(process.env.TEMPLATES);
const result = { nodes: {}, templates: {} };
const context = await chromium.launchPersistentContext(profile, {
  executablePath: process.env.CHROMIUM, headless: true, args: JSON.parse(process.env.BROWSER_FLAGS),
  viewport: { width: 1600, height: 1000 },
});
try {
  const page = context.pages()[0] ?? await context.newPage();
  await page.goto(url, { waitUntil: "domcontentloaded" });
  await page.waitForFunction(() => window.comfyAPI?.app?.app?.graph && window.LiteGraph, null, { timeout: 90000 });
  await page.waitForTimeout(1500);
  // The node library, opened from its sidebar button; each node found by its name in the library's
  // search box and its page opened with the node's help ("Learn more") button, as a user does.
  // 1.35: the node library, opened from its sidebar button, each node found with the library's search box
  // and its page opened with the node's help ("Learn more") button. 1.49 (its redesigned library has no help
  // button): the node placed on the canvas, selected, and its page opened with the selection toolbox's Info
  // button, which shows it in the right-side panel.
  const search = page.locator(".node-lib-search-box input").first();
  await page.locator(".node-library-tab-button, button.side-bar-button:has([class*=comfy--node])").first().click();
  await page.waitForTimeout(1000);
  result.path = (await search.isVisible().catch(() => false)) ? "node library help button" : "selection toolbox info button";
  const waitContent = async () => {
    const content = page.locator(".node-help-content").first();
    await content.waitFor({ state: "visible", timeout: 10000 });
    await page.waitForFunction(() => {
      const c = document.querySelector(".node-help-content");
      return c && (c.querySelector(".fallback-content") || c.innerText.trim().length > 40);
    }, null, { timeout: 10000 });
    await page.waitForTimeout(200);
    return { text: await content.innerText(),
             fallback: (await page.locator(".node-help-content .fallback-content").count()) > 0 };
  };
  if (result.path === "selection toolbox info button") {  // the sidebar closed again
    await page.locator("button.side-bar-button:has([class*=comfy--node])").first().click();
  }
  for (const [id, display] of NODES) {
    const entry = result.nodes[id] = {};
    try {
      if (result.path === "node library help button") {
        await search.fill("");
        await search.fill(display);
        const label = new RegExp(`^\\s*${display.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}\\s*$`);
        const leaf = page.locator(".node-lib-node-container").filter({ has: page.getByText(label) });
        await leaf.first().waitFor({ state: "visible", timeout: 10000 });
        await leaf.first().hover();
        await leaf.first().locator(".help-button").first().click();
        Object.assign(entry, await waitContent());
        await page.locator("button:has([class*=arrow-left])").first().click();
        await search.waitFor({ state: "visible", timeout: 10000 });
      } else {
        await page.evaluate((id) => {
          const app = window.comfyAPI.app.app;
          app.graph.clear();
          const node = window.LiteGraph.createNode(id);
          node.pos = [300, 200];
          app.graph.add(node);
          app.canvas.ds.offset = [0, 0]; app.canvas.ds.scale = 1;
          app.canvas.deselectAll?.();
          app.canvas.selectNode(node);
          app.canvas.setDirty(true, true);
        }, id);
        const info = page.locator("[data-testid=info-button]").first();
        await info.waitFor({ state: "visible", timeout: 10000 });
        await info.click();
        Object.assign(entry, await waitContent());
      }
    } catch (e) {
      entry.error = String(e && e.message || e).slice(0, 1500);
      entry.dom = (await page.evaluate(() => document.body.innerText)).slice(0, 2000);
      await page.keyboard.press("Escape").catch(() => {});
    }
  }
  // Each template, opened as the template browser does, then what the frontend shows about it: a
  // missing-node dialog, and the model files it cannot find (1.35: the Missing Models dialog; 1.49: the
  // Missing Models card of the right-side errors panel).
  for (const name of TEMPLATES) {
    const entry = result.templates[name] = {};
    try {
      await page.evaluate(() => document.querySelectorAll(".p-dialog-mask").forEach((d) => d.querySelector(".p-dialog-close-button, .p-dialog-header-close")?.click()));
      await page.waitForTimeout(300);
      await page.evaluate(async ([name, module]) => {
        const app = window.comfyAPI.app.app, api = window.comfyAPI.api.api;
        const wf = await (await api.fetchApi(`/workflow_templates/${module}/${name}.json`)).json();
        await app.loadGraphData(wf, true, true, name, { openSource: "template" });
      }, [name, module]);
      await page.waitForTimeout(2500);
      entry.dialogs = await page.evaluate(() => [...document.querySelectorAll(".p-dialog")].map((d) => d.innerText.slice(0, 3000)));
      // 1.49: the error overlay's "View details" opens the errors panel with its Missing Models card.
      const details = page.locator("[data-testid=error-overlay-see-errors]");
      entry.models = [];
      if (await details.isVisible().catch(() => false)) {
        await details.click();
        await page.waitForTimeout(1000);
        entry.panel = await page.evaluate(() => document.querySelector("[data-testid=properties-panel]")?.innerText.slice(0, 3000) ?? null);
        entry.testids = await page.evaluate(() => [...new Set([...document.querySelectorAll("[data-testid]")].map((e) => e.dataset.testid))]);
        entry.models = await page.evaluate(() => [...document.querySelectorAll("[data-testid=missing-model-importable-rows] > *")].map((row) => ({
          text: row.innerText, link: [...row.querySelectorAll("button[aria-label]")].map((b) => b.getAttribute("aria-label")) })));
      } else {  // 1.35: the Missing Models dialog, one entry ("folder / file" and its buttons) a file
        entry.models = await page.evaluate(() => [...document.querySelectorAll(".p-dialog")]
          .filter((d) => /models were not found/.test(d.innerText))
          .flatMap((d) => [...d.querySelectorAll("span, div, label")].filter((e) =>
            e.children.length === 0 && /^\S+ \/ \S+$/.test(e.innerText.trim())).map((e) => {
            let row = e;
            while (row.parentElement && !row.querySelector("button") && row.parentElement !== d) row = row.parentElement;
            return { text: row.innerText,
                     link: [...row.querySelectorAll("button")].map((b) => b.innerText.trim() || b.getAttribute("aria-label")) };
          })));
      }
    } catch (e) {
      entry.error = String(e && e.message || e).slice(0, 1500);
    }
  }
} catch (e) {
  result.error = String(e && e.stack || e);
} finally {
  await context.close();
}
console.log("RESULT " + JSON.stringify(result));
"""


@pytest.fixture(scope="module", params=["installed", NEWEST_FRONTEND])
def comfy_server(request):
    """A ComfyUI server with the frontend its Python has installed, then with the newest frontend package."""
    comfy = find_comfyui()
    if comfy is None:
        skip_loudly("no ComfyUI found")
    if not (os.path.isfile(CHROMIUM) and os.access(CHROMIUM, os.X_OK)):
        skip_loudly(f"no Chromium at {CHROMIUM}")
    if shutil.which("node") is None:
        skip_loudly("no node")
    if not (PLAYWRIGHT / "playwright-core" / "package.json").is_file():
        skip_loudly(f"no playwright-core in {PLAYWRIGHT}")
    front_end = []
    if request.param == NEWEST_FRONTEND:
        if not (NEWEST_FRONTEND_ROOT / "index.html").is_file():
            skip_loudly(f"no comfyui-frontend-package {NEWEST_FRONTEND} in .frontend/")
        front_end = ["--front-end-root", str(NEWEST_FRONTEND_ROOT)]
    tmp = Path(tempfile.mkdtemp(prefix="cached-sampler-browser-"))
    for name in ("custom_nodes", "user", "output", "temp", "input", "profile"):
        (tmp / name).mkdir()
    (tmp / "custom_nodes" / PACK_DIR_NAME).symlink_to(ROOT, target_is_directory=True)
    # Dismiss first-run dialogs for this throw-away user.
    (tmp / "user" / "default").mkdir()
    (tmp / "user" / "default" / "comfy.settings.json").write_text(json.dumps({
        "Comfy.TutorialCompleted": True, "Comfy.InstalledVersion": "99.0.0", "Comfy.Minimap.Visible": False}))
    (tmp / "extra_model_paths.yaml").write_text(f"cached_sampler_browser_test:\n  base_path: {tmp}\n"
                                                f"  custom_nodes: custom_nodes/\n")
    port = free_port()
    log = open(tmp / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "main.py", "--cpu", "--listen", "127.0.0.1", "--port", str(port),
         "--extra-model-paths-config", str(tmp / "extra_model_paths.yaml"), "--user-directory", str(tmp / "user"),
         "--output-directory", str(tmp / "output"), "--temp-directory", str(tmp / "temp"),
         "--input-directory", str(tmp / "input"), "--database-url", "sqlite:///:memory:",
         "--disable-auto-launch", "--disable-api-nodes", *front_end],
        cwd=comfy, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"})
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"ComfyUI exited with {server.returncode}:\n{(tmp / 'server.log').read_text()[-4000:]}")
            try:
                with urllib.request.urlopen(url + "/api/object_info/CachedSampler", timeout=5) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"ComfyUI did not answer in {SERVER_START_S} s:\n{(tmp / 'server.log').read_text()[-4000:]}")
            time.sleep(1)
        yield url, tmp
    finally:
        stop(server)
        log.close()
        ARTIFACTS.mkdir(exist_ok=True)
        shutil.copy(tmp / "server.log", ARTIFACTS / "browser_server.log")
        shutil.rmtree(tmp, ignore_errors=True)


def drive(url: str, tmp: Path, shot: Path | None, mode: str, script: str = DRIVER, **extra: object) -> dict:
    """Run a browser driver once (bounded in time, its process group stopped) and return its result;
    ``extra`` goes to the driver as JSON in environment variables of the same names."""
    driver = tmp / f"driver_{mode}.mjs"
    driver.write_text(script)
    profile = Path(tempfile.mkdtemp(prefix="profile-", dir=tmp))
    args = [str(shot), WORKFLOW, PACK_DIR_NAME] if script is DRIVER else [PACK_DIR_NAME]
    browser = subprocess.Popen(
        ["node", str(driver), str(PLAYWRIGHT), url, str(profile), *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
        env={**os.environ, "CHROMIUM": CHROMIUM, "BROWSER_FLAGS": json.dumps(FLAGS), "SHOTS": str(ARTIFACTS),
             "EXAMPLES": json.dumps(EXAMPLES), "MODE": mode,
             **{k: json.dumps(v) for k, v in extra.items()},
             "PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD": "1", "PLAYWRIGHT_BROWSERS_PATH": str(tmp / "no-browsers")})
    try:
        out, _ = browser.communicate(timeout=BROWSER_S)
    except subprocess.TimeoutExpired:
        stop(browser, grace=5)
        out = browser.communicate()[0]
        pytest.fail(f"the browser run took over {BROWSER_S} s:\n{out[-4000:]}")
    finally:
        stop(browser, grace=5)
    lines = [line for line in out.splitlines() if line.startswith("RESULT ")]
    assert lines, f"driver printed no result:\n{out[-4000:]}"
    result = json.loads(lines[-1][len("RESULT "):])
    (ARTIFACTS / f"browser_result_{mode}.json").write_text(json.dumps(result, indent=1))
    assert "error" not in result, result["error"]
    return result


def offsite_not_ours(message: str, workflow_text: str) -> bool:
    """The frontend looking up model files online for its missing-models panel, which the server's Content
    Security Policy blocks here: the default graph's files (newer frontends, whenever that happens to finish)
    and the files an example names in its loaders' properties.models (their sizes, for the download dialog),
    with the error the frontend logs for each size it could not fetch."""
    if message.startswith("Error fetching file size: TypeError: Failed to fetch"):
        return True
    urls = [u.rstrip(".") for u in re.findall(r"https?://[^\s'\"]+", message)]
    return "Content Security Policy" in message and bool(urls) and all(
        u not in workflow_text or u.split("?")[0].endswith(MODEL_FILES) for u in urls)


def test_without_the_extension_the_node_still_shows_the_summary_text(comfy_server):
    url, tmp = comfy_server
    ARTIFACTS.mkdir(exist_ok=True)
    result = drive(url, tmp, ARTIFACTS / "browser_without_extension.png", "without-extension")
    assert "cached_sampler.summary" not in result["extensions"]
    assert result["done"] == "success", result["done"]
    after = result["after"]
    assert after["summaryText"] is None
    if after["previewText"] is None and after["frontend"] and version(after["frontend"]) >= (1, 50):
        # Newer frontends take their progress text off the nodes when the job ends: the summary text is read
        # as the frontend alone showed it on the node at the run's end.
        assert after["previewAtEnd"] and "/20 steps (cond " in after["previewAtEnd"], after["previewAtEnd"]
    else:
        assert after["previewText"] and "/20 steps (cond " in after["previewText"], after["previewText"]
    saved = result["loaded"]["savedValues"]
    assert after["savedValues"][:len(saved)] == [1, *saved[1:]], "the frontend alone keeps the widget positions"


def version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def check_layout(result: dict) -> None:
    """While the second run goes and after it: one box (the frontend's own progress box taken off), every
    widget inside the node, the node above the node below it, and no line of the summary cut."""
    samples = result["samples"]
    assert len(samples) >= 20, f"the layout was measured during the second run: {len(samples)} samples"
    assert any(s["state"] == "live" for s in samples), "the live progress text showed in the summary widget"
    for when, layout in [("after the first run", result["first"]), *(("during the second run", s) for s in samples),
                         ("after the second run", result["second"])]:
        assert not layout["progressBox"], f"{when}: the frontend's progress box is stacked under the summary"
        assert not layout["outside"], f"{when}: widgets below the node's bottom: {layout['outside']}"
        assert layout["next"] and layout["nodeBottom"] <= layout["nextTop"], \
            f"{when}: the sampler ({layout['nodeBottom']}) runs into {layout['next']!r} ({layout['nextTop']})"
        assert layout["summaryBottom"] <= layout["screenBottom"] + 1, \
            f"{when}: the summary ({layout['summaryBottom']}) spills below the node ({layout['screenBottom']})"
        assert not layout["cut"], f"{when}: text cut: {layout['cut']}"
    assert result["second"]["state"] == "summary"


def test_tiny_example_in_a_real_browser_shows_the_summary(comfy_server):
    url, tmp = comfy_server
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "browser_tiny_digits.png"
    result = drive(url, tmp, shot, "full")
    from cached_sampler_dev.generate import make_example_workflows
    with urllib.request.urlopen(f"{url}/api/object_info", timeout=120) as response:
        defs = json.loads(response.read())
    # A template written for newer node definitions (LTX-2's) reads back other widget values on an older
    # ComfyUI: it is checked where its nodes are as it was written for.
    newer = {name: missing for name in EXAMPLES if (missing := make_example_workflows.missing_requirements(name, defs))}
    if newer:
        warnings.warn(f"not checked on this ComfyUI, which lacks what they need: {newer}")
    for name in (n for n in EXAMPLES if n not in newer):
        example = result["examples"][name]
        assert example["missing"] == [], f"{name}: missing node types {example['missing']}"
        assert example["nodes"] == example["expected"] and example["links"] == example["expectedLinks"], example
        assert example["changed"] == [], f"{name}: the frontend read other widget values: {example['changed']}"
        text = (ROOT / "example_workflows" / f"{name}.json").read_text(encoding="utf-8")
        problems = [c for c in example["console"] if "404" not in c and not offsite_not_ours(c, text)]
        assert not problems, f"{name}: {problems}"

    loaded = result["loaded"]
    assert WORKFLOW in loaded["templates"], "listed by the template endpoint"
    assert loaded["missing"] == [], f"missing node types: {loaded['missing']}"
    assert "cached_sampler.summary" in result["extensions"], "the web extension loaded"
    assert result["done"] == "success", result["done"]

    after = result["after"]
    text = after["summaryText"] or ""
    assert "First Block Cache + TaylorSeer" in text, text
    assert "/20 steps computed" in text and "saved" in text and "acted: First Block Cache" in text, text
    assert "cond " in text and "uncond " in text, text
    assert after["summaryVisible"]
    computed = int(text.split("/20 steps computed")[0].rsplit("\n", 1)[-1])
    assert len(after["strip"]) == 20 and after["strip"].count("computed") == computed, (after["strip"], text)
    assert after["strip"].count("skipped") == 20 - computed > 0, after["strip"]
    # The tuning plot reached the Preview Image node, and the page loaded it from the server.
    plot = after["plot"]["outputs"]
    assert plot and len(plot) == 1, after["plot"]
    assert any(v.startswith("200 ") and f"filename={plot[0]['filename']}&" in v for v in result["views"]), \
        (plot, result["views"])
    assert len(after["progress"]) >= 40, "live progress text arrived for each step of both runs"
    assert after["progress"][0].splitlines()[1].startswith("step 1/20:")
    assert after["cellTitles"][0] in ("evaluation 1: computed", "evaluation 1: skipped"), after["cellTitles"][0]
    live = [s["text"] for s in result["samples"] if s["state"] == "live"]
    assert any("skipped so far" in t and "threshold" in t for t in live), live[:3]
    check_layout(result)
    # Selecting the node, and opening the side panel, leave the summary box as wide as it was.
    width = result["width"]
    assert width["before"] and width["before"] > 100, width
    assert width["selectedNodes"] == [result["loaded"]["samplerId"]], f"the click selected the sampler: {width}"
    for when in ("selected", "panel", "panelClosed"):
        if when in width:
            assert abs(width[when] - width["before"]) <= 1, f"{when}: the summary box changed width: {width}"

    # The summary is display only: not in the saved workflow, not in the prompt.
    assert after["savedValues"] == loaded["savedValues"], (after["savedValues"], loaded["savedValues"])
    for shown in [*text.splitlines()[1:], "skipped so far", "model work saved", "cached_sampler_summary"]:
        assert shown not in after["savedJson"], f"{shown!r} was saved in the workflow"
    assert set(result["promptInputs"]) <= {"model", "seed", "steps", "cfg", "sampler_name", "scheduler", "positive",
                                           "negative", "latent_image", "denoise", "interceptors", "allow_distilled",
                                           "cache_on_cpu"}
    errors = [c for c in result["console"] if "cached_sampler" in c.lower() or "cached sampler" in c.lower()
              or f"/{PACK_DIR_NAME}/" in c]
    assert not errors, errors
    ours = [f for f in result["failed"] if PACK_DIR_NAME in f or "cached_sampler" in f.lower()]
    assert not ours, f"requests for the pack's files failed: {ours}"
    assert shot.is_file()


def test_in_a_chinese_ui_the_summary_and_live_text_are_chinese(comfy_server):
    """With the frontend's language set to Chinese the node's labels and the live text's fixed phrases are
    Chinese; numbers and method names stay as they are, and the layout holds with the wider characters."""
    url, tmp = comfy_server
    ARTIFACTS.mkdir(exist_ok=True)
    shot = ARTIFACTS / "browser_tiny_digits_zh.png"
    result = drive(url, tmp, shot, "zh")
    assert "cached_sampler.summary" in result["extensions"]
    assert result["done"] == "success", result["done"]
    after = result["after"]
    text = after["summaryText"] or ""
    assert text.splitlines()[0] == "First Block Cache + TaylorSeer", text
    assert "已计算 " in text and "/20 步" in text and "节省 " in text, text
    assert "生效：First Block Cache" in text, text
    for english in ("computed", "saved", "acted", "steps"):
        assert english not in text, f"{english!r} left in English: {text}"
    assert after["cellTitles"][0] in ("第 1 次评估：已计算", "第 1 次评估：已跳过"), after["cellTitles"][0]
    computed = int(text.split("已计算 ")[1].split("/20 步")[0])
    assert after["strip"].count("computed") == computed and len(after["strip"]) == 20, (after["strip"], text)
    live = [s["text"] for s in result["samples"] if s["state"] == "live"]
    assert live and all(t.splitlines()[0] == "First Block Cache + TaylorSeer" for t in live), live[:3]
    assert any("步：已计算" in t and "阈值" in t for t in live), live[:3]
    assert not any("skipped so far" in t or "threshold" in t for t in live), live[:3]
    check_layout(result)
    assert shot.is_file()


def page_sentence(node_id: str) -> str:
    """The first sentence of the node's "When to choose it" section, as the rendered page reads it."""
    path = ROOT / "web" / "docs" / node_id / "en.md"
    if not path.is_file():
        path = ROOT / "web" / "docs" / f"{node_id}.md"
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    section = text.split("## When to choose it", 1)[-1].strip().split("\n\n", 1)[0]
    plain = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", section).replace("`", "").replace("**", "").replace("*", "")
    return " ".join(plain.split(". ", 1)[0].split())


def test_node_library_and_templates_show_the_packs_pages_and_model_sources(comfy_server):
    """Every node of the pack opens its own page from the node library's help button (not the frontend's
    generic fallback), and every template opens with no missing-node dialog and every missing model file
    named with its download source."""
    url, tmp = comfy_server
    ARTIFACTS.mkdir(exist_ok=True)
    with urllib.request.urlopen(f"{url}/api/object_info", timeout=120) as response:
        defs = json.loads(response.read())
    nodes = sorted((name, d["display_name"]) for name, d in defs.items()
                   if PACK_DIR_NAME in str(d.get("python_module", "")))
    assert len(nodes) >= 10, nodes
    result = drive(url, tmp, None, "docs", DOCS_DRIVER, NODES=nodes, TEMPLATES=EXAMPLES)
    for name, display in nodes:
        entry = result["nodes"][name]
        assert "error" not in entry, f"{name}: {entry}"
        assert not entry["fallback"], f"{name}: the frontend's fallback instead of the pack's page: {entry['text'][:300]}"
        shown = " ".join(entry["text"].split())
        sentence = page_sentence(name)
        assert "When to choose it" in shown and sentence and sentence in shown, (name, sentence, shown[:600])
    for name in EXAMPLES:
        entry = result["templates"][name]
        assert "error" not in entry, f"{name}: {entry}"
        workflow = json.loads((ROOT / "example_workflows" / f"{name}.json").read_text(encoding="utf-8"))
        # The model files the template's loaders name in their widgets (none is installed here), whatever
        # metadata the template carries: a file without metadata is one the frontend cannot name a source for.
        files = {v for n in workflow["nodes"] for v in n.get("widgets_values") or []
                 if isinstance(v, str) and v.endswith(MODEL_FILES)}
        shown = "\n".join([*entry["dialogs"], entry.get("panel") or ""])
        assert not re.search(r"missing nodes|nodes are missing|missing node types", shown, re.I), f"{name}: {shown[:800]}"
        assert not any("missing-node" in t for t in entry.get("testids", [])), f"{name}: {entry['testids']}"
        listed = entry["models"]
        assert len(listed) == len(files), f"{name}: the frontend lists {listed}, the template names {sorted(files)}"
        for model in listed:
            assert "Unknown" not in model["text"] and "Copy URL" in model["link"], f"{name}: {model}"
            assert any(f in model["text"] for f in files), f"{name}: {model} is none of {sorted(files)}"
