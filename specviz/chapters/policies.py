"""Chapter: depth policies. Plain decoding and every policy at each batch size, rows taking prompts from
the pool, then plain decoding again; the winner named only outside the noise band the two plain runs
measured (at least ±5 %).

Measured: about 25 s on the 2-core CPU with the offline SmolLM2-135M and the n-gram draft (B 1/4/12,
16 new tokens: 18 runs).
"""
from __future__ import annotations

import statistics
from typing import Iterable, Iterator

import plotly.graph_objects as go

from specviz import lessons
from specviz.chapters import vllm_panels
from specviz.chapters.base import Chapter, Result, VllmPanel
from specviz.chapters.common import finished, settings_of, snapshot, timed_run, warm_up
from specviz.chapters.plotting import PLAIN, POLICY_COLOURS, TICK, labels_for, styled
from specviz.engine.policies import POLICY_NAMES, make_policy
from specviz.engine.torchmode import inference_steps

POLICIES_CLOSE = 0.05    # the noise band's floor (the race chapter's ±5 %); each batch measures its own too


def policies_conclusion(clear: dict[int, str], batches: int | None = None, below_plain: set[int] = frozenset()) -> str:
    """`clear`: the batch sizes whose fastest policy beat the next one outside the noise band, of
    `batches` tried; `below_plain`: those where even the fastest stayed under plain decoding. None such:
    the policies were level (any "winner" is noise); one winner: at every batch size, or only at those
    (the others level; "won" not said where it still lost to plain decoding); else a switch (between two
    losses to plain decoding, said so)."""
    if not clear:
        return "conclusion_close"
    if len(set(clear.values())) == 1:
        if batches is None or len(clear) >= batches:
            return "conclusion_same_winner"
        return "conclusion_winner_some_below_plain" if set(clear) <= set(below_plain) else "conclusion_winner_some"
    # two winners that each still lost to plain decoding where they won: a switch between two losses
    return "conclusion_switch_below_plain" if set(clear) <= set(below_plain) else "conclusion_switch"


def row_key(win: dict) -> str:
    """A batch size's sentence: a winner, a winner level with or below plain decoding, or level (below plain
    decoding where even the fastest stayed under it outside the band: "level" alone read as no loss)."""
    if not win["clear"]:
        below = win["vs_plain"] < 1 - win.get("band", 0.0)
        return "conclusion_row_level_below_plain" if below else "conclusion_row_level"
    band = win.get("band", 0.0)
    if abs(win["vs_plain"] - 1) <= band:      # "yet only 1.00× plain decoding" read as a loss
        return "conclusion_row_tied_plain"
    return "conclusion_row" if win["vs_plain"] > 1 else "conclusion_row_below_plain"


def noise_band(first: float, second: float) -> float:
    """The band two runs of plain decoding at one batch size measured (their gap ÷ their mean), at least
    POLICIES_CLOSE: differences inside it are not a winner."""
    mean = (first + second) / 2
    return max(POLICIES_CLOSE, abs(first - second) / mean if mean > 0 else 0.0)


@inference_steps
def run_policies(pair, prompt_ids_pool: list[list[int]], batches: Iterable[int] = (1, 4, 12), depth: int = 4,
                 max_new: int = 16, policies: Iterable[str] = POLICY_NAMES) -> Iterator[Result]:
    """At each batch size: plain decoding (the baseline), then every policy at the requested depth with
    its default parameters, rows taking prompts from the pool in order, then plain decoding again (the two
    plain runs measure the noise band). One yield per run. Extra keys: `winners` ([{batch_size, policy,
    tokens_per_s, vs_plain, clear, band}]), `plain` ([{batch_size, tokens_per_s, band}])."""
    batches = sorted({int(b) for b in batches})
    policies = list(policies)
    pool = [list(p) for p in prompt_ids_pool]
    settings = settings_of(pair, batches=batches, depth=depth, max_new=max_new, policies=policies,
                         prompts=len(pool), policy_params={p: make_policy(p).describe() for p in policies})
    extra: dict = {"winners": [], "plain": []}
    yield snapshot("policies", pair, settings, 0.0, [], **extra)
    warm_up(pair, pool, depth)
    rows: list[dict] = []
    total, done = len(batches) * (len(policies) + 2), 0
    bands: dict[int, float] = {}
    for b in batches:
        base = timed_run(pair, pool, 0, b, max_new)
        plain = {"batch_size": b, "tokens_per_s": base.tokens_per_s, "band": None}
        extra["plain"].append(plain)
        done += 1
        yield snapshot("policies", pair, settings, done / total, rows, **extra)
        mine = []
        for name in policies:
            run = timed_run(pair, pool, depth, b, max_new, make_policy(name))
            depths = [ev.depth for ev in run.events]
            mine.append({"policy": name, "batch_size": b, "tokens_per_s": run.tokens_per_s,
                         "mean_depth": statistics.fmean(depths) if depths else 0.0,
                         "acceptance_rate": run.totals.acceptance_rate, "wall_s": run.wall_s})
            done += 1
            yield snapshot("policies", pair, settings, done / total, rows + _against(mine, plain), **extra)
        again = timed_run(pair, pool, 0, b, max_new).tokens_per_s
        bands[b] = noise_band(base.tokens_per_s, again)
        plain.update(tokens_per_s=(base.tokens_per_s + again) / 2, band=bands[b])
        rows += _against(mine, plain)
        done += 1
        extra["winners"] = _winners(rows, bands)
        yield snapshot("policies", pair, settings, done / total, rows, **extra)
    values, key, row_values = policies_values(rows, batches, bands)
    keys = [row_key(w) for w in row_values] + [key]
    yield finished(snapshot("policies", pair, settings, 1.0, rows, **extra), values, key, keys,
                 row_values + [values])


