"""Adaptive verification: verify only the draft slots that are likely to survive (DSpark, vLLM's
`enable_adaptive_verification`).

Every row drafts; every drafted slot (row r, position j) gets a survival probability

    S(r, j) = c(r, 1) · c(r, 2) · … · c(r, j),

the chance that the target keeps drafts 1..j. The step then verifies a global budget of B slots, the
B with the highest survival over the whole batch. Because S only falls along a row, those B slots are
a prefix of each row's draft: position 5 of a confident row can beat position 1 of an unsure one, and
a row may verify nothing and decode one token. B is chosen each step as

    B* = argmax_B (rows + Σ_{top B} S) ÷ (draft_s + overhead_s + verify_s(rows + B)),

expected tokens over expected seconds, from cost tables measured on this machine.

Where the confidences come from:
- a model (or layer-skip) draft: the draft's top probability at that position, calibrated against the
  acceptance measured at that position and confidence (`Calibration`), so that S predicts acceptance;
- n-gram: no probabilities, so c is the acceptance measured at that position for drafts that came from
  a match of that length, learnt online.

Exactness. Greedy rows are exact whatever is verified (the target's argmax decides). A sampled row
with a model draft is exact only if the decision to verify position j never looks at the token drawn
at j or after it; the top-B choice of this step does (S(r, j+1) depends on d_j). So a sampled model row
verifies the positions whose survival clears the cut-off *of the previous step* (`cutoff`): its
confidences depend only on the tokens before each position, and the cut-off only on the past.
n-gram drafts are a fixed function of the context, so every row may use this step's B*.

The draft depth. DSpark drafts a block in one pass; a model draft here pays a pass per position. So
model rows draft only one position deeper than the step before verified, stop drafting once their raw
survival falls well under the last cut-off, and probe now and then after steps that verified nothing.
n-gram drafting costs almost nothing, so it always drafts the full depth.

Ownership: the engine owns one `Budget` and calls it from the thread that steps the batch.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field

CONF_BINS = 10           # raw-confidence bins of the calibration table
POSITIONS = 8            # positions told apart (deeper ones share the last entry)
PRIOR_WEIGHT = 4.0       # pseudo-counts for the prior (the raw confidence, or NGRAM_PRIOR)
NGRAM_PRIOR = 0.5
MAX_COUNT = 400.0        # counts decay past this, so the tables follow a changing workload
DRAFT_STOP = 0.25        # model rows stop drafting below this fraction of the last cut-off
PROBE_EVERY = 32         # steps without a verified draft before model rows draft again


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


@dataclass
class CostTable:
    """Seconds by size (tokens per verify pass, or rows), from observed steps, optionally seeded by a
    profile measured at warm-up. A query is the monotone fit, interpolated; above the largest size it
    grows along the last measured slope, below the smallest it stays flat."""

    smoothing: float = 0.3
    seed: dict[int, float] = field(default_factory=dict)     # size → seconds, measured at warm-up
    seen: dict[int, float] = field(default_factory=dict)     # size → seconds, observed (moving average)
    _fit: tuple[list[int], list[float]] | None = None

    def observe(self, size: int, seconds: float) -> None:
        old = self.seen.get(size)
        self.seen[size] = seconds if old is None else (1 - self.smoothing) * old + self.smoothing * seconds
        self._fit = None

    def __bool__(self) -> bool:
        return bool(self.seed or self.seen)

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

    def _fitted(self) -> tuple[list[int], list[float]]:
        """Observed sizes win; the seed fills the sizes not seen yet, scaled by how far the observed
        steps sit from it (a profile of one long row is not a step of many short ones)."""
        if self._fit is None:
            points = dict(self.seed)
            if self.seed and self.seen:
                ratios = sorted(s / self._seed_at(n) for n, s in self.seen.items() if self._seed_at(n) > 0)
                scale = ratios[len(ratios) // 2] if ratios else 1.0
                points = {n: s * scale for n, s in self.seed.items()}
            points.update(self.seen)
            xs = sorted(points)
            self._fit = (xs, monotone(xs, [points[x] for x in xs]))
        return self._fit

    def _seed_at(self, n: int) -> float:
        xs = sorted(self.seed)
        i = bisect.bisect_left(xs, n)
        if i < len(xs) and xs[i] == n:
            return self.seed[n]
        if i == 0 or i == len(xs):
            return self.seed[xs[min(i, len(xs) - 1)]]
        w = (n - xs[i - 1]) / (xs[i] - xs[i - 1])
        return self.seed[xs[i - 1]] * (1 - w) + self.seed[xs[i]] * w


@dataclass
class Calibration:
    """P(the target keeps slot j | it kept every slot before j), by (key, position): the key is a raw
    confidence bin for model drafts and the match length for n-gram drafts. Counts start from a prior
    (the raw confidence, or NGRAM_PRIOR) worth PRIOR_WEIGHT observations."""

    reached: dict[tuple[int, int], float] = field(default_factory=dict)
    kept: dict[tuple[int, int], float] = field(default_factory=dict)

    def rate(self, key: int, pos: int, prior: float) -> float:
        k = (key, min(pos, POSITIONS - 1))
        n = self.reached.get(k, 0.0)
        return (self.kept.get(k, 0.0) + PRIOR_WEIGHT * prior) / (n + PRIOR_WEIGHT)

    def observe(self, key: int, pos: int, kept: bool) -> None:
        k = (key, min(pos, POSITIONS - 1))
        n = self.reached.get(k, 0.0) + 1.0
        a = self.kept.get(k, 0.0) + float(kept)
        if n > MAX_COUNT:
            a, n = a * MAX_COUNT / n, MAX_COUNT
        self.reached[k], self.kept[k] = n, a


@dataclass(frozen=True)
class Selection:
    """What the scheduler decided in one step."""

    lengths: list[int]         # per row: drafts offered to the verify pass
    drafted: int               # draft slots the drafter proposed, all rows
    verified: int              # of which verified
    budget: int                # B* (the slots chosen by this step's argmax; sampled model rows aside)


def _bin(c: float) -> int:
    return min(CONF_BINS - 1, max(0, int(c * CONF_BINS)))


class Budget:
    """The batch-wide verification budget (see the module docstring)."""

    def __init__(self, verify_seed: dict[int, float] | None = None):
        self.verify = CostTable(seed=dict(verify_seed or {}))   # seconds by real tokens per verify pass
        self.overhead = CostTable()        # seconds outside the forwards, by rows
        self.model_cal, self.ngram_cal = Calibration(), Calibration()
        self.cutoff = 0.0                  # survival of the last slot chosen in the previous step
        self.depth_hint: int | None = None  # deepest row verified in the previous step (None: no step yet)
        self._idle = 0                     # steps since a model row last verified a draft
        self._keys: list[list[int]] = []   # per row and position of the last selection: calibration key

    # --- before drafting ---------------------------------------------------------------------------
    def draft_depth(self, depth: int, kind: str) -> int:
        """How deep rows under this budget draft this step (the slider's depth is the ceiling)."""
        if kind != "model" or self.depth_hint is None:
            return depth
        if self.depth_hint == 0:
            if self._idle < PROBE_EVERY:
                return 0
            self._idle = 0
            return min(depth, 1)
        return min(depth, self.depth_hint + 1)

    def draft_floor(self) -> float:
        """Model rows stop drafting once their raw survival falls below this."""
        return DRAFT_STOP * self.cutoff

    # --- after drafting ------------------------------------------------------------------------------
    def survival(self, prop, i: int) -> tuple[list[float], list[int]]:
        """Row i's survival per drafted position, and the calibration key of each position."""
        k = int(prop.lengths[i])
        if prop.match is not None:               # n-gram: measured acceptance by match length
            n = prop.match[i]
            cs, keys = [self.ngram_cal.rate(n, j, NGRAM_PRIOR) for j in range(k)], [n] * k
        elif prop.conf is not None:              # model: calibrated top probability
            raw = prop.conf[i, :k].tolist()
            keys = [_bin(c) for c in raw]
            cs = [self.model_cal.rate(b, j, c) for j, (b, c) in enumerate(zip(keys, raw))]
        else:
            cs, keys = [NGRAM_PRIOR] * k, [0] * k
        out, s = [], 1.0
        for c in cs:
            s *= min(1.0, max(0.0, c))
            out.append(s)
        return out, keys

    def select(self, prop, chosen: list[bool], sampled: list[bool], fixed_s: float, rows: int) -> Selection:
        """Per row, how many of its drafts to verify. Rows not `chosen` (other policies) keep theirs;
        `sampled` rows with a model draft follow the previous cut-off (see Exactness); the others
        share B*. `fixed_s`: this step's draft seconds."""
        lengths = prop.lengths.tolist()
        fixed_tokens, gain = rows, float(rows)
        slots: list[tuple[float, int, int]] = []
        self._keys = [[] for _ in lengths]
        for i, k in enumerate(lengths):
            if not chosen[i] or k == 0:
                fixed_tokens += k
                continue
            surv, self._keys[i] = self.survival(prop, i)
            if sampled[i] and prop.match is None:
                lengths[i] = sum(1 for s in surv if s >= self.cutoff)
                fixed_tokens += lengths[i]
                gain += sum(surv[:lengths[i]])
                continue
            slots += [(s, j, i) for j, s in enumerate(surv)]
            lengths[i] = 0
        drafted = sum(int(x) for x in prop.lengths.tolist())
        slots.sort(key=lambda t: (-t[0], t[1]))
        fixed_s += self.overhead.at(rows)
        best, best_rate, total = 0, gain / max(fixed_s + self.verify.at(fixed_tokens), 1e-9), gain
        for b, (s, _, _) in enumerate(slots, start=1):
            total += s
            rate = total / max(fixed_s + self.verify.at(fixed_tokens + b), 1e-9)
            if rate > best_rate:
                best, best_rate = b, rate
        for _, _, i in slots[:best]:
            lengths[i] += 1
        if slots:
            self.cutoff = slots[best - 1][0] if best else min(1.0, slots[0][0] + 1e-6)
        return Selection(lengths, drafted, sum(lengths), best)

    # --- after verification ----------------------------------------------------------------------
    def observe(self, prop, verified: list[int], accepted: list[int], chosen: list[bool], rows: int,
                tokens: int, verify_s: float, overhead_s: float) -> None:
        """Learn from the step: acceptance per position (for the calibration tables) and the costs."""
        cal = self.ngram_cal if prop.match is not None else self.model_cal
        deepest = 0
        for i, (k, a) in enumerate(zip(verified, accepted)):
            if not chosen[i]:
                continue
            deepest = max(deepest, k)
            keys = self._keys[i] if i < len(self._keys) else []
            for j in range(min(k, a + 1, len(keys))):   # slot j was reached iff the ones before were kept
                cal.observe(keys[j], j, j < a)
        if any(chosen):
            self.depth_hint = deepest
            self._idle = 0 if deepest else self._idle + 1
        if tokens:
            self.verify.observe(tokens, verify_s)
        self.overhead.observe(rows, overhead_s)


def verify_profile(model, device, dtype, new_cache=None, context: int = 64,
                   sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128)) -> dict[int, float]:
    """A warm-up profile of the target's verify pass: median seconds by tokens per pass (the knee
    measurement's curve, short). `Budget` scales it to the steps it then observes."""
    from specviz.hardware.device import measure_latency

    secs = measure_latency(model, list(sizes), context, device, dtype, repeats=3, new_cache=new_cache)
    return dict(zip(sizes, secs))

