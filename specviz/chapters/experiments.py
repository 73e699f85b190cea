"""The Lesson tab's experiments: one generator per chapter, measured on the loaded pair on this machine.

Every generator yields plain JSON-able dicts (the UI streams them, saves their `table` as CSV, and a
recording may replay them). Each dict is a whole snapshot, never a diff, so any yield can be drawn alone:

    chapter            "race" | "knee" | "breadth_depth" | "ledger" | "sweep" | "policies"
    done, progress     bool, 0..1
    device             hardware.device_name() of the device that ran it
    settings           the parameters of this run (and the pair's label)
    table              the chart's data as rows ({column: value}) — the CSV download
    values             the numbers the chapter's conclusion templates need, named exactly as the
                       placeholders in specviz/lessons/*.toml ({} until done)
    conclusion         the key of the conclusion variant that applies (None until done)
    conclusions        every conclusion key to show, in order (a chapter may show several)
    conclusion_values  one values dict per entry of `conclusions` (the policies chapter has one
                       `conclusion_row` per batch size, each with its own numbers)

plus what each chart needs (the race's `segments` and `tokens`, the ledger's `parts`, …; see each
generator). Conclusion variants are picked by the small named rules below, from the measured numbers.

Default sizes fit the lesson's time goals on the 2-core CPU with the offline SmolLM2-135M and the n-gram
draft (measured with the machine otherwise idle): race ≈ 1.5 s, knee ≈ 16 s, breadth vs depth ≈ 6 s,
ledger ≈ 1.5 s, policies ≈ 25 s (B 1/4/12, 16 new tokens: 18 runs), sweep ≈ 35 s (B up to 32).

Honest timing: the caller holds the device exclusively while a generator runs (specviz.serve.scheduler's
DeviceGate), runs are measured one after the other, each chapter warms up once, and a generator never
yields in the middle of a timed run — the consumer's work between two yields (drawing a chart) must not
land inside a measurement.
"""
from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

from specviz.hardware.device import KNEE_TOKENS, Peaks, device_name, find_knee, knee_steps
from specviz.engine.policies import POLICY_NAMES, Policy, make_policy
from specviz.hardware.profiles import PUBLISHED_LABEL, load_published
from specviz.engine.request import Knobs, RunTotals, StepEvent
from specviz.hardware.roofline import (best_depths, crossover_from_rows, expected_tokens_per_pass, latency_curve,
                              predicted_knee, walltime_improvement)
from specviz.engine.torchmode import inference_steps
from specviz.lessons import Said

Result = dict[str, Any]

# --- conclusion rules (thresholds in one place, each with its reason) ---------------------------------
RACE_FASTER = 1.05       # ±5 %: run-to-run noise of a short CPU run; inside it the race is a draw
RACE_SLOWER = 0.95
KNEE_FLAT = 1.15         # 2 tokens within 15 % of 1 token: "almost free"; beyond it extra tokens cost
OVERHEAD_FACTOR = 2.0    # the rule of hardware.step_metrics: > 2× the roofline time = overhead-bound
BD_MATCH = 0.25          # breadth and depth "cost about the same" when within 25 % of each other
SWEEP_PAYS = 1.05        # a depth "pays" at a batch size when it beats plain decoding by ≥ 5 % (the race's band)
LEDGER_AGREE = 0.15      # theory and measured speed-up within 15 % "agree"
POLICIES_CLOSE = 0.05    # every policy within 5 % of the others at every batch: the choice hardly matters


def race_conclusion(speedup: float) -> str:
    """Faster if speculation finished ≥ 5 % sooner, slower if ≥ 5 % later, else even."""
    if speedup >= RACE_FASTER:
        return "conclusion_faster"
    if speedup <= RACE_SLOWER:
        return "conclusion_slower"
    return "conclusion_even"


def knee_conclusion(ratio2: float, t1_s: float, roofline_t1_s: float | None) -> str:
    """Not memory-bound when a 2-token pass costs ≥ 15 % more than a 1-token pass (extra tokens are not
    free); else overhead-bound when one token took over twice its roofline time (fixed costs, not the
    weight read, fill the pass); else flat (memory-bound: the textbook case)."""
    if ratio2 >= KNEE_FLAT:
        return "conclusion_not_memory_bound"
    if roofline_t1_s is not None and t1_s > OVERHEAD_FACTOR * roofline_t1_s:
        return "conclusion_overhead_bound"
    return "conclusion_flat"


def breadth_depth_breakpoint(ns: list[int], breadth_s: list[float], depth_s: list[float]) -> int | None:
    """The smallest n from which on breadth and depth differ by more than 25 % at every larger n too
    (one noisy mismatch below a matching point is not a breakpoint); None if they match at the largest n."""
    match = [abs(b / d - 1) <= BD_MATCH if d > 0 else False for b, d in zip(breadth_s, depth_s)]
    if not match or match[-1]:
        return None
    i = len(match) - 1
    while i > 0 and not match[i - 1]:
        i -= 1
    return ns[i]


