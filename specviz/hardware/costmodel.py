"""The calibrated cost model and the what-if grids built on it.

`Calibration` and `pass_time` are what a real software stack on real hardware does, with rates and
overheads taken from measurements (the rule and why are in the comment above `Calibration`); `Setup`,
`whatif_rows`, `fit_alpha`, `depth_crossover` and `run_seconds` answer the What-if tab's questions; the
sweep uses `best_depths` and `crossover_from_rows` on its measured rows. Plain numbers, no torch.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from specviz.hardware.presets import GPUS, MODELS, PresetError
from specviz.hardware.roofline import ModelSpec, PassCost, arithmetic_increase, expected_tokens_per_pass, pass_cost
from specviz.lessons import Said

# --- the calibrated model ---------------------------------------------------------------------------
# Rule: pass time = overheads + memory + arithmetic − overlap × min(memory, arithmetic), where
#   memory     = (weights + KV cache) ÷ (peak bandwidth × bandwidth_eff)
#   arithmetic = FLOPs ÷ (peak FLOP/s × flops_eff)
#   overheads  = pass_overhead (framework work per forward call) + layer_overhead × layers (eager kernel
#                launches, which is why a deep, narrow draft is launch-bound)
# and a decode step (plain, or drafting + verifying) adds step_overhead once (scheduler, sampling); a
# speculative step (k > 0) adds spec_row_overhead per sequence in the batch: the stack's bookkeeping
# outside the forward passes (building the draft tree and its mask, accepting, moving KV entries,
# preparing the draft's next input). No pass-time fit can see it — it is only visible in measured
# speed-ups — so it is 0 unless fitted to published speed-ups of that stack (specviz.hardware.profiles).
# Why a sum (overlap = 0) for real stacks: measured pass times grow linearly from the first extra token
# (the published H100 fit: +21 µs per token from 1 token up; this machine's CPU profile: every doubling
# costs more), while max() would keep them flat up to the ridge (~280 tokens on an H100). Small GEMMs
# are tiled for many rows, attention and the element-wise kernels run one after another, and each kernel
# waits for the previous one: the arithmetic does not hide under the weight streaming. With overlap = 1,
# efficiencies 1 and no overheads the rule is exactly the ideal roofline, max(memory, arithmetic).

@dataclass(frozen=True)
class Calibration:
    """How a real software stack on real hardware falls short of the ideal roofline (from measurements)."""

    name: str
    bandwidth_eff: float = 1.0      # achieved ÷ peak bandwidth, for weights and KV cache
    flops_eff: float = 1.0          # achieved ÷ peak FLOP/s for the arithmetic
    overlap: float = 1.0            # share of the shorter of memory/arithmetic hidden under the longer
    pass_overhead_s: float = 0.0    # per forward pass, any model
    layer_overhead_s: float = 0.0   # per decoder layer per pass
    step_overhead_s: float = 0.0    # per decode step (one per plain step or per draft+verify step)
    spec_row_overhead_s: float = 0.0  # per sequence per speculative step, outside the passes (fitted)
    source: str = ""                # where the numbers come from

    @property
    def is_ideal(self) -> bool:
        return (self.bandwidth_eff, self.flops_eff, self.overlap) == (1.0, 1.0, 1.0) and not (
            self.pass_overhead_s or self.layer_overhead_s or self.step_overhead_s or self.spec_row_overhead_s)


# names and sources are Saids: English where printed (CLI, JSON), the reader's language on the page
IDEAL = Calibration(Said("whatif.cal.ideal_name"), source=Said("whatif.ideal_note"))


def pass_time(cost: PassCost, n_layers: int, bandwidth: float, flops: float, cal: Calibration = IDEAL) -> float:
    """Seconds for one forward pass under `cal` (the rule above); IDEAL gives `step_time` exactly."""
    memory = cost.bytes / (bandwidth * cal.bandwidth_eff)
    arithmetic = cost.flops / (flops * cal.flops_eff)
    longer, shorter = max(memory, arithmetic), min(memory, arithmetic)
    return cal.pass_overhead_s + cal.layer_overhead_s * n_layers + longer + (1 - cal.overlap) * shorter


@dataclass(frozen=True)
class PassFit:
    """A published linear fit of measured pass times: fixed + per token + per cached token, + per step."""

    gpu: str                 # GPUS preset it was measured on
    model: str               # MODELS preset it was measured with
    fixed_s: float
    per_token_s: float       # per token in the pass (all rows together)
    per_kv_token_s: float    # per cached token the pass reads (all rows together)
    per_step_s: float        # per decode step, outside the forward pass
    source: str              # the paper, a name (e.g. "SpecDecode-Bench (arXiv 2601.11580)")
    stack: str               # the software it measured, a name (e.g. "vLLM 0.10.1")

    @property
    def description(self) -> Said:
        return Said("whatif.cal.fit_source", source=self.source, stack=self.stack, gpu=self.gpu.split()[0],
                    model=self.model, fixed=f"{1e3 * self.fixed_s:.1f}", per_token=f"{1e6 * self.per_token_s:.0f}",
                    per_kv=f"{1e9 * self.per_kv_token_s:.0f}", per_step=f"{1e3 * self.per_step_s:.1f}")


# SpecDecode-Bench ("Speculative Decoding: Performance or Illusion?", arXiv 2601.11580), simulator fit of
# vLLM 0.10.1 on one H100 with Llama-3.1-8B, batch 1-64 (PUBLISHED-RESULTS.md).
SPECDECODE_BENCH_H100 = PassFit(
    "H100 SXM", "Llama-3.1-8B", fixed_s=5.9e-3, per_token_s=21e-6, per_kv_token_s=39e-9, per_step_s=1.2e-3,
    source="SpecDecode-Bench (arXiv 2601.11580)", stack="vLLM 0.10.1")


def calibration_from_fit(fit: PassFit) -> Calibration:
    """Rates and overheads implied by a published pass-time fit, as fractions of the GPU's datasheet peaks
    (so they carry over to other GPUs as "the same software stack")."""
    gpu, spec = GPUS[fit.gpu], MODELS[fit.model]
    # a cached token costs its K and V bytes at the achieved bandwidth (39 ns ≈ 128 KiB ÷ 3.35 TB/s: peak)
    bw_eff = min(1.0, spec.kv_bytes_per_token() / (fit.per_kv_token_s * gpu.bandwidth))
    # each extra token costs its GEMM FLOPs (2 per streamed parameter) at the achieved FLOP rate
    flops_eff = min(1.0, 2 * spec.streamed_params / (fit.per_token_s * gpu.flops))
    # what the fixed part leaves after streaming the weights is per-pass overhead (graphs are replayed
    # whole, so no per-layer launch cost: a 1-layer draft pays it too — ~32 % of the target's pass vs the
    # ≈ 37.5 % SpecDecode-Bench measured for EAGLE on this model)
    weights = spec.streamed_params * spec.bytes_per_param / (gpu.bandwidth * bw_eff)
    return Calibration(Said("whatif.cal.serving_name", fit=fit.source.split(" (")[0]), bandwidth_eff=bw_eff,
                       flops_eff=flops_eff, overlap=0.0, pass_overhead_s=max(0.0, fit.fixed_s - weights),
                       step_overhead_s=fit.per_step_s, source=fit.description)


SERVING = calibration_from_fit(SPECDECODE_BENCH_H100)


def fit_calibration(spec: ModelSpec, tokens: list[int], seconds: list[float], context: int, bandwidth: float,
                    flops: float, name: str, source: str) -> Calibration:
    """Fit overhead and FLOP efficiency to a measured latency-vs-tokens curve (a recorded profile).

    The bandwidth is taken as measured (calibration copies are an achieved rate already); the rule is
    the sum; the fitted fixed cost is charged per layer, since an eager stack's fixed cost is its kernel
    launches (~10 per decoder layer). Least squares on relative error (weights 1 / t²).
    """
    # t − memory = overhead + x · FLOPs, x = 1 / achieved FLOP/s: a weighted 2-parameter linear fit
    rows = []
    for n, t in zip(tokens, seconds):
        c = pass_cost(spec, 1, n, context)
        rows.append((c.flops, t - c.bytes / bandwidth, 1 / t ** 2))
    sw = sum(w for *_, w in rows)
    sx = sum(w * f for f, _, w in rows)
    sy = sum(w * y for _, y, w in rows)
    sxx = sum(w * f * f for f, _, w in rows)
    sxy = sum(w * f * y for f, y, w in rows)
    det = sw * sxx - sx * sx
    if len(rows) < 2 or det <= 0:
        raise PresetError("a calibration fit needs at least two different tokens-per-pass points")
    x = (sw * sxy - sx * sy) / det
    overhead = (sy - x * sx) / sw
    if x <= 0:                     # the curve is flat: arithmetic hides entirely; keep the peak rate
        x, overhead = 1 / flops, sy / sw - sx / (sw * flops)
    overhead = max(0.0, overhead)
    return Calibration(name, bandwidth_eff=1.0, flops_eff=1 / (x * flops), overlap=0.0,
                       layer_overhead_s=overhead / spec.n_layers, source=source)


# --- what-if grids (the app's What-if tab; `sweep` uses best_depths and crossover_from_rows) ---------

def latency_curve(spec: ModelSpec, bandwidth: float, flops: float, tokens: list[int], context: int,
                  overhead_s: float = 0.0, calibration: Calibration | None = None) -> list[float]:
    """Forward time (seconds) of one row of n tokens per pass, for each n in `tokens`: the ideal roofline,
    or the calibrated model when `calibration` is given (the pass alone, without the step overhead)."""
    cal = calibration or IDEAL
    return [pass_time(pass_cost(spec, 1, n, context), spec.n_layers, bandwidth, flops, cal) + overhead_s
            for n in tokens]


@dataclass(frozen=True)
class Setup:
    """One what-if question: a target, a draft (None = n-gram lookup, free), a GPU and a cost model."""

    target: ModelSpec
    draft: ModelSpec | None
    bandwidth: float
    flops: float
    context: int
    calibration: Calibration = IDEAL
    overhead_s: float = 0.0         # extra fixed time per forward pass (the UI's overhead slider)

    def pass_s(self, spec: ModelSpec, batch: int, tokens: int, context: int | None = None) -> float:
        cost = pass_cost(spec, batch, tokens, self.context if context is None else context)
        return pass_time(cost, spec.n_layers, self.bandwidth, self.flops, self.calibration) + self.overhead_s

    def step_s(self, batch: int, depth: int) -> float:
        """One decode step: k draft passes of one token per row, then one target pass over
        batch × (k + 1) tokens, plus the stack's per-step overhead (and, when speculating, its
        per-sequence bookkeeping)."""
        cal = self.calibration
        drafting = 0.0 if self.draft is None or depth == 0 else depth * self.pass_s(self.draft, batch, 1)
        bookkeeping = cal.spec_row_overhead_s * batch if depth > 0 else 0.0
        return cal.step_overhead_s + bookkeeping + drafting + self.pass_s(self.target, batch, depth + 1)

    def speedup(self, batch: int, depth: int, alpha: float) -> float:
        """Tokens/s at depth k over plain decoding (depth 0) at the same batch."""
        return expected_tokens_per_pass(alpha, depth) * self.step_s(batch, 0) / self.step_s(batch, depth)


def whatif_rows(target: ModelSpec, draft: ModelSpec | None, bandwidth: float, flops: float, alpha: float,
                context: int, batches: list[int], depths: list[int], overhead_s: float = 0.0,
                calibration: Calibration | None = None) -> list[dict]:
    """Estimated tokens/s, speed-up over depth 0 and FLOPs factor at each (batch, depth): k draft steps
    of one token per row, then one target pass over batch × (k + 1) tokens. `draft` None = a free draft
    (n-gram lookup). `calibration` None = the ideal roofline (every pass also pays `overhead_s`)."""
    setup = Setup(target, draft, bandwidth, flops, context, calibration or IDEAL, overhead_s)
    plain = pass_cost(target, 1, 1, context, logits=1).flops
    c_hat = 0.0 if draft is None else pass_cost(draft, 1, 1, context, logits=1).flops / plain
    rows = []
    for b in batches:
        t0 = setup.step_s(b, 0)
        for k in depths:
            t = setup.step_s(b, k)
            rows.append({"batch_size": b, "depth": k, "step_s": t,
                         "tokens_per_s": b * expected_tokens_per_pass(alpha, k) / t,
                         "speedup": expected_tokens_per_pass(alpha, k) * t0 / t,
                         "flops_ratio": arithmetic_increase(alpha, k, c_hat) if k else 1.0})
    return rows


def fit_alpha(setup: Setup, batch: int, depth: int, speedup: float) -> float:
    """The acceptance rate α at which `setup` predicts `speedup` at (batch, depth): step times do not
    depend on α, so this inverts E[tokens per pass] = speed-up × t_spec ÷ t_plain (bisection)."""
    want = speedup * setup.step_s(batch, depth) / setup.step_s(batch, 0)
    lo, hi = 0.0, 0.9999
    if want >= expected_tokens_per_pass(hi, depth):
        return hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens_per_pass(mid, depth) < want else (lo, mid)
    return (lo + hi) / 2


def depth_crossover(setup: Setup, alpha: float, depth: int, max_batch: int = 4096) -> int | None:
    """Smallest batch at which speculating `depth` tokens no longer beats plain decoding (speed-up < 1),
    scanning every batch up to 64 and then in steps of 1/16; None if it still pays at `max_batch`."""
    b = 1
    while b <= max_batch:
        if setup.speedup(b, depth, alpha) < 1.0:
            return b
        b += 1 if b < 64 else b // 16
    return None


def run_seconds(setup: Setup, batch: int, depth: int, alpha: float, prompt_tokens: int, new_tokens: int) -> float:
    """End-to-end time of a whole run as `python -m specviz sweep` measures it, B rows of one prompt: the
    target's prefill of that prompt once (the engine computes rows of the same prompt once and copies them),
    a draft model's catch-up on every row's prompt (its first drafting step feeds each row whole), then
    new_tokens ÷ E[tokens per step] steps at the mean context."""
    prefill = setup.pass_s(setup.target, 1, prompt_tokens, context=0)
    if setup.draft is not None and depth > 0:
        prefill += setup.pass_s(setup.draft, batch, prompt_tokens, context=0)
    mean_ctx = prompt_tokens + new_tokens // 2
    steps = new_tokens / expected_tokens_per_pass(alpha, depth)
    return prefill + steps * replace(setup, context=mean_ctx).step_s(batch, depth)


def best_depths(rows: list[dict]) -> dict[int, int]:
    """Batch size → the depth with the highest tokens/s in a sweep or what-if grid."""
    best: dict[int, dict] = {}
    for r in rows:
        b = r["batch_size"]
        if b not in best or r["tokens_per_s"] > best[b]["tokens_per_s"]:
            best[b] = r
    return {b: r["depth"] for b, r in sorted(best.items())}


def crossover_from_rows(rows: list[dict]) -> int | None:
    """The smallest batch size from which on plain decoding (depth 0) is best, or None if it never is."""
    best = best_depths(rows)
    for b in sorted(best):
        if all(best[x] == 0 for x in best if x >= b):
            return b
    return None


@dataclass(frozen=True)
class MemoryFit:
    """What a GPU's memory holds of a what-if question (an estimate: weights and KV cache only, no
    activations, no engine buffers): the weights' bytes, one row's KV cache at the context, and the most
    rows whose caches fit beside the weights (0 when the weights alone do not fit)."""

    memory: float
    weights: float
    kv_per_row: float
    max_rows: int


def memory_fit(setup: Setup, memory: float) -> MemoryFit | None:
    """The fit on a GPU with `memory` bytes (None where the memory is unknown). An EAGLE head reuses the
    target's lm_head, so it is not counted twice."""
    if memory <= 0:
        return None
    t, d = setup.target, setup.draft
    weights = t.params * t.bytes_per_param
    kv = t.kv_bytes_per_token()
    if d is not None:
        shared = d.head_params if d.name.startswith("EAGLE:") else 0
        weights += (d.params - shared) * d.bytes_per_param
        kv += d.kv_bytes_per_token()
    per_row = kv * setup.context
    rows = int((memory - weights) // per_row) if memory > weights and per_row > 0 else 0
    return MemoryFit(memory, weights, per_row, rows)
