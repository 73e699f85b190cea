"""The Lesson tab's experiments (one module per chapter in specviz.chapters, each with its figure), on the tiny
random-weight pairs: every chapter runs to done, yields progressively, and hands the UI numbers that fill
its conclusion templates in both languages. No timed asserts: timings are whatever this machine gives."""
from __future__ import annotations

import dataclasses
import json
import re
import string

import pytest

from specviz import lessons
from specviz.chapters import BY_KEY, CHAPTERS, breadth_depth, common, frontier, knee, ledger, policies, race, sweep
from specviz.chapters.plotting import DRAFT
from specviz.engine.request import Knobs, Request
from specviz.hardware.costmodel import crossover_from_rows
from specviz.hardware.device import Peaks
from specviz.hardware.paired import Ratio

# a CPU-like calibration: enough for the roofline column, no measurement needed in a test
PEAKS = Peaks("cpu", 3.0e10, 3.0e10, "float32")


def collect(gen) -> list[dict]:
    out = []
    for d in gen:
        json.dumps(d, allow_nan=False)          # plain JSON, as the UI saves and a recording replays it
        out.append(d)
    return out


@pytest.fixture(scope="module")
def runs(make_pair, prompts, one_model_thread):
    """Every chapter once, small sizes; chapter → every dict it yielded."""
    skip, ngram = make_pair("layerskip:1-2"), make_pair("ngram")
    return {
        "race": collect(race.run_race(skip, prompts[1], depth=3, max_new=12)),
        "race_ngram": collect(race.run_race(ngram, prompts[1], depth=3, max_new=12)),
        "knee": collect(knee.run_knee(skip, PEAKS, context=16, repeats=1, cap=8)),
        "breadth_depth": collect(breadth_depth.run_breadth_depth(skip, context=16, ns=(1, 2, 4, 8), repeats=1)),
        "ledger": collect(ledger.run_ledger(skip, prompts[1], depth=3, max_new=12)),     # the race's settings
        "sweep": collect(sweep.run_sweep(ngram, prompts[0], batches=(1, 2, 3), depths=(1, 2), max_new=6)),
        "policies": collect(policies.run_policies(skip, prompts[:2], batches=(1, 3), depth=2, max_new=6)),
        "frontier": collect(frontier.run_frontier(ngram, prompts, **FRONTIER_SHORT)),
    }


# the frontier chapter at test size: two class sizes, one fixed depth (with no speculation and adaptive
# verification, three arms), one round, a few tokens a user
FRONTIER_SHORT = dict(users=(1, 2), depths=(2,), max_new=4, repeats=1, class_tokens=8, cell_tokens=16)


def test_every_chapter_with_an_experiment_runs_here(runs):
    """The registry's chapters with an experiment are exactly those the tests below run."""
    assert {c.key for c in CHAPTERS if c.run is not None} == {chapter_of(name) for name in runs}


def chapter_of(name: str) -> str:
    return name.split("_ngram")[0]


# --- every chapter --------------------------------------------------------------------------------------

def test_every_chapter_runs_to_done_progressively(runs):
    for name, ds in runs.items():
        assert len(ds) >= 3, name
        assert [d["done"] for d in ds] == [False] * (len(ds) - 1) + [True], name
        progress = [d["progress"] for d in ds]
        assert progress == sorted(progress) and progress[0] == 0.0 and progress[-1] == 1.0, name
        last = ds[-1]
        assert last["chapter"] == chapter_of(name)
        assert last["device"].startswith("cpu")
        assert last["table"] and last["conclusion"] in last["conclusions"], name
        assert len(last["conclusions"]) == len(last["conclusion_values"])
        assert all(d["conclusion"] is None for d in ds[:-1])


def _conclusion_keys(lang: str, chapter: str) -> list[str]:
    return [k for k in lessons.load(lang)["chapter"][chapter] if k.startswith("conclusion")]


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_values_fill_every_conclusion_template(runs, lang):
    for name, ds in runs.items():
        ch, last = chapter_of(name), ds[-1]
        # a chapter whose sentences each carry their own values (the frontier: one per class size) is
        # checked by the loop below on what it said; tests/test_frontier.py fills each of its sentences
        one_dict = last["conclusion_values"] == [last["values"]] * len(last["conclusions"])
        for key in _conclusion_keys(lang, ch) if one_dict else ():
            tmpl = lessons.template(lang, f"chapter.{ch}.{key}")
            fields = {f for _, f, _, _ in string.Formatter().parse(tmpl) if f}
            assert fields <= set(last["values"]), (name, key, fields - set(last["values"]))
            tmpl.format(**last["values"])            # every format spec fits its value (raises if not)
        for key, vals in zip(last["conclusions"], last["conclusion_values"]):
            lessons.template(lang, f"chapter.{ch}.{key}").format(**vals)


# --- the race -------------------------------------------------------------------------------------------

