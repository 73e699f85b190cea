"""Chapter: the race. Plain decoding against speculative decoding of the same prompt, drawn on one clock.

Measured: about 1.5 s on the 2-core CPU with the offline SmolLM2-135M and the n-gram draft.
"""
from __future__ import annotations

import statistics
from typing import Iterator

import plotly.graph_objects as go

from specviz import lessons
from specviz.chapters.base import Chapter, Result
from specviz.chapters.common import (TimedRun, draft_cost, finished, finite, settings_of, snapshot, timed_run,
                                     warm_up)
from specviz.chapters.plotting import DRAFT, PLAIN, PREFILL, TICK, VERIFY, aligned, labels_for, styled
from specviz.engine.policies import Policy, policy_spec
from specviz.engine.torchmode import inference_steps

RACE_FASTER = 1.05       # ±5 %: run-to-run noise of a short CPU run; inside it the race is a draw
RACE_SLOWER = 0.95


def race_conclusion(speedup: float) -> str:
    """Faster if speculation finished ≥ 5 % sooner, slower if ≥ 5 % later, else even."""
    if speedup >= RACE_FASTER:
        return "conclusion_faster"
    if speedup <= RACE_SLOWER:
        return "conclusion_slower"
    return "conclusion_even"


def lane(run: TimedRun, name: str) -> tuple[list[dict], list[dict]]:
    """Segments {lane, kind, start_s, end_s, tokens} and token ticks {lane, t_s, index, kind} of one run,
    on its own clock (0 = the run's start). A step ends when its event arrived; it began wall_s before,
    drafting first, then the verify pass (in the engine's order)."""
    segs, ticks, n = [], [], 0
    for i, (ev, end) in enumerate(zip(run.events, run.ends)):
        start = max(0.0, end - ev.wall_s)
        if i == 0 and ev.prefill_s > 0:
            segs.append({"lane": name, "kind": "prefill", "start_s": max(0.0, start - ev.prefill_s),
                         "end_s": start, "tokens": 0})
        t = start
        # a depth-0 step drafts nothing: its few µs of drafter bookkeeping are no draft pass (on a busy
        # machine they passed 0.1 ms and drew one on the plain lane)
        if ev.depth > 0 and (ev.drafted or ev.draft_s > 1e-4):
            segs.append({"lane": name, "kind": "draft", "start_s": t, "end_s": t + ev.draft_s, "tokens": 0})
            t += ev.draft_s
        kind = "plain" if ev.tokens_per_pass == ev.batch_size else "verify"
        segs.append({"lane": name, "kind": kind, "start_s": t, "end_s": t + ev.verify_s, "tokens": ev.emitted,
                     "checked": ev.tokens_per_pass})
        for r in ev.rows:
            kinds = ["accepted"] * min(r.accepted, len(r.emitted)) + [r.last_kind]
            for k in kinds[: len(r.emitted)]:
                n += 1
                ticks.append({"lane": name, "t_s": end, "index": n, "kind": k})
    return segs, ticks


def _lane_summary(run: TimedRun) -> dict:
    t = run.totals
    return {"wall_s": run.wall_s, "tokens": t.tokens, "steps": t.steps, "prefill_s": t.prefill_s,
            "draft_s": t.draft_s, "verify_s": t.verify_s, "tokens_per_s": run.tokens_per_s}


def _policy_name(policy: Policy | str | None) -> str:
    """The name a run's settings show, read without building a policy (the run builds its own)."""
    return policy.name if hasattr(policy, "name") else policy_spec(policy).name


@inference_steps
def run_race(pair, prompt_ids: list[int], depth: int = 4, max_new: int = 48,
             policy: Policy | str | None = None) -> Iterator[Result]:
    """Plain decoding (k = 0), then speculative decoding (k = depth) of the same prompt, greedy, one after
    the other; yields after each run. Extra keys: `segments`, `tokens` (ticks), `lanes` (per-lane
    totals), `identical` (greedy outputs equal), `replayed_together` (always True: the lanes are two
    sequential measurements drawn on one clock)."""
    settings = settings_of(pair, depth=depth, max_new=max_new,
                         policy=_policy_name(policy), prompt_tokens=len(prompt_ids))
    extra = {"segments": [], "tokens": [], "lanes": {}, "identical": None, "replayed_together": True}
    yield snapshot("race", pair, settings, 0.0, [], **extra)
    warm_up(pair, [prompt_ids], depth)
    plain = timed_run(pair, [prompt_ids], 0, 1, max_new)
    segs, ticks = lane(plain, "plain")
    extra.update(segments=segs, tokens=ticks, lanes={"plain": _lane_summary(plain)})
    yield snapshot("race", pair, settings, 0.5, segs, **extra)
    spec = timed_run(pair, [prompt_ids], depth, 1, max_new, policy)
    s_segs, s_ticks = lane(spec, "spec")
    extra.update(segments=segs + s_segs, tokens=ticks + s_ticks,
                 lanes={"plain": _lane_summary(plain), "spec": _lane_summary(spec)},
                 identical=plain.outputs == spec.outputs)
    values = {**race_values(plain, spec), "depth": depth}
    key = race_conclusion(values["speedup"])
    yield finished(snapshot("race", pair, settings, 1.0, segs + s_segs, **extra), values, key, [key])


