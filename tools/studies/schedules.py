"""Where the computed steps go: Spectrum's schedule against the pack's growing cadence and even spacing, at equal work.

On a natural-image model (a plain euler loop, 28 steps, TaylorSeer order 1, 8 of 28 steps computed) Spectrum's
schedule (arXiv 2603.01623: three computed steps first, then gaps of 2, 3, 4, 5, 6, steps 0, 1, 2, 4, 7, 11, 16, 22,
*the last step forecast*) read 34.4 / 32.9 dB (decoded PSNR, mean / worst of 4 seeds), the same steps with the last
computed instead of step 22 32.7 / 31.9 dB, the growing cadence with one more early step 29.0 / 26.6 dB and three
warm-up steps then even spacing with the last 24.2 / 22.3 dB. This study measures the same comparison on the
bundled models, through ComfyUI's executor and the pack's Cached Sampler: every schedule computes the same number of
steps, the others forecast by TaylorSeer order 1. The schedules that Fixed Cadence's settings give are its own
(``warmup_steps``, ``growth``, ``growth_ratio`` and ``last_step``); the others are plans of exactly the steps listed.
Decoded-image PSNR against the uncached run at the same seed. Prints a markdown report.

    nice -n 5 python3 -m cached_sampler_dev.studies.schedules       # digits and video models (about 9 min on 2 cores)
    nice -n 5 python3 -m cached_sampler_dev.studies.schedules --model digits # one model (a model of calibration_spaces.MODELS)
"""
from __future__ import annotations

import argparse
import dataclasses
import statistics


from .calibration_spaces import MODELS, base_prompt, capture, register_study_chains, sampling, start_study  # noqa: E402

STEPS = 28  # cfg 3, euler / simple: calibration_spaces.sampling, as the bench
BUDGETS = (8, 12)  # computed steps of 28: Spectrum's 8 (3.5x), and a gentler 12 (2.3x)
GRID = [k / 20 for k in range(0, 201)]  # Fixed Cadence's growth and growth_ratio are searched on its 0.05 grid


def schedules(ic, budget: int) -> dict[str, object]:
    """label -> the decider of each schedule, all computing ``budget`` of ``STEPS`` steps. Each family's setting is
    the smallest growth that gives the budget, so that its computed steps reach furthest; at 8 of 28 that is
    Spectrum's own (growth 1)."""

    @dataclasses.dataclass(frozen=True)
    class Steps(ic.base.Decider):
        """Computes exactly the steps ``compute`` names (its ``last_step`` "forecast": the plan says)."""
        declaration = ic.base.Decider.declaration.but(kind="study_steps", display_name="Study steps",
                                                      granularity=ic.kinds.Granularity.MODEL)
        compute: tuple = ()
        last_step: str = "forecast"

        def decide(self, run, ev, signals, measured):
            return ev.index in self.compute

    def smallest(make, values):
        return next(c for c in (make(v) for v in values) if len(c.computed_steps(STEPS)) == budget)

    spectrum = smallest(lambda g: ic.FixedCadence(interval=2, growth=g, warmup_steps=3, last_step="forecast"), GRID)
    spectrum_steps = spectrum.computed_steps(STEPS)
    if budget == 8:
        assert spectrum_steps == (0, 1, 2, 4, 7, 11, 16, 22), spectrum_steps
    geometric = smallest(lambda r: ic.FixedCadence(interval=2, growth_ratio=r, warmup_steps=3, last_step="forecast"),
                         [r for r in GRID if r >= 1.0])
    growing = smallest(lambda w: smallest(lambda g: ic.FixedCadence(interval=2, growth=g, warmup_steps=w), GRID),
                       range(0, budget))
    even = [c for c in (ic.FixedCadence(interval=k) for k in range(1, STEPS)) if len(c.computed_steps(STEPS)) == budget]
    rows = {
        f"warm-up 3, growing gaps, the last forecast (Spectrum's at 8: `warmup_steps` 3, `interval` 2, `growth` "
        f"{spectrum.growth:g}, `last_step` forecast)": spectrum,
        f"the same, the last step computed instead of step {spectrum_steps[-1]}":
            Steps(compute=spectrum_steps[:-1] + (STEPS - 1,)),
        f"warm-up 3, geometric gaps, the last forecast (`warmup_steps` 3, `interval` 2, `growth_ratio` "
        f"{geometric.growth_ratio:g}, `last_step` forecast)": geometric,
        f"the growing cadence, the last computed (`warmup_steps` {growing.warmup_steps}, `interval` 2, `growth` "
        f"{growing.growth:g})": growing,
        **({"the growing cadence at `growth` 1 with one more early step, the last computed (`warmup_steps` 2, "
            "`interval` 2, `growth` 1)": ic.FixedCadence(interval=2, growth=1.0, warmup_steps=2)}
           if budget == 8 else {}),
        **({f"even spacing with the last computed (`interval` {even[0].interval})": even[0]} if even else {}),
        "warm-up 3, then even spacing with the last computed": Steps(compute=ic.methods.planned.uniform_plan(STEPS, budget, 3)),
        "even spacing from the first, the last forecast":
            Steps(compute=ic.methods.schedule_search.front_loaded(STEPS, budget, 1.0)),
    }
    for label, decider in rows.items():
        assert len(computed_steps(decider)) == budget, (label, computed_steps(decider))
    return rows


