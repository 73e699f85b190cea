"""Torch modes that survive a generator moving between threads.

`torch.inference_mode()`, `torch.no_grad()` and `torch.set_grad_enabled()` are thread-local. Gradio
resumes a streaming handler's generator on whichever worker thread is free, so a `with
torch.inference_mode():` that spans a `yield` is silently off after the first resumption on another
thread: tensors made there carry autograd history (a cache of them then refuses `copy.deepcopy`). The
lesson's breadth-vs-depth chapter failed in class exactly so.

The rule in this package: never hold a torch mode across a `yield`. A generator that needs one is
decorated with `inference_steps`, which enters the mode around each resumption, in the thread that
resumes it. (tests/test_threads.py checks the rule on the source and the behaviour on every chapter.)
"""
from __future__ import annotations

import functools
from typing import Callable, Iterator, TypeVar

T = TypeVar("T")


def inference_steps(gen_fn: Callable[..., Iterator[T]]) -> Callable[..., Iterator[T]]:
    """Run every resumption of the generator (its code between two yields) under inference mode."""
    @functools.wraps(gen_fn)
    def wrapper(*args, **kwargs):
        # on first use: torch is slow to import
        import torch

        inner = gen_fn(*args, **kwargs)
        try:
            while True:
                with torch.inference_mode():
                    try:
                        item = next(inner)
                    except StopIteration as stop:
                        return stop.value
                yield item
        finally:
            with torch.inference_mode():        # its own finally blocks may touch tensors too
                inner.close()
    return wrapper
