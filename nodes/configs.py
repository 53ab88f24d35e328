"""Interceptor-config nodes: each appends one caching method to a chain. Pure data, no state.

Every node has the same shape (its own widgets, an optional upstream chain, a chain output), so they
are declared as data and built by :func:`config_node`. Ranges are checked by ComfyUI when the prompt is
validated; what needs several inputs (start below end, Fn + Bn against the model) is checked when the
chain is built, naming the node and the input, before any sampler runs. New widgets go at the end of a node's list:
saved workflows store widget values by position.
"""
from __future__ import annotations

from typing import Callable

from comfy_api.latest import io

from ..interceptors import (AdaptiveCache, DBCache, FirstBlockCache, FixedCadence, GuidanceCache, Interceptor, MagCache,
                            Spectrum, TaylorSeer, TeaCache, VerifiedBlockCache, VerifiedForecast)
from ..interceptors.methods import guidance as guidance_method
from ..interceptors.methods import magcache as magcache_method
from ..interceptors.methods.fixed_cadence import MAX_GROWTH as FIXED_CADENCE_MAX_GROWTH
from ..interceptors.methods import teacache as teacache_method
from .common import CONFIG_CATEGORY, PREFIX, chain_input, chain_output, extend, node_label, percent_inputs


def config_node(name: str, display_name: str, description: str, inputs: list,
                make: Callable[..., Interceptor]) -> type[io.ComfyNode]:
    """A config node class: ``make(**widget values)`` builds its interceptor."""

    class ConfigNode(io.ComfyNode):
        @classmethod
        def define_schema(cls):
            return io.Schema(node_id=f"{PREFIX}{name}", display_name=display_name, category=CONFIG_CATEGORY,
                             description=description, inputs=[*inputs, chain_input()], outputs=[chain_output()],
                             hidden=[io.Hidden.unique_id])

        @classmethod
        def execute(cls, interceptors=None, **values) -> io.NodeOutput:
            node = node_label(display_name, cls.hidden.unique_id)
            return io.NodeOutput(extend(interceptors, make(**values), node))

    ConfigNode.__name__ = ConfigNode.__qualname__ = f"{name}Node"
    return ConfigNode


def threshold_input(default: float, tooltip: str, maximum: float = 100.0, step: float = 0.01):
    return io.Float.Input("threshold", default=default, min=0.0, max=maximum, step=step, tooltip=tooltip)


def max_consecutive_input(default: int):
    return io.Int.Input("max_consecutive_cached", default=default, min=-1, max=100, tooltip=(
        "Never skip more than this many steps in a row (-1: no limit). Low values bound the error of long "
        "reuse runs."))


FixedCadenceNode = config_node(
    "FixedCadence", "Fixed Cadence",
    "Computes the model every N-th step and reuses the last computed result in between (or a TaylorSeer "
    "forecast, if one is chained). Works on every model. The FORA / TaylorSeer schedule (arXiv 2407.01425, "
    "2503.06923); with 'growth', Spectrum's growing one (arXiv 2603.01623).",
    [io.Int.Input("interval", default=2, min=1, max=100, tooltip=(
        "Compute every N-th step; 1 computes every step (no caching), 2 halves the model work.")),
     *percent_inputs(),
     io.Float.Input("growth", default=0.0, min=0.0, max=FIXED_CADENCE_MAX_GROWTH, step=0.05, optional=True, tooltip=(
         "Spectrum's growing schedule (its flex_window): after each step the cadence computes, the interval grows "
         "by this much (its whole part is used), so computed steps thin out as the image settles. 0: a fixed "
         "interval."))],
    lambda interval, start_percent, end_percent, growth=0.0: FixedCadence(
        interval=interval, start_percent=start_percent, end_percent=end_percent, growth=growth))

_DBCACHE_THRESHOLD = ("Relative L1 change of the probe blocks' residual since the last computed step under which "
                      "the middle blocks are skipped. 0 disables caching (bit-identical output). Flux: 0.08-0.2; "
                      "Wan/HunyuanVideo: 0.05-0.15.")
_WARMUP = io.Float.Input("warmup", default=0.1, min=0.0, max=1.0, step=0.01, tooltip=(
    "Fraction of the steps at the start that are always computed (the image layout is decided there)."))
_MAX_CACHED = io.Int.Input("max_cached_steps", default=-1, min=-1, max=10000, tooltip=(
    "At most this many steps skipped in the whole run (-1: no limit)."))