def race_values(plain: TimedRun, spec: TimedRun) -> dict:
    """Speed-up end to end (prefill included): the ratio of end-to-end tokens/s, which is plain wall ÷
    speculative wall when both wrote the same tokens (greedy: they do)."""
    t = spec.totals
    speedup = spec.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s > 0 else 0.0
    # decoding alone (prefill excluded), the Playground's measure: a reader compares the two figures
    decode = t.tokens_per_s / plain.totals.tokens_per_s if plain.totals.tokens_per_s > 0 else 0.0
    passes = [ev.tokens_per_pass / ev.batch_size for ev in spec.events]
    return {"speedup": speedup, "slowdown": 1 / speedup if speedup > 0 else 0.0, "decode_speedup": decode,
            "flops_ratio": t.flops_ratio,
            "tokens_per_pass": statistics.fmean(passes) if passes else 0.0,   # slots each verify checked
            "tokens_per_step": t.mean_accepted_length,                         # tokens each verify kept
            "acceptance": finite(t.acceptance_rate), "draft_cost": draft_cost(spec, plain),
            "plain_s": plain.wall_s, "spec_s": spec.wall_s,
            "plain_passes": plain.totals.steps, "spec_passes": t.steps}


TOO_THIN = 0.002          # a bar under 0.2 % of the axis is below a pixel on a phone or a projector


def figure_race(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Two horizontal lanes (plain, speculative) on one time axis: coloured passes (prefill, draft,
    verify, plain) and a tick where tokens appear. The lanes were measured one after the other and are
    replayed together: the note says so."""
    L = labels_for("race", labels)
    names = {"plain": L["lane_plain"], "spec": L["lane_spec"]}
    kinds = [("prefill", L["legend_prefill"], PREFILL), ("plain", L["legend_plain"], PLAIN),
             ("draft", L["legend_draft"], DRAFT), ("verify", L["legend_verify"], VERIFY)]
    fig = go.Figure()
    segs = result.get("segments", [])
    lane_s = max((s["end_s"] for s in segs), default=0.0)
    for kind, name, colour in kinds:
        mine = [s for s in segs if s["kind"] == kind]
        if not mine:
            continue
        each = sum(s["end_s"] - s["start_s"] for s in mine) / len(mine)
        if kind == "draft" and each < TOO_THIN * lane_s:
            # an n-gram lookup takes microseconds: its bars are in the chart but no eye finds them
            name = lessons.chart_fill(L["legend_draft_thin"], {"us": 1e6 * each})
        # a pass's hover says what it did: a verify pass's tokens checked and written, a one-token pass's
        # token (in the speculative lane: a step whose draft found nothing to propose)
        said = [_pass_said(s, L) for s in mine]
        fig.add_trace(go.Bar(orientation="h", y=[names.get(s["lane"], s["lane"]) for s in mine],
                             x=[max(s["end_s"] - s["start_s"], 1e-5) for s in mine],
                             base=[s["start_s"] for s in mine], name=name, marker=dict(color=colour),
                             width=0.5, customdata=[[s["start_s"], s["end_s"], w] for s, w in zip(mine, said)],
                             hovertemplate="%{customdata[0]:.3f}–%{customdata[1]:.3f} s%{customdata[2]}<extra>"
                                           + name + "</extra>"))
    steps: dict[tuple, list[int]] = {}
    for t in result.get("tokens", []):
        steps.setdefault((t["lane"], t["t_s"]), []).append(t["index"])
    if steps:
        keys = sorted(steps)
        fig.add_trace(go.Scatter(x=[t for _, t in keys], y=[names.get(ln, ln) for ln, _ in keys], mode="markers",
                                 name=L["legend_tokens"], marker=dict(symbol="line-ns-open", size=26, color=TICK,
                                                                      line=dict(width=2, color=TICK)),
                                 text=[_span(steps[k], L) for k in keys], hovertemplate="%{x:.3f} s: %{text}"))
    note = L["replay_note"]
    if result.get("done") and result.get("values"):
        v = result["values"]
        note += "<br>" + lessons.chart_fill(L["headline"] if v.get("speedup", 0) >= 1 else L["headline_slower"], v)
    # above the plot, growing upwards: the note is 2-3 lines (the replay note breaks for phones)
    fig.add_annotation(text=note, y=1.02, yanchor="bottom", xref="paper", yref="paper", showarrow=False,
                       font=dict(size=12), **aligned(L))
    fig.update_yaxes(categoryorder="array", categoryarray=[names["plain"], names["spec"]])
    return styled(fig, dark, height=320, barmode="overlay", xaxis_title=L["axis_seconds"],
                  margin=dict(l=150, r=20, t=84, b=100), legend=dict(orientation="h", y=-0.45, x=0))


def _pass_said(seg: dict, L: dict) -> str:
    """" · 7 tokens checked, 4 written" for a verify pass, " · one token written" for a pass with no draft
    to check; "" for a prefill or a draft pass (and for a result recorded before segments carried `checked`)."""
    if seg["kind"] == "plain" and seg.get("checked"):
        return " · " + L["hover_plain"]
    if seg["kind"] != "verify" or not seg.get("checked"):
        return ""
    return " · " + lessons.chart_fill(L["hover_pass"], {"checked": seg["checked"], "written": seg["tokens"]})


def _span(idx: list[int], L: dict) -> str:
    if len(idx) == 1:
        return lessons.chart_fill(L["hover_token"], {"n": idx[0]})
    return lessons.chart_fill(L["hover_tokens"], {"a": min(idx), "b": max(idx)})


CHAPTER = Chapter("race", run=lambda ctx: run_race(ctx.pair, ctx.prompt, depth=ctx.depth), figure=figure_race,
                  button_id="run-race")
