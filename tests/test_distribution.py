"""The engine's samples follow the target's own distribution (the promise of speculative sampling).

tests/test_sampling.py checks the accept rule on toy distributions, for the first token. Here the whole
engine runs: seeded requests at temperature 1, rows of different prompt lengths, many steps, a depth
that changes every step (and per row, with the confidence policy), model and layer-skip drafts, on the
fast path with our C layers where the kernel builds. Every emitted token at output position ≥ 1 is then
scored against the target's exact next-token distribution given the same prefix, computed from the
target's own logits (stock transformers forward, no padding).

The statistic: a randomised probability integral transform. For a token x drawn from p (tokens ordered
by p, most likely first), u = P(X before x) + V·p(x), V uniform, is uniform on [0, 1); and because each
token is uniform given everything before it, the u of a whole run are independent. A chi-square test on
ten equal bins of u is then a goodness-of-fit test against the target's distribution at every position
at once. A draft whose distribution leaks into the output puts too few tokens in the first bins (a
random draft token is rarely one of the target's few most likely ones), which the test sees; the last
tests break the accept rule on purpose and check that it does.
"""
from __future__ import annotations

import pytest
import torch

from specviz.engine import loop, sampling
from specviz.engine.policies import make_policy
from specviz.engine.request import Knobs

pytestmark = pytest.mark.usefixtures("one_model_thread")

MAX_NEW = 20
ROWS = 6                 # rows per request (prompts of 1 to 8 tokens reused in order: ragged)
SEEDS = range(40)        # 40 requests × 6 rows × 19 scored positions ≈ 4500 tokens per case
BINS = 10
ALPHA = 1e-3             # the real rule must not be rejected at this level (seeded, so deterministic)
BROKEN_BELOW = 1e-6      # a broken rule must be rejected far beyond it
DEPTHS = (3, 0, 5, 1, 8, 2, 4)    # the depth asked for, changed at every step (k = 0 included)


@pytest.fixture(scope="module")
def fast_pairs(make_pair):
    """The pairs on the fast path: our C layers (every matrix in the "rows" layout) when the kernel
    builds here, else the static path with the measured layouts."""
    from specviz.fastpath import layout

    mp = pytest.MonkeyPatch()
    if "rows" in layout.available(torch.float32):
        mp.setenv("SPECVIZ_LAYOUT", "rows")
    try:
        return {d: make_pair(d, "static") for d in ("draft", "layerskip:1-2")}
    finally:
        mp.undo()


CASES = {          # (draft, policy): a model draft at a cycling depth; layer-skip rows that stop early
    "model": ("draft", lambda: make_policy("fixed")),
    "layerskip": ("layerskip:1-2", lambda: make_policy("confidence", threshold=0.03)),
}


def run_requests(pair, prompts, policy, seen: dict) -> list[tuple[list[int], list[int]]]:
    """(prompt, output) for every row of every seeded request; `seen` collects what the steps did
    (depths, ragged steps, accepted drafts) so the test can check its conditions really occurred."""
    out = []
    for seed in SEEDS:
        eng = pair.engine()
        knobs = Knobs(depth=DEPTHS[0], batch_size=ROWS, policy=policy())
        for ev in eng.generate(prompts, knobs, MAX_NEW, temperature=1.0, seed=seed):
            seen.setdefault("depths", set()).add(ev.depth)
            seen["ragged"] = seen.get("ragged", 0) + (len({len(r.drafted) for r in ev.rows}) > 1)
            seen["accepted"] = seen.get("accepted", 0) + sum(r.accepted for r in ev.rows)
            seen["rejected"] = seen.get("rejected", 0) + sum(r.last_kind == "correction" for r in ev.rows)
            knobs.set(depth=DEPTHS[(ev.step + 1) % len(DEPTHS)])
        out += [(eng.prompt_of(r), o) for r, o in eng.outputs().items()]
    return out


def pit_values(model, rows: list[tuple[list[int], list[int]]], seed: int = 0) -> torch.Tensor:
    """u for every emitted token past the first, against the target's exact distribution there."""
    gen = torch.Generator().manual_seed(seed)
    us = []
    with torch.inference_mode():
        for prompt, out in rows:
            if len(out) < 2:
                continue
            ids = torch.tensor([prompt + out])
            logits = model(ids).logits[0, len(prompt):len(prompt) + len(out) - 1].float()  # predicts out[1:]
            p = torch.softmax(logits, dim=-1)
            order = p.argsort(dim=-1, descending=True)
            sorted_p = p.gather(1, order)
            rank = (order == torch.tensor(out[1:])[:, None]).float().argmax(dim=1)
            before = sorted_p.cumsum(dim=1).gather(1, rank[:, None]).squeeze(1) - sorted_p.gather(1, rank[:, None]).squeeze(1)
            px = sorted_p.gather(1, rank[:, None]).squeeze(1)
            us.append(before + torch.rand(len(rank), generator=gen) * px)
    return torch.cat(us).clamp(0.0, 1.0 - 1e-9)


