"""How errors reach a student: a sentence in the page, never a traceback or a bare "the upstream app
raised an exception". Human errors (bad input, a model that will not load, a limit) pass through as
they are; anything unexpected becomes a sentence, and the traceback goes to the server log."""
from __future__ import annotations

import logging
from contextlib import contextmanager

import gradio as gr

from specviz.limits import LimitError
from specviz.models import ModelError
from specviz.policies import PolicyError

log = logging.getLogger("specviz.app")
UNEXPECTED = ("Something went wrong on the server ({kind}). The details are in the server log; "
              "please try again.")


@contextmanager
def as_human_errors():
    """Errors meant for a human become a gradio message (also inside a ZeroGPU worker, whose other
    exceptions reach the browser only as "ZeroGPU worker error")."""
    try:
        yield
    except (ModelError, LimitError, PolicyError) as exc:
        raise gr.Error(str(exc)) from None


@contextmanager
def as_sentences():
    """Around a whole handler: human errors as they are, anything unexpected as a sentence."""
    try:
        with as_human_errors():
            yield
    except gr.Error:
        raise
    except Exception as exc:
        log.exception("handler failed")
        raise gr.Error(UNEXPECTED.format(kind=type(exc).__name__)) from None