def test_race_same_tokens_two_lanes_one_clock(runs):
    for name in ("race", "race_ngram"):
        last = runs[name][-1]
        assert last["identical"] is True and last["replayed_together"] is True
        v = last["values"]
        assert v["speedup"] > 0 and v["slowdown"] == pytest.approx(1 / v["speedup"])
        assert last["conclusion"] == race.race_conclusion(v["speedup"])
        lanes = last["lanes"]
        # end to end (prefill included) and decoding alone (the Playground's measure), each named as such
        assert v["speedup"] == pytest.approx(lanes["plain"]["wall_s"] / lanes["spec"]["wall_s"])
        assert 0 < v["decode_speedup"] and v["decode_speedup"] != pytest.approx(v["speedup"], rel=1e-6)
        said = lessons.text("en", f"chapter.race.{last['conclusion']}", **v)
        assert "prefill" in said and (f"{v['decode_speedup']:.2f}×" in said or "slower" in last["conclusion"])
        assert lanes["plain"]["tokens"] == lanes["spec"]["tokens"] == 12
        assert lanes["plain"]["steps"] == 12 and lanes["spec"]["steps"] <= 12
        for ln in ("plain", "spec"):
            segs = [s for s in last["segments"] if s["lane"] == ln]
            assert segs and all(s["start_s"] <= s["end_s"] <= lanes[ln]["wall_s"] + 1e-9 for s in segs)
            for a, b in zip(segs, segs[1:]):      # passes follow each other on the lane's own clock
                assert b["start_s"] >= a["end_s"] - 1e-6
            ticks = [t for t in last["tokens"] if t["lane"] == ln]
            assert [t["index"] for t in ticks] == list(range(1, 13))
            assert sum(s["tokens"] for s in segs) == 12
        assert {s["kind"] for s in last["segments"] if s["lane"] == "plain"} <= {"prefill", "plain"}
    skip = runs["race"][-1]
    assert {"draft", "verify"} <= {s["kind"] for s in skip["segments"] if s["lane"] == "spec"}
    # a layer-skip draft is half the target: real draft work, so more FLOPs than plain decoding
    assert skip["values"]["flops_ratio"] > 1 and skip["values"]["draft_cost"] > 0


def test_race_takes_a_policy_by_name(make_pair, prompts):
    last = collect(race.run_race(make_pair("ngram"), prompts[0], depth=2, max_new=4, policy="adaptive"))[-1]
    assert last["settings"]["policy"] == "adaptive" and last["identical"] is True


# --- the knee and breadth vs depth -----------------------------------------------------------------------

def test_knee_points_roofline_and_rule(runs, make_pair):
    ds = runs["knee"]
    assert [len(d["table"]) for d in ds] == [0, 1, 2, 3, 4, 4]
    last = ds[-1]
    assert [r["tokens_per_pass"] for r in last["table"]] == [1, 2, 4, 8]
    assert all(r["roofline_ms"] > 0 for r in last["table"]) and last["predicted_knee"] >= 1
    v = last["values"]
    assert 1 <= v["knee"] <= 8 and last["measured_knee"] == v["knee"]
    t = last["table"]
    # the verdict's ratio comes from its own alternating pairs, with an interval around it
    assert v["ratio2_lo"] <= v["ratio2"] <= v["ratio2_hi"] and v["pairs"] >= 9
    measured = Ratio(v["ratio2"], v["ratio2_lo"], v["ratio2_hi"], v["pairs"], 0.0, 0.0)
    assert last["conclusion"] == knee.knee_conclusion(v["ratio2"], t[0]["measured_ms"] / 1000,
                                                      t[0]["roofline_ms"] / 1000, measured=measured)
    # without calibrated peaks: no roofline, and so never an overhead-bound verdict
    bare = collect(knee.run_knee(make_pair("ngram"), None, context=8, repeats=1, cap=2))[-1]
    assert all(r["roofline_ms"] is None for r in bare["table"]) and bare["predicted_knee"] is None
    assert bare["conclusion"] != "conclusion_overhead_bound"


def test_knee_rule():
    assert knee.knee_conclusion(1.5, 0.01, 0.001) == "conclusion_not_memory_bound"
    assert knee.knee_conclusion(1.05, 0.01, 0.001) == "conclusion_overhead_bound"
    assert knee.knee_conclusion(1.05, 0.01, 0.008) == "conclusion_flat"
    assert knee.knee_conclusion(1.05, 0.01, None) == "conclusion_flat"
    near = Ratio(1.12, 1.05, 1.2, 45, 0.01, 0.0112)              # its interval holds the 1.15 line
    assert knee.knee_conclusion(1.12, 0.01, None, measured=near) == "conclusion_close"
    clear = Ratio(1.2, 1.16, 1.3, 9, 0.01, 0.012)
    assert knee.knee_conclusion(1.2, 0.01, None, measured=clear) == "conclusion_not_memory_bound"


def test_flat_conclusion_quotes_what_the_curve_shows():
    """A pass of 8 tokens at 1.54× a one-token pass is not "almost the same time": the conclusion names
    the widest pass within 25 % (4 tokens) and its ratio, and the knee only as where the curve turns."""
    from specviz import lessons

    ns, ms = [1, 2, 4, 8, 16], [24.0, 25.0, 27.0, 37.0, 60.0]
    rows = [{"roofline_ms": None}]
    v = knee.knee_values(ns, [m / 1000 for m in ms], rows)
    assert v["flat_to"] == 4 and v["flat_ratio"] == pytest.approx(27 / 24)
    text = lessons.text("en", "chapter.knee.conclusion_flat", **v)
    assert text.startswith("Up to 4 tokens per pass") and "at most 1.12×" in text and "(24.0 ms)" in text
    # a one-token pass slower than wider ones (this CPU's 21.2 vs 16.9 ms) is the slowest of the flat part
    v = knee.knee_values([1, 2, 4], [0.0212, 0.0169, 0.0191], rows)
    assert v["flat_to"] == 4 and v["flat_ratio"] == pytest.approx(1.0)


def test_breadth_depth_side_by_side(runs):
    ds = runs["breadth_depth"]
    assert [len(d["table"]) for d in ds] == [0, 1, 2, 3, 4, 4]
    last = ds[-1]
    rows = last["table"]
    assert [r["tokens_per_pass"] for r in rows] == [1, 2, 4, 8]
    assert all(r["breadth_ms"] > 0 and r["depth_ms"] > 0 for r in rows)
    assert all(r["ratio_lo"] <= r["breadth_over_depth"] <= r["ratio_hi"] for r in rows if r["ratio_lo"] is not None)
    assert rows[-1]["ratio_lo"] is not None and rows[-1]["pairs"] >= 6        # the verdict's n has an interval
    bp = breadth_depth.breadth_depth_breakpoint([r["tokens_per_pass"] for r in rows],
                                                [breadth_depth._differs(r) for r in rows])
    lo, hi = rows[-1]["ratio_lo"], rows[-1]["ratio_hi"]
    if lo <= 0.75 <= hi or lo <= 1.25 <= hi:
        assert last["conclusion"] == "conclusion_close" and last["breakpoint"] is None
        return
    assert last["breakpoint"] == bp
    assert last["conclusion"] == ("conclusion_holds" if bp is None else "conclusion_stops")
    assert last["values"]["n"] == (8 if bp is None else bp)


