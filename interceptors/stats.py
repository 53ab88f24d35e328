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

    work_done: float = 0.0                        # batch chunks' worth of model work really done
    work_total: float = 0.0                       # ... and what the plain sampler would have done
    notes: tuple[str, ...] = ()                   # what the run switched off or could not do

    @property
    def work_saved(self) -> float:
        """Share of model work not done, by batch rows (a forward of only the positive rows of a CFG step is
        half the work), counting a forward whose middle blocks were skipped by the share of its blocks that ran
        (embedders and the final layer are not counted: an estimate)."""
        return 1.0 - self.work_done / self.work_total if self.work_total else 0.0

    @property
    def estimated_speedup(self) -> float:
        return 1.0 / max(1.0 - self.work_saved, 1e-6)

    def text(self) -> str:
        order = {"cond": 0, "uncond": 1}
        branches = sorted(self.branches.items(), key=lambda kv: (order.get(kv[0].split("#")[0], 2), kv[0]))
        per_branch = ", ".join(f"{name} {done}/{seen}" for name, (done, seen) in branches)
        acted = ", ".join(self.acted) if self.acted else "none"
        return (f"computed {self.evaluations - self.evaluations_skipped}/{self.evaluations} model evaluations "
                f"({per_branch}); model work saved {self.work_saved:.0%}, estimated speedup "
                f"{self.estimated_speedup:.2f}x; acted: {acted}")


def summarize(run: LoopState, seconds: float = 0.0) -> RunSummary:
    branches: dict[str, list[int]] = {}
    for r in run.records:
        for name, computed in r.branches.items():
            entry = branches.setdefault(name, [0, 0])
            entry[0] += int(computed and not (r.blocks_total and r.blocks_run < r.blocks_total))
            entry[1] += 1
    acted = tuple(dict.fromkeys(r.decided_by for r in run.records if r.decided_by))
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
        work_done=sum(r.chunks_computed * (r.blocks_run / r.blocks_total if r.blocks_total else 1.0)
                      for r in run.records),
        work_total=sum(r.chunks_total for r in run.records),
    )
