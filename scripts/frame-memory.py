#!/usr/bin/env python3
"""What one Playground frame kept for the language switch costs in memory (specviz.ui.shown).

A Streamer is fed a synthetic Run's steps (rows × tokens at depth k, a random number of drafts kept a step,
a tokenizer that gives each token a short word) and tracemalloc counts what it then holds: its steps, the
texts each row showed and the coloured views. Prints the row-steps and the megabytes.

    .venv/bin/python scripts/frame-memory.py [--rows 16] [--tokens 512] [--depth 6]
"""
from __future__ import annotations

import argparse
import random
import sys
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specviz.engine.request import RowStep, StepEvent  # noqa: E402
from specviz.ui.stream import Streamer  # noqa: E402


class _Words:
    def decode(self, ids, skip_special_tokens=False) -> str:
        return "".join(f" w{i % 1000}" for i in ids)


def _step(step: int, made: list[int], tokens: int, depth: int, rng: random.Random) -> StepEvent:
    rows = []
    for r in range(len(made)):
        kept = rng.randint(0, depth)
        drafted = [rng.randrange(50000) for _ in range(depth)]
        emitted = drafted[:kept] + [rng.randrange(50000)]
        made[r] += len(emitted)
        done = made[r] >= tokens
        rows.append(RowStep(r, drafted, kept, emitted, "bonus", done=done, finish="length" if done else ""))
    n = len(made)
    return StepEvent(step, n, depth, "fixed", rows, 0, 0, 0, 0, 0, n * (depth + 1), 100, 0, 0, 0, 0, 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--depth", type=int, default=6)
    args = ap.parse_args()
    rng, made = random.Random(0), [0] * args.rows
    tracemalloc.start()
    streamer = Streamer(SimpleNamespace(), SimpleNamespace(lang="en"), _Words(), "s", "en", None, ["p"])
    step = 0
    while min(made) < args.tokens:
        streamer.add(_step(step, made, args.tokens, args.depth, rng))
        step += 1
    held, _ = tracemalloc.get_traced_memory()
    print(f"{args.rows} rows × {args.tokens} tokens, depth {args.depth}: {step} steps, "
          f"{streamer.row_steps()} row-steps, {held / 1e6:.1f} MB held")


if __name__ == "__main__":
    main()
