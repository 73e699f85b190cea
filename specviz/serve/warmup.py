"""Getting a loaded pair onto the fast path (`specviz.fastpath`) while the app already serves it eagerly.

The app loads every pair on the stock transformers modules first, so the first Run never waits for a
compiler. `warm` then builds the same pair on the fast path in a background thread, runs it over every
shape a Run meets (one and two rows, depth 0 and 4) — which is when `torch.compile` compiles, or loads
its persistent cache — and checks it before the app may switch:
- the greedy tokens must equal the eager path's on the warm-up prompt, or differ only where the target's
  own pass holds a near-tie (SpecViz's one rule, `engine.divergence`): in bf16 on a GPU the graph path's
  kernels sum in another order than the stock modules'. A fast path that changes any other token is
  never served;
- with --compile auto, a one-token target pass must be faster than the eager one, timed with the device
  to itself (`exclusive`), interleaved, medians.
Building the fast twin holds the device too: on a machine seen for the first time it times the weight
layouts (`specviz.fastpath.layout`, a few seconds, then cached), and a Run beside it would skew them.
Only then does it return the fast pair; the caller swaps it in between steps.
"""
from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass, replace

from specviz.engine.divergence import NEAR_TIE, Divergence, compare_rows, first_difference
from specviz.engine.request import Knobs
from specviz.pairs.pipeline import Pair, encode_prompt, load_pair
from specviz.serve.prompts import DEFAULT_PROMPT

WARM_TOKENS = 12          # new tokens per warm-up generation: enough steps for every shape and a median
PROMPT_TOKENS = 256       # a longer warm-up prompt keeps its last this many tokens
SHAPES = [(1, 0), (2, 0), (1, 4), (2, 4)]    # (rows, depth): what a Run meets first


@dataclass(frozen=True)
class WarmResult:
    pair: Pair | None            # the fast pair to serve from now on; None = stay on the eager path
    mode: str                    # the fast-path mode that was tried ("off" when none was)
    seconds: float               # building, compiling and checking it
    eager_ms: float | None       # median one-token target pass, eager path (when timed)
    fast_ms: float | None        # the same on the fast path
    note: str                    # a sentence: why it was (not) switched


def target_mode(choice: str, device_type: str) -> str | None:
    """The fast-path mode the app warms for a --compile choice (None: the fast path is off).
    auto: on a CPU the compact forward uncompiled — compiling it measured no faster there and costs a
    minute of both cores; on CUDA the graph path, where eager decode is bound by kernel launches."""
    if choice == "off":
        return None
    if choice == "static":
        return "static"
    if device_type != "cpu":
        return "graphs"
    return "compiled" if choice == "on" else "static"


def warm(eager: Pair, choice: str, exclusive=nullcontext, prompt_ids: list[int] | None = None) -> WarmResult:
    """Build, compile, check and (for auto) time the fast twin of `eager`; see the module docstring."""
    mode = target_mode(choice, eager.target.device.type)
    if mode is None:
        return WarmResult(None, "off", 0.0, None, None, "the fast path is off (--compile off)")
    t0 = time.perf_counter()
    with exclusive():     # on a machine seen for the first time this times the weight layouts (fastpath.layout)
        fast = load_pair(eager.target.ref, eager.draft_ref, eager.target.device, target=eager.target,
                         draft=eager.draft, compile="on" if mode in ("compiled", "graphs") else mode)
    # what the eager pair's steps taught about acceptance holds on any path
    fast = replace(fast, learnt=eager.learnt)
    if not fast.fast.on:
        return WarmResult(None, mode, time.perf_counter() - t0, None, None, fast.fast.note)
    ids = (prompt_ids or encode_prompt(eager.tokenizer, DEFAULT_PROMPT))[-PROMPT_TOKENS:]
    reference = _greedy(eager, ids, 1, 0)[0]
    ties: list[Divergence] = []
    for rows, depth in SHAPES:                  # compiles (or loads the compile cache) for each shape
        for out in _greedy(fast, ids, rows, depth):
            found, bug = _judged(eager, ids, out, reference)
            ties += found
            if bug is not None:
                return WarmResult(None, mode, time.perf_counter() - t0, None, None,
                                  f"the fast path gave other tokens than the eager one at {rows} rows, depth {depth} "
                                  f"({bug.said()}); staying eager")
    with exclusive():
        eager_ms, fast_ms = _one_token_ms(eager, fast, ids)
    seconds = time.perf_counter() - t0
    if choice == "auto" and fast_ms >= eager_ms:
        return WarmResult(None, mode, seconds, eager_ms, fast_ms,
                          f"measured slower here ({fast_ms:.1f} vs {eager_ms:.1f} ms a pass, {fast.fast.layout}); "
                          "staying eager")
    return WarmResult(fast, mode, seconds, eager_ms, fast_ms,
                      f"ready after {seconds:.1f} s: a one-token pass {fast_ms:.1f} ms vs {eager_ms:.1f} ms eager "
                      f"({fast.fast.layout})" + _ties_said(ties))


def _judged(eager: Pair, ids: list[int], out: list[int],
            reference: list[int]) -> tuple[list[Divergence], Divergence | None]:
    """(near-ties, the first difference that is not one) of a fast row against the eager path's. Past a
    near-tie the row goes on from its own token, so the eager path decodes on from there too, and the
    rest of the row is judged against that."""
    ties: list[Divergence] = []
    while (pos := first_difference(out, reference)) is not None:
        found = compare_rows(eager.target.model, eager.target.device, [ids], [out], [reference]).divergences[0]
        if not found.near_tie:
            return ties, found
        ties.append(found)
        prefix = out[:pos + 1]
        reference = prefix + _greedy(eager, ids + prefix, 1, 0)[0][:len(out) - len(prefix)]
    return ties, None


def _ties_said(ties: list[Divergence]) -> str:
    """What the check let through: rows that split a near-tie the other way, with the widest margin."""
    if not ties:
        return ""
    margin = max(d.margins.top1_minus_top2 for d in ties)
    return (f"; {len(ties)} near-ties split the other way (the target's two best tokens {margin:.3g} logits "
            f"apart at most; the rule: under {NEAR_TIE})")


def _greedy(pair: Pair, ids: list[int], rows: int, depth: int) -> list[list[int]]:
    eng = pair.engine()
    for _ in eng.generate([list(ids)] * rows, Knobs(depth=depth, batch_size=rows), WARM_TOKENS):
        pass
    return [eng.outputs()[r] for r in sorted(eng.outputs())]


def _pass_times(pair: Pair, ids: list[int]) -> list[float]:
    eng = pair.engine()
    return [ev.verify_s for ev in eng.generate([list(ids)], Knobs(depth=0, batch_size=1), WARM_TOKENS)][1:]


def _one_token_ms(eager: Pair, fast: Pair, ids: list[int], rounds: int = 2) -> tuple[float, float]:
    """Median one-token target pass on each path, interleaved so machine noise meets both alike."""
    e, f = [], []
    for _ in range(rounds):
        e += _pass_times(eager, ids)
        f += _pass_times(fast, ids)
    return 1e3 * statistics.median(e), 1e3 * statistics.median(f)
