"""Drafters propose up to k tokens per row; the engine verifies them with the target.

Every engine makes its own drafter (`Pair.make_drafter()`): a drafter's KV cache holds the rows of
exactly one batch, so two engines must never share one (two runs sharing a drafter wrote their rows into
each other's cache). The model weights behind it are shared read-only.

- `ModelDrafter`: a small model from the same family (or the target itself with layers skipped —
  `make_layerskip_model`). It keeps its own `RaggedCache`, `draft_kv`. Each row's cache holds a prefix of the
  row's sequence (`fed[i]` tokens); the first draft pass of a step feeds whatever the row has not yet
  fed (usually the last emitted token, two after an all-accepted step, more after steps without
  speculation, the whole prompt for a new row), so the draft always catches up in one pass.
- `NgramDrafter`: prompt lookup (vLLM's `ngram`, transformers' `prompt_lookup_num_tokens`): find the
  earliest occurrence of the row's longest matching last n tokens (n = 3..1) and propose what followed —
  vLLM's rule, so a side-by-side run drafts the same tokens. No model, no cache.
"""
from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Protocol

import torch

from specviz.engine.kvcache import RaggedCache, left_padded, timed_forward, to_device
from specviz.engine.sampling import greedy_ids, probabilities, sample
from specviz.hardware.roofline import ZERO_COST, ModelSpec, PassCost, pass_cost
from specviz.lessons import Said


@dataclass
class Proposal:
    tokens: torch.Tensor | None   # [B, K] draft ids; entries past a row's length are padding. None where the
    #                               drafter made them on the host (`device_tokens()` copies them when asked:
    #                               greedy acceptance never asks, and on a GPU each copy is a launch)
    lengths: torch.Tensor | None  # [B] tokens drafted per row (None likewise: `device_lengths()`)
    q: torch.Tensor | None        # [B, K, V] draft probabilities (sampling with a model), else None
    passes: int = 0               # draft forward passes
    seconds: float = 0.0          # time inside draft forwards
    cost: PassCost = ZERO_COST    # FLOPs and bytes of those passes (rejected work included)
    conf: torch.Tensor | None = None   # [B, K] the draft's top probability at each drafted position
    #                                    (asked for with scores=True; a model drafter only)
    keys: list[int] | None = None      # per row, the key its drafts' acceptance is learnt under (a draft
    #                                    with no probabilities: the n-gram match length; None for a model)
    catchup_s: float = 0.0        # of `seconds`, the first pass when it fed rows a backlog (not a draft pass's price)
    # tokens and lengths as lists, where the drafter made them on the host or once read back: on a GPU each
    # read of a device tensor waits for the device, and a step reads these several times
    _host_tokens: list[list[int]] | None = field(default=None, init=False, repr=False, compare=False)
    _host_lengths: list[int] | None = field(default=None, init=False, repr=False, compare=False)
    _device: object = field(default=None, init=False, repr=False, compare=False)   # where device_* copy to

    @property
    def width(self) -> int:
        """K: each row's draft slots (the verify block is K + 1 wide)."""
        if self.tokens is not None:
            return self.tokens.shape[1]
        return len(self._host_tokens[0]) if self._host_tokens else 0

    def device_tokens(self) -> torch.Tensor:
        """`tokens` on the device (copied from the host lists on first use)."""
        if self.tokens is None:
            self.tokens = to_device(self._host_tokens, torch.long, self._device).reshape(len(self._host_tokens),
                                                                                        self.width)
        return self.tokens

    def device_lengths(self) -> torch.Tensor:
        """`lengths` on the device (copied from the host list on first use)."""
        if self.lengths is None:
            self.lengths = to_device(self._host_lengths, torch.long, self._device)
        return self.lengths

    def token_lists(self) -> list[list[int]]:
        """`tokens` as lists (read from the device at most once; do not modify them)."""
        if self._host_tokens is None:
            self._host_tokens = self.tokens.tolist()
        return self._host_tokens

    def length_list(self) -> list[int]:
        """`lengths` as a list (read from the device at most once; do not modify it)."""
        if self._host_lengths is None:
            self._host_lengths = self.lengths.tolist()
        return self._host_lengths

    def with_lists(self, tokens: list[list[int]] | None, lengths: list[int] | None) -> "Proposal":
        """This proposal, told its tokens and lengths as the host lists they were made from."""
        self._host_tokens, self._host_lengths = tokens, lengths
        return self

    def cut(self, lengths: list[int]) -> "Proposal":
        """The same drafts, each row verifying only its first lengths[i] (≤ what it drafted)."""
        K = max(lengths, default=0)
        host = None if self._host_tokens is None else [row[:K] for row in self._host_tokens]
        out = Proposal(None if self.tokens is None else self.tokens[:, :K],
                       None if self.lengths is None else to_device(lengths, torch.long, self.lengths.device),
                       None if self.q is None else self.q[:, :K], self.passes, self.seconds, self.cost,
                       None if self.conf is None else self.conf[:, :K], self.keys,
                       self.catchup_s).with_lists(host, list(lengths))
        out._device = self._device
        return out

    @classmethod
    def of_lists(cls, drafts: list[list[int]], device, **rest) -> "Proposal":
        """A proposal from drafts made on the host (a draft without a model): the lists, kept for the step's
        bookkeeping; copied to the device only if something asks (`device_tokens`, `device_lengths`)."""
        K = max([len(d) for d in drafts] + [0])
        # one tensor from padded lists, when asked: a tensor per row costs more than an n-gram lookup at 64 rows
        padded = [d + [0] * (K - len(d)) for d in drafts]
        out = cls(None, None, None, **rest).with_lists(padded, [len(d) for d in drafts])
        out._device = device
        return out


