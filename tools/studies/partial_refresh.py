"""Partial refreshes between sparse computed steps: do a few block executions buy back what whole steps cost?

On the bundled digits model (2 double + 4 single blocks, all ten digits, euler / simple, cfg 3, 28 steps) a plan
computing 5 of 28 evaluations (every 6th) meets 35 dB and 4 of 28 (every 7th) does not; 6x asks for 4.67
evaluations' work. This study fills the gap with *partial refreshes* (X-Slim's middle tier, arXiv 2512.12604):
on an evaluation the plan would forecast, the first and the last block run (1/3 of the block work) on the
forecast middle, so the model's output is computed from fresh front and back blocks instead of forecast whole.
It runs through the pack's Cached Sampler with two study-only deciders: a whole-model plan that lets the planned
evaluations through, and a block plan that runs them in full or in the middle tier. A partial step's output is
either kept as a point of the whole-model forecast (what the engine does with an output whose blocks were
partly forecast) or left out of it (an estimator that ignores the outputs at those sigmas).

It also forecasts the block stack's residuals instead of the model's output (a block plan with no front and no
back blocks: on a forecast evaluation only the embedding and the final layer run, fresh at its timestep).

Positions and pairs are chosen at the calibration seed, then measured at held-out seeds; decoded-image PSNR
against the uncached run at the same seed. Prints a markdown report.

    python3 -m cached_sampler_dev.studies.partial_refresh            # about 2 min on 2 cores
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics

from .calibration_spaces import base_prompt, capture, register_study_chains, sampling, start_study  # noqa: E402

STEPS = 28
CALIBRATION_SEED = 1
HELD_OUT = (0, 3, 100, 101)
PLANS = {"4 of 28 (every 7th)": (0, 7, 14, 21), "5 of 28 (every 6th)": (0, 6, 12, 18, 24)}
SIGMAS: dict[int, float] = {}  # evaluation index -> sigma, recorded by the plan's first run


def study_classes(ic):
    """The study's deciders and estimator, built on the pack's classes as loaded by ComfyUI."""
    Granularity = ic.kinds.Granularity

    @dataclasses.dataclass(frozen=True)
    class WholePlan(ic.base.Decider):
        """Computes the evaluations ``compute`` names (the block plan decides how much of each runs)."""
        declaration = ic.base.Decider.declaration.but(
            kind="study_whole_plan",
            display_name="Study plan",
            granularity=Granularity.MODEL,
            forces_last_step=False,
        )
        compute: tuple = ()

        def decide(self, run, ev, signals, measured):
            SIGMAS.setdefault(ev.index, ev.sigma)
            return ev.index in self.compute

    @dataclasses.dataclass(frozen=True)
    class BlockPlan(ic.VerifiedBlockCache):
        """Runs ``full`` in full and ``partial`` in the middle tier (front and back blocks on the forecast middle);
        with ``alone`` it is the only decider and forecasts every other evaluation's blocks."""
        declaration = ic.VerifiedBlockCache.declaration.but(
            kind="study_block_plan",
            display_name="Study tiers",
            forces_last_step=False,
        )
        full: tuple = ()
        partial: tuple = ()
        alone: bool = False
        threshold: float = 0.0  # no probe forecast is kept or checked

        def validate(self) -> None:  # Fn 0 is allowed here: the study forecasts the whole block stack
            pass

        def measure(self, run, ev, signals):
            return []

        def decide(self, run, ev, signals, measured):
            SIGMAS.setdefault(ev.index, ev.sigma)
            state = run.state_of(self)
            if self.alone and ev.index not in self.full:
                state.tier = 1 if ev.index in self.partial else 0
            else:
                state.tier = 1 if ev.index in self.partial else 2
            return state.tier == 2

    @dataclasses.dataclass(frozen=True)
    class Forecast(ic.TaylorSeer):
        """TaylorSeer that keeps no point at the sigmas in ``ignore`` (the partial steps' outputs)."""
        declaration = ic.TaylorSeer.declaration.but(kind="study_taylorseer")
        ignore: tuple = ()

        def observe(self, slot, value, sigma):
            if not any(ic.taylorseer.same_sigma(sigma, s) for s in self.ignore):
                super().observe(slot, value, sigma)

    return WholePlan, BlockPlan, Forecast


