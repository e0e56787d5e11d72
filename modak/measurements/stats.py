"""Statistics of repeated measurements: an interval for one configuration, a paired ratio for two, and the
equivalence verdict the decision metrics and ``modak tune`` share.

Launches of one session are interleaved in rounds (every candidate once per round, in random order), so launch
``i`` of two candidates ran at about the same time: their ratio cancels what drifted between rounds. Ratios are
summarized by their geometric mean; their intervals and a single configuration's are Student t intervals on log
times.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

CONFIDENCE = 0.9
EQUIVALENCE_MARGIN = 0.05  # "as fast as the best": within 5%


def median_interval(launch_medians: Sequence[float], confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(center, low, high) of a configuration's step time from its launches' medians: the median of the launches,
    and a t interval on their logarithms (one launch: a zero-width interval, which says nothing)."""
    values = np.log(np.asarray(launch_medians, dtype=float))
    center = float(np.exp(np.median(values)))
    if len(values) < 2:
        return center, center, center
    from scipy.stats import t

    half = float(t.ppf(0.5 + confidence / 2, len(values) - 1) * values.std(ddof=1) / math.sqrt(len(values)))
    mean = float(values.mean())
    return center, float(math.exp(mean - half)), float(math.exp(mean + half))


def spread(launch_medians: Sequence[float]) -> float:
    """Launch-to-launch coefficient of variation (0 for one launch)."""
    values = np.asarray(launch_medians, dtype=float)
    return float(values.std(ddof=1) / values.mean()) if len(values) >= 2 else 0.0


@dataclass(frozen=True)
class Ratio:
    """``a / b`` step-time ratio with its interval; below 1 means ``a`` is faster."""

    estimate: float
    low: float
    high: float
    rounds: int
    paired: bool

    def faster(self) -> bool:
        """``a`` is confidently faster than ``b``."""
        return self.high < 1.0

    def slower(self) -> bool:
        """``a`` is confidently slower than ``b``."""
        return self.low > 1.0

    def equivalent(self, margin: float = EQUIVALENCE_MARGIN) -> bool:
        """``a`` is shown to be at most ``margin`` slower than ``b`` (the interval's upper end within it)."""
        return self.high <= 1.0 + margin

    def describe(self) -> str:
        return f"{self.estimate:.3f}x [{self.low:.3f}, {self.high:.3f}]"


def ratio(a: Sequence[float], b: Sequence[float], paired: bool = True, confidence: float = CONFIDENCE) -> Ratio:
    """The ratio of ``a``'s step times to ``b``'s: paired by round (``a[i]`` and ``b[i]`` ran in the same round;
    the first ``min(len)`` rounds are used), or unpaired, as the ratio of geometric means. The interval is a
    Student t interval on the logarithms (Welch's when unpaired); one value per side gives a zero-width one.

    Not a percentile bootstrap: with the 3 to 8 rounds a race has, a bootstrap interval is too narrow (it
    declared a 1% difference under 5% noise confidently slower after 3 rounds in tests/test_tune.py)."""
    from scipy.stats import t

    la, lb = np.log(np.asarray(a, dtype=float)), np.log(np.asarray(b, dtype=float))
    freedom: float  # the t distribution's degrees of freedom (Welch's are fractional)
    if paired:
        rounds = min(len(la), len(lb))
        logs = la[:rounds] - lb[:rounds]
        center = float(logs.mean())
        if rounds < 2:
            return Ratio(math.exp(center), math.exp(center), math.exp(center), rounds, True)
        error, freedom = float(logs.std(ddof=1)) / math.sqrt(rounds), rounds - 1
    else:
        rounds = min(len(la), len(lb))
        center = float(la.mean() - lb.mean())
        va = la.var(ddof=1) / len(la) if len(la) > 1 else 0.0
        vb = lb.var(ddof=1) / len(lb) if len(lb) > 1 else 0.0
        error = math.sqrt(va + vb)
        if error == 0.0:
            return Ratio(math.exp(center), math.exp(center), math.exp(center), rounds, False)
        parts = [v ** 2 / (n - 1) for v, n in ((va, len(la)), (vb, len(lb))) if n > 1]
        freedom = (va + vb) ** 2 / sum(parts)
    half = float(t.ppf(0.5 + confidence / 2, freedom)) * error
    return Ratio(math.exp(center), math.exp(center - half), math.exp(center + half), rounds, paired)
