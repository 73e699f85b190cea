"""Adaptive verification: the budget's pieces, the engine under it (exact, and it does trim), sampling
keeps the target's distribution, and the frontier command's refusals."""
import math

import pytest
import torch

from specviz.engine.acceptance import CONF_BINS, POSITIONS, AcceptanceTable
from specviz.engine.budget import Budget
from specviz.engine.costs import CostTable, monotone
from specviz.engine.draftdepth import PROBE_EVERY, DraftDepth
from specviz.engine.drafters import Proposal
from specviz.engine.loop import Knobs
from specviz.engine.policies import make_policy
from specviz.engine.request import Request


def test_monotone_pools_the_dips():
    assert monotone([1, 2, 4, 8], [1.0, 3.0, 2.0, 5.0]) == [1.0, 2.5, 2.5, 5.0]
    assert monotone([1, 2], [2.0, 1.0]) == [1.5, 1.5]


def test_cost_table_interpolates_and_extends_along_the_last_slope():
    t = CostTable(seen={1: 1.0, 3: 3.0})
    assert t.at(2) == pytest.approx(2.0)
    assert t.at(5) == pytest.approx(5.0)
    assert t.at(0) == pytest.approx(1.0)


def test_seed_is_scaled_to_what_the_steps_measured():
    t = CostTable(seed={1: 1.0, 8: 1.0, 64: 8.0})
    t.observe(8, 2.0)              # the real steps cost twice the profile
    assert t.at(64) == pytest.approx(16.0)
    assert t.at(8) == pytest.approx(2.0)


def test_one_slow_step_neither_sticks_nor_outlives_its_size():
    """A size's cost is the median of its recent steps, and a size no step measures again falls back to
    the scaled profile after STALE observations (else a spike at a size the budget then avoids stays)."""
    from specviz.engine.costs import RECENT, STALE
    t = CostTable(seed={1: 1.0, 4: 1.0, 8: 1.0, 16: 2.0})
    for _ in range(RECENT):
        t.observe(4, 1.0)
    t.observe(4, 9.0)                  # one preempted step among normal ones
    assert t.at(4) == pytest.approx(1.0)
    t.observe(7, 3.0)                  # a spike at a size seen once
    assert t.at(8) == pytest.approx(3.0)       # the monotone fit lifts the sizes above it
    for _ in range(STALE - 1):
        t.observe(4, 1.0)
    assert t.at(8) == pytest.approx(3.0)       # still inside its window (STALE observations)
    t.observe(4, 1.0)
    assert t.at(7) == pytest.approx(1.0) and t.at(8) == pytest.approx(1.0)   # expired: the profile again
    unseeded = CostTable()
    unseeded.observe(2, 5.0)
    for _ in range(STALE + 1):
        unseeded.observe(1, 1.0)
    assert unseeded.at(2) == pytest.approx(5.0)   # nothing to fall back on: kept


@pytest.fixture
def plain_rates(monkeypatch):
    """The planner's cost logic on the rates alone: no optimism for thin evidence (tested on its own)."""
    from specviz.engine import acceptance

    monkeypatch.setattr(acceptance, "EXPLORE", 0.0)


def _proposal(conf: list[list[float]]) -> Proposal:
    B, K = len(conf), max(len(c) for c in conf)
    c = torch.zeros(B, K)
    for i, row in enumerate(conf):
        c[i, :len(row)] = torch.tensor(row)
    return Proposal(torch.zeros(B, K, dtype=torch.long), torch.tensor([len(r) for r in conf]), None, conf=c)


def test_confident_row_goes_deeper_than_an_unsure_one():
    """Position 5 of a confident row beats position 1 of an unsure one; each row verifies a prefix."""
    b = Budget(verify_seed={2: 1.0, 7: 1.0, 12: 1.5})  # flat to 7 tokens, then dear
    prop = _proposal([[0.99] * 6, [0.2] * 6])
    sel = b.select(prop, [True, True], [False, False], 0.0, 2)
    assert sel.lengths[0] == 6 and sel.lengths[1] <= 1
    assert sel.verified == sum(sel.lengths) and sel.drafted == 12 and sel.budget == sel.verified


