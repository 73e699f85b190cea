"""The door: every request is checked here once, against one `Limits`, before it reaches a model.

The playground, the Gradio API (which bypasses the sliders' ranges), the ZeroGPU path and the CLI all
call `check_run` for a new Run and `check_knobs` for a live change (a slider, the policy radio or its
threshold box, the acceptance dial); each bad value gets the same sentence everywhere (`specviz.limits`,
`specviz.engine.policies.PolicyError`). Past the door the values are typed and in range: the engine's
objects only assert their own invariants, and callers use the values the door returns.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from specviz.engine.policies import PolicyChoice
from specviz.lessons import Key, Said, quoted
from specviz.limits import LimitError, Limits, RunArgs, check_request, whole


def check_run(batch, depth, temperature, max_new, policy=None, threshold=None, limits: Limits = Limits(),
              table: dict[int, int] | None = None, max_depth: int | None = None,
              synthetic: bool = False) -> RunArgs:
    """A new Run's numbers and policy (UI name + threshold field, or the CLI's table / max depth).
    `synthetic`: the Run drafts with the synthetic draft, which proposes the target's own greedy tokens,
    so it is refused any temperature but 0."""
    nums = check_request(batch, depth, temperature, max_new, limits)
    if synthetic and nums.temperature > 0:
        raise LimitError(Said("errors.synthetic_sampling"))
    return replace(nums, policy=PolicyChoice.parse(policy, threshold, table=table, max_depth=max_depth))


def check_acceptance(value) -> float:
    """The acceptance dial A: the chance that a synthetic draft's token is the target's own, a number from
    0 to 1 (kept to the hundredth, as the lesson's dial keeps it); true/false and anything else refused."""
    try:
        a = None if isinstance(value, bool) else float(str(value).strip())
    except (TypeError, ValueError):
        a = None
    if a is None or not math.isfinite(a) or not 0.0 <= a <= 1.0:
        raise LimitError(Said("errors.bad_acceptance", value=quoted(str(value)[:40])))
    return round(a, 2)


@dataclass(frozen=True)
class KnobChange:
    """A live change, checked; None where that control did not move."""

    depth: int | None = None
    batch: int | None = None
    policy: PolicyChoice | None = None
    acceptance: float | None = None


def check_knobs(depth=None, batch=None, policy=None, threshold=None, limits: Limits = Limits(),
                acceptance=None) -> KnobChange:
    """A live change of a running request: a slider, a policy picked by name with the threshold box's
    value (`policy` None: the policy did not change), or the acceptance dial."""
    d = None if depth is None else whole(depth, "speculation depth", 0, limits.max_depth)
    b = None if batch is None else whole(batch, "batch size (rows)", 1, limits.max_rows_per_user)
    p = None if policy is None else PolicyChoice.parse(policy, threshold)
    a = None if acceptance is None else check_acceptance(acceptance)
    return KnobChange(d, b, p, a)


def check_count(value, what: str, hi: int) -> int:
    """A count a CLI command takes (users, rounds, threads at once): a whole number from 1 to `hi`; `what`
    is the lesson key that names it in the refusal."""
    return whole(value, Key(what), 1, hi)
