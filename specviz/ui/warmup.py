"""Waiting for the app's warm-up: while a pair's fast path times its weight layouts, a Run or a chapter
measured beside it would time the warm-up and the eager path (several times slower a token on a CPU),
so both wait for it, saying so, up to WARMUP_WAIT_S."""
from __future__ import annotations

WARMUP_WAIT_S = 180.0
WARMUP_POLL_S = 1.0


def warming(app, choice) -> bool:
    """The app is warming this pair's fast path now (False where it has no fast path to warm)."""
    fast = getattr(getattr(app, "pairs", None), "fast_status", lambda c: None)(choice)
    return fast is not None and fast.state == "warming"
