"""How deep rows under adaptive verification draft when drafting has a price (a model or layer-skip draft).

DSpark drafts a block in one pass; a model draft here pays a pass per position. So such rows draft to
the depth with the best expected tokens per second (measured draft cost by rows, verify cost, mean
survival per position), stop drafting once their raw survival falls well under the last cut-off, and
probe one position now and then after choosing not to draft, ever more rarely while probes find nothing
worth drafting. A probe drafts in one row, the one with the least to catch up: a row that has not drafted
for a while must first feed the draft model every token since (a prefill), and a probe in every row
would be a draft prefill of the whole class. So a probe also waits until the serving time since the last
one is 1 ÷ PROBE_SHARE times its estimated price, and never comes where a draft that every target kept
would still not pay. A free draft (n-gram, synthetic) never comes here: it drafts the full depth.

Ownership: one per `Budget`, called from the thread that steps the batch.
"""
from __future__ import annotations

from specviz.engine.acceptance import KEYED_PRIOR
from specviz.engine.costs import CostTable, RowCosts

DRAFT_STOP = 0.25        # model rows stop drafting below this fraction of the last cut-off
PROBE_EVERY = 32         # steps without a verified draft before model rows draft again …
PROBE_MAX = 256          # … doubling after each probe that did not make drafting pay, up to this …
PROBE_SHARE = 0.02       # … and at most this share of the serving time spent on probes (their catch-up)


class DraftDepth:
    """The depth a priced draft drafts to, learnt from its costs and the survival it reaches."""

    def __init__(self, verify: RowCosts, overhead: CostTable, seed: dict[int, float] | None = None):
        self.verify, self.overhead = verify, overhead
        self.cost = CostTable(seed=dict(seed or {}))   # seconds per draft pass, by rows
        self.pos_mean: dict[int, float] = {}   # position → mean survival over rows (moving average)
        self.step_depth = 0                # the depth rows drafted to this step
        self.probing = False               # this step's depth is a probe: one row drafts it
        self._idle = 0                     # steps in a row that chose not to draft
        self._probe_every = PROBE_EVERY    # idle steps before the next probe
        self._idle_s = 0.0                 # seconds served since the last probe or drafting step

    def choose(self, depth: int, rows: int, catchup: int = 0) -> int:
        """The depth with the best expected tokens per second (the whole depth until a step has been
        measured), or a one-position probe after enough idle steps. `catchup`: tokens the probe's row
        would first feed the draft model."""
        self.step_depth, self.probing = depth, False
        if not self.cost or not self.verify:
            return depth
        rates = self._expected_rates(depth, rows)
        best = max(range(depth + 1), key=rates.__getitem__)
        if best:
            self._idle, self._probe_every, self._idle_s = 0, PROBE_EVERY, 0.0
        else:
            self._idle += 1
        if not best and self._idle >= self._probe_every and self._probe_pays(depth, rows, catchup, rates[0]):
            # each probe that does not make drafting pay doubles the wait for the next
            self._idle, self._idle_s, best, self.probing = 0, 0.0, min(depth, 1), True
            self._probe_every = min(PROBE_MAX, 2 * self._probe_every)
        self.step_depth = best
        return best

    def _probe_pays(self, depth: int, rows: int, catchup: int, base: float) -> bool:
        """A probe now? Only if the serving time since the last probe covers its price 1 ÷ PROBE_SHARE
        times (the catch-up pass, the target's one-row pass of that many tokens scaled by the draft's
        price per pass against the target's, and one draft pass), and drafting could pay at all (every
        row drafting d, every draft kept, beats `base`, the rate of drafting none, for some d)."""
        one = self.verify.at(1, 1)
        ratio = self.cost.at(1) / one if one > 0 else 1.0
        price = ratio * self.verify.at(1, max(1, catchup)) + self.cost.at(rows)
        if self._idle_s * PROBE_SHARE < price:
            return False
        return max(self._expected_rates(depth, rows, all_kept=True)[1:], default=0.0) > base

    def _expected_rates(self, depth: int, rows: int, all_kept: bool = False) -> list[float]:
        """Per d in 0..depth: tokens per second if every row drafted and verified d positions (the verify
        pass then trims, so this is the upper end of what drafting d can bring); `all_kept`: were every
        draft accepted (the most drafting d could ever bring). The tables are looked up once for all d."""
        verify = self.verify.table(rows)
        fixed, per_pass = self.overhead.at(rows), self.cost.at(rows)
        out, kept, survival = [], 0.0, 1.0
        for d in range(depth + 1):
            gain = rows * (1.0 + (d if all_kept else kept))
            cost = fixed + d * per_pass + verify.at(rows * (1 + d))
            out.append(gain / max(cost, 1e-9))
            # mean survival at position d: measured, else the one before it × the prior
            survival = self.pos_mean.get(d, survival * KEYED_PRIOR)
            kept += survival
        return out

    def floor(self, cutoff: float) -> float:
        """Model rows stop drafting once their raw survival falls below this."""
        return DRAFT_STOP * cutoff

    def learn(self, survivals: dict[int, list[float]]) -> None:
        """Mean survival per position over the rows under the budget (0 past a row's drafts)."""
        if not survivals:
            return
        sums = [0.0] * self.step_depth
        for s in survivals.values():
            for j, v in enumerate(s[:self.step_depth]):
                sums[j] += v
        for j, total in enumerate(sums):
            mean = total / len(survivals)
            old = self.pos_mean.get(j)
            self.pos_mean[j] = mean if old is None else 0.7 * old + 0.3 * mean

    def observe(self, prop, rows: int, step_s: float) -> None:
        """A draft pass's price by rows (a catch-up pass is a prefill of the backlog, not the price of a
        draft pass: left out), and the serving time towards the next probe."""
        passes = prop.passes - (1 if prop.catchup_s > 0 else 0)
        if passes > 0:
            self.cost.observe(rows, (prop.seconds - prop.catchup_s) / passes)
        self._idle_s += step_s
