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

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specviz.fastpath import rows
from specviz.fastpath.layout import CLASS_NAMES, Plan, Routed, linear, plan_for, row_class, stacked
from specviz.lessons import Listed, Said

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
    """One decoder layer's parameters as the fast path multiplies them: q, k and v stacked into one
    matrix, gate and up into another (4 matmuls a layer instead of 7: fewer calls, larger streams; each
    output is the same dot product, so the values are bit-for-bit those of the separate matrices),
    each stored in its layout (`specviz.fastpath.layout`). Biases None where the family has none."""

    ln1: torch.Tensor
    wqkv: object            # [(H + 2 Hkv) hd, d]: a tensor, or a layout.Routed
    bqkv: torch.Tensor | None
    wo: object
    bo: torch.Tensor | None
    ln2: torch.Tensor
    w_gu: object            # [2 I, d]: gate rows, then up rows
    w_down: object

    def as_tuple(self) -> tuple:
        return (self.ln1, self.wqkv, self.bqkv, self.wo, self.bo, self.ln2, self.w_gu, self.w_down)


def _matrices(block) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The layer's four matrices as multiplied: [q; k; v], o, [gate; up], down (stacked ones are copies,
    made once per weight and shared by every view of the model, e.g. a layer-skip draft)."""
    a, m = block.self_attn, block.mlp
    return (stacked((a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)), a.o_proj.weight,
            stacked((m.gate_proj.weight, m.up_proj.weight)), m.down_proj.weight)


def weights_of(model) -> list[torch.Tensor]:
    """The matrices a pass multiplies by, the LM head first (what `layout.plan_for` times)."""
    head = model.get_output_embeddings().weight
    return [head] + [w for block in model.model.layers for w in _matrices(block)]


def _qkv_bias(a) -> torch.Tensor | None:
    parts = [_bias(lin) for lin in (a.q_proj, a.k_proj, a.v_proj)]
    if all(p is None for p in parts):
        return None
    return torch.cat([p.detach() if p is not None else lin.weight.new_zeros(lin.weight.shape[0])
                      for p, lin in zip(parts, (a.q_proj, a.k_proj, a.v_proj))])


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

    def __init__(self, model, compiled: bool = False, plan: Plan | None = None):
        """`plan`: the weights' layouts (`passes.compact_for` chooses one by timing whole passes); None:
        the fastest per matrix shape as measured here (`layout.plan_for`; on CUDA the weights in place)."""
        check_supported(model)
        cfg, inner = model.config, model.model
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.dims = Dims(cfg.num_attention_heads, cfg.num_key_value_heads, head_dim, float(cfg.rms_norm_eps))
        self.embed = inner.embed_tokens.weight                     # [V, d]
        self.norm = inner.norm.weight                              # [d]
        self.norm_eps = float(inner.norm.variance_epsilon)
        head = model.get_output_embeddings().weight                # [V, d] (the embedding when tied)
        mats = [_matrices(block) for block in inner.layers]
        self.head_rows = head.shape[0]                             # logits per token (the vocabulary)
        self.inv_freq = inner.rotary_emb.inv_freq                  # [head_dim / 2]
        self.rope_scale = float(inner.rotary_emb.attention_scaling)
        self.device, self.dtype = self.embed.device, self.embed.dtype
        self.plan: Plan = plan if plan is not None else plan_for(weights_of(model), compiled)
        self._w = self.plan.store                                  # the weights' layout, see above
        self.head = self._w(head)
        self.layers = [self._layer(block, ms) for block, ms in zip(inner.layers, mats)]
        self._tuples = [w.as_tuple() for w in self.layers]        # built once, not per layer per pass
        self._c_layers = tuple(rows.layers(self.layers, self.dims, functools.partial(_for_class, c))
                               if self.plan.c_layers[c] else None
                               for c in range(len(CLASS_NAMES)))     # per row class, immutable once built
        # what a short block (decode, verify, draft) runs: `hidden` itself, or compiled layers set by
        # specviz.fastpath.compile_compact; long blocks (prefill) always run `hidden` eagerly
        self.fast_hidden = self.hidden

    def _layer(self, block, mats) -> LayerWeights:
        wqkv, wo, w_gu, w_down = (self._w(m) for m in mats)
        return LayerWeights(block.input_layernorm.weight, wqkv, _qkv_bias(block.self_attn), wo,
                            _bias(block.self_attn.o_proj), block.post_attention_layernorm.weight, w_gu, w_down)

    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def rope(self, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """pos: [B, T] → cos, sin: [B, T, 1, head_dim] (as transformers computes them, in fp32), with
        rotate-half's minus sign moved into the first half of sin (x·(−s) is exactly −(x·s)), so a layer
        rotates by swapping halves without negating."""
        freqs = pos[..., None].float() * self.inv_freq.float()
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos() * self.rope_scale, emb.sin() * self.rope_scale
        half = sin.shape[-1] // 2
        sin = torch.cat((-sin[..., :half], sin[..., half:]), dim=-1)
        return cos.to(self.dtype)[:, :, None], sin.to(self.dtype)[:, :, None]

    def hidden(self, tokens, pos, bias, slots, kbufs, vbufs, layer_fn=None) -> torch.Tensor:
        """Run every layer. tokens, pos: [B, T]; bias: [B, 1, T, S] additive mask; slots: [T] cache
        slots the block is written to; kbufs/vbufs: per layer [B, n_kv, S, head_dim], updated in place.
        Returns the final-normed hidden states [B, T, d]."""
        fn = layer_fn or decoder_layer
        x = F.embedding(tokens, self.embed)
        cos, sin = self.rope(pos)
        lay = self.c_layers(tokens.numel()) if layer_fn is None else None
        done = rows.run_layers(lay, x, cos, sin, bias, slots, kbufs, vbufs) if lay is not None else None
        if done is not None:                                    # every layer in one C call each (rows.c)
            return rms_norm(done, self.norm, self.norm_eps)
        bias = self.grouped_bias(bias)
        for w, kb, vb in zip(self._tuples, kbufs, vbufs):
            x = fn(x, cos, sin, bias, slots, kb, vb, w, self.dims)
        return rms_norm(x, self.norm, self.norm_eps)

    def hidden_packed(self, tokens, pos, bias, slots, kbufs, vbufs, sel) -> torch.Tensor:
        """`hidden` for a block with holes (rows that drafted fewer tokens than the longest), computing only
        its N real tokens: `sel` [N] indexes them in the flattened [B·T] block. Every matrix multiplies
        N rows instead of B·T (where a pass is compute-bound, holes cost as much as tokens); only
        attention sees the padded [B, T] shape, and a hole writes zeros to its cache slot, which stays
        invalid. Returns the final-normed hidden states [N, d]."""
        B, T = tokens.shape
        x = F.embedding(tokens.reshape(-1)[sel], self.embed)                # [N, d]
        cos, sin = self.rope(pos.reshape(1, -1)[:, sel])                      # [1, N, 1, hd]
        lay = self.c_layers(sel.numel())
        done = rows.run_layers(lay, x, cos[0], sin[0], bias, slots, kbufs, vbufs, sel) if lay is not None else None
        if done is not None:                                    # in C: the holes are simply not there
            return rms_norm(done, self.norm, self.norm_eps)
        bias = self.grouped_bias(bias)
        for w, kb, vb in zip(self._tuples, kbufs, vbufs):
            x = packed_layer(x, cos[0], sin[0], bias, slots, kb, vb, w, self.dims, sel, B, T)
        return rms_norm(x, self.norm, self.norm_eps)

    def summary(self) -> str:
        """The weights' layouts and where whole layers run in C: what counters and benchmarks print."""
        classes = [name for name, lay in zip(CLASS_NAMES, self._c_layers) if lay is not None]
        if not classes:
            return self.plan.summary()
        if len(classes) == len(CLASS_NAMES):
            return Said("playground.fast.in_c_all", weights=self.plan.summary())
        return Said("playground.fast.in_c", weights=self.plan.summary(), rows=Listed(classes))

    def c_layers(self, n_rows: int):
        """The layers as our C layer runs them for a block of `n_rows` tokens (`rows.layers`), or None
        where a matrix of that row class is in another layout."""
        return self._c_layers[row_class(n_rows)]

    def grouped_bias(self, bias: torch.Tensor) -> torch.Tensor:
        """[B, 1, T, S] → [B, 1, g·T, S]. GQA without repeating K/V: the g query heads of one KV head
        attend as g×T queries of it, so the mask repeats g times — built once a pass, not once a layer."""
        B, _, T, S = bias.shape
        g = self.dims.n_heads // self.dims.n_kv
        return bias[:, :, None].expand(B, 1, g, T, S).reshape(B, 1, g * T, S)

    def logits(self, h: torch.Tensor) -> torch.Tensor:
        """h: [B, T', d] → logits [B, T', V] (one matmul, outside any compiled graph)."""
        return linear(h, self.head)