def test_breadth_depth_times_the_path_the_engine_decodes_on(make_pair, one_model_thread):
    """On the fast path (what the knee chapter and the engine run), not transformers' own modules: a
    reviewer read a one-token pass of 55 ms here against 25 ms in the knee chapter."""
    fast = make_pair("layerskip:1-2", compile="static")
    calls = []
    real = fast.target_cache

    def counted(batch):
        calls.append(batch)
        return real(batch)
    fast = dataclasses.replace(fast, target_cache=counted)
    last = collect(breadth_depth.run_breadth_depth(fast, context=16, ns=(1, 2, 8), repeats=1))[-1]
    assert last["settings"]["forward"] == "fast" and calls == [1, 1]     # one row and its copies: two prefills
    assert [r["tokens_per_pass"] for r in last["table"]] == [1, 2, 8]
    assert all(r["breadth_ms"] > 0 and r["depth_ms"] > 0 for r in last["table"])
    assert collect(breadth_depth.run_breadth_depth(make_pair("layerskip:1-2"), context=16, ns=(1,), repeats=1)
                   )[-1]["settings"]["forward"] == "stock"


def test_breadth_depth_breakpoint_rule():
    ns = [1, 2, 4, 8, 16]
    F, T = False, True
    assert breadth_depth.breadth_depth_breakpoint(ns, [F, F, F, F, F]) is None
    assert breadth_depth.breadth_depth_breakpoint(ns, [F, F, F, T, T]) == 8
    # one noisy mismatch below a matching point is not the breakpoint
    assert breadth_depth.breadth_depth_breakpoint(ns, [F, T, F, T, T]) == 8
    assert breadth_depth.breadth_depth_breakpoint(ns, [T, T, T, T, T]) == 1
    assert breadth_depth.breadth_depth_breakpoint(ns, [T, T, T, T, F]) is None


def test_breadth_depth_names_a_breakpoint_only_where_intervals_are_clear_of_the_band():
    """A busy machine moved the breakpoint between presses (2, 8, 8, 64): an n whose interval reaches the
    band is not 'different', so the breakpoint sits above it; a last n reaching it says 'close'."""
    def row(n, ratio, lo, hi):
        return {"tokens_per_pass": n, "breadth_ms": ratio, "depth_ms": 1.0, "breadth_over_depth": ratio,
                "ratio_lo": lo, "ratio_hi": hi, "pairs": 9}
    rows = [row(1, 1.0, 0.9, 1.1), row(2, 1.4, 1.2, 1.6), row(4, 1.5, 1.3, 1.7), row(8, 2.0, 1.8, 2.2)]
    values, key = breadth_depth.breadth_depth_values(rows)
    assert key == "conclusion_stops" and values["n"] == 4           # n = 2's interval reaches 1.25
    rows[-1] = row(8, 1.3, 1.2, 1.4)
    assert breadth_depth.breadth_depth_values(rows)[1] == "conclusion_close"
    rows[-1] = row(8, 1.1, 1.0, 1.2)
    assert breadth_depth.breadth_depth_values(rows) == (breadth_depth._quoted(rows[-1]), "conclusion_holds")


# --- the ledger -----------------------------------------------------------------------------------------

def test_ledger_adds_up_to_spent_flops(runs):
    last = runs["ledger"][-1]
    parts = {p["part"]: p["flops"] for p in last["parts"]}
    assert set(parts) == {"draft", "kept", "rejected", "target"}
    assert sum(parts.values()) == pytest.approx(last["spent_flops"], rel=1e-12)
    assert last["flops_ratio"] == pytest.approx(last["spent_flops"] / last["plain_flops"], rel=1e-12)
    assert last["values"]["waste"] == pytest.approx(parts["rejected"] / last["spent_flops"])
    assert sum(p["share"] for p in last["parts"]) == pytest.approx(1.0)
    assert last["conclusions"][:2] == ["conclusion_waste", "conclusion_theory"]


def test_race_and_ledger_count_flops_alike(runs):
    """The race and the ledger report one FLOPs ratio for the same prompt, pair and depth (the lesson's
    race runs at depth 6, the ledger at 4: their ratios differ by depth only)."""
    led = runs["ledger"][-1]
    assert runs["race"][-1]["values"]["flops_ratio"] == pytest.approx(led["values"]["flops_ratio"], rel=1e-9)
    assert led["values"]["flops_ratio"] > 1


def _ledger_matches_engine(run_events, totals):
    led = ledger.FlopsLedger()
    for ev in run_events:
        led.add(ev)
    assert led.spent == pytest.approx(totals.spent_flops, rel=1e-12)
    assert led.flops_ratio == pytest.approx(totals.flops_ratio, rel=1e-12)
    pos = led.positions()
    assert sum(p["drafted"] for p in pos) == totals.drafted
    assert sum(p["accepted"] for p in pos) == totals.accepted
    assert [p["drafted"] for p in pos] == sorted((p["drafted"] for p in pos), reverse=True)
    return led


def test_ledger_equals_engine_totals_ragged_batch(make_pair, prompts):
    # three rows with different drafts (n-gram finds different matches): padded verify slots
    run = common.timed_run(make_pair("ngram"), prompts[:3], 3, 3, 10)
    _ledger_matches_engine(run.events, run.totals)
    run = common.timed_run(make_pair("layerskip:1-2"), prompts[:2], 3, 2, 10, "confidence")
    _ledger_matches_engine(run.events, run.totals)