class Drafter(Protocol):
    """What the engine asks of a drafter. Rows are addressed by their position in the engine's batch.

    - `admit(seqs, tags)`: rows with these token sequences join at the end of the batch (a drafter with a
      cache may defer their prefill to the first step that drafts); `tags` (`RowTag`) say who each row is,
      for a drafter that needs it. Returns (seconds, PassCost).
    - `retire(keep)`: only the rows at these positions stay, in this order.
    - `propose(seqs, depths, confidence, temperatures, gens, scores=False, survival=None)`: up to
      depths[i] tokens for row i, whose full sequence is seqs[i]; a row stops early when its draft's top
      probability falls below confidence[i] (None: no threshold), or when the running product of those
      probabilities falls below survival[i]; a row with temperature > 0 samples from its own generator.
      With `scores` a model drafter also returns each position's top probability (`Proposal.conf`).
    - `commit(accepted)`: after verification, row i kept accepted[i] of its drafts; forget the rest.
    - `reset()`: drop every row and any cached state (after a failed step).
    - `backlogs(seqs)`: per row, the tokens it would feed a draft model before drafting (0 for a free draft).

    `free`: drafting runs no forward pass (n-gram, synthetic), so adaptive verification drafts the full
    depth; otherwise it prices each position's pass (`specviz.engine.draftdepth`). `keys`: the keys a free
    draft's proposals carry (`Proposal.keys`), whose acceptance adaptive verification learns.
    """

    free: bool
    keys: tuple[int, ...]
    label: str

    def admit(self, seqs: list[list[int]], tags: list | None = None) -> tuple[float, PassCost]: ...

    def retire(self, keep: list[int]) -> None: ...

    def propose(self, seqs: list[list[int]], depths: list[int], confidence: list[float | None],
                temperatures: list[float], gens: list, scores: bool = False,
                survival: list[float | None] | None = None) -> Proposal: ...

    def commit(self, accepted: list[int]) -> None: ...

    def reset(self) -> None: ...

    def backlogs(self, seqs: list[list[int]]) -> list[int]: ...


