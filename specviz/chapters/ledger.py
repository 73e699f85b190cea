"""Chapter: the FLOPs ledger. Where a speculative run's FLOPs and seconds went, acceptance by draft
position, Leviathan et al.'s theory from the measured α and c, and the prediction priced on this
machine's pass-time curve beside the measurement, with the measured reason they sit apart
(`specviz.chapters.theory`). With the acceptance dial it runs the synthetic draft `synthetic:A` on the
pair's target: A is then known, the draft free, and its reference is decoded before anything is timed.

Measured: about 4.5 s on the 2-core CPU with the offline SmolLM2-135M and the n-gram draft (depth 6).
"""
from __future__ import annotations

import math

from dataclasses import dataclass, field
from typing import Iterator

import plotly.graph_objects as go
from plotly.subplots import make_subplots


from specviz.chapters import theory as th
from specviz.chapters.base import Chapter, Result
from specviz.chapters.common import TimedRun, draft_cost, finished, finite, settings_of, snapshot, timed_run
from specviz.chapters.dial import References, dial_keys, dial_title
from specviz.chapters.dial import warm_up as dial_warm_up
from specviz.chapters.plotting import (DRAFT, KEPT, OTHER, OWN, PLAIN, PREDICTION, PREFILL, REJECTED, TICK, VERIFY,
                                       labels_for, styled)
from specviz.engine.request import StepEvent
from specviz.engine.torchmode import inference_steps
from specviz.hardware.passcurve import PassCurve, measure_curve
from specviz.hardware.roofline import expected_tokens_per_pass, walltime_improvement

LEDGER_AGREE = 0.15      # theory and measurement within 15 % "agree"


def _apart(theory: float, measured: float) -> float:
    return abs(theory / measured - 1) if measured > 0 else 1.0


def ledger_agreement(theory: dict, measured: dict) -> tuple[str, float]:
    """The larger relative difference |theory ÷ measured − 1| of the two numbers the page sets side by side
    (tokens per pass, speed-up); agree when it is at most 15 %. On the speed-up alone, an estimated draft
    cost that happened to offset the tokens' gap read as "agree within 0 %" beside 11 % apart."""
    diff = max(_apart(theory[q], measured[q]) for q in ("tokens_per_pass", "speedup"))
    return ("conclusion_agree" if diff <= LEDGER_AGREE else "conclusion_differ"), diff


def leviathan_theory(alpha: float, depth: int, c: float) -> dict[str, float]:
    """Expected tokens per target pass and wall-time speed-up for acceptance α, depth γ and draft cost c
    (roofline's implementations of Leviathan et al.'s equation 1 and theorem 3.8)."""
    return {"tokens_per_pass": expected_tokens_per_pass(alpha, depth),
            "speedup": walltime_improvement(alpha, depth, c)}


@dataclass
class FlopsLedger:
    """Where one request's FLOPs went. The verify pass is split evenly per slot (its matmuls cost the same
    per token; attention differs by a few per cent along the block): a row's slots are its drafts kept,
    its drafts rejected — with the padding slots of shorter drafts, also thrown away — and the slot that
    yields the target's own token. In a shared pass a row has the slots StepEvent.width gives it, and
    the draft work is StepEvent.draft_part, so the parts add up to RunTotals.spent_flops."""

    draft: float = 0.0
    kept: float = 0.0
    rejected: float = 0.0
    target: float = 0.0
    plain: float = 0.0
    drafted_at: list[int] = field(default_factory=list)    # position i: drafts proposed at i + 1
    accepted_at: list[int] = field(default_factory=list)   # position i: of which accepted

    def add(self, ev: StepEvent) -> None:
        self.draft += ev.draft_part
        per_slot = ev.target_flops / ev.tokens_per_pass if ev.tokens_per_pass else 0.0
        k = ev.width - 1                                   # draft slots a row of this request is charged
        for r in ev.rows:
            self.kept += per_slot * r.accepted
            self.rejected += per_slot * (k - r.accepted)
            self.target += per_slot
            self._positions(len(r.drafted), r.accepted)
        self.plain += ev.plain_flops

    def _positions(self, drafted: int, accepted: int) -> None:
        while len(self.drafted_at) < drafted:
            self.drafted_at.append(0)
            self.accepted_at.append(0)
        for i in range(drafted):
            self.drafted_at[i] += 1
            self.accepted_at[i] += i < accepted

    @property
    def spent(self) -> float:
        return self.draft + self.kept + self.rejected + self.target

    @property
    def flops_ratio(self) -> float:
        return self.spent / self.plain if self.plain else 0.0

    def parts(self) -> list[dict]:
        total = self.spent or 1.0
        return [{"part": p, "flops": f, "share": f / total} for p, f in
                (("draft", self.draft), ("kept", self.kept), ("rejected", self.rejected), ("target", self.target))]

    def positions(self) -> list[dict]:
        return [{"position": i + 1, "drafted": d, "accepted": a, "survival": a / d if d else 0.0}
                for i, (d, a) in enumerate(zip(self.drafted_at, self.accepted_at))]


