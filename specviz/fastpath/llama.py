"""A compact Llama-family forward (Llama, SmolLM2, Qwen2) that reads a loaded transformers model's
weights and runs against preallocated KV buffers (`specviz.fastpath.cache`).

Weights are read in place on CUDA; on a CPU each matrix is served in the layout this machine multiplies
fastest at the rows a pass brings (`specviz.fastpath.layout`, chosen by timing the candidates here once:
decode streams every matrix for a few rows, and the layout alone can double that rate). The stock model
is left untouched.

Why our own forward instead of the stock modules: per pass, transformers builds masks, walks a Cache
object and goes through a dozen Python modules per layer; on a CPU that overhead is about as long as
streaming the weights. Here one decoder layer is one pure function of tensors (`decoder_layer`), so
the same function — and, compiled, the same graph — serves every layer of every model of the family:
the weights are arguments, not attributes.

The maths follows transformers' LlamaRMSNorm / rotate-half RoPE / SwiGLU MLP / GQA attention exactly;
`tests/test_fastpath.py` compares the logits against transformers' forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specviz.fastpath.layout import Plan, linear, plan_for

SUPPORTED = ("llama", "qwen2")


class Unsupported(ValueError):
    """The model is not a plain Llama-family decoder; the message says why (the caller falls back)."""


@dataclass(frozen=True)
class Dims:
    n_heads: int        # query heads
    n_kv: int           # key/value heads (GQA: n_heads is a multiple)
    head_dim: int
    eps: float          # RMSNorm epsilon


@dataclass(frozen=True)
class LayerWeights:
    """References to one decoder layer's parameters (biases None where the family has none)."""

    ln1: torch.Tensor
    wq: torch.Tensor
    bq: torch.Tensor | None
    wk: torch.Tensor
    bk: torch.Tensor | None
    wv: torch.Tensor
    bv: torch.Tensor | None
    wo: torch.Tensor
    bo: torch.Tensor | None
    ln2: torch.Tensor
    w_gate: torch.Tensor
    w_up: torch.Tensor
    w_down: torch.Tensor

    def as_tuple(self) -> tuple:
        return (self.ln1, self.wq, self.bq, self.wk, self.bk, self.wv, self.bv, self.wo, self.bo,
                self.ln2, self.w_gate, self.w_up, self.w_down)


def _matrices(block) -> list[torch.Tensor]:
    a, m = block.self_attn, block.mlp
    return [lin.weight for lin in (a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj)]


def _bias(linear) -> torch.Tensor | None:
    return linear.bias if getattr(linear, "bias", None) is not None else None


def check_supported(model) -> None:
    """Raise Unsupported with a sentence unless our forward computes exactly what `model` does."""
    cfg = model.config
    kind = getattr(cfg, "model_type", "?")
    if kind not in SUPPORTED:
        raise Unsupported(f"the fast path supports {', '.join(SUPPORTED)} models, not '{kind}'")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        raise Unsupported(f"the fast path needs a SiLU MLP, this model uses '{cfg.hidden_act}'")
    if getattr(cfg, "use_sliding_window", False) or "sliding_attention" in (getattr(cfg, "layer_types", None) or []):
        raise Unsupported("the fast path has no sliding-window attention")
    if getattr(cfg, "mlp_bias", False):
        raise Unsupported("the fast path has no MLP biases")
    rope = getattr(model.model.rotary_emb, "rope_type", "default")
    if rope not in ("default", "linear", "llama3"):
        # dynamic/yarn-style RoPE changes its frequencies with the sequence length
        raise Unsupported(f"the fast path has fixed RoPE frequencies, this model uses rope_type '{rope}'")


