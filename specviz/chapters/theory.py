"""Theory against measurement: what the acceptance dial predicts on this machine, and why a run sits apart.

With each drafted token right with probability A, independently, and a free draft (c = 0 in Leviathan et
al. 2023), a row's step of k drafts yields E(A, k) = (1 − A^(k+1)) ÷ (1 − A) tokens (k + 1 at A = 1). On
this machine that step costs one pass of k + 1 tokens, t(k + 1), where plain decoding pays t(1) a token,
so the predicted speed-up is E × t(1) ÷ t(k + 1), t read off the measured pass-time curve
(`specviz.hardware.passcurve`). A run whose batch or depth moved is predicted step by step: each step
costs t(its pass width), and plain decoding would spend E × t(its rows) on the same expected tokens.

A measurement differs from the prediction by factors that multiply one into the other, each measured:
- tokens:   tokens a row gained per step ÷ E (acceptance not independent per position, steps cut short)
- passes:   the curve's pass-time ratio ÷ the run's own (longer context than the curve's, noise)
- draft:    verify ÷ (verify + draft) seconds (the draft's own cost, c > 0)
- overhead: the share of step time inside the passes, speculative ÷ plain (sampling, bookkeeping)
- rest:     what is left (rows of different lengths, a batch that changed)
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

from specviz.hardware.passcurve import PassCurve
from specviz.hardware.roofline import expected_tokens_per_pass

AGREE = 0.15           # prediction and measurement within 15 % "agree"
REASONS = ("tokens", "passes", "draft", "overhead", "rest")
CLOSE = 0.05           # two factors within 5 % of each other: either may come out largest in the next run


@dataclass(frozen=True)
class StepShape:
    """One step as the theory sees it."""

    rows: int                      # rows in the pass (every user's)
    width: int                     # tokens the verify pass processed
    drafts: tuple[int, ...]        # drafts verified, per row of this request
    rate: float | None = None      # the dial's A at this step (None: the run's rate)


def shapes_of(events, rates: list[float | None] | None = None) -> list[StepShape]:
    """StepShapes from a run's step events (`rates`: the dial's A per step, where it moved)."""
    rates = rates or [None] * len(events)
    return [StepShape(ev.batch_size, ev.tokens_per_pass, tuple(len(r.drafted) for r in ev.rows), a)
            for ev, a in zip(events, rates) if ev.rows]


@dataclass(frozen=True)
class Prediction:
    tokens_per_step: float         # E, per row-step
    speedup: float                 # plain seconds ÷ speculative seconds for the same expected tokens
    pass_ratio: float              # Σ t(width) ÷ Σ t(rows): what the curve says a step costs over plain
    step_s: float = 0.0            # the mean of t(width) over the steps: with one row, speedup = E × t(1) ÷ this


def predict(shapes: list[StepShape], rate: float, curve: PassCurve) -> Prediction:
    """The theory for these steps at acceptance `rate` (a step's own rate, where it has one)."""
    spec_s = plain_s = rows_s = tokens = 0.0
    row_steps = 0
    for s in shapes:
        a = rate if s.rate is None else s.rate
        e = [expected_tokens_per_pass(a, k) for k in s.drafts]
        spec_s += curve.at(s.width)
        rows_s += curve.at(s.rows)
        plain_s += sum(e) / len(e) * curve.at(s.rows)
        tokens += sum(e)
        row_steps += len(e)
    if not shapes or spec_s <= 0:
        return Prediction(1.0, 1.0, 1.0, curve.at(1))      # E × t(1) ÷ step_s still reads 1.00×
    return Prediction(tokens / row_steps, plain_s / spec_s, spec_s / rows_s, spec_s / len(shapes))


@dataclass(frozen=True)
class Gap:
    """How a measured speed-up sits against its prediction, factor by factor (see the module docstring)."""

    predicted: float
    measured: float
    factors: dict[str, float]      # REASONS → factor (1: no part of the gap)
    detail: dict[str, float]       # what the factors are made of, for the sentences

    @property
    def difference(self) -> float:
        """Signed: prediction ÷ measurement − 1 (+: the theory promised more)."""
        return self.predicted / self.measured - 1 if self.measured > 0 else 1.0

    @property
    def agree(self) -> bool:
        return abs(self.difference) <= AGREE

    @property
    def main(self) -> str:
        """The reason that moves the measurement furthest from the prediction."""
        return max(REASONS, key=self._size)

    @property
    def runner_up(self) -> str | None:
        """The second reason where it is within CLOSE of the main one: naming one alone would flip between
        runs of the same work (single passes on a shared machine are that noisy)."""
        first, second = sorted(REASONS, key=self._size, reverse=True)[:2]
        close = math.log1p(CLOSE)
        # a second factor of ×1.00 is no reason at all, however small the first
        return second if self._size(second) >= close and self._size(first) - self._size(second) < close else None

    def _size(self, reason: str) -> float:
        return abs(math.log(max(self.factors[reason], 1e-9)))


def _per(total: float, n: int) -> float:
    return total / n if n else 0.0


def gap(pred: Prediction, spec, plain) -> Gap:
    """`spec`, `plain`: the run's and its plain baseline's RunTotals (decode seconds, prefill apart)."""
    measured = spec.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else 0.0
    passes_run = _ratio(_per(spec.verify_s, spec.steps), _per(plain.verify_s, plain.steps))
    in_spec = _ratio(spec.verify_s + spec.draft_s, spec.wall_s)
    in_plain = _ratio(plain.verify_s, plain.wall_s)
    f = {"tokens": _ratio(spec.mean_accepted_length, pred.tokens_per_step),
         "passes": _ratio(pred.pass_ratio, passes_run),
         "draft": _ratio(spec.verify_s, spec.verify_s + spec.draft_s),
         "overhead": _ratio(in_spec, in_plain)}
    explained = pred.speedup * math.prod(f.values())
    f["rest"] = _ratio(measured, explained) if measured else 1.0
    detail = {"curve_pass_ratio": pred.pass_ratio, "run_pass_ratio": passes_run, "draft_share": 1 - f["draft"],
              "overhead_spec": 1 - in_spec, "overhead_plain": 1 - in_plain}
    return Gap(pred.speedup, measured, f, detail)


def coin_values(shapes: list[StepShape], spec, acceptance: float, curve: PassCurve) -> dict:
    """Under the dial, how far the synthetic draft's coins landed from A. They are independent, as the
    formula assumes, so a tokens-a-step gap there is their luck over a short answer, not streaks: the
    share right over n judged guesses lies within ±2σ = 2√(A(1 − A) ÷ n) of A, 19 times in 20.
    `spec`: the run's RunTotals."""
    alpha, n = spec.alpha or 0.0, spec.reached
    at_alpha = [replace(s, rate=None) for s in shapes]        # a step's own A would override α
    return {"coin_alpha": alpha, "coin_n": n, "coin_a": acceptance,
            "coin_band": 2 * math.sqrt(acceptance * (1 - acceptance) / n) if n else 0.0,
            "tokens_at_alpha": predict(at_alpha, alpha, curve).tokens_per_step,
            "measured_tokens": spec.mean_accepted_length}


def reason_key(main: str, coins: dict | None = None, moved: bool = False) -> str:
    """The largest factor's sentence. Where the dial's coins set the tokens a step, theirs: how far they
    fell from A (or that they fell on it), or, for a dial moved during the Run, that they have no streaks."""
    if main != "tokens" or not (coins or moved):
        return f"reason_{main}"
    if moved:
        return "reason_tokens_moved"
    even = round(100 * coins["coin_alpha"]) == round(100 * coins["coin_a"])
    return "reason_tokens_dial_even" if even else "reason_tokens_dial"


def _ratio(a: float, b: float) -> float:
    """a ÷ b; 1 where b is missing (a part that was not measured is no part of the gap)."""
    return a / b if b > 0 else 1.0


def gap_values(g: Gap, pred: Prediction) -> dict:
    """The numbers a theory sentence fills in (the ledger's `reason_*`, the Playground's `theory_*`)."""
    return {"predicted_speedup": g.predicted, "measured_speedup": g.measured, "difference": g.difference,
            "abs_difference": abs(g.difference), "tokens_per_step": pred.tokens_per_step, "main": g.main,
            "runner_up": g.runner_up or "", "close": CLOSE,
            **{f"f_{k}": v for k, v in g.factors.items()}, **g.detail}