def ledger_agreement(theory_speedup: float, measured_speedup: float) -> tuple[str, float]:
    """Relative difference |theory ÷ measured − 1|; agree when it is at most 15 %."""
    diff = abs(theory_speedup / measured_speedup - 1) if measured_speedup > 0 else 1.0
    return ("conclusion_agree" if diff <= LEDGER_AGREE else "conclusion_differ"), diff


def sweep_best_depths(rows: list[dict]) -> dict[int, int]:
    """Batch size → best depth: the fastest cell (roofline.best_depths), unless no depth beats plain
    decoding by 5 % — then k = 0: a 1 % "win" on a shared CPU is noise, not a reason to speculate."""
    best = best_depths(rows)
    for b, k in best.items():
        ups = [r["speedup"] for r in rows if r["batch_size"] == b and r["depth"] > 0 and r.get("speedup")]
        if k and max(ups, default=0.0) < SWEEP_PAYS:
            best[b] = 0
    return best


def sweep_crossover(rows: list[dict]) -> int | None:
    """The smallest batch size from which on, at every larger one too, the best depth is 0 (no depth paid,
    by the 5 % rule above): roofline.crossover_from_rows over those best depths."""
    best = sweep_best_depths(rows)
    return crossover_from_rows([{"batch_size": b, "depth": k, "tokens_per_s": 1.0} for b, k in best.items()])


def sweep_conclusion(crossover: int | None) -> str:
    """A crossover exists when, from some batch size on, plain decoding (k = 0) was the best depth."""
    return "conclusion_no_crossover" if crossover is None else "conclusion_crossover"


def policies_conclusion(winners: dict[int, str], spread: float) -> str:
    """Close when every policy was within 5 % of the others at every batch size (the winner is then
    noise); else the same winner everywhere; else a switch (different winners at small and large B)."""
    if spread <= POLICIES_CLOSE:
        return "conclusion_close"
    if len(set(winners.values())) == 1:
        return "conclusion_same_winner"
    return "conclusion_switch"


# --- Leviathan et al. 2023 -------------------------------------------------------------------------------

def leviathan_theory(alpha: float, depth: int, c: float) -> dict[str, float]:
    """Expected tokens per target pass and wall-time speed-up for acceptance α, depth γ and draft cost c
    (roofline's implementations of Leviathan et al.'s equation 1 and theorem 3.8)."""
    return {"tokens_per_pass": expected_tokens_per_pass(alpha, depth),
            "speedup": walltime_improvement(alpha, depth, c)}


# --- measuring runs --------------------------------------------------------------------------------------

@dataclass
class TimedRun:
    """One generation, measured start to end with nothing else in between."""

    events: list[StepEvent]
    ends: list[float]                 # seconds from the start to when each step's event arrived
    wall_s: float                     # end to end: prefill, every step, bookkeeping
    totals: RunTotals
    outputs: dict[int, list[int]]

    @property
    def tokens_per_s(self) -> float:
        """End-to-end throughput (prefill included), the number a user waits for."""
        return self.totals.tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def draft_positions(self) -> int:
        """Sequential draft steps: per step the longest draft of any row (one draft pass per position
        for a model drafter; a single lookup for n-gram, whose time is then spread over them)."""
        return sum(max((len(r.drafted) for r in ev.rows), default=0) for ev in self.events)

    @property
    def mean_target_pass_s(self) -> float:
        return self.totals.verify_s / self.totals.steps if self.totals.steps else 0.0


def _policy(policy: Policy | str | None) -> Policy | None:
    return make_policy(policy) if isinstance(policy, str) else policy


def timed_run(pair, prompts: list[list[int]], depth: int, batch: int, max_new: int,
              policy: Policy | str | None = None) -> TimedRun:
    """Generate greedily and time it; the events are only collected (nothing else runs in between)."""
    eng = pair.engine()
    events, ends = [], []
    t0 = time.perf_counter()
    for ev in eng.generate(prompts, Knobs(depth=depth, batch_size=batch, policy=_policy(policy)), max_new):
        events.append(ev)
        ends.append(time.perf_counter() - t0)
    wall = time.perf_counter() - t0
    return TimedRun(events, ends, wall, eng.totals, eng.outputs())


def warm_up(pair, prompts: list[list[int]], depth: int, batch: int = 1) -> None:
    """One short run first: the first forwards of a process allocate and pick kernels."""
    timed_run(pair, prompts, max(depth, 1), batch, 4)


def draft_cost(spec: TimedRun, plain: TimedRun) -> float:
    """Leviathan's c: mean time of one draft pass (spec run: draft time ÷ draft positions) ÷ mean time of
    one target pass at one token (the plain run's verify passes)."""
    per_draft = spec.totals.draft_s / spec.draft_positions if spec.draft_positions else 0.0
    return per_draft / plain.mean_target_pass_s if plain.mean_target_pass_s > 0 else 0.0


