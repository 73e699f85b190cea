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
- `adaptive-verification`: draft up to the requested depth, then verify only the slots most likely to
  survive, a budget chosen per step over the whole batch (DSpark; see `specviz.engine.budget`).

Each class carries its name; `POLICIES`, the registry at the end, is the one list of them: name → class,
the parameters each reads with their checks, and the lesson keys of its label and help line. What names
or lists a policy (the page's radio, the CLI's --policy, deep links, chapters, the door) reads it.
"""
from __future__ import annotations

import bisect
import math
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable, ClassVar, Protocol

from specviz.hardware.roofline import expected_tokens_per_pass
from specviz.lessons import Said, quoted
from specviz.limits import MAX_DEPTH, brief


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
    budgeted: bool = False             # the engine's verification budget trims these rows' drafts


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
    reached: int | None = None   # drafts the target came to (StepEvent.reached); None: take `drafted`


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
    name: ClassVar[str] = "disable-by-batch-size"
    threshold: int = 8

    def plan(self, ctx: PlanContext) -> StepPlan:
        return StepPlan(0 if ctx.batch_size > self.threshold else ctx.depth)

    def observe(self, obs: StepObservation) -> None:
        pass

    def describe(self) -> str:
        return f"no speculation above {self.threshold} rows"


@dataclass
class BatchTable:
    name: ClassVar[str] = "batch-table"
    table: dict[int, int] = field(default_factory=lambda: {1: 6, 4: 4, 8: 2, 16: 1, 32: 0})

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
    name: ClassVar[str] = "confidence"
    threshold: float = 0.5

    def plan(self, ctx: PlanContext) -> StepPlan:
        return StepPlan(ctx.depth, self.threshold)

    def observe(self, obs: StepObservation) -> None:
        pass

    def describe(self) -> str:
        return f"rows stop drafting below {self.threshold:.2f} draft confidence"


class AdaptiveVerification:
    """Rows draft up to the requested depth; the engine's batch-wide budget (`specviz.engine.budget`)
    then picks which drafted slots the target verifies. The state lives in the engine, because the
    budget is shared by every row of the batch, whoever's request it is."""

    name = "adaptive-verification"

    def plan(self, ctx: PlanContext) -> StepPlan:
        return StepPlan(ctx.depth, budgeted=True)

    def observe(self, obs: StepObservation) -> None:
        pass

    def describe(self) -> str:
        return "verify the slots most likely to survive, a budget per step from measured costs"


@dataclass
class AdaptiveGoodput:
    """Pick k ∈ [0, max_depth] maximising B·E[tokens/pass](α, k) ÷ (k·t_draft + t_verify(B·(k+1))).

    α is an exponential moving average of the measured per-token acceptance; t_draft the measured time
    of one draft pass; t_verify(n) the measured verify time at n tokens per pass, interpolated between
    the points seen so far. Outside the measured range it is optimistic — flat above, proportional to n
    below — so the policy tries unmeasured depths, and the measurement then corrects the guess.
    """

    name: ClassVar[str] = "adaptive"
    max_depth: int = 8
    smoothing: float = 0.2
    probe_every: int = 24     # steps at k=0 before trying speculation again (α may have changed)
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
            # α per draft the target came to: kept ÷ drafted counts the drafts after a rejection, never
            # judged, and read α low the deeper the policy went
            judged = obs.reached if obs.reached else obs.drafted
            self.alpha = (1 - s) * self.alpha + s * (obs.accepted / judged)
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


