"""Shape buckets of the graph path: which (rows, tokens per row, cache slots) get a captured pass, and
which bucket a pass of a given shape runs in. Pure arithmetic, no torch.

A CUDA graph replays fixed shapes, so a pass is padded up to its bucket: more rows (padding rows see
nothing), more tokens per row (scratch slots past the block that the next pass overwrites), more slots
(attention over slots no query may see). Padding is real arithmetic, and the knee the lesson measures is
rows × tokens per pass: k + 1 = 9 padded to 16 at 64 rows would compute 1,024 tokens instead of 576. So
the token buckets are fine where k + 1 lies (every value to 6, then 8, 10, 12, 16) and the graph path
reports the tokens it was given beside the tokens it computed (`graphs.GraphStats`).

Slots are bucketed too: every pass reads rows × slots of keys and values, so one bucket of the arena's
whole length would stream most of it for nothing at 64 rows.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import NamedTuple

ROWS = (1, 2, 4, 8, 16, 32, 64)                  # the shared batch's cap is 64 rows (limits.Limits)
TOKENS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)       # k + 1 for depths 0-5 exactly; deeper ones padded a little
SLOTS = (256, 512, 1024, 2048)                   # prompt + generated + holes, until compaction
WIDE = (32, 64, 128, 256, 512)                   # one row only: the knee chapter's wide passes


class Shape(NamedTuple):
    rows: int
    tokens: int       # per row
    slots: int        # cache slots every query attends over


@dataclass(frozen=True)
class Buckets:
    """The shapes captured at warm-up: every rows × tokens × slots bucket, plus `wide` token counts at
    one row (a pass that wide at more rows is a prefill, which runs eagerly)."""

    rows: tuple[int, ...] = ROWS
    tokens: tuple[int, ...] = TOKENS
    slots: tuple[int, ...] = SLOTS
    wide: tuple[int, ...] = WIDE
    budget_s: float = 120.0      # warm-up stops capturing after this long; the rest run eagerly (counted)

    def __post_init__(self):
        for name in ("rows", "tokens", "slots"):
            vals = getattr(self, name)
            if not vals or any(not isinstance(v, int) or v < 1 for v in vals):
                raise ValueError(f"graph buckets: {name} must be whole numbers of at least 1, got {vals!r}")
            object.__setattr__(self, name, tuple(sorted(set(vals))))
        object.__setattr__(self, "wide", tuple(sorted(set(self.wide) - set(self.tokens))))

    @property
    def max_rows(self) -> int:
        return self.rows[-1]

    @property
    def max_slots(self) -> int:
        return self.slots[-1]

    @property
    def max_tokens(self) -> int:
        """The widest block of one row a graph serves."""
        return max(self.tokens + self.wide)

    def shapes(self) -> list[Shape]:
        """Every captured shape in capture order: the largest first (it sizes the shared memory pool the
        others reuse), then the rest smallest first, so a warm-up cut short by `budget_s` leaves out the
        large shapes a class rarely reaches, not the one-row decode shapes every step uses."""
        grid = [Shape(r, t, s) for r in self.rows for t in self.tokens for s in self.slots if t <= s]
        grid += [Shape(1, t, s) for t in self.wide for s in self.slots if t <= s]
        grid.sort(key=lambda sh: (sh.rows * sh.tokens * sh.slots, sh))
        return grid[-1:] + grid[:-1]

    def pick(self, rows: int, tokens: int, length: int) -> Shape | None:
        """The smallest bucket for a block of `tokens` per row over `rows` rows appended to a cache of
        `length` slots (the padded block must fit after them), or None: no bucket holds it."""
        if rows < 1 or tokens < 1:
            return None
        r = _first_at_least(self.rows, rows)
        t = _first_at_least(self.tokens + (self.wide if r == 1 else ()), tokens)
        if r is None or t is None:
            return None
        s = _first_at_least(self.slots, length + t)
        return None if s is None else Shape(r, t, s)

    def arena_bytes(self, slot_bytes: int) -> int:
        """Bytes of the KV arena these buckets need, `slot_bytes` per row per slot (every layer, K and V;
        the runner adds one spare slot)."""
        return self.max_rows * self.max_slots * slot_bytes

    def within(self, max_bytes: int, slot_bytes: int) -> "Buckets":
        """These buckets with the largest row buckets dropped (then the largest slot buckets) until the
        arena fits in `max_bytes`; unchanged if it already does."""
        out = self
        while out.arena_bytes(slot_bytes) > max_bytes and len(out.rows) > 1:
            out = replace(out, rows=out.rows[:-1])
        while out.arena_bytes(slot_bytes) > max_bytes and len(out.slots) > 1:
            out = replace(out, slots=out.slots[:-1])
        return out


def for_roofline(tokens: list[int], context: int, cap: int) -> Buckets:
    """One row, each measured width up to `cap` tokens, and slots for the context plus two passes of it
    (`hardware.device.measure_latency` times the second pass of a width on a fresh cache)."""
    widths = tuple(n for n in tokens if n <= cap) or (1,)
    slots = tuple(sorted({_pow2_at_least(context + 2 * n) for n in widths}))
    return Buckets(rows=(1,), tokens=widths, slots=slots, wide=())


def parse(text: str) -> Buckets:
    """Buckets from "rows=1,2,4;tokens=1,2,3;slots=64,128;wide=8" (SPECVIZ_GRAPH_BUCKETS; missing
    parts keep their defaults). A ValueError says what is wrong."""
    fields: dict[str, tuple[int, ...]] = {}
    for part in (p.strip() for p in text.split(";") if p.strip()):
        name, _, vals = part.partition("=")
        name = name.strip()
        if name not in ("rows", "tokens", "slots", "wide"):
            raise ValueError(f"graph buckets: unknown part {name!r} (rows, tokens, slots or wide)")
        try:
            fields[name] = tuple(int(v) for v in vals.split(",") if v.strip())
        except ValueError:
            raise ValueError(f"graph buckets: {name} takes comma-separated whole numbers, got {vals!r}") from None
    return Buckets(**fields)


def _first_at_least(values: tuple[int, ...], n: int) -> int | None:
    return next((v for v in sorted(values) if v >= n), None)


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()