# --- result dicts ----------------------------------------------------------------------------------------

def _device(pair) -> str:
    return device_name(pair.target.device)


def _settings(pair, **kw) -> dict:
    return {"pair": pair.label, "target": pair.target.ref, "draft": pair.draft_ref, **kw}


def _snapshot(chapter: str, pair, settings: dict, progress: float, table: list[dict], **extra) -> Result:
    return {"chapter": chapter, "done": False, "progress": round(min(max(progress, 0.0), 1.0), 4),
            "device": _device(pair), "settings": settings, "table": copy.deepcopy(table), "values": {},
            "conclusion": None, "conclusions": [], "conclusion_values": [], **copy.deepcopy(extra)}


def _final(snapshot: Result, values: dict, conclusion: str, conclusions: list[str],
           conclusion_values: list[dict] | None = None) -> Result:
    snapshot.update(done=True, progress=1.0, values=values, conclusion=conclusion, conclusions=conclusions,
                    conclusion_values=conclusion_values or [values] * len(conclusions))
    return snapshot


def _finite(x: float | None, default: float = 0.0) -> float:
    return float(x) if x is not None and math.isfinite(x) else default


# --- chapter: the race -----------------------------------------------------------------------------------

def lane(run: TimedRun, name: str) -> tuple[list[dict], list[dict]]:
    """Segments {lane, kind, start_s, end_s, tokens} and token ticks {lane, t_s, index, kind} of one run,
    on its own clock (0 = the run's start). A step ends when its event arrived; it began wall_s before,
    drafting first, then the verify pass (in the engine's order)."""
    segs, ticks, n = [], [], 0
    for i, (ev, end) in enumerate(zip(run.events, run.ends)):
        start = max(0.0, end - ev.wall_s)
        if i == 0 and ev.prefill_s > 0:
            segs.append({"lane": name, "kind": "prefill", "start_s": max(0.0, start - ev.prefill_s),
                         "end_s": start, "tokens": 0})
        t = start
        # a depth-0 step drafts nothing: its few µs of drafter bookkeeping are no draft pass (on a busy
        # machine they passed 0.1 ms and drew one on the plain lane)
        if ev.depth > 0 and (ev.drafted or ev.draft_s > 1e-4):
            segs.append({"lane": name, "kind": "draft", "start_s": t, "end_s": t + ev.draft_s, "tokens": 0})
            t += ev.draft_s
        kind = "plain" if ev.tokens_per_pass == ev.batch_size else "verify"
        segs.append({"lane": name, "kind": kind, "start_s": t, "end_s": t + ev.verify_s, "tokens": ev.emitted})
        for r in ev.rows:
            kinds = ["accepted"] * min(r.accepted, len(r.emitted)) + [r.last_kind]
            for k in kinds[: len(r.emitted)]:
                n += 1
                ticks.append({"lane": name, "t_s": end, "index": n, "kind": k})
    return segs, ticks


def _lane_summary(run: TimedRun) -> dict:
    t = run.totals
    return {"wall_s": run.wall_s, "tokens": t.tokens, "steps": t.steps, "prefill_s": t.prefill_s,
            "draft_s": t.draft_s, "verify_s": t.verify_s, "tokens_per_s": run.tokens_per_s}


@inference_steps
def run_race(pair, prompt_ids: list[int], depth: int = 4, max_new: int = 48,
             policy: Policy | str | None = None) -> Iterator[Result]:
    """Plain decoding (k = 0), then speculative decoding (k = depth) of the same prompt, greedy, one after
    the other; yields after each run. Extra keys: `segments`, `tokens` (ticks), `lanes` (per-lane
    totals), `identical` (greedy outputs equal), `replayed_together` (always True: the lanes are two
    sequential measurements drawn on one clock)."""
    settings = _settings(pair, depth=depth, max_new=max_new,
                         policy=getattr(_policy(policy), "name", "fixed"), prompt_tokens=len(prompt_ids))
    extra = {"segments": [], "tokens": [], "lanes": {}, "identical": None, "replayed_together": True}
    yield _snapshot("race", pair, settings, 0.0, [], **extra)
    warm_up(pair, [prompt_ids], depth)
    plain = timed_run(pair, [prompt_ids], 0, 1, max_new)
    segs, ticks = lane(plain, "plain")
    extra.update(segments=segs, tokens=ticks, lanes={"plain": _lane_summary(plain)})
    yield _snapshot("race", pair, settings, 0.5, segs, **extra)
    spec = timed_run(pair, [prompt_ids], depth, 1, max_new, policy)
    s_segs, s_ticks = lane(spec, "spec")
    extra.update(segments=segs + s_segs, tokens=ticks + s_ticks,
                 lanes={"plain": _lane_summary(plain), "spec": _lane_summary(spec)},
                 identical=plain.outputs == spec.outputs)
    values = race_values(plain, spec)
    key = race_conclusion(values["speedup"])
    yield _final(_snapshot("race", pair, settings, 1.0, segs + s_segs, **extra), values, key, [key])


