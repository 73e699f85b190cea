"""Two pass shapes timed in alternation, and what a verdict drawn at a line may claim from them.

A machine that slows down for a while (another program, a frequency step) slows both shapes alike when
their passes alternate, so the ratio of each pair stays near the truth where two medians taken a second
apart do not. The middle of the pairs' ratios comes with a distribution-free interval (the sign test's
order statistics); a verdict whose interval holds its line is too close to call, and says so.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

from specviz.hardware.device import timed_once

CONFIDENCE = 0.95        # the interval around the middle ratio holds it at least this often
FIRST_PAIRS = 9          # 9 pairs are the fewest whose 95 % interval drops the two extremes
MOST_PAIRS = 45          # a ratio near its line gets more pairs up to this many (~1.5 s on a CPU's 135M pass)
MORE_BUDGET_S = 6.0      # …while the passes timed so far took less than this (a slow pass or a busy CPU)
TICK_S = 1e-9            # a pass timed at 0 (a coarse clock) counts as this: every ratio stays finite

Pass = tuple[Callable[[], object], Callable[[], object] | None]     # (one pass, its undo: not timed)


@dataclass(frozen=True)
class Ratio:
    """b's time ÷ a's, the middle of `pairs` alternating pairs, with its CONFIDENCE interval [lo, hi]
    (infinite with too few pairs: below 6, no two order statistics hold the median 95 % of the time);
    a_s, b_s: each shape's own median seconds."""
    ratio: float
    lo: float
    hi: float
    pairs: int
    a_s: float
    b_s: float

    def finite(self) -> bool:
        return math.isfinite(self.lo) and math.isfinite(self.hi)

    def holds(self, line: float) -> bool:
        """The interval reaches the line: which side the ratio lies on is not known."""
        return self.lo <= line <= self.hi

    def values(self, name: str) -> dict:
        """The figures a conclusion quotes: {name}, {name}_lo, {name}_hi and pairs."""
        return {name: self.ratio, f"{name}_lo": self.lo, f"{name}_hi": self.hi, "pairs": self.pairs}


def median_interval(xs: list[float], confidence: float = CONFIDENCE) -> tuple[float, float]:
    """The order statistics (x_(j), x_(n+1−j)) that hold the median with at least `confidence`: the count
    of samples below the median is Binomial(n, ½), so each tail may keep at most (1 − confidence)/2."""
    xs, n = sorted(xs), len(xs)
    tail, j = (1.0 - confidence) / 2, 0
    below = 0.0
    while j < n and below + math.comb(n, j) / 2 ** n <= tail:
        below += math.comb(n, j) / 2 ** n
        j += 1
    if j == 0:
        return -math.inf, math.inf
    return xs[j - 1], xs[n - j]


def alternate(a: Pass, b: Pass, device, pairs: int, times: tuple[list, list] | None = None) -> tuple[list, list]:
    """`pairs` more passes of each shape, alternating and swapping which goes first every pair (a shape
    that always follows the other would always meet the same warm caches); each pass's undo runs
    untimed after it. One untimed pass of each first when `times` is new."""
    ta, tb = times or ([], [])
    if not ta:
        for run, undo in (a, b):
            run()
            if undo:
                undo()
    done = len(ta)
    for i in range(pairs):
        for (run, undo), out in ((a, ta), (b, tb)) if (done + i) % 2 == 0 else ((b, tb), (a, ta)):
            out.append(max(timed_once(run, device), TICK_S))
            if undo:
                undo()
    return ta, tb


def paired_ratio(a: Pass, b: Pass, device, lines: tuple[float, ...] = (), first: int = FIRST_PAIRS,
                 most: int = MOST_PAIRS, budget_s: float = MORE_BUDGET_S) -> Ratio:
    """b ÷ a from `first` alternating pairs, then `first` more at a time while the interval holds one
    of `lines` (the verdict's thresholds), fewer than `most` pairs ran and their passes took < budget_s
    (a verdict's interval is always made finite, whatever the budget)."""
    first = max(1, int(first))
    # each look at the interval may stop the pairs there, so each gets its share of the 5 % (Bonferroni):
    # the interval quoted at the end then holds the middle with CONFIDENCE however many looks it took
    confidence = 1 - (1 - CONFIDENCE) / (math.ceil(most / first) if lines else 1)
    times = alternate(a, b, device, first)
    ratio = _ratio(*times, confidence)
    while lines and ratio.pairs < most and any(ratio.holds(x) for x in lines) and (
            not ratio.finite() or sum(times[0]) + sum(times[1]) < budget_s):
        times = alternate(a, b, device, min(first, most - ratio.pairs), times)
        ratio = _ratio(*times, confidence)
    return ratio


def _ratio(ta: list[float], tb: list[float], confidence: float) -> Ratio:
    ratios = [b / a for a, b in zip(ta, tb)]
    lo, hi = median_interval(ratios, confidence)
    return Ratio(statistics.median(ratios), lo, hi, len(ratios), statistics.median(ta), statistics.median(tb))
