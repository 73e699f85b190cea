"""The vLLM servers an app offers as pairs (operator's choice only: `--vllm-url`, `--vllm-launch`).

An `Endpoint` is one server: its URL, what it serves (read from /v1/models, never assumed), its k (read
from the per-request metrics of a two-token probe), a tokenizer to encode prompts and draw tokens (from
the served model's directory, or our loader for a launched pair), and a poller that reads /metrics once
a second into the latest `Snapshot` and its `Window` (running batch, waiting, tokens/s, acceptance).
Shared by every session: its fields are set by one thread (start-up, the poller) and only read elsewhere.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass

from specviz.lessons import Said
from specviz.vllm import metrics
from specviz.vllm.client import ServedModel, VllmClient, VllmError
from specviz.vllm.launcher import LaunchSpec, VllmServer

log = logging.getLogger("specviz.vllm")
POLL_S = 1.0


def pair_label(model: str, method: str, k: int | None) -> str:
    """Pair labels of vLLM entries begin with `vLLM` (outside checks rely on it)."""
    name = os.path.basename(model.rstrip("/")) or model
    if method == "none" or k == 0:
        return Said("pairs.vllm_plain", name=name)
    if k is None:                    # launched servers: k follows the depth slider
        return Said("pairs.vllm_follows", name=name, method=method)
    return Said("pairs.vllm_fixed", name=name, method=method, k=k)


@dataclass(frozen=True)
class Status:
    state: str            # "starting" | "ready" | "failed"
    note: str = ""


class Endpoint:
    def __init__(self, url: str | None, label: str, method: str, k: int | None,
                 server: VllmServer | None = None, target_ref: str | None = None):
        self.url, self.label, self.method, self.k = url, label, method, k
        self.server, self.target_ref = server, target_ref
        self.served: ServedModel | None = None
        self.status = Status("starting" if server else "ready")
        self.latest: metrics.Snapshot | None = None
        self.window: metrics.Window | None = None
        self.runs = 0                      # SpecViz Runs streaming on it now (users through this app)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._started_at = time.monotonic()

    # --- start-up ---------------------------------------------------------------------------------------
    @classmethod
    def from_url(cls, url: str, model: str | None = None) -> "Endpoint":
        """A server the operator runs. Read what it serves now; if it is down, the entry stays and a
        Run says so (it may come up later)."""
        client = VllmClient(url, timeout_s=10)
        try:
            served = client.model(model)
            k = probe_k(client, served.name)
            ep = cls(client.url, pair_label(served.name, "speculative" if k else "none", k),
                     "speculative" if k else "none", k)
            ep.served = served
        except VllmError as exc:
            log.warning("vLLM at %s: %s", url, exc)
            ep = cls(client.url, Said("pairs.vllm_unreachable"), "?", None)
        ep.start_polling()
        return ep

    @classmethod
    def launch(cls, target: str, draft: str, depth: int, port: int, eager: bool = False) -> "Endpoint":
        """A server SpecViz starts in the background (~1.5-2.5 min on 2 cores) and stops at exit."""
        server = VllmServer(LaunchSpec(target, draft, depth, port, served_name=target, eager=eager))
        ep = cls(server.url, pair_label(target, "n-gram" if draft == "ngram" else draft, depth),
                 draft, depth, server, target)
        threading.Thread(target=ep._start_server, name=f"specviz-vllm-launch-{port}", daemon=True).start()
        return ep

    def _start_server(self) -> None:
        try:
            self.server.start(progress=lambda line: log.info("%s", line))
            self.served = VllmClient(self.url).model()
            self.status = Status("ready")
        except VllmError as exc:
            log.warning("vLLM launch failed: %s", exc)
            self.status = Status("failed", exc.args[0] if len(exc.args) == 1 else str(exc))   # keeps a Said
            return
        self.start_polling()

    def restart(self) -> None:
        """Start a launched server again after it died (a Run names the cause and offers this)."""
        if self.server is None or self.status.state == "starting":
            return
        self.status, self._started_at = Status("starting"), time.monotonic()
        threading.Thread(target=self._start_server, name="specviz-vllm-restart", daemon=True).start()

    # --- what a Run needs -----------------------------------------------------------------------------
    def client(self) -> VllmClient:
        return VllmClient(self.url, timeout_s=120)

    def ready_model(self) -> ServedModel:
        """The served model, or a sentence saying why a Run cannot start now."""
        if self.status.state == "starting":
            waited = int(time.monotonic() - self._started_at)
            raise VllmError(Said("errors.vllm.still_starting", waited=waited))
        if self.status.state == "failed":
            raise VllmError(Said("errors.vllm.could_not_start", note=self.status.note))
        if self.server is not None and not self.server.alive():
            self.restart()
            raise VllmError(Said("errors.vllm.restarting"))
        if self.served is None:                       # an operator's server that was down at start-up
            self.served = VllmClient(self.url, timeout_s=10).model()
        return self.served

    @property
    def model_ref(self) -> str | None:
        """A model reference our loader reads for the same model (tokenizer, the lossless check): the
        launched pair's, else the served model's directory when it is on this machine."""
        if self.target_ref:
            return self.target_ref
        root = self.served.root if self.served else None
        return root if root and os.path.isdir(root) else (self.served.name if self.served else None)

    def enter(self) -> None:
        with self._lock:
            self.runs += 1

    def leave(self) -> None:
        with self._lock:
            self.runs -= 1

    def running(self) -> float | None:
        return self.latest.running if self.latest else None

    # --- /metrics, once a second ------------------------------------------------------------------------
    def start_polling(self) -> None:
        threading.Thread(target=self._poll, name="specviz-vllm-metrics", daemon=True).start()

    def _poll(self) -> None:
        client = VllmClient(self.url, timeout_s=3)
        while not self._stop.is_set():
            try:
                snap = metrics.snapshot(client.metrics_text(), self.served.name if self.served else None)
                if self.latest is not None:
                    self.window = metrics.window(self.latest, snap)
                self.latest = snap
            except VllmError:
                self.latest = None
            self._stop.wait(POLL_S)

    def close(self) -> None:
        self._stop.set()
        if self.server is not None:
            self.server.stop()


def probe_k(client: VllmClient, model: str) -> int | None:
    """The server's k, from the per-request metrics of a two-token completion (None: no speculation,
    or the server was started without --per-request-spec-decode-metrics)."""
    out = client.complete(model, [1, 2, 3], 2)
    return int(out.spec["num_spec_tokens"]) if out.spec and out.spec.get("num_spec_tokens") else None