def _for_class(c: int, w):
    return w.by_class[c] if type(w) is Routed else w


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm: normalised in fp32, cast back to x's dtype, then scaled (transformers' order).
    `F.rms_norm` computes exactly that (checked in tests/test_fastpath.py), on CUDA as one fused kernel
    instead of a chain of small ones; outside fp32 the weight stays out of it, so the cast comes first."""
    if x.dtype == torch.float32 and w.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), w, eps)
    return w * F.rms_norm(x, (x.shape[-1],), None, eps)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """RoPE with transformers' rotate-half convention; `sin` carries the sign (see CompactLlama.rope)."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin


def decoder_layer(x, cos, sin, bias, slots, kbuf, vbuf, w: tuple, dims: Dims) -> torch.Tensor:
    """One pre-norm decoder block. x: [B, T, d]; cos, sin: [B, T, 1, hd]; bias: [B, 1, g·T, S] (the mask
    repeated for the g query heads of a KV head); slots: [T]; kbuf, vbuf: [B, n_kv, S, hd], the block's
    keys/values are written at `slots`. Returns x: [B, T, d]."""
    ln1, wqkv, bqkv, wo, bo, ln2, w_gu, w_down = w
    B, T, _ = x.shape
    H, Hkv, hd = dims.n_heads, dims.n_kv, dims.head_dim
    h = rms_norm(x, ln1, dims.eps)
    qkv = linear(h, wqkv, bqkv)                                       # [B, T, (H + 2 Hkv) hd]
    nqk = (H + Hkv) * hd
    qk = rotate(qkv[..., :nqk].view(B, T, H + Hkv, hd), cos, sin)     # q and k rotated together
    q = qk[:, :, :H].transpose(1, 2)                                  # [B, H, T, hd]
    k = qk[:, :, H:].transpose(1, 2)                                  # [B, Hkv, T, hd]
    v = qkv[..., nqk:].view(B, T, Hkv, hd).transpose(1, 2)
    kbuf.index_copy_(2, slots, k)
    vbuf.index_copy_(2, slots, v)
    g = H // Hkv
    qg = q.reshape(B, Hkv, g * T, hd)
    att = F.scaled_dot_product_attention(qg, kbuf, vbuf, attn_mask=bias, scale=hd ** -0.5)   # [B, Hkv, gT, hd]
    att = att.reshape(B, H, T, hd).transpose(1, 2).reshape(B, T, H * hd)
    return _after_attention(x, att, wo, bo, ln2, w_gu, w_down, dims.eps)


