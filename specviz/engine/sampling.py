"""Accept/reject maths for a batch of draft proposals, no models. Greedy verification compares on the host
(`greedy_accept`: a handful of integers a row, read back once); sampling is torch on the logits' device.

Shapes used by the sampling functions (B rows, K = the step's max depth, V vocabulary):
- draft:   [B, K]      draft token ids (entries past a row's length are ignored)
- lengths: [B]         how many tokens each row drafted (0..K)
- p:       [B, K+1, V] target probabilities at each draft position plus the bonus position
- q:       [B, K, V]   draft probabilities the draft tokens were sampled from (None: point masses)

Random numbers come either from one generator for the whole batch, or from a list with one generator per
row: the engine gives every row its own stream, so a seeded request draws the same numbers whatever
else shares its batch.
"""
from __future__ import annotations

import torch


def probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Softmax at a temperature, in fp32 so that small probabilities survive the ratio test."""
    return torch.softmax(logits.float() / temperature, dim=-1)


ARGMAX_CHUNK = 1024


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """logits.argmax(dim=-1), the same indices (the first maximum; a NaN counts as the maximum), faster
    on a CPU. torch's CPU argmax over a long last dimension does not vectorise: ~30 µs per position of a
    49152-token vocabulary, 1.1 ms for a 4-row, 9-wide verify, where `amax` takes a tenth of that. So the
    maximum of each 1024-wide chunk comes from `amax`, the first chunk holding the row's maximum from an
    argmax over the chunk maxima, and the index from an argmax inside that chunk alone."""
    V = logits.shape[-1]
    main = (V // ARGMAX_CHUNK) * ARGMAX_CHUNK
    if logits.device.type != "cpu" or main < 4 * ARGMAX_CHUNK:
        return logits.argmax(dim=-1)
    flat = logits.reshape(-1, V)
    chunks = flat[:, :main].reshape(flat.shape[0], -1, ARGMAX_CHUNK)
    peaks = chunks.amax(dim=-1)                                             # [N, V // C]
    c = peaks.argmax(dim=-1)                                                # first chunk with the maximum
    rows = torch.arange(flat.shape[0], device=flat.device)
    idx = c * ARGMAX_CHUNK + chunks[rows, c].argmax(dim=-1)
    if main < V:                    # a tail shorter than a chunk: it wins only if strictly greater (or NaN)
        best, tail = peaks[rows, c], flat[:, main:]
        t_best, t_idx = tail.amax(dim=-1), tail.argmax(dim=-1) + main
        wins = (t_best > best) | (t_best.isnan() & ~best.isnan())
        idx = torch.where(wins, t_idx, idx)
    return idx.reshape(logits.shape[:-1])


Gens = torch.Generator | list[torch.Generator]


def sample(probs: torch.Tensor, gen: Gens) -> torch.Tensor:
    """One draw per leading index from the last dimension. probs: [..., V] → [...].
    With a list of generators (one per row of the first dimension) each row draws from its own."""
    if isinstance(gen, list):
        return torch.stack([sample(probs[i], g) for i, g in enumerate(gen)]) if gen else \
            torch.zeros(probs.shape[:-1], dtype=torch.long, device=probs.device)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=gen).reshape(probs.shape[:-1])


def uniform(lengths: torch.Tensor, cols: int, gen: Gens, device) -> torch.Tensor:
    """[rows, cols] uniform draws, from one generator, or one per row drawing only lengths[i] numbers
    (the rest are 1, never accepted and never looked at): a row's stream then advances by its own
    drafts only, not by the depth of whatever shares its batch."""
    if isinstance(gen, list):
        u = torch.ones(len(gen), cols, device=device)
        for i, (g, n) in enumerate(zip(gen, lengths.tolist())):
            u[i, :n] = torch.rand(n, generator=g, device=device)
        return u
    return torch.rand(lengths.shape[0], cols, generator=gen, device=device)


def _first_rejection(ok: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Accepted prefix length per row: positions before the first failure, capped at the row's length."""
    K = ok.shape[1]
    in_range = torch.arange(K, device=ok.device)[None, :] < lengths[:, None]
    return torch.cumprod((ok & in_range).long(), dim=1).sum(dim=1)


def greedy_accept(target_ids: list[list[int]], drafts: list[list[int]], lengths: list[int]):
    """Greedy verification, on the host. target_ids [B][K+1]: the target's argmax at each position; drafts
    [B][≥ lengths[i]]. A draft token is kept while it equals the target's own argmax; the target's argmax
    at the first mismatch (the correction) or after the last draft (the bonus) follows. Returns
    (n_accepted, next_token), lists of B."""
    n, nxt = [], []
    for ids, d, k in zip(target_ids, drafts, lengths):
        a = 0
        while a < k and d[a] == ids[a]:
            a += 1
        n.append(a)
        nxt.append(ids[a])
    return n, nxt


def speculative_accept(p: torch.Tensor, q: torch.Tensor | None, draft: torch.Tensor,
                       lengths: torch.Tensor, gen: Gens):
    """Leviathan et al. 2023 / Chen et al. 2023 speculative sampling for a batch.

    Rule: keep draft token x with probability min(1, p(x)/q(x)); at the first rejection draw from
    norm(max(0, p − q)); if all are kept draw a bonus token from p at the next position. The output is
    distributed exactly as sampling from p. A point-mass draft (q = None, e.g. n-gram lookup) has
    q(x) = 1, so x is kept with probability p(x) and the residual is p with x removed.
    Returns (n_accepted [B], next_token [B]).
    """
    B, K1, V = p.shape
    K = K1 - 1
    if K == 0:
        return torch.zeros(B, dtype=torch.long, device=p.device), sample(p[:, 0], gen)
    p_x = p[:, :K].gather(2, draft[:, :, None]).squeeze(2)                       # [B, K]
    q_x = torch.ones_like(p_x) if q is None else q.gather(2, draft[:, :, None]).squeeze(2)
    u = uniform(lengths, K, gen, p.device)
    ok = u * q_x < p_x                                                            # u < p/q without dividing by 0
    n = _first_rejection(ok, lengths)
    p_n = p.gather(1, n[:, None, None].expand(B, 1, V)).squeeze(1)               # [B, V]
    rejected = n < lengths
    if q is None:
        q_n = torch.zeros_like(p_n)
        x_n = draft.gather(1, n.clamp(max=K - 1)[:, None]).squeeze(1)
        q_n.scatter_(1, x_n[:, None], 1.0)
    else:
        q_n = q.gather(1, n.clamp(max=K - 1)[:, None, None].expand(B, 1, V)).squeeze(1)
    residual = torch.clamp(p_n - q_n, min=0.0)
    mass = residual.sum(dim=1, keepdim=True)
    # p == q exactly leaves no residual mass; then a rejection is impossible, but guard against
    # rounding by falling back to p
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_n)
    dist = torch.where(rejected[:, None], residual, p_n)
    return n, sample(dist, gen)
