"""The synthetic draft (`synthetic:A`): lossless on every path and policy, acceptance set by the dial and
measured by the target, the same coins on every arm, and its refusals."""
import math

import pytest

from specviz.engine.policies import POLICY_NAMES, make_policy
from specviz.engine.request import Knobs, Request, RowStep, RunTotals, StepEvent
from specviz.engine.synthetic import SyntheticDrafter, coin, reference_run
from specviz.pairs.models import ModelError, parse_draft_ref

MAX_NEW = 20


def test_coins_are_fixed_by_seed_row_and_position_and_uniform():
    assert coin(3, 1, 17) == coin(3, 1, 17)
    assert len({coin(3, 1, p) for p in range(50)}) == 50
    assert coin(3, 1, 5) != coin(4, 1, 5) and coin(3, 1, 5) != coin(3, 2, 5)
    xs = [coin(0, 0, p) for p in range(20000)]
    assert 0.0 <= min(xs) and max(xs) < 1.0
    assert abs(sum(xs) / len(xs) - 0.5) < 0.01
    assert abs(sum(x < 0.3 for x in xs) / len(xs) - 0.3) < 0.015


@pytest.mark.parametrize("ref, rate", [("synthetic:0.7", 0.7), ("synthetic:1", 1.0), ("synthetic:0", 0.0),
                                       ("synthetic:.25", 0.25)])
def test_the_dial_is_parsed(ref, rate):
    d = parse_draft_ref(ref)
    assert d.kind == "synthetic" and d.rate == rate


@pytest.mark.parametrize("ref", ["synthetic", "synthetic:", "synthetic:1.5", "synthetic:-0.1", "synthetic:x",
                                 "synthetic:0.7:3"])
def test_a_bad_dial_is_refused_in_one_sentence(ref):
    with pytest.raises(ModelError) as err:
        parse_draft_ref(ref)
    assert "synthetic:" in str(err.value) and "\n" not in str(err.value)


def _run(pair, prompts, batch: int, depth: int, policy: str, max_new: int = MAX_NEW, seed: int = 0):
    eng = pair.engine()
    refs, _ = reference_run(eng, prompts, batch, max_new)
    events = list(eng.generate(prompts, Knobs(depth, batch, make_policy(policy)), max_new, seed=seed,
                               references=refs))
    return eng, events


@pytest.mark.parametrize("rate, path", [(0.0, "off"), (0.3, "static"), (0.7, "off"), (1.0, "static")])
def test_greedy_output_is_the_targets_own_on_every_policy(make_pair, prompts, reference, path, rate):
    pair = make_pair(f"synthetic:{rate}", compile=path)
    for policy in POLICY_NAMES:
        for batch, depth in ((3, 8),) + (((1, 4), (2, 0)) if policy == "fixed" else ()):
            eng, events = _run(pair, prompts[:batch], batch, depth, policy)
            for row, out in eng.outputs().items():
                assert out == reference(row, MAX_NEW), (policy, batch, depth, row)
            assert eng.drafter.realigned == 0 and eng.drafter.unreferenced == 0
            drafted = sum(ev.drafted for ev in events)
            if depth and policy == "fixed":
                assert drafted > 0
                accepted = sum(ev.accepted for ev in events)
                assert (accepted == 0) if rate == 0.0 else (accepted == drafted) if rate == 1.0 else 0 < accepted < drafted


def test_acceptance_by_position_is_the_dial_and_tokens_per_step_follow_leviathan(make_pair, prompts):
    """Given the position before it was accepted, each position is accepted with probability A (within 3
    binomial standard deviations over thousands of drafts), and the mean tokens per step of steps the
    token limit did not cut is (1 − A^(k+1)) ÷ (1 − A) within 5 %."""
    rate, depth = 0.7, 4
    pair = make_pair(f"synthetic:{rate}")
    reached, kept = [0] * depth, [0] * depth
    per_step = []
    totals = RunTotals()
    for seed in range(60):
        eng, events = _run(pair, prompts[:1], 1, depth, "fixed", max_new=60, seed=seed)
        for ev in events:
            totals.add(ev)
            row = ev.rows[0]
            if len(row.drafted) == depth:          # not cut by the token limit
                per_step.append(len(row.emitted))
                for j in range(depth):
                    if j <= row.accepted:
                        reached[j] += 1
                        kept[j] += int(j < row.accepted)
    assert sum(reached) >= 2000
    for j in range(depth):
        sd = math.sqrt(rate * (1 - rate) / reached[j])
        assert abs(kept[j] / reached[j] - rate) < 3 * sd, (j, kept[j], reached[j])
    expected = (1 - rate ** (depth + 1)) / (1 - rate)
    assert abs(sum(per_step) / len(per_step) / expected - 1) < 0.05
    # the α the theory takes is the dial's A: kept ÷ the drafts the target reached; kept ÷ drafted counts
    # the drafts after a rejection, never judged, and reads about 0.44 at A = 0.7, k = 4
    assert abs(totals.alpha - rate) < 3 * math.sqrt(rate * (1 - rate) / totals.reached), totals
    assert totals.acceptance_rate < rate - 0.15, totals