def ledger_of(run: TimedRun) -> FlopsLedger:
    led = FlopsLedger()
    for ev in run.events:
        led.add(ev)
    return led


@inference_steps
def run_ledger(pair, prompt_ids: list[int], depth: int = 4, max_new: int = 48,
               acceptance: float | None = None) -> Iterator[Result]:
    """One speculative run (k = depth) with its FLOPs ledger, wall-time parts and acceptance by draft
    position; a plain run (k = 0) of the same prompt for the measured speed-up; Leviathan's theory from
    the measured α and c beside it, and the prediction from this machine's pass-time curve (measured
    first) with the factors that separate it from the measurement. `acceptance`: the dial's A (the
    pair's target with the synthetic draft; its reference decoded first, its cost reported).

    α is kept ÷ the drafts the target reached (RunTotals.alpha, the i.i.d. model's maximum-likelihood
    estimate), not accepted ÷ drafted (vLLM's ratio, low by the drafts after a rejection, never judged),
    nor the α that makes the model reproduce the measured tokens per pass (that would compare nothing).
    Measured speed-up is decode throughput (prefill excluded, as in the theory).

    Extra keys: `parts` (FLOPs parts), `times` (wall-time parts), `positions`, `theory` (rows of
    quantity / theory / measured), `spent_flops`, `plain_flops`, `flops_ratio`, `curve` (the pass-time
    curve the prediction used)."""
    if acceptance is not None:
        pair = pair.with_synthetic(acceptance)
    refs = References()
    settings = settings_of(pair, depth=depth, max_new=max_new, prompt_tokens=len(prompt_ids),
                           alpha_estimate="accepted ÷ reached")
    yield snapshot("ledger", pair, settings, 0.0, [], parts=[], times=[], positions=[], theory=[], curve=None,
                   **dial_keys(pair, refs))
    dial_warm_up(pair, refs, [prompt_ids], depth)
    curve = ledger_curve(pair, len(prompt_ids) + max_new // 2, depth)
    engine, references = refs.engine(pair, [prompt_ids], 1, max_new)      # a synthetic draft's reference first
    spec = timed_run(pair, [prompt_ids], depth, 1, max_new, engine=engine, references=references)
    led = ledger_of(spec)
    parts, times, positions = led.parts(), _time_parts(spec), led.positions()
    extra = {"parts": parts, "times": times, "positions": positions, "theory": [],
             "spent_flops": led.spent, "plain_flops": led.plain, "flops_ratio": led.flops_ratio,
             "curve": curve.as_dict()}
    yield snapshot("ledger", pair, settings, 0.5, _ledger_table(parts, times, positions, []), **extra,
                   **dial_keys(pair, refs))
    plain = timed_run(pair, [prompt_ids], 0, 1, max_new)
    values, theory = ledger_values(spec, plain, led, depth)
    dial = dial_values(spec, plain, curve, depth, acceptance, refs.seconds)
    values.update(dial)
    theory.append({"quantity": "curve_speedup", "theory": dial["predicted_speedup"], "measured": dial["measured_speedup"]})
    agree, _ = ledger_agreement(*_pairs(values))
    if acceptance is not None and agree == "conclusion_differ":
        agree = "conclusion_differ_dial"       # the synthetic draft's guesses come in no streaks
    extra["theory"] = theory
    snap = snapshot("ledger", pair, settings, 1.0, _ledger_table(parts, times, positions, theory), **extra,
                    **dial_keys(pair, refs))
    said = ["conclusion_waste", "conclusion_theory", agree, "conclusion_curve", dial["reason"]]
    said += [f"close_{dial['runner_up']}"] if dial["runner_up"] else []
    yield finished(snap, values, agree, said)      # under the dial the page says what ran and its reference's cost


def ledger_curve(pair, context: int, depth: int) -> PassCurve:
    """This machine's pass time at the sizes the theory prices (1 and k + 1 among them), on the forward
    path the runs take, measured before them."""
    t = pair.target
    sizes = tuple(sorted({1, 2, 4, 8, 16, depth + 1}))
    return measure_curve(t.model, t.device, t.dtype, pair.target_cache, context, sizes, pair.fast.shown)


def dial_values(spec: TimedRun, plain: TimedRun, curve: PassCurve, depth: int, acceptance: float | None,
                reference_s: float) -> dict:
    """The prediction from the pass-time curve at A (the dial) or the measured α, against the measured
    speed-up, and the measured factors between them (`specviz.chapters.theory`)."""
    rate = acceptance if acceptance is not None else finite(spec.totals.alpha)
    shapes = th.shapes_of(spec.events)
    pred = th.predict(shapes, rate, curve)
    g = th.gap(pred, spec.totals, plain.totals)
    coins = th.coin_values(shapes, spec.totals, acceptance, curve) if acceptance is not None else {}
    return {**th.gap_values(g, pred), **coins, "rate": rate, "k1": depth + 1,
            "reason": th.reason_key(g.main, coins),
            "t1_ms": 1e3 * curve.at(1), "tk_ms": 1e3 * curve.at(depth + 1), "step_ms": 1e3 * pred.step_s,
            "acceptance": acceptance if acceptance is not None else 0.0, "reference_s": reference_s,
            "curve_context": curve.context}


def _time_parts(run: TimedRun) -> list[dict]:
    t = run.totals
    overhead = max(0.0, run.wall_s - t.prefill_s - t.draft_s - t.verify_s)
    return [{"part": p, "seconds": s, "share": s / run.wall_s if run.wall_s else 0.0} for p, s in
            (("prefill", t.prefill_s), ("draft", t.draft_s), ("verify", t.verify_s), ("overhead", overhead))]


def ledger_values(spec: TimedRun, plain: TimedRun, led: FlopsLedger, depth: int) -> tuple[dict, list[dict]]:
    alpha = finite(spec.totals.alpha)
    c = draft_cost(spec, plain)
    theory = leviathan_theory(alpha, depth, c)
    measured = spec.totals.mean_accepted_length
    measured_speedup = spec.totals.tokens_per_s / plain.totals.tokens_per_s if plain.totals.tokens_per_s else 0.0
    _, diff = ledger_agreement(theory, {"tokens_per_pass": measured, "speedup": measured_speedup})
    values = {"waste": led.rejected / led.spent if led.spent else 0.0, "flops_ratio": led.flops_ratio,
              "alpha": alpha, "c": c, "depth": depth, "theory": theory["tokens_per_pass"],
              "theory_speedup": theory["speedup"], "measured": measured, "measured_speedup": measured_speedup,
              "diff": diff,
              # for the UI's notes: the race's number (prefill included, which the theory leaves out)
              "measured_speedup_end_to_end": spec.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else 0.0}
    rows = [{"quantity": "tokens_per_pass", "theory": theory["tokens_per_pass"], "measured": measured},
            {"quantity": "speedup", "theory": theory["speedup"], "measured": measured_speedup}]
    return values, rows


def _pairs(values: dict) -> tuple[dict, dict]:
    """(theory, measured) of the two numbers `ledger_agreement` compares, from a run's values."""
    return ({"tokens_per_pass": values["theory"], "speedup": values["theory_speedup"]},
            {"tokens_per_pass": values["measured"], "speedup": values["measured_speedup"]})


def _ledger_table(parts, times, positions, theory) -> list[dict]:
    """One CSV for the chapter's four views, told apart by `section`."""
    out = [{"section": "flops", "name": p["part"], "value": p["flops"], "share": p["share"]} for p in parts]
    out += [{"section": "seconds", "name": t["part"], "value": t["seconds"], "share": t["share"]} for t in times]
    out += [{"section": "position", "name": p["position"], "value": p["survival"], "drafted": p["drafted"],
             "accepted": p["accepted"]} for p in positions]
    out += [{"section": "theory", "name": r["quantity"], "value": r["theory"], "measured": r["measured"]}
            for r in theory]
    return out


def figure_ledger(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Top left: the FLOPs ledger and the wall time as two stacked 100 % bars. Top right: share of drafts
    accepted by position. Bottom: theory (Leviathan et al.) vs measured tokens per pass and speed-up."""
    L = labels_for("ledger", labels)
    fig = make_subplots(rows=2, cols=2, specs=[[{}, {}], [{"colspan": 2}, None]], vertical_spacing=0.22,
                        horizontal_spacing=0.12, row_heights=[0.58, 0.42])
    flops = [("draft", L["part_draft"], DRAFT), ("kept", L["part_kept"], KEPT),
             ("rejected", L["part_rejected"], REJECTED), ("target", L["part_target"], OWN)]
    times = [("prefill", L["time_prefill"], PREFILL), ("draft", L["time_draft"], DRAFT),
             ("verify", L["time_verify"], VERIFY), ("overhead", L["time_overhead"], OTHER)]
    _stack(fig, result.get("parts", []), flops, L["flops"])
    _stack(fig, result.get("times", []), times, L["wall_time"])
    pos = result.get("positions", [])
    fig.add_trace(go.Bar(x=[p["position"] for p in pos], y=[p["survival"] for p in pos], name=L["axis_survival"],
                         marker_color=KEPT, showlegend=False, customdata=[[p["accepted"], p["drafted"]] for p in pos],
                         hovertemplate="%{y:.0%} (%{customdata[0]} / %{customdata[1]})<extra></extra>"), row=1, col=2)
    theory = {r["quantity"]: r for r in result.get("theory", [])}
    names = [("tokens_per_pass", L["row_tokens_per_pass"]), ("speedup", L["row_speedup"]),
             ("curve_speedup", L["row_curve_speedup"])]
    if theory:
        # the third group's prediction is priced on this machine's curve, not Leviathan's formulas: its bar
        # takes the theory's place under a name and colour of its own
        formula = [q for q, _ in names if q != "curve_speedup"]
        for col, name, colour, only in (("theory", L["theory"], PLAIN, formula),
                                        ("theory", L["curve_prediction"], PREDICTION, ["curve_speedup"]),
                                        ("measured", L["measured"], TICK, [q for q, _ in names])):
            ys = [theory[q][col] if q in theory and q in only else None for q, _ in names]
            fig.add_trace(go.Bar(x=[n for _, n in names], y=ys, name=name, marker_color=colour, offsetgroup=col,
                                 text=[f"{y:.2f}" if y is not None else "" for y in ys], textposition="outside",
                                 cliponaxis=False),
                          row=2, col=1)
        # head room for the numbers over the tallest bar (plotly cut "3.38" at the plot's top)
        shown = [theory[q][c] for q, _ in names if q in theory for c in ("theory", "measured")]
        top = max((v for v in shown if isinstance(v, (int, float)) and math.isfinite(v)), default=1.0)
        fig.update_yaxes(range=[0, 1.15 * max(top, 1e-9)], row=2, col=1)
    fig.update_xaxes(title_text=L["axis_share"], tickformat=".0%", range=[0, 1], row=1, col=1)
    fig.update_xaxes(title_text=L["axis_position"], dtick=1, row=1, col=2)
    fig.update_yaxes(title_text=L["axis_survival"], tickformat=".0%", range=[0, 1.05], row=1, col=2)
    return styled(fig, dark, title=dial_title(L, result), height=560, barmode="group",
                  legend=dict(orientation="h", y=-0.12, x=0, groupclick="toggleitem"))


def _stack(fig: go.Figure, parts: list[dict], order: list[tuple], row_name: str) -> None:
    """One horizontal 100 % bar made of `parts` in `order`, stacked by hand (the figure's bar mode is
    "group" for the theory bars, so stacked parts share one offsetgroup and carry their own base)."""
    by = {p["part"]: p["share"] for p in parts}
    base = 0.0
    for key, name, colour in order:
        share = by.get(key, 0.0)
        if key not in by:
            continue
        # each bar's parts under its own name in the legend: "draft" is a part of both bars
        fig.add_trace(go.Bar(orientation="h", y=[row_name], x=[share], base=[base], name=name, marker_color=colour,
                             offsetgroup="stack", legendgroup=row_name, legendgrouptitle_text=row_name,
                             text=[f"{share:.0%}"],
                             textposition="inside", insidetextanchor="middle",
                             hovertemplate=name + ": %{x:.1%}<extra></extra>"), row=1, col=1)
        base += share


# the race's depth (the lesson's): two chapters pricing the same prompt at two depths read as a contradiction
CHAPTER = Chapter("ledger",
                  run=lambda ctx: run_ledger(ctx.pair, ctx.prompt, depth=ctx.depth, acceptance=ctx.acceptance),
                  figure=figure_ledger, button_id="run-ledger", dial=True)
