"""How long to time a kernel: the statistics that decide when a median is known well enough.

GPU kernel times are skewed (a launch can only be slowed down: a clock step, a preempting
context, an L2 that another process evicted), so surrotune's objective is the median of the
timed launches, and the question "have we timed enough?" is asked of the median. Its 95 %
confidence interval here is distribution-free: for sorted times ``x(1) <= ... <= x(n)`` the
interval ``[x(j), x(n-j+1)]`` covers the population median with probability
``1 - 2 P(B <= j-1)``, ``B ~ Binomial(n, 1/2)``, whatever the distribution of the times. The
worker times launches in rounds (:func:`next_round`) until that interval lies within
``target_precision`` of the median on both sides, or a cap on launches or on wall time is
reached, and the trial records which one stopped it.

Everything here is a pure function of the times measured so far, so that it is tested on the
CPU; :mod:`surrotune.backends.worker` does the launching.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "L2_FLUSH_MODES",
    "STOP_REASONS",
    "MeasurePolicy",
    "Round",
    "choose_l2_flush",
    "median_interval",
    "median_rank_interval",
    "min_samples",
    "next_round",
    "relative_precision",
]

#: ``[evaluation] l2_flush``: flush the L2 before each timed launch always, never, or when the
#: kernel's arguments fit in it (``auto``: otherwise a launch would find its data left in L2 by
#: the previous one and time faster than it runs in an application)
L2_FLUSH_MODES = ("auto", "always", "never")

#: why the timing of a configuration stopped (``Result.timing_stop``)
STOP_REASONS = {
    "repeats": "a fixed number of timed launches ([evaluation] repeats) was timed",
    "precision": "the median's 95 % interval lies within target_precision of it",
    "max_repeats": "the cap on timed launches was reached before the target precision",
    "max_measure_time": "the cap on timing wall time was reached before the target precision",
}


def median_rank_interval(n: int, confidence: float = 0.95) -> tuple[int, int] | None:
    """0-based indices ``(lo, hi)`` into ``n`` sorted times whose values bound the median with at
    least ``confidence``; None when ``n`` is too small for any such interval (below 6 at 95 %).

    The widest-possible order statistics are taken as far in as the exact binomial tail allows:
    ``j`` is the largest rank with ``P(B <= j - 1) <= (1 - confidence) / 2``.
    """
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie strictly between 0 and 1, got {confidence}")
    if n < 1:
        return None
    tail = (1.0 - confidence) / 2.0
    log_norm = math.lgamma(n + 1) - n * math.log(2.0)
    cdf = 0.0
    j = 0
    for i in range(n // 2 + 1):
        pmf = math.exp(log_norm - math.lgamma(i + 1) - math.lgamma(n - i + 1))
        if cdf + pmf > tail * (1.0 + 1e-12):
            break
        cdf += pmf
        j = i + 1
    if j == 0:
        return None
    return j - 1, n - j


def min_samples(confidence: float = 0.95) -> int:
    """The fewest times that give a distribution-free interval of the median (6 at 95 %)."""
    n = 1
    while median_rank_interval(n, confidence) is None:
        n += 1
    return n


def median_interval(
    times: Sequence[float], confidence: float = 0.95
) -> tuple[float, float] | None:
    """The distribution-free ``confidence`` interval of the median of ``times``, or None."""
    ranks = median_rank_interval(len(times), confidence)
    if ranks is None:
        return None
    ordered = sorted(times)
    return ordered[ranks[0]], ordered[ranks[1]]


def relative_precision(times: Sequence[float], confidence: float = 0.95) -> float | None:
    """How far the median's interval reaches from the median, relative to it: the larger of
    ``(median - lo) / median`` and ``(hi - median) / median``.

    0.01 means "the median is known to ±1 %". None when there are too few times for an interval;
    0 when the interval has no width (the times repeat exactly, as coarse event timers do);
    ``inf`` for a non-positive median with a non-empty interval.
    """
    interval = median_interval(times, confidence)
    if interval is None:
        return None
    lo, hi = interval
    if hi == lo:
        return 0.0
    median = statistics.median(times)
    if median <= 0:
        return math.inf
    return float(max(median - lo, hi - median) / median)


@dataclass(frozen=True)
class MeasurePolicy:
    """How a configuration is timed, from ``[evaluation]``.

    ``min_repeats`` launches are always timed (the first round); with ``max_repeats`` above it
    the timing goes on in rounds until the median is known to ``target_precision`` (relative
    half-width of its ``confidence`` interval), ``max_repeats`` launches were timed, or
    ``max_seconds`` of wall time were spent on the timed rounds. With ``max_repeats ==
    min_repeats`` exactly that many launches are timed, which is what ``[evaluation] repeats``
    always meant.
    """

    warmup: int = 3
    min_repeats: int = 10
    max_repeats: int = 200
    target_precision: float = 0.01
    max_seconds: float = 1.0
    confidence: float = 0.95

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"warmup must be 0 or more, got {self.warmup}")
        if self.min_repeats < 1:
            raise ValueError(f"min_repeats must be 1 or more, got {self.min_repeats}")
        if self.max_repeats < self.min_repeats:
            raise ValueError(
                f"max_repeats ({self.max_repeats}) must be at least min_repeats "
                f"({self.min_repeats})"
            )
        if not 0.0 < self.target_precision < 1.0:
            raise ValueError(
                f"target_precision must lie strictly between 0 and 1, got {self.target_precision}"
            )
        if not self.max_seconds > 0:
            raise ValueError(f"max_seconds must be positive, got {self.max_seconds}")
        median_rank_interval(1, self.confidence)  # validates the confidence

    @classmethod
    def fixed(cls, warmup: int, repeats: int) -> MeasurePolicy:
        """Exactly ``repeats`` timed launches after ``warmup`` untimed ones."""
        return cls(warmup=warmup, min_repeats=repeats, max_repeats=repeats)

    @classmethod
    def from_settings(cls, evaluation: Any) -> MeasurePolicy:
        """The policy of an :class:`surrotune.experiment.EvaluationSettings`.

        Its ``repeats`` is the minimum; ``max_repeats`` None means "exactly ``repeats``".
        """
        minimum, maximum = evaluation.repeats, evaluation.max_repeats
        return cls(
            warmup=evaluation.warmup,
            min_repeats=minimum,
            max_repeats=minimum if maximum is None else max(maximum, minimum),
            target_precision=evaluation.target_precision,
            max_seconds=evaluation.max_measure_s,
        )

    @property
    def adaptive(self) -> bool:
        """Whether the number of timed launches depends on the precision reached."""
        return self.max_repeats > self.min_repeats

    def watchdog_s(self, kernel_timeout_s: float) -> float:
        """The longest a correct but slow configuration can take in the worker, before margins.

        Every launch of the first round (checked, warm-up, ``min_repeats`` timed) may take the
        kernel timeout; later rounds are sized to end within ``max_seconds`` of wall time, and
        may overrun it by one launch.
        """
        launches = 1 + self.warmup + self.min_repeats
        if not self.adaptive:
            return kernel_timeout_s * launches
        return kernel_timeout_s * (launches + 1) + self.max_seconds


@dataclass(frozen=True)
class Round:
    """What :func:`next_round` decided: time ``count`` more launches, or stop (``count`` 0)
    for ``reason`` (one of :data:`STOP_REASONS`). ``precision`` is that of the times so far."""

    count: int
    reason: str
    precision: float | None


def next_round(policy: MeasurePolicy, times: Sequence[float], elapsed_s: float) -> Round:
    """How many launches to time next, given the times so far and the wall time they took.

    The interval of the median narrows as ``1/sqrt(n)``, so the next round asks for the launches
    that would bring the current precision to the target (20 % more, for the noise in that
    guess), but at most doubles the count, never passes ``max_repeats``, and is sized to fit the
    wall time left (at least one launch).
    """
    n = len(times)
    precision = relative_precision(times, policy.confidence) if n else None
    if n < policy.min_repeats:
        return Round(policy.min_repeats - n, "", precision)
    if not policy.adaptive:
        return Round(0, "repeats", precision)
    if precision is not None and precision <= policy.target_precision:
        return Round(0, "precision", precision)
    if n >= policy.max_repeats:
        return Round(0, "max_repeats", precision)
    if elapsed_s >= policy.max_seconds:
        return Round(0, "max_measure_time", precision)
    if precision is None or not math.isfinite(precision):
        # too few times for an interval (or a zero median): top up to what one needs, or double
        wanted = most = max(min_samples(policy.confidence) - n, n)
    else:
        wanted = math.ceil(n * (precision / policy.target_precision) ** 2 * 1.2) - n
        most = n
    count = max(1, min(wanted, most, policy.max_repeats - n))
    per_launch_s = elapsed_s / n
    if per_launch_s > 0:
        count = min(count, max(1, int((policy.max_seconds - elapsed_s) / per_launch_s)))
    return Round(count, "", precision)


def choose_l2_flush(mode: str, working_set_bytes: int, l2_bytes: int | None) -> bool:
    """Whether to flush the L2 cache before each timed launch (``[evaluation] l2_flush``).

    ``auto`` flushes when the kernel's arguments (inputs and outputs) fit in the L2: then every
    launch after the first would find them cached and time faster than the kernel runs in an
    application, where other work evicts them. A working set larger than the L2 streams through
    it anyway, and flushing would only cost time.
    """
    if mode not in L2_FLUSH_MODES:
        raise ValueError(f"l2_flush must be one of {', '.join(L2_FLUSH_MODES)}, got {mode!r}")
    if mode == "always":
        return True
    if mode == "never" or not l2_bytes:
        return False
    return working_set_bytes <= l2_bytes
