"""vLLM's streamed output → the step records the playground draws (`specviz.engine.request.RowStep`).

What vLLM tells us per request: the generated token ids as they stream (one chunk per engine step while
the API server keeps up) and, at the end (`--per-request-spec-decode-metrics detailed`), two arrays with
one entry per verify step *that carried drafts*: `per_step_drafted` and `per_step_accepted`. Steps
without drafts (the prefill token, an n-gram miss) are not listed. vLLM never returns the rejected
drafts' text: SpecViz shows their count (`REJECTED` placeholders), never invented tokens.

Live, a chunk of n tokens reads as n - 1 accepted drafts and the target's own token. The rejected counts
arrive with the last chunk; `closing_step` adds them to the row then, so totals (and the acceptance
rate) are exact. `align` rebuilds the exact per-step reading afterwards (for the result JSON).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass

from specviz.engine.request import RowStep

REJECTED = -1          # a rejected draft whose text vLLM did not return (only counted)


def live_step(row: int, chunk: list[int], done: bool = False, finish: str = "") -> RowStep:
    """One streamed chunk as one step: all but the last token were accepted drafts."""
    kept = list(chunk[:-1])
    return RowStep(row, kept, len(kept), list(chunk), "bonus" if kept else "plain", done, finish)


def rejected_total(spec: dict | None) -> int:
    if not spec:
        return 0
    return int(spec.get("num_draft_tokens", 0)) - int(spec.get("num_accepted_draft_tokens", 0))


def closing_step(row: int, spec: dict | None, finish: str) -> RowStep | None:
    """The row's rejected drafts (counted, no text), reported when vLLM sends its per-request metrics.
    Where chunks merged several steps, the live reading over-counted accepted drafts; the exact figures
    are in `spec` (see `RowFigures`)."""
    n = rejected_total(spec)
    if n <= 0:
        return None
    return RowStep(row, [REJECTED] * n, 0, [], "plain", True, finish)


@dataclass(frozen=True)
class Step:
    """One engine step of one row in the exact reading: `drafted` 0 for a step without drafts."""

    tokens: int
    drafted: int
    accepted: int


def align(chunks: list[list[int]], spec: dict | None) -> list[Step] | None:
    """The exact sequence of steps that explains the streamed chunks and vLLM's per-step arrays.

    Each chunk boundary is a step boundary; a drafted step emits accepted + 1 tokens (fewer only if the
    token limit cut the last one), a step without drafts one token; the first token (prefill) has no
    drafts. Where a lone token could be a step without drafts or one that rejected all its drafts, the
    drafted reading is placed first (vLLM does not say which). None when no reading fits."""
    acc = list((spec or {}).get("per_step_accepted") or [])
    dra = list((spec or {}).get("per_step_drafted") or [])
    tokens = sum(len(c) for c in chunks)
    if not chunks or len(acc) != len(dra):
        return None
    bounds, pos = set(), 0
    for c in chunks:
        pos += len(c)
        bounds.add(pos)
    memo: dict[tuple[int, int], list[Step] | None] = {}

    def solve(t: int, j: int) -> list[Step] | None:
        if t == tokens:
            return [] if j == len(acc) else None
        if (t, j) in memo:
            return memo[(t, j)]
        found = None
        if t > 0 and j < len(acc):
            end = t + acc[j] + 1
            last = j == len(acc) - 1
            if end > tokens and last:
                end = tokens                      # the token limit cut this step
            if end <= tokens and not any(b in bounds for b in range(t + 1, end)):
                rest = solve(end, j + 1)
                if rest is not None:
                    found = [Step(end - t, dra[j], acc[j])] + rest
        if found is None:
            rest = solve(t + 1, j)
            if rest is not None:
                found = [Step(1, 0, 0)] + rest
        memo[(t, j)] = found
        return found
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 4 * tokens + 100))
    try:
        return solve(0, 0)
    finally:
        sys.setrecursionlimit(limit)


@dataclass(frozen=True)
class RowFigures:
    """One row's exact counts from vLLM's per-request metrics."""

    tokens: int
    drafted: int
    accepted: int


def reached_of(spec: dict | None) -> int | None:
    """Drafts the target came to (kept, and each step's first rejection: α's denominator), from the per-step
    lists; None where vLLM sent none (the live reading lumps a row's rejections into one closing step)."""
    if not spec or "per_step_drafted" not in spec:
        return None
    acc, dra = list(spec.get("per_step_accepted") or []), list(spec.get("per_step_drafted") or [])
    if len(acc) != len(dra):
        return None
    return sum(min(int(d), int(a) + 1) for d, a in zip(dra, acc))


def row_figures(tokens: int, spec: dict | None) -> RowFigures:
    s = spec or {}
    return RowFigures(tokens, int(s.get("num_draft_tokens", 0)), int(s.get("num_accepted_draft_tokens", 0)))
