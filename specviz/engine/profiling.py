"""Warm-up profiles for adaptive verification: what a pass costs on this machine before any step ran.

The target's pass by tokens stands for the verify cost; a model draft's pass by rows (one token per row)
for the draft cost. `Budget` starts from them and scales them to the steps it then observes.
"""
from __future__ import annotations

from specviz.engine.costs import monotone
from specviz.hardware.device import measure_latency

SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
QUICK_SIZES = (1, 2, 4, 8, 16, 32, 64)    # the lesson's profile: larger passes extend along the last slope


def verify_profile(model, device, dtype, new_cache=None, context: int = 64,
                   sizes: tuple[int, ...] = SIZES, quick: bool = False) -> dict[int, float]:
    """Median seconds of a forward pass by tokens per pass (the knee measurement's curve, short).
    `quick` (the lesson, which must fit a minute on a 2-core CPU): 3 samples a size on one cache."""
    secs = measure_latency(model, list(sizes), context, device, dtype, repeats=3 if quick else 5,
                           new_cache=new_cache, one_cache=quick)
    return dict(zip(sizes, monotone(list(sizes), secs)))


def pair_profiles(pair, context: int = 64, quick: bool = False) -> tuple[dict[int, float], dict[int, float] | None]:
    """The target's verify cost and, for a draft that pays a forward pass per position, that pass's cost
    (None for a free draft, or where the draft cannot be timed on its own)."""
    t = pair.target
    sizes = QUICK_SIZES if quick else SIZES
    verify = verify_profile(t.model, t.device, t.dtype, pair.target_cache, context, sizes, quick)
    drafter = pair.make_drafter()
    if drafter.free:
        return verify, None
    try:
        return verify, verify_profile(drafter.model, t.device, t.dtype, drafter.cache_factory, context, sizes, quick)
    except Exception:         # a layer-skip view may not run outside its own cache: learn it online
        return verify, None