DBCacheNode = config_node(
    "DBCache", "DBCache",
    "Dual Block Cache (vipshop/cache-dit): the first Fn blocks always run and probe how much the step changes; "
    "the last Bn blocks always run and refine; the blocks in between are skipped while the probe's residual "
    "barely changes. Needs a model with transformer-block hooks (Flux, Wan, HunyuanVideo, Qwen-Image, SD3, ...).",
    [io.Int.Input("Fn", default=1, min=1, max=200, tooltip="Front blocks that always run; they are the probe."),
     io.Int.Input("Bn", default=0, min=0, max=200, tooltip="Back blocks that always run after the cached middle."),
     threshold_input(0.12, _DBCACHE_THRESHOLD, step=0.005),
     _WARMUP, _MAX_CACHED, max_consecutive_input(3), *percent_inputs()],
    lambda Fn, Bn, threshold, warmup, max_cached_steps, max_consecutive_cached, start_percent, end_percent: DBCache(
        front=Fn, back=Bn, threshold=threshold, warmup=warmup, max_cached_steps=max_cached_steps,
        max_consecutive_cached=max_consecutive_cached, start_percent=start_percent, end_percent=end_percent))

FirstBlockCacheNode = config_node(
    "FirstBlockCache", "First Block Cache",
    "First Block Cache (ParaAttention / WaveSpeed FBCache): block 1 always runs and probes the change; all later "
    "blocks are skipped while its residual barely changes. DBCache with Fn=1, Bn=0.",
    [threshold_input(0.12, _DBCACHE_THRESHOLD, step=0.005),
     _WARMUP, _MAX_CACHED, max_consecutive_input(3), *percent_inputs()],
    lambda threshold, warmup, max_cached_steps, max_consecutive_cached, start_percent, end_percent: FirstBlockCache(
        threshold=threshold, warmup=warmup, max_cached_steps=max_cached_steps,
        max_consecutive_cached=max_consecutive_cached, start_percent=start_percent, end_percent=end_percent))

TaylorSeerNode = config_node(
    "TaylorSeer", "TaylorSeer Forecast",
    "Forecasts skipped work instead of reusing it stale (TaylorSeer, arXiv 2503.06923): a polynomial in sigma "
    "through the last computed steps. Chain it with a caching node (DBCache, First Block Cache, Fixed Cadence, "
    "Adaptive Cache); it decides nothing by itself.",
    [io.Int.Input("order", default=1, min=0, max=2, tooltip=(
        "0 reuses the last value; 1 extrapolates linearly (recommended); 2 adds curvature (more aggressive)."))],
    lambda order: TaylorSeer(order=order))

SpectrumNode = config_node(
    "Spectrum", "Spectrum Forecast",
    "Forecasts skipped work from a global fit instead of reusing it stale (Spectrum, arXiv 2603.01623): Chebyshev "
    "polynomials in sigma fitted by ridge regression to the last computed steps, blended with TaylorSeer's local "
    "line. Keeps up to 'window' computed values per cached quantity and CFG branch (TaylorSeer keeps order + 1). "
    "Chain it with a caching node (Fixed Cadence, Adaptive Cache, DBCache, First Block Cache); it decides nothing "
    "by itself.",
    [io.Int.Input("window", default=10, min=3, max=100, tooltip=(
        "Computed steps kept and fitted, at most (each one a cached tensor: memory grows with it). At least "
        "degree + 2; until that many steps are computed the local forecast is used alone.")),
     io.Int.Input("degree", default=4, min=1, max=8, tooltip=(
         "Highest Chebyshev polynomial of the fit (the paper's m, default 4). Lower is smoother and needs fewer "
         "computed steps before it is used.")),
     io.Float.Input("ridge", default=0.1, min=0.0, max=10.0, step=0.01, tooltip=(
         "Ridge regularisation of the fit (the paper's lambda, default 0.1); 0 is a plain least-squares fit.")),
     io.Float.Input("blend", default=0.5, min=0.0, max=1.0, step=0.05, tooltip=(
         "Weight of the Chebyshev forecast against the local one (the paper's w): 1 is Chebyshev alone, 0 is "
         "TaylorSeer alone. The authors recommend 0.5-1.0, higher when more steps are skipped.")),
     io.Int.Input("order", default=1, min=0, max=2, tooltip=(
         "Order of the local forecast (TaylorSeer's): 1, a line through the last two computed steps, as the "
         "paper."))],
    lambda window, degree, ridge, blend, order: Spectrum(
        window=window, degree=degree, ridge=ridge, blend=blend, order=order))

