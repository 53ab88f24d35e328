"""What the user sees of a run: live progress text on the node, and the summary afterwards."""
from __future__ import annotations

import logging

from ..interceptors import InterceptorChain, LoopState, RunSummary

log = logging.getLogger("cached_sampler")


def send_progress_text(text: str, node_id) -> None:
    """ComfyUI's per-node progress-text channel; a no-op without a server (headless runs)."""
    if node_id is None:
        return
    try:
        from server import PromptServer
        server = getattr(PromptServer, "instance", None)
    except Exception:  # headless or a ComfyUI without the server module
        return
    if server is not None and hasattr(server, "send_progress_text"):
        server.send_progress_text(text, node_id)


class RunReport:
    """Collects one sampler execution's runs (KSamplerAdvanced segments are separate runs)."""

    def __init__(self, node: str, chain: InterceptorChain, node_id=None, live: bool = True):
        self.node = node
        self.chain = chain
        self.node_id = node_id
        self.live = live
        self.warnings: list[str] = []
        self.summaries: list[RunSummary] = []
        self.runs: list[LoopState] = []

    def warn(self, message: str) -> None:
        log.warning("%s: %s", self.node, message)
        self.warnings.append(message)

    def evaluation_ended(self, run: LoopState, ev) -> None:
        done = sum(1 for r in run.records if not r.skipped)
        text = f"step {ev.step + 1}/{ev.total_steps}: computed {done}, skipped {len(run.records) - done}"
        if ev.record.metric is not None:
            verdict = "skip" if ev.record.skipped else "compute"
            text += f" | change {ev.record.metric:.4g} vs threshold {ev.record.threshold:.4g} -> {verdict}"
        send_progress_text(text, self.node_id)

    def run_ended(self, run: LoopState, summary: RunSummary) -> None:
        self.runs.append(run)
        self.summaries.append(summary)
        send_progress_text(self.text(), self.node_id)

    def text(self) -> str:
        if self.chain.empty:
            return "No interceptors connected: plain KSampler."
        lines = [s.text() for s in self.summaries] or ["(no sampling run)"]
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])

    def ui(self) -> dict:
        return {"text": (self.text(),)}
