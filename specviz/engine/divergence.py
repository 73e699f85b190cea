"""Is our greedy output the target's own? The divergence report, and SpecViz's one near-tie rule.

Greedy speculative decoding is exact in exact arithmetic. In floating point, verifying k + 1 tokens in one
pass adds the same numbers in another order than decoding them one at a time, so where the target's best
tokens lie within rounding of each other either may win. Every check in SpecViz (bench-hf, generate
--check, bench-vllm, the Playground's check, scripts/gpu-check) applies this one rule:

    At the first position where two outputs differ, run the target once over the prompt and the common
    prefix (its own forward pass). The divergence is a near-tie when both candidate tokens lie within
    NEAR_TIE logits of the target's best there (so top-1 − top-2 < NEAR_TIE). Any other divergence is a bug.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specviz.lessons import Said

# logits: bf16 rounds a logit near 10 to ±0.03, and fp32 kernels that sum in another order move it far less
NEAR_TIE = 0.05


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first position where two token lists differ (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def is_near_tie(top_gap: float, ours_gap: float | None = None, reference_gap: float | None = None) -> bool:
    """The rule: the two best logits within NEAR_TIE, and each candidate (where there is one) within
    NEAR_TIE of the best. Gaps are the best logit minus the candidate's (≥ 0)."""
    gaps = [g for g in (top_gap, ours_gap, reference_gap) if g is not None]
    return all(g < NEAR_TIE for g in gaps)


@dataclass(frozen=True)
class Margins:
    """The target's own pass at one position: the best logit's lead over the second, and over each candidate."""

    top1_minus_top2: float
    ours_gap: float | None           # best − ours (None: our output had ended)
    reference_gap: float | None      # best − the reference's token

    @property
    def ours_minus_reference(self) -> float | None:
        if self.ours_gap is None or self.reference_gap is None:
            return None
        return self.reference_gap - self.ours_gap


@torch.inference_mode()
def target_margins(model, device, prefix: list[int], ours: int | None, reference: int | None) -> Margins:
    """One forward of the target over `prefix` (prompt + common prefix, one row, no padding)."""
    logits = model(torch.tensor([prefix], device=device)).logits[0, -1].float()
    top = torch.topk(logits, 2).values
    best = float(top[0])

    def gap(tok):
        return None if tok is None or not 0 <= tok < logits.shape[0] else best - float(logits[tok])
    return Margins(best - float(top[1]), gap(ours), gap(reference))


@dataclass(frozen=True)
class Divergence:
    """One row's first difference from the reference (`position` counts generated tokens from 0)."""

    row: int
    position: int
    ours: int | None                 # None: our output had ended there
    reference: int | None            # None: the reference had ended there
    margins: Margins

    @property
    def near_tie(self) -> bool:
        m = self.margins
        return is_near_tie(m.top1_minus_top2, m.ours_gap, m.reference_gap)

    def as_dict(self) -> dict:
        m = self.margins
        return {"row": self.row, "position": self.position, "ours": self.ours, "reference": self.reference,
                "top1_minus_top2": m.top1_minus_top2, "ours_minus_reference": m.ours_minus_reference,
                "near_tie": self.near_tie}

    def said(self, decode=None) -> Said:
        """The row's sentence (a near-tie, or a bug), tokens shown through `decode` (ids → text) when given."""
        def shown(tok):
            if tok is None:
                return Said("lossless.end_of_output")
            return repr(decode([tok]))[1:-1] if decode is not None else str(tok)
        key = "lossless.row_near_tie" if self.near_tie else "lossless.row_bug"
        return Said(key, row=self.row + 1, pos=self.position + 1, target_tok=shown(self.reference),
                    ours_tok=shown(self.ours), margin=f"{self.margins.top1_minus_top2:.3g}", rule=NEAR_TIE)


@dataclass(frozen=True)
class DivergenceReport:
    """Our outputs against the reference, row by row."""

    rows: int
    tokens: int                      # our tokens compared, all rows
    divergences: tuple[Divergence, ...]

    @property
    def identical(self) -> bool:
        return not self.divergences

    @property
    def bugs(self) -> list[Divergence]:
        return [d for d in self.divergences if not d.near_tie]

    @property
    def lossless(self) -> bool:
        """Identical, or every divergence a near-tie under the rule."""
        return not self.bugs

    @property
    def verdict(self) -> str:
        return "identical" if self.identical else "near-ties" if self.lossless else "bug"

    def as_dict(self) -> dict:
        return {"verdict": self.verdict, "identical": self.identical, "lossless": self.lossless,
                "rows": self.rows, "tokens": self.tokens, "near_tie_rule": str(rule_said()),
                "divergences": [d.as_dict() for d in self.divergences]}

    def sentences(self, decode=None) -> list[Said]:
        if self.identical:
            return [Said("lossless.identical_rows", rows=self.rows, n=self.tokens)]
        return [d.said(decode) for d in self.divergences] + [rule_said()]


def rule_said() -> Said:
    return Said("lossless.rule", rule=NEAR_TIE)


def compare_rows(model, device, prompts: list[list[int]], ours: list[list[int]],
                 reference: list[list[int]]) -> DivergenceReport:
    """Each row's first divergence from the reference, with the target's own margins there."""
    found = []
    for row, (prompt, a, b) in enumerate(zip(prompts, ours, reference)):
        pos = first_difference(a, b)
        if pos is None:
            continue
        mine = a[pos] if pos < len(a) else None
        theirs = b[pos] if pos < len(b) else None
        margins = target_margins(model, device, list(prompt) + list(a[:pos]), mine, theirs)
        found.append(Divergence(row, pos, mine, theirs, margins))
    return DivergenceReport(len(ours), sum(map(len, ours)), tuple(found))


@torch.inference_mode()
def reference_decode(model, device, prompt: list[int], max_new: int, eos_ids: list[int]) -> list[int]:
    """The target's own greedy continuation of one prompt: transformers' generate, no draft, no batch."""
    ids = torch.tensor([prompt], device=device)
    out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new,
                         pad_token_id=eos_ids[0] if eos_ids else 0, eos_token_id=list(eos_ids) or None,
                         temperature=None, top_p=None, top_k=None)
    return out[0, len(prompt):].tolist()


def check_against_target(model, device, eos_ids: list[int], prompts: list[list[int]],
                         ours: list[list[int]]) -> DivergenceReport:
    """Our rows against the target decoding each prompt alone, as many tokens as we wrote (a prompt
    shared by several rows is decoded once)."""
    done: dict[tuple, list[int]] = {}
    reference = []
    for prompt, a in zip(prompts, ours):
        key = (tuple(prompt), len(a))
        if a and key not in done:
            done[key] = reference_decode(model, device, list(prompt), len(a), eos_ids)
        reference.append(done.get(key, []))
    return compare_rows(model, device, prompts, ours, reference)