def test_ledger_equals_engine_totals_shared_batch(make_pair, prompts):
    """Two requests in one engine: each gets its share of the shared passes."""
    eng = make_pair("layerskip:1-2").engine()
    reqs = [Request([prompts[0]], Knobs(depth=3, batch_size=2), 8), Request([prompts[1]], Knobs(depth=1), 8)]
    events = {r.id: [] for r in reqs}
    for r in reqs:
        eng.add(r)
    while any(not r.done for r in reqs):
        for owner, ev in eng.step():
            events[owner.id].append(ev)
    assert any(ev.share < 1 for ev in events[reqs[1].id])
    for r in reqs:
        _ledger_matches_engine(events[r.id], r.totals)


def test_ledger_theory_is_leviathan(runs):
    v = runs["ledger"][-1]["values"]
    a, g, c = v["alpha"], v["depth"], v["c"]
    tokens = (1 - a ** (g + 1)) / (1 - a)
    assert v["theory"] == pytest.approx(tokens)
    assert v["theory_speedup"] == pytest.approx(tokens / (g * c + 1))
    # agreement covers both numbers the conclusion sets side by side
    assert v["diff"] == pytest.approx(max(abs(v["theory_speedup"] / v["measured_speedup"] - 1),
                                          abs(v["theory"] / v["measured"] - 1)))
    assert runs["ledger"][-1]["conclusion"] == ("conclusion_agree" if v["diff"] <= ledger.LEDGER_AGREE
                                                else "conclusion_differ")
    theory = {r["quantity"]: r for r in runs["ledger"][-1]["theory"]}
    assert theory["speedup"]["measured"] == v["measured_speedup"] and theory["tokens_per_pass"]["theory"] == v["theory"]


def test_leviathan_published_prediction():
    """Leviathan et al. 2023, T5-XXL with T5-small: α 0.75, γ 7, c ≈ 0.02 → their formula predicts 3.2×."""
    t = ledger.leviathan_theory(0.75, 7, 0.02)
    assert round(t["speedup"], 1) == 3.2
    assert t["tokens_per_pass"] == pytest.approx((1 - 0.75 ** 8) / 0.25)
    assert ledger.leviathan_theory(0.0, 4, 0.1)["tokens_per_pass"] == 1.0


# --- the sweep ------------------------------------------------------------------------------------------

def test_sweep_fills_cell_by_cell_and_finds_crossover(runs):
    ds = runs["sweep"]
    last = ds[-1]
    assert last["depths"] == [0, 1, 2] and last["batches"] == [1, 2, 3]   # k = 0 always measured
    sizes = [len(d["table"]) for d in ds]
    # one yield per run: a batch size's cells appear in its first round, and its two later rounds redo them
    assert sizes == [0, 1, 2, 3, 3, 3, 3, 3, 3, 3, 4, 5, 6] + [6] * 6 + [7, 8, 9] + [9] * 7
    for d in ds[1:]:
        assert all(r["speedup"] is not None and r["speedup"] > 0 for r in d["table"])   # known once measured
    cross = sweep.sweep_crossover(last["table"])
    assert last["crossover_batch"] == cross
    assert last["best_depth"] == [{"batch_size": b, "depth": k} for b, k in sweep.sweep_best_depths(last["table"]).items()]
    unsettled = bool(sweep.sweep_unsettled(sweep.sweep_best_depths(last["table"]))[0])
    assert last["conclusion"] == sweep.sweep_conclusion(cross, unsettled)
    assert last["conclusions"][0] == "conclusion_best"
    assert len(last["best_depth"]) == 3 and last["values"]["max_batch"] == 3
    assert {r["runs"] for r in last["table"]} == {sweep.SWEEP_ROUNDS} and last["values"]["rounds"] == 3
    assert all((r["band"] is None) == (r["depth"] == 0) for r in last["table"])
    assert last["values"]["edge_band"] >= 0 and last["values"]["pays"] == sweep.NOISE_FLOOR


def _timed(tps: float) -> common.TimedRun:
    from specviz.engine.request import RunTotals
    return common.TimedRun([], [], 1.0, RunTotals(tokens=int(tps)), {})


def test_a_sweep_cell_is_the_median_of_its_rounds_paired_with_plain():
    """Each round's ratio is taken to plain decoding of the same round (a slow round slows both), the
    cell's speed-up is their median and its band their spread: one cell run once moved the crossover
    between presses of the same button."""
    runs = {0: [_timed(100), _timed(50), _timed(100)], 2: [_timed(120), _timed(60), _timed(100)]}
    plain, two = sweep.sweep_cells(runs, 4)
    assert plain["speedup"] == 1.0 and plain["band"] is None and plain["tokens_per_s"] == 100
    assert two["speedup"] == pytest.approx(1.2) and two["runs"] == 3      # ratios 1.2, 1.2, 1.0
    assert two["tokens_per_s"] == 100                                      # the median run's speed
    assert two["band"] == pytest.approx(0.1 / 1.2)                         # (1.2 − 1.0) ÷ 2 ÷ 1.2
    assert sweep.sweep_cells({0: [_timed(100)], 2: []}, 4) == [sweep.sweep_cells({0: [_timed(100)]}, 4)[0]]
    assert sweep.turn([0, 1, 2], 0) == [0, 1, 2] and sweep.turn([0, 1, 2], 1) == [2, 1, 0]


