"""Cache-aware schedule alignment: the sigmas a budget plan steps through, moved to suit the plan.

BudCache (Lei et al., ICML 2026, arXiv 2606.13496) fixes the number of computed evaluations, searches which ones
offline, and then, for tight budgets, adapts the time discretization to the chosen plan: skipping steps makes the
cached trajectory drift from the full one, and different timesteps for the computed steps can steer it back. They
refine the timesteps by a lightweight, data-free distillation (the full run from the same noise as teacher, the
cached run with adjustable timesteps as student). Here the same idea is a derivative-free search, which needs
nothing of the model but sampling runs: a coordinate search over the computed steps' sigmas, each moved towards one of its neighbouring
computed steps by a fraction of the gap, the skipped steps between re-spaced with it (each keeps its place between
the computed steps around it, as in the run's own schedule). Every candidate is judged by a real cached run's final
PSNR against the uncached run (the caller's ``measure``, over its seeds, the worst seed), a move is kept only when
it raises that PSNR, and the number of rounds is fixed, so the cost is bounded in advance
(:func:`alignment_runs`) and the result is never worse than the plain schedule on the seeds measured.

The first sigma (the noise level the run starts from) and the last (where it ends) never move, and the schedule
stays strictly decreasing.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

from .taylorseer import same_sigma

# the fractions of the gap to a neighbouring computed step a computed step's sigma is moved by, one per round:
# coarse, then fine
ALIGN_FRACTIONS = (0.3, 0.1)


def respaced(schedule: Sequence[float], anchors: dict[int, float]) -> tuple[float, ...]:
    """``schedule`` (the run's sigmas, the last one where it ends) with the sigmas of the steps in ``anchors`` set
    as given and every other sigma re-spaced between the anchored ones around it, keeping its fraction of the
    original gap. The first and last sigma are always kept."""
    n = len(schedule) - 1
    nodes = {0: float(schedule[0]), n: float(schedule[n])}
    nodes.update({k: float(v) for k, v in anchors.items() if 0 < k < n})
    keys = sorted(nodes)
    out = list(map(float, schedule))
    for a, b in zip(keys, keys[1:]):
        if nodes[a] == schedule[a] and nodes[b] == schedule[b]:
            continue  # neither end moved: the run's own sigmas, exactly
        span = schedule[b] - schedule[a]
        for j in range(a + 1, b):
            fraction = (schedule[j] - schedule[a]) / span if span else (j - a) / (b - a)
            out[j] = nodes[a] + (nodes[b] - nodes[a]) * fraction
        out[b] = nodes[b]
    return tuple(out)


def alignment_runs(budget: int, rounds: int = len(ALIGN_FRACTIONS)) -> int:
    """The most candidate schedules :func:`align` measures for a plan of ``budget`` computed steps (the first
    never moves): two directions per movable step per round."""
    return 2 * max(budget - 1, 0) * rounds


@dataclasses.dataclass(frozen=True)
class Alignment:
    schedule: tuple[float, ...]  # the sigmas to sample through (the plain schedule where no move helped)
    quality: object              # what ``measure`` returned for it (has .psnr)
    runs: int                    # candidate schedules measured (sampling runs per seed)
    moved: bool                  # whether any sigma moved


def align(schedule: Sequence[float], compute: Sequence[int], measure, plain_quality,
          fractions: Sequence[float] = ALIGN_FRACTIONS) -> Alignment:
    """Coordinate search over the sigmas of the computed steps ``compute`` (of ``schedule``, the run's sigmas):
    each round, each computed step but the first in turn is moved by ``fraction`` of the gap towards the computed
    step before it (a higher sigma), then towards the one after it (or the end), and the first move whose
    ``measure(schedule) -> quality`` beats the best PSNR so far is kept. ``plain_quality``: the plan's measured
    quality on the plain schedule, the one to beat."""
    n = len(schedule) - 1
    movable = sorted(k for k in set(compute) if 0 < k < n)
    anchors = {k: float(schedule[k]) for k in movable}
    best, best_schedule, runs = plain_quality, tuple(map(float, schedule)), 0
    for fraction in fractions:
        for k in movable:
            index = movable.index(k)
            before = anchors[movable[index - 1]] if index > 0 else float(schedule[0])
            after = anchors[movable[index + 1]] if index + 1 < len(movable) else float(schedule[n])
            for neighbour in (before, after):
                trial = {**anchors, k: anchors[k] + fraction * (neighbour - anchors[k])}
                candidate = respaced(schedule, trial)
                quality = measure(candidate)
                runs += 1
                if quality.psnr > best.psnr:
                    best, best_schedule, anchors = quality, candidate, trial
                    break
    return Alignment(best_schedule, best, runs, best_schedule != tuple(map(float, schedule)))


def valid_alignment(schedule: Sequence[float], aligned: Sequence[float]) -> str | None:
    """Why ``aligned`` cannot replace ``schedule`` (None when it can): the same length, the same first and last
    sigma, strictly decreasing."""
    if len(aligned) != len(schedule):
        return f"the aligned schedule has {len(aligned)} sigmas, the run's {len(schedule)}"
    if aligned and (abs(aligned[0] - schedule[0]) > 1e-6 or abs(aligned[-1] - schedule[-1]) > 1e-6):
        return "the aligned schedule must start and end where the run's does"
    if any(b >= a for a, b in zip(aligned, aligned[1:])):
        return "the aligned schedule's sigmas must decrease strictly"
    return None


def why_not_aligned(target: str, sigmas, schedule) -> str | None:
    """Why a plan's sigmas cannot be aligned (None when they can): only a 'budget' plan (a 'quality' plan's
    budget is what the search lowers), of a sampler that evaluates the model once per step at its sigmas."""
    if target != "budget":
        return "alignment is for the 'budget' target"
    if len(sigmas) != len(schedule) - 1 or not all(same_sigma(a, b) for a, b in zip(sigmas, schedule)):
        return "this sampler evaluates the model other than once per step at the schedule's sigmas"
    return None
