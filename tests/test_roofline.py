"""Roofline arithmetic against hand-worked numbers."""
import pytest

from specviz.hardware import roofline as rf

# A 27B-parameter dense model at batch 1 (the article's Qwen3.5-27B example, shape simplified):
# 27e9 bf16 parameters = 54 GB streamed per token; on an H100 SXM (3.35 TB/s HBM3, 989 TFLOP/s dense
# bf16) streaming takes 54e9 / 3.35e12 = 16.1 ms while the 2 × 27e9 = 54 GFLOPs take 0.055 ms:
# memory-bound by a factor of ~295 — the ridge point — so up to ~295 tokens per pass cost the same.
H100_BW, H100_FLOPS = 3.35e12, 989e12


def test_article_27b_on_h100_is_memory_bound():
    cost = rf.PassCost(flops=2 * 27e9, bytes=27e9 * 2)
    t = rf.step_time(cost, H100_BW, H100_FLOPS)
    assert t == pytest.approx(54e9 / 3.35e12)
    assert cost.bytes / H100_BW / (cost.flops / H100_FLOPS) == pytest.approx(295.2, rel=1e-3)
    # 295 tokens in one pass: FLOP time now equals the streaming time (the knee)
    big = rf.PassCost(flops=2 * 27e9 * 295.2, bytes=54e9)
    assert big.flops / H100_FLOPS == pytest.approx(big.bytes / H100_BW, rel=1e-3)


def test_pass_cost_hand_worked():
    # 1 layer, d=4, 2 heads × 2 dims, 1 kv head, d_ff=8, vocab 10, fp32
    s = rf.ModelSpec("toy", n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, head_dim=2, d_ff=8, vocab=10,
                     tied=True, bytes_per_param=4)
    # q,o: 2·4·4 = 32; k,v: 2·4·2 = 16; mlp: 3·4·8 = 96 → 144 per layer; head 40
    assert s.layer_params == 144 and s.head_params == 40 and s.params == 184
    c = rf.pass_cost(s, batch=1, tokens=1, context=3, logits=1)
    # 2·144 + 2·40 + 4·4·(3 + 1)·1 = 288 + 80 + 64
    assert c.flops == 432
    # weights (144 + 40)·4 = 736; kv: 2·1·1·2·4 = 16 bytes per token × (3 + 1) = 64
    assert c.bytes == 800


def test_leviathan_formulas():
    assert rf.expected_tokens_per_pass(0.0, 4) == 1
    assert rf.expected_tokens_per_pass(1.0, 4) == 5
    assert rf.expected_tokens_per_pass(0.8, 4) == pytest.approx((1 - 0.8 ** 5) / 0.2)
    # paper's example regime: α = 0.8, γ = 5, c = 0.05 → ≈ 2.95×
    assert rf.walltime_improvement(0.8, 5, 0.05) == pytest.approx((1 - 0.8 ** 6) / 0.2 / 1.25)
    # more arithmetic, always ≥ 1 when drafts are not free
    assert rf.arithmetic_increase(0.8, 4, 0.1) > 1
    assert rf.arithmetic_increase(1.0, 4, 0.0) == pytest.approx(1.0)


def test_spec_from_hf_config():
    cfg = {"num_attention_heads": 9, "hidden_size": 576, "num_hidden_layers": 30, "num_key_value_heads": 3,
           "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True}
    s = rf.spec_from_config(cfg, "smollm2-135m")
    assert s.head_dim == 64
    assert 130e6 < s.params < 140e6   # SmolLM2-135M
