"""Which pass the fast path runs on this CPU: chosen by timing whole passes, not by crediting a layout.

`layout.plan_for` times each matrix shape's products alone (stock, column-major, oneDNN, our kernel).
A pass is more than its products: our C layer (rows.c) runs a whole decoder layer as one call and saves
the ~25 small torch calls a layer makes, but where our product is slower than the BLAS library's, a
fixed credit for the C layer would choose a pass slower than eager. So the candidates here are whole
passes, timed on this model at each row class (1 row; a verify's 5; a shared batch's 16 × 5),
interleaved, medians:
- "C layers": every layer one C call, each matrix with the fastest product the C layer can call
  (our kernel, or the BLAS product F.linear runs, on the model's matrix or its column-major copy);
- "torch layers": the compact torch layer, each matrix in its fastest layout of all (oneDNN included);
- "eager" (one row only): the stock transformers modules, what the fast path must beat to be worth it.
Each row class takes the fastest fast candidate; `Plan.passes` keeps the figures (and whether eager
was faster, which `--compile auto` reads). The decision is cached beside the layout timings
(`layouts.json`) with the machine's load; one taken on a busy machine or a stale one is timed again.
`compact_for` is where a model's compact forward is built with that choice.

Exactness: through the BLAS product a row's sums may depend on how many rows share the call, so
verify's logits may differ from decode's in the last bits there (our own kernel keeps them equal);
the warm-up compares whole greedy generations before a pair is served, and the engine's tests check
that greedy output stays the target's own.
"""
from __future__ import annotations

import hashlib
import logging
import statistics
import time
from dataclasses import replace

import torch

from specviz.fastpath import layout, rows
from specviz.fastpath.cache import StaticCache
from specviz.fastpath.layout import C_LAYOUTS, CLASS_NAMES, PROBE_ROWS, Plan, _cache_key, choose, plan_for
from specviz.fastpath.llama import CompactLlama, check_supported, weights_of
from specviz.hardware.device import is_busy, load_now, read_table, remeasure_reason, write_table
from specviz.machine import cache_root

log = logging.getLogger("specviz.fastpath")

C, TORCH, EAGER = "C layers", "torch layers", "eager"
ROUNDS = 5                 # timed rounds per candidate and class (after one warm-up round)
BUDGET_S = 20.0            # stop after this long once 3 rounds are in (a busy machine is slow)
CONTEXT = (48, 48, 8)      # cached tokens before the timed pass, per class (the batch class: short prefill)


def compact_for(model, compiled: bool = False) -> CompactLlama:
    """The compact forward of `model` in the layouts whose whole passes measured fastest here (on CUDA, or
    compiled, the per-shape plan as it is). Raises llama.Unsupported for other architectures."""
    check_supported(model)
    weights = weights_of(model)
    plan = plan_for(weights, compiled)
    if plan.times and not compiled:          # measured per shape: now time whole passes
        plan = choose_pass(model, plan, weights)
    return CompactLlama(model, compiled, plan)


def candidates(base: Plan, head_shape: tuple[int, int]) -> dict[str, Plan]:
    """The fast pass candidates from the per-shape timings in `base`."""
    best = {s: choose(t) for s, t in base.times.items()}
    out = {TORCH: replace(base, choice=best, c_layers=(False,) * len(PROBE_ROWS))}
    if rows.library() is None:
        return out
    allowed = tuple(n for n in C_LAYOUTS if n == "rows" or rows.has_gemm())
    if not any(n in allowed for t in base.times.values() for n in t[0]):
        return out
    # the LM head is a torch product in both candidates: it keeps its fastest layout of all
    c_choice = {s: best[s] if s == head_shape else choose(t, allowed) for s, t in base.times.items()}
    out[C] = replace(base, choice=c_choice, c_layers=(True,) * len(PROBE_ROWS))
    return out


def choose_pass(model, base: Plan, weights: list[torch.Tensor]) -> Plan:
    """The plan whose passes measured fastest here (see the module docstring); `weights[0]` is the head."""
    head_shape = tuple(weights[0].shape)
    cands = candidates(base, head_shape)
    sig, digest = _signature(model, base, cands)
    record = _cached(sig, digest)
    if record is None:
        before = set(layout._COPIES)
        record = _measure(model, cands)
        _store(sig, digest, record)
    else:
        before = None
    winners = record["winners"]
    final = _merge(cands, winners, record, "cached" if before is None else "measured")
    if before is not None:
        _drop_unused(before, weights, final)
    log.info("fast path: %s", describe(final))
    return final


def describe(plan: Plan) -> str:
    """One line for the log: per row class the candidate kept and the figures it was chosen on."""
    p = plan.passes
    if not p:
        return plan.summary()
    parts = []
    for c, name in enumerate(CLASS_NAMES):
        ms = ", ".join(f"{cand} {p['ms'][cand][c]:.2f}" for cand in p["ms"] if p["ms"][cand][c] is not None)
        parts.append(f"{name}: {p['winners'][c]} ({ms} ms)")
    load = p.get("measured", {})
    busy = " on a busy machine" if is_busy(load) else ""
    return (f"whole passes timed{busy} ({p['source']}, load {load.get('load', '?')} on {load.get('cpus', '?')} "
            f"CPUs): " + "; ".join(parts))


def eager_faster(plan: Plan) -> tuple[float, float] | None:
    """(fast ms, eager ms) of a one-token pass when eager measured faster here, else None."""
    ms = plan.passes.get("ms", {})
    if EAGER not in ms or ms[EAGER][0] is None:
        return None
    fast = ms[plan.passes["winners"][0]][0]
    return (fast, ms[EAGER][0]) if ms[EAGER][0] < fast else None


