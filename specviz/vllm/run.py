"""One Run on vLLM: B concurrent completions (the batch slider = concurrent requests, sharing vLLM's
continuous batch with every other user's) merged into one stream of step events.

Each row streams in its own thread (blocking HTTP); the consuming thread gets their chunks through a
queue and turns them into `StepEvent`s (`specviz.vllm.steps`). Stopping closes every row's connection,
which makes vLLM abort those requests. A row's failure ends the Run with that row's sentence; the
other rows are stopped.
"""
from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Iterator

from specviz.engine.request import RowStep, RunTotals, StepEvent
from specviz.lessons import Said
from specviz.vllm.client import VllmClient, VllmError
from specviz.vllm.steps import align, closing_step, live_step, reached_of, row_figures

POLL_S = 0.25


@dataclass
class RowState:
    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    chunks: list[list[int]] = field(default_factory=list)
    spec: dict | None = None
    finish: str = ""
    t_first: float | None = None
    t_end: float | None = None


@dataclass
class RunResult:
    outputs: dict[int, list[int]]
    prompts: dict[int, list[int]]
    totals: RunTotals
    error: str | None
    stopped: bool
    specs: dict[int, dict | None]
    per_step: dict[int, list[dict] | None]      # exact per-step reading per row (None: no fit)
    wall_s: float
    latencies: dict[int, float]                 # row → seconds from the Run's start to its last token


class VllmRun:
    """Stream `batch` completions at once; iterate `events()`, then read `result`."""

    def __init__(self, client: VllmClient, model: str, prompts: list[list[int]], batch: int, max_new: int,
                 temperature: float = 0.0, seed: int = 0, ignore_eos: bool = False,
                 stop: threading.Event | None = None, running=lambda: None):
        self.client, self.model = client, model
        self.rows = {i: RowState(list(prompts[i % len(prompts)])) for i in range(batch)}
        self.max_new, self.temperature, self.seed, self.ignore_eos = max_new, temperature, seed, ignore_eos
        self.stop = stop or threading.Event()
        self.running = running              # () → vLLM's running count (from /metrics), or None
        self._q: queue.Queue = queue.Queue()
        self._closed = threading.Event()    # our own: the rows' threads stop reading
        self.totals = RunTotals()
        self.result: RunResult | None = None

    def _row(self, i: int) -> None:
        st = self.rows[i]
        try:
            for ch in self.client.stream(self.model, st.prompt, self.max_new, self.temperature,
                                         self.ignore_eos, self.seed * 1_000_003 + i):
                if self._closed.is_set():
                    break            # leaving the with-block closes the connection: vLLM aborts the request
                self._q.put(("chunk", i, ch, time.perf_counter()))
            self._q.put(("end", i, None, time.perf_counter()))
        except VllmError as exc:
            self._q.put(("error", i, exc.args[0] if len(exc.args) == 1 else str(exc), time.perf_counter()))
        except Exception as exc:      # never leave the consumer waiting
            self._q.put(("error", i, Said("errors.vllm.client_failed", kind=type(exc).__name__, detail=str(exc)),
                         time.perf_counter()))

    def events(self) -> Iterator[StepEvent]:
        t0 = time.perf_counter()
        threads = [threading.Thread(target=self._row, args=(i,), daemon=True, name=f"specviz-vllm-row{i}")
                   for i in self.rows]
        for t in threads:
            t.start()
        open_rows, error, last_t, step = set(self.rows), None, t0, 0
        while open_rows:
            if self.stop.is_set():
                break
            try:
                kind, i, payload, t = self._q.get(timeout=POLL_S)
            except queue.Empty:
                continue
            st = self.rows[i]
            if kind == "error":
                error = payload
                break
            if kind == "end":
                open_rows.discard(i)
                st.t_end = t
                if st.spec is not None or st.finish:
                    rs = closing_step(i, st.spec, st.finish or "length")
                    if rs is not None:
                        step += 1
                        yield self._event(step, [rs], 0.0, 0.0, st)
                continue
            ch = payload
            st.spec = ch.spec or st.spec
            if ch.finish:
                st.finish = "eos" if ch.finish == "stop" else "length"
            if not ch.token_ids:
                continue
            first = st.t_first is None
            if first:
                st.t_first = t
            st.tokens += ch.token_ids
            st.chunks.append(list(ch.token_ids))
            rs = live_step(i, ch.token_ids, bool(ch.finish), st.finish)
            wall, last_t = t - last_t, t
            step += 1
            yield self._event(step, [rs], wall, (t - t0) if first else 0.0, st)
        self._closed.set()
        stopped = self.stop.is_set() and error is None
        self._finish(t0, error, stopped)

    def _event(self, step: int, rows: list[RowStep], wall: float, prefill: float, st: RowState) -> StepEvent:
        running = self.running()
        ev = StepEvent(step=step, batch_size=int(running) if running else len(self.rows), depth=0, policy="vllm",
                       rows=rows, draft_s=0.0, verify_s=0.0, overhead_s=0.0, wall_s=wall, prefill_s=prefill,
                       tokens_per_pass=0, context=len(st.prompt) + len(st.tokens), draft_flops=0.0,
                       draft_bytes=0.0, target_flops=0.0, target_bytes=0.0, plain_flops=0.0,
                       users=1, shared_emitted=sum(len(r.emitted) for r in rows), path="vLLM")
        self.totals.add(ev)
        return ev

    def _finish(self, t0: float, error: str | None, stopped: bool) -> None:
        """Totals from vLLM's exact per-request figures (the live reading may have merged steps)."""
        figs = {i: row_figures(len(st.tokens), st.spec) for i, st in self.rows.items()}
        if all(st.spec is not None for st in self.rows.values()):
            self.totals.drafted = sum(f.drafted for f in figs.values())
            self.totals.accepted = sum(f.accepted for f in figs.values())
        # α's denominator from the exact per-step lists, else none (alpha None): the live steps lump a row's
        # rejections into one
        reached = [reached_of(st.spec) for st in self.rows.values()]
        self.totals.reached = sum(reached) if reached and None not in reached else 0
        per_step = {}
        for i, st in self.rows.items():
            steps = align(st.chunks, st.spec) if st.spec else None
            per_step[i] = None if steps is None else [s.__dict__ for s in steps]
        self.result = RunResult(
            {i: st.tokens for i, st in self.rows.items()}, {i: st.prompt for i, st in self.rows.items()},
            self.totals, error, stopped, {i: st.spec for i, st in self.rows.items()}, per_step,
            time.perf_counter() - t0,
            {i: (st.t_end or time.perf_counter()) - t0 for i, st in self.rows.items()})


def run_all(client: VllmClient, model: str, prompts: list[list[int]], max_new: int, ignore_eos: bool = True,
            stop: threading.Event | None = None) -> RunResult:
    """Every prompt as one concurrent row, to the end (the benchmark's use)."""
    run = VllmRun(client, model, prompts, len(prompts), max_new, ignore_eos=ignore_eos, stop=stop)
    for _ in run.events():
        pass
    return run.result
