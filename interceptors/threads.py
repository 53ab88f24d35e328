"""One decision per evaluation among the devices' threads of ComfyUI's native multi-GPU path.

There the rows of one evaluation (its CFG branches, or batch rows) run on several devices at once, one thread
each, and every thread reaches the same run. A decider that measures what the model computes sees only its own
thread's rows in a call. So, as the ranks of a :class:`~.distributed.RankGroup` sum their measures before the
ratio, the threads of an evaluation meet (:meth:`DeviceThreads.decide`): each measures its rows and hands over
its measures' sums, the last to arrive adds them up (:func:`~.metrics.combined`: numerator and denominator sums,
in the order of the rows' branches, not of arrival) and takes the one decision, and every thread follows it. The
decider's rule runs once, on the whole evaluation's signals, as on one device; caches stay per branch.

Nothing waits for ever: a thread waits for the others at most ``wait_s`` (:data:`WAIT_ENV`, else
:data:`DEFAULT_WAIT_S`), after which the run is switched off with a note and every thread computes; so does a run
whose evaluation's number of threads the adapter could not tell (:meth:`DeviceThreads.expect`).
"""
from __future__ import annotations

import math
import os
import threading

from .base import Decider
from .metrics import combined_each, deliver, terms_of

# Every measuring decider of the pack declares ``gathers_over_threads``. DBCache, First Block Cache, TeaCache,
# Adaptive Cache and the Verified Forecast measure ratios of sums over rows, added up over the threads
# (``Decider.gathered``); the Verified Block Cache's sums are per-branch products, which the threads' lists join
# (its branches one after the other). Adaptive Cache and the Verified Forecast also measure after a computed step,
# on one device by the evaluation's first forward: there each thread's first forward measures its rows, and the
# sums are pooled (:class:`AfterComputed`), so the rate or error is that of all the rows, as one device batching
# them measures it. A decider that declares nothing is switched off under native multi-GPU.

# The longest a device's thread waits for the others of its evaluation. They start together, so what it waits is
# how far the slowest device lags behind in reaching the measure: far less than a step, on any devices.
DEFAULT_WAIT_S = 60.0
WAIT_ENV = "CACHED_SAMPLER_THREAD_WAIT"


def gathers(decider: Decider) -> bool:
    """Whether ``decider``'s measure can be gathered over the devices' threads exactly (see the module)."""
    return decider.gathers_over_threads


def thread_wait(wait_s: float | None = None) -> float:
    """Seconds a device's thread waits for the others: ``wait_s``, else :data:`WAIT_ENV`, else the default."""
    if wait_s is None:
        text = os.environ.get(WAIT_ENV, "").strip()
        try:
            wait_s = float(text) if text else DEFAULT_WAIT_S
        except ValueError:
            raise ValueError(f"{WAIT_ENV} must be a number of seconds, got {text!r}.") from None
    if not (wait_s > 0 and math.isfinite(wait_s)):
        raise ValueError(f"{WAIT_ENV} must be a positive number of seconds, got {wait_s!r}.")
    return float(wait_s)


class AfterComputed:
    """What a decider measures after a computed evaluation, by its first forward (another forward of it, of split
    CFG, only moves anchors); where several devices' threads run the evaluation, by the first forward of each
    thread, whose sums are added when read (:func:`~.metrics.combined`). One per decider's run state, changed
    under the run's lock (``LoopState.computed``)."""

    def __init__(self):
        self.index: int | None = None   # the evaluation measuring
        self.threads: set[int] = set()  # the threads that measured in it
        self.parts: list[list | None] = []  # their measures once read, each thread's in the same order

    def admit(self, run, ev_index: int) -> bool:
        """Whether the forward now told it computed measures: the first of evaluation ``ev_index``, or under
        native multi-GPU (``run.threads``) the first of its device's thread."""
        thread = threading.get_ident()
        if self.index != ev_index:
            self.index, self.threads, self.parts = ev_index, {thread}, []
            return True
        if run.threads is None or thread in self.threads:
            return False
        self.threads.add(thread)
        return True

    def add(self, run, measures: list, then) -> None:
        """Read ``measures`` with the run's next transfer, then hand ``then`` the values pooled over every admitted
        forward's measures read so far. The last read is of all of them, and it comes before the next decision:
        an evaluation's forwards all end before the next evaluation decides."""
        parts, slot = self.parts, len(self.parts)
        parts.append(None)  # filled when read: until then the sums on the device belong to the pending read only

        def read(host):
            deliver(measures, host)
            for m in measures:
                m.terms = []  # read: the values are what is kept
            parts[slot] = measures
            if all(part is not None for part in parts):
                then(_pooled(parts))
        run.read_later(terms_of(measures), read)


def _pooled(parts: list[list]) -> list:
    if len(parts) == 1:
        return [m.value() for m in parts[0]]
    return [None if m is None else m.value() for m in combined_each(parts)]


