"""Start a local vLLM server for a SpecViz pair, wait until it is healthy, stop it with SpecViz.

vLLM lives in its own venv (`.venv-vllm`, `bash scripts/vllm-setup`): its pins differ from ours. The
`vllm` console script of the CPU distribution looks itself up under the wrong name, so the server is
started as `python -m vllm.entrypoints.openai.api_server`.

No orphans: the server runs in its own process group (vLLM forks an engine core process), which is
killed as a whole by `stop()`, at interpreter exit (atexit) and on SIGTERM/SIGINT.
"""
from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from specviz.lessons import Said
from specviz.pairs.models import resolve_ref
from specviz.vllm.client import VllmClient, VllmError

ROOT = Path(__file__).resolve().parents[2]
VENV = ROOT / ".venv-vllm"
START_TIMEOUT_S = 900          # measured on 2 cores: first start ~140 s (compiles), later ~90 s; 5+ min when loaded
NGRAM_MAX, NGRAM_MIN = 3, 1    # our NgramDrafter looks up the last 3, then 2, then 1 tokens
KV_CACHE_GB = "2"              # VLLM_CPU_KVCACHE_SPACE: the CPU build's KV cache, in GiB


@dataclass(frozen=True)
class LaunchSpec:
    """What to serve: a SpecViz pair (target reference, draft reference) at one depth."""

    target: str
    draft: str
    depth: int
    port: int
    host: str = "127.0.0.1"
    max_model_len: int = 4096
    schedule: tuple[tuple[int, int, int], ...] = ()   # num_speculative_tokens_per_batch_size rows
    served_name: str | None = None                    # default: the model directory
    eager: bool = False                               # --enforce-eager: no compile at start (tests start faster)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def python_path(venv: Path = VENV) -> Path:
    return venv / "bin" / "python"


def vllm_installed(venv: Path = VENV) -> bool:
    return python_path(venv).is_file()


def require_installed(venv: Path = VENV) -> None:
    """Refuse, before anything loads or starts, where vLLM's venv is missing."""
    if not vllm_installed(venv):
        raise VllmError(Said("errors.vllm.not_installed", venv=str(venv)))


def model_dir(ref: str) -> str:
    """The directory vLLM reads for a model reference (the offline alias → our safetensors copy)."""

    return resolve_ref(ref)


def speculative_config(draft: str, depth: int, schedule=()) -> dict | None:
    """SpecViz's draft reference → vLLM's --speculative-config (None: no speculation)."""
    if depth <= 0:
        return None
    if draft == "ngram":
        cfg = {"method": "ngram", "num_speculative_tokens": depth,
               "prompt_lookup_max": NGRAM_MAX, "prompt_lookup_min": NGRAM_MIN}
    elif draft.startswith("layerskip"):
        raise VllmError(Said("errors.vllm.no_layerskip", draft=draft))
    elif draft.startswith("synthetic"):
        raise VllmError(Said("errors.vllm.no_synthetic", draft=draft))
    else:
        cfg = {"method": "draft_model", "model": model_dir(draft), "num_speculative_tokens": depth}
    if schedule:
        cfg["num_speculative_tokens_per_batch_size"] = [list(r) for r in schedule]
    return cfg


