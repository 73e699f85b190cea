"""The accept/reject rule on toy distributions: the output must be distributed as the target's p."""
import pytest
import torch

from specviz.engine.sampling import greedy_accept, speculative_accept

P = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05])
Q = torch.tensor([0.1, 0.1, 0.2, 0.3, 0.3])     # a poor draft: mass where p has little


def _run(q_dist, k, n=40000, seed=0, point_mass_token=None):
    gen = torch.Generator().manual_seed(seed)
    p = P.expand(n, k + 1, 5).clone()
    if point_mass_token is None:
        draft = torch.multinomial(q_dist.expand(n * k, 5), 1, replacement=True, generator=gen).view(n, k)
        q = q_dist.expand(n, k, 5).clone()
    else:
        draft = torch.full((n, k), point_mass_token)
        q = None
    lengths = torch.full((n,), k)
    acc, nxt = speculative_accept(p, q, draft, lengths, gen)
    # the first emitted token: the first draft if accepted, else the resampled token
    first = torch.where(acc > 0, draft[:, 0], nxt)
    return acc, first


def _tv(samples):
    freq = torch.bincount(samples, minlength=5).float() / samples.numel()
    return 0.5 * (freq - P).abs().sum().item()


@pytest.mark.parametrize("k", [1, 3])
def test_first_token_follows_target(k):
    acc, first = _run(Q, k)
    assert _tv(first) < 0.01          # sampling noise at n = 40000 is ~0.003
    # acceptance probability of one token is Σ min(p, q) = 0.1+0.1+0.15+0.1+0.05 = 0.5
    assert (acc > 0).float().mean().item() == pytest.approx(0.5, abs=0.01)


def test_point_mass_draft_is_lossless():
    acc, first = _run(None, 2, point_mass_token=3)
    assert _tv(first) < 0.01
    assert (acc > 0).float().mean().item() == pytest.approx(P[3].item(), abs=0.01)


def test_rejections_resample_the_residual_and_acceptance_is_geometric():
    """Inside the rule: each draft is kept with probability Σ min(p, q) = 0.5, independently, so the
    accepted length is geometric (capped at k); after a rejection the next token follows
    norm(max(0, p − q)) = [0.8, 0.2, 0, 0, 0]; after k acceptances the bonus follows p."""
    k, n = 3, 40000
    gen = torch.Generator().manual_seed(2)
    draft = torch.multinomial(Q.expand(n * k, 5), 1, replacement=True, generator=gen).view(n, k)
    acc, nxt = speculative_accept(P.expand(n, k + 1, 5).clone(), Q.expand(n, k, 5).clone(), draft,
                                  torch.full((n,), k), gen)
    lengths = torch.bincount(acc, minlength=k + 1).float() / n
    assert lengths.tolist() == pytest.approx([0.5, 0.25, 0.125, 0.125], abs=0.01)
    residual = torch.bincount(nxt[acc < k], minlength=5).float() / int((acc < k).sum())
    assert residual.tolist() == pytest.approx([0.8, 0.2, 0.0, 0.0, 0.0], abs=0.01)
    assert _tv(nxt[acc == k]) < 0.02          # ~5,000 samples: noise ~0.01


def test_the_checks_above_catch_a_broken_rule(monkeypatch):
    """The bounds the tests above use reject the real rule with a fault put in: keeping every draft
    (its uniform draws all 0) gives the draft's q for the first token, not p."""
    from specviz.engine import sampling

    monkeypatch.setattr(sampling, "uniform", lambda lengths, cols, gen, device: torch.zeros(lengths.shape[0], cols))
    acc, first = _run(Q, 1)
    assert _tv(first) > 0.1 and (acc > 0).float().mean().item() == 1.0


def test_bonus_token_when_all_accepted_comes_from_p():
    # identical p and q: everything is accepted, the bonus is drawn from p at position k
    n, k = 40000, 2
    gen = torch.Generator().manual_seed(3)
    p = P.expand(n, k + 1, 5).clone()
    draft = torch.multinomial(P.expand(n * k, 5), 1, replacement=True, generator=gen).view(n, k)
    acc, nxt = speculative_accept(p, p[:, :k].clone(), draft, torch.full((n,), k), gen)
    assert bool((acc == k).all())
    assert _tv(nxt) < 0.01


def test_greedy_accept_prefix_and_correction():
    target = [[5, 6, 7, 8], [5, 6, 7, 8], [1, 2, 3, 4], [4, 0, 0, 0]]
    draft = [[5, 6, 9], [5, 6, 7], [9, 9, 9], [4, 0, 0]]
    n, nxt = greedy_accept(target, draft, [3, 2, 3, 0])
    assert n == [2, 2, 0, 0]
    assert nxt == [7, 7, 1, 4]   # correction, bonus after its 2 drafts, correction, a row that drafted none


@pytest.mark.parametrize("vocab", [49152, 49152 + 77, 5000])
def test_greedy_ids_is_argmax_ties_nan_and_infinities_included(vocab):
    """The chunked argmax gives torch's indices: the first maximum, within a chunk, across chunks, in the
    short tail, where a NaN is (torch counts it as the maximum), and for a row of -inf."""
    from specviz.engine.sampling import greedy_ids
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, vocab, generator=g)
    x[0, 1, 100] = x[0, 1, 3000] = 50.0                 # a tie in two chunks: the first wins
    x[0, 2, 2000] = x[0, 2, 2001] = 50.0                 # a tie inside one chunk
    x[1, 0, vocab - 1] = 60.0                           # the maximum in the last entry (the tail, if any)
    x[1, 1, vocab - 2] = x[1, 1, 10] = 70.0              # a tie between the first chunk and the end
    x[1, 2, 4000] = float("nan")                         # NaN counts as the maximum …
    x[1, 3, vocab - 3] = float("nan")                    # … in the tail too
    x[1, 3, 5] = float("inf")
    x[2, 0] = float("-inf")                              # a row of -inf: index 0
    got = greedy_ids(x)
    assert torch.equal(got, x.argmax(dim=-1))
    assert got[0, 1] == 100 and got[1, 0] == vocab - 1
    assert torch.equal(greedy_ids(x[0, 0]), x[0, 0].argmax(dim=-1))   # one position, no batch