class CompactLlama:
    """Read-only view of a Llama-family model's weights plus the pure functions that run them.

    Shared by every cache (and engine) that uses the model; holds no per-run state."""

    def __init__(self, model, compiled: bool = False):
        check_supported(model)
        cfg, inner = model.config, model.model
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.dims = Dims(cfg.num_attention_heads, cfg.num_key_value_heads, head_dim, float(cfg.rms_norm_eps))
        self.embed = inner.embed_tokens.weight                     # [V, d]
        self.norm = inner.norm.weight                              # [d]
        self.norm_eps = float(inner.norm.variance_epsilon)
        head = model.get_output_embeddings().weight                # [V, d] (the embedding when tied)
        self.plan: Plan = plan_for([head] + [w for b in inner.layers for w in _matrices(b)], compiled)
        self._w = self.plan.store                                  # the weights' layout, see above
        self.head = self._w(head)
        self.inv_freq = inner.rotary_emb.inv_freq                  # [head_dim / 2]
        self.rope_scale = float(inner.rotary_emb.attention_scaling)
        self.layers = [self._layer(block) for block in inner.layers]
        self.device, self.dtype = self.embed.device, self.embed.dtype
        # what a short block (decode, verify, draft) runs: `hidden` itself, or a compiled twin set by
        # specviz.fastpath.cache_factory; long blocks (prefill) always run `hidden` eagerly
        self.fast_hidden = self.hidden
        self.graphs = False             # True when fast_hidden replays CUDA graphs

    def _layer(self, block) -> LayerWeights:
        a, m, w = block.self_attn, block.mlp, self._w
        return LayerWeights(block.input_layernorm.weight, w(a.q_proj.weight), _bias(a.q_proj), w(a.k_proj.weight),
                            _bias(a.k_proj), w(a.v_proj.weight), _bias(a.v_proj), w(a.o_proj.weight),
                            _bias(a.o_proj), block.post_attention_layernorm.weight, w(m.gate_proj.weight),
                            w(m.up_proj.weight), w(m.down_proj.weight))

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pos: [B, T] → cos, sin: [B, 1, T, head_dim] (as transformers computes them, in fp32)."""
        freqs = pos[..., None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
        return cos.to(self.dtype)[:, None], sin.to(self.dtype)[:, None]

    def hidden(self, tokens, pos, bias, slots, kbufs, vbufs, layer_fn=None) -> torch.Tensor:
        """Run every layer. tokens, pos: [B, T]; bias: [B, 1, T, S] additive mask; slots: [T] cache
        slots the block is written to; kbufs/vbufs: per layer [B, n_kv, S, head_dim], updated in place.
        Returns the final-normed hidden states [B, T, d]."""
        fn = layer_fn or decoder_layer
        x = F.embedding(tokens, self.embed)
        cos, sin = self.rope(pos)
        for w, kb, vb in zip(self.layers, kbufs, vbufs):
            x = fn(x, cos, sin, bias, slots, kb, vb, w.as_tuple(), self.dims)
        return rms_norm(x, self.norm, self.norm_eps)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h: [B, T', d] → logits [B, T', V] (one matmul, outside any compiled graph)."""
        return linear(h, self.head)


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    dtype = x.dtype
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return w * xf.to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def decoder_layer(x, cos, sin, bias, slots, kbuf, vbuf, w: tuple, dims: Dims) -> torch.Tensor:
    """One pre-norm decoder block. x: [B, T, d]; cos, sin: [B, 1, T, hd]; bias: [B, 1, T, S];
    slots: [T]; kbuf, vbuf: [B, n_kv, S, hd], the block's keys/values are written at `slots`.
    Returns x: [B, T, d]."""
    ln1, wq, bq, wk, bk, wv, bv, wo, bo, ln2, w_gate, w_up, w_down = w
    B, T, _ = x.shape
    H, Hkv, hd = dims.n_heads, dims.n_kv, dims.head_dim
    h = rms_norm(x, ln1, dims.eps)
    q = linear(h, wq, bq).view(B, T, H, hd).transpose(1, 2)          # [B, H, T, hd]
    k = linear(h, wk, bk).view(B, T, Hkv, hd).transpose(1, 2)        # [B, Hkv, T, hd]
    v = linear(h, wv, bv).view(B, T, Hkv, hd).transpose(1, 2)
    q = q * cos + _rotate_half(q) * sin
    k = k * cos + _rotate_half(k) * sin
    kbuf.index_copy_(2, slots, k)
    vbuf.index_copy_(2, slots, v)
    # GQA without repeating K/V: the g query heads of one KV head become g×T queries of that head
    g = H // Hkv
    qg = q.reshape(B, Hkv, g * T, hd)
    S = kbuf.shape[2]
    bg = bias[:, :, None].expand(B, 1, g, T, S).reshape(B, 1, g * T, S)
    att = F.scaled_dot_product_attention(qg, kbuf, vbuf, attn_mask=bg, scale=hd ** -0.5)   # [B, Hkv, gT, hd]
    att = att.reshape(B, H, T, hd).transpose(1, 2).reshape(B, T, H * hd)
    x = x + linear(att, wo, bo)
    h = rms_norm(x, ln2, dims.eps)
    return x + linear(F.silu(linear(h, w_gate)) * linear(h, w_up), w_down)
