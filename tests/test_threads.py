"""Generators the UI streams are resumed by gradio on whichever worker thread is free. Torch's modes are
thread-local, so a mode held across a `yield` silently switches off (the breadth-vs-depth chapter failed in
class with "Only Tensors created explicitly by the user … support the deepcopy protocol"). Two checks:
the rule on the source (no torch mode spans a yield, no thread-local grad switch), and every chapter's
experiment resumed on a fresh thread at each step."""
from __future__ import annotations

import ast
import threading
from pathlib import Path

import pytest

from specviz.chapters import CHAPTERS, breadth_depth, frontier, knee, ledger, policies, race, sweep
from specviz.hardware.device import Peaks

SRC = Path(__file__).resolve().parents[1] / "specviz"
MODES = {"inference_mode", "no_grad", "enable_grad", "set_grad_enabled", "autocast", "enable_inference_mode"}


def _mode_name(expr) -> str | None:
    call = expr if isinstance(expr, ast.Call) else None
    func = call.func if call is not None else expr
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    return name if name in MODES else None


def _own_yields(node) -> bool:
    """A yield in this node's body, not counting functions defined inside it."""
    todo = list(ast.iter_child_nodes(node))
    while todo:
        n = todo.pop()
        if isinstance(n, (ast.Yield, ast.YieldFrom)):
            return True
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(n))
    return False


def mode_across_yield(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            modes = [m for m in (_mode_name(i.context_expr) for i in node.items) if m]
            if modes and _own_yields(node):
                found.append(f"line {node.lineno}: {modes[0]} spans a yield")
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Call) and \
                _mode_name(node.value.func) == "set_grad_enabled":
            found.append(f"line {node.lineno}: set_grad_enabled switches only the calling thread")
    return found


def test_the_rule_catches_the_old_bug():
    old = ("def gen():\n    with torch.inference_mode():\n        for n in ns:\n            yield n\n")
    assert mode_across_yield(old) == ["line 2: inference_mode spans a yield"]
    assert mode_across_yield("torch.set_grad_enabled(False)\n")
    ok = ("def f():\n    with torch.inference_mode():\n        x = 1\n    yield x\n"
          "def g():\n    with torch.no_grad():\n        def inner():\n            yield 1\n")
    assert mode_across_yield(ok) == []


def test_no_torch_mode_spans_a_yield_in_specviz():
    bad = {str(p.relative_to(SRC)): found for p in sorted(SRC.rglob("*.py"))
           if (found := mode_across_yield(p.read_text(encoding="utf-8")))}
    assert bad == {}


def on_fresh_threads(gen) -> list[dict]:
    """Consume a generator as gradio does: each resumption on a new thread (modes off there)."""
    out, error = [], []

    def step():
        try:
            out.append(next(gen))
        except StopIteration:
            out.append(None)
        except Exception as exc:          # reported below, with the chapter's name
            error.append(exc)
    while not error and (not out or out[-1] is not None):
        t = threading.Thread(target=step)
        t.start()
        t.join()
    assert not error, repr(error[0])
    return out[:-1]


@pytest.mark.parametrize("chapter", [c.key for c in CHAPTERS if c.run is not None])
def test_every_chapter_survives_thread_hops(make_pair, prompts, loaded, chapter, one_model_thread):
    """Each chapter runs to done with every resumption on a new thread, and every forward of the target
    ran with autograd off, on whichever thread resumed it (the weights ask for no grad, so a mode lost on
    a hop breaks nothing at once: it is seen here, before a cache of tensors with history is copied)."""
    import torch

    skip, ngram = make_pair("layerskip:1-2"), make_pair("ngram")
    peaks = Peaks("cpu", 3.0e10, 3.0e10, "float32")
    make = {"race": lambda: race.run_race(skip, prompts[1], depth=3, max_new=8),
            "knee": lambda: knee.run_knee(skip, peaks, context=16, repeats=1, cap=4),
            "breadth_depth": lambda: breadth_depth.run_breadth_depth(skip, context=16, ns=(1, 2, 4), repeats=1),
            "ledger": lambda: ledger.run_ledger(skip, prompts[1], depth=3, max_new=8),
            "sweep": lambda: sweep.run_sweep(ngram, prompts[0], batches=(1, 2), depths=(1,), max_new=4),
            "policies": lambda: policies.run_policies(skip, prompts[:2], batches=(1, 2), depth=2, max_new=4),
            "frontier": lambda: frontier.run_frontier(ngram, prompts, users=(1, 2), depths=(2,), max_new=4,
                                                      repeats=1, class_tokens=8)}[chapter]
    grad_on: list[bool] = []
    model = loaded["target"].model
    hook = model.register_forward_pre_hook(lambda module, args: grad_on.append(torch.is_grad_enabled()))
    try:
        got = on_fresh_threads(make())
    finally:
        hook.remove()
    assert got and got[-1]["done"], chapter
    assert grad_on and not any(grad_on), f"{chapter}: {sum(grad_on)} of {len(grad_on)} target passes ran with grad on"


def test_loaded_weights_never_need_grad(loaded):
    """No autograd graph on any thread: the weights themselves ask for none."""
    for name, m in loaded.items():
        assert not any(p.requires_grad for p in m.model.parameters()), name


def test_freezing_hides_what_is_alive_from_the_collector():
    """`freeze_long_lived` (called once a process's pairs are loaded and warm): the objects alive then
    leave the collector's generations, so its full collections stop walking the models. Unfrozen at the
    end, so the rest of the suite collects as usual."""
    import gc

    from specviz.serve.heap import freeze_long_lived

    kept = [[i] for i in range(100)]
    try:
        assert freeze_long_lived() >= 100       # (the count drops as frozen objects die: no equality)
        assert not any(o is kept for o in gc.get_objects())
    finally:
        gc.unfreeze()
    assert any(o is kept for o in gc.get_objects())