def race_values(plain: TimedRun, spec: TimedRun) -> dict:
    """Speed-up end to end (prefill included): the ratio of end-to-end tokens/s, which is plain wall ÷
    speculative wall when both wrote the same tokens (greedy: they do)."""
    t = spec.totals
    speedup = spec.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s > 0 else 0.0
    passes = [ev.tokens_per_pass / ev.batch_size for ev in spec.events]
    return {"speedup": speedup, "slowdown": 1 / speedup if speedup > 0 else 0.0,
            "flops_ratio": t.flops_ratio,
            "tokens_per_pass": statistics.fmean(passes) if passes else 0.0,   # slots each verify checked
            "tokens_per_step": t.mean_accepted_length,                         # tokens each verify kept
            "acceptance": _finite(t.acceptance_rate), "draft_cost": draft_cost(spec, plain),
            "plain_s": plain.wall_s, "spec_s": spec.wall_s,
            "plain_passes": plain.totals.steps, "spec_passes": t.steps}


# --- chapter: the knee -----------------------------------------------------------------------------------

@inference_steps
def run_knee(pair, peaks: Peaks | None, context: int = 256, repeats: int = 3,
             cap: int | None = None) -> Iterator[Result]:
    """Latency of one target pass against tokens per pass (hardware.knee_steps: log-spaced up to 128 on
    CPU, 512 on GPU, median of `repeats`), one yield per point, with the ideal roofline from this
    machine's calibrated `peaks` (None: no roofline, and no overhead-bound verdict). Extra keys:
    `predicted_knee` (roofline), `measured_knee`."""
    t, spec = pair.target, pair.target_spec
    cap = cap or (512 if t.device.type == "cuda" else 128)
    total = len([n for n in KNEE_TOKENS if n <= cap])
    predicted = predicted_knee(spec, peaks.bandwidth, peaks.flops, context) if peaks else None
    settings = _settings(pair, context=context, repeats=repeats, cap=cap,
                         peaks=None if peaks is None else {"bandwidth": peaks.bandwidth, "flops": peaks.flops})
    extra = {"predicted_knee": predicted, "measured_knee": None}
    yield _snapshot("knee", pair, settings, 0.0, [], **extra)
    ns, lat, rows = [], [], []
    # through the forward path the pair's engine runs (the fast path once the app has switched to it)
    for ns, lat in knee_steps(t.model, t.device, t.dtype, context, repeats, cap, pair.target_cache):
        rows = knee_rows(spec, peaks, context, ns, lat)
        yield _snapshot("knee", pair, settings, len(ns) / total, rows, **extra)
    values = knee_values(ns, lat, rows)
    extra["measured_knee"] = values["knee"]
    key = knee_conclusion(values["ratio2"], lat[0], rows[0]["roofline_ms"] / 1000 if peaks else None)
    yield _final(_snapshot("knee", pair, settings, 1.0, rows, **extra), values, key, [key])


def knee_rows(spec, peaks: Peaks | None, context: int, ns: list[int], lat: list[float]) -> list[dict]:
    roof = latency_curve(spec, peaks.bandwidth, peaks.flops, ns, context) if peaks else [None] * len(ns)
    return [{"tokens_per_pass": n, "measured_ms": 1000 * s, "roofline_ms": None if r is None else 1000 * r,
             "ms_per_token": 1000 * s / n} for n, s, r in zip(ns, lat, roof)]


def knee_values(ns: list[int], lat: list[float], rows: list[dict]) -> dict:
    """knee: where the measured curve leaves its flat part (hardware.find_knee), within the range measured;
    ratio2: a 2-token pass ÷ a 1-token pass; overhead_ms: the cheapest pass (the floor)."""
    knee = find_knee(ns, lat) if len(ns) >= 2 else float(ns[-1])
    knee = int(round(min(max(_finite(knee, ns[-1]), 1.0), ns[-1])))
    ratio2 = lat[1] / lat[0] if len(lat) > 1 and lat[0] > 0 else 1.0
    return {"knee": knee, "ratio2": ratio2, "overhead_ms": 1000 * min(lat),
            "one_token_ms": 1000 * lat[0], "roofline_one_token_ms": rows[0]["roofline_ms"]}


# --- chapter: breadth vs depth ---------------------------------------------------------------------------

