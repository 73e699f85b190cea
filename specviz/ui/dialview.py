"""What the Playground says about the acceptance dial and the theory, in the reader's language: a
synthetic Run's line (A, its own engine, what its reference cost, re-alignments), and after any Run with
a plain baseline, the prediction priced on this machine's pass-time curve beside the measurement, with
the measured factor that separates them most (`specviz.chapters.theory`). Pure functions of numbers."""
from __future__ import annotations

from specviz import lessons
from specviz.chapters import theory
from specviz.hardware.passcurve import PassCurve
from specviz.ui.i18n import t


def synthetic_md(lang: str, acceptance: float, reference_s: float | None, referencing: bool = False,
                 realigned: int = 0, unreferenced: int = 0) -> str:
    """ "synthetic draft (A = 0.70): …; drafting is free · an engine of its own · the reference took 3.1 s"."""
    parts = [t(lang, "playground.synthetic_line", acceptance=acceptance)]
    if referencing:
        parts.append(t(lang, "playground.reference_running"))
    elif reference_s is not None:
        parts.append(t(lang, "playground.reference_cost", seconds=reference_s))
    if realigned:
        parts.append(t(lang, "playground.realigned", n=realigned))
    if unreferenced:
        parts.append(t(lang, "playground.unreferenced", n=unreferenced))
    return " · ".join(parts)


def curve_md(lang: str, curve: PassCurve) -> str:
    if curve.recorded:
        return t(lang, "playground.curve_recorded", device=curve.device, name=curve.recorded)
    return t(lang, "playground.curve_measured", context=curve.context)


def theory_result(events, rates: list, rate: float | None, curve: PassCurve | None, spec, plain,
                  synthetic: bool = False) -> dict | None:
    """The prediction against the measurement for a finished Run (None where there is nothing to compare:
    no drafts, no plain baseline, no curve). `rate`: the dial's A, or the measured acceptance."""
    shapes = theory.shapes_of(events, rates or None)
    if curve is None or plain is None or rate is None or not spec.drafted or not shapes:
        return None
    pred = theory.predict(shapes, rate, curve)
    g = theory.gap(pred, spec, plain)
    # one A all Run long: its coins' share right against it (a moved dial mixes several A)
    moved = synthetic and len(set(rates or [rate])) > 1
    coins = theory.coin_values(shapes, spec, rate, curve) if synthetic and not moved else {}
    return {**theory.gap_values(g, pred), **coins, "rate": rate, "agree": g.agree,
            "reason": theory.reason_key(g.main, coins, moved)}


def theory_md(lang: str, result: dict | None, curve: PassCurve | None, synthetic: bool) -> str:
    """Two sentences: the prediction and the measurement, then the largest factor between them."""
    if result is None:
        return ""
    head = "playground.theory_real" if not synthetic else \
        "playground.theory_synthetic_moved" if result.get("moved") else "playground.theory_synthetic"
    values = {k: v for k, v in result.items() if k not in ("main", "runner_up", "agree", "moved", "reason")}
    # "62 % below the measurement", not "-62 % off" (a first-time reader could not tell which way)
    above = values.get("difference", 0) > 0
    values["side"] = lessons.Key("playground.theory_above" if above else "playground.theory_below")
    text = f"{t(lang, head, **values)} ({curve_md(lang, curve)})"
    text += "\n\n" + t(lang, "playground.theory_" + result.get("reason", f"reason_{result['main']}"), **values)
    if result.get("runner_up"):     # the ledger's sentence: the same two factors, named the same way
        text += " " + t(lang, f"chapter.ledger.close_{result['runner_up']}", **values)
    return text
