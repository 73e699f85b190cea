"""The lesson's chapters: each experiment a module here, the list in lesson order in `registry.py`.

The list is imported at its first use (`specviz.chapters.CHAPTERS`), not with the package: the chapters
draw with plotly, and the CLI's measurements that share their cells (`frontier`) run on a bare GPU box
with torch and transformers only.
"""
from __future__ import annotations

from specviz.chapters.base import Chapter, Context, Result

_REGISTRY = ("CHAPTERS", "KEYS", "BY_KEY")


def __getattr__(name: str):
    if name in _REGISTRY:
        from specviz.chapters import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'specviz.chapters' has no attribute {name!r}")


__all__ = ["CHAPTERS", "KEYS", "BY_KEY", "Chapter", "Context", "Result"]
