"""How the fast path stores the weight matrices it multiplies by, on a CPU — chosen by measuring.

Decode multiplies a few rows (one per sequence, k + 1 when verifying) by every weight matrix, so a pass
is the time to stream the weights through the matrix kernel, and which kernel streams fastest is a
property of the CPU, not of the code. Candidate layouts, all exact fp32 (the same products; sums may
round differently, ~1e-6, and the warm-up compares whole greedy generations before any is served):
- "stock":    the model's own [out, in] matrix, `F.linear` (MKL, or OpenBLAS/Accelerate on ARM); no copy
- "colmajor": the same matrix stored column-major ([in, out] in memory); `F.linear` then runs the
              non-transposed GEMM, the same call as `torch.mm(x, wᵀ-contiguous)`
- "onednn":   oneDNN's linear with the weight reordered for it once (where the op exists and agrees)
- "rows":     our own kernel (`specviz.fastpath.rows`): blocks of 16 output columns read once front to
              back with up to six rows' sums in registers (where a C compiler built it and it agrees)
The CPUs we measured disagree by up to 3× on which of these streams a few rows fastest, and one CPU's
winner at one row is not its winner at five (docs/BENCHMARKS.md keeps the figures): no layout wins
everywhere, so none is assumed.

So `plan_for` times the candidates on this model's own matrix shapes at three row classes — one row
(decode), a verify's rows (k + 1 = 5) and a shared batch (16 × (k + 1) = 80) — interleaved, best of
several rounds, and keeps per matrix shape the fastest layout per class. Stock costs no memory; a copy
in another layout is kept only where it wins by `MIN_GAIN`, at most `MAX_COPIES` per matrix, and a
matrix whose classes want different layouts holds each (`Routed`; `linear` picks by row count). The
timings and the choice are kept per machine in the user cache beside the calibrated peaks
(`layouts.json`), so a restart does not re-time. SPECVIZ_LAYOUT=stock|colmajor|onednn forces one layout
(for measurements and tests). Copies are shared per weight (a layer-skip draft and a self-draft reuse
the target's) and go when the weight goes. On CUDA the weights are used in place.

A compiled forward (`torch.compile`) gets the column-major copies: oneDNN's reordered weights are
opaque tensors that the compiler does not trace.
"""
from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from dataclasses import dataclass, field
from functools import lru_cache

import torch
import torch.nn.functional as F

from specviz.fastpath import rows
from specviz.hardware.device import is_busy, load_now, machine_key, read_table, remeasure_reason, write_table
from specviz.lessons import Key, Listed, Said
from specviz.machine import cache_root, cpu_model

log = logging.getLogger("specviz.fastpath")

PACK_ROWS = 8          # oneDNN reorders for this many rows: 1–16 rows all ran at their best with it
PROBE_ROWS = ((1, 1), (1, 5), (16, 5))     # (rows, tokens) timed per class: decode, verify, shared batch
# Saids: "1 row" … in logs and benchmarks, the reader's language in the counters
CLASS_NAMES = (Said("playground.fast.rows_one"), Said("playground.fast.rows_few"), Said("playground.fast.rows_many"))
FEW_ROWS = 16          # the upper bound of the middle class (rows × tokens of one pass)
MIN_GAIN = 0.10        # a copy in another layout must be this much faster than what is already kept
# what a whole C layer (rows.c) can multiply by: our kernel, or the BLAS product F.linear runs, on the
# model's own matrix or its column-major copy. Whether C layers pay is timed on whole passes
# (specviz.fastpath.passes), not credited here: where our product is the slower one, a credit would lose
C_LAYOUTS = ("rows", "stock", "colmajor")
MAX_COPIES = 2         # copies besides the model's own matrix, per matrix
PROBE_BYTES = 128 * 2**20   # matrices of one shape timed per round: more than a CPU's last-level cache
ROUNDS = 5
SHAPE_BUDGET_S = 3.0   # per matrix shape: stop after this long once 2 rounds are in (a busy machine is slow)

_COPIES: dict[tuple[int, str], tuple[weakref.ref, torch.Tensor]] = {}   # (id(weight), layout) → copy
_LOCK = threading.Lock()


def _shared(w: torch.Tensor, layout: str, make) -> torch.Tensor:
    key = (id(w), layout)
    with _LOCK:
        ref, copy = _COPIES.get(key, (None, None))
        if ref is not None and ref() is w:
            return copy
        copy = make(w.detach())
        # the dict is bound as a default: at interpreter exit module globals may already be None
        _COPIES[key] = (weakref.ref(w, lambda _, k=key, table=_COPIES: table.pop(k, None)), copy)
        return copy