class ModelDrafter:
    free = False
    keys: tuple[int, ...] = ()          # its confidences say how sure it is: no keys

    def __init__(self, model, spec: ModelSpec, device, dtype, vocab: int,
                 layer_map: dict[int, int] | None = None, n_layers: int | None = None, label: str = "",
                 cache_factory=None):
        self.model, self.spec, self.device, self.dtype = model, spec, device, dtype
        self.cache_factory = cache_factory    # batch → KV cache (fast path); None = RaggedCache
        self.vocab = vocab            # logits are cut to the vocabulary shared with the target
        self.layer_map, self.n_layers = layer_map, n_layers
        self.label = label
        self.reset()

    def reset(self) -> None:
        self.draft_kv = (self.cache_factory(0) if self.cache_factory
                         else RaggedCache(0, self.device, self.dtype, self.layer_map))
        self.fed: list[int] = []      # per row: tokens of its sequence already in the draft cache
        self._spec_slots: torch.Tensor | None = None   # [B, K] slot of fed draft token j (or -1)
        self._fed_before: list[int] = []

    # --- rows joining and leaving -------------------------------------------------------------
    def admit(self, seqs: list[list[int]], tags: list | None = None):
        """New rows join with an empty draft cache: the first step that drafts feeds their whole
        sequence (catch-up), so a run at depth 0 never pays for a draft prefill."""
        self.draft_kv.add_rows(len(seqs))
        self.fed += [0] * len(seqs)
        return 0.0, ZERO_COST

    def retire(self, keep: list[int]) -> None:
        self.draft_kv.select(torch.tensor(keep, dtype=torch.long, device=self.device))
        self.fed = [self.fed[i] for i in keep]

    def backlogs(self, seqs: list[list[int]]) -> list[int]:
        """The draft cache catches up lazily: a row feeds every token since it last drafted."""
        return [len(s) - f for s, f in zip(seqs, self.fed)]

    # --- one step -------------------------------------------------------------------------------
    def propose(self, seqs: list[list[int]], depths: list[int], confidence: list[float | None],
                temperatures: list[float], gens: list, scores: bool = False,
                survival: list[float | None] | None = None) -> Proposal:
        B, K = len(seqs), max(depths, default=0)
        lengths = torch.zeros(B, dtype=torch.long, device=self.device)
        tokens = torch.zeros(B, max(K, 1), dtype=torch.long, device=self.device)
        if K == 0:
            return Proposal(tokens[:, :0], lengths, None).with_lists([[] for _ in range(B)], [0] * B)
        want = torch.tensor(depths, device=self.device)
        # only rows that draft catch up: a row at depth 0 keeps its place and is fed when it drafts again
        # (else a probe in one row would be a draft prefill of the whole batch)
        self._fed_before = [len(s) if d > 0 else f for s, f, d in zip(seqs, self.fed, depths)]
        self._spec_slots = torch.full((B, K), -1, dtype=torch.long, device=self.device)
        sampling = any(t > 0 for t in temperatures)
        q_all = torch.zeros(B, K, self.vocab, device=self.device) if sampling else None
        thresholds = None
        if any(c is not None for c in confidence):
            thresholds = torch.tensor([0.0 if c is None else c for c in confidence], device=self.device)
        floor = None     # survival stop: the running product of top probabilities
        if survival is not None and any(c is not None for c in survival):
            floor = torch.tensor([0.0 if c is None else c for c in survival], device=self.device)
        conf = torch.zeros(B, K, device=self.device) if scores or floor is not None else None
        running = torch.ones(B, device=self.device)
        feed, feed_valid = left_padded([s[f:] if d > 0 else [] for s, f, d in zip(seqs, self.fed, depths)],
                                       self.device)
        ctx, seconds, cost, passes = self.draft_kv.length, 0.0, ZERO_COST, 0
        # more than the last two tokens per row: a backlog (a new row, or one back from depth 0), priced apart
        catchup_s, backlog = 0.0, feed.shape[1] > 2
        alive = want > 0
        for j in range(K):
            logits, secs = timed_forward(self.draft_kv, self.model, feed, feed_valid, logits_to_keep=1)
            seconds += secs
            catchup_s = secs if j == 0 and backlog else catchup_s
            passes += 1
            cost = cost + pass_cost(self.spec, B, feed.shape[1], ctx, logits=1, n_layers=self.n_layers)
            ctx = self.draft_kv.length
            logits = logits[:, -1, : self.vocab]
            d, probs = self._pick(logits, temperatures, gens, alive) if sampling else (greedy_ids(logits), None)
            if thresholds is not None or conf is not None:
                # the distribution's top probability depends only on the tokens before position j,
                # never on the token drawn there: stopping on it keeps sampled verification exact
                top = (probs if probs is not None else torch.softmax(logits.float(), dim=-1)).max(dim=-1).values
                if thresholds is not None:
                    alive = alive & (top >= thresholds)
                if conf is not None:
                    conf[:, j] = top
                    running = running * top
                    if floor is not None:
                        alive = alive & (running >= floor)
            tokens[:, j] = torch.where(alive, d, 0)
            if q_all is not None:
                q_all[:, j] = probs
            lengths = lengths + alive.long()
            alive = alive & (want > j + 1)
            if j == K - 1 or not bool(alive.any()):
                break
            # feed d_j to the rows that keep drafting; the others get a hole
            self._spec_slots[:, j] = torch.where(alive, self.draft_kv.length, -1)
            feed, feed_valid = tokens[:, j:j + 1].clone(), alive[:, None].clone()
        Kused = int(lengths.max())
        return Proposal(tokens[:, :Kused], lengths,
                        None if q_all is None else q_all[:, :Kused], passes, seconds, cost,
                        None if conf is None else conf[:, :Kused], catchup_s=catchup_s)

    def _pick(self, logits: torch.Tensor, temperatures: list[float], gens: list, drafting: torch.Tensor):
        """Greedy rows take the argmax; sampled rows still drafting draw from their tempered
        distribution with their own generator — only they draw, so a row's random stream advances by
        its own drafts, whatever depth its batch mates use. Returns (tokens [B], probs [B, V]); greedy
        rows' probs are at temperature 1."""
        t = torch.tensor([x if x > 0 else 1.0 for x in temperatures], device=self.device)[:, None]
        probs = probabilities(logits, t)
        tokens = greedy_ids(logits)
        live = drafting.tolist()
        sampled = [i for i, x in enumerate(temperatures) if x > 0 and live[i]]
        if sampled:
            idx = torch.tensor(sampled, dtype=torch.long, device=self.device)
            tokens[idx] = sample(probs[idx], [gens[i] for i in sampled])
        return tokens, probs

    def commit(self, accepted: list[int]) -> None:
        """After verification: keep fed draft tokens 1..n (n accepted), turn the rest into holes."""
        if self._spec_slots is None:
            return
        slots = self._spec_slots
        n = to_device(accepted, torch.long, self.device)
        j = torch.arange(slots.shape[1], device=self.device)[None, :]
        reject = (slots >= 0) & (j >= n[:, None])       # fed token j+1 kept iff j+1 ≤ n
        rows, cols = reject.nonzero(as_tuple=True)
        self.draft_kv.invalidate(rows, slots[rows, cols])
        # a row fed d_1..d_m (m = its fed slots); of those, the first n are now part of its sequence
        kept = torch.minimum(n, (slots >= 0).sum(dim=1)).tolist()
        self.fed = [f + k for f, k in zip(self._fed_before, kept)]
        self._spec_slots = None
        self.draft_kv.compact()