def _sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _pass_seconds(model, cache, device, rows: int, tokens: int, context: int, vocab: int, repeats: int) -> float:
    """Median time of one forward of rows × tokens new tokens on top of `cache` (context slots per row).
    The cache is cropped back after every pass, so each repeat sees the same context; the first pass is
    a warm-up and not counted."""
    import torch

    ids = torch.randint(0, vocab, (rows, tokens), device=device)
    times = []
    for r in range(repeats + 1):
        _sync(device)
        t0 = time.perf_counter()
        model(input_ids=ids, past_key_values=cache, use_cache=True)
        _sync(device)
        if r:
            times.append(time.perf_counter() - t0)
        # drop the pass's new slots; a negative count means "remove this many" in every transformers 5.x
        # (a positive one meant an absolute length in older releases and is refused by newer ones)
        cache.crop(-(cache.get_seq_length() - context))
    return statistics.median(times)


@inference_steps
def run_breadth_depth(pair, context: int = 256, ns: Iterable[int] = (1, 2, 4, 8, 16, 32, 64),
                      repeats: int = 3) -> Iterator[Result]:
    """At each tokens per pass n: one target pass of n rows × 1 token (breadth: every row has its own
    `context`-slot cache) against 1 row × n tokens (depth: a verify of n − 1 drafts on one cache). One
    yield per n. Extra key: `breakpoint` (first n from which they stop matching, or None)."""
    import torch
    from transformers import DynamicCache

    model, device = pair.target.model, pair.target.device
    ns = sorted({int(n) for n in ns if int(n) >= 1})
    vocab = model.get_input_embeddings().weight.shape[0]
    settings = _settings(pair, context=context, ns=ns, repeats=repeats)
    yield _snapshot("breadth_depth", pair, settings, 0.0, [], breakpoint=None)
    rows: list[dict] = []
    one = DynamicCache()
    model(input_ids=torch.randint(0, vocab, (1, context), device=device), past_key_values=one,
          use_cache=True, logits_to_keep=1)
    for i, n in enumerate(ns):
        depth_s = _pass_seconds(model, one, device, 1, n, context, vocab, repeats)
        wide = copy.deepcopy(one)
        wide.batch_repeat_interleave(n)            # n rows with the same context, n caches to read
        breadth_s = _pass_seconds(model, wide, device, n, 1, context, vocab, repeats)
        del wide
        rows.append({"tokens_per_pass": n, "breadth_ms": 1000 * breadth_s, "depth_ms": 1000 * depth_s,
                     "breadth_over_depth": breadth_s / depth_s if depth_s > 0 else None})
        yield _snapshot("breadth_depth", pair, settings, (i + 1) / len(ns), rows, breakpoint=None)
    values, key = breadth_depth_values(rows)
    yield _final(_snapshot("breadth_depth", pair, settings, 1.0, rows,
                           breakpoint=values["n"] if key == "conclusion_stops" else None), values, key, [key])


def breadth_depth_values(rows: list[dict]) -> tuple[dict, str]:
    ns = [r["tokens_per_pass"] for r in rows]
    b = [r["breadth_ms"] for r in rows]
    d = [r["depth_ms"] for r in rows]
    bp = breadth_depth_breakpoint(ns, b, d)
    at = rows[ns.index(bp)] if bp is not None else rows[-1]
    values = {"n": at["tokens_per_pass"], "breadth_ms": at["breadth_ms"], "depth_ms": at["depth_ms"]}
    return values, ("conclusion_holds" if bp is None else "conclusion_stops")


# --- chapter: the ledger ---------------------------------------------------------------------------------

@dataclass
class FlopsLedger:
    """Where one request's FLOPs went. The verify pass is split evenly per slot (its matmuls cost the same
    per token; attention differs by a few per cent along the block): a row's slots are its drafts kept,
    its drafts rejected — with the padding slots of shorter drafts, also thrown away — and the slot that
    yields the target's own token. Parts are scaled by the request's share of a shared pass, so they add
    up to RunTotals.spent_flops."""

    draft: float = 0.0
    kept: float = 0.0
    rejected: float = 0.0
    target: float = 0.0
    plain: float = 0.0
    drafted_at: list[int] = field(default_factory=list)    # position i: drafts proposed at i + 1
    accepted_at: list[int] = field(default_factory=list)   # position i: of which accepted

    def add(self, ev: StepEvent) -> None:
        self.draft += ev.draft_flops * ev.share
        per_slot = ev.target_flops / ev.tokens_per_pass if ev.tokens_per_pass else 0.0
        k = ev.tokens_per_pass // ev.batch_size - 1        # draft slots per row in this verify pass
        for r in ev.rows:
            self.kept += per_slot * r.accepted
            self.rejected += per_slot * (k - r.accepted)
            self.target += per_slot
            self._positions(len(r.drafted), r.accepted)
        self.plain += ev.plain_flops

    def _positions(self, drafted: int, accepted: int) -> None:
        while len(self.drafted_at) < drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(drafted):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < accepted

    @property
    def spent(self) -> float:
        return self.draft + self.kept + self.rejected + self.target

    @property
    def flops_ratio(self) -> float:
        return self.spent / self.plain if self.plain else 0.0

    def parts(self) -> list[dict]:
        total = self.spent or 1.0
        return [{"part": p, "flops": f, "share": f / total} for p, f in
                (("draft", self.draft), ("kept", self.kept), ("rejected", self.rejected), ("target", self.target))]

    def positions(self) -> list[dict]:
        return [{"position": i + 1, "drafted": d, "accepted": a, "survival": a / d if d else 0.0}
                for i, (d, a) in enumerate(zip(self.drafted_at, self.accepted_at))]


