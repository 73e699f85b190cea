import pytest

from specviz.engine.policies import AdaptiveGoodput, PlanContext, PolicyError, StepObservation, make_policy, parse_table


def test_fixed_and_disable():
    assert make_policy("fixed").plan(PlanContext(32, 5)).depth == 5
    p = make_policy("disable-by-batch-size", threshold=8)
    assert p.plan(PlanContext(8, 4)).depth == 4
    assert p.plan(PlanContext(9, 4)).depth == 0


def test_batch_table_picks_largest_key_not_above_b():
    p = make_policy("batch-table", table=parse_table("1:6,8:2,32:0"))
    assert [p.plan(PlanContext(b, 4)).depth for b in (1, 7, 8, 31, 64)] == [6, 6, 2, 2, 0]


def test_confidence_carries_threshold():
    plan = make_policy("confidence", threshold=0.3).plan(PlanContext(2, 6))
    assert plan.depth == 6 and plan.confidence == 0.3


@pytest.mark.parametrize("bad", [dict(name="nope"), dict(name="confidence", threshold=1.5),
                                 dict(name="disable-by-batch-size", threshold=-1),
                                 dict(name="adaptive", max_depth=99)])
def test_bad_policies_are_refused(bad):
    with pytest.raises(PolicyError):
        make_policy(bad.pop("name"), **bad)


def test_bad_table_text():
    with pytest.raises(PolicyError):
        parse_table("1-6")


def _feed(p: AdaptiveGoodput, batch, alpha, verify_of_n, draft_s=0.01, steps=30):
    for i in range(steps):
        k = p.plan(PlanContext(batch, 4)).depth
        n = batch * (k + 1)
        p.observe(StepObservation(batch, k, batch * k, round(batch * k * alpha), draft_s * k, k,
                                  verify_of_n(n), n))
    return p.plan(PlanContext(batch, 4)).depth


def test_adaptive_speculates_when_verify_is_flat_and_stops_when_it_is_linear():
    flat = lambda n: 0.1                       # memory-bound: any tokens per pass cost the same
    linear = lambda n: 0.1 * n                 # compute-bound: every token costs
    assert _feed(AdaptiveGoodput(max_depth=6), 1, 0.8, flat) >= 3
    assert _feed(AdaptiveGoodput(max_depth=6), 32, 0.3, linear) == 0