def test_compute_bound_pass_verifies_nothing_and_memory_bound_verifies_all():
    steep = Budget(verify_seed={1: 1.0, 100: 100.0})   # every slot costs a whole token's pass
    assert steep.select(_proposal([[0.9] * 4]), [True], [False], 0.0, 1).lengths == [0]
    flat = Budget(verify_seed={1: 1.0, 100: 1.0})
    assert flat.select(_proposal([[0.9] * 4]), [True], [False], 0.0, 1).lengths == [4]


def test_with_nobody_waiting_the_step_is_planned_for_the_batchs_last_row():
    """Past the knee, a row with fewer tokens left than the last one does not end the batch sooner by
    going faster: its drafts are left out while the last row's are verified. Where requests wait for
    room, any row that finishes lets one in, so every row's drafts count again; below the knee (a flat
    pass) the row ahead verifies too, past it never (not even one cheap-looking token of a wide pass). Rows level with each other move the end only together: the
    chance that all keep a draft is the product, so many level rows verify little."""
    prop = _proposal([[0.9] * 3, [0.9] * 3])
    past_knee = {2: 1.0, 5: 1.6, 8: 2.2}          # every token 20 % of the plain pass
    steeper = {2: 1.0, 5: 1.9, 8: 2.8}            # … 30 %
    sel = Budget(verify_seed=steeper).select(prop, [True, True], [False, False], 0.0, 2, [10, 20])
    assert sel.lengths == [0, 3]
    sel = Budget(verify_seed=past_knee).select(prop, [True, True], [False, False], 0.0, 2, [10, 20])
    assert sel.lengths == [0, 3]                  # a token more a row costs 40 % more: past the knee
    nearly_flat = {2: 1.0, 5: 1.03, 8: 1.06}      # … 2 %, below the knee (≤ FREE_SHARE): every row counts
    sel = Budget(verify_seed=nearly_flat).select(prop, [True, True], [False, False], 0.0, 2, [10, 20])
    assert sel.lengths == [3, 3]
    sel = Budget(verify_seed=past_knee).select(prop, [True, True], [False, False], 0.0, 2, [10, 20], waiting=True)
    assert sel.lengths == [3, 3]
    sel = Budget(verify_seed=past_knee).select(prop, [True, True], [False, False], 0.0, 2, [20, 20])
    assert sel.lengths == [2, 2]                  # two level rows, each 0.9 sure: 0.81 a place together, 0.53 at the third
    flat = {2: 1.0, 8: 1.0}
    sel = Budget(verify_seed=flat).select(prop, [True, True], [False, False], 0.0, 2, [10, 20])
    assert sel.lengths == [3, 3]
    many = _proposal([[0.8] * 3] * 16)              # 16 level rows: 0.8 ** 16 ≈ 0.03 a place
    steep = {16: 1.0, 64: 2.2}
    assert sum(Budget(verify_seed=steep).select(many, [True] * 16, [False] * 16, 0.0, 16, [20] * 16).lengths) == 0
    assert sum(Budget(verify_seed=steep).select(many, [True] * 16, [False] * 16, 0.0, 16, [20] * 16,
                                                waiting=True).lengths) >= 32
    # 64 rows past the knee: one token more costs 1.6 % of the pass, but it is a 64th of the work, not free
    wide = _proposal([[0.9] * 3] + [[]] * 63)
    linear = {64: 1.0, 128: 2.0}
    assert sum(Budget(verify_seed=linear).select(wide, [True] * 64, [False] * 64, 0.0, 64,
                                                 [10] + [20] * 63).lengths) == 0
    # below the knee every row's expected tokens count (the slot plan): 4 level rows, 0.9 sure, verify all
    # 12 slots, where the last row's plan would stop at one a row (12 tokens cost 1.35× a pass of 4)
    four = _proposal([[0.9] * 3] * 4)
    knee_at_8 = {4: 1.0, 8: 1.0, 12: 1.35, 16: 1.5}
    assert sum(Budget(verify_seed=knee_at_8).select(four, [True] * 4, [False] * 4, 0.0, 4, [20] * 4).lengths) == 12
    one_short = _proposal([[0.9] * 3, []])        # a level row with nothing drafted: the end cannot move
    assert Budget(verify_seed=steeper).select(one_short, [True, True], [False, False], 0.0, 2,
                                              [20, 20]).lengths == [0, 0]


