"""The interceptor core: contracts, chain, per-run loop state and the caching methods.

Plain torch only; nothing here imports ComfyUI, so every piece can be tested on its own.
"""
from .adaptive import AdaptiveCache
from .base import Decider, Estimator, GuidanceDecider, Interceptor, Observer
from .cards import DiffusionFacts, ModelCard, build_card
from .chain import InterceptorChain
from .dbcache import DBCache, FirstBlockCache
from .fixed_cadence import FixedCadence
from .guidance import GuidanceCache
from .kinds import (NEGATIVE, POSITIVE, ChainError, Granularity, InterceptorError, NonFiniteOutputError, Role,
                    Signal)
from .magcache import MagCache, MagnitudeRecorder, recorded_ratios
from .observers import NaNWatch
from .planned import Plan, PlannedSchedule, Recorder, calibrate, recorded_trajectory
from .quality import Quality, image_quality, latent_psnr, latent_quality, ssim, worst_quality
from .records import BranchKey, Evaluation, Forward
from .reuse import ReuseLast
from .run import Run
from .state import LoopState, schedule_of
from .spectrum import Spectrum
from .stats import RunSummary, summarize
from .taylorseer import TaylorSeer
from .teacache import TeaCache
from .verified import VerifiedBlockCache, VerifiedForecast

__all__ = [
    "MagCache", "MagnitudeRecorder", "VerifiedBlockCache", "VerifiedForecast", "recorded_ratios", "TeaCache", "Plan", "PlannedSchedule", "Recorder", "calibrate", "recorded_trajectory", "Quality", "image_quality", "latent_psnr", "latent_quality", "ssim", "worst_quality", "AdaptiveCache", "DBCache", "FirstBlockCache", "Spectrum", "TaylorSeer", "BranchKey", "ChainError", "Decider", "Estimator", "Evaluation", "FixedCadence", "Forward", "GuidanceCache", "GuidanceDecider", "Granularity", "Signal",
    "Interceptor", "InterceptorChain", "InterceptorError", "LoopState", "ModelCard", "NaNWatch",
    "NonFiniteOutputError", "Observer", "ReuseLast", "Role", "Run", "POSITIVE", "NEGATIVE", "RunSummary", "build_card", "DiffusionFacts", "schedule_of", "summarize",
]