AdaptiveCacheNode = config_node(
    "AdaptiveCache", "Adaptive Cache",
    "EasyCache-style runtime-adaptive cache (arXiv 2507.02860) at whole-model level: predicts how much the "
    "output would change from how much the input changed and skips the model while the accumulated prediction "
    "stays under the threshold. Works on every model ComfyUI can sample, without calibration.",
    [threshold_input(0.1, "Accumulated predicted output change under which steps are skipped. 0 disables "
                     "caching (bit-identical). 0.05 is cautious, 0.1 balanced, 0.2 fast."),
     max_consecutive_input(-1), *percent_inputs(0.15, 0.95)],
    lambda threshold, max_consecutive_cached, start_percent, end_percent: AdaptiveCache(
        threshold=threshold, max_consecutive_cached=max_consecutive_cached, start_percent=start_percent,
        end_percent=end_percent))

TeaCacheNode = config_node(
    "TeaCache", "TeaCache",
    "TeaCache (arXiv 2411.19108, ali-vilab/TeaCache): skips the transformer blocks while the timestep-modulated "
    "input of block 0 barely changes, rescaled by the authors' per-model polynomial. For Flux, HunyuanVideo, LTXV "
    "and Wan 2.1; other models are refused (use Adaptive Cache).",
    [threshold_input(0.4, "Accumulated rescaled change under which the blocks are skipped. Flux 0.25-0.6; "
                     "HunyuanVideo 0.1-0.15; LTXV 0.03-0.06; Wan 1.3B 0.05-0.1, 14B 0.1-0.2. 0 disables caching."),
     io.Combo.Input("model_type", options=list(teacache_method.MODEL_TYPES), tooltip=(
         "Which published polynomial to use; 'auto' picks it from the model (Wan defaults to the 1.3B fit: "
         "choose the 14B one for 14B models).")),
     *percent_inputs()],
    lambda threshold, model_type, start_percent, end_percent: TeaCache(
        threshold=threshold, model_type=model_type, start_percent=start_percent, end_percent=end_percent))


def _magcache(threshold, K, retention_ratio, model_type, custom_ratios, start_percent, end_percent):
    ratios = magcache_method.parse_ratios(custom_ratios, "MagCache") if custom_ratios.strip() else ()
    return MagCache(threshold=threshold, max_consecutive_cached=K, retention=retention_ratio, model_type=model_type,
                    ratios=ratios, start_percent=start_percent, end_percent=end_percent)


MagCacheNode = config_node(
    "MagCache", "MagCache",
    "MagCache (arXiv 2506.09045, Zehong-Ma/MagCache): skips the transformer blocks while the error predicted from "
    "the model's magnitude-ratio curve stays small. Published curves for Flux, Chroma, HunyuanVideo and Wan 2.1; "
    "for any other model run MagCache Calibrate once and use its ratios with model_type 'custom'.",
    [threshold_input(0.06, "Accumulated |1 - ratio| error under which steps are skipped. Flux 0.1-0.25; Wan 1.3B "
                     "0.12; HunyuanVideo 0.24. 0 disables caching."),
     io.Int.Input("K", default=2, min=0, max=20, tooltip="At most this many steps skipped in a row."),
     io.Float.Input("retention_ratio", default=0.2, min=0.0, max=1.0, step=0.01, tooltip=(
         "Fraction of the steps at the start that are always computed.")),
     io.Combo.Input("model_type", options=list(magcache_method.MODEL_TYPES), tooltip=(
         "Which ratio curve to use: 'auto' from the model, a published one, or 'custom' (custom_ratios).")),
     io.String.Input("custom_ratios", default="", multiline=True, tooltip=(
         "For model_type 'custom': the comma-separated ratios printed by MagCache Calibrate.")),
     *percent_inputs()],
    _magcache)

