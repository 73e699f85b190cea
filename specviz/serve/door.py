"""The door: every request is checked here once, against one `Limits`, before it reaches a model.

The playground, the Gradio API (which bypasses the sliders' ranges), the ZeroGPU path and the CLI all
call `check_run` for a new Run and `check_knobs` for a live change (a slider, the policy radio or its
threshold box); each bad value gets the same sentence everywhere (`specviz.limits`,
`specviz.engine.policies.PolicyError`). Past the door the values are typed and in range: the engine's
objects only assert their own invariants, and callers use the values the door returns.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from specviz.engine.policies import PolicyChoice
from specviz.lessons import Key
from specviz.limits import Limits, RunArgs, check_request, whole


def check_run(batch, depth, temperature, max_new, policy=None, threshold=None, limits: Limits = Limits(),
              table: dict[int, int] | None = None, max_depth: int | None = None) -> RunArgs:
    """A new Run's numbers and policy (UI name + threshold field, or the CLI's table / max depth)."""
    nums = check_request(batch, depth, temperature, max_new, limits)
    return replace(nums, policy=PolicyChoice.parse(policy, threshold, table=table, max_depth=max_depth))


@dataclass(frozen=True)
class KnobChange:
    """A live change, checked; None where that control did not move."""

    depth: int | None = None
    batch: int | None = None
    policy: PolicyChoice | None = None


def check_knobs(depth=None, batch=None, policy=None, threshold=None, limits: Limits = Limits()) -> KnobChange:
    """A live change of a running request: a slider, or a policy picked by name with the threshold box's
    value (`policy` None: the policy did not change)."""
    d = None if depth is None else whole(depth, "speculation depth", 0, limits.max_depth)
    b = None if batch is None else whole(batch, "batch size (rows)", 1, limits.max_rows_per_user)
    p = None if policy is None else PolicyChoice.parse(policy, threshold)
    return KnobChange(d, b, p)


def check_count(value, what: str, hi: int) -> int:
    """A count a CLI command takes (users, rounds, threads at once): a whole number from 1 to `hi`; `what`
    is the lesson key that names it in the refusal."""
    return whole(value, Key(what), 1, hi)
