"""Pure arithmetic about forward passes: bytes and FLOPs per pass, a roofline step-time model, and the
Leviathan et al. formulas for speculative decoding.

No torch, no transformers: everything here takes plain numbers, so it is cheap to test against worked
examples and can be used by the engine (accounting), the charts and the what-if views alike.

Conventions (stated once, used everywhere):
- A matmul with a weight of P parameters costs 2·P FLOPs per token (one multiply, one add).
- Attention over a context of C cached tokens costs 4·d_attn·C FLOPs per token per layer
  (Q·Kᵀ and A·V, each 2·d_attn·C), where d_attn = n_heads · head_dim.
- A forward pass streams every weight once (the memory-bound cost), plus the KV cache it reads and writes.

Two step-time models live here. The *ideal roofline* (`step_time`) is the article's argument: a pass
takes the slower of streaming its bytes at peak bandwidth and doing its FLOPs at peak FLOP/s. The
*calibrated* model (`Calibration`, `pass_time`) is what real kernels do, with rates and overheads taken
from measurements; see the comment above `Calibration` for the rule and why.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from specviz.lessons import Said, quoted


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer, enough to count its FLOPs and bytes."""

    name: str
    n_layers: int        # decoder blocks
    d_model: int         # hidden size
    n_heads: int         # query heads
    n_kv_heads: int      # key/value heads (GQA shares them)
    head_dim: int        # per-head width
    d_ff: int            # MLP intermediate size (gated MLP: three matrices of d_model × d_ff)
    vocab: int           # rows of the embedding / lm_head
    tied: bool = True    # lm_head shares the embedding matrix
    bytes_per_param: float = 2.0  # bf16 by default; fp32 = 4
    extra_params: int = 0  # weights every pass streams outside the blocks and lm_head (an EAGLE head's fc)

    @property
    def layer_params(self) -> int:
        """Weights of one decoder block (attention projections + gated MLP; norms are negligible)."""
        q_o = 2 * self.d_model * self.n_heads * self.head_dim
        k_v = 2 * self.d_model * self.n_kv_heads * self.head_dim
        mlp = 3 * self.d_model * self.d_ff
        return q_o + k_v + mlp

    @property
    def head_params(self) -> int:
        """The lm_head matrix (the output projection to the vocabulary)."""
        return self.d_model * self.vocab

    @property
    def params(self) -> int:
        """All parameters, counting a tied embedding once."""
        embed = 0 if self.tied else self.d_model * self.vocab
        return self.n_layers * self.layer_params + self.head_params + embed + self.extra_params

    @property
    def streamed_params(self) -> int:
        """Parameters read from memory by one forward pass (embedding lookups read only a few rows)."""
        return self.n_layers * self.layer_params + self.head_params + self.extra_params

    def kv_bytes_per_token(self) -> float:
        """Bytes of K and V that one cached token occupies across all layers."""
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.bytes_per_param


