"""What every chapter's experiment shares: a timed greedy run, the draft-cost estimate, and the snapshot
dicts the page streams.

A snapshot is a whole state, never a diff, so any yield can be drawn alone:

    chapter            the chapter's key
    done, progress     bool, 0..1
    device             hardware.device.device_name() of the device that ran it
    settings           the parameters of this run (and the pair's label)
    table              the chart's data as rows ({column: value}) — the CSV download
    values             the numbers the chapter's conclusion templates need, named exactly as the
                       placeholders in specviz/lessons/*.toml ({} until done)
    conclusion         the key of the conclusion variant that applies (None until done)
    conclusions        every conclusion key to show, in order (a chapter may show several)
    conclusion_values  one values dict per entry of `conclusions`

plus what each chapter's figure needs. Honest timing: the caller holds the device exclusively while an
experiment runs (specviz.serve.scheduler's DeviceGate), runs are measured one after the other, each
chapter warms up once, and an experiment never yields in the middle of a timed run — the consumer's work
between two yields (drawing a chart) must not land inside a measurement.
"""
from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass

from specviz.chapters.base import Result
from specviz.engine.policies import Policy, make_policy
from specviz.engine.request import Knobs, RunTotals, StepEvent
from specviz.hardware.device import device_name


@dataclass
class TimedRun:
    """One generation, measured start to end with nothing else in between."""

    events: list[StepEvent]
    ends: list[float]                 # seconds from the start to when each step's event arrived
    wall_s: float                     # end to end: prefill, every step, bookkeeping
    totals: RunTotals
    outputs: dict[int, list[int]]

    @property
    def tokens_per_s(self) -> float:
        """End-to-end throughput (prefill included), the number a user waits for."""
        return self.totals.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def draft_positions(self) -> int:
        """Sequential draft steps: per step the longest draft of any row (one draft pass per position
        for a model drafter; a single lookup for n-gram, whose time is then spread over them)."""
        return sum(max((len(r.drafted) for r in ev.rows), default=0) for ev in self.events)

    @property
    def mean_target_pass_s(self) -> float:
        return self.totals.verify_s / self.totals.steps if self.totals.steps else 0.0


def as_policy(policy: Policy | str | None) -> Policy | None:
    return make_policy(policy) if isinstance(policy, str) else policy


def timed_run(pair, prompts: list[list[int]], depth: int, batch: int, max_new: int,
              policy: Policy | str | None = None, engine=None, references: dict | None = None) -> TimedRun:
    """Generate greedily and time it; the events are only collected (nothing else runs in between).
    `engine`: one of `pair`'s to run on (default a fresh one); `references`: a synthetic draft's (see
    chapters.dial.reference), decoded by that engine before."""
    eng = engine if engine is not None else pair.engine()
    knobs = Knobs(depth=depth, batch_size=batch, policy=as_policy(policy))
    events, ends = [], []
    t0 = time.perf_counter()
    for ev in eng.generate(prompts, knobs, max_new, references=references):
        events.append(ev)
        ends.append(time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    return TimedRun(events, ends, wall, eng.totals, eng.outputs())


def warm_up(pair, prompts: list[list[int]], depth: int, batch: int = 1) -> None:
    """One short run first: the first forwards of a process allocate and pick kernels."""
    timed_run(pair, prompts, max(depth, 1), batch, 4)


def draft_cost(spec: TimedRun, plain: TimedRun) -> float:
    """Leviathan's c: mean time of one draft pass (spec run: draft time ÷ draft positions) ÷ mean time of
    one target pass at one token (the plain run's verify passes)."""
    per_draft = spec.totals.draft_s / spec.draft_positions if spec.draft_positions else 0.0
    return per_draft / plain.mean_target_pass_s if plain.mean_target_pass_s > 0 else 0.0


def device_of(pair) -> str:
    return device_name(pair.target.device)


def settings_of(pair, **kw) -> dict:
    return {"pair": pair.label, "target": pair.target.ref, "draft": pair.draft_ref, **kw}


def snapshot(chapter: str, pair, settings: dict, progress: float, table: list[dict], **extra) -> Result:
    return {"chapter": chapter, "done": False, "progress": round(min(max(progress, 0.0), 1.0), 4),
            "device": device_of(pair), "settings": settings, "table": copy.deepcopy(table), "values": {},
            "conclusion": None, "conclusions": [], "conclusion_values": [], **copy.deepcopy(extra)}


def finished(snapshot: Result, values: dict, conclusion: str, conclusions: list[str],
           conclusion_values: list[dict] | None = None) -> Result:
    snapshot.update(done=True, progress=1.0, values=values, conclusion=conclusion, conclusions=conclusions,
                    conclusion_values=conclusion_values or [values] * len(conclusions))
    return snapshot


def finite(x: float | None, default: float = 0.0) -> float:
    return float(x) if x is not None and math.isfinite(x) else default
