"""How deep to speculate each step.

A policy sees the live batch size and the depth the user asked for, and returns a `StepPlan`: the depth
to draft this step and, optionally, a confidence threshold under which a row stops drafting early (so
rows may end up with different depths in one step). After each step the engine reports what happened
(`StepObservation`), which the adaptive policy learns from.

- `fixed`: always the requested depth.
- `disable-by-batch-size`: after vLLM's former `--speculative-disable-by-batch-size` (removed in 2026 for
  a depth per batch size, `num_speculative_tokens_per_batch_size`; vLLM counted queued requests, here
  the rows running): depth 0 while more than `threshold` rows are active (under load the spare compute
  is gone, drafts only add work).
- `batch-table`: a depth per batch size (the largest table key ≤ B applies), e.g. profiled offline.
- `adaptive`: choose k each step to maximise expected tokens/s from the measured acceptance rate and
  the measured draft and verify times (SmartSpec's goodput, DSpark's load-aware depth).
- `confidence`: draft up to the requested depth, but a row stops when the draft's top probability
  falls below a threshold (DISCO / SpecDec++ / AdaEDL in spirit).
"""
from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Protocol

from specviz.hardware.roofline import expected_tokens_per_pass
from specviz.lessons import Said, quoted
from specviz.limits import MAX_DEPTH

POLICY_NAMES = ("fixed", "disable-by-batch-size", "batch-table", "adaptive", "confidence")


class PolicyError(ValueError):
    """Bad policy name or parameters; the message is meant for a human."""


@dataclass(frozen=True)
class PlanContext:
    batch_size: int   # rows active this step
    depth: int        # depth the user asked for (the slider / --depth)


@dataclass(frozen=True)
class StepPlan:
    depth: int                         # max draft tokens per row this step
    confidence: float | None = None    # stop a row's drafting below this top probability


@dataclass(frozen=True)
class StepObservation:
    batch_size: int
    depth: int              # planned depth
    drafted: int            # draft tokens proposed over all rows
    accepted: int           # of which accepted
    draft_s: float          # time in draft forwards
    draft_passes: int       # draft forward passes run
    verify_s: float         # time in the target's verify forward
    tokens_per_pass: int    # slots the verify pass processed (batch × (k+1))


class Policy(Protocol):
    """How deep one request speculates. Contract:

    - `plan` is called once per step, before drafting, with the *shared* batch size (every row of every
      request in this step) and the depth this request asked for; it returns the depth for this
      request's rows (the engine may still cut a row's depth near its token limit).
    - `observe` is called once per step after verification with what this request's rows drafted and
      accepted and what the shared passes cost; a policy may learn from it (adaptive) or ignore it.
    - A policy object belongs to exactly one request, so it may keep state without locks; the engine
      calls it only from the thread that steps the batch.
    """

    name: str

    def plan(self, ctx: PlanContext) -> StepPlan: ...

    def observe(self, obs: StepObservation) -> None: ...

    def describe(self) -> str: ...


class FixedPolicy:
    name = "fixed"

    def plan(self, ctx: PlanContext) -> StepPlan:
        return StepPlan(ctx.depth)

    def observe(self, obs: StepObservation) -> None:
        pass

    def describe(self) -> str:
        return "fixed depth"


@dataclass
class DisableByBatchSize:
    threshold: int = 8
    name: str = "disable-by-batch-size"

    def plan(self, ctx: PlanContext) -> StepPlan:
        return StepPlan(0 if ctx.batch_size > self.threshold else ctx.depth)

    def observe(self, obs: StepObservation) -> None:
        pass

    def describe(self) -> str:
        return f"no speculation above {self.threshold} rows"


