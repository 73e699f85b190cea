"""Start the real app (python app.py) on a free port for API and browser tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_started: list[subprocess.Popen] = []     # every app a test started, for the end-of-session sweep


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_app(target: str, draft: str, log: Path, extra_env: dict | None = None):
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT), "GRADIO_ANALYTICS_ENABLED": "False",
           **(extra_env or {})}
    args = [sys.executable, str(ROOT / "app.py"), "--port", str(port)]
    if target:
        args += ["--target", target, "--draft", draft]
    # its own process group: stopping the app also stops whatever it forked (a ZeroGPU worker)
    proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                            start_new_session=True)
    _started.append(proc)
    url = f"http://127.0.0.1:{port}/"
    deadline = time.time() + 120
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"app exited early:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"app did not start:\n{log.read_text()[-2000:]}")


def stop_app(proc) -> None:
    """Stop the app and everything in its process group."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue
    try:                           # forked children outlive their parent's exit: sweep the group
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def stop_all() -> None:
    """End of the test session: nothing a test started keeps running."""
    for proc in _started:
        stop_app(proc)


def client(url, timeout: float | None = None):
    from gradio_client import Client

    if timeout is None:
        return Client(url, verbose=False)
    return Client(url, verbose=False, httpx_kwargs={"timeout": timeout})


def pair_label(c) -> str:
    """The default pair's label, read from the served API."""
    params = c.view_api(return_format="dict", print_info=False)["named_endpoints"]["/generate"]["parameters"]
    return next(p for p in params if p["parameter_name"] == "pair_label")["parameter_default"]


def unexpected_tracebacks(log_text: str) -> list[str]:
    """Tracebacks in an app log that end in anything but a gr.Error (gradio logs the human messages
    it shows, too; those are expected, anything else is a bug)."""
    bad = []
    for block in log_text.split("Traceback (most recent call last):")[1:]:
        last = [ln for ln in block.splitlines() if ln and not ln.startswith((" ", "\t"))]
        if not last or not last[0].startswith("gradio.exceptions.Error"):
            bad.append(block[-600:])
    return bad
