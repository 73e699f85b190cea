"""No attention query is ever fully masked, on any path (stock modules, the fast path, the graph path).

A padding query (a left-padded prompt, a hole after a short draft, a padding row of a graph bucket) has no
valid slot to see. On a CPU, SDPA gives such a query a uniform softmax over the masked scores, which is
finite. A fused GPU kernel need not: the mask's dtype minimum times log2(e) overflows to -inf, and a row of
-inf is NaN there. NaN then lands in the cache, and a masked slot still poisons its row (0 × NaN is NaN).
Here SDPA is replaced by such a kernel (`strict_sdpa`), and every path must stay exact."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from specviz.engine.request import Knobs
from specviz.fastpath.cache import StaticCache

pytestmark = pytest.mark.usefixtures("one_model_thread")

MAX_NEW = 12
SMALL = "rows=1,2,4,8;tokens=1,2,3,4,5,6,8;slots=64,128;wide=16"
REAL_SDPA = F.scaled_dot_product_attention


def strict_sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """SDPA as a fused GPU kernel treats a query that sees nothing: NaN (a mask at the dtype's minimum is
    -inf to it). Everything else as the real SDPA computes it."""
    if attn_mask is None or attn_mask.dtype == torch.bool:
        return REAL_SDPA(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p, is_causal=is_causal, scale=scale,
                         enable_gqa=enable_gqa)
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scores = (q.float() @ k.float().transpose(-1, -2)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    hidden = attn_mask <= torch.finfo(attn_mask.dtype).min / 2
    scores = scores.masked_fill(hidden, float("-inf")) + attn_mask.float().masked_fill(hidden, 0.0)
    return (torch.softmax(scores, dim=-1) @ v.float()).to(q.dtype)


def test_the_strict_kernel_returns_nan_for_a_query_that_sees_nothing():
    """The stand-in behaves as described, or the tests below prove nothing."""
    q, k, v = (torch.randn(1, 2, 3, 8) for _ in range(3))
    mask = torch.zeros(1, 1, 3, 3)
    mask[0, 0, 1] = torch.finfo(torch.float32).min                 # query 1 sees no key
    out = strict_sdpa(q, k, v, attn_mask=mask)
    assert torch.isnan(out[:, :, 1]).all() and torch.isfinite(out[:, :, [0, 2]]).all()
    assert torch.isfinite(REAL_SDPA(q, k, v, attn_mask=mask)).all()   # the CPU's own kernel: finite
    ok = torch.zeros(1, 1, 3, 3)
    assert torch.allclose(strict_sdpa(q, k, v, attn_mask=ok), REAL_SDPA(q, k, v, attn_mask=ok), atol=1e-5)


@pytest.mark.parametrize("compile", ["off", "static", "on"])
def test_every_path_stays_exact_where_a_kernel_gives_nan_to_a_query_that_sees_nothing(
        make_pair, monkeypatch, prompts, reference, compile):
    """Prompts of different lengths (left padding), depth 3 (holes) and 3 rows (a padding row in the graph
    path's 4-row bucket), run twice on one pair so the second batch reuses the first one's cache rows."""
    monkeypatch.setenv("SPECVIZ_LAYOUT", "stock")               # the torch layer (our C layers call no SDPA)
    monkeypatch.setenv("SPECVIZ_BUCKETS_ON_CPU", "1")
    monkeypatch.setenv("SPECVIZ_GRAPH_BUCKETS", SMALL)
    pair = make_pair("layerskip:1-2", compile)
    monkeypatch.setattr(F, "scaled_dot_product_attention", strict_sdpa)
    # as on CUDA, blocks with holes run whole (a CPU computes only their real tokens where that pays)
    monkeypatch.setattr(StaticCache, "_packable", staticmethod(lambda tok_valid, c_layers=None: None))
    for batch in (3, 4):
        eng = pair.engine()
        list(eng.generate(prompts, Knobs(depth=3, batch_size=batch), MAX_NEW))
        for row, out in eng.outputs().items():
            assert out == reference(row, MAX_NEW), f"{compile}: row {row} of {batch} differs from target.generate"
    for runner in pair.fast.runners:
        assert all(torch.isfinite(t).all() for t in runner.keys + runner.values), "NaN in the graph path's arena"
