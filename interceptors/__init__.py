"""The interceptor core: contracts, chain, per-run loop state, and the caching methods (``methods/``, one module
each, re-exported here).

Plain torch only; nothing here imports ComfyUI, so every piece can be tested on its own.
"""
from .methods.adaptive import AdaptiveCache
from .base import Declaration, Decider, Estimator, GuidanceDecider, Interceptor, Observer
from .cards import DiffusionFacts, ModelCard, build_card
from .chain import InterceptorChain
from .methods.dbcache import DBCache, FirstBlockCache
from .methods.partial_last_step import PartialLastStep
from .methods.fixed_cadence import FixedCadence
from .methods.guidance import GuidanceCache
from .kinds import (NEGATIVE, POSITIVE, Anchor, Cached, ChainError, Granularity, InterceptorError,
                    NonFiniteOutputError, Role, Signal)
from .methods.magcache import MagCache, MagnitudeRecorder, recorded_ratios
from .observers import NaNWatch
from .methods.planned import Plan, PlannedSchedule, Recorder, calibrate, recorded_trajectory
from .quality import Quality, image_quality, latent_psnr, latent_quality, seed_margin, ssim, worst_quality
from .records import BranchKey, Evaluation, Forward
from .reuse import ReuseLast
from .run import Run
from .state import LoopState, schedule_of
from .methods.spectrum import Spectrum
from .stats import RunSummary, summarize
from .methods.taylorseer import TaylorSeer
from .methods.teacache import TeaCache
from .methods.verified import VerifiedBlockCache, VerifiedForecast

__all__ = [
    "MagCache", "MagnitudeRecorder", "VerifiedBlockCache", "VerifiedForecast", "recorded_ratios", "TeaCache", "Plan", "PlannedSchedule", "Recorder", "calibrate", "recorded_trajectory", "Quality", "image_quality", "latent_psnr", "latent_quality", "ssim", "worst_quality", "seed_margin", "AdaptiveCache", "DBCache", "FirstBlockCache", "PartialLastStep", "Spectrum", "TaylorSeer", "BranchKey", "ChainError", "Decider", "Estimator", "Evaluation", "FixedCadence", "Forward", "GuidanceCache", "GuidanceDecider", "Granularity", "Signal", "Anchor", "Cached", "Declaration",
    "Interceptor", "InterceptorChain", "InterceptorError", "LoopState", "ModelCard", "NaNWatch",
    "NonFiniteOutputError", "Observer", "ReuseLast", "Role", "Run", "POSITIVE", "NEGATIVE", "RunSummary", "build_card", "DiffusionFacts", "schedule_of", "summarize",
]