def test_a_depth_pays_only_outside_its_own_band():
    rows = [{"batch_size": 8, "depth": 0, "speedup": 1.0}, {"batch_size": 8, "depth": 2, "speedup": 1.08, "band": 0.1},
            {"batch_size": 8, "depth": 4, "speedup": 1.06, "band": None}]
    assert sweep.sweep_best_depths(rows) == {8: 4}                   # 1.08 inside ±10 %; 1.06 outside ±5 %
    rows[2]["speedup"] = 1.04
    assert sweep.sweep_best_depths(rows) == {8: 0}
    rows[1]["band"] = 0.06
    assert sweep.sweep_best_depths(rows) == {8: 2}
    assert sweep.edge_values(rows, None) == {"edge_depth": 2, "edge_speedup": 1.08, "edge_band": 0.06}
    assert sweep.edge_values(rows, 16)["edge_depth"] == "—"
    # without a crossover the sentence names the depth that paid, not a faster one inside its band
    wide = [{"batch_size": 32, "depth": 0, "speedup": 1.0}, {"batch_size": 32, "depth": 2, "speedup": 1.10, "band": 0.2},
            {"batch_size": 32, "depth": 4, "speedup": 1.07, "band": 0.01}]
    assert sweep.sweep_crossover(wide) is None and sweep.edge_values(wide, None)["edge_depth"] == 4


def test_a_sweep_cell_shows_the_spread_it_measured_not_the_floor():
    """Three rounds at 1.03, 1.05, 1.06× spread about ±1.5 %: the cell says so, and only the decision
    takes the 5 % floor."""
    runs = {0: [_timed(100)] * 3, 2: [_timed(103), _timed(105), _timed(106)]}
    cell = sweep.sweep_cells(runs, 8)[1]
    assert cell["band"] == pytest.approx(0.03 / 2 / 1.05) and sweep.pays_band(cell) == 0.05


def test_the_sweeps_colours_show_a_loss_and_keep_their_scale():
    """A reader saw 0.95-0.99× cells in the pale yellow of 1.00× (RdYlGn centred on 1 over 0-2) under a
    chapter called "When it hurts", and the colour bar ran 0-2 on one press and 0.5-1.5 on the next."""
    import plotly.colors as pc

    def colour(c, v):
        lo, hi = c["zmin"], c["zmax"]
        pos = (v - lo) / (hi - lo)
        stops = c["colorscale"]
        for (a, ca), (b, cb) in zip(stops, stops[1:]):
            if a <= pos <= b:
                return pc.find_intermediate_color(pc.hex_to_rgb(ca), pc.hex_to_rgb(cb), (pos - a) / (b - a) if b > a else 0)
    one, few = sweep.speedup_colours([1.0, 1.2]), sweep.speedup_colours([0.97, 1.6])
    assert (one["zmin"], one["zmax"]) == (few["zmin"], few["zmax"]) == sweep.COLOUR_RANGE
    r, g, b = colour(few, 0.97)
    assert r > g + 40 and r > b + 40                                 # salmon: a loss
    r1, g1, b1 = colour(few, 1.03)
    assert g1 > r1 and g1 > b1                                       # green: a gain
    wide = sweep.speedup_colours([0.3, 2.5])
    assert (wide["zmin"], wide["zmax"]) == (0.3, 2.5)                # no cell past the ends


def test_sweep_publishes_sources():
    pts = sweep.published_points()
    assert pts and all(p["label"] == "published measurement" and p["source"] for p in pts)
    series = {p["series"] for p in pts}
    assert any("EAGLE-3" in s for s in series) and any(s.startswith("EAGLE on") for s in series)
    vllm = [p for p in pts if p["batch"] is None]
    assert {p["load"] for p in vllm} == {"QPS 1", "high QPS"} and min(p["speedup"] for p in vllm) < 1


def test_sweep_rule():
    assert sweep.sweep_conclusion(None) == "conclusion_no_crossover"
    assert sweep.sweep_conclusion(8) == "conclusion_crossover"

    def rows(grid):   # {batch: [tokens/s at k = 0, 1, 2]}
        return [{"batch_size": b, "depth": k, "tokens_per_s": t, "speedup": t / tps[0]}
                for b, tps in grid.items() for k, t in enumerate(tps)]
    # a 1 % "win" at B = 32 is noise: plain is best there, and speculation stops paying from 32
    r = rows({1: [10, 15, 17], 16: [90, 95, 99], 32: [100, 96, 101]})
    assert sweep.sweep_best_depths(r) == {1: 2, 16: 2, 32: 0} and sweep.sweep_crossover(r) == 32
    assert crossover_from_rows(r) is None                  # the plain fastest-cell rule would say "never"
    # a batch size where it stops paying, followed by one where it pays again, is not the crossover
    r = rows({1: [10, 15, 17], 4: [40, 41, 40], 8: [60, 70, 66], 16: [90, 80, 85]})
    assert sweep.sweep_crossover(r) == 16
    assert sweep.sweep_crossover(rows({1: [10, 15, 17], 2: [20, 25, 30]})) is None


def test_a_sweep_that_does_not_settle_says_so():
    """A reader saw plain decoding win at B = 4 and 16 and a depth win at 8 and 32, under "No crossover:
    at the largest batch a depth still beat plain, the crossover lies further out". Such a grid is said
    to be unsettled; a crossover with a plain win below it keeps its sentence and gets that one too."""
    assert sweep.sweep_conclusion(None, unsettled=True) == "conclusion_unsettled"
    best = {1: 2, 2: 2, 4: 0, 8: 1, 16: 0, 32: 2}
    assert sweep.sweep_unsettled(best) == ([4, 16], [8, 32])
    assert sweep.sweep_unsettled({1: 2, 8: 0, 16: 0}) == ([], [])
    said = lessons.text("en", "chapter.sweep.conclusion_unsettled", plain_batches=lessons.Listed(["4", "16"]),
                        spec_batches=lessons.Listed(["8", "32"]))
    assert "plain decoding was the best at B = 4, 16, yet" in said and "(B = 8, 32)" in said
    fa = lessons.text("fa", "chapter.sweep.conclusion_unsettled", plain_batches=lessons.Listed(["4", "16"]),
                      spec_batches=lessons.Listed(["8", "32"]))
    assert "16" in fa and "32" in fa and "crossover" in fa