# --- the registry ---------------------------------------------------------------------------------------
def _number(value) -> float:
    """A threshold as a finite number (the page sends its Number box, the API may send anything)."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise PolicyError(Said("errors.threshold_not_number", value=brief(value))) from None
    if not math.isfinite(number):
        raise PolicyError(Said("errors.threshold_not_finite"))
    return number


def _batch_threshold(value) -> int:
    t = _number(value)
    if t < 0 or t != int(t):
        raise PolicyError(Said("errors.threshold_batch", value=t))
    return int(t)


def _probability(value) -> float:
    t = _number(value)
    if not 0.0 <= t <= 1.0:
        raise PolicyError(Said("errors.confidence_range", value=t))
    return t


def _whole(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _table(value) -> tuple[tuple[int, int], ...]:
    """(batch, depth) pairs, sorted: hashable and picklable, as a PolicyChoice must be."""
    try:
        items = sorted(dict(value).items())
    except (TypeError, ValueError):
        items = []
    if not items or not all(_whole(b) and _whole(k) and b >= 1 and 0 <= k <= MAX_DEPTH for b, k in items):
        raise PolicyError(Said("errors.batch_table_range", max_depth=MAX_DEPTH))
    return tuple(items)


def _depth_cap(value) -> int:
    if not _whole(value) or not 0 <= value <= MAX_DEPTH:
        raise PolicyError(Said("errors.adaptive_range", max_depth=MAX_DEPTH, value=brief(value)))
    return value


def _same(value):
    return value


@dataclass(frozen=True)
class Param:
    """One parameter a policy reads: the field that carries it (in PolicyChoice and in the class alike), its
    check (a user's value → the checked value, or PolicyError with a sentence) and how the class takes it."""

    field: str                           # "threshold" | "table" | "max_depth"
    check: Callable[[Any], Any]
    to_class: Callable[[Any], Any] = _same
    label_key: str | None = None         # the page's threshold box's label while this policy is picked


@dataclass(frozen=True)
class PolicySpec:
    """One registered policy: its class (which carries the name) and the parameters it reads."""

    cls: type
    params: tuple[Param, ...] = ()

    @property
    def name(self) -> str:
        return self.cls.name

    @property
    def label_key(self) -> str:
        """Its name for readers (lessons [policy_label]); the API and the CLI keep `name`."""
        return f"policy_label.{self.name}"

    @property
    def help_key(self) -> str:
        """Its one help line (lessons [policies])."""
        return f"policies.{self.name}"

    @property
    def threshold(self) -> Param | None:
        """The parameter the page's one threshold box sets, if this policy reads one."""
        return next((p for p in self.params if p.field == "threshold"), None)

    def default(self, param: Param):
        """The class's own default for `param`, in checked form."""
        f = next(f for f in fields(self.cls) if f.name == param.field)
        return param.check(f.default if f.default is not MISSING else f.default_factory())

    def check(self, given: dict) -> dict:
        """Each parameter this policy reads, checked (left out: its default); the others are dropped."""
        return {p.field: self.default(p) if given.get(p.field) is None else p.check(given[p.field])
                for p in self.params}

    def build(self, choice: "PolicyChoice") -> Policy:
        return self.cls(**{p.field: p.to_class(getattr(choice, p.field)) for p in self.params})


# Every policy a user can name, in the order the page lists them.
POLICIES: dict[str, PolicySpec] = {spec.name: spec for spec in (
    PolicySpec(FixedPolicy),
    PolicySpec(DisableByBatchSize, (Param("threshold", _batch_threshold, label_key="playground.threshold_disable"),)),
    PolicySpec(BatchTable, (Param("table", _table, to_class=dict),)),
    PolicySpec(AdaptiveGoodput, (Param("max_depth", _depth_cap),)),
    PolicySpec(ConfidencePolicy, (Param("threshold", _probability, label_key="playground.threshold_confidence"),)),
    PolicySpec(AdaptiveVerification),
)}
POLICY_NAMES = tuple(POLICIES)


def reading(field: str) -> list[str]:
    """The policies that read a parameter ("threshold", "table", "max_depth"), for help texts."""
    return [name for name, spec in POLICIES.items() if any(p.field == field for p in spec.params)]


def policy_spec(name) -> PolicySpec:
    """The registered policy a user named (None: the default one); PolicyError with a sentence otherwise."""
    name = FixedPolicy.name if name is None else (name.strip() if isinstance(name, str) else str(name))
    spec = POLICIES.get(name)
    if spec is None:
        shown = name if len(name) <= 40 else name[:37] + "…"
        raise PolicyError(Said("errors.unknown_policy", name=quoted(shown), names=", ".join(POLICY_NAMES)))
    return spec


def parse_table(text: str) -> dict[int, int]:
    """Parse "1:6,8:2,32:0" into {1: 6, 8: 2, 32: 0}."""
    try:
        pairs = [p.split(":") for p in text.split(",") if p.strip()]
        return {int(b): int(k) for b, k in pairs}
    except ValueError as exc:
        raise PolicyError(Said("errors.bad_batch_table", text=text)) from exc


@dataclass(frozen=True)
class PolicyChoice:
    """A policy as one typed value from the door to the engine: checked once (`parse`, which builds
    nothing), picklable (it crosses into a ZeroGPU worker and into the control file), and built afresh
    for every request (`build`), because policies keep per-request state (the adaptive one learns from its
    own steps). A parameter the policy reads holds the value it will use; the others are None."""

    name: str = FixedPolicy.name
    threshold: float | None = None                     # disable-by-batch-size (rows), confidence (probability)
    table: tuple[tuple[int, int], ...] | None = None   # batch-table: (batch, depth) pairs
    max_depth: int | None = None                       # adaptive: the deepest k it may pick

    @classmethod
    def parse(cls, name=None, threshold=None, table: dict[int, int] | None = None,
              max_depth: int | None = None) -> "PolicyChoice":
        """Check a policy named by a user (UI, API, CLI); raises PolicyError with a sentence. The page sends
        its threshold box with every policy: a parameter the policy does not read is dropped."""
        spec = policy_spec(name)
        return cls(spec.name, **spec.check({"threshold": threshold, "table": table, "max_depth": max_depth}))

    def build(self) -> Policy:
        """A fresh policy object, for one request."""
        return POLICIES[self.name].build(self)


def make_policy(name: str | None = None, threshold=None, table: dict[int, int] | None = None,
                max_depth: int | None = None) -> Policy:
    """Check and build at once, for code that runs a policy by name for one request of its own (the
    chapters' experiments, tests)."""
    return PolicyChoice.parse(name, threshold, table, max_depth).build()


FIXED = PolicyChoice()
