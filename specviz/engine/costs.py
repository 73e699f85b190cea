"""What passes cost on this machine, as the budget prices them: seconds by size (tokens per verify pass,
or rows per draft pass), learnt from observed steps over a profile measured at warm-up.

A bigger pass never costs less (`monotone`), a slow step does not stick (a size's cost is the median of its
recent steps), and a verify pass is priced by its row class as well as its tokens (`RowCosts`).
"""
from __future__ import annotations

import bisect
import statistics
from dataclasses import dataclass, field

def monotone(xs: list[int], ys: list[float]) -> list[float]:
    """The non-decreasing fit of ys over increasing xs (pool-adjacent-violators, weights equal):
    a bigger pass never costs less, whatever noise the timings carry."""
    blocks: list[list[float]] = []      # [sum, count]
    for y in ys:
        blocks.append([y, 1.0])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, c = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += c
    out: list[float] = []
    for s, c in blocks:
        out += [s / c] * int(c)
    return out



# A size's observed cost is the median of its last RECENT observations; where a warm-up profile can stand
# in for it, a size expires STALE observations (of the whole table) after its last one. A moving average
# kept one preempted step's spike, the monotone fit then priced every larger size dear, and the budget
# stopped verifying them, so nothing measured those sizes again.
RECENT = 5
STALE = 50
# Above the largest size a table has ever observed, planning pays only this share of the increment the
# (scaled) profile predicts: an optimistic start, corrected by the step that verifies that size. A noisy
# warm-up profile (a few samples on a busy machine) could otherwise price verifying out for good, and a
# budget that never verifies never measures what verifying costs.
EXPLORE_SHARE = 0.5