def ledger_of(run: TimedRun) -> FlopsLedger:
    led = FlopsLedger()
    for ev in run.events:
        led.add(ev)
    return led


@inference_steps
def run_ledger(pair, prompt_ids: list[int], depth: int = 4, max_new: int = 48) -> Iterator[Result]:
    """One speculative run (k = depth) with its FLOPs ledger, wall-time parts and acceptance by draft
    position; a plain run (k = 0) of the same prompt for the measured speed-up; Leviathan's theory from
    the measured α and c beside it.

    α is the simple ratio accepted ÷ drafted (vLLM's draft acceptance rate, RunTotals.acceptance_rate),
    not the α that would make the i.i.d. model reproduce the measured tokens per pass: fitted that way
    the theory's tokens per pass would equal the measurement by construction and compare nothing.
    Measured speed-up is decode throughput (prefill excluded, as in the theory).

    Extra keys: `parts` (FLOPs parts), `times` (wall-time parts), `positions`, `theory` (rows of
    quantity / theory / measured), `spent_flops`, `plain_flops`, `flops_ratio`."""
    settings = _settings(pair, depth=depth, max_new=max_new, prompt_tokens=len(prompt_ids),
                         alpha_estimate="accepted ÷ drafted")
    yield _snapshot("ledger", pair, settings, 0.0, [], parts=[], times=[], positions=[], theory=[])
    warm_up(pair, [prompt_ids], depth)
    spec = timed_run(pair, [prompt_ids], depth, 1, max_new)
    led = ledger_of(spec)
    parts, times, positions = led.parts(), _time_parts(spec), led.positions()
    extra = {"parts": parts, "times": times, "positions": positions, "theory": [],
             "spent_flops": led.spent, "plain_flops": led.plain, "flops_ratio": led.flops_ratio}
    yield _snapshot("ledger", pair, settings, 0.5, _ledger_table(parts, times, positions, []), **extra)
    plain = timed_run(pair, [prompt_ids], 0, 1, max_new)
    values, theory = ledger_values(spec, plain, led, depth)
    agree, _ = ledger_agreement(values["theory_speedup"], values["measured_speedup"])
    extra["theory"] = theory
    snap = _snapshot("ledger", pair, settings, 1.0, _ledger_table(parts, times, positions, theory), **extra)
    yield _final(snap, values, agree, ["conclusion_waste", "conclusion_theory", agree])


def _time_parts(run: TimedRun) -> list[dict]:
    t = run.totals
    overhead = max(0.0, run.wall_s - t.prefill_s - t.draft_s - t.verify_s)
    return [{"part": p, "seconds": s, "share": s / run.wall_s if run.wall_s else 0.0} for p, s in
            (("prefill", t.prefill_s), ("draft", t.draft_s), ("verify", t.verify_s), ("overhead", overhead))]


def ledger_values(spec: TimedRun, plain: TimedRun, led: FlopsLedger, depth: int) -> tuple[dict, list[dict]]:
    alpha = _finite(spec.totals.acceptance_rate)
    c = draft_cost(spec, plain)
    theory = leviathan_theory(alpha, depth, c)
    measured = spec.totals.mean_accepted_length
    measured_speedup = spec.totals.tokens_per_s / plain.totals.tokens_per_s if plain.totals.tokens_per_s else 0.0
    _, diff = ledger_agreement(theory["speedup"], measured_speedup)
    values = {"waste": led.rejected / led.spent if led.spent else 0.0, "flops_ratio": led.flops_ratio,
              "alpha": alpha, "c": c, "depth": depth, "theory": theory["tokens_per_pass"],
              "theory_speedup": theory["speedup"], "measured": measured, "measured_speedup": measured_speedup,
              "diff": diff,
              # for the UI's notes: the race's number (prefill included, which the theory leaves out)
              "measured_speedup_end_to_end": spec.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else 0.0}
    rows = [{"quantity": "tokens_per_pass", "theory": theory["tokens_per_pass"], "measured": measured},
            {"quantity": "speedup", "theory": theory["speedup"], "measured": measured_speedup}]
    return values, rows


def _ledger_table(parts, times, positions, theory) -> list[dict]:
    """One CSV for the chapter's four views, told apart by `section`."""
    out = [{"section": "flops", "name": p["part"], "value": p["flops"], "share": p["share"]} for p in parts]
    out += [{"section": "seconds", "name": t["part"], "value": t["seconds"], "share": t["share"]} for t in times]
    out += [{"section": "position", "name": p["position"], "value": p["survival"], "drafted": p["drafted"],
             "accepted": p["accepted"]} for p in positions]
    out += [{"section": "theory", "name": r["quantity"], "value": r["theory"], "measured": r["measured"]}
            for r in theory]
    return out