def test_the_bookkeeping_of_verifying_is_priced_apart_from_verifying_nothing(plain_rates):
    """Steps that verify drafts pay for acceptance and holes that a step verifying nothing skips: with
    those measured apart, a near-even slot is left out; priced alike, it is taken."""
    def budget(spec_s: float, plain_s: float | None) -> Budget:
        b = Budget(verify_seed={1: 1.0, 2: 1.6})            # one more token: +60 % (a 0.7 slot: +70 % tokens)
        b._base_age[1] = 0                                   # the pass with no drafts was just timed: no probe
        b.overhead.observe(1, spec_s)
        if plain_s is not None:
            b.overhead_plain.observe(1, plain_s)
        return b
    one = _proposal([[0.7]])
    assert budget(0.0, None).select(one, [True], [False], 0.0, 1).lengths == [1]
    assert budget(0.3, 0.3).select(one, [True], [False], 0.0, 1).lengths == [1]   # the same either way
    assert budget(0.3, 0.0).select(one, [True], [False], 0.0, 1).lengths == [0]   # 0.3 s more with drafts


def test_a_probe_waits_for_its_share_of_the_serving_time_and_never_comes_where_drafting_cannot_pay():
    """A probe's row first feeds the draft its backlog (a prefill): the probe waits until the time served
    since the last one covers that price 1 ÷ PROBE_SHARE times, and a draft that would not pay even if the
    target kept every token is never probed, however long it waits."""
    verify = {1: 0.010, 4: 0.011, 8: 0.012, 64: 0.1}

    def probes(draft_s: float, idle_s: float, backlog: int) -> bool:
        d = Budget(verify, draft_seed={1: draft_s}).drafting
        d.pos_mean = {j: 0.0 for j in range(4)}            # nothing survived so far: the budget drafts none
        d._idle, d._idle_s = PROBE_EVERY, idle_s
        assert d.choose(4, 1, backlog) == (1 if d.probing else 0)
        return d.probing
    assert not probes(0.001, 0.5, 100)       # a 100-token catch-up (~17 ms here) wants ~0.8 s served first
    assert probes(0.001, 2.0, 100)
    assert probes(0.001, 0.5, 2)             # a short backlog is cheap to probe
    assert not probes(0.012, 100.0, 1)       # dearer per pass than the target: no acceptance would pay


def test_sampled_model_rows_follow_the_previous_cutoff(plain_rates):
    """A sampled row's cut may not look at its own later drafts: it keeps the slots above the cut-off
    set by the step before, whatever this step's B* is."""
    b = Budget(verify_seed={1: 1.0, 100: 100.0})
    b.cutoff = 0.5
    sel = b.select(_proposal([[0.9, 0.9, 0.9, 0.9, 0.9, 0.9, 0.9]]), [True], [True], 0.0, 1)
    assert sel.lengths == [sum(1 for j in range(1, 8) if 0.9 ** j >= 0.5)]


def _engine(pair, budget=None):
    return pair.engine(budget=budget)