@dataclass
class CostTable:
    """Seconds by size (tokens per verify pass, or rows), from observed steps, optionally seeded by a
    profile measured at warm-up. A query is the monotone fit, interpolated; above the largest size it
    grows along the last measured slope, below the smallest it stays flat."""

    seed: dict[int, float] = field(default_factory=dict)     # size → seconds, measured at warm-up
    seen: dict[int, float] = field(default_factory=dict)     # size → seconds, observed (recent median)
    _fit: tuple[list[int], list[float]] | None = None
    _recent: dict[int, list[float]] = field(default_factory=dict, repr=False)   # size → last RECENT seconds
    _last: dict[int, int] = field(default_factory=dict, repr=False)             # size → observation number
    _count: int = 0
    _seed_xs: list[int] = field(default_factory=list, repr=False)    # the seed's sizes, sorted once
    _largest: int = 0             # the largest size ever observed (0: none)

    def __post_init__(self) -> None:
        self._seed_xs = sorted(self.seed)

    def observe(self, size: int, seconds: float) -> None:
        recent = self._recent.setdefault(size, [])
        recent.append(seconds)
        del recent[:-RECENT]
        self.seen[size] = statistics.median(recent)
        self._largest = max(self._largest, size)
        self._count += 1
        self._last[size] = self._count
        self._fit = None

    def _fresh(self) -> dict[int, float]:
        """The observed sizes still trusted: all of them without a seed to fall back on, else those
        observed in the last STALE observations (an expired size is priced from the scaled seed until a
        step measures it again). The count moves only in `observe`, which drops the cached fit."""
        if not self.seed:
            return self.seen
        return {n: v for n, v in self.seen.items() if self._count - self._last.get(n, self._count) < STALE}

    def __bool__(self) -> bool:
        return bool(self.seed or self.seen)

    def forget_above(self, size: int) -> None:
        """Drop what was observed above `size`: those sizes are priced from the scaled seed again, and
        above the largest size still observed with EXPLORE_SHARE's optimism (`Budget` retries)."""
        for n in [n for n in self.seen if n > size]:
            del self.seen[n], self._recent[n]
            self._last.pop(n, None)
        self._largest = max(self.seen, default=0)
        self._fit = None

    def at(self, size: int) -> float:
        xs, ys = self._fitted()
        if not xs:
            return 0.0
        i = bisect.bisect_left(xs, size)
        if i < len(xs) and xs[i] == size:
            return ys[i]
        if i == 0:
            return ys[0]
        if i == len(xs):
            if len(xs) == 1:
                return ys[0]
            slope = max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2]))
            return ys[-1] + slope * (size - xs[-1])
        w = (size - xs[i - 1]) / (xs[i] - xs[i - 1])
        return ys[i - 1] * (1 - w) + ys[i] * w

    def explore(self, size: int) -> float:
        """The price planning uses: `at`, except above the largest size ever observed, where only
        EXPLORE_SHARE of the predicted increment over it counts (see EXPLORE_SHARE)."""
        if not self._largest or size <= self._largest:
            return self.at(size)
        base = self.at(self._largest)
        return base + EXPLORE_SHARE * max(0.0, self.at(size) - base)

    def _fitted(self) -> tuple[list[int], list[float]]:
        """Observed sizes win; the seed fills the sizes not seen yet, scaled by how far the observed
        steps sit from it (a profile of one long row is not a step of many short ones). Refitted after
        every observation, so once per step: kept to one pass over each table."""
        if self._fit is None:
            seen = self._fresh()
            points = dict(self.seed)
            if self.seed and seen:
                ratios = []
                for n, s in seen.items():
                    at = self._seed_at(n)
                    if at > 0:
                        ratios.append(s / at)
                ratios.sort()
                scale = ratios[len(ratios) // 2] if ratios else 1.0
                points = {n: s * scale for n, s in self.seed.items()}
            points.update(seen)
            xs = sorted(points)
            self._fit = (xs, monotone(xs, [points[x] for x in xs]))
        return self._fit

    def _seed_at(self, n: int) -> float:
        xs = self._seed_xs
        i = bisect.bisect_left(xs, n)
        if i < len(xs) and xs[i] == n:
            return self.seed[n]
        if i == 0 or i == len(xs):
            return self.seed[xs[min(i, len(xs) - 1)]]
        w = (n - xs[i - 1]) / (xs[i] - xs[i - 1])
        return self.seed[xs[i - 1]] * (1 - w) + self.seed[xs[i]] * w


class RowCosts:
    """Verify seconds by tokens per pass, one CostTable per batch-rows class (powers of two): 64 tokens
    as 64 rows × 1 cost far more than 4 rows × 16 (64 caches to attend over, another fast-path row class),
    so one table by tokens alone, learnt at a small class, prices a large one wrong. Each class's table
    starts from the warm-up profile (one row of N tokens) and is scaled by its own observed steps; a class
    not seen yet borrows the nearest class that has been."""

    def __init__(self, seed: dict[int, float] | None = None):
        self.seed = dict(seed or {})
        self.tables: dict[int, CostTable] = {}

    @staticmethod
    def row_class(rows: int) -> int:
        return 1 << max(0, int(rows) - 1).bit_length()

    def __bool__(self) -> bool:
        return bool(self.seed) or any(self.tables.values())

    def observe(self, rows: int, tokens: int, seconds: float) -> None:
        c = self.row_class(rows)
        self.tables.setdefault(c, CostTable(seed=dict(self.seed))).observe(tokens, seconds)

    def forget_above(self, rows: int, tokens: int) -> None:
        """`CostTable.forget_above` on the table of this row class (not one it borrows)."""
        table = self.tables.get(self.row_class(rows))
        if table is not None:
            table.forget_above(tokens)

    def table(self, rows: int) -> CostTable:
        """The table a step of `rows` rows is priced from (looked up once per step, not once per slot)."""
        c = self.row_class(rows)
        seen = [k for k, t in self.tables.items() if t.seen]
        if c not in seen and seen:     # the nearest class, in factors of two (ties: the larger, dearer)
            c = min(seen, key=lambda k: (abs(k.bit_length() - c.bit_length()), -k))
        return self.tables.get(c) or CostTable(seed=self.seed)

    def at(self, rows: int, tokens: int) -> float:
        return self.table(rows).at(tokens)
