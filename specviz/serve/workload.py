"""The class workload, wired once: one shared scheduler per pair, and many users submitting at once.

The app's runner (`specviz.serve.runner.Schedulers`) and the CLI's class benchmarks (`bench-classroom`,
`bench-vllm`, `frontier`) build their shared scheduler here, so a benchmark measures the engine the class
uses, configured the same way. `class_reference` is a synthetic draft's reference for a class.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from specviz.engine.request import Knobs, Request, RunTotals
from specviz.limits import Limits
from specviz.serve.gate import DeviceGate
from specviz.serve.scheduler import Scheduler


def shared_scheduler(pair, limits: Limits = Limits(), gate: DeviceGate | None = None, ignore_eos: bool = False,
                     free_memory=None, name: str | None = None, budget=None, built=None) -> Scheduler:
    """The pair's shared batch. `ignore_eos`: every row decodes exactly its max new tokens (benchmarks
    compare engines token for token, so neither may stop early). `budget`: adaptive verification's, for
    every engine the scheduler builds (a benchmark keeps one across its cells). `built(engine)`: told of
    every engine the scheduler builds, in its thread (a benchmark reads its step counters afterwards)."""
    def make_engine():
        eng = pair.engine(budget=budget, eos_ids=[] if ignore_eos else None)
        if built is not None:
            built(eng)
        return eng
    kw = {} if free_memory is None else {"free_memory": free_memory}
    plain = not ignore_eos and budget is None and built is None
    return Scheduler(pair.engine if plain else make_engine, limits, gate or DeviceGate(), pair.target_spec,
                     pair.draft_spec, name=name or "pair", **kw)


@dataclass
class UserRun:
    """What one user saw, timed from the common start."""

    first_s: float | None          # the first step's tokens arrived
    done_s: float                  # the request finished
    outputs: list[int]             # row 0's generated ids
    totals: RunTotals | None
    error: str | None


def users_at_once(sched: Scheduler, requests: list[Request], together: bool = False) -> tuple[float, list[UserRun]]:
    """Submit every request at the same moment, each user reading its updates in its own thread; returns
    the wall time until the last one finished and each user's run. Each user submits from its own thread,
    as browsers do (they arrive within milliseconds, and the loop may admit them in two waves); with
    `together` the class is handed over in one call (`Scheduler.submit_all`), so it is admitted in one
    wave: a comparison of arms on our own engine is then not moved by when each thread got to run."""
    res: list[UserRun | None] = [None] * len(requests)
    tickets: list = [None] * len(requests)

    def user(i: int, t0: float) -> None:
        first, last = None, None
        ticket = tickets[i] or sched.submit(requests[i])
        for upd in ticket.updates():
            if upd.events and first is None:
                first = time.perf_counter() - t0
            last = upd
        outs = (last.outputs or {}) if last is not None else {}
        res[i] = UserRun(first, time.perf_counter() - t0, outs.get(0, next(iter(outs.values()), [])),
                         None if last is None else last.totals, None if last is None else last.error)
    t0 = time.perf_counter()
    if together:
        tickets[:] = sched.submit_all(requests)
    threads = [threading.Thread(target=user, args=(i, t0), daemon=True) for i in range(len(requests))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, res


def class_reference(sched: Scheduler, prompts: list[list[int]],
                    max_new: int) -> tuple[dict[tuple[int, ...], tuple[int, ...]], float]:
    """A synthetic draft's reference for a class (`specviz.engine.synthetic`): one class at depth 0 through
    `sched`, a one-row request per prompt (one per user), handed over in one call as a timed class is.

    Pass the scheduler the run uses, or one built the same way: its engines decide where a row ends, so the
    reference stops at EOS exactly where the run's rows do (`shared_scheduler(ignore_eos=...)`), and it is
    decoded by the same forward path. Returns (prompt → the target's own continuation, seconds the class
    took): the seconds are the dial's price, reported apart and kept out of every timed figure. Then give
    each user's request `references=` this dict and its own `seed` (the user's index), so every arm draws
    the same coins. A class larger than the scheduler's batch waits in its queue (`Busy` past it); a request
    the scheduler failed raises RuntimeError with its sentence."""
    requests = [Request([p], Knobs(0, 1), max_new, seed=i) for i, p in enumerate(prompts)]
    secs, runs = users_at_once(sched, requests, together=True)
    errors = [r.error for r in runs if r.error]
    if errors:
        raise RuntimeError(f"the shared scheduler failed a reference request: {errors[0]}")
    refs: dict[tuple[int, ...], tuple[int, ...]] = {}
    for p, r in zip(prompts, runs):
        refs.setdefault(tuple(p), tuple(r.outputs))
    return refs, secs
