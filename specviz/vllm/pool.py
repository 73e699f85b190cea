"""Launched vLLM servers that follow the depth slider: one server per k, started on demand.

A vLLM server has one k (`num_speculative_tokens` is fixed at start). Where SpecViz launched the servers
(`app.py --vllm-launch`), the pair's entry is a `LaunchedPool`: a Run at depth k goes to the server for
k, which is started the first time some student asks for k (about 2 minutes on a small CPU; that Run gets a
sentence naming the depths ready now). Servers are kept while memory allows: before a new one starts, the
least recently used idle servers are stopped until MemAvailable leaves room for it (and at most
MAX_SERVERS run at once). A server that is streaming a Run is never stopped for another.
Shared by every session: the table of servers is changed only under the pool's lock.
"""
from __future__ import annotations

import threading
import time
from typing import Callable

from specviz.lessons import Listed, Said
from specviz.vllm.backend import Endpoint, pair_label
from specviz.vllm.client import VllmError

SERVER_GIB = 4.0        # one CPU server of the 135M pair: its KV cache (2 GiB) + weights + runtime, measured ~3.5
MAX_SERVERS = 3         # on a small CPU every idle server still holds memory and a polling thread


def mem_available_gib() -> float | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2 ** 20
    except (OSError, ValueError, IndexError):
        pass
    return None


class LaunchedPool:
    """The launched servers of one pair, by depth. `endpoint_for(k)` is what a Run uses."""

    def __init__(self, target: str, draft: str, first_depth: int, launch: Callable[[int], Endpoint],
                 memory: Callable[[], float | None] = mem_available_gib, max_servers: int = MAX_SERVERS):
        self.target, self.draft = target, draft
        method = "n-gram" if draft == "ngram" else draft
        self.label = pair_label(target, method, None)          # k follows the depth slider
        self.model_ref = target
        self._launch, self._memory, self._max = launch, memory, max_servers
        self._lock = threading.Lock()
        # the operator asked for the first server: it starts whatever the memory says
        self.current = launch(first_depth)
        self._servers: dict[int, Endpoint] = {first_depth: self.current}
        self._used: dict[int, float] = {first_depth: time.monotonic()}

    def depths(self) -> list[int]:
        with self._lock:
            return sorted(k for k, ep in self._servers.items() if ep.status.state == "ready")

    def endpoint_for(self, k: int) -> Endpoint:
        """The server for depth k, launching it (and making room) when there is none."""
        stop: list[Endpoint] = []
        with self._lock:
            ep = self._servers.get(k)
            if ep is None or ep.status.state == "failed":
                stop = self._make_room(exclude=k)
                ep = self._servers[k] = self._launch(k)
            self._used[k] = time.monotonic()
            self.current = ep
        for old in stop:                       # outside the lock: stopping takes seconds
            old.close()
        return ep

    def _make_room(self, exclude: int) -> list[Endpoint]:
        """Idle servers to stop (least recently used first) so one more fits; a sentence when it cannot."""
        idle = sorted((k for k, ep in self._servers.items() if k != exclude and ep.runs == 0),
                      key=lambda k: self._used.get(k, 0.0))
        victims: list[int] = []
        while idle and (len(self._servers) - len(victims) >= self._max or not self._room(len(victims))):
            victims.append(idle.pop(0))
        if len(self._servers) - len(victims) >= self._max:
            raise VllmError(Said("errors.vllm.servers_busy", n=len(self._servers)))
        if not self._room(len(victims)):
            raise VllmError(Said("errors.vllm.no_memory", free=self._memory(), need=SERVER_GIB))
        out = []
        for k in victims:
            out.append(self._servers.pop(k))
            self._used.pop(k, None)
        return out

    def _room(self, freed: int) -> bool:
        avail = self._memory()
        return avail is None or avail + freed * SERVER_GIB >= SERVER_GIB * 1.5

    def starting_sentence(self, k: int, ep: Endpoint) -> Said:
        ready = [d for d in self.depths() if d != k]
        waited = int(time.monotonic() - ep._started_at)
        if ready:
            return Said("errors.vllm.starting_ready", k=k, waited=waited, ready=Listed(map(str, ready)))
        return Said("errors.vllm.starting", k=k, waited=waited)

    def close(self) -> None:
        with self._lock:
            servers = list(self._servers.values())
            self._servers.clear()
        for ep in servers:
            ep.close()