@dataclass
class BatchTable:
    table: dict[int, int] = field(default_factory=lambda: {1: 6, 4: 4, 8: 2, 16: 1, 32: 0})
    name: str = "batch-table"

    def plan(self, ctx: PlanContext) -> StepPlan:
        keys = sorted(self.table)
        i = bisect.bisect_right(keys, ctx.batch_size) - 1
        return StepPlan(self.table[keys[max(i, 0)]])

    def observe(self, obs: StepObservation) -> None:
        pass

    def describe(self) -> str:
        return "depth by batch size " + ", ".join(f"B≥{b}: k={k}" for b, k in sorted(self.table.items()))


@dataclass
class ConfidencePolicy:
    threshold: float = 0.5
    name: str = "confidence"

    def plan(self, ctx: PlanContext) -> StepPlan:
        return StepPlan(ctx.depth, self.threshold)

    def observe(self, obs: StepObservation) -> None:
        pass

    def describe(self) -> str:
        return f"rows stop drafting below {self.threshold:.2f} draft confidence"


@dataclass
class AdaptiveGoodput:
    """Pick k ∈ [0, max_depth] maximising B·E[tokens/pass](α, k) ÷ (k·t_draft + t_verify(B·(k+1))).

    α is an exponential moving average of the measured per-token acceptance; t_draft the measured time
    of one draft pass; t_verify(n) the measured verify time at n tokens per pass, interpolated between
    the points seen so far. Outside the measured range it is optimistic — flat above, proportional to n
    below — so the policy tries unmeasured depths, and the measurement then corrects the guess.
    """

    max_depth: int = 8
    smoothing: float = 0.2
    probe_every: int = 24     # steps at k=0 before trying speculation again (α may have changed)
    name: str = "adaptive"
    alpha: float = 0.6        # prior acceptance until measured
    draft_pass_s: float | None = None
    verify_s: dict[int, float] = field(default_factory=dict)
    _since_draft: int = 0

    def plan(self, ctx: PlanContext) -> StepPlan:
        if not self.verify_s or self.draft_pass_s is None:
            return StepPlan(min(self.max_depth, max(ctx.depth, 1)))
        best = max(range(self.max_depth + 1), key=lambda k: self.goodput(ctx.batch_size, k))
        if best == 0 and self._since_draft >= self.probe_every:
            best = 1
        return StepPlan(best)

    def goodput(self, batch: int, k: int) -> float:
        """Expected tokens per second at batch `batch` and depth `k` under the current estimates."""
        t = k * (self.draft_pass_s or 0.0) + self._verify_time(batch * (k + 1))
        return batch * expected_tokens_per_pass(self.alpha, k) / max(t, 1e-9)

    def _verify_time(self, n: int) -> float:
        xs = sorted(self.verify_s)
        i = bisect.bisect_left(xs, n)
        if i < len(xs) and xs[i] == n:
            return self.verify_s[n]
        if i == 0:       # below every measurement: assume cost shrinks with tokens (optimistic)
            return self.verify_s[xs[0]] * n / xs[0]
        if i == len(xs):  # above every measurement: assume it stays flat (optimistic)
            return self.verify_s[xs[-1]]
        lo, hi = xs[i - 1], xs[i]
        w = (n - lo) / (hi - lo)
        return self.verify_s[lo] * (1 - w) + self.verify_s[hi] * w

    def observe(self, obs: StepObservation) -> None:
        s = self.smoothing
        if obs.drafted:
            self.alpha = (1 - s) * self.alpha + s * (obs.accepted / obs.drafted)
            self._since_draft = 0
        else:
            self._since_draft += 1
        if obs.draft_passes:
            per = obs.draft_s / obs.draft_passes
            self.draft_pass_s = per if self.draft_pass_s is None else (1 - s) * self.draft_pass_s + s * per
        old = self.verify_s.get(obs.tokens_per_pass)
        self.verify_s[obs.tokens_per_pass] = obs.verify_s if old is None else (1 - s) * old + s * obs.verify_s

    def describe(self) -> str:
        return f"adaptive goodput (α≈{self.alpha:.2f}, k ≤ {self.max_depth})"