def spec_from_config(config: dict, name: str = "model", bytes_per_param: float = 2.0) -> ModelSpec:
    """Build a ModelSpec from a Hugging Face config dict (Llama/Qwen/Mistral field names)."""
    n_heads = int(config["num_attention_heads"])
    d_model = int(config["hidden_size"])
    head_dim = int(config.get("head_dim") or d_model // n_heads)
    return ModelSpec(
        name=name,
        n_layers=int(config["num_hidden_layers"]),
        d_model=d_model,
        n_heads=n_heads,
        n_kv_heads=int(config.get("num_key_value_heads") or n_heads),
        head_dim=head_dim,
        d_ff=int(config["intermediate_size"]),
        vocab=int(config["vocab_size"]),
        tied=bool(config.get("tie_word_embeddings", False)),
        bytes_per_param=bytes_per_param,
    )


@dataclass(frozen=True)
class PassCost:
    """What one forward pass asks of the hardware."""

    flops: float
    bytes: float

    def __add__(self, other: "PassCost") -> "PassCost":
        return PassCost(self.flops + other.flops, self.bytes + other.bytes)


ZERO_COST = PassCost(0.0, 0.0)


def pass_cost(spec: ModelSpec, batch: int, tokens: int, context: int, logits: int | None = None,
              n_layers: int | None = None) -> PassCost:
    """FLOPs and bytes of one forward pass over `batch` rows of `tokens` new tokens each, attending to
    `context` cached slots (plus the new tokens).

    `logits` is how many positions per row go through the lm_head (all `tokens` by default; 1 when
    only the last position is needed). `n_layers` lets a self-speculative draft (layers skipped)
    count only the blocks it runs.
    """
    layers = spec.n_layers if n_layers is None else n_layers
    logits = tokens if logits is None else logits
    rows_tokens = batch * tokens
    d_attn = spec.n_heads * spec.head_dim
    # average context a new token attends to: the cache plus, causally, half of the new block
    attn_ctx = context + (tokens + 1) / 2
    flops = (2 * layers * spec.layer_params * rows_tokens
             + 2 * spec.head_params * batch * logits
             + 4 * layers * d_attn * attn_ctx * rows_tokens)
    weight_bytes = (layers * spec.layer_params + spec.head_params) * spec.bytes_per_param
    if spec.extra_params:          # zero for every plain model: their counts are unchanged
        flops += 2 * spec.extra_params * rows_tokens
        weight_bytes += spec.extra_params * spec.bytes_per_param
    kv_per_token = spec.kv_bytes_per_token() * layers / spec.n_layers
    kv_bytes = kv_per_token * batch * (context + tokens)  # read the cache, write the new slots
    return PassCost(float(flops), float(weight_bytes + kv_bytes))


def plain_token_flops(spec: ModelSpec, context: int) -> float:
    """FLOPs that plain decoding spends on one token at a given context (the baseline of the FLOPs
    ratio): one token through every layer and the lm_head."""
    return pass_cost(spec, batch=1, tokens=1, context=context, logits=1).flops


def step_time(cost: PassCost, bandwidth: float, peak_flops: float, overhead_s: float = 0.0) -> float:
    """Roofline step time: the slower of streaming the bytes and doing the FLOPs, plus fixed overhead."""
    return max(cost.bytes / bandwidth, cost.flops / peak_flops) + overhead_s


# --- Leviathan et al. 2023 (arXiv 2211.17192), section 3 --------------------------------------------
# α: probability that a draft token is accepted (assumed i.i.d.), γ: draft depth,
# c: time of one draft step ÷ time of one target step, ĉ: FLOPs of a draft step ÷ target step.

def expected_tokens_per_pass(alpha: float, depth: int) -> float:
    """E[tokens emitted per target pass] = (1 − α^(γ+1)) / (1 − α)  (equation 1)."""
    if depth <= 0:
        return 1.0
    if alpha >= 1.0:
        return float(depth + 1)
    return (1 - alpha ** (depth + 1)) / (1 - alpha)


def walltime_improvement(alpha: float, depth: int, c: float) -> float:
    """Expected speed-up over plain decoding: (1 − α^(γ+1)) / ((1 − α)(γc + 1))  (theorem 3.8)."""
    return expected_tokens_per_pass(alpha, depth) / (depth * c + 1)


def arithmetic_increase(alpha: float, depth: int, c_hat: float) -> float:
    """Expected factor of extra arithmetic: (1 − α)(γĉ + γ + 1) / (1 − α^(γ+1))  (theorem 3.11)."""
    return (depth * c_hat + depth + 1) / expected_tokens_per_pass(alpha, depth)


# --- what-if presets (datasheet numbers; dense bf16 tensor FLOP/s without sparsity) ------------------

@dataclass(frozen=True)
class GpuSpec:
    name: str
    bandwidth: float   # bytes/s
    flops: float       # dense bf16 FLOP/s
    source: str

    @property
    def ridge(self) -> float:
        return self.flops / self.bandwidth


GPUS = {g.name: g for g in [
    GpuSpec("H100 SXM", 3.35e12, 989e12, "NVIDIA H100 datasheet: 3.35 TB/s HBM3, 989 TFLOPS bf16 dense"),
    GpuSpec("H200", 4.8e12, 989e12, "NVIDIA H200 datasheet: 4.8 TB/s HBM3e, 989 TFLOPS bf16 dense"),
    GpuSpec("A100 80GB", 2.039e12, 312e12, "NVIDIA A100 datasheet: 2,039 GB/s (SXM), 312 TFLOPS bf16"),
    GpuSpec("L4", 300e9, 121e12, "NVIDIA L4 datasheet: 300 GB/s, 242 TFLOPS bf16 with sparsity → 121 dense"),
    GpuSpec("T4", 320e9, 65e12, "NVIDIA T4 datasheet: 320 GB/s, 65 TFLOPS fp16 (no bf16)"),
    GpuSpec("A10G", 600e9, 70e12, "AWS/NVIDIA A10G: 600 GB/s, ~70 TFLOPS bf16 dense"),
    GpuSpec("RTX PRO 6000 Blackwell", 1.792e12, 503.8e12,
            "NVIDIA RTX PRO 6000 Blackwell datasheet: 1,792 GB/s; 4 PFLOPS fp4 sparse → ~504 TFLOPS bf16 dense"),
]}

MODELS = {m.name: m for m in [
    # shapes from each model's config.json on the Hugging Face hub
    ModelSpec("SmolLM2-135M", 30, 576, 9, 3, 64, 1536, 49152, True),
    ModelSpec("SmolLM2-360M", 32, 960, 15, 5, 64, 2560, 49152, True),
    ModelSpec("SmolLM2-1.7B", 24, 2048, 32, 32, 64, 8192, 49152, True),
    ModelSpec("Qwen2.5-0.5B", 24, 896, 14, 2, 64, 4864, 151936, True),
    ModelSpec("Qwen2.5-7B", 28, 3584, 28, 4, 128, 18944, 152064, False),
    # the article's example: Qwen3.5-27B streams ~27 B active parameters per token (shape approximated
    # as a dense 64-layer model of that size)
    ModelSpec("Qwen3.5-27B (article)", 64, 5120, 40, 8, 128, 25600, 151936, False),
    ModelSpec("Llama-3-70B", 80, 8192, 64, 8, 128, 28672, 128256, False),
    # the targets of the published batch sweeps (PUBLISHED-RESULTS.md): meta-llama/Llama-3.1-8B-Instruct
    # and -70B-Instruct config.json
    ModelSpec("Llama-3.1-8B", 32, 4096, 32, 8, 128, 14336, 128256, False),
    ModelSpec("Llama-3.1-70B", 80, 8192, 64, 8, 128, 28672, 128256, False),
]}


class PresetError(ValueError):
    """An unknown GPU, model or draft name, or a draft that cannot draft for the chosen target."""


# --- draft presets: EAGLE-style heads, layer-skip self-drafts, n-gram lookup --------------------------
# EAGLE (Li et al. 2024) drafts with one decoder layer of the target's shape that reads the target's
# last hidden state fused with the next token's embedding (an fc layer 2d → d), and reuses the target's
# lm_head, which every draft pass streams again. EAGLE-3 (arXiv 2503.01840) fuses three feature layers
# (fc 3d → d), feeds the layer's attention 2d-wide inputs, and has its own lm_head over a reduced draft
# vocabulary (32,000 tokens in the released Llama-3.1-8B head's config).
NGRAM = "ngram"
EAGLE_HEADS = {"EAGLE:": None, "EAGLE-3:": 32000}       # prefix → draft vocabulary (None: the target's)
LAYERSKIP = "layerskip:"


def eagle_head(target: ModelSpec, prefix: str = "EAGLE:") -> ModelSpec:
    """The shape of an EAGLE-style draft head for `target` (`prefix` "EAGLE:" or "EAGLE-3:")."""
    d, qkv = target.d_model, (target.n_heads + 2 * target.n_kv_heads) * target.head_dim
    if prefix == "EAGLE:":
        extra = 2 * d * d                       # fc: [embedding ; feature] → d
    else:
        extra = 3 * d * d + d * qkv             # fc over three features + the 2d-wide q/k/v inputs
    return replace(target, name=prefix + target.name, n_layers=1, vocab=EAGLE_HEADS[prefix] or target.vocab,
                   tied=True, extra_params=extra)


def draft_names(targets: list[str] | None = None) -> list[str]:
    """Draft presets for the what-if: every model, then the EAGLE heads of each target preset."""
    targets = list(MODELS) if targets is None else targets
    return list(MODELS) + [p + t for p in EAGLE_HEADS for t in targets]


def resolve_model(name: str) -> ModelSpec:
    if name not in MODELS:
        raise PresetError(Said("errors.unknown_model_preset", name=quoted(name), names=", ".join(MODELS)))
    return MODELS[name]


def resolve_draft(name: str, target: ModelSpec) -> ModelSpec | None:
    """A draft preset's shape for `target`: None for n-gram lookup (no model), an EAGLE head (which must
    belong to this target: it reads its features), `layerskip:A-B` (the target minus layers A..B), or a
    model preset."""
    if name == NGRAM:
        return None
    for prefix in EAGLE_HEADS:
        if name.startswith(prefix):
            base = name[len(prefix):]
            if base != target.name:
                raise PresetError(Said("errors.eagle_other_target", name=name, base=base, target=target.name,
                                       fix=f"{prefix}{target.name}"))
            return eagle_head(resolve_model(base), prefix)
    if name.startswith(LAYERSKIP):
        a, _, b = name[len(LAYERSKIP):].partition("-")
        if not (a.isdigit() and b.isdigit() and int(a) <= int(b) < target.n_layers):
            raise PresetError(Said("errors.bad_layerskip_preset", name=quoted(name), n=target.n_layers))
        kept = target.n_layers - (int(b) - int(a) + 1)
        return replace(target, name=name, n_layers=kept)
    return resolve_model(name)


def resolve_gpu(name: str | None = None, bandwidth: float | None = None, flops: float | None = None) -> GpuSpec:
    """A GPU preset by name, or one given by its bandwidth (bytes/s) and dense FLOP/s."""
    if name is not None:
        if name not in GPUS:
            raise PresetError(Said("errors.unknown_gpu_preset", name=quoted(name), names=", ".join(GPUS)))
        return GPUS[name]
    if bandwidth is None or flops is None or not (0 < bandwidth < 1e15 and 0 < flops < 1e18):
        raise PresetError(Said("errors.gpu_needs_numbers"))
    return GpuSpec(f"custom GPU ({bandwidth / 1e12:.3g} TB/s, {flops / 1e12:.4g} TFLOP/s)", float(bandwidth),
                   float(flops), "given by the user")


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


def predicted_knee(spec: ModelSpec, bandwidth: float, flops: float, context: int = 512,
                   max_tokens: int = 65536) -> int:
    """Tokens per pass at which the roofline turns from memory- to compute-bound for this model."""
    n = 1
    while n < max_tokens:
        c = pass_cost(spec, 1, n, context)
        if c.flops / flops >= c.bytes / bandwidth:
            return n
        n += max(1, n // 16)
    return max_tokens


def spec_throughput(batch: int, depth: int, alpha: float, c: float, target_step) -> float:
    """Tokens/s of batch × speculation: `target_step(n)` is the target's time for n tokens per pass,
    a draft step costs c × target_step(batch)."""
    t = depth * c * target_step(batch) + target_step(batch * (depth + 1))
    return batch * expected_tokens_per_pass(alpha, depth) / t


def best_depth(batch: int, alpha: float, c: float, target_step, max_depth: int = 16) -> int:
    return max(range(max_depth + 1), key=lambda k: spec_throughput(batch, k, alpha, c, target_step))


def crossover_batch(alpha: float, c: float, target_step, max_batch: int = 1024) -> int | None:
    """Smallest batch size at which no depth beats plain decoding (speculation stops paying)."""
    b = 1
    while b <= max_batch:
        if best_depth(b, alpha, c, target_step) == 0:
            return b
        b *= 2
    return None


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
    """End-to-end time of a whole run as `python -m specviz sweep` measures it: prefill of every row
    (target, and a draft model's own), then new_tokens ÷ E[tokens per step] steps at the mean context."""
    prefill = setup.pass_s(setup.target, batch, prompt_tokens, context=0)
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
