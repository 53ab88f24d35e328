"""What the user sees of a run: live progress text on the node, the summary afterwards, the tuning plot.

The live text and the summary travel over ComfyUI's per-node progress-text channel (shown under the
node by the frontend); the summary also goes out as the node's UI output (``text`` for any client,
``cached_sampler`` with the numbers for the pack's web extension). Without a server (headless runs,
scripts) nothing is sent and nothing fails.
"""
from __future__ import annotations

import logging

from ...interceptors import InterceptorChain, LoopState, PlannedSchedule, RunSummary
from ...interceptors.records import counted_in
from . import plot

log = logging.getLogger("cached_sampler")

DEFAULT_METRIC = "change metric"  # the name of a metric whose decider declares none (Decider.metric_name)


def send_progress_text(text: str, node_id) -> None:
    """ComfyUI's per-node progress-text channel; a no-op without a server (headless runs). A failure to
    send never interrupts sampling."""
    if node_id is None:
        return
    try:
        from server import PromptServer
        server = getattr(PromptServer, "instance", None)
        if server is None or not hasattr(server, "send_progress_text"):
            return
        server.send_progress_text(text, node_id, getattr(server, "client_id", None))
    except Exception as e:  # headless, a ComfyUI without the server module, or a closed connection
        log.debug("progress text not sent: %s", e)


def _name(label: str) -> str:
    return label.strip("'")


def _branches(s: RunSummary) -> list[tuple[str, tuple[int, int]]]:
    """Per-branch counts, cond first, then uncond, then any others in the order they ran."""
    order = {"cond": 0, "uncond": 1}
    items = list(s.branches.items())
    return sorted(items, key=lambda kv: (order.get(kv[0].split("#")[0], 2), items.index(kv)))


def _time_saved(s: RunSummary) -> str:
    """', the steps that skipped work took 1.20 s less than computed ones': the wall-clock time the skipped work
    saved, as the run timed its steps. What caching adds to a computed step is not taken off (a few ms on a real
    model, relatively more on a tiny one)."""
    if s.seconds_saved is None:
        return ""
    return f", the steps that skipped work took {s.seconds_saved:.2f} s less than computed ones"