def computed_steps(decider) -> tuple[int, ...]:
    return decider.compute if hasattr(decider, "compute") else decider.computed_steps(STEPS)


class Study:
    """One model through the executor: a KSampler reference and a Cached Sampler per schedule, per seed."""

    def __init__(self, app, ic, model: str):
        self.app, self.ic, self.model = app, ic, model
        self.decode = app.module(MODELS[model][1]).decode
        self.executor = app.executor()
        self.chains: dict[str, object] = {}
        register_study_chains(app, self.chains)

    def run(self, seed: int, deciders: dict) -> dict:
        """label -> (decoded-image PSNR at ``seed``, steps computed), every schedule in one prompt."""
        from ..support.tiny_nodes import CAPTURED

        class Args:
            steps = STEPS
        prompt = base_prompt(self.model)
        del prompt["vae"]
        prompt["plain"] = {"class_type": "KSampler", "inputs": sampling(Args, seed)}
        capture(prompt, "plain", f"plain@{seed}")
        nodes = {}
        for label, decider in deciders.items():
            key = f"{self.model}{len(self.chains)}"
            self.chains[key] = self.ic.InterceptorChain.of([decider, self.ic.TaylorSeer(order=1)])
            prompt[f"{key}c"] = {"class_type": "ToolStudyChain", "inputs": {"key": key}}
            prompt[key] = {"class_type": "CachedSampler", "inputs": {**sampling(Args, seed),
                                                                    "interceptors": [f"{key}c", 0]}}
            capture(prompt, key, f"{key}@{seed}")
            nodes[label] = key
        _, ui = self.app.run(prompt, self.executor)
        reference = self.decode(CAPTURED[f"plain@{seed}"])
        out = {}
        for label, key in nodes.items():
            psnr = self.ic.image_quality(reference, self.decode(CAPTURED[f"{key}@{seed}"])).psnr
            out[label] = (psnr, ui[key]["cached_sampler"][0]["runs"][0]["computed"])
        return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", choices=sorted(MODELS),
                        help="the model to measure (repeat for several; default: digits and video)")
    parser.add_argument("--seeds", type=int, default=4, help="seeds 0 .. N-1 (default 4)")
    args = parser.parse_args(argv)
    import torch
    torch.set_num_threads(1)
    app, ic, _ = start_study()
    seeds = list(range(args.seeds))
    print("# Where the computed steps go\n")
    print(f"The same number of computed steps (the same work) placed differently, {STEPS} steps, euler / simple, "
          f"cfg 3, the other steps forecast by TaylorSeer order 1, through the pack's Cached Sampler. Decoded-image "
          f"PSNR against the uncached run at the same seed, *mean / worst* over seeds {', '.join(map(str, seeds))}. "
          f"Steps counted from 0; the last is {STEPS - 1}. Each family's setting is the smallest growth that gives "
          f"the budget.\n")
    for model in args.model or ["digits", "video"]:
        study = Study(app, ic, model)
        print(f"## {model} model\n")
        for budget in BUDGETS:
            rows = schedules(ic, budget)
            results = [study.run(seed, rows) for seed in seeds]
            print(f"{budget} of {STEPS} steps computed:\n")
            print("| schedule | steps computed | PSNR (dB) |")
            print("|---|---|---|")
            for label, decider in rows.items():
                counts = {r[label][1] for r in results}
                assert counts == {budget}, (label, counts)  # the run computed what the schedule says
                values = [r[label][0] for r in results]
                print(f"| {label} | {', '.join(map(str, computed_steps(decider)))} | "
                      f"{statistics.mean(values):.2f} / {min(values):.2f} |", flush=True)
            print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
