"""The error boundary (specviz.ui.errors): every kind of handler keeps its kind, refusals pass as they are
with one log line, anything else becomes a sentence in the user's language with its traceback logged."""
from __future__ import annotations

import asyncio
import inspect
import logging

import gradio as gr
import pytest

from specviz.limits import LimitError, brief
from specviz.ui.errors import guard


def _lang(session):
    return "fa" if session == "persian-tab" else "en"


class Req(gr.Request):
    def __init__(self, session):
        super().__init__()
        self.session_hash = session


def plain(x, request: gr.Request = None):
    if x == "limit":
        raise LimitError("batch size must be from 1 to 4; 9 is out of range")
    if x == "bug":
        raise KeyError("oops")
    return x


def gen(x, request: gr.Request = None):
    yield "first"
    plain(x, request)
    yield "second"


async def coro(x, request: gr.Request = None):
    return plain(x, request)


async def agen(x, request: gr.Request = None):
    yield "first"
    plain(x, request)


def run(fn, *args):
    """Call any kind of handler to the end; what it returned/yielded last."""
    out = fn(*args)
    if inspect.isasyncgen(out):
        async def drain():
            return [v async for v in out]
        return asyncio.run(drain())[-1]
    if inspect.iscoroutine(out):
        return asyncio.run(out)
    if inspect.isgenerator(out):
        return list(out)[-1]
    return out


@pytest.mark.parametrize("fn", [plain, gen, coro, agen], ids=["plain", "generator", "coroutine", "async-gen"])
def test_guard_keeps_the_kind_and_turns_errors_into_sentences(fn, caplog):
    g = guard(fn, "test", _lang)
    for check in (inspect.isgeneratorfunction, inspect.iscoroutinefunction, inspect.isasyncgenfunction):
        assert check(g) == check(fn)
    assert inspect.signature(g) == inspect.signature(fn)        # gradio reads the parameters from it
    assert run(g, "ok", Req("a")) in ("ok", "second", "first")
    caplog.set_level(logging.INFO, logger="specviz.app")
    with pytest.raises(gr.Error) as refused:
        run(g, "limit", Req("a"))
    assert "out of range" in refused.value.message and not refused.value.print_exception
    assert sum("refused" in r.message for r in caplog.records) == 1 and not any(r.exc_info for r in caplog.records)
    caplog.clear()
    with pytest.raises(gr.Error) as bug:
        run(g, "bug", Req("a"))
    assert "Something unexpected went wrong" in bug.value.message and not bug.value.print_exception
    assert any(r.exc_info for r in caplog.records)               # the traceback is in the log, once
    with pytest.raises(gr.Error) as bug_fa:
        run(g, "bug", Req("persian-tab"))
    assert "خطای غیرمنتظره" in bug_fa.value.message               # in the user's language


def test_recursion_and_memory_errors_are_named():
    def deep(request: gr.Request = None):
        raise RecursionError("maximum recursion depth exceeded")

    def oom(request: gr.Request = None):
        raise MemoryError()
    with pytest.raises(gr.Error, match="nested too deeply"):
        guard(deep, "t", _lang)(Req("a"))
    with pytest.raises(gr.Error, match="ran out of memory"):
        guard(oom, "t", _lang)(Req("a"))


def test_values_are_quoted_briefly():
    assert brief(1e308) == "1e+308" and brief(10**12) == "1e+12"
    assert brief(10**5000) == "a number of about 5001 digits"
    assert len(brief("x" * 10_000)) <= 40 and brief("x" * 10_000).endswith("…")
    assert brief(None) == "None" and brief([1, 2]) == "[1, 2]"
    from specviz.limits import check_request
    with pytest.raises(LimitError, match="about 5001 digits"):
        check_request(10**5000, 1, 0, 8)


def test_a_number_outside_its_bounds_is_refused_by_its_bounds_in_the_readers_language():
    """Gradio refuses a slider's or number box's value outside its bounds before any handler runs: the
    sentence gives the bounds and the label, not "must be a number"."""
    from types import SimpleNamespace

    from specviz import lessons
    from specviz.ui.errors import input_sentence

    batch = gr.Slider(1, 16, value=1, step=1, label="Batch size (rows)")
    bandwidth = gr.Number(3.35, minimum=0.001, label="Custom GPU bandwidth (TB/s)")
    fn = SimpleNamespace(inputs=[batch, bandwidth], fn=lambda v, bw: None)
    said = input_sentence(fn, 0, 999, ValueError(), name="Batch size (rows)")
    assert said == "'Batch size (rows)' must be from 1 to 16, not 999."
    assert input_sentence(fn, 1, -5, ValueError(), name="bw") == "'bw' must be at least 0.001, not -5."
    # the page's own event: its slider has already moved to the bound, and the sentence says so (a number
    # box does not move; an API call moves nothing)
    page = SimpleNamespace(inputs=[batch, bandwidth], fn=lambda v, bw: None, api_visibility="private")
    assert input_sentence(page, 0, 999, ValueError(), name="B") == "'B' must be from 1 to 16, not 999: the slider is set to 16 instead."
    assert str(input_sentence(page, 0, 0, ValueError(), name="B")).endswith("set to 1 instead.")
    assert input_sentence(page, 1, -5, ValueError(), name="bw") == "'bw' must be at least 0.001, not -5."
    persian = lessons.say("fa", input_sentence(fn, 0, 0, ValueError(), name=lessons.Key("app.label_batch_size")))
    assert "باید از" in persian and lessons.text("fa", "app.label_batch_size") in persian
    # inside its bounds, or not a number at all: the kind it must be
    assert "must be a number" in input_sentence(fn, 0, "two", ValueError())
    assert "must be a number" in input_sentence(fn, 0, float("nan"), ValueError())