class NgramDrafter:
    """Prompt-lookup drafting from the row's own context (no model, so draft cost is only CPU time)."""

    free = True
    label = "ngram (prompt lookup)"

    def __init__(self, device, max_ngram: int = 3):
        self.device, self.max_ngram = device, max_ngram
        self.keys = tuple(range(1, max_ngram + 1))     # a draft's key is the match length it came from

    def admit(self, seqs, tags=None):
        return 0.0, ZERO_COST

    def retire(self, keep):
        pass

    def commit(self, accepted):
        pass

    def reset(self) -> None:
        pass

    def backlogs(self, seqs: list[list[int]]) -> list[int]:
        return [0] * len(seqs)

    def lookup(self, seq: list[int], k: int) -> list[int]:
        """The k tokens that followed the earliest occurrence of seq's last n tokens, for the largest
        n = 3..1 that occurs earlier (vLLM's n-gram proposer picks the same: longest, then earliest)."""
        return self.match(seq, k)[0]

    def match(self, seq: list[int], k: int) -> tuple[list[int], int]:
        """`lookup`'s drafts and the n-gram length n they came from (0: no match)."""
        if not seq:
            return [], 0
        last, size = seq[-1], len(seq)
        for n in range(min(self.max_ngram, size - 1), 0, -1):
            tail = seq[-n:]
            end = n - 1           # a candidate's last position, n - 1 … size - 2: where `last` occurs
            while True:
                # list.index scans in C for the next `last`; only those places are compared in Python
                try:
                    end = seq.index(last, end, size - 1)
                except ValueError:
                    break
                start = end - n + 1
                if seq[start:end + 1] == tail:
                    return seq[end + 1:end + 1 + k], n
                end += 1
        return [], 0

    def propose(self, seqs, depths, confidence, temperatures, gens, scores=False, survival=None) -> Proposal:
        t0 = time.perf_counter()
        found = [self.match(s, k) if k > 0 else ([], 0) for s, k in zip(seqs, depths)]
        return Proposal.of_lists([d for d, _ in found], self.device, seconds=time.perf_counter() - t0,
                                 keys=[n for _, n in found])


def make_layerskip_model(model, first: int, last: int):
    """The target with decoder layers first..last (inclusive) skipped, sharing every weight.

    Returns (model_view, layer_map, kept_layers). The view is a shallow copy whose layer list omits the
    skipped blocks; `layer_map` maps each kept block's original index to its slot in the draft's cache.
    """
    inner = model.model
    n = len(inner.layers)
    if not (0 <= first <= last < n):
        raise ValueError(Said("errors.layerskip_outside", a=first, b=last, last=n - 1))
    kept = [i for i in range(n) if not first <= i <= last]
    if not kept:
        raise ValueError(Said("errors.layerskip_all"))
    view_inner = copy.copy(inner)
    view_inner._modules = dict(inner._modules)
    view_inner.layers = torch.nn.ModuleList([inner.layers[i] for i in kept])
    view = copy.copy(model)
    view._modules = dict(model._modules)
    view.model = view_inner
    return view, {orig: dense for dense, orig in enumerate(kept)}, len(kept)
