"""Start the real app (python app.py) on a free port for API and browser tests."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


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
    proc = subprocess.Popen(args, stdout=log.open("w"), stderr=subprocess.STDOUT, env=env, cwd=ROOT)
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
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
