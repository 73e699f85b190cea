"""Greedy speculative decoding must reproduce the target's own greedy output, token for token."""
import threading

import pytest

from specviz.engine.policies import POLICY_NAMES, make_policy, parse_table
from specviz.engine.request import EngineError, Knobs

MAX_NEW = 24
DRAFTS = ["draft", "target", "ngram", "layerskip:1-2"]


def run(pair, prompts, knobs, max_new=MAX_NEW, on_step=None, **kw):
    eng = pair.engine()
    events = []
    for ev in eng.generate(prompts, knobs, max_new, **kw):
        events.append(ev)
        if on_step:
            on_step(ev, knobs)
    return eng, events


def assert_exact(eng, reference, max_new=MAX_NEW):
    outs = eng.outputs()
    assert outs, "no rows ran"
    for row, out in outs.items():
        assert out == reference(row, max_new), f"row {row} differs from target.generate"


@pytest.mark.parametrize("fast", ["off", "static"])     # stock modules, and the fast path's static cache
@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("batch", [1, 3, 8])
@pytest.mark.parametrize("depth", [0, 1, 4, 8])
def test_greedy_matches_target(make_pair, prompts, reference, draft, batch, depth, fast):
    eng, events = run(make_pair(draft, fast), prompts, Knobs(depth=depth, batch_size=batch))
    assert_exact(eng, reference)
    assert len(eng.outputs()) == batch
    if depth == 0:
        assert all(r.last_kind == "plain" and not r.drafted for ev in events for r in ev.rows)


def test_mixed_acceptance_is_exercised(make_pair, prompts, reference):
    """layerskip accepts some drafts and rejects others: holes land mid-cache in varied rows."""
    eng, events = run(make_pair("layerskip:1-2"), prompts, Knobs(depth=4, batch_size=4), max_new=40)
    assert_exact(eng, reference, 40)
    counts = {r.accepted for ev in events for r in ev.rows if r.drafted}
    assert 0 in counts and max(counts) >= 1


# parameters that make each policy act on the schedule below (batch 1, then 3 at step 1, then 6 at step 2;
# then the first rows finish and the batch shrinks): disable-by-batch-size speculates at 1 to 4 rows and
# not at 6; the table gives k = 5, 2 and 0 in turn; confidence stops rows at different depths
ACTING = {"disable-by-batch-size": (lambda: make_policy("disable-by-batch-size", threshold=4), {0, 5}),
          "batch-table": (lambda: make_policy("batch-table", table=parse_table("1:5,3:2,6:0")), {5, 2, 0}),
          "confidence": (lambda: make_policy("confidence", threshold=0.05), None)}


def _grow(ev, knobs):
    if ev.step == 0:
        knobs.set(batch_size=3)
    if ev.step == 1:
        knobs.set(batch_size=6)


@pytest.mark.parametrize("policy", POLICY_NAMES)
@pytest.mark.parametrize("draft", DRAFTS)
def test_every_policy_is_lossless(make_pair, prompts, reference, policy, draft):
    make, depths = ACTING.get(policy, (lambda: make_policy(policy), None))
    eng, events = run(make_pair(draft), prompts, Knobs(depth=5, batch_size=1, policy=make()), on_step=_grow)
    assert_exact(eng, reference)
    assert len(eng.outputs()) == 6 and {ev.batch_size for ev in events} >= {1, 3, 6}
    if depths is not None:       # the policy acted: every depth it should have chosen, it chose
        assert {ev.depth for ev in events} == depths, [(ev.batch_size, ev.depth) for ev in events]
    if policy == "disable-by-batch-size":
        assert all(ev.depth == 0 for ev in events if ev.batch_size > 4)
        assert all(ev.depth == 5 for ev in events if ev.batch_size <= 4)


def test_confidence_gives_rows_different_depths(make_pair, prompts, reference):
    eng, events = run(make_pair("layerskip:1-2"), prompts,
                      Knobs(depth=6, batch_size=4, policy=make_policy("confidence", threshold=0.05)), max_new=40)
    assert_exact(eng, reference, 40)
    assert any(len({len(r.drafted) for r in ev.rows}) > 1 for ev in events)


def test_disable_by_batch_size_turns_speculation_off(make_pair, prompts):
    _, events = run(make_pair("target"), prompts,
                    Knobs(depth=4, batch_size=3, policy=make_policy("disable-by-batch-size", threshold=2)))
    assert all(ev.depth == 0 and ev.drafted == 0 for ev in events)


def _prefix_exact(eng, reference, max_new):
    """Retired rows stop early: their output must be a prefix of the reference."""
    for row, out in eng.outputs().items():
        ref = reference(row, max_new)
        assert out == ref[: len(out)], f"row {row} diverged"


def test_knobs_change_mid_stream(make_pair, prompts, reference):
    def turn(ev, knobs):
        if ev.step == 2:
            knobs.set(depth=1)
        if ev.step == 4:
            knobs.set(batch_size=6, depth=6)     # admit 4 new rows mid-stream
        if ev.step == 7:
            knobs.set(batch_size=3, policy=make_policy("confidence", threshold=0.2))  # retire 3
    eng, events = run(make_pair("layerskip:1-2"), prompts, Knobs(depth=4, batch_size=2), max_new=30,
                      on_step=turn)
    _prefix_exact(eng, reference, 30)
    assert [len(ev.rows) for ev in events][:8] == [2, 2, 2, 2, 2, 6, 6, 6]
    assert len(events[8].rows) == 3 and events[8].retired == [3, 4, 5]
    assert any("depth 4→1" in c for ev in events for c in ev.changes)
    finished = [r for r, out in eng.outputs().items() if r < 3]
    for row in finished:
        assert eng.outputs()[row] == reference(row, 30)