def _after_attention(x, att, wo, bo, ln2, w_gu, w_down, eps: float) -> torch.Tensor:
    """The layer's second half, shared by both shapes ([B, T, ·] or packed [N, ·]): output projection,
    residual, pre-norm SwiGLU MLP, residual."""
    x = x + linear(att, wo, bo)
    gu = linear(rms_norm(x, ln2, eps), w_gu)                          # [..., 2 I]: gate rows, then up rows
    inter = gu.shape[-1] // 2
    return x + linear(F.silu(gu[..., :inter]) * gu[..., inter:], w_down)


def packed_layer(x, cos, sin, bias, slots, kbuf, vbuf, w: tuple, dims: Dims, sel, B: int, T: int) -> torch.Tensor:
    """`decoder_layer` on the N real tokens of a [B, T] block with holes. x: [N, d]; cos, sin: [N, 1, hd];
    sel: [N] positions in the flattened block. The same per-token arithmetic: only which rows each
    matrix multiplies changes."""
    ln1, wqkv, bqkv, wo, bo, ln2, w_gu, w_down = w
    H, Hkv, hd = dims.n_heads, dims.n_kv, dims.head_dim
    h = rms_norm(x, ln1, dims.eps)
    qkv = linear(h, wqkv, bqkv)                                       # [N, (H + 2 Hkv) hd]
    nqk = (H + Hkv) * hd
    qk = rotate(qkv[:, :nqk].view(-1, H + Hkv, hd), cos, sin)         # [N, H + Hkv, hd]
    full = qkv.new_zeros(B * T, (H + 2 * Hkv) * hd)                   # the padded block for attention
    full[sel, :nqk] = qk.reshape(-1, nqk)
    full[sel, nqk:] = qkv[:, nqk:]
    full = full.view(B, T, H + 2 * Hkv, hd)
    q = full[:, :, :H].transpose(1, 2)                                # [B, H, T, hd]
    k = full[:, :, H:H + Hkv].transpose(1, 2)
    v = full[:, :, H + Hkv:].transpose(1, 2)
    kbuf.index_copy_(2, slots, k)
    vbuf.index_copy_(2, slots, v)
    g = H // Hkv
    att = F.scaled_dot_product_attention(q.reshape(B, Hkv, g * T, hd), kbuf, vbuf, attn_mask=bias, scale=hd ** -0.5)
    att = att.reshape(B, H, T, hd).transpose(1, 2).reshape(B * T, H * hd)[sel]   # [N, H hd]
    return _after_attention(x, att, wo, bo, ln2, w_gu, w_down, dims.eps)
