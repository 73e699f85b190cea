"""The acceptance dial in the lesson: a chapter with `Chapter.dial` runs, when the page sets
`Context.acceptance` to A, on the local target with the synthetic draft `synthetic:A`
(`Pair.with_synthetic`, `specviz.engine.synthetic`).

A synthetic run needs its reference first: the target's own greedy continuation of each row, decoded
by the same engine at depth 0 on the same batch, untimed. `References` does that batch by batch and
keeps the bill. Every dial chapter's result carries `dial_keys(...)`:

    synthetic     A, or None when the pair's own draft ran (the figures' "synthetic draft (A = …)")
    reference_s   seconds the references took (paid before the timed runs, left out of every figure)
    realigned     rows whose output left their reference at a near-tie (they decoded on without drafts)

The Lesson tab reads what ran from the settings' `draft` (`synthetic:A`, as settings_of writes it) and
needs `reference_s` beside it: a result under the dial without them is refused; `realigned` is optional.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specviz import lessons
from specviz.chapters import common
from specviz.chapters.base import Context
from specviz.engine.synthetic import reference_run


def dialled(ctx: Context):
    """The pair a dial chapter runs on: the student's own, or its target with `synthetic:A`."""
    return ctx.pair if ctx.acceptance is None else ctx.pair.with_synthetic(ctx.acceptance)


def acceptance_of(pair) -> float | None:
    """A synthetic draft's dial A, None for a real draft."""
    return getattr(pair, "synthetic", None)


@dataclass
class References:
    """The references of one experiment, batch by batch, and their price."""

    seconds: float = 0.0
    engines: list = field(default_factory=list)

    def engine(self, pair, prompts: list[list[int]], batch: int, max_new: int, eos_ids: list[int] | None = None):
        """An engine of `pair` for the timed runs at `batch`, and the references they pass
        (`references=`; None for a real draft). With a synthetic draft the same engine has just decoded
        `prompts` at depth 0 on a batch of `batch` rows, `max_new` tokens long: untimed, its seconds billed here."""
        eng = pair.engine(eos_ids=eos_ids)
        self.engines.append(eng)
        if acceptance_of(pair) is None:
            return eng, None
        refs, seconds = reference_run(eng, prompts, batch, max_new)
        self.seconds += seconds
        return eng, refs

    @property
    def realigned(self) -> int:
        return sum(int(getattr(e.drafter, "realigned", 0)) for e in self.engines)


def warm_up(pair, refs: References, prompts: list[list[int]], depth: int) -> None:
    """common.warm_up, drafting on a synthetic draft too: after a reference of its own (billed to `refs`),
    so the first timed cell does not pick the kernels of the verify passes."""
    if acceptance_of(pair) is None:
        common.warm_up(pair, prompts, depth)
        return
    engine, ref = refs.engine(pair, prompts, 1, 4)
    common.timed_run(pair, prompts, max(depth, 1), 1, 4, engine=engine, references=ref)


def dial_keys(pair, refs: References | None = None) -> dict:
    """The keys every dial chapter's result carries (see the module docstring)."""
    synthetic = acceptance_of(pair)
    return {"synthetic": synthetic,
            "reference_s": None if synthetic is None or refs is None else round(refs.seconds, 4),
            "realigned": 0 if refs is None else refs.realigned}


def dial_title(L: dict, result: dict) -> str | None:
    """A chart's "synthetic draft (A = 0.7)" (its chapter's `dial_title`), None for a real draft."""
    a = result.get("synthetic")
    return None if a is None else lessons.chart_fill(L["dial_title"], {"acceptance": a})
