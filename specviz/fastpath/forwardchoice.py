"""auto's verdict on the graph path's forward, kept per device and model shape (`<cache>/graph-forward.json`).

auto learns which forward is faster by compiling the decoder layer and timing both one-token replays.
Where the eager forward wins, that compile bought nothing, and every later load on the device would pay
it again to learn the same thing: so an eager verdict is kept, like the layout timings, for a week (a
driver or torch changes under it) or until `specviz calibrate` forgets it. The CPU's load is not asked:
the replays are timed by the GPU's own clock, and the compile just before them keeps the CPU busy anyway.
A compiled verdict is not acted on: the compile it would save is needed to serve anyway, and the probe
beside it is what catches a compile that fails.
"""
from __future__ import annotations

import threading
import time

from specviz.hardware.device import MAX_AGE_S, machine_key, read_table, write_table
from specviz.machine import cache_root

FILE = "graph-forward.json"
_LOCK = threading.Lock()


def key(device, dtype, shape: str, backend: str) -> str:
    """What a verdict is valid for: this host, device, dtype and torch; the model's shape; the compiler."""
    return f"{machine_key(device, dtype)} | {shape} | {backend}"


def kept(k: str, now: float | None = None) -> dict | None:
    """The stored verdict for `k` when it says eager and is under a week old, else None (an unreadable
    entry included: it is timed again)."""
    with _LOCK:
        got = read_table(cache_root() / FILE).get(k)
    if not isinstance(got, dict) or got.get("forward") != "eager":
        return None
    ms, at = got.get("ms"), got.get("at")
    if not (isinstance(ms, dict) and ms and all(isinstance(v, (int, float)) for v in ms.values())):
        return None
    if not isinstance(at, (int, float)) or (now or time.time()) - at > MAX_AGE_S:
        return None
    return got


def store(k: str, forward: str, ms: dict[str, float]) -> None:
    path = cache_root() / FILE
    with _LOCK:
        table = read_table(path)
        table[k] = {"forward": forward, "ms": {n: round(v, 4) for n, v in ms.items()},
                    "date": time.strftime("%Y-%m-%d"), "at": round(time.time())}
        write_table(path, table)


def forget(device) -> None:
    """Drop every verdict taken on `device` of this host (its next load times both forwards again)."""
    path, prefix = cache_root() / FILE, machine_key(device, "").split(" | ")[:2]
    with _LOCK:
        table = read_table(path)
        gone = [k for k in table if k.split(" | ")[:2] == prefix]
        for k in gone:
            table.pop(k)
        if gone:
            write_table(path, table)


def sentence(got: dict) -> str:
    """How a kept verdict reads in the counters."""
    times = ", ".join(f"{n} {v:.3f} ms" for n, v in got["ms"].items())
    return f"auto, kept from its timing on {got.get('date', '?')}: {times} (`specviz calibrate` times again)"