def _fraction(value: float) -> str:
    return f"{value:.0%}"


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

    # -- naming -------------------------------------------------------------------------------------
    @property
    def methods(self) -> str:
        """The chain as the user built it, by method: 'First Block Cache + TaylorSeer'."""
        return " + ".join(ic.display_name for ic in self.chain) or "no interceptors"

    @property
    def _shown(self) -> list:
        """The deciders whose metric is shown: a decider whose metric is secondary only where no other one reports."""
        return [d for d in self.chain.deciders if not d.metric_secondary] or list(self.chain.deciders)

    @property
    def metric_name(self) -> str:
        """What the chain's reported metric measures, as its deciders declare it (``Decider.metric_name``)."""
        names = {d.metric_name or DEFAULT_METRIC for d in self._shown}
        return names.pop() if len(names) == 1 else DEFAULT_METRIC

    @property
    def threshold_rule(self) -> str:
        """What the shown metric's threshold means (``Decider.threshold_rule``)."""
        rules = {d.threshold_rule for d in self._shown}
        return rules.pop() if len(rules) == 1 else "skip below"

    def warn(self, message: str) -> None:
        log.warning("%s: %s", self.node, message)
        self.warnings.append(message)

    # -- live ---------------------------------------------------------------------------------------
    def progress_text(self, run: LoopState, ev) -> str:
        """Where the run stands after one evaluation: steps computed/skipped so far and the decision."""
        done = sum(1 for r in run.records if not r.skipped)
        skipped = len(run.records) - done
        record = ev.record
        line = (f"step {ev.step + 1}/{ev.total_steps}: {done} computed, {skipped} skipped so far "
                f"({_fraction(skipped / max(len(run.records), 1))} skipped)")
        if record.metric is not None and record.threshold is not None:
            relation = "<" if record.metric < record.threshold else ">="
            # skipped at or above the threshold: a middle tier (Verified Block Cache's back blocks ran)
            verdict = ("computed" if not record.skipped else "skipped" if relation == "<" else
                       "partly skipped (back blocks computed)")
            decision = f"{self.metric_name} {record.metric:.4g} {relation} threshold {record.threshold:.4g}: {verdict}"
        elif record.skipped:
            decision = "skipped"
        else:
            decision = "computed (not checked: first, last, warm-up or outside start/end percent)"
        return f"{self.methods}\n{line}\n{decision}"

    def evaluation_ended(self, run: LoopState, ev) -> None:
        send_progress_text(self.progress_text(run, ev), self.node_id)

    def run_ended(self, run: LoopState, summary: RunSummary) -> None:
        self.runs.append(run)
        self.summaries.append(summary)
        send_progress_text(self.text(), self.node_id)

    # -- summary ------------------------------------------------------------------------------------
    @staticmethod
    def run_lines(s: RunSummary) -> list[str]:
        computed = s.evaluations - s.evaluations_skipped
        unit = counted_in(s.evaluations, s.steps)
        branches = ", ".join(f"{name} {done}/{seen}" for name, (done, seen) in _branches(s))
        lines = [f"computed {computed}/{s.evaluations} {unit}" + (f" ({branches})" if branches else ""),
                 f"model work saved {_fraction(s.work_saved)}, estimated speedup {s.estimated_speedup:.2f}x"
                 f"{_time_saved(s)}, sampling took {s.seconds:.2f} s, {s.cache_text}"]
        acted = ", ".join(_name(a) for a in s.acted) if s.acted else "none (nothing was skipped)"
        lines.append(f"acted: {acted}")
        lines.extend(f"note: {n}" for n in s.notes)
        return lines

    def quality_hint(self) -> str | None:
        """What the chain knows of its quality: the PSNR Auto Calibrate measured for its plan, where a run followed
        the plan (a plan made for another sampler or schedule computes every step and says so in a note)."""
        plan = next((d for d in self.chain.deciders if isinstance(d, PlannedSchedule) and d.quality), None)
        if plan is None or not self.summaries:
            return None
        if any("calibrated for another schedule or sampler" in n for s in self.summaries for n in s.notes):
            return None
        return f"quality: {plan.quality.describe()}, as Auto Calibrate measured this plan"

    def text(self) -> str:
        if self.chain.empty:
            return "No interceptors connected: plain KSampler."
        lines = [self.methods] + ([self.quality_hint()] if self.quality_hint() else [])
        if not self.summaries:
            lines.append("(no sampling run)")
        for i, s in enumerate(self.summaries):
            prefix = f"run {i + 1}: " if len(self.summaries) > 1 else ""
            lines.extend(prefix + line for line in self.run_lines(s))
        return "\n".join(lines + [f"warning: {w}" for w in self.warnings])

    def data(self) -> dict:
        """The summary's numbers for the web extension (JSON-able)."""
        runs = []
        for run, s in zip(self.runs, self.summaries):
            runs.append({
                "steps": s.steps, "evaluations": s.evaluations,
                "computed": s.evaluations - s.evaluations_skipped, "skipped": s.evaluations_skipped,
                "branches": {name: list(v) for name, v in _branches(s)},
                "work_saved": round(s.work_saved, 4), "speedup": round(s.estimated_speedup, 3),
                "seconds": round(s.seconds, 3),
                "seconds_saved": None if s.seconds_saved is None else round(s.seconds_saved, 3), "acted": [_name(a) for a in s.acted], "notes": list(s.notes),
                "cache_bytes": dict(s.cache_bytes), "cache_peak_bytes": dict(s.cache_peak_bytes),
                "decisions": "".join("s" if r.skipped else "c" for r in run.records),
            })
        return {"empty": self.chain.empty, "methods": self.methods,
                "interceptors": [_name(ic.label) for ic in self.chain], "metric": self.metric_name,
                "runs": runs, "warnings": list(self.warnings)}

    def ui(self) -> dict:
        return {"text": (self.text(),), "cached_sampler": (self.data(),)}

    # -- plot ---------------------------------------------------------------------------------------
    @property
    def records(self) -> list:
        return [r for run in self.runs for r in run.records]

    def plot(self):
        """The tuning plot of every run of this execution (IMAGE tensor)."""
        if self.chain.empty:
            return plot.tuning_plot([])
        heading = f"{self.node}: {self.methods}"
        if len(self.runs) > 1:
            heading += f" ({len(self.runs)} runs)"
        return plot.tuning_plot(self.records, heading=heading, metric_name=self.metric_name,
                                threshold_rule=self.threshold_rule)
