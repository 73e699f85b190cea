"""What one request may ask for, checked in one place.

Every entry point — the CLI, the Gradio API (which bypasses the sliders' ranges), the playground, the
engine itself — calls `check_request` (or one of the small checks it is built from), so a number out of
range gets the same sentence everywhere. A public Space meets curious students: batch size 100000,
depth -3, a 200,000-character prompt, "NaN" for a temperature. Each gets a sentence a student
understands, never a traceback.

`Limits` holds the caps; the defaults suit a laptop or a CPU Space. The app may lower the per-user rows
(SPECVIZ_MAX_ROWS_PER_USER) and the shared batch (SPECVIZ_MAX_SHARED_ROWS).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any

from specviz.lessons import Key, Said

MAX_DEPTH = 16          # draft tokens per step; deeper chains are accepted whole only by near-copies
ENGINE_MAX_NEW = 4096   # what the engine itself accepts (experiments, benchmarks); users get Limits.max_new_tokens


class LimitError(ValueError):
    """A request outside the limits; the message is meant for a student (a `lessons.Said`: English as its
    text, shown in the student's language by the page)."""


# what each checked number is called in a sentence (lesson keys, so a page can say it in Persian)
WHAT = {"batch size (rows)": "errors.what_batch", "speculation depth": "errors.what_depth",
        "temperature": "errors.what_temperature", "max new tokens": "errors.what_max_new"}


def _what(what: str):
    return Key(WHAT[what]) if what in WHAT else what


@dataclass(frozen=True)
class Limits:
    max_rows_per_user: int = 64        # rows one request (one student's batch-size slider) may open
    max_shared_rows: int = 64          # rows in the shared batch, all users together
    max_depth: int = MAX_DEPTH
    min_new_tokens: int = 1
    max_new_tokens: int = 512         # the playground's slider, the API and the CLI: one range everywhere
    max_prompt_tokens: int = 4096      # after the chat template
    max_prompt_chars: int = 20_000     # checked before tokenizing: a huge paste is refused at once
    max_temperature: float = 2.0
    max_queue: int = 32                # requests waiting for room in the shared batch

    def __post_init__(self):
        # the engine's own caps bound every configurable limit (a larger value would pass the door and then
        # fail the engine's invariants)
        assert 0 <= self.max_depth <= MAX_DEPTH and 1 <= self.max_new_tokens <= ENGINE_MAX_NEW


def limits_from_env(base: Limits = Limits()) -> Limits:
    """The classroom limits, with the per-user and shared rows overridable by environment variables."""
    def env_int(name: str, default: int) -> int:
        raw = os.environ.get(name, "").strip()
        return int(raw) if raw.isdigit() and int(raw) > 0 else default
    per_user = env_int("SPECVIZ_MAX_ROWS_PER_USER", 16)
    shared = env_int("SPECVIZ_MAX_SHARED_ROWS", base.max_shared_rows)
    return Limits(min(per_user, shared), shared, base.max_depth, base.min_new_tokens, base.max_new_tokens,
                  base.max_prompt_tokens, base.max_prompt_chars, base.max_temperature,
                  env_int("SPECVIZ_MAX_QUEUE", base.max_queue))


def whole(value, what: str, lo: int, hi: int) -> int:
    """A whole number in [lo, hi], from an int, a float with no fraction, or a numeric string."""
    if isinstance(value, bool):
        raise LimitError(Said("errors.not_whole", what=_what(what), lo=lo, hi=hi, value=repr(value)))
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise LimitError(Said("errors.not_whole", what=_what(what), lo=lo, hi=hi, value=brief(value))) from None
    if not math.isfinite(number) or number != int(number):
        raise LimitError(Said("errors.not_whole", what=_what(what), lo=lo, hi=hi, value=brief(value)))
    if not lo <= number <= hi:
        raise LimitError(Said("errors.out_of_range", what=_what(what), lo=lo, hi=hi, number=brief(value)))
    return int(number)


def between(value, what: str, lo: float, hi: float) -> float:
    """A finite number in [lo, hi]."""
    try:
        number = float(value)
    except (TypeError, ValueError, OverflowError):
        raise LimitError(Said("errors.not_number", what=_what(what), lo=lo, hi=hi, value=brief(value))) from None
    if not math.isfinite(number) or not lo <= number <= hi:
        raise LimitError(Said("errors.not_number", what=_what(what), lo=lo, hi=hi, value=brief(value)))
    return number


def brief(value, width: int = 40) -> str:
    """A value quoted in a refusal: short, whatever was sent (1e308 stays "1e+308", not 309 digits)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        return Said("errors.long_number", digits=int(value.bit_length() * 0.30103) + 1)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
            and abs(value) >= 1e9:
        return f"{value:.3g}"
    try:
        text = repr(value)
    except RecursionError:
        text = f"a deeply nested {type(value).__name__}"
    return text if len(text) <= width else text[:width - 3] + "…"


def check_prompt_text(text, limits: Limits = Limits()) -> str:
    if text is None or not isinstance(text, str):
        raise LimitError(Said("errors.prompt_not_text"))
    if not text.strip():
        raise LimitError(Said("errors.prompt_empty"))
    if len(text) > limits.max_prompt_chars:
        raise LimitError(Said("errors.prompt_too_many_chars", chars=len(text), limit=limits.max_prompt_chars))
    return text


def check_prompt_ids(ids: list[int], limits: Limits = Limits()) -> list[int]:
    if not ids:
        raise LimitError(Said("errors.prompt_no_tokens"))
    if len(ids) > limits.max_prompt_tokens:
        raise LimitError(Said("errors.prompt_too_long", tokens=len(ids), limit=limits.max_prompt_tokens))
    return ids


@dataclass(frozen=True)
class RunArgs:
    """One request's values, checked."""

    batch: int
    depth: int
    temperature: float
    max_new: int
    policy: Any = None        # a checked engine.policies.PolicyChoice, filled in at the door (serve/door.py)


def check_request(batch, depth, temperature, max_new, limits: Limits = Limits()) -> RunArgs:
    """A request's numbers (the door, `specviz.serve.door.check_run`, adds its policy)."""
    return RunArgs(whole(batch, "batch size (rows)", 1, limits.max_rows_per_user),
                   whole(depth, "speculation depth", 0, limits.max_depth),
                   between(temperature, "temperature", 0.0, limits.max_temperature),
                   whole(max_new, "max new tokens", limits.min_new_tokens, limits.max_new_tokens))
