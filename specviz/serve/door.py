"""The door: every request is checked here once, against one `Limits`, before it reaches a model.

The playground, the Gradio API (which bypasses the sliders' ranges), the ZeroGPU path and the CLI all
call `check_run` for a new Run and `check_knobs` for a live slider change; each bad value gets the same
sentence everywhere (`specviz.limits`, `specviz.engine.policies.PolicyError`). Past the door the values
are typed and in range: the engine's objects only assert their own invariants.
"""
from __future__ import annotations

from dataclasses import replace

from specviz.engine.policies import PolicyChoice
from specviz.limits import Limits, RunArgs, check_request, whole


def check_run(batch, depth, temperature, max_new, policy=None, threshold=None, limits: Limits = Limits(),
              table: dict[int, int] | None = None, max_depth: int | None = None) -> RunArgs:
    """A new Run's numbers and policy (UI name + threshold field, or the CLI's table / max depth)."""
    nums = check_request(batch, depth, temperature, max_new, limits)
    return replace(nums, policy=PolicyChoice.parse(policy, threshold, table=table, max_depth=max_depth))


def check_knobs(depth=None, batch=None, limits: Limits = Limits()) -> tuple[int | None, int | None]:
    """A live slider change (None: that slider did not move)."""
    d = None if depth is None else whole(depth, "speculation depth", 0, limits.max_depth)
    b = None if batch is None else whole(batch, "batch size (rows)", 1, limits.max_rows_per_user)
    return d, b