class _Meeting:
    """The threads of one evaluation meeting for one decider's decision."""

    def __init__(self, expected: int):
        self.expected = expected
        self.parts: list = []       # (order, signals, measured) per thread, as they arrive
        self.threads: set[int] = set()
        self.done = False


class DeviceThreads:
    """The meetings of one run's device threads. ``lock`` is the run's lock, under which :meth:`decide` is
    called; waiting releases it. ``wait_s``: how long a thread waits for the others (:func:`thread_wait`)."""

    def __init__(self, lock, wait_s: float | None = None):
        self.wait_s = thread_wait(wait_s)
        self._arrived = threading.Condition(lock)
        self._expected: dict[int, int | None] = {}   # evaluation index -> its number of device threads
        self._meetings: dict[tuple[int, str], _Meeting] = {}

    def expect(self, ev_index: int, threads: int | None) -> None:
        """The evaluation ``ev_index`` runs on ``threads`` devices' threads (None: it could not be told)."""
        with self._arrived:
            self._expected[ev_index] = threads
            for key in [k for k in self._meetings if k[0] < ev_index]:  # evaluations gone
                del self._meetings[key]

    def decide(self, run, decider: Decider, signals: dict | None) -> bool:
        """``run``'s decision for ``decider`` in its evaluation, taken once over the rows of every device thread of
        it (under ``run``'s lock). Forced decisions need no one else's rows."""
        ev = run.evaluation
        decisions = run.decisions
        if run.off:
            return True
        meeting = self._meetings.get((ev.index, decider.id))
        if decider.id in ev.decisions:
            if meeting is not None and threading.get_ident() not in meeting.threads \
                    and len(meeting.threads) >= meeting.expected:
                run.switch_off(miscount_note(len(meeting.threads) + 1, meeting.expected))
            return decisions.decide(run, decider, signals)
        expected = self._expected.get(ev.index)
        if expected is None:
            run.switch_off(unknown_note())
            return True
        run.read_place()
        if expected <= 1 or decisions.forced(decider, ev):
            return decisions.decide(run, decider, signals)
        measured = decider.measure(run, ev, signals)
        run.transfer(measured)
        if meeting is None:
            meeting = self._meetings[(ev.index, decider.id)] = _Meeting(expected)
        meeting.parts.append((_order(signals), signals, measured))
        meeting.threads.add(threading.get_ident())
        if len(meeting.parts) >= meeting.expected:
            compute = self._decide_for_all(run, decider, ev, meeting)
            self._arrived.notify_all()
            return compute
        if not self._arrived.wait_for(lambda: meeting.done or run.off, timeout=self.wait_s):
            run.switch_off(timeout_note(decider, self.wait_s, len(meeting.parts), meeting.expected))
            meeting.parts = []
            self._arrived.notify_all()
        return ev.decisions.get(decider.id, True) if meeting.done else True

    @staticmethod
    def _decide_for_all(run, decider: Decider, ev, meeting: _Meeting) -> bool:
        """The last thread to arrive: the one decision, from every thread's measures and signals together."""
        parts = sorted(meeting.parts, key=lambda part: part[0])
        signals = {key: value for _, mine, _ in parts for key, value in (mine or {}).items()}
        joined = decider.gathered([measured for _, _, measured in parts])
        compute = True if joined is None else bool(decider.decide(run, ev, signals, joined))
        ev.decided_on[decider.id] = set(signals)
        ev.decisions[decider.id] = compute
        meeting.done = True
        meeting.parts = []  # the threads' signals: kept by the decider where it needs them, not here
        return compute


def _order(signals: dict | None) -> tuple:
    """Where a thread's rows sit among the evaluation's: its first branch's cond index (and entry)."""
    keys = sorted((-1 if k.branch is None else k.branch, k.occurrence, str(k.uuid)) for k in (signals or {}))
    return keys[0] if keys else (math.inf,)


PREFIX = "ComfyUI's native multi-GPU (MultiGPU CFG Split) ran this run's conditionings on several devices at once"


def unknown_note() -> str:
    return (f"{PREFIX}, and how many devices' threads ran a step could not be told (conditionings ComfyUI adds or "
            f"schedules its own way, or the model called outside the sampler's conds batching), so the measuring "
            f"deciders could not gather their measure over them: caching was switched off from that step on, and "
            f"every step from there was computed in full")


def timeout_note(decider: Decider, wait_s: float, arrived: int, expected: int) -> str:
    return (f"{PREFIX}, and {decider.label}'s measure was gathered from {arrived} of the step's {expected} device "
            f"threads within {wait_s:g} s (a device failed or lagged far behind; {WAIT_ENV} sets the wait): caching "
            f"was switched off from that step on, and every step from there was computed in full")


def miscount_note(arrived: int, expected: int) -> str:
    return (f"{PREFIX}, on {arrived} devices' threads in a step where {expected} were expected (a ComfyUI whose "
            f"multi-GPU scheduling differs from the one the pack knows): caching was switched off from the next "
            f"step on, and every step from there was computed in full")