def make_policy(name: str, threshold: float | None = None, table: dict[int, int] | None = None,
                max_depth: int | None = None):
    """Build a policy by its CLI/UI name; `threshold` is a batch size for disable-by-batch-size and a
    probability for confidence."""
    name = "fixed" if name is None else (name.strip() if isinstance(name, str) else str(name))
    if threshold is not None:
        try:
            threshold = float(threshold)
        except (TypeError, ValueError):
            raise PolicyError(Said("errors.threshold_not_number", value=repr(threshold))) from None
        if not math.isfinite(threshold):
            raise PolicyError(Said("errors.threshold_not_finite"))
    if name == "fixed":
        return FixedPolicy()
    if name == "disable-by-batch-size":
        t = 8 if threshold is None else threshold
        if t < 0 or int(t) != t:
            raise PolicyError(Said("errors.threshold_batch", value=t))
        return DisableByBatchSize(int(t))
    if name == "batch-table":
        if table is not None:
            if not table or any(b < 1 or not 0 <= k <= MAX_DEPTH for b, k in table.items()):
                raise PolicyError(Said("errors.batch_table_range", max_depth=MAX_DEPTH))
            return BatchTable(dict(table))
        return BatchTable()
    if name == "adaptive":
        m = 8 if max_depth is None else max_depth
        if not 0 <= m <= MAX_DEPTH:
            raise PolicyError(Said("errors.adaptive_range", max_depth=MAX_DEPTH, value=m))
        return AdaptiveGoodput(max_depth=m)
    if name == "confidence":
        t = 0.5 if threshold is None else threshold
        if not 0.0 <= t <= 1.0:
            raise PolicyError(Said("errors.confidence_range", value=t))
        return ConfidencePolicy(float(t))
    shown = name if len(name) <= 40 else name[:37] + "…"
    raise PolicyError(Said("errors.unknown_policy", name=quoted(shown), names=", ".join(POLICY_NAMES)))


def parse_table(text: str) -> dict[int, int]:
    """Parse "1:6,8:2,32:0" into {1: 6, 8: 2, 32: 0}."""
    try:
        pairs = [p.split(":") for p in text.split(",") if p.strip()]
        return {int(b): int(k) for b, k in pairs}
    except ValueError as exc:
        raise PolicyError(Said("errors.bad_batch_table", text=text)) from exc


# policies whose UI "threshold" field means something; for the others the field is ignored
THRESHOLD_POLICIES = ("disable-by-batch-size", "confidence")


@dataclass(frozen=True)
class PolicyChoice:
    """A policy as one typed value from the door to the engine: checked once (`parse`), picklable (it
    crosses into a ZeroGPU worker and into the control file), and built afresh for every request
    (`build`), because policies keep per-request state (the adaptive one learns from its own steps)."""

    name: str = "fixed"
    threshold: float | None = None                     # only for THRESHOLD_POLICIES
    table: tuple[tuple[int, int], ...] | None = None   # batch-table: (batch, depth) pairs
    max_depth: int | None = None                       # adaptive: the deepest k it may pick

    @classmethod
    def parse(cls, name=None, threshold=None, table: dict[int, int] | None = None,
              max_depth: int | None = None) -> "PolicyChoice":
        """Check a policy named by a user (UI, API, CLI); raises PolicyError with a sentence."""
        name = "fixed" if name is None else (name.strip() if isinstance(name, str) else str(name))
        threshold = threshold if name in THRESHOLD_POLICIES else None
        policy = make_policy(name, threshold=threshold, table=table, max_depth=max_depth)
        kept = getattr(policy, "threshold", None) if name in THRESHOLD_POLICIES else None
        return cls(policy.name, kept, tuple(sorted(table.items())) if table else None, max_depth)

    def build(self):
        return make_policy(self.name, threshold=self.threshold, table=dict(self.table) if self.table else None,
                           max_depth=self.max_depth)


FIXED = PolicyChoice()