def _run_exact(eng, prompts, reference, lengths: list[int]):
    """One adaptive-verification request of 2 rows and depth 6 per length, stepped to the end; every row
    must equal the target's own greedy output. Returns the requests and the step events."""
    reqs = [Request([prompts[i % 4]], Knobs(6, 2, make_policy("adaptive-verification")), n)
            for i, n in enumerate(lengths)]
    for r in reqs:
        eng.add(r)
    events = []
    while any(not r.done for r in reqs):
        events += [ev for _, ev in eng.step()]
    for i, r in enumerate(reqs):
        for row, out in r.outputs().items():
            assert out == reference(i % 4, lengths[i]), f"request {i} row {row}"
    return reqs, events


@pytest.mark.parametrize("draft", ["draft", "layerskip:1-2", "ngram"])
def test_trimmed_verification_is_still_exact(make_pair, prompts, reference, draft):
    """A dear verify pass makes the budget cut drafts; greedy output still equals the target's. The
    requests ask for different lengths, so one is the batch's last row and its drafts can pay."""
    eng = _engine(make_pair(draft), Budget(verify_seed={1: 0.01, 4: 0.011, 8: 0.03, 64: 0.3}))
    reqs, events = _run_exact(eng, prompts, reference, [24, 20, 16, 12])
    drafted = sum(ev.slots_drafted for ev in events)
    verified = sum(ev.slots_verified for ev in events)
    assert drafted > 0 and verified < drafted, "the budget never cut a draft"
    assert any(ev.budget is not None for ev in events)
    assert all(r.totals.proposed >= r.totals.drafted for r in reqs)


def test_ngram_rows_draft_nothing_where_no_plan_could_verify_a_draft(make_pair, prompts, reference):
    """Level rows past the knee move the batch's end only if all keep a draft at once: with 8 of them
    and a dear pass no draft could pay, whatever it is, so n-gram rows skip drafting (and stay exact);
    with requests waiting, or one row alone, they draft."""
    steep = {1: 0.01, 4: 0.011, 8: 0.03, 64: 0.3}
    b = Budget(verify_seed=steep)
    assert not b.could_verify([20] * 8, False, 6)
    assert b.could_verify([20] * 8, True, 6)                 # a row that ends lets a waiting one in
    assert b.could_verify([20], False, 6)                    # one row: 0.5 sure for +10 % of a pass
    assert Budget(verify_seed={1: 0.01, 64: 0.0101}).could_verify([20] * 8, False, 6)   # a flat pass: all count
    _, events = _run_exact(_engine(make_pair("ngram"), Budget(verify_seed=steep)), prompts, reference, [16] * 4)
    assert sum(ev.slots_drafted for ev in events) == 0


def test_a_budget_shut_off_by_slow_readings_retries_and_waits_longer_each_time():
    """A few slow readings above a size (a busy moment) once kept keyed drafts off for whole cells: with
    nothing verified nothing above that size is measured again. After RETRY_FIRST plain steps the budget
    forgets them and the (flat) profile prices verifying again; a retry that ends in another shut-off
    doubles the wait; steps that verify bring it back."""
    from specviz.engine.budget import RETRY_FIRST, RETRY_MAX, Retries
    from specviz.engine.costs import RECENT
    b = Budget(verify_seed={1: 0.010, 4: 0.010, 8: 0.0105, 16: 0.011, 64: 0.3})   # flat to 16 tokens
    assert b.could_verify([20] * 4, False, 4)
    plain = _proposal([[]] * 4)

    def step(tokens: int, seconds: float) -> None:
        b.observe(plain, [0] * 4, [0] * 4, [True] * 4, 4, tokens, seconds, 0.001)
    for _ in range(RECENT):
        step(8, 0.030)                 # verifying one draft a row read 3× the plain pass
    step(4, 0.010)
    assert not b.could_verify([20] * 4, False, 4)
    for _ in range(RETRY_FIRST - 2):
        step(4, 0.010)
    assert not b.could_verify([20] * 4, False, 4), "forgot before RETRY_FIRST plain steps"
    step(4, 0.010)
    assert b.could_verify([20] * 4, False, 4), "still shut off after RETRY_FIRST plain steps"
    r = Retries()
    waits = []
    for _ in range(6):
        n = 1
        while not r.step(4, False):
            n += 1
        waits.append(n)
    assert waits == [min(RETRY_FIRST << i, RETRY_MAX) for i in range(6)]
    for _ in range(RETRY_MAX):
        assert not r.step(4, True)     # verifying: no retry, and the wait goes back to RETRY_FIRST
    assert sum(1 for _ in iter(lambda: r.step(4, False), True)) + 1 == RETRY_FIRST


