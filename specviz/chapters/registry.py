"""The lesson's chapters, in lesson order: the one list the Lesson tab, deep links (`?chapter=`), the
recorder and the tests read (as `specviz.chapters.CHAPTERS`, `KEYS`, `BY_KEY`).

Adding a chapter: write `specviz/chapters/<key>.py` (its experiment, its conclusion rules, its figure and a
`CHAPTER = Chapter(...)` line; see `base.py`), add it below, and add `[chapter.<key>]` to
`specviz/lessons/en.toml` and `fa.toml`.
"""
from __future__ import annotations

from specviz.chapters import breadth_depth, frontier, knee, ledger, policies, race, sweep
from specviz.chapters.base import Chapter, Context, Result

# The order of the argument (SEED-NOTES): more FLOPs yet faster → the race → decode is memory-bound →
# breadth ≈ depth → the price → when it hurts → vLLM's answer and beyond → the frontier as the class grows.
CHAPTERS: tuple[Chapter, ...] = (
    Chapter("intro"),               # the source's argument in words: no experiment
    race.CHAPTER,
    knee.CHAPTER,
    breadth_depth.CHAPTER,
    ledger.CHAPTER,
    sweep.CHAPTER,
    policies.CHAPTER,
    frontier.CHAPTER,               # today's answer, measured: adaptive verification on the frontier
)
KEYS: tuple[str, ...] = tuple(c.key for c in CHAPTERS)
BY_KEY: dict[str, Chapter] = {c.key: c for c in CHAPTERS}
