"""The acceptance dial on the command line: one synthetic draft's bookkeeping, shared by `bench-hf`, `sweep`
and `bench-classroom`.

A synthetic draft (`synthetic:A`, `specviz.engine.synthetic`) needs the target's own continuation of every
row before its run: a reference decoded at depth 0 on the same batch and the same engine (for a class, one
depth-0 class through the same scheduler, `serve.workload.class_reference`). Its seconds are reported apart
(`reference_s`) and are never part of a timed figure; the drafters' counters (`realigned`: rows whose output
left their reference; `unreferenced`: rows that had none and drafted nothing) are summed over every run.
"""
from __future__ import annotations

from dataclasses import dataclass


def synthetic_note(rate: float) -> str:
    """What a synthetic draft is, in the words every command prints beside its figures."""
    return (f"synthetic draft (A = {rate:g}): the target's own continuation, each drafted token right with "
            f"probability {rate:g}; drafting is free")


@dataclass
class Dial:
    """One command's synthetic draft: its dial A (None: a real draft, and every method does nothing), the
    reference runs' seconds and the drafters' counters."""

    rate: float | None
    reference_s: float = 0.0          # every reference run, summed: the price of the dial, paid untimed
    realigned: int = 0
    unreferenced: int = 0

    @classmethod
    def of(cls, pair) -> "Dial":
        return cls(pair.synthetic)

    @property
    def on(self) -> bool:
        return self.rate is not None

    def reference(self, engine, prompts: list[list[int]], batch: int, max_new: int) -> dict | None:
        """prompt → the target's own continuation, decoded by `engine` at depth 0 on `batch` rows (None for a
        real draft). `engine` must end rows where the timed run's engines do."""
        if not self.on:
            return None
        # on first use: transformers is slow to import (the CLI checks its arguments first)
        from specviz.engine.synthetic import reference_run

        refs, secs = reference_run(engine, prompts, batch, max_new)
        self.reference_s += secs
        return refs

    def class_reference(self, sched, prompts: list[list[int]], max_new: int) -> dict | None:
        """The same for a class: one depth-0 class of these prompts (a user each) through `sched`."""
        if not self.on:
            return None
        # on first use: transformers is slow to import
        from specviz.serve.workload import class_reference

        refs, secs = class_reference(sched, prompts, max_new)
        self.reference_s += secs
        return refs

    def count(self, drafter) -> None:
        """Add one engine's drafter counters (a run that is part of the command's figures)."""
        if self.on:
            self.realigned += int(getattr(drafter, "realigned", 0))
            self.unreferenced += int(getattr(drafter, "unreferenced", 0))

    def as_dict(self) -> dict | None:
        """The JSON's `synthetic` object (None for a real draft)."""
        if not self.on:
            return None
        return {"rate": self.rate, "reference_s": self.reference_s, "realigned": self.realigned,
                "unreferenced": self.unreferenced, "note": synthetic_note(self.rate)}