def _colmajor_copy(t: torch.Tensor) -> torch.Tensor:
    return t.t().contiguous().t()


def _onednn_copy(t: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(t.contiguous(), PACK_ROWS)


_MAKERS = {"stock": lambda t: t, "colmajor": _colmajor_copy, "onednn": _onednn_copy, "rows": rows.pack}


def stored(w: torch.Tensor, layout: str) -> torch.Tensor:
    """`w` in `layout` (the model's own tensor for "stock"; one shared copy otherwise)."""
    if layout == "stock":
        return w
    return _shared(w, layout, _MAKERS[layout])


def stacked(ws: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """The matrices `ws` stacked row-wise into one (q/k/v, gate/up), made once per first weight and
    shared like the layout copies (a layer-skip draft reuses the target's)."""
    return _shared(ws[0], f"stacked{len(ws)}", lambda _: torch.cat([w.detach() for w in ws]))


@dataclass(frozen=True)
class Routed:
    """One weight held in a layout per row class (`linear` takes the one for the rows it multiplies)."""

    by_class: tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def row_class(rows: int) -> int:
    """0: one row (decode); 1: up to FEW_ROWS (a verify); 2: more (a shared batch, a prefill)."""
    return 0 if rows <= 1 else 1 if rows <= FEW_ROWS else 2


def linear(x: torch.Tensor, w, b: torch.Tensor | None = None) -> torch.Tensor:
    """x @ wᵀ + b for a weight in any of the layouts above (or a `Routed` one)."""
    if type(w) is Routed:
        w = w.by_class[row_class(x.numel() // x.shape[-1])]
    if type(w) is rows.Packed:
        return rows.multiply(x, w, b)
    if w.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, b, "none", [], "")
    return F.linear(x, w, b)


@lru_cache(maxsize=1)
def _onednn_agrees() -> bool:
    """oneDNN's linear exists here and computes what F.linear does (a probe, not a proof: the fast path's
    warm-up then compares whole greedy generations before the app switches)."""
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        g = torch.Generator().manual_seed(0)
        w, x, b = (torch.randn(*s, generator=g) for s in ((48, 32), (3, 2, 32), (48,)))
        got = linear(x, torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS), b)
        return got.shape == (3, 2, 48) and torch.allclose(got, F.linear(x, w, b), rtol=1e-4, atol=1e-4)
    except (RuntimeError, AttributeError, TypeError):
        return False


def available(dtype: torch.dtype) -> tuple[str, ...]:
    """The layouts this CPU can run for `dtype` (oneDNN's and ours only in fp32, where they agree)."""
    names = ["stock", "colmajor"]
    if dtype == torch.float32 and _onednn_agrees():
        names.append("onednn")
    if dtype == torch.float32 and rows.library() is not None:
        names.append("rows")
    return tuple(names)


# --- choosing from timings (pure: tests inject the numbers) ---------------------------------------
def choose(times: list[dict[str, float]], allowed: tuple[str, ...] | None = None) -> tuple[str, ...]:
    """The layout serving each row class, from `times[class][layout]` (seconds; a missing layout is not
    available; `allowed` narrows the candidates, e.g. to C_LAYOUTS). Stock is free and always kept; other
    layouts are added greedily — first the one with the largest relative gain in any class over what is
    kept — while that gain is at least MIN_GAIN, up to MAX_COPIES. Each class then takes the fastest kept
    layout. Every product is compared at its measured time: no layout gets a credit."""
    if allowed is not None:
        times = [{n: v for n, v in t.items() if n in allowed} for t in times]
    names = {n for t in times for n in t}
    kept = ["stock"] if "stock" in names else []

    def best_kept(t: dict[str, float]) -> float:
        return min((t[n] for n in kept if n in t), default=float("inf"))

    while sum(k != "stock" for k in kept) < MAX_COPIES:
        gains = {n: max(1 - t[n] / best_kept(t) if n in t else 0.0 for t in times)
                 for n in sorted(names - set(kept))}
        if not gains:
            break
        name = max(gains, key=gains.get)            # ties: the first name alphabetically
        if kept and gains[name] < MIN_GAIN:
            break
        kept.append(name)
    return tuple(min((n for n in kept if n in t), key=t.get) for t in times)


# --- timing the candidates on this machine --------------------------------------------------------
def time_layouts(shape: tuple[int, int], count: int, layouts: tuple[str, ...], dtype=torch.float32,
                 rounds: int = ROUNDS, budget_s: float = SHAPE_BUDGET_S,
                 probes: tuple[tuple[int, int], ...] = PROBE_ROWS) -> list[dict[str, float]]:
    """Seconds per matrix of `shape` for each layout at each (rows, tokens) of `probes`: `count` matrices (as
    many as the model has, up to PROBE_BYTES) streamed in turn, layouts interleaved, best of `rounds`
    (the least disturbed run: other programs only ever add time), fewer (not under 2) past `budget_s`."""
    out_f, in_f = shape
    n = max(1, min(count, PROBE_BYTES // max(1, out_f * in_f * torch.finfo(dtype).bits // 8)))
    g = torch.Generator().manual_seed(0)
    base = [torch.randn(out_f, in_f, generator=g).to(dtype) for _ in range(n)]   # values do not change timing
    mats = {name: [_MAKERS[name](w) for w in base] for name in layouts}
    xs = [torch.randn(r, t, in_f, generator=g).to(dtype) for r, t in probes]
    best = [{name: float("inf") for name in layouts} for _ in probes]
    start = time.perf_counter()
    with torch.inference_mode():
        for rnd in range(rounds + 1):               # round 0 warms caches, allocators and kernels
            if rnd > min(2, rounds) and time.perf_counter() - start > budget_s:
                break
            for c, x in enumerate(xs):
                for name in layouts:
                    t0 = time.perf_counter()
                    for w in mats[name]:
                        linear(x, w)
                    if rnd:
                        best[c][name] = min(best[c][name], (time.perf_counter() - t0) / n)
    return best


@dataclass(frozen=True)
class Plan:
    """Which layout serves each matrix shape at each row class, and where that decision came from."""

    choice: dict[tuple[int, int], tuple[str, ...]]
    source: str                                     # "measured", "cached", "forced …", "default …"
    times: dict[tuple[int, int], list[dict[str, float]]] = field(default_factory=dict)
    nbytes: dict[tuple[int, int], int] = field(default_factory=dict)   # weight bytes per shape (summary)
    c_layers: tuple[bool, ...] = (False,) * len(PROBE_ROWS)   # per row class: whole layers in C (rows.c)
    passes: dict = field(default_factory=dict)      # the whole-pass timings that chose (passes.py), for logs

    def store(self, w: torch.Tensor):
        """`w` as the fast path keeps it: one tensor, or a `Routed` one when its classes differ."""
        per_class = self.choice.get(tuple(w.shape), ("stock",) * len(PROBE_ROWS))
        if len(set(per_class)) == 1:
            return stored(w, per_class[0])
        return Routed(tuple(stored(w, name) for name in per_class))

    def by_class(self) -> list[dict[str, float]]:
        """Per row class, each layout's share of the weight bytes it serves."""
        out = []
        for c in range(len(PROBE_ROWS)):
            shares: dict[str, float] = {}
            for shape, names in self.choice.items():
                shares[names[c]] = shares.get(names[c], 0) + self.nbytes.get(shape, 1)
            total = sum(shares.values()) or 1
            out.append({k: v / total for k, v in sorted(shares.items(), key=lambda kv: -kv[1])})
        return out

    def summary(self) -> str:
        """A short line for logs, counters and benchmarks: "weights onednn (1 row), stock (2+ rows)"."""
        if not self.choice:          # on CUDA: every matrix as the model holds it
            return Said("playground.fast.weights", layouts=Key("playground.fast.in_place"))
        parts = []
        for name, shares in zip(CLASS_NAMES, self.by_class()):
            text = " + ".join(k if len(shares) == 1 else f"{k} {round(100 * v)} %" for k, v in shares.items())
            parts.append((text, name))
        merged: list[list] = []
        for text, name in parts:                       # "stock (1 row, 2-16 rows)" instead of repeating
            if merged and merged[-1][0] == text:
                merged[-1][1].append(name)
            else:
                merged.append([text, [name]])
        if len(merged) == 1:
            return Said("playground.fast.weights", layouts=merged[0][0])
        return Said("playground.fast.weights", layouts=Listed(
            Said("playground.fast.layout_rows", layout=text, rows=Listed(names)) for text, names in merged))


IDENTITY = Plan({}, "in place")


def plan_for(weights: list[torch.Tensor], compiled: bool = False, refresh: bool = False) -> Plan:
    """The layout plan for a model's matrices `weights` (see the module docstring)."""
    if not weights or weights[0].device.type != "cpu":
        return IDENTITY
    dtype = weights[0].dtype
    counts: dict[tuple[int, int], int] = {}
    for w in weights:
        counts[tuple(w.shape)] = counts.get(tuple(w.shape), 0) + 1
    nbytes = {s: n * s[0] * s[1] * weights[0].element_size() for s, n in counts.items()}
    forced = os.environ.get("SPECVIZ_LAYOUT", "").strip().lower()
    if compiled:
        forced = "colmajor"                          # what the compiler traces
    if forced:
        if forced not in available(dtype):
            log.warning("SPECVIZ_LAYOUT=%s is not one of %s here; measuring instead", forced, available(dtype))
        else:
            # forced "rows": whole layers in C, as before; another forced layout keeps the torch layer
            return Plan({s: (forced,) * len(PROBE_ROWS) for s in counts}, f"forced {forced}", {}, nbytes,
                        (forced == "rows" and not compiled,) * len(PROBE_ROWS))
    times, cached = _cached_times(counts, dtype, refresh)
    plan = Plan({s: choose(t) for s, t in times.items()}, "cached" if cached else "measured", times, nbytes)
    log.info("fast path: per-shape products %s (%s on this CPU)", plan.summary(), plan.source)
    return plan


_CACHE_LOCK = threading.Lock()


def _cache_key(dtype: torch.dtype) -> str:
    # the kernel variant and its source too: timings of the 256-bit kernel say nothing of the 512-bit
    # one, nor an older kernel's of a newer one
    kernel = f"{rows.isa()} {rows.source_tag()}" if rows.isa() else "no kernel"
    return (f"{machine_key(torch.device('cpu'), dtype)} | {cpu_model()} | {torch.get_num_threads()} threads"
            f" | {kernel}")


def _cached_times(counts: dict[tuple[int, int], int], dtype: torch.dtype,
                  refresh: bool) -> tuple[dict[tuple[int, int], list[dict[str, float]]], bool]:
    """Timings per shape from `<cache>/layouts.json` (this machine, dtype, thread count), measuring the
    shapes not there yet (or all, with `refresh`) and storing them; and whether all came from the cache."""
    path = cache_root() / "layouts.json"
    key, names = _cache_key(dtype), available(dtype)
    with _CACHE_LOCK:                           # two models loading at once measure one at a time
        table = read_table(path)
        entry = table.get(key) if isinstance(table.get(key), dict) else {}
        why = remeasure_reason(entry.get("measured"))
        if why and any(f"{s[0]}x{s[1]}" in entry for s in counts):
            log.info("fast path: the cached layout timings were %s; timing them again", why)
            refresh = True
        out, missing = {}, []
        for shape in sorted(counts):
            got = entry.get(f"{shape[0]}x{shape[1]}")
            if not refresh and _valid(got, names):
                out[shape] = [{n: float(t[n]) for n in names} for t in got]
            else:
                missing.append(shape)
        if missing:
            log.info("fast path: timing %s weight layouts on this CPU for %d matrix shapes (once; cached)",
                     "/".join(names), len(missing))
        load = load_now()
        for shape in missing:
            out[shape] = time_layouts(shape, counts[shape], names, dtype)
            entry[f"{shape[0]}x{shape[1]}"] = out[shape]
        if missing:
            entry["measured"] = load      # the machine's load beside the timings: busy ones are re-taken
            if is_busy(load):
                log.info("fast path: layouts timed on a busy machine (load %.2f on %d CPUs); kept until the "
                         "next start only", load["load"], load["cpus"])
            table[key] = entry
            write_table(path, table)
    return out, not missing


def _valid(got, names) -> bool:
    return (isinstance(got, list) and len(got) == len(PROBE_ROWS)
            and all(isinstance(t, dict) and all(isinstance(t.get(n), (int, float)) for n in names) for t in got))


def forget(dtype: torch.dtype = torch.float32) -> None:
    """Drop this machine's layout timings (`python -m specviz calibrate` does, so the next load re-times
    alongside the fresh peaks)."""
    path = cache_root() / "layouts.json"
    key = _cache_key(dtype)
    with _CACHE_LOCK:
        table = read_table(path)
        gone = [k for k in table if k == key or k.startswith(key + " | passes")]   # and the whole-pass choices
        for k in gone:
            table.pop(k)
        if gone:
            write_table(path, table)
