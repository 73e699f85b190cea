"""How errors reach a student: a sentence in the page, never a traceback or a bare "the upstream app
raised an exception". Human errors (bad input, a model that will not load, a limit) pass through as
they are, in the student's language (`lang`: their sentences are `lessons.Said`, English by default);
anything unexpected becomes a sentence, and the traceback goes to the server log."""
from __future__ import annotations

import logging
from contextlib import contextmanager

import gradio as gr

from specviz import lessons
from specviz.limits import LimitError
from specviz.models import ModelError
from specviz.policies import PolicyError
from specviz.recordings import RecordingError

log = logging.getLogger("specviz.app")


def human(lang: str, message) -> str:
    """An exception or a message (a `lessons.Said`, a plain string) as a sentence in `lang`."""
    return lessons.say(lang, message)


def error(lang: str, key: str, /, **values) -> gr.Error:
    """A gradio message for a lesson key (`errors.*`), in `lang`."""
    return gr.Error(lessons.say(lang, lessons.Said(key, **values)))


@contextmanager
def as_human_errors(lang: str = lessons.DEFAULT_LANG):
    """Errors meant for a human become a gradio message (also inside a ZeroGPU worker, whose other
    exceptions reach the browser only as "ZeroGPU worker error")."""
    try:
        yield
    except (ModelError, LimitError, PolicyError, RecordingError) as exc:
        raise gr.Error(human(lang, exc)) from None


@contextmanager
def as_sentences(lang: str = lessons.DEFAULT_LANG):
    """Around a whole handler: human errors as they are, anything unexpected as a sentence."""
    try:
        with as_human_errors(lang):
            yield
    except gr.Error:
        raise
    except Exception as exc:
        log.exception("handler failed")
        raise error(lang, "errors.server_error", kind=type(exc).__name__) from None
