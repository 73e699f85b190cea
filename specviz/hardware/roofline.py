"""Pure arithmetic about forward passes: bytes and FLOPs per pass, the ideal roofline step time, and the
Leviathan et al. formulas for speculative decoding.

No torch, no transformers: everything here takes plain numbers, so it is cheap to test against worked
examples and can be used by the engine (accounting), the charts and the what-if views alike.

Conventions (stated once, used everywhere):
- A matmul with a weight of P parameters costs 2·P FLOPs per token (one multiply, one add).
- Attention over a context of C cached tokens costs 4·d_attn·C FLOPs per token per layer
  (Q·Kᵀ and A·V, each 2·d_attn·C), where d_attn = n_heads · head_dim.
- A forward pass streams every weight once (the memory-bound cost), plus the KV cache it reads and writes.

The *ideal roofline* (`step_time`) is the article's argument: a pass takes the slower of streaming its
bytes at peak bandwidth and doing its FLOPs at peak FLOP/s. What real kernels do (rates and overheads
taken from measurements) is `specviz.hardware.costmodel`; the GPU and model presets the what-if offers are
`specviz.hardware.presets`.
"""
from __future__ import annotations

from dataclasses import dataclass


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
