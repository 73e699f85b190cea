"""The what-if's presets: GPUs (datasheet numbers), model shapes, and draft presets (EAGLE-style heads,
layer-skip self-drafts, n-gram lookup), resolved from the names a user types."""
from __future__ import annotations

from dataclasses import dataclass, replace

from specviz.hardware.roofline import ModelSpec
from specviz.lessons import Said, quoted

# --- what-if presets (datasheet numbers; dense bf16 tensor FLOP/s without sparsity) ------------------

@dataclass(frozen=True)
class GpuSpec:
    name: str
    bandwidth: float   # bytes/s
    flops: float       # dense bf16 FLOP/s
    source: str
    memory: float = 0.0   # bytes of device memory (datasheet); 0 where unknown (a custom GPU, this machine)

    @property
    def ridge(self) -> float:
        return self.flops / self.bandwidth


GPUS = {g.name: g for g in [
    GpuSpec("H100 SXM", 3.35e12, 989e12, "NVIDIA H100 datasheet: 3.35 TB/s HBM3, 989 TFLOPS bf16 dense", memory=80e9),
    GpuSpec("H200", 4.8e12, 989e12, "NVIDIA H200 datasheet: 4.8 TB/s HBM3e, 989 TFLOPS bf16 dense", memory=141e9),
    GpuSpec("A100 80GB", 2.039e12, 312e12, "NVIDIA A100 datasheet: 2,039 GB/s (SXM), 312 TFLOPS bf16", memory=80e9),
    GpuSpec("L4", 300e9, 121e12, "NVIDIA L4 datasheet: 300 GB/s, 242 TFLOPS bf16 with sparsity → 121 dense", memory=24e9),
    GpuSpec("T4", 320e9, 65e12, "NVIDIA T4 datasheet: 320 GB/s, 65 TFLOPS fp16 (no bf16)", memory=16e9),
    GpuSpec("A10G", 600e9, 70e12, "AWS/NVIDIA A10G: 600 GB/s, ~70 TFLOPS bf16 dense", memory=24e9),
    GpuSpec("RTX PRO 6000 Blackwell", 1.792e12, 503.8e12,
            "NVIDIA RTX PRO 6000 Blackwell datasheet: 1,792 GB/s; 4 PFLOPS fp4 sparse → ~504 TFLOPS bf16 dense",
            memory=96e9),
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


def named_by_shape(spec: ModelSpec, otherwise: str) -> str:
    """The preset of this shape ("SmolLM2-135M" for smollm2-135m-offline's config), else `otherwise`."""
    def shape(m: ModelSpec) -> tuple:
        return m.n_layers, m.d_model, m.n_heads, m.n_kv_heads, m.head_dim, m.d_ff, m.vocab, m.tied
    return next((name for name, m in MODELS.items() if shape(m) == shape(spec)), otherwise)


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
    if name not in MODELS:      # a draft is more than a model preset: name every kind
        raise PresetError(Said("errors.unknown_draft_preset", name=quoted(name), names=", ".join(MODELS)))
    return MODELS[name]


# a custom GPU's bounds, bytes/s and FLOP/s (0.001-100 TB/s, 0.001-100000 TFLOP/s): the CLI's flags, the
# What-if's number boxes and this check share them
CUSTOM_BANDWIDTH = (1e9, 1e14)
CUSTOM_FLOPS = (1e9, 1e17)


def _check_custom(value: float, bounds: tuple[float, float], key: str) -> None:
    """A custom GPU's rate within its bounds, else the sentence that names it and its value, in TB/s or
    TFLOP/s as the What-if's boxes take them (one sentence for both read as if both were wrong)."""
    if not bounds[0] <= value <= bounds[1]:
        raise PresetError(Said(key, value=value / 1e12, lo=bounds[0] / 1e12, hi=bounds[1] / 1e12))


def resolve_gpu(name: str | None = None, bandwidth: float | None = None, flops: float | None = None) -> GpuSpec:
    """A GPU preset by name, or one given by its bandwidth (bytes/s) and dense FLOP/s."""
    if name is not None:
        if name not in GPUS:
            raise PresetError(Said("errors.unknown_gpu_preset", name=quoted(name), names=", ".join(GPUS)))
        return GPUS[name]
    if bandwidth is None or flops is None:
        raise PresetError(Said("errors.gpu_needs_numbers"))
    _check_custom(bandwidth, CUSTOM_BANDWIDTH, "whatif.bad_bandwidth")
    _check_custom(flops, CUSTOM_FLOPS, "whatif.bad_flops")
    return GpuSpec(f"custom GPU ({bandwidth / 1e12:.3g} TB/s, {flops / 1e12:.4g} TFLOP/s)", float(bandwidth),
                   float(flops), "given by the user")