def _against(mine: list[dict], plain: dict) -> list[dict]:
    """Each policy's run with its speed relative to plain decoding at the same batch size."""
    base = plain["tokens_per_s"]
    return [{**r, "vs_plain": r["tokens_per_s"] / base if base else 0.0} for r in mine]


def _winners(rows: list[dict], bands: dict[int, float] | None = None) -> list[dict]:
    """Per batch size the fastest policy, and whether it beat the next one outside that batch's band."""
    out = []
    for b in sorted({r["batch_size"] for r in rows}):
        ranked = sorted((r for r in rows if r["batch_size"] == b), key=lambda r: -r["tokens_per_s"])
        w, band = ranked[0], (bands or {}).get(b, POLICIES_CLOSE)
        second = ranked[1]["tokens_per_s"] if len(ranked) > 1 else 0.0
        out.append({"batch_size": b, "policy": w["policy"], "tokens_per_s": w["tokens_per_s"],
                    "vs_plain": w["vs_plain"], "band": band,
                    "clear": second <= 0 or w["tokens_per_s"] / second > 1 + band})
    return out


def policies_values(rows: list[dict], batches: list[int],
                    bands: dict[int, float] | None = None) -> tuple[dict, str, list[dict]]:
    """Per batch the fastest policy, named a winner only outside the batch's noise band (conclusion_row,
    else conclusion_row_level); overall: the spread (largest best ÷ worst − 1 at any batch), the widest
    band, the policy with most clear wins (ties: higher mean speed-up over plain), and for a switch the
    batch from which the winner at the largest clear batch size wins at every larger one, and who won at
    small batches. Only clear wins count."""
    wins = _winners(rows, bands)
    clear = {w["batch_size"]: w["policy"] for w in wins if w["clear"]}
    winners = clear or {w["batch_size"]: w["policy"] for w in wins}
    spread = 0.0
    for b in batches:
        tps = [r["tokens_per_s"] for r in rows if r["batch_size"] == b]
        if tps and min(tps) > 0:
            spread = max(spread, max(tps) / min(tps) - 1)
    names = {r["policy"] for r in rows}

    def score(p: str) -> tuple:
        mine = [r["vs_plain"] for r in rows if r["policy"] == p]
        return list(winners.values()).count(p), statistics.fmean(mine) if mine else 0.0
    overall = max(sorted(names), key=score)
    ordered = sorted(winners)
    large = winners[ordered[-1]]
    i = len(ordered) - 1
    while i > 0 and winners[ordered[i - 1]] == large:
        i -= 1
    # "at small batch sizes": the winner at the smallest batch, unless that is the large-batch winner
    # again (A, B, A): then whoever won just below the large-batch streak
    small = winners[ordered[0]] if winners[ordered[0]] != large else (winners[ordered[i - 1]] if i > 0 else large)
    values = {"policy": overall, "spread": spread, "small_policy": small, "large_policy": large,
              "batch": ordered[i], "small_batches": lessons.Listed(str(b) for b in ordered[:i] if winners[b] == small),
              "tokens_per_s": next(w["tokens_per_s"] for w in wins if w["policy"] == overall),
              "vs_plain": next(w["vs_plain"] for w in wins if w["policy"] == overall),
              "band": max(w["band"] for w in wins),
              "clear_batches": lessons.Listed(str(b) for b in batches if b in clear),
              "level_batches": lessons.Listed(str(b) for b in batches if b not in clear)}
    row_values = [{"batch": w["batch_size"], "policy": w["policy"], "tokens_per_s": w["tokens_per_s"],
                   "vs_plain": w["vs_plain"], "band": w["band"], "clear": w["clear"]} for w in wins]
    # where the winner did not beat plain decoding: below it, or level with it
    below = {w["batch_size"] for w, v in zip(wins, row_values)
             if row_key(v) in ("conclusion_row_below_plain", "conclusion_row_tied_plain")}
    return values, policies_conclusion(clear, len({w["batch_size"] for w in wins}), below), row_values


