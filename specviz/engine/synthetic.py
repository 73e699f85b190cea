"""A synthetic draft with a set acceptance rate: acceptance as a dial, losslessly.

`synthetic:A` proposes, at each drafted position, the target's own greedy token with probability A and
otherwise a token the target would not choose there (a token of the row's own continuation, from another
place). The target's own tokens come from a reference: the target's greedy continuation of each row,
decoded beforehand by the same engine at depth 0 on the same batch (`RowTag.reference`, carried by the
request). Verification stays the real one, so the output is
the target's token for token and the acceptance measured is the target's verdict, not the coin; with
a free draft (no forward pass) the expected tokens per step are (1 − A^(k+1)) ÷ (1 − A).

Each coin is keyed by (seed, row, absolute position), so every arm of a comparison draws the same coins
whatever its depth or batch. Where the output leaves the reference (two candidates tied within
floating-point noise on one path and not on the other), the reference no longer describes the row's
context: the row re-aligns to its own output by drafting nothing more (it decodes one token a step, as
plain decoding does), so no draft is ever judged against a stale reference. These re-alignments are
counted and reported (`realigned`).

vLLM's synthetic mode accepts drafts with a set probability whatever they are, so its output is not the
target's; this one keeps the output exact and only sets what the drafts are.
"""
from __future__ import annotations

import time

from specviz.engine.drafters import Proposal
from specviz.engine.request import Knobs, RowTag
from specviz.hardware.roofline import ZERO_COST

SYNTHETIC_KEYS = 100     # a synthetic draft at A learns under key SYNTHETIC_KEYS + round(100 A): the dial may move
_MASK = (1 << 64) - 1
_WRONG = 0x5DEECE66D     # salts the coin that picks which wrong token a rejected position gets


def coin(seed: int, row: int, position: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, row, position): a splitmix64 hash of the three."""
    x = (seed * 0x9E3779B97F4A7C15 + row * 0xBF58476D1CE4E5B9 + position * 0x94D049BB133111EB) & _MASK
    for shift, mul in ((30, 0xBF58476D1CE4E5B9), (27, 0x94D049BB133111EB)):
        x = ((x ^ (x >> shift)) * mul) & _MASK
    x ^= x >> 31
    return (x >> 11) / float(1 << 53)


class SyntheticDrafter:
    """Drafts the reference token with probability `rate`, else another token; no model, no cache."""

    free = True

    def __init__(self, rate: float, vocab: int, device):
        self.rate, self.vocab, self.device = float(rate), int(vocab), device
        self.realigned = 0                 # rows whose output left their reference, over this drafter's life
        self.unreferenced = 0              # rows asked to draft without a reference (they draft nothing)
        self.reset()

    @property
    def label(self) -> str:
        return f"synthetic:{self.rate:g}"

    @property
    def keys(self) -> tuple[int, ...]:
        """One key per dial setting: what adaptive verification learnt at one A says nothing about another."""
        return (SYNTHETIC_KEYS + round(100 * self.rate),)

    def reset(self) -> None:
        self.tags: list[RowTag | None] = []
        self._followed: list[int] = []     # per row: emitted tokens checked against the reference so far
        self._left: list[bool] = []        # per row: its output left the reference

    def admit(self, seqs: list[list[int]], tags: list | None = None):
        self.tags += [t if t is not None and t.reference is not None else None for t in (tags or [None] * len(seqs))]
        self._followed += [0] * len(seqs)
        self._left += [False] * len(seqs)
        return 0.0, ZERO_COST

    def retire(self, keep: list[int]) -> None:
        self.tags = [self.tags[i] for i in keep]
        self._followed = [self._followed[i] for i in keep]
        self._left = [self._left[i] for i in keep]

    def commit(self, accepted) -> None:
        pass

    def backlogs(self, seqs: list[list[int]]) -> list[int]:
        return [0] * len(seqs)

    def propose(self, seqs, depths, confidence, temperatures, gens, scores=False, survival=None) -> Proposal:
        t0 = time.perf_counter()
        drafts = [self._row(i, s, k) for i, (s, k) in enumerate(zip(seqs, depths))]
        return Proposal.of_lists(drafts, self.device, seconds=time.perf_counter() - t0, keys=list(self.keys) * len(seqs))

    def _row(self, i: int, seq: list[int], k: int) -> list[int]:
        tag = self.tags[i]
        if k <= 0 or self._left[i]:
            return []
        if tag is None:
            self._left[i] = True           # counted once; it decodes as plain decoding does
            self.unreferenced += 1
            return []
        ref, done = tag.reference, len(seq) - tag.prompt_len       # tokens the row has emitted so far
        if self._follow(i, seq, tag, done):
            return []
        out = []
        for pos in range(done, min(done + k, len(ref))):
            right = ref[pos]
            if coin(tag.seed, tag.row, pos) < self.rate:
                out.append(right)
            else:          # any other token: the target, whose greedy choice is `right`, rejects it
                out.append(self._wrong(ref, tag, pos, right))
        return out

    def _wrong(self, ref, tag: RowTag, pos: int, right: int) -> int:
        """A wrong guess taken from the row's own continuation, at another place: random vocabulary put
        whatever words a tokenizer holds on a class's projected screen. Keyed by the coins, as the rest."""
        n = len(ref)
        start = int(coin(tag.seed ^ _WRONG, tag.row, pos) * n)
        for j in range(n):
            if ref[(start + j) % n] != right:
                return ref[(start + j) % n]
        return (right + 1) % self.vocab          # a continuation of one repeated token: its neighbour id

    def _follow(self, i: int, seq: list[int], tag: RowTag, done: int) -> bool:
        """Check the tokens emitted since the last step against the reference; count a row once when its
        output leaves it. Returns whether it has left."""
        start = self._followed[i]
        if done > start:
            if list(tag.reference[start:done]) != seq[tag.prompt_len + start: tag.prompt_len + done]:
                self._left[i] = True
                self.realigned += 1
            self._followed[i] = done
        return self._left[i]


def reference_run(engine, prompts: list[list[int]], batch: int, max_new: int) -> tuple[dict, float]:
    """The target's own greedy continuation of each prompt, decoded by `engine` at depth 0 on a batch of
    `batch` rows (prompts reused in order, as the run that follows reuses them), `max_new` tokens long and
    ending at EOS only where the engine's rows do. Returns (prompt → continuation, seconds it took): the
    price of the dial, paid before the timed run and left out of its figures."""
    t0 = time.perf_counter()
    for _ in engine.generate(prompts, Knobs(0, batch), max_new):
        pass
    refs: dict[tuple[int, ...], tuple[int, ...]] = {}
    for row, out in engine.outputs().items():
        refs.setdefault(tuple(engine.prompt_of(row)), tuple(out))
    return refs, time.perf_counter() - t0