def test_alpha_counts_the_drafts_the_target_reached():
    """A row that kept 1 of 4 drafts was judged on 2 (the second was rejected, the last two never seen); a
    row that kept all 3 on 3; a row with no drafts on none."""
    rows = [RowStep(0, [5, 6, 7, 8], 1, [5, 9], "correction"), RowStep(1, [1, 2, 3], 3, [1, 2, 3, 4], "bonus"),
            RowStep(2, [], 0, [4], "plain")]
    ev = StepEvent(1, 3, 4, "fixed", rows, 0.0, 0.0, 0.0, 0.0, 0.0, 10, 8, 0.0, 0.0, 0.0, 0.0, 0.0)
    totals = RunTotals()
    totals.add(ev)
    assert (totals.reached, totals.alpha, totals.acceptance_rate) == (5, 4 / 5, 4 / 7)
    assert RunTotals().alpha is None


def test_every_arm_draws_the_same_coins(make_pair, prompts):
    """The drafts of a row at a position depend on (seed, row, position) only: two depths agree wherever
    both drafted that position from the same context."""
    pair = make_pair("synthetic:0.5")
    seen: dict[int, dict[int, int]] = {}
    for depth in (2, 6):
        _, events = _run(pair, prompts[:1], 1, depth, "fixed")
        pos = 0
        for ev in events:
            row = ev.rows[0]
            for j, t in enumerate(row.drafted):
                prev = seen.setdefault(pos + j, {}).setdefault(depth, t)
                assert prev == t
            pos += len(row.emitted)
    both = [p for p, d in seen.items() if len(d) == 2]
    assert both and all(seen[p][2] == seen[p][6] for p in both)


def test_a_row_whose_output_leaves_its_reference_realigns_and_stays_exact(make_pair, prompts, reference):
    pair = make_pair("synthetic:1")
    eng = pair.engine()
    good = reference(0, MAX_NEW)
    wrong = list(good)
    wrong[5] = (wrong[5] + 1) % 300          # as if the reference run had broken a near-tie the other way
    refs = {tuple(prompts[0]): tuple(wrong)}
    list(eng.generate(prompts[:1], Knobs(4, 1), MAX_NEW, references=refs))
    assert eng.outputs()[0] == good
    assert eng.drafter.realigned == 1


def test_a_row_without_a_reference_drafts_nothing_and_is_counted(make_pair, prompts, reference):
    eng = make_pair("synthetic:0.9").engine()
    events = list(eng.generate(prompts[:2], Knobs(4, 2), MAX_NEW))
    assert sum(ev.drafted for ev in events) == 0 and eng.drafter.unreferenced == 2
    assert eng.outputs()[0] == reference(0, MAX_NEW)


def test_the_drafter_is_free_and_keyed():
    d = SyntheticDrafter(0.5, 100, "cpu")
    assert d.free and d.backlogs([[1, 2], [3]]) == [0, 0]


@pytest.mark.parametrize("policy", ["fixed", "adaptive-verification"])
def test_eight_clients_at_once_through_the_shared_scheduler_are_exact(make_pair, prompts, reference, policy):
    """Eight users, each a request submitted from its own thread at the same moment, share one batch: every
    row equals the target's own greedy output, whatever shares its steps."""
    from specviz.limits import Limits
    from specviz.serve.workload import class_reference, shared_scheduler, users_at_once

    pair = make_pair("synthetic:0.7", compile="static")
    mine = [prompts[i % len(prompts)] for i in range(8)]
    sched = shared_scheduler(pair, Limits(max_rows_per_user=1, max_shared_rows=8, max_queue=8))
    try:
        refs, _ = class_reference(sched, mine, MAX_NEW)
        _, runs = users_at_once(sched, [Request([p], Knobs(6, 1, make_policy(policy)), MAX_NEW, seed=i,
                                                references=refs) for i, p in enumerate(mine)])
    finally:
        sched.close()
    assert all(r.error is None for r in runs)
    assert max(r.totals.shared_batch_max for r in runs) > 1            # they did share steps
    for i, r in enumerate(runs):
        assert r.outputs == reference(i % len(prompts), MAX_NEW), i
    assert sum(r.totals.accepted for r in runs) > 0


def test_every_guess_is_a_token_of_the_rows_own_text(make_pair, prompts):
    """A wrong guess was any token of the vocabulary: on a class's projected screen the rejected drafts read
    as random words, whatever the tokenizer holds. It is now a token of the row's own continuation, taken
    from another place; the right ones are that continuation's own."""
    pair = make_pair("synthetic:0.3")
    eng = pair.engine()
    refs, _ = reference_run(eng, prompts[:2], 2, MAX_NEW)
    events = list(eng.generate(prompts[:2], Knobs(4, 2, make_policy("fixed")), MAX_NEW, seed=0, references=refs))
    own = {row: set(refs[tuple(eng.prompt_of(row))]) for row in eng.outputs()}
    assert len(own) == 2 and own[0] != own[1]
    outside = [(r.row, t) for ev in events for r in ev.rows for t in r.drafted if t not in own[r.row]]
    rejected = sum(len(r.drafted) > r.accepted for ev in events for r in ev.rows)
    assert rejected > 5 and not outside, (rejected, outside)