def server_argv(spec: LaunchSpec, model: str, python: Path | None = None) -> list[str]:
    """The command line of the server (pure: tested without vLLM)."""
    argv = [str(python or python_path()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", model, "--host", spec.host, "--port", str(spec.port),
            "--dtype", "float32", "--max-model-len", str(spec.max_model_len),
            "--served-model-name", spec.served_name or model, "--disable-uvicorn-access-log"]
    if spec.eager:
        argv.append("--enforce-eager")
    cfg = speculative_config(spec.draft, spec.depth, spec.schedule)
    if cfg is not None:
        argv += ["--speculative-config", json.dumps(cfg),
                 "--per-request-spec-decode-metrics", "detailed"]
    return argv


def server_env(base: dict | None = None) -> dict:
    env = dict(os.environ if base is None else base)
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", KV_CACHE_GB)
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONUNBUFFERED"] = "1"      # the log shows progress while we wait
    env.pop("PYTHONPATH", None)        # our packages must not shadow vLLM's pins
    return env


class VllmServer:
    """One launched server. `start()` blocks until healthy (calling `progress(line)` as it waits)."""

    def __init__(self, spec: LaunchSpec, venv: Path = VENV):
        self.spec, self.venv = spec, venv
        self.proc: subprocess.Popen | None = None
        self.log_path: Path | None = None
        self._lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, progress: Callable[[str], None] | None = None, timeout_s: float = START_TIMEOUT_S) -> "VllmServer":
        with self._lock:
            if self.alive():
                return self
            require_installed(self.venv)
            argv = server_argv(self.spec, model_dir(self.spec.target), python_path(self.venv))
            fd, path = tempfile.mkstemp(prefix=f"specviz-vllm-{self.spec.port}-", suffix=".log")
            self.log_path = Path(path)
            with os.fdopen(fd, "wb") as log:
                # its own session = its own process group: stop() kills the engine core it forks too; run from
                # its venv, where no stray .py sits: `python -m` imports the working folder first, and a
                # csv.py in a shared /tmp would shadow the standard library
                self.proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=server_env(),
                                             start_new_session=True, cwd=str(self.venv))
            _register(self)
        self._wait_healthy(progress, timeout_s)
        return self

    def _wait_healthy(self, progress, timeout_s: float) -> None:
        client, t0, last = VllmClient(self.url, timeout_s=5), time.monotonic(), -1
        while True:
            waited = int(time.monotonic() - t0)
            if not self.alive():
                raise VllmError(Said("errors.vllm.exited", code=self.proc.returncode, line=self.last_log_line()))
            if client.healthy():
                if progress:
                    progress(f"vLLM server on port {self.spec.port} healthy after {waited} s")
                return
            if waited >= timeout_s:
                self.stop()
                raise VllmError(Said("errors.vllm.not_healthy", seconds=timeout_s, log=str(self.log_path)))
            if progress and waited // 10 != last:
                last = waited // 10
                progress(f"starting vLLM on port {self.spec.port}… {waited} s ({self.last_log_line()[:100]})")
            time.sleep(1.0)

    def last_log_line(self) -> str:
        try:
            lines = [ln for ln in self.log_path.read_text(errors="replace").splitlines() if ln.strip()]
            return lines[-1].strip() if lines else ""
        except (OSError, AttributeError):
            return ""

    def stop(self) -> None:
        """Kill the server's whole process group (TERM, then KILL after 10 s); safe to call twice."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            _forget(self)
            return
        for sig, wait_s in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(wait_s)
                break
            except subprocess.TimeoutExpired:
                continue
        _kill_group_leftovers(proc.pid)
        _forget(self)


def _kill_group_leftovers(pgid: int) -> None:
    """The leader may be gone while a forked child of its group lives on: kill the group once more."""
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


# --- every launched server dies with this process ---------------------------------------------------------
_servers: list[VllmServer] = []
_registry_lock = threading.Lock()
_hooks_installed = False


def _register(server: VllmServer) -> None:
    global _hooks_installed
    with _registry_lock:
        _servers.append(server)
        if _hooks_installed:
            return
        _hooks_installed = True
    atexit.register(stop_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous = signal.getsignal(sig)
            signal.signal(sig, _on_signal(previous))


def _forget(server: VllmServer) -> None:
    with _registry_lock:
        if server in _servers:
            _servers.remove(server)


def _on_signal(previous):
    def handler(signum, frame):
        stop_all()
        if callable(previous):
            previous(signum, frame)
        else:
            sys.exit(128 + signum)
    return handler


def stop_all() -> None:
    with _registry_lock:
        servers = list(_servers)
    for s in servers:
        s.stop()