# --- policies -------------------------------------------------------------------------------------------

def test_policies_table_and_winners(runs):
    last = runs["policies"][-1]
    # start, plain + every policy per batch, final
    assert len(runs["policies"]) == 1 + 2 * (2 + len(policies.POLICY_NAMES)) + 1
    rows = last["table"]
    assert {(r["policy"], r["batch_size"]) for r in rows} == {(p, b) for p in policies.POLICY_NAMES for b in (1, 3)}
    for w in last["winners"]:
        mine = [r for r in rows if r["batch_size"] == w["batch_size"]]
        assert w["tokens_per_s"] == max(r["tokens_per_s"] for r in mine)
    assert last["conclusions"][2:] == [last["conclusion"]]
    for w, key in zip(last["winners"], last["conclusions"]):     # a winner is named only outside the band
        assert key == policies.row_key(w) and w["band"] >= policies.POLICIES_CLOSE
        assert (not key.startswith("conclusion_row_level")) == w["clear"]
    assert all(p["band"] >= policies.POLICIES_CLOSE for p in last["plain"])
    assert [v["batch"] for v in last["conclusion_values"][:2]] == [1, 3]
    for r in rows:    # depth 0 rows are plain decoding: disable-by-batch-size never disables at B ≤ 8
        if r["policy"] == "disable-by-batch-size":
            assert r["mean_depth"] == 2


def test_policies_rule():
    assert policies.policies_conclusion({}) == "conclusion_close"
    assert policies.policies_conclusion({1: "fixed", 4: "fixed"}) == "conclusion_same_winner"
    assert policies.policies_conclusion({1: "fixed", 4: "adaptive"}) == "conclusion_switch"
    assert policies.noise_band(100, 80) == pytest.approx(20 / 90) and policies.noise_band(100, 99) == 0.05
    # identical runs (a policy that is fixed at this batch size): level, not a win; a wide band hides more
    rows = [{"policy": p, "batch_size": 1, "tokens_per_s": t, "vs_plain": t / 10}
            for p, t in [("fixed", 20.0), ("disable-by-batch-size", 20.4), ("adaptive", 15.0)]]
    values, key, per_row = policies.policies_values(rows, [1])
    assert key == "conclusion_close" and per_row[0]["clear"] is False
    rows[1]["tokens_per_s"] = 25.0
    assert policies.policies_values(rows, [1])[1] == "conclusion_same_winner"
    assert policies.policies_values(rows, [1], {1: 0.3})[1] == "conclusion_close"
    rows = [{"policy": p, "batch_size": b, "tokens_per_s": t, "vs_plain": t / 10}
            for p, b, t in [("fixed", 1, 20), ("adaptive", 1, 15), ("fixed", 4, 30), ("adaptive", 4, 40),
                            ("fixed", 16, 30), ("adaptive", 16, 45)]]
    values, key, per_row = policies.policies_values(rows, [1, 4, 16])
    assert key == "conclusion_switch"
    assert (values["small_policy"], values["large_policy"], values["batch"]) == ("fixed", "adaptive", 4)
    assert values["spread"] == pytest.approx(0.5) and values["policy"] == "adaptive"
    assert [r["policy"] for r in per_row] == ["fixed", "adaptive", "adaptive"]
    # A, B, A: the small-batch winner is never the large-batch one
    rows = [{"policy": p, "batch_size": b, "tokens_per_s": t, "vs_plain": 1.0}
            for p, b, t in [("fixed", 1, 20), ("adaptive", 1, 15), ("fixed", 4, 10), ("adaptive", 4, 40),
                            ("fixed", 16, 50), ("adaptive", 16, 45)]]
    values, key, _ = policies.policies_values(rows, [1, 4, 16])
    assert (values["small_policy"], values["large_policy"], values["batch"]) == ("adaptive", "fixed", 16)


def test_policies_never_say_every_batch_size_for_a_winner_at_some():
    """One clear winner at batch 12 and level elsewhere is not "the fastest at every batch size"; a winner
    slower than plain decoding says so (disable-by-batch-size at 0.99× plain was "the winner")."""
    rows = [{"policy": p, "batch_size": b, "tokens_per_s": t, "vs_plain": v}
            for p, b, t, v in [("fixed", 1, 20, 1.9), ("adaptive", 1, 19.5, 1.85),
                               ("fixed", 12, 60, 0.6), ("disable-by-batch-size", 12, 88.8, 0.99)]]
    values, key, per_row = policies.policies_values(rows, [1, 12])
    # its clear win was still below plain decoding: the summary does not call it a win (a first-time user
    # read "won clearly only where the batch size was 4" over "only 0.99× plain decoding" for batch 4)
    assert key == "conclusion_winner_some_below_plain"
    assert (str(values["clear_batches"]), str(values["level_batches"])) == ("12", "1")
    # 0.99x is inside the band: level with plain decoding ("yet only 0.99x plain decoding" read as a loss)
    assert [policies.row_key(w) for w in per_row] == ["conclusion_row_level", "conclusion_row_tied_plain"]
    level = lessons.text("en", "chapter.policies.conclusion_row_tied_plain", **per_row[1])
    assert "level with plain decoding (0.99×, inside the ±5% noise band)" in level, level
    assert policies.row_key(dict(per_row[1], vs_plain=0.9)) == "conclusion_row_below_plain"
    assert policies.row_key(dict(per_row[1], vs_plain=1.2)) == "conclusion_row"
    text = lessons.text("en", "chapter.policies." + key, **values)
    assert "only at batch size B = 12, and even there it did not beat plain decoding" in text, text
    assert "won" not in text and "every" not in text
    assert "disable" in lessons.text("fa", "chapter.policies." + key, **values)
    above = [dict(r, vs_plain=1.2) if r["batch_size"] == 12 else r for r in rows]
    key = policies.policies_values(above, [1, 12])[1]
    assert key == "conclusion_winner_some"
    assert "only at batch size B = 12; at B = 1, no policy" in lessons.text("en", "chapter.policies." + key, **values)