# --- timing -------------------------------------------------------------------------------------------
def _measure(model, cands: dict[str, Plan]) -> dict:
    load = load_now()
    compacts = {name: CompactLlama(model, plan=plan) for name, plan in cands.items()}
    runs = {name: [_runner(model, comp, c) for c in range(len(PROBE_ROWS))] for name, comp in compacts.items()}
    runs[EAGER] = [_eager_runner(model)] + [None] * (len(PROBE_ROWS) - 1)
    samples = {name: [[] for _ in PROBE_ROWS] for name in runs}
    start = time.perf_counter()
    with torch.inference_mode():
        for rnd in range(ROUNDS + 1):            # round 0 warms caches and allocators
            if rnd > 3 and time.perf_counter() - start > BUDGET_S:
                break
            for c in range(len(PROBE_ROWS)):
                for name, per_class in runs.items():
                    if per_class[c] is None:
                        continue
                    t0 = time.perf_counter()
                    per_class[c]()
                    if rnd:
                        samples[name][c].append(time.perf_counter() - t0)
    ms = {name: [1e3 * statistics.median(s) if s else None for s in per] for name, per in samples.items()}
    winners = [min((n for n in cands if ms[n][c] is not None), key=lambda n: ms[n][c]) for c in range(len(PROBE_ROWS))]
    if is_busy(load):
        log.info("fast path: whole passes timed on a busy machine (load %.2f on %d CPUs); timed again at the "
                 "next start", load["load"], load["cpus"])
    return {"winners": winners, "ms": ms, "measured": load}


def _runner(model, compact, c: int):
    """A pass of class `c`'s shape through the engine's cache (StaticCache), after a short prefill."""
    (B, T), ctx = PROBE_ROWS[c], CONTEXT[c]
    vocab = compact.embed.shape[0]
    g = torch.Generator().manual_seed(c)
    cache = StaticCache(compact, B)
    with torch.inference_mode():
        cache.forward(model, torch.randint(0, vocab, (B, ctx), generator=g), torch.ones(B, ctx, dtype=torch.bool), 1)
    ids = torch.randint(0, vocab, (B, T), generator=g)
    valid = torch.ones(B, T, dtype=torch.bool)
    return lambda: cache.forward(model, ids, valid)


def _eager_runner(model):
    """A one-token pass through the stock transformers modules (what `--compile off` runs)."""
    from transformers import DynamicCache

    vocab = model.get_input_embeddings().weight.shape[0]
    g = torch.Generator().manual_seed(9)
    cache = DynamicCache()
    with torch.inference_mode():
        model(input_ids=torch.randint(0, vocab, (1, CONTEXT[0]), generator=g), past_key_values=cache,
              use_cache=True, logits_to_keep=1)
    ids = torch.randint(0, vocab, (1, 1), generator=g)
    return lambda: model(input_ids=ids, past_key_values=cache, use_cache=True)


# --- merging, caching, memory -----------------------------------------------------------------------
def _merge(cands: dict[str, Plan], winners: list[str], record: dict, source: str) -> Plan:
    base = next(iter(cands.values()))
    choice = {s: tuple(cands[winners[c]].choice[s][c] for c in range(len(PROBE_ROWS))) for s in base.choice}
    c_layers = tuple(w == C for w in winners)
    return replace(base, choice=choice, c_layers=c_layers,
                   passes={"winners": winners, "ms": record["ms"], "measured": record.get("measured", {}),
                           "source": source})


def _signature(model, base: Plan, cands: dict[str, Plan]) -> tuple[str, str]:
    """The cache key for this model's passes here, and a digest of the candidates (new per-shape timings
    can change the candidates: their passes are then timed again)."""
    shapes = ",".join(f"{a}x{b}:{base.nbytes.get((a, b), 0)}" for a, b in sorted(base.choice))
    sig = f"{_cache_key(torch.float32)} | passes | {len(model.model.layers)} layers | {shapes}"
    digest = hashlib.sha256(repr(sorted((n, sorted(p.choice.items()), p.c_layers) for n, p in cands.items()))
                            .encode()).hexdigest()[:16]
    return sig, digest


def _cached(sig: str, digest: str) -> dict | None:
    table = read_table(cache_root() / "layouts.json")
    rec = table.get(sig)
    if not isinstance(rec, dict) or rec.get("digest") != digest:
        return None
    why = remeasure_reason(rec.get("measured"))
    if why:
        log.info("fast path: the cached whole-pass timings were %s; timing them again", why)
        return None
    try:
        if len(rec["winners"]) == len(PROBE_ROWS) and all(w in rec["ms"] for w in rec["winners"]):
            return rec
    except (KeyError, TypeError):
        pass
    return None


def _store(sig: str, digest: str, record: dict) -> None:
    path = cache_root() / "layouts.json"
    with layout._CACHE_LOCK:
        table = read_table(path)
        table[sig] = {**record, "digest": digest}
        write_table(path, table)


def _drop_unused(before: set, weights: list[torch.Tensor], final: Plan) -> None:
    """Free the layout copies made only for a losing candidate (copies older than this choice, e.g. the
    target's used by its layer-skip draft, are left alone)."""
    with layout._LOCK:
        for w in weights:
            used = set(final.choice.get(tuple(w.shape), ()))
            for name in ("colmajor", "onednn", "rows"):
                key = (id(w), name)
                if key in layout._COPIES and key not in before and name not in used:
                    layout._COPIES.pop(key, None)