GuidanceCacheNode = config_node(
    "GuidanceCache", "Guidance Cache",
    "Computes the negative (unconditional) CFG branch only on some steps and estimates it on the others from "
    "the positive one, so those steps cost half (FasterCache's CFG-Cache, arXiv 2410.19355; Adaptive Guidance, "
    "arXiv 2312.12487). Works on every model; chain it with one step or block cache and TaylorSeer Forecast. "
    "At cfg 1 there is no negative branch: it does nothing and says so. Guiders with their own layout (DualCFG, "
    "PerpNeg) are left alone, with a note.",
    [io.Int.Input("interval", default=2, min=1, max=100, tooltip=(
        "Compute the negative branch on every N-th step the model runs (steps a chained step cache skips do not "
        "count); 1 always computes it (bit-identical to no Guidance Cache). In adaptive mode: the longest gap; in "
        "agreement mode: how often the agreement is checked again.")),
     io.Combo.Input("mode", options=list(guidance_method.MODES), tooltip=(
         "cadence: every N-th step. adaptive: skip while the predicted change of the guidance difference "
         "(negative minus positive prediction) since it was last computed stays under the threshold. agreement "
         "(Adaptive Guidance): skip once the two predictions point at the same image (1 - the cosine similarity of "
         "the denoised predictions under the threshold), checking again every N-th step.")),
     io.Float.Input("threshold", default=0.0, min=0.0, max=10.0, step=0.005, tooltip=(
         "Adaptive mode: predicted relative change of the guidance difference under which the negative branch is "
         "skipped. Agreement mode: 1 - cosine similarity of the positive and negative denoised predictions under "
         "which it is skipped (the paper's 0.99 similarity is 0.01). 0 never skips (bit-identical).")),
     io.Combo.Input("estimate", options=list(guidance_method.ESTIMATES), tooltip=(
         "What stands in for a skipped negative prediction: difference forecast = this step's positive "
         "prediction plus the guidance difference extrapolated in sigma from the last two computed steps "
         "(recommended); difference = plus the last computed difference; negative forecast / reuse = the "
         "negative prediction itself, extrapolated or reused.")),
     *percent_inputs()],
    lambda interval, mode, threshold, estimate, start_percent, end_percent: GuidanceCache(
        interval=interval, mode=mode, threshold=threshold, estimate=estimate, start_percent=start_percent,
        end_percent=end_percent))

VerifiedForecastNode = config_node(
    "VerifiedForecast", "Verified Forecast",
    "Skips the whole model while the predicted error of the forecast that replaces it stays under the threshold "
    "(forecast-then-verify, SpeCa arXiv 2509.11628, X-Slim arXiv 2512.12604). On every computed step the forecast "
    "a skip would have used is checked against what the model computed; that error, scaled by how much the input "
    "has changed since, predicts the error of the next skips. Chain TaylorSeer Forecast after it. Works on every "
    "model.",
    [threshold_input(0.05, "Predicted relative error of the forecast (mean |forecast - computed| / mean |computed| "
                     "of the model's prediction) under which a step is skipped. An error, not a change: the same "
                     "value means about the same damage on another model. 0 disables caching (bit-identical).",
                     maximum=10.0, step=0.005),
     max_consecutive_input(-1), *percent_inputs()],
    lambda threshold, max_consecutive_cached, start_percent, end_percent: VerifiedForecast(
        threshold=threshold, max_consecutive_cached=max_consecutive_cached, start_percent=start_percent,
        end_percent=end_percent))

VerifiedBlockCacheNode = config_node(
    "VerifiedBlockCache", "Verified Block Cache",
    "The probe blocks run every step and their output is forecast too; the other blocks are forecast only when the "
    "probe's forecast is close to what the probe really computed (SpeCa arXiv 2509.11628, X-Slim arXiv "
    "2512.12604). Three tiers: below 'threshold' every block after the probe is forecast; up to "
    "'refresh_ratio' times it the last Bn blocks run on the forecast middle; above, the step is computed. Chain "
    "TaylorSeer Forecast after it. Needs a model with transformer-block hooks (Flux, Wan, HunyuanVideo, ...).",
    [io.Int.Input("Fn", default=1, min=1, max=200, tooltip="Front blocks that always run; they are the probe "
                  "whose forecast is verified."),
     io.Int.Input("Bn", default=1, min=0, max=200, tooltip=(
         "Back blocks that run in the middle tier (forecast error between the two thresholds); forecast with the "
         "middle below 'threshold'. 0: no middle tier.")),
     threshold_input(0.05, "Relative error of the probe's forecast (root of sum (forecast - computed)^2 over "
                     "sum computed^2) under which every block after the probe is forecast. 0 disables caching "
                     "(bit-identical output).", maximum=10.0, step=0.005),
     io.Float.Input("refresh_ratio", default=2.0, min=1.0, max=100.0, step=0.1, tooltip=(
         "Up to this multiple of 'threshold' the back blocks are recomputed and the middle forecast (the middle "
         "tier); above it the step is computed in full. 1: no middle tier.")),
     max_consecutive_input(-1), *percent_inputs()],
    lambda Fn, Bn, threshold, refresh_ratio, max_consecutive_cached, start_percent, end_percent:
    VerifiedBlockCache(front=Fn, back=Bn, threshold=threshold, refresh_ratio=refresh_ratio,
                       max_consecutive_cached=max_consecutive_cached, start_percent=start_percent,
                       end_percent=end_percent))

CONFIG_NODES = [FixedCadenceNode, DBCacheNode, FirstBlockCacheNode, TaylorSeerNode, SpectrumNode, AdaptiveCacheNode,
                TeaCacheNode, MagCacheNode, GuidanceCacheNode, VerifiedForecastNode,
                VerifiedBlockCacheNode]