def test_a_level_batch_size_where_every_policy_lost_to_plain_decoding_says_so():
    """At batch 4 every policy ran at 0.83-0.90x plain decoding and the line said only "level": the policies
    were level with each other, and all of them below plain decoding outside the band."""
    rows = [{"policy": p, "batch_size": 4, "tokens_per_s": t, "vs_plain": t / 100}
            for p, t in [("fixed", 90.0), ("adaptive", 88.0), ("confidence", 83.0)]]
    _, _, per_row = policies.policies_values(rows, [4])
    assert per_row[0]["clear"] is False and policies.row_key(per_row[0]) == "conclusion_row_level_below_plain"
    for lang in ("en", "fa"):
        text = lessons.text(lang, "chapter.policies.conclusion_row_level_below_plain", **per_row[0])
        assert "0.90×" in text and "{" not in text, text
    assert "below plain decoding" in lessons.text("en", "chapter.policies.conclusion_row_level_below_plain", **per_row[0])
    inside = [dict(r, vs_plain=r["vs_plain"] + 0.08) for r in rows]          # 0.98x: inside the band, just level
    assert policies.row_key(policies.policies_values(inside, [4])[2][0]) == "conclusion_row_level"


def test_the_policies_chart_names_its_winners_outline_in_the_legend():
    rows = [{"policy": p, "batch_size": b, "tokens_per_s": t, "vs_plain": t / 10}
            for p, b, t in [("fixed", 1, 20), ("adaptive", 1, 12)]]
    winners = [{"batch_size": 1, "policy": "fixed", "clear": True}]
    fig = policies.figure_policies({"table": rows, "winners": winners})
    outlines = [d for d in fig.data if "outlined" in (d.name or "")]
    assert len(outlines) == 1 and outlines[0].showlegend and outlines[0].y == (2.0, )
    # the policies' own bars carry no outline: plotly drew the legend swatch of an outlined one outlined
    bars = [d for d in fig.data if d not in outlines]
    assert all(d.marker.line.width in (None, 0) for d in bars)
    assert outlines[0].offsetgroup == "fixed" == bars[0].offsetgroup          # drawn right over its bar
    assert not any("outlined" in (d.name or "") for d in policies.figure_policies({"table": rows, "winners": []}).data)
    assert policies.policies_conclusion({1: "fixed", 12: "fixed"}, 2) == "conclusion_same_winner"


def test_race_rule():
    assert race.race_conclusion(1.3) == "conclusion_faster"
    assert race.race_conclusion(0.8) == "conclusion_slower"
    assert race.race_conclusion(1.0) == "conclusion_even"


# --- the frontier ---------------------------------------------------------------------------------------

def test_frontier_runs_every_arm_at_every_class_size_with_the_same_tokens(runs):
    last = runs["frontier"][-1]
    cells = {(r["arm"], r["depth"], r["users"]) for r in last["table"]}
    assert cells == {(arm, d, n) for arm, d in frontier.arms(FRONTIER_SHORT["depths"])
                     for n in FRONTIER_SHORT["users"]}
    assert last["identical"] is True              # every arm gave every user the same tokens
    for r in last["table"]:
        assert r["classes"] == 2 and r["tokens"] == 2 * r["users"] * frontier.tokens_per_user(
            r["users"], FRONTIER_SHORT["max_new"], FRONTIER_SHORT["class_tokens"]), r      # two classes a cell
    assert [d["progress"] for d in runs["frontier"]] == [0.0, 0.5, 1.0, 1.0]