class Study:
    def __init__(self):
        self.app, self.ic, self.decode = start_study("digits")
        self.executor = self.app.executor()
        self.whole, self.blocks, self.forecast = study_classes(self.ic)
        self.chains: dict[str, object] = {}
        self.references: dict[int, object] = {}
        register_study_chains(self.app, self.chains)

    def chain(self, full, partial=(), kept=True, stack=False):
        if stack:  # the block stack forecast whole: no front, no back blocks
            items = [self.blocks(front=0, back=0, full=tuple(full), alone=True)]
        else:
            items = [self.whole(compute=tuple(sorted(set(full) | set(partial))))]
            if partial:
                items.append(self.blocks(full=tuple(full), partial=tuple(partial)))
        ignore = () if kept else tuple(SIGMAS[i] for i in partial)
        items.append(self.forecast(order=1, ignore=ignore))
        return self.ic.InterceptorChain.of(items)

    def psnr(self, seed: int, settings: dict) -> dict:
        """name -> (decoded-image PSNR at ``seed``, work share of the uncached run)."""
        from ..support.tiny_nodes import CAPTURED

        class Args:
            steps = STEPS
        prompt = base_prompt("digits")
        del prompt["vae"]
        if seed not in self.references:
            prompt["plain"] = {"class_type": "KSampler", "inputs": sampling(Args, seed)}
            capture(prompt, "plain", f"plain{seed}")
        nodes = {}
        for name, chain in settings.items():
            key = f"{len(self.chains)}"
            self.chains[key] = chain
            node = f"n{key}"
            prompt[f"{node}c"] = {"class_type": "ToolStudyChain", "inputs": {"key": key}}
            prompt[node] = {"class_type": "CachedSampler", "inputs": {**sampling(Args, seed), "interceptors": [f"{node}c", 0]}}
            capture(prompt, node, f"{key}@{seed}")
            nodes[name] = (node, key)
        _, ui = self.app.run(prompt, self.executor)
        if seed not in self.references:
            self.references[seed] = self.decode(CAPTURED[f"plain{seed}"])
        out = {}
        for name, (node, key) in nodes.items():
            work = 1 - ui[node]["cached_sampler"][0]["runs"][0]["work_saved"]
            out[name] = (self.ic.image_quality(self.references[seed], self.decode(CAPTURED[f"{key}@{seed}"])).psnr, work)
        return out


def held_out(study: Study, chain) -> tuple[float, float]:
    values = [study.psnr(s, {"x": chain})["x"][0] for s in HELD_OUT]
    return statistics.mean(values), min(values)


def main(argv=None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    import torch
    torch.set_num_threads(1)
    study = Study()
    study.psnr(CALIBRATION_SEED, {"record sigmas": study.chain(PLANS["4 of 28 (every 7th)"])})

    print("# Partial refreshes between sparse computed steps\n")
    print(f"Digits model (2 double + 4 single blocks), 28 steps, euler / simple, cfg 3, TaylorSeer order 1; decoded-image "
          f"PSNR against the uncached run at the same seed, *mean / worst* over the held-out seeds "
          f"{', '.join(map(str, HELD_OUT))}. A partial refresh runs the first and the last block on the forecast "
          f"middle (1/3 of a step's block work). Positions are chosen at seed {CALIBRATION_SEED}; *change at seed "
          f"{CALIBRATION_SEED}* is the range over every position a plan forecasts. Work = block executions x batch "
          f"rows, as a share of the uncached run.\n")
    by_position = []
    print("| plan | partial step's output | refreshed at | work | reduction | PSNR (held out) | change at seed 1 |")
    print("|---|---|---|---|---|---|---|")
    for label, full in PLANS.items():
        base = study.psnr(CALIBRATION_SEED, {"base": study.chain(full)})["base"][0]
        mean, worst = held_out(study, study.chain(full))
        work = len(full) / STEPS
        print(f"| {label} | | none | {work:.3f} | {1 / work:.2f}x | {mean:.2f} / {worst:.2f} | |")
        for kept in (True, False):
            words = "kept by the forecast" if kept else "left out of the forecast"
            free = [p for p in range(STEPS) if p not in full]
            singles = study.psnr(CALIBRATION_SEED, {p: study.chain(full, (p,), kept) for p in free})
            changes = [v[0] - base for v in singles.values()]
            by_position.append(f"{label}, {words}: " + ", ".join(
                f"{p + 1}: {singles[p][0] - base:+.1f}" for p in free))
            best = max(free, key=lambda p: singles[p][0])
            chosen = [(best,)]
            if len(full) == 4:  # a second refresh, the best beside the first: 4 + 2/3 evaluations, 6.0x
                pairs = study.psnr(CALIBRATION_SEED, {p: study.chain(full, tuple(sorted((best, p))), kept)
                                                      for p in free if p != best})
                chosen.append(tuple(sorted((best, max(pairs, key=lambda p: pairs[p][0])))))
            for partial in chosen:
                chain = study.chain(full, partial, kept)
                mean, worst = held_out(study, chain)
                work = study.psnr(CALIBRATION_SEED, {"w": chain})["w"][1]
                where = ", ".join(str(p + 1) for p in partial)
                span = f"{min(changes):+.2f} to {max(changes):+.2f} dB" if len(partial) == 1 else ""
                print(f"| {label} | {words} | step {where} | {work:.3f} | {1 / work:.2f}x | {mean:.2f} / {worst:.2f} | {span} |")

    print(f"\nChange at seed {CALIBRATION_SEED} by the step refreshed (dB):\n")
    for line in by_position:
        print(f"* {line}")
    print("\nThe block stack's residuals forecast instead of the model's output (no front or back blocks: on a forecast "
          "evaluation the embedding and the final layer run, fresh at its timestep), the same plans:\n")
    print("| plan | forecast of | PSNR (held out) |")
    print("|---|---|---|")
    for label, full in PLANS.items():
        for words, stack in (("the model's output (the pack's)", False), ("the block stack's residuals", True)):
            mean, worst = held_out(study, study.chain(full, stack=stack))
            print(f"| {label} | {words} | {mean:.2f} / {worst:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
