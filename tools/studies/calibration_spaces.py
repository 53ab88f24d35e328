"""Auto Calibrate judged on latents or on decoded images: what each plan saves and the image PSNR it gives.

On the bundled digits model (all ten digits, euler / simple, cfg 3), through ComfyUI's executor as the
tests run it: for each PSNR target, Auto Calibrate makes a plan at the calibration seed without a VAE
(latent PSNR), with the model's VAE (image PSNR) and with the VAE on several seeds; each plan then runs in
a Cached Sampler at the calibration seed and at held-out seeds, and its decoded digits are compared with
the uncached ones. Prints a markdown report: work saved, the image PSNR each plan really gives, the gap
between latent and image PSNR, the seed-to-seed spread, and what the decodes cost.

    python3 -m cached_sampler_dev.studies.calibration_spaces   # 28 steps, targets 35 and 40 dB (about 20 min on 2 cores)
    python3 -m cached_sampler_dev.studies.calibration_spaces --steps 12 --targets 35 --eval-seeds 2   # a quick check
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

from ..devkit.comfy_harness import start

DECODES = {"count": 0, "seconds": 0.0}
HELD_OUT_FROM = 100


class TimedVAE:
    """Passes the VAE on, counting its decodes and the time they take (the decode cost of a calibration)."""

    def __init__(self, vae):
        self.vae = vae

    def decode(self, samples):
        started = time.perf_counter()
        images = self.vae.decode(samples)
        DECODES["count"] += 1
        DECODES["seconds"] += time.perf_counter() - started
        return images


class TimedVAENode:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"vae": ("VAE",)}}

    RETURN_TYPES = ("VAE",)
    FUNCTION = "wrap"
    CATEGORY = "testing"

    def wrap(self, vae):
        return (TimedVAE(vae),)


MODELS = {  # the bundled models a study can run on: the node that loads one, and its module
    "digits": ({"class_type": "CachedSamplerDigitsModel", "inputs": {"digits": "0123456789"}}, "nodes.demo_models.digits"),
    "video": ({"class_type": "CachedSamplerVideoModel", "inputs": {"classes": "01234567"}}, "nodes.demo_models.video"),
    "photos": ({"class_type": "CachedSamplerPhotosModel", "inputs": {"classes": "01234567"}}, "nodes.demo_models.photos"),
}


def register_study_chains(app, chains: dict) -> None:
    """Register the study's chain node, ``ToolStudyChain``: its ``key`` input names the chain of ``chains`` (filled
    by the study before each prompt) it outputs, so a prompt can use chains the config nodes cannot express."""

    class StudyChain:
        @classmethod
        def INPUT_TYPES(cls):
            return {"required": {"key": ("STRING", {"default": ""})}}

        RETURN_TYPES = ("CACHED_SAMPLER_CHAIN",)
        FUNCTION = "chain"
        CATEGORY = "testing"

        def chain(self, key):
            return (chains[key],)

    app.nodes.NODE_CLASS_MAPPINGS["ToolStudyChain"] = StudyChain


def start_study(model: str = "digits"):
    """A headless ComfyUI with the pack and the timed VAE node, quiet progress bars; (the app, the pack's
    interceptors module, the bundled ``model``'s decoder)."""
    app = start(quiet=True)
    app.nodes.NODE_CLASS_MAPPINGS["ToolTimedVAE"] = TimedVAENode
    import comfy.utils
    comfy.utils.PROGRESS_BAR_ENABLED = False
    return app, app.module("interceptors"), app.module(MODELS[model][1]).decode


def sampling(args, seed: int) -> dict:
    return {"model": ["source", 0], "seed": seed, "steps": args.steps, "cfg": 3.0, "sampler_name": "euler",
            "scheduler": "simple", "positive": ["source", 1], "negative": ["source", 2],
            "latent_image": ["source", 3], "denoise": 1.0}


def base_prompt(model: str = "digits") -> dict:
    """The bundled ``model`` (node ``source``: model, positive, negative, latent, VAE) and its timed VAE."""
    return {"source": MODELS[model][0], "vae": {"class_type": "ToolTimedVAE", "inputs": {"vae": ["source", 4]}}}


def capture(prompt: dict, node: str, key: str, output: int = 0) -> None:
    prompt[f"capture_{key}"] = {"class_type": "TestCaptureLatent", "inputs": {"samples": [node, output], "key": key}}


def run_plan(app, executor, args, target: float, vae: bool, seeds: int, eval_seeds: list[int],
             leave_negative_out: bool = False) -> dict:
    """Calibrate once (timed, decodes counted), then sample the plan at every evaluation seed. ``work_saved`` is
    the sampled run's own count, which a negative branch left out (half a step's work) moves too."""
    from ..support.tiny_nodes import CAPTURED
    calibration = {"class_type": "CachedSamplerAutoCalibrate", "inputs": {
        **sampling(args, args.seed), "target": "quality", "min_psnr": target, "budget": 8, "order": 1,
        "seeds": seeds, **({"vae": ["vae", 0]} if vae else {}),
        **({"negative_branch": "left out where the target holds"} if leave_negative_out else {})}}
    prompt = base_prompt(getattr(args, "model", "digits")) | {"calibrate": calibration}
    capture(prompt, "calibrate", "calibration_uncached", output=1)
    DECODES.update(count=0, seconds=0.0)
    started = time.perf_counter()
    _, ui = app.run(prompt, executor)
    seconds = time.perf_counter() - started
    decodes = dict(DECODES)
    for seed in eval_seeds:  # the calibration node is cached by the executor: these prompts only sample
        prompt[f"sampler{seed}"] = {"class_type": "CachedSampler", "inputs": {
            **sampling(args, seed), "interceptors": ["calibrate", 0]}}
        capture(prompt, f"sampler{seed}", f"cached{seed}")
    _, sampled = app.run(prompt, executor)
    text = ui["calibrate"]["text"][0]
    computed, evaluations = (int(v) for v in text.split("compute ")[1].split(" ")[0].split("/"))
    work_saved = sampled[f"sampler{eval_seeds[0]}"]["cached_sampler"][0]["runs"][0]["work_saved"]
    return {"target": target, "space": "image" if vae else "latent", "seeds": seeds, "text": text,
            "work_saved": work_saved, "computed": computed, "evaluations": evaluations,
            "seconds": seconds, "decodes": decodes["count"], "decode_seconds": decodes["seconds"],
            "cached": {seed: CAPTURED[f"cached{seed}"] for seed in eval_seeds}}


def uncached_latents(app, executor, args, eval_seeds: list[int]) -> dict:
    from ..support.tiny_nodes import CAPTURED
    prompt = base_prompt()
    for seed in eval_seeds:
        prompt[f"plain{seed}"] = {"class_type": "KSampler", "inputs": sampling(args, seed)}
        capture(prompt, f"plain{seed}", f"plain{seed}")
    del prompt["vae"]
    app.run(prompt, executor)
    return {seed: CAPTURED[f"plain{seed}"] for seed in eval_seeds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=28)
    parser.add_argument("--targets", type=float, nargs="+", default=[35.0, 40.0], help="min_psnr values (dB)")
    parser.add_argument("--seed", type=int, default=1, help="the seed plans are calibrated at")
    parser.add_argument("--eval-seeds", type=int, default=8, help="how many held-out seeds (100, 101, ...) the "
                        "plans are measured at too")
    parser.add_argument("--confirm-seeds", type=int, nargs="+", default=[3, 6], help="'seeds' of the multi-seed "
                        "image plans")
    args = parser.parse_args(argv)

    app, ic, decode = start_study()
    held_out = list(range(HELD_OUT_FROM, HELD_OUT_FROM + args.eval_seeds))  # apart from any seed calibrated on
    eval_seeds = [args.seed, *held_out]
    executor = app.executor()
    plain = uncached_latents(app, executor, args, eval_seeds)

    rows = []
    for target in args.targets:
        for vae, seeds in ((False, 1), (True, 1), *((True, n) for n in args.confirm_seeds)):
            row = run_plan(app, executor, args, target, vae, seeds, eval_seeds)
            row["image_psnr"] = {s: ic.image_quality(decode(plain[s]), decode(row["cached"][s])).psnr
                                 for s in eval_seeds}
            row["latent_psnr"] = {s: ic.latent_psnr(plain[s], row["cached"][s]) for s in eval_seeds}
            rows.append(row)
            print(f"[{target} dB, {row['space']}, seeds {seeds}] {row['text']}", file=sys.stderr, flush=True)

    print(f"Auto Calibrate on the bundled digits model: {args.steps} steps, euler / simple, cfg 3, all ten digits; "
          f"plans made at seed {args.seed}, measured there and at {len(held_out)} held-out seeds "
          f"({', '.join(map(str, held_out))}). Image PSNR: the decoded digits against the uncached "
          f"ones (0..1).\n")
    print("| target | measured on | seeds | computed | work saved | image PSNR at the calibration seed | "
          "held-out image PSNR: worst / mean / best | held-out seeds meeting the target in images |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        held = [r["image_psnr"][s] for s in held_out]
        print(f"| {r['target']:g} dB | {r['space']} | {r['seeds']} | {r['computed']}/{r['evaluations']} | "
              f"{r['work_saved']:.0%} | {r['image_psnr'][args.seed]:.1f} dB | "
              f"{min(held):.1f} / {statistics.mean(held):.1f} / {max(held):.1f} dB | "
              f"{sum(v >= r['target'] for v in held)}/{len(held)} |")
    gaps = [r["latent_psnr"][s] - r["image_psnr"][s] for r in rows for s in eval_seeds]
    print(f"\nLatent PSNR minus image PSNR, same runs: mean {statistics.mean(gaps):.1f} dB "
          f"(from {min(gaps):.1f} to {max(gaps):.1f}).")
    spreads = [max(r["image_psnr"].values()) - min(r["image_psnr"].values()) for r in rows]
    print(f"Seed-to-seed spread of a plan's image PSNR over the {len(eval_seeds)} seeds: "
          f"{min(spreads):.1f} to {max(spreads):.1f} dB (max - min per plan).")
    for r in rows:
        if r["decodes"]:
            print(f"Decodes, {r['target']:g} dB, seeds {r['seeds']}: {r['decodes']} taking "
                  f"{r['decode_seconds'] * 1e3:.0f} ms of a {r['seconds']:.1f} s calibration ({r['decode_seconds'] / r['seconds']:.2%}).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