def test_knobs_from_another_thread(make_pair, prompts, reference):
    """Slider events arrive from another thread while the run streams."""
    knobs = Knobs(depth=3, batch_size=3)
    stop = threading.Event()

    def slider():   # 40 slider moves, a few milliseconds apart, then the user lets go
        for i in range(40):
            if stop.is_set():
                return
            knobs.set(depth=i % 7, batch_size=1 + (i % 5))
            stop.wait(0.003)
    t = threading.Thread(target=slider, daemon=True)
    t.start()
    try:
        eng, events = run(make_pair("layerskip:1-2"), prompts, knobs, max_new=30)
    finally:
        stop.set()
        t.join()
    _prefix_exact(eng, reference, 30)
    assert len({ev.depth for ev in events}) > 1


def test_refill_keeps_batch_busy_until_stopped(make_pair, prompts, reference):
    knobs = Knobs(depth=2, batch_size=2)

    def stop_late(ev, k):
        if ev.step == 25:
            k.stop.set()
    eng, events = run(make_pair("draft"), prompts, knobs, max_new=6, on_step=stop_late, refill=True)
    assert len(events) == 26
    assert len(eng.outputs()) > 2             # finished rows were replaced by new ones
    _prefix_exact(eng, reference, 6)


def test_row_hitting_eos_early(make_pair, prompts, reference, loaded):
    ref0 = reference(0, MAX_NEW)
    eos = ref0[5]                              # a token row 0 produces early
    for draft in ("target", "layerskip:1-2", "draft"):
        eng = make_pair(draft).engine(eos_ids=[eos])
        list(eng.generate(prompts[:3], Knobs(depth=4, batch_size=3), MAX_NEW))
        for row, out in eng.outputs().items():
            assert out == reference(row, MAX_NEW, eos=eos)
        assert eng.outputs()[0][-1] == eos and len(eng.outputs()[0]) <= 6


def test_cache_stays_bounded(make_pair, prompts, reference):
    """Rejected drafts leave holes; compaction keeps the cache near the longest row."""
    eng = make_pair("draft").engine()     # nearly everything rejected: k holes every step
    longest = 0
    for ev in eng.generate(prompts, Knobs(depth=8, batch_size=4), 120):
        longest = max(len(r.seq) for r in eng.rows)
        assert eng.target_kv.length <= longest + 8 + 64
        assert eng.drafter.draft_kv.length <= longest + 8 + 64
    assert_exact(eng, reference, 120)


def test_sampling_is_seeded_and_reported(make_pair, prompts):
    pair = make_pair("layerskip:1-2")
    a, ev_a = run(pair, prompts, Knobs(depth=3, batch_size=2), temperature=0.8, seed=7)
    b, _ = run(pair, prompts, Knobs(depth=3, batch_size=2), temperature=0.8, seed=7)
    c, _ = run(pair, prompts, Knobs(depth=3, batch_size=2), temperature=0.8, seed=8)
    assert a.outputs() == b.outputs()
    assert a.outputs() != c.outputs()
    assert a.totals.acceptance_rate is not None


def test_totals_and_accounting(make_pair, prompts):
    eng, events = run(make_pair("target"), prompts, Knobs(depth=4, batch_size=2))
    t = eng.totals
    assert t.acceptance_rate == 1.0
    assert t.mean_accepted_length == pytest.approx(MAX_NEW * 2 / t.row_steps)
    assert t.flops_ratio > 1.5      # the draft is as big as the target: ~2× the FLOPs of plain decoding
    assert all(ev.tokens_per_pass == ev.batch_size * (ev.depth + 1) for ev in events[:-1])
    plain, _ = run(make_pair("target"), prompts, Knobs(depth=0, batch_size=2))
    assert plain.totals.flops_ratio == pytest.approx(1.0, rel=0.05)


def test_plain_decodings_price_is_each_rows_own(make_pair, prompts):
    """What plain decoding would have spent on a step's tokens: each row at its own context, also when
    rows at one context share the price (the step works it out once per context)."""
    from specviz.hardware.roofline import plain_token_flops

    rows = prompts[:3] + prompts[:1]             # different prompt lengths, and two rows at one context
    assert len({len(p) for p in rows}) >= 2
    eng, events = run(make_pair("ngram"), rows, Knobs(depth=4, batch_size=len(rows)))
    spec, done = eng.spec, {}
    assert len({len(r.emitted) for ev in events for r in ev.rows}) >= 2
    for ev in events:
        want = 0.0
        for r in ev.rows:
            seq = len(eng.prompt_of(r.row)) + done.get(r.row, 0)
            want += len(r.emitted) * plain_token_flops(spec, seq - 1 + (len(r.emitted) - 1) / 2)
            done[r.row] = done.get(r.row, 0) + len(r.emitted)
        assert ev.plain_flops == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("bad", [dict(depth=-1), dict(depth=17), dict(batch_size=0), dict(batch_size=65),
                                 dict(depth=2.5)])
def test_knob_ranges(bad):
    with pytest.raises(EngineError):
        Knobs(**bad)


def test_bad_generate_args(make_pair, prompts):
    eng = make_pair("draft").engine()
    with pytest.raises(EngineError):
        list(eng.generate([[]], Knobs(), 5))
    with pytest.raises(EngineError):
        list(eng.generate(prompts, Knobs(), 0))
    with pytest.raises(EngineError):
        list(eng.generate(prompts, Knobs(), 5, temperature=-1))
