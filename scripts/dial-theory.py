#!/usr/bin/env python3
"""The acceptance dial's theory against this machine, at batch 1.

For A = 0.5 and 0.9 and k = 2, 4, 8: the predicted decode speed-up E(A, k) × t(1) ÷ t(k + 1) (Leviathan et
al. with a free draft, E = (1 − A^(k+1)) ÷ (1 − A); t from a pass-time curve measured here first) against
the measured one: ten rows' coins (request seeds 0–9) of 96 tokens on the default prompt, each synthetic run
beside a plain one, decode seconds only (the reference and prefill left out).

    .venv/bin/python scripts/dial-theory.py [OUT.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from specviz.cli.args import out_file  # noqa: E402
from specviz.engine.request import Knobs  # noqa: E402
from specviz.engine.synthetic import reference_run  # noqa: E402
from specviz.hardware.passcurve import measure_curve  # noqa: E402
from specviz.hardware.roofline import expected_tokens_per_pass  # noqa: E402
from specviz.pairs.pipeline import encode_prompt, load_pair  # noqa: E402
from specviz.serve.prompts import DEFAULT_PROMPT  # noqa: E402

NEW_TOKENS = 96
SEEDS = 10


def run(pair, prompt: list[int], depth: int, refs: dict, seed: int) -> tuple[int, float]:
    """(tokens, decode seconds) of one row."""
    eng = pair.engine()
    for _ in eng.generate([prompt], Knobs(depth, 1), NEW_TOKENS, seed=seed, references=refs):
        pass
    return eng.totals.tokens, eng.totals.wall_s


def measured_speedup(pair, prompt: list[int], depth: int, refs: dict) -> float:
    """Speculative ÷ plain decode tokens per second, over SEEDS rows each, interleaved."""
    plain, spec = [0, 0.0], [0, 0.0]
    for seed in range(SEEDS):
        for acc, k in ((plain, 0), (spec, depth)):
            n, secs = run(pair, prompt, k, refs, seed)
            acc[0], acc[1] = acc[0] + n, acc[1] + secs
    return (spec[0] / spec[1]) / (plain[0] / plain[1])


def main(out: str | None) -> None:
    torch.set_num_threads(1)            # as the app: every core but one on a 2-core machine
    base = load_pair("smollm2-135m-offline", "ngram", compile="static")
    prompt = encode_prompt(base.tokenizer, DEFAULT_PROMPT)
    t = base.target
    curve = measure_curve(t.model, t.device, t.dtype, base.target_cache, context=len(prompt) + NEW_TOKENS // 2,
                          sizes=tuple(range(1, 10)) + (16,), rounds=5)
    print("pass ms by tokens:", dict(zip(curve.tokens, (round(1000 * s, 2) for s in curve.seconds))))
    rows = []
    for rate in (0.5, 0.9):
        pair = base.with_synthetic(rate)
        refs, _ = reference_run(pair.engine(), [prompt], 1, NEW_TOKENS)
        run(pair, prompt, 4, refs, 0)                           # warm-up
        for depth in (2, 4, 8):
            predicted = expected_tokens_per_pass(rate, depth) * curve.at(1) / curve.at(depth + 1)
            measured = measured_speedup(pair, prompt, depth, refs)
            rows.append({"A": rate, "k": depth, "predicted": round(predicted, 3), "measured": round(measured, 3),
                         "measured_over_predicted": round(measured / predicted, 3)})
            print(rows[-1], flush=True)
    if out:
        Path(out).write_text(json.dumps({"curve_s": dict(zip(curve.tokens, curve.seconds)), "rows": rows}, indent=1))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="scripts/dial-theory.py", description=__doc__.splitlines()[0])
    parser.add_argument("out", nargs="?", type=out_file, help="also write the curve and rows as JSON here")
    main(parser.parse_args().out)
