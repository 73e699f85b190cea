"""How likely a drafted slot is to survive verification, learnt from the target's verdicts.

A slot (row r, position j) survives when the target keeps drafts 1..j; its survival is the running product

    S(r, j) = c(r, 1) · c(r, 2) · … · c(r, j),

each c the probability that the target keeps that draft once it kept the ones before it. Where the c come
from:
- a model (or layer-skip) draft: the draft's top probability at that position, calibrated against the
  acceptance measured at that position and confidence bin, so that S predicts acceptance;
- a draft with no probabilities (n-gram, synthetic): the acceptance measured at that position for drafts
  of the same key (the n-gram match length; one key for a synthetic draft), learnt online.
Both tables also learn from hindsight (`Hindsight`): the first slot a row drafted but did not verify,
when it kept all it verified, is judged by the target's next token, so a position the budget left out
is still measured and a too-pessimistic start corrects itself.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

CONF_BINS = 10           # raw-confidence bins of the model draft's table
POSITIONS = 8            # positions told apart (deeper ones share the last entry)
PRIOR_WEIGHT = 4.0       # pseudo-counts for the prior (the raw confidence, or KEYED_PRIOR)
KEYED_PRIOR = 0.5        # a keyed draft's acceptance before anything was measured
MAX_COUNT = 400.0        # counts decay past this, so the tables follow a changing workload
FORGET = 0.995           # per step: a count's weight halves in ~140 steps
EXPLORE = 1.0            # standard errors of optimism the budget plans with (see AcceptanceTable.optimistic)
PULL_EVERY = 16          # steps between fresh copies of what the pair's other engines taught (Learnt)


def running_product(cs: list[float]) -> list[float]:
    """S(j) = c(1) · … · c(j), each confidence clipped to [0, 1]."""
    out, s = [], 1.0
    for c in cs:
        s *= min(1.0, max(0.0, c))
        out.append(s)
    return out


def conf_bin(c: float) -> int:
    return min(CONF_BINS - 1, max(0, int(c * CONF_BINS)))


@dataclass
class AcceptanceTable:
    """P(the target keeps slot j | it kept every slot before j), by (key, position). Counts start from a
    prior worth PRIOR_WEIGHT observations: the raw confidence for a model draft; for a keyed draft
    (`pooled`), the rate measured at that position over every key, so a key seen for the first time
    starts from what the others taught, not from a guess."""

    pooled: bool = False
    reached: dict[tuple[int, int], float] = field(default_factory=dict)
    kept: dict[tuple[int, int], float] = field(default_factory=dict)
    pos_reached: dict[int, float] = field(default_factory=dict)     # by position, every key together
    pos_kept: dict[int, float] = field(default_factory=dict)
    # the counts above are stored divided by `_fade`, the product of every `forget` factor so far: a step's
    # fading is then one multiplication, not one per count
    _fade: float = field(default=1.0, repr=False, compare=False)
    # derived from the counts above (cleared whenever they change): prior → rate by position
    _pooled_rates: dict[float, list[float]] = field(default_factory=dict, repr=False, compare=False)

    def rate(self, key: int, pos: int, prior: float) -> float:
        p = min(pos, POSITIONS - 1)
        if self.pooled:
            prior = self._pooled(prior)[p]
        n, f = self.reached.get((key, p), 0.0), self._fade
        return (self.kept.get((key, p), 0.0) * f + PRIOR_WEIGHT * prior) / (n * f + PRIOR_WEIGHT)

    def optimistic(self, key: int, pos: int, prior: float) -> float:
        """The rate plus one standard error of the counts behind it (the prior's included): where little
        was measured the budget leans towards verifying, and what it verifies is then measured, so a
        pessimistic start cannot starve the table of the evidence that would correct it."""
        r = self.rate(key, pos, prior)
        n = self.count(key, pos) + PRIOR_WEIGHT
        return min(1.0, r + EXPLORE * math.sqrt(max(r * (1.0 - r), 0.0) / n))

    def count(self, key: int, pos: int) -> float:
        """Slots of this key and position reached, faded as `forget` left them."""
        return self.reached.get((key, min(pos, POSITIONS - 1)), 0.0) * self._fade

    def evidence(self) -> float:
        """Slots reached so far, every key and position together, faded."""
        return sum(self.pos_reached.values()) * self._fade

    def _pooled(self, base: float) -> list[float]:
        """The rate by position over every key. A position seen rarely starts from the rate of the one
        before it, not from `base`: a draft that survived its first positions is a copied span and tends
        to go on, so a fixed prior at depth would stop the budget short of what deep drafts keep."""
        rates = self._pooled_rates.get(base)
        if rates is None:
            rates, prior, f = [], base, self._fade
            for p in range(POSITIONS):
                prior = ((self.pos_kept.get(p, 0.0) * f + PRIOR_WEIGHT * prior)
                         / (self.pos_reached.get(p, 0.0) * f + PRIOR_WEIGHT))
                rates.append(prior)
            self._pooled_rates[base] = rates
        return rates

    def forget(self, factor: float) -> None:
        """Fade every count a little, so a slot class that stopped being verified drifts back to its
        prior and is tried again."""
        self._fade *= factor
        if self._fade < 1e-100:       # fold the fade into the counts before it underflows
            for table in (self.reached, self.kept, self.pos_reached, self.pos_kept):
                for k in table:
                    table[k] *= self._fade
            self._fade = 1.0
        self._pooled_rates.clear()

    def observe(self, key: int, pos: int, kept: bool) -> None:
        self.observe_many(key, pos, 1, int(kept))

    def observe_many(self, key: int, pos: int, reached_n: int, kept_n: int) -> None:
        """`reached_n` slots of this key and position reached in one step, `kept_n` of them kept (a step's
        rows are one update here, not one each)."""
        p, f = min(pos, POSITIONS - 1), self._fade
        for reached, kept_, k in ((self.reached, self.kept, (key, p)), (self.pos_reached, self.pos_kept, p)):
            n, a = reached.get(k, 0.0) * f + reached_n, kept_.get(k, 0.0) * f + kept_n
            if n > MAX_COUNT:
                a, n = a * MAX_COUNT / n, MAX_COUNT
            reached[k], kept_[k] = n / f, a / f
        self._pooled_rates.clear()


@dataclass(frozen=True)
class Hindsight:
    """What the step tells about the first slot it did not verify: a row that verified k of its drafts and
    kept all k emits the target's own token at k, so draft k would have been kept iff it equals that token
    (greedy). For a sampled row with a fixed (keyed) draft d the two events have the same probability,
    p(d); a sampled model draft is accepted with min(1, p/q) instead, so those rows are left out."""

    drafts: list[list[int]]        # [B][K] every drafted token, before the budget cut
    proposed: list[int]            # per row: drafts proposed
    next_tokens: list[int]         # per row: the token the target emitted after the kept drafts
    greedy: list[bool]


class Survival:
    """Both acceptance tables and the survival they give each drafted slot of a step. `keys` remembers,
    per row of the last step, the confidence bin of each position, for `observe`. With `learnt` (the
    pair's shared tables) every step's verdicts are added there, and the tables this budget plans with
    are a copy of them, taken when it first plans and again every PULL_EVERY steps (an engine that never
    plans never copies)."""

    def __init__(self, learnt=None) -> None:
        self.learnt = learnt
        self.confident = AcceptanceTable()             # model drafts, by confidence bin
        self.keyed = AcceptanceTable(pooled=True)      # keyed drafts (n-gram, synthetic), by key
        self.keys: list[list[int]] = []
        self._since_pull = PULL_EVERY                  # steps since the last copy (first plan: copy now)

    def _pull(self) -> None:
        """A fresh copy of the pair's tables (they hold this budget's own verdicts too)."""
        if self.learnt is not None and self._since_pull >= PULL_EVERY:
            self.confident, self.keyed = self.learnt.copy()
            self._since_pull = 0

    def of_step(self, prop, chosen: list[bool], optimistic: bool = False) -> dict[int, list[float]]:
        """Per chosen row, its survival at each drafted position (`optimistic`: from each rate plus its
        uncertainty, `AcceptanceTable.optimistic`). A keyed row's survival depends only on its key and
        depth, so it is computed once per (key, depth) a step."""
        self._pull()
        keyed_rate = self.keyed.optimistic if optimistic else self.keyed.rate
        confident_rate = self.confident.optimistic if optimistic else self.confident.rate
        lengths = prop.length_list()
        self.keys = [[] for _ in lengths]
        conf = prop.conf.tolist() if prop.conf is not None and prop.keys is None and any(lengths) else None
        memo: dict = {}
        out: dict[int, list[float]] = {}
        for i, k in enumerate(lengths):
            if not chosen[i]:
                continue
            if prop.keys is not None:
                out[i], self.keys[i] = _keyed_row(int(prop.keys[i]), k, keyed_rate, memo)
            elif conf is not None:
                raw = conf[i][:k]
                self.keys[i] = [conf_bin(c) for c in raw]
                out[i] = running_product([confident_rate(b, j, c) for j, (b, c) in enumerate(zip(self.keys[i], raw))])
            else:
                out[i], self.keys[i] = running_product([KEYED_PRIOR] * k), [0] * k
        return out

    def best_keyed(self, depth: int, keys) -> list[float]:
        """Per position 1..depth, the highest survival any of these keys has there (plain rates: the
        caller multiplies many rows' bounds, where optimism would compound)."""
        self._pull()
        best = [0.0] * depth
        for key in keys:
            for j, s in enumerate(running_product([self.keyed.rate(key, j, KEYED_PRIOR) for j in range(depth)])):
                best[j] = max(best[j], s)
        return best

    def observe(self, prop, verified: list[int], accepted: list[int], chosen: list[bool],
                after: Hindsight | None) -> None:
        """Acceptance per position from the step's `chosen` rows' verdicts, one update per (key, position).
        A keyed draft's key is its proposal's (any row can teach); a model draft's bins come from this
        budget's own selection."""
        keyed = prop.keys is not None
        table = self.keyed if keyed else self.confident
        drafts = after.drafts if after is not None else None
        seen: dict[tuple[int, int], list[int]] = {}     # (key, position) → [reached, kept] this step
        for i, (k, a) in enumerate(zip(verified, accepted)):
            if not chosen[i]:
                continue
            keys = [int(prop.keys[i])] * (after.proposed[i] if after is not None else k) if keyed else \
                (self.keys[i] if i < len(self.keys) else [])
            for j in range(min(k, a + 1, len(keys))):   # slot j was reached iff the ones before were kept
                _tally(seen, keys[j], j, j < a)
            if after is not None and a == k and k < min(after.proposed[i], len(keys)) \
                    and (after.greedy[i] or prop.keys is not None):
                _tally(seen, keys[k], k, int(drafts[i][k]) == after.next_tokens[i])
        for (key, j), (n, kept) in seen.items():
            table.observe_many(key, j, n, kept)
        if self.learnt is not None and seen:
            self.learnt.add(keyed, seen)
        self._since_pull += 1

    def forget(self) -> None:
        self.confident.forget(FORGET)
        self.keyed.forget(FORGET)


def _keyed_row(key: int, k: int, rate, memo: dict) -> tuple[list[float], list[int]]:
    """A keyed row's survival by position: a function of its key and depth, once per step."""
    got = memo.get((key, k))
    if got is None:
        got = memo[(key, k)] = (running_product([rate(key, j, KEYED_PRIOR) for j in range(k)]), [key] * k)
    return list(got[0]), list(got[1])


def _tally(seen: dict, key: int, pos: int, kept: bool) -> None:
    got = seen.setdefault((key, pos), [0, 0])
    got[0] += 1
    got[1] += int(kept)