# --- figures --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("dark", [False, True])
def test_figures_build_for_every_chapter(runs, dark):
    for name, ds in runs.items():
        ch = chapter_of(name)
        fa = {k: v for k, v in lessons.load("fa")["chapter"][ch].items() if isinstance(v, str)}
        for d in (ds[0], ds[len(ds) // 2], ds[-1]):      # empty, partial and final results all draw
            for labels in ({}, fa):
                fig = BY_KEY[ch].figure(d, labels, dark=dark)
                assert fig.layout.paper_bgcolor == "rgba(0,0,0,0)" and fig.layout.plot_bgcolor == "rgba(0,0,0,0)"
                assert fig.layout.template.layout.paper_bgcolor is not None
                fig.to_json()
        assert BY_KEY[ch].figure(ds[-1], {}, dark).data, name


def test_a_race_says_when_its_draft_passes_are_too_thin_to_see():
    """The n-gram draft's passes take microseconds: the legend named an orange "draft pass" no reader
    could find. It now says how long they took; a draft pass wide enough to see keeps its plain name."""
    def result(draft_s):
        segs = [{"lane": "spec", "kind": "draft", "start_s": 0.1 * i, "end_s": 0.1 * i + draft_s, "tokens": 0}
                for i in range(5)] + [{"lane": "spec", "kind": "verify", "start_s": 0.1 * i + draft_s,
                                       "end_s": 0.1 * (i + 1), "tokens": 2} for i in range(5)]
        return {"segments": segs, "tokens": []}
    names = {tr.name for tr in race.figure_race(result(20e-6)).data}
    assert "draft pass (20 µs each: too short to see)" in names
    assert "draft pass" in {tr.name for tr in race.figure_race(result(0.03)).data}
    fa = {k: lessons.text("fa", f"chapter.race.{k}") for k in ("legend_draft_thin",)}
    assert any("20" in n and "µs" in n and "کوتاه" in n for n in (tr.name for tr in race.figure_race(result(20e-6), fa).data))


def test_figures_use_the_given_labels(runs):
    fig = race.figure_race(runs["race"][-1], {"lane_plain": "PLAIN-X", "legend_draft": "DRAFT-X"})
    assert "PLAIN-X" in {y for tr in fig.data for y in (tr.y or [])}
    assert "DRAFT-X" in {tr.name for tr in fig.data}
    fig = sweep.figure_sweep(runs["sweep"][-1], {})
    names = [tr.name or "" for tr in fig.data]
    assert any("EAGLE-3" in n and "published measurement" in n for n in names)
    fig = ledger.figure_ledger(runs["ledger"][-1], {"part_rejected": "WASTE-X"})
    assert "WASTE-X" in {tr.name for tr in fig.data}


def test_the_ledgers_legend_gives_one_colour_one_meaning_under_each_bars_name(runs):
    """A first-time user read blue as the target's own tokens (FLOPs, 22 %) and as verify passes (wall time,
    52 %), and the measured bars were that blue too: each colour now means one thing, and a part named in
    both bars (the draft) sits under each bar's name in the legend."""
    fig = ledger.figure_ledger(runs["ledger"][-1], {})
    shown = [tr for tr in fig.data if tr.showlegend is not False]
    by_colour = {}
    for tr in shown:
        by_colour.setdefault(tr.marker.color, set()).add(tr.name)
    # one colour, one meaning: the draft's orange in both bars is the same draft (its work, its passes)
    assert all(len(names) == 1 or (colour == DRAFT and len(names) == 2) for colour, names in by_colour.items()), \
        by_colour
    stacked = [tr for tr in shown if tr.orientation == "h"]
    assert stacked and all(tr.legendgrouptitle.text == tr.legendgroup for tr in stacked)


def test_a_race_pass_says_what_it_checked_and_wrote(runs):
    """A reader hovered a verify bar and got only "0.237–0.272 s", and could not tell what the one-token
    passes in the speculative lane were: each pass now says its tokens checked and written."""
    fig = race.figure_race(runs["race"][-1], {})
    verify = next(tr for tr in fig.data if tr.name == "verify pass (target)")
    said = [c[2] for c in verify.customdata]
    assert all(re.fullmatch(r" · \d+ tokens checked, \d+ written", w) for w in said), said
    assert "%{customdata[2]}" in verify.hovertemplate
    plain = next(tr for tr in fig.data if tr.name == "target pass (one token)")
    assert {c[2] for c in plain.customdata} == {" · one token written, no draft to check"}   # not "1 tokens checked"
    prefill = next(tr for tr in fig.data if tr.name == "prefill (prompt)")
    assert [c[2] for c in prefill.customdata] == [""] * len(prefill.customdata)


def test_the_ledgers_curve_prediction_is_not_drawn_as_leviathans_theory(runs):
    """The third group's bar (the speed-up priced on this machine's pass-time curve) was drawn in the
    colour and under the name of "theory (Leviathan et al.)": a reader gave the paper a number it never
    made. It has a name and colour of its own, in the theory's place."""
    fig = ledger.figure_ledger(runs["ledger"][-1], {})
    bars = {tr.name: tr for tr in fig.data if tr.orientation != "h" and tr.xaxis == "x3"}
    theory, curve = bars["theory (Leviathan et al.)"], bars["prediction on this machine's pass-time curve"]
    assert theory.y[2] is None and None not in theory.y[:2]
    assert curve.y[:2] == (None, None) and curve.y[2] is not None and curve.offsetgroup == theory.offsetgroup
    assert curve.marker.color not in {theory.marker.color, bars["measured"].marker.color}


def test_every_chapter_says_the_work_it_ran(runs):
    """The chapters measure different work (one prompt or a pool, rows, tokens, depths), so one batch
    size's speed-up differs between them: each says what it ran, from its own settings, in both languages."""
    from specviz.ui.lesson import conclusion_md, workload_md
    for name, results in runs.items():
        last = results[-1]
        for lang, word in (("en", "Workload:"), ("fa", "بار کاری:")):
            line = workload_md(lang, last)
            assert line.startswith("_" + word) and "{" not in line, (name, line)
            assert line in conclusion_md(lang, last)
    sweep_line = workload_md("en", runs["sweep"][-1])
    assert "batch sizes 1, 2, 3; depths 0, 1, 2" in sweep_line, sweep_line
    assert workload_md("en", {**runs["race"][-1], "settings": {}}) == ""        # a result without its settings


def test_a_switch_between_two_winners_that_lost_to_plain_decoding_says_so():
    """"At small batch sizes adaptive-verification wins; from batch size 12 on, disable-by-batch-size takes
    over" where batch 1 was level and both winners ran below plain decoding (0.87x, 0.99x): the summary
    names where each won and that neither beat not speculating."""
    rows = [{"policy": p, "batch_size": b, "tokens_per_s": t, "vs_plain": v}
            for p, b, t, v in [("fixed", 1, 20, 1.5), ("adaptive", 1, 19.8, 1.49),
                               ("adaptive", 4, 40, 0.87), ("fixed", 4, 30, 0.65),
                               ("fixed", 12, 60, 0.6), ("disable-by-batch-size", 12, 88.8, 0.99)]]
    values, key, _ = policies.policies_values(rows, [1, 4, 12])
    assert key == "conclusion_switch_below_plain"
    assert (str(values["small_batches"]), values["batch"]) == ("4", 12)
    text = lessons.text("en", "chapter.policies." + key, **values)
    assert "adaptive won at B = 4 and disable-by-batch-size from B = 12 on" in text, text
    assert "neither beat plain decoding where it won: at those batch sizes speculating did not pay" in text, text
    assert "small batch sizes" not in text, text
    assert "{" not in lessons.text("fa", "chapter.policies." + key, **values)
    above = [dict(r, vs_plain=1.3) if r["batch_size"] > 1 else r for r in rows]
    values, key, _ = policies.policies_values(above, [1, 4, 12])
    assert key == "conclusion_switch"
    text = lessons.text("en", "chapter.policies." + key, **values)
    assert text.startswith("adaptive won at B = 4; from B = 12 on, disable-by-batch-size took over"), text
