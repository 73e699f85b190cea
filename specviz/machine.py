"""This machine's identity and SpecViz's cache folder: the two facts that measurements are filed under.

No torch and no other SpecViz import, so the fast path, the hardware module and the model loader can all
ask it without importing each other.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path


def cache_root() -> Path:
    """Where SpecViz keeps what it measured or built (peaks, layouts, kernels, gguf conversions):
    `SPECVIZ_CACHE`, else the user cache folder."""
    env = os.environ.get("SPECVIZ_CACHE")
    if env:
        return Path(env)
    from platformdirs import user_cache_dir  # imported here: only the first caller pays for it

    return Path(user_cache_dir("specviz"))


def cpu_model() -> str:
    """The CPU's model name (a VM image, and its cache, can move to another kind of CPU under one host name)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith(("model name", "cpu model", "hardware")):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()