class ProbingDepth(DraftDepth):
    """Every step is a probe (one position, past the survival stop) while `on`; then the whole depth."""

    on = True

    def choose(self, depth, rows, catchup=0):
        self.step_depth, self.probing = (1, True) if self.on else (depth, False)
        return self.step_depth


def _probing_budget(verify_seed) -> Budget:
    b = Budget(verify_seed=verify_seed)
    b.drafting = ProbingDepth(b.verify, b.overhead)
    return b


@pytest.mark.parametrize("draft", ["draft", "layerskip:1-2"])
def test_a_probe_drafts_in_one_row_and_the_others_catch_up_later_exactly(make_pair, prompts, reference, draft):
    """A probe drafts in one row only (the one with the least to feed the draft model) and the other rows
    do not catch up until they draft: at most one row proposes per step, and every row stays exact once
    the probes stop and all rows draft again (their draft caches catch up then)."""
    eng = _engine(make_pair(draft), _probing_budget({1: 0.01, 4: 0.011, 8: 0.03, 64: 0.3}))
    reqs = [Request([prompts[i]], Knobs(4, 1, make_policy("adaptive-verification")), 24) for i in range(4)]
    for r in reqs:
        eng.add(r)
    probed = []
    for _ in range(6):
        probed.append(sum(1 for _, ev in eng.step() for row in ev.rows if row.proposed))
    assert max(probed) == 1, probed               # one row of the four, every step
    eng.budget.drafting.on = False               # from here every row drafts the full depth
    while any(not r.done for r in reqs):
        eng.step()
    for i, r in enumerate(reqs):
        assert r.outputs()[0] == reference(i, 24), f"request {i}"


def _chi2_pvalue(stat: float, dof: int) -> float:
    """Upper tail of the chi-square distribution (Wilson–Hilferty normal approximation)."""
    z = ((stat / dof) ** (1 / 3) - (1 - 2 / (9 * dof))) / math.sqrt(2 / (9 * dof))
    return 0.5 * math.erfc(z / math.sqrt(2))


def _seeded_budget() -> Budget:
    """The real planner, as if it had served a while: acceptance rises with the draft's confidence, a
    draft pass is nearly free, and a verify pass costs a little per token, so each step verifies the
    confident part of the drafts and cuts the rest (rows with different cuts in one step)."""
    b = Budget({1: 1.0, 4096: 3.0}, draft_seed={1: 1e-4, 4096: 1e-4})
    # the costs stay as seeded (this machine's timings would move the cut from run to run); the planner,
    # its acceptance tables and its cut-off are the real ones
    for table in (b.verify, b.drafting.cost, b.overhead, b.overhead_plain):
        table.observe = lambda *args: None
    for key in range(CONF_BINS):
        for pos in range(POSITIONS):
            b.survival.confident.observe_many(key, pos, 400, int(400 * (0.45 + 0.05 * key)))
    return b


def _chi2(counts: torch.Tensor, p: torch.Tensor) -> float:
    """p-value of counts against the distribution p (bins expecting fewer than 5 pooled)."""
    n = float(counts.sum())
    big = p * n >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([p[big] * n, (p[~big].sum() * n)[None]])
    stat = float(((obs - exp) ** 2 / exp.clamp_min(1e-9)).sum())
    return _chi2_pvalue(stat, int(big.sum()))