# --- chapter: the sweep ----------------------------------------------------------------------------------

# The vLLM blog measured against load (queries per second), not batch size, so its points have no batch;
# they are not in assets/published/speedups.json (a batch-indexed file). Numbers: PUBLISHED-RESULTS.md.
VLLM_BLOG_SOURCE = ("vLLM blog, 'How Speculative Decoding Boosts vLLM Performance by up to 2.8x' (2024-10-17): "
                    "4× H100, Llama-3-70B")
# Names and loads are Saids: their English is what the CSV and the tests read, a chart shows them in its
# reader's language.
_DRAFT_MODEL, _NGRAM = (Said("chapter.sweep.blog_draft_model", model="Qwama-0.5B"),
                        Said("chapter.sweep.blog_ngram", data="CNN/DailyMail"))
_LIGHT, _HIGH = Said("chapter.sweep.load_light", qps=1), Said("chapter.sweep.load_high")
VLLM_BLOG = [(_DRAFT_MODEL, _LIGHT, 1.5), (_DRAFT_MODEL, _HIGH, 1 / 1.4), (_NGRAM, _LIGHT, 2.8), (_NGRAM, _HIGH, 1 / 1.8)]


def published_points() -> list[dict]:
    """Published speed-ups against batch size (profiles.load_published, as the what-if uses them), then
    the vLLM blog's light- vs high-load points (batch None, `load` named). Never ours: each carries its
    source and the label "published measurement"."""
    out = [{"source": s.source, "label": PUBLISHED_LABEL, "batch": b, "speedup": x,
            "series": Said("chapter.sweep.series", label=s.label, cite=s.cite), "load": None}
           for s in load_published() for b, x in zip(s.batch_sizes, s.speedup)]
    out += [{"source": VLLM_BLOG_SOURCE, "label": PUBLISHED_LABEL, "batch": None, "speedup": x,
             "series": Said("chapter.sweep.blog_series", name=name), "name": name, "load": load}
            for name, load, x in VLLM_BLOG]
    return out


@inference_steps
def run_sweep(pair, prompt_ids: list[int], batches: Iterable[int] = (1, 2, 4, 8, 16, 32),
              depths: Iterable[int] = (0, 1, 2, 4), max_new: int = 24) -> Iterator[Result]:
    """Every (batch B, depth k) cell: B rows of the prompt, greedy, end-to-end tokens/s, speed-up over
    k = 0 at the same B (k = 0 is always measured, first, so every cell's speed-up is known as soon as it
    finishes). One yield per cell. Extra keys: `batches`, `depths`, `best_depth` ([{batch_size, depth}],
    sweep_best_depths), `crossover_batch` (sweep_crossover), `published` (see published_points)."""
    batches = sorted({int(b) for b in batches})
    depths = sorted({0, *(int(k) for k in depths)})
    settings = _settings(pair, batches=batches, depths=depths, max_new=max_new, prompt_tokens=len(prompt_ids))
    pub = published_points()
    extra = {"batches": batches, "depths": depths, "best_depth": [], "crossover_batch": None, "published": pub}
    yield _snapshot("sweep", pair, settings, 0.0, [], **extra)
    warm_up(pair, [prompt_ids], max(depths))
    rows: list[dict] = []
    total = len(batches) * len(depths)
    for b in batches:
        for k in depths:
            run = timed_run(pair, [prompt_ids], k, b, max_new)
            rows.append(sweep_row(run, b, k, rows))
            extra["best_depth"] = _best(rows)
            yield _snapshot("sweep", pair, settings, len(rows) / total, rows, **extra)
    cross = sweep_crossover(rows)
    extra.update(best_depth=_best(rows), crossover_batch=cross)
    best = sweep_best_depths(rows)
    values = {"best_depths": ", ".join(f"B={b}: k={k}" for b, k in best.items()),
              "crossover": cross if cross is not None else "—", "max_batch": max(batches)}
    key = sweep_conclusion(cross)
    yield _final(_snapshot("sweep", pair, settings, 1.0, rows, **extra), values, key, ["conclusion_best", key])


def sweep_row(run: TimedRun, batch: int, depth: int, rows: list[dict]) -> dict:
    base = next((r["tokens_per_s"] for r in rows if r["batch_size"] == batch and r["depth"] == 0), None)
    tps = run.tokens_per_s
    return {"batch_size": batch, "depth": depth, "tokens_per_s": tps,
            "speedup": 1.0 if depth == 0 else (tps / base if base else None),
            "acceptance_rate": run.totals.acceptance_rate, "flops_ratio": run.totals.flops_ratio,
            "tokens": run.totals.tokens, "wall_s": run.wall_s}