def figure_policies(result: dict, labels: dict | None = None, dark: bool = False) -> go.Figure:
    """Grouped bars: each policy's tokens/s relative to plain decoding at each batch size (1× = plain),
    the winner at each batch size outlined."""
    L = labels_for("policies", labels)
    rows = result.get("table", [])
    batches = sorted({r["batch_size"] for r in rows})
    winners = {(w["batch_size"], w["policy"]) for w in result.get("winners", []) if w.get("clear", True)}
    fig = go.Figure()
    outline_named = False
    for i, policy in enumerate(dict.fromkeys(r["policy"] for r in rows)):
        mine = {r["batch_size"]: r for r in rows if r["policy"] == policy}
        name = lessons.isolate_rtl(lessons.policy_label(L.get("_lang", lessons.DEFAULT_LANG), policy))
        xs, ys = [str(b) for b in batches], [mine[b]["vs_plain"] if b in mine else None for b in batches]
        fig.add_trace(go.Bar(x=xs, y=ys, name=name, offsetgroup=policy, legendgroup=policy,
                             marker=dict(color=POLICY_COLOURS[i % len(POLICY_COLOURS)]),
                             customdata=[mine[b]["tokens_per_s"] if b in mine else None for b in batches],
                             hovertemplate=name + ": %{y:.2f}× (%{customdata:.1f} " + L["column_tokens_per_s"]
                             + ")<extra></extra>"))
        won = [y if (b, policy) in winners else None for b, y in zip(batches, ys)]
        if any(y is not None for y in won):
            # the winner's outline as a hollow bar over its own (same offset group): drawn on the policy's
            # bars, plotly's legend showed that policy's swatch outlined too; named once in the legend
            fig.add_trace(go.Bar(x=xs, y=won, offsetgroup=policy, name=lessons.isolate_rtl(L["winner_outline"]),
                                 showlegend=not outline_named, legendgroup="winner", legendrank=1001, hoverinfo="skip",
                                 marker=dict(color="rgba(0,0,0,0)", line=dict(width=3, color=TICK))))
            outline_named = True
    if batches:
        fig.add_hline(y=1.0, line=dict(color=PLAIN, dash="dot", width=1))
    return styled(fig, dark, barmode="group", xaxis_title=L["column_batch"], yaxis_title=L["column_vs_plain"],
                  legend_title_text=L["column_policy"], xaxis_type="category")


def vllm_schedule(sweep, lang: str) -> dict:
    """vLLM's per-batch-size schedule against its fixed depths, drawn like the class's policies."""
    name = lessons.isolate_rtl(lessons.text(lang, "chapter.policies.vllm_schedule_name"))
    return vllm_panels.schedule_result(sweep, name)


def vllm_notes(sweep) -> list[tuple[str, dict]]:
    """The schedule itself, then how it fared against the best fixed depth at each batch size."""
    points = vllm_panels.schedule_points(sweep)
    if not points:
        return []
    schedule = lessons.Listed(f"{lo}-{hi}→{k}" for lo, hi, k in sweep.schedule["rows"])
    return [("chapter.policies.vllm_schedule", {"schedule": schedule})] + [(_point_key(p), p) for p in points]


def _point_key(point: dict) -> str:
    """Where the schedule drafted the best fixed depth's own k, a gap is its server's speed, not its choice."""
    same = abs(point["mean_depth"] - point["best_k"]) < 0.05
    return "chapter.policies.vllm_point_same" if same else "chapter.policies.vllm_point"


CHAPTER = Chapter("policies", run=lambda ctx: run_policies(ctx.pair, ctx.pool), figure=figure_policies,
                  button_id="run-policies", vllm=VllmPanel(result=vllm_schedule, figure=figure_policies,
                                                           notes=vllm_notes))