@pytest.mark.parametrize("draft", ["layerskip:1-2", "draft"])
def test_sampling_keeps_the_targets_distribution(make_pair, prompts, draft):
    """Under the real planner, sampled rows' first two tokens follow the target's own distribution: the
    first against p(·|prompt), the second against p(·|prompt, first) for the commonest first tokens
    (chi-square), while the budget verified some drafts of a row and cut the rest."""
    pair = make_pair(draft)
    eng = _engine(pair, _seeded_budget())
    temp, prompt = 0.6, prompts[0]
    cut = verified = 0
    outs = []
    for wave in range(3):           # 1,024 rows a wave: the pass costs what the seeded table says
        reqs = [Request([prompt], Knobs(3, 64, make_policy("adaptive-verification")), 3, temperature=temp,
                        seed=16 * wave + s) for s in range(16)]
        for r in reqs:
            eng.add(r)
        while any(not r.done for r in reqs):
            for _, ev in eng.step():
                verified += ev.slots_verified
                cut += sum(1 for row in ev.rows if len(row.drafted) < row.proposed)
        outs += [out for r in reqs for out in r.outputs().values()]

    def p_next(ids: list[int]) -> torch.Tensor:
        with torch.inference_mode():
            logits = pair.target.model(input_ids=torch.tensor([ids])).logits[0, -1, : pair.vocab].float()
        return torch.softmax(logits / temp, dim=-1)
    firsts = torch.tensor([o[0] for o in outs])
    p = p_next(prompt)
    assert _chi2(torch.bincount(firsts, minlength=p.numel()).float(), p) > 1e-4
    common = torch.bincount(firsts).topk(3).indices.tolist()
    for t in common:
        seconds = torch.tensor([o[1] for o in outs if o[0] == t])
        if len(seconds) >= 100:
            q = p_next(prompt + [t])
            assert _chi2(torch.bincount(seconds, minlength=q.numel()).float(), q) > 1e-4, f"after {t}"
    assert verified > 0 and cut > 0, f"the budget never cut a row's drafts ({verified} verified)"


@pytest.mark.parametrize("argv, words", [
    (["--users", "0"], "argument --users: must be whole numbers from 1 to 64 separated by commas"),
    (["--users", "a,b"], "argument --users: must be whole numbers from 1 to 64 separated by commas"),
    (["--depths", "0"], "at least one depth above 0"),
    (["--depths", "0,99"], "argument --depths: must be whole numbers from 0 to"),
    (["--prompts", "poem"], "argument --prompts: invalid choice: 'poem'"),
    (["--repeats", "0"], "argument --repeats: must be a whole number from 1 to 9"),
    (["--max-new-tokens", "0"], "argument --max-new-tokens: must be a whole number from 1 to 512"),
])
def test_frontier_refuses_bad_input_in_one_sentence(capsys, argv, words):
    from specviz.__main__ import main

    assert main(["frontier", *argv]) == 2
    err = capsys.readouterr().err
    assert words in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_steps_observations_at_once_count_as_many_one_by_one():
    """The budget folds a step's rows into one calibration update per (key, position): below the count cap
    it must leave the same rates as observing slot by slot."""
    one, many = AcceptanceTable(pooled=True), AcceptanceTable(pooled=True)
    for kept in (True, False, True, True, False):
        one.observe(3, 1, kept)
    many.observe_many(3, 1, 5, 3)
    for key in (3, 2):
        assert one.rate(key, 1, 0.5) == pytest.approx(many.rate(key, 1, 0.5))
    assert many.rate(3, 1, 0.5) != pytest.approx(AcceptanceTable(pooled=True).rate(3, 1, 0.5))