def _best(rows: list[dict]) -> list[dict]:
    return [{"batch_size": b, "depth": k} for b, k in sweep_best_depths(rows).items()]


# --- chapter: policies -----------------------------------------------------------------------------------

@inference_steps
def run_policies(pair, prompt_ids_pool: list[list[int]], batches: Iterable[int] = (1, 4, 12), depth: int = 4,
                 max_new: int = 16, policies: Iterable[str] = POLICY_NAMES) -> Iterator[Result]:
    """At each batch size: plain decoding (the baseline), then every policy at the requested depth with
    its default parameters, rows taking prompts from the pool in order. One yield per run. Extra keys:
    `winners` ([{batch_size, policy, tokens_per_s, vs_plain}]), `plain` ([{batch_size, tokens_per_s}])."""
    batches = sorted({int(b) for b in batches})
    policies = list(policies)
    pool = [list(p) for p in prompt_ids_pool]
    settings = _settings(pair, batches=batches, depth=depth, max_new=max_new, policies=policies,
                         prompts=len(pool), policy_params={p: make_policy(p).describe() for p in policies})
    extra: dict = {"winners": [], "plain": []}
    yield _snapshot("policies", pair, settings, 0.0, [], **extra)
    warm_up(pair, pool, depth)
    rows: list[dict] = []
    total, done = len(batches) * (len(policies) + 1), 0
    for b in batches:
        base = timed_run(pair, pool, 0, b, max_new)
        extra["plain"].append({"batch_size": b, "tokens_per_s": base.tokens_per_s})
        done += 1
        yield _snapshot("policies", pair, settings, done / total, rows, **extra)
        for name in policies:
            run = timed_run(pair, pool, depth, b, max_new, make_policy(name))
            depths = [ev.depth for ev in run.events]
            rows.append({"policy": name, "batch_size": b, "tokens_per_s": run.tokens_per_s,
                         "vs_plain": run.tokens_per_s / base.tokens_per_s if base.tokens_per_s else 0.0,
                         "mean_depth": statistics.fmean(depths) if depths else 0.0,
                         "acceptance_rate": run.totals.acceptance_rate, "wall_s": run.wall_s})
            done += 1
            extra["winners"] = _winners(rows)
            yield _snapshot("policies", pair, settings, done / total, rows, **extra)
    values, key, row_values = policies_values(rows, batches)
    keys = ["conclusion_row"] * len(row_values) + [key]
    yield _final(_snapshot("policies", pair, settings, 1.0, rows, **extra), values, key, keys,
                 row_values + [values])


def _winners(rows: list[dict]) -> list[dict]:
    out = []
    for b in sorted({r["batch_size"] for r in rows}):
        w = max((r for r in rows if r["batch_size"] == b), key=lambda r: r["tokens_per_s"])
        out.append({"batch_size": b, "policy": w["policy"], "tokens_per_s": w["tokens_per_s"],
                    "vs_plain": w["vs_plain"]})
    return out


def policies_values(rows: list[dict], batches: list[int]) -> tuple[dict, str, list[dict]]:
    """Per batch the winner (conclusion_row); overall: the spread (largest best ÷ worst − 1 at any batch),
    the policy with most wins (ties: higher mean speed-up over plain), and for a switch the batch from
    which the winner at the largest batch size wins at every larger size, and who won at small batches."""
    wins = _winners(rows)
    winners = {w["batch_size"]: w["policy"] for w in wins}
    spread = 0.0
    for b in batches:
        tps = [r["tokens_per_s"] for r in rows if r["batch_size"] == b]
        if tps and min(tps) > 0:
            spread = max(spread, max(tps) / min(tps) - 1)
    names = {r["policy"] for r in rows}

    def score(p: str) -> tuple:
        mine = [r["vs_plain"] for r in rows if r["policy"] == p]
        return list(winners.values()).count(p), statistics.fmean(mine) if mine else 0.0
    overall = max(sorted(names), key=score)
    ordered = sorted(winners)
    large = winners[ordered[-1]]
    i = len(ordered) - 1
    while i > 0 and winners[ordered[i - 1]] == large:
        i -= 1
    # "at small batch sizes": the winner at the smallest batch, unless that is the large-batch winner
    # again (A, B, A): then whoever won just below the large-batch streak
    small = winners[ordered[0]] if winners[ordered[0]] != large else (winners[ordered[i - 1]] if i > 0 else large)
    values = {"policy": overall, "spread": spread, "small_policy": small, "large_policy": large,
              "batch": ordered[i], "tokens_per_s": next(w["tokens_per_s"] for w in wins if w["policy"] == overall),
              "vs_plain": next(w["vs_plain"] for w in wins if w["policy"] == overall)}
    row_values = [{"batch": w["batch_size"], "policy": w["policy"], "tokens_per_s": w["tokens_per_s"],
                   "vs_plain": w["vs_plain"]} for w in wins]
    return values, policies_conclusion(winners, spread), row_values
