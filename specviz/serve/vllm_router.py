"""Runs on a vLLM pair: the app's runner, with pairs whose `engine` is "vllm" streamed from a vLLM server.

`VllmRouter` wraps the app's own runner: a Run on one of our pairs goes to it unchanged; a Run on a vLLM
pair becomes B concurrent streamed requests to that server (`specviz.vllm.run`), grouped into the same
`Packet`s the playground draws. "Batch now" for a vLLM pair is vLLM's own running count (/metrics).
The servers are the operator's (flags or environment), never a URL typed on the page.
"""
from __future__ import annotations

import os
import time
from typing import Iterator

from specviz.lessons import Said
from specviz.serve.catalog import PairChoice
from specviz.serve.runner import FLUSH_S, Packet, RunRequest
from specviz.serve.scheduler import BatchInfo
from specviz.vllm.backend import Endpoint
from specviz.vllm.client import VllmError
from specviz.vllm.pool import LaunchedPool
from specviz.vllm.run import VllmRun

VLLM_NOTE = Said("pairs.vllm_note")        # shown in the reader's language (specviz/lessons)


def vllm_choices(endpoints: list) -> list[PairChoice]:
    """One pair entry per server the operator named, and one per launched pool (its k follows the slider)."""
    return [PairChoice(ep.label, ep.model_ref or ep.label, "ngram", VLLM_NOTE, engine="vllm") for ep in endpoints]


def _batch_now(endpoint) -> BatchInfo:
    """What "batch now" reads for a vLLM pair: vLLM's own running and waiting counts (/metrics)."""
    ep = _current(endpoint)
    running = ep.running()
    waiting = ep.latest.waiting if ep.latest else None
    return BatchInfo(int(running or 0), ep.runs, int(waiting or 0))


def _current(ep) -> Endpoint:
    """A pool's server of the latest Run (what "batch now" shows), or the endpoint itself."""
    return ep.current if isinstance(ep, LaunchedPool) else ep


class VllmRouter:
    """The app's runner plus vLLM pairs (labels → endpoints): the same five questions a runner answers
    (control, packets, knee, ready, batch_info), each sent to vLLM or to the app's own runner."""

    def __init__(self, inner, endpoints: list):
        self.inner = inner
        self.by_label = {ep.label: ep for ep in endpoints}
        self.zero_gpu = inner.zero_gpu

    def endpoint(self, choice) -> Endpoint | LaunchedPool | None:
        if getattr(choice, "engine", "specviz") != "vllm":
            return None
        return self.by_label.get(choice.label)

    def control(self, knobs, policy, acceptance=None):
        return self.inner.control(knobs, policy, acceptance)   # sliders reach a vLLM Run through its knobs too

    def pass_curve(self, choice):
        return None if self.endpoint(choice) is not None else self.inner.pass_curve(choice)

    def recheck_curve(self, choice, seen) -> bool:
        return False if self.endpoint(choice) is not None else self.inner.recheck_curve(choice, seen)

    def batch_info(self, choice) -> BatchInfo | None:
        ep = self.endpoint(choice)
        return _batch_now(ep) if ep is not None else self.inner.batch_info(choice)

    def depth_mode(self, choice) -> tuple[str, int | None]:
        """How the depth slider relates to a pair: ("ours", None) for our engine, ("fixed", k) for a
        server someone runs (a server has one k), ("follows", None) for launched servers (one per k)."""
        ep = self.endpoint(choice)
        if ep is None:
            return "ours", None
        if isinstance(ep, LaunchedPool):
            return "follows", None
        return "fixed", ep.k

    def knee(self, choice, context, peaks):
        if self.endpoint(choice) is not None:
            raise VllmError(Said("errors.vllm.knee"))
        return self.inner.knee(choice, context, peaks)

    def ready(self, choice) -> None:
        """A sentence (VllmError) unless the vLLM pair's server can take a Run now."""
        ep = self.endpoint(choice)
        if ep is None:
            raise VllmError(Said("errors.vllm.not_configured"))
        if isinstance(ep, LaunchedPool):
            return                  # which server is ready depends on the Run's depth: the Run says (packets)
        ep.ready_model()
        if ep.model_ref is None or choice.target != ep.model_ref:
            raise VllmError(Said("errors.vllm.model_unknown"))

    def packets(self, req: RunRequest, choice, control) -> Iterator[Packet]:
        ep = self.endpoint(choice)
        if ep is None:
            return self.inner.packets(req, choice, control)
        return self._vllm_packets(ep, req, control)

    def _vllm_packets(self, ep, req: RunRequest, control) -> Iterator[Packet]:
        if isinstance(ep, LaunchedPool):          # launched servers follow the depth slider
            pool, ep = ep, ep.endpoint_for(req.depth)
            if ep.status.state == "starting":
                raise VllmError(pool.starting_sentence(req.depth, ep))
        served = ep.ready_model()                 # a sentence if it is starting, failed or unreachable
        if served.max_len and max(map(len, req.prompts)) + req.max_new > served.max_len:
            raise VllmError(Said("errors.vllm.too_long", n=req.max_new, max_len=served.max_len))
        run = VllmRun(ep.client(), served.name, [list(p) for p in req.prompts], req.batch, req.max_new,
                      req.temperature, req.seed, stop=control.knobs.stop, running=ep.running)
        ep.enter()
        try:
            pending, last = [], time.perf_counter()
            for ev in run.events():
                pending.append(ev)
                if time.perf_counter() - last >= FLUSH_S:
                    last = time.perf_counter()
                    yield Packet(list(pending), run.totals.copy(), worker_pid=os.getpid())
                    pending.clear()
        finally:
            ep.leave()
        res = run.result
        error = res.error
        if error and ep.server is not None and not ep.server.alive():
            error = Said("errors.vllm.with_stopped", error=error)
        yield Packet(pending, res.totals.copy(), final=True, stopped=res.stopped, outputs=res.outputs,
                     worker_pid=os.getpid(), error=error)