def chi_square_p(u: torch.Tensor) -> tuple[float, list[int]]:
    """p-value of "u is uniform" from a chi-square test on BINS equal bins (df = BINS - 1)."""
    counts = torch.bincount((u * BINS).long(), minlength=BINS).double()
    expected = len(u) / BINS
    stat = ((counts - expected) ** 2 / expected).sum()
    p = torch.special.gammaincc(torch.tensor((BINS - 1) / 2, dtype=torch.float64), stat / 2)
    return float(p), counts.long().tolist()


def goodness_of_fit(pair, prompts, loaded, policy) -> tuple[float, list[int], int, dict]:
    seen: dict = {}
    rows = run_requests(pair, prompts, policy, seen)
    u = pit_values(loaded["target"].model, rows)
    p, counts = chi_square_p(u)
    return p, counts, len(u), seen


@pytest.fixture(scope="module")
def ragged_prompts(prompts):
    """Prompts of 8, 3, 1 and 5 tokens: rows of different lengths share every step."""
    assert len({len(p) for p in prompts}) >= 3
    return [prompts[1][:8], prompts[0][:3], prompts[2][:1], prompts[3][:5]]


@pytest.mark.parametrize("case", CASES)
def test_engine_samples_follow_the_target(fast_pairs, ragged_prompts, loaded, case):
    draft, policy = CASES[case]
    pair = fast_pairs[draft]
    p, counts, n, seen = goodness_of_fit(pair, ragged_prompts, loaded, policy)
    print(f"\n{case} on {pair.fast.shown}: chi-square p = {p:.3g} over {n} tokens, bins {counts}, {seen}")
    # the conditions claimed above really occurred: depths from 0 to 8, ragged steps, drafts kept and rejected
    assert {0, 8} <= seen["depths"] and len(seen["depths"]) >= 5 and seen["ragged"] > 0, seen
    assert seen["accepted"] > 200 and seen["rejected"] > 200 and n > 4000, seen
    assert p > ALPHA, f"the engine's samples do not follow the target (p = {p:.2g}, bins {counts})"


# --- the same test must catch a broken accept rule ---------------------------------------------------
REAL_ACCEPT = sampling.speculative_accept


def accept_every_draft(p, q, draft, lengths, gen):
    """Broken: keep every draft token (the output is then the draft's distribution), bonus from p."""
    B, K1, V = p.shape
    n = lengths.clone() if K1 > 1 else torch.zeros(B, dtype=torch.long)
    return n, sampling.sample(p.gather(1, n[:, None, None].expand(B, 1, V)).squeeze(1), gen)


def residual_is_p(p, q, draft, lengths, gen):
    """Broken: the real test min(1, p/q), but after a rejection draw from p, not norm(max(0, p − q))."""
    if q is None or p.shape[1] == 1:
        return REAL_ACCEPT(p, q, draft, lengths, gen)
    B, K1, V = p.shape
    K = K1 - 1
    p_x = p[:, :K].gather(2, draft[:, :, None]).squeeze(2)
    q_x = q.gather(2, draft[:, :, None]).squeeze(2)
    ok = sampling.uniform(lengths, K, gen, p.device) * q_x < p_x
    n = sampling._first_rejection(ok, lengths)
    return n, sampling.sample(p.gather(1, n[:, None, None].expand(B, 1, V)).squeeze(1), gen)


@pytest.mark.parametrize("broken", [accept_every_draft, residual_is_p], ids=lambda f: f.__name__)
def test_the_fit_test_rejects_a_broken_accept_rule(fast_pairs, ragged_prompts, loaded, monkeypatch, broken):
    # the engine calls the rule by the name it imported; patch both so no path keeps the real one
    monkeypatch.setattr(sampling, "speculative_accept", broken)
    monkeypatch.setattr(loop, "speculative_accept", broken)
    draft, policy = CASES["model"]
    p, counts, n, _ = goodness_of_fit(fast_pairs[draft], ragged_prompts, loaded, policy)
    print(f"\n{broken.__name__}: chi-square p = {p:.3g} over {n} tokens, bins {counts}")
    assert p < BROKEN_BELOW, f"a broken accept rule went unnoticed (p = {p:.2g}, bins {counts})"