def test_fading_the_counts_lazily_leaves_the_rates_that_fading_each_count_would():
    """`Calibration.forget` keeps one running factor instead of multiplying every count each step. Against a
    reference that fades every count at once, through the count cap and the fold that keeps the factor from
    underflowing, every rate must agree."""
    import random

    from specviz.engine.acceptance import MAX_COUNT, POSITIONS, PRIOR_WEIGHT

    rng = random.Random(5)
    cal, reached, kept = AcceptanceTable(), {}, {}
    for step in range(3400):
        for _ in range(rng.randrange(4)):
            key, pos = rng.randrange(3), rng.randrange(POSITIONS)
            n = rng.randrange(1, 40)
            a = rng.randrange(n + 1)
            cal.observe_many(key, pos, n, a)
            r, k = reached.get((key, pos), 0.0) + n, kept.get((key, pos), 0.0) + a
            if r > MAX_COUNT:
                k, r = k * MAX_COUNT / r, MAX_COUNT
            reached[(key, pos)], kept[(key, pos)] = r, k
        factor = 1e-30 if step % 997 == 0 else 0.995       # a few large fades reach the fold
        cal.forget(factor)
        reached = {x: v * factor for x, v in reached.items()}
        kept = {x: v * factor for x, v in kept.items()}
        if step % 50 == 0:
            for key, pos in ((0, 0), (1, 3), (2, POSITIONS - 1)):
                want = (kept.get((key, pos), 0.0) + PRIOR_WEIGHT * 0.5) / (reached.get((key, pos), 0.0) + PRIOR_WEIGHT)
                assert cal.rate(key, pos, 0.5) == pytest.approx(want, rel=1e-9)
                assert cal.count(key, pos) == pytest.approx(reached.get((key, pos), 0.0), rel=1e-9, abs=1e-300)


def test_thin_evidence_leans_towards_verifying_and_fades_as_evidence_grows():
    """A rate measured on few slots plans with one standard error of optimism, so a pessimistic start is
    tried and corrected; on hundreds of slots the optimism is a few hundredths."""
    t = AcceptanceTable(pooled=True)
    assert t.optimistic(3, 0, 0.5) == pytest.approx(0.5 + (0.25 / 4) ** 0.5)
    for _ in range(400):
        t.observe(3, 0, False)
    t.observe_many(3, 0, 400, 200)
    assert t.optimistic(3, 0, 0.5) - t.rate(3, 0, 0.5) < 0.03
    # the slot plan uses it: a 0.7-sure slot that a 60 % dearer pass prices out on its rate alone is tried
    b = Budget(verify_seed={1: 1.0, 2: 1.6})
    b._base_age[1] = 0
    assert b.select(_proposal([[0.7]]), [True], [False], 0.0, 1).lengths == [1]


def test_a_size_never_observed_is_priced_optimistically_until_a_step_measures_it():
    t = CostTable(seed={1: 1.0, 2: 2.0, 8: 3.0})
    t.observe(1, 1.0)
    assert t.explore(2) == pytest.approx(1.5)          # half the predicted increment over the largest seen
    t.observe(2, 2.0)
    assert t.explore(2) == pytest.approx(2.0)          # measured: its own price
    assert t.explore(8) == pytest.approx(2.5)


def test_what_a_pair_learnt_outlives_its_engines(make_pair, prompts):
    """Steps of any policy teach a keyed draft's acceptance to the pair's shared tables, and a new budget
    starts from them (warm), while a pair of its own starts from the prior."""
    from specviz.engine.learnt import Learnt

    pair = make_pair("synthetic:1")
    eng = pair.engine()
    from specviz.engine.synthetic import reference_run

    refs, _ = reference_run(eng, prompts[:2], 2, 16)
    list(eng.generate(prompts[:2], Knobs(4, 2), 16, references=refs))     # fixed depth: every draft kept
    fresh = pair.engine()
    keys = fresh.drafter.keys                                            # one key per dial setting
    assert fresh.budget.survival.best_keyed(1, keys)[0] > 0.9            # warm: from the earlier engine's steps
    assert Budget(learnt=Learnt()).survival.best_keyed(1, keys)[0] == 0.5   # a pair of its own: the prior
    assert pair.with_synthetic(0.5).learnt is not pair.learnt
