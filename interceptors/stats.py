"""What caching did in one run: the numbers shown on the node and written to the log."""
from __future__ import annotations

import dataclasses

from .state import LoopState


@dataclasses.dataclass(frozen=True)
class RunSummary:
    steps: int
    evaluations: int
    evaluations_skipped: int
    forwards_computed: int
    forwards_skipped: int
    blocks_run: int
    blocks_total: int
    branches: dict[str, tuple[int, int]]          # branch -> (evaluations computed, evaluations seen)
    interceptors: tuple[str, ...]
    acted: tuple[str, ...]                        # interceptors that skipped at least once
    seconds: float

    work_done: float = 0.0                        # batch rows' worth of model work really done
    work_total: float = 0.0                       # ... and what the plain sampler would have done
    notes: tuple[str, ...] = ()                   # what the run switched off or could not do
    cache_bytes: dict[str, int] = dataclasses.field(default_factory=dict)       # device -> bytes held at the end
    cache_peak_bytes: dict[str, int] = dataclasses.field(default_factory=dict)  # device -> bytes at the peak

    @property
    def work_saved(self) -> float:
        """Share of model work not done, by batch rows (a forward of only the positive rows of a CFG step is
        half the work), counting each forward whose middle blocks were skipped by the share of its own blocks that
        ran (``EvaluationRecord.work_done``; embedders and the final layer are not counted: an estimate)."""
        # rounded past float noise: a share that is exactly a half per cent (0.375) shows as it is on every sampler
        return round(1.0 - self.work_done / self.work_total, 9) if self.work_total else 0.0

    seconds_saved: float | None = None            # measured: see seconds_saved()

    @property
    def estimated_speedup(self) -> float:
        return 1.0 / max(1.0 - self.work_saved, 1e-6)

    @property
    def cache_text(self) -> str:
        """'cache 1.2 GB on cuda:0 (peak 1.3 GB)': what the run's caches held at its end, and at most."""
        end = sum(self.cache_bytes.values())
        peak = sum(self.cache_peak_bytes.values())
        devices = self.cache_peak_bytes or self.cache_bytes
        where = " + ".join(f"{format_bytes(b)} on {d}" for d, b in sorted(devices.items(), key=lambda kv: -kv[1]))
        if not where:
            return "cache empty"
        if len(devices) > 1:
            return f"cache peak {where}; {format_bytes(end)} at the end"
        return f"cache {format_bytes(end)} on {next(iter(devices))}" + (
            f" (peak {format_bytes(peak)})" if peak != end else "")

    def text(self) -> str:
        order = {"cond": 0, "uncond": 1}
        branches = sorted(self.branches.items(), key=lambda kv: (order.get(kv[0].split("#")[0], 2), kv[0]))
        per_branch = ", ".join(f"{name} {done}/{seen}" for name, (done, seen) in branches)
        acted = ", ".join(self.acted) if self.acted else "none"
        return (f"computed {self.evaluations - self.evaluations_skipped}/{self.evaluations} model evaluations "
                f"({per_branch}); model work saved {self.work_saved:.0%}, estimated speedup "
                f"{self.estimated_speedup:.2f}x; {self.cache_text}; acted: {acted}")


def summarize(run: LoopState, seconds: float = 0.0) -> RunSummary:
    branches: dict[str, list[int]] = {}
    for r in run.records:
        for name, computed in r.branches.items():
            entry = branches.setdefault(name, [0, 0])
            entry[0] += int(computed and not (r.blocks_total and r.blocks_run < r.blocks_total))
            entry[1] += 1
    acted = tuple(dict.fromkeys(label for r in run.records for label in r.skipped_by))
    return RunSummary(
        steps=run.total_steps,
        evaluations=len(run.records),
        evaluations_skipped=sum(1 for r in run.records if r.skipped),
        forwards_computed=sum(r.forwards_computed for r in run.records),
        forwards_skipped=sum(r.forwards_skipped for r in run.records),
        blocks_run=sum(r.blocks_run for r in run.records),
        blocks_total=sum(r.blocks_total for r in run.records),
        branches={k: (v[0], v[1]) for k, v in branches.items()},
        interceptors=tuple(ic.label for ic in run.chain),
        acted=acted,
        seconds=seconds,
        notes=tuple(run.notes),
        cache_bytes=dict(run.cache_bytes),
        cache_peak_bytes=dict(run.cache_peak_bytes),
        work_done=sum(r.work_done for r in run.records),
        work_total=sum(r.rows_total for r in run.records),
        seconds_saved=seconds_saved(run.records),
    )


def seconds_saved(records) -> float | None:
    """Wall-clock seconds the skipped work saved, as the run measured it: each evaluation that did less than all its
    work against the median evaluation that did all of it (the first left out: it warms up). None where there is
    nothing to compare: no evaluation skipped work, or none after the first computed it all."""
    full = sorted(r.seconds for r in records[1:] if r.seconds > 0 and r.work_done >= r.rows_total > 0)
    lighter = [r.seconds for r in records if r.seconds > 0 and r.work_done < r.rows_total]
    if not full or not lighter:
        return None
    median = full[len(full) // 2]
    return sum(max(median - s, 0.0) for s in lighter)


def format_bytes(n: int) -> str:
    """Bytes for people: '0 B', '512 B', '3.4 KB', '1.2 GB' (decimal units, as GPU tools show them)."""
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}" if n < 100 * size else f"{n / size:.0f} {unit}"
    return f"{n} B"
