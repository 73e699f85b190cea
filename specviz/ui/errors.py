"""How errors reach a student: a sentence in the page, never a traceback or a bare "the upstream app
raised an exception".

One boundary (`guard_blocks`) wraps every event handler of the page and gradio's own input check:
- refusals (bad input, a limit, a model that will not load, a recording that is not one) become a
  `gr.Error` with their sentence, and the log keeps one line per refusal;
- anything unexpected becomes a sentence in the user's language, and the log keeps its traceback;
- values gradio itself refuses (a word where a number goes, a number outside a slider's or a number
  box's bounds, a list where text goes) are refused before our code runs, naming the input by its label
  in the reader's language, with the value quoted briefly.
Handlers may still raise `gr.Error` or the human errors themselves; the boundary only makes sure nothing
else gets through.
"""
from __future__ import annotations

import functools
import inspect
import logging
import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable

import gradio as gr

from specviz import lessons
from specviz.engine.policies import PolicyError
from specviz.limits import LimitError, brief
from specviz.pairs.models import ModelError
from specviz.serve.recordings import RecordingError

log = logging.getLogger("specviz.app")
HUMAN = (ModelError, LimitError, PolicyError, RecordingError)
GRADIO_TITLE = "Error"          # gr.Error's default title
# the session of the event gradio is processing: its input check runs before any handler (which would get
# the request), and its refusal is still written in that reader's language
_SESSION: ContextVar[str | None] = ContextVar("specviz_session", default=None)


def human(lang: str, message) -> str:
    """An exception or a message (a `lessons.Said`, a plain string) as a sentence in `lang`."""
    return lessons.say(lang, message)


def error(lang: str, key: str, /, **values) -> gr.Error:
    """A refusal for a lesson key (`errors.*`), in `lang`."""
    return refusal(lessons.say(lang, lessons.Said(key, **values)), lang=lang)


def refusal(message: str, where: str = "", lang: str = lessons.DEFAULT_LANG) -> gr.Error:
    """A refusal: shown as it is, one line in the log (gradio would print a whole traceback)."""
    log.info("refused%s: %s", f" {where}" if where else "", message[:300].replace("\n", " "))
    return gr.Error(message, print_exception=False, title=lessons.text(lang, "app.error_title"))


def as_error(exc: Exception, lang: str = lessons.DEFAULT_LANG, where: str = "") -> gr.Error:
    """Any exception as the error a user sees."""
    if isinstance(exc, gr.Error):
        # not logged twice; a keyed message (lessons.Said) in the reader's language
        if exc.print_exception:
            return refusal(human(lang, exc.message), where, lang)
        exc.message = human(lang, exc.message)
        if exc.title == GRADIO_TITLE:           # raised without one: gradio would show its English "Error"
            exc.title = lessons.text(lang, "app.error_title")
        return exc
    if isinstance(exc, HUMAN):
        return refusal(human(lang, exc), where, lang)        # its sentence in the reader's language
    if isinstance(exc, RecursionError):
        return refusal(lessons.text(lang, "errors.too_deep"), where, lang)
    if isinstance(exc, MemoryError) or "out of memory" in str(exc).lower():
        log.warning("out of memory in %s: %s", where or "a handler", str(exc)[:200])
        return gr.Error(lessons.text(lang, "errors.out_of_memory"), print_exception=False,
                        title=lessons.text(lang, "app.error_title"))
    log.error("handler %s failed", where or "?", exc_info=exc)
    return gr.Error(lessons.text(lang, "errors.server_error"), print_exception=False,
                    title=lessons.text(lang, "app.error_title"))


@contextmanager
def as_human_errors(lang: str = lessons.DEFAULT_LANG):
    """Errors meant for a human become a gradio message (also inside a ZeroGPU worker, whose other
    exceptions reach the browser only as "ZeroGPU worker error")."""
    try:
        yield
    except HUMAN as exc:
        raise refusal(human(lang, exc), lang=lang) from None


@contextmanager
def as_sentences(lang: str = lessons.DEFAULT_LANG, where: str = ""):
    """Around a block of a handler: human errors as they are, anything unexpected as a sentence."""
    try:
        yield
    except Exception as exc:
        raise as_error(exc, lang, where) from None


# --- the boundary around every handler ------------------------------------------------------------------

def _session_of(args, kwargs) -> str | None:
    for value in (*args, *kwargs.values()):
        if isinstance(value, gr.Request):
            return getattr(value, "session_hash", None)
    return None


def guard(fn: Callable, where: str, lang_of: Callable[[str | None], str]) -> Callable:
    """`fn` with every exception turned into the error a user sees; the same kind of callable (plain,
    generator, coroutine, async generator), so gradio streams and awaits it as before."""
    def fail(exc, args, kwargs):
        return as_error(exc, lang_of(_session_of(args, kwargs)), where)

    if inspect.isasyncgenfunction(fn):
        @functools.wraps(fn)
        async def agen(*args, **kwargs):
            try:
                async for item in fn(*args, **kwargs):
                    yield item
            except Exception as exc:
                raise fail(exc, args, kwargs) from None
        return agen
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def coro(*args, **kwargs):
            try:
                return await fn(*args, **kwargs)
            except Exception as exc:
                raise fail(exc, args, kwargs) from None
        return coro
    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args, **kwargs):
            try:
                return (yield from fn(*args, **kwargs))
            except Exception as exc:
                raise fail(exc, args, kwargs) from None
        return gen

    @functools.wraps(fn)
    def plain(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise fail(exc, args, kwargs) from None
    return plain


KINDS = {"Slider": "errors.kind_number", "Number": "errors.kind_number", "Textbox": "errors.kind_text",
         "Checkbox": "errors.kind_bool", "Dropdown": "errors.kind_choice", "Radio": "errors.kind_choice",
         "File": "errors.kind_file"}


def input_sentence(block_fn, index: int | None, value, exc: Exception, name=None, block=None) -> lessons.Said:
    """What was wrong with an input gradio could not read, in a sentence a person (or script) can act on
    (a Said: its English is what an API caller reads). `name` names the input (its label, else the
    handler's parameter); `block` is the component as this session has it (its bounds)."""
    if isinstance(exc, RecursionError):
        return lessons.Said("errors.too_deep")
    if index is None:
        want = len(block_fn.inputs)
        names = lessons.Listed(_param_name(block_fn, i) for i in range(want))
        if isinstance(value, list) and len(value) != want:
            return lessons.Said("errors.call_count", sent=len(value), want=want, names=names)
        return lessons.Said("errors.call_unreadable", want=want, names=names)
    block = block if block is not None else block_fn.inputs[index]
    name = name if name is not None else _param_name(block_fn, index)
    # the page's own events (private: no API) come from a slider whose box moves to its bound as it loses
    # focus, before any Run or experiment reads it
    on_page = getattr(block_fn, "api_visibility", "") == "private"
    whole = getattr(block_fn.inputs[index], "whole", False)      # the page's component (a session's copy forgets)
    outside = _outside_bounds(block, name, value, on_page) or (_off_step(block, name, value, on_page) if whole else None)
    if outside is not None:
        return outside
    if value is None and type(block).__name__ == "Slider":      # an emptied box, or "-" alone: not "None"
        return lessons.Said("errors.input_empty", name=name, lo=block.minimum, hi=block.maximum)
    kind = lessons.Key(KINDS.get(type(block).__name__, "errors.kind_value"))
    return lessons.Said("errors.bad_input", name=name, kind=kind, value=brief(value))


def _outside_bounds(block, name, value, on_page: bool = False) -> lessons.Said | None:
    """A number a slider or number box refused for its bounds (typed into the box, or sent by a script):
    the bounds, not "must be a number". `on_page`: a slider on the page moves to its nearest bound when
    its box loses focus (pressing Run does that), so the next Run uses the bound, and the sentence names it."""
    if type(block).__name__ not in ("Slider", "Number") or isinstance(value, bool):
        return None
    if not isinstance(value, (int, float)) or (isinstance(value, float) and math.isnan(value)):
        return None
    lo, hi = getattr(block, "minimum", None), getattr(block, "maximum", None)
    below, above = lo is not None and value < lo, hi is not None and value > hi
    if not (below or above):
        return None
    key = "errors.input_range" if lo is not None and hi is not None else \
        "errors.input_min" if below else "errors.input_max"
    if on_page and key == "errors.input_range" and type(block).__name__ == "Slider":
        return lessons.Said("errors.input_range_set", name=name, lo=lo, hi=hi, value=brief(value),
                            bound=lo if below else hi)
    return lessons.Said(key, name=name, lo=lo, hi=hi, value=brief(value))


def _off_step(block, name, value, on_page: bool) -> lessons.Said | None:
    """A fraction sent to a slider of whole numbers (`whole_numbers`); on the page its box then shows the
    nearest whole number (COMMIT_TYPED_JS), and the sentence names it."""
    if not _fraction(value):
        return None
    lo, hi = block.minimum, block.maximum
    if on_page:
        return lessons.Said("errors.input_whole_set", name=name, lo=lo, hi=hi, value=brief(value),
                            bound=math.floor(value + 0.5))
    return lessons.Said("errors.input_whole", name=name, lo=lo, hi=hi, value=brief(value))


def whole_numbers(*sliders) -> None:
    """Sliders of whole numbers (rows, depth, new tokens, context): gradio checks a slider's bounds, not its
    step, so the boundary (`_guard_preprocess`) refuses a fraction itself. The mark is on the page's
    component, where the boundary reads it (a session's copy of a component is rebuilt without it)."""
    for slider in sliders:
        slider.whole = True


def _fraction(value) -> bool:
    return isinstance(value, float) and math.isfinite(value) and not value.is_integer()


def _whole_refused(block_fn, inputs) -> bool:
    """A fraction sent to a slider of whole numbers (gradio's own check lets it through). A handler that
    reads raw values (preprocess=False: a Run, its door's own sentences) checks them itself."""
    return block_fn.preprocess and isinstance(inputs, list) and len(inputs) == len(block_fn.inputs) and any(
        getattr(block, "whole", False) and _fraction(value) for block, value in zip(block_fn.inputs, inputs))


def _param_name(block_fn, index: int) -> str:
    """The parameter's name as the API page shows it (the handler's argument), else the component's."""
    try:
        params = [p for p in inspect.signature(block_fn.fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                  and p.annotation not in (gr.Request, "gr.Request")]
    except (TypeError, ValueError):
        params = []
    if index < len(params):
        return params[index].name
    block = block_fn.inputs[index]
    return str(getattr(block, "elem_id", None) or getattr(block, "label", None) or f"input {index + 1}")


def _guard_preprocess(blocks: gr.Blocks, lang_of: Callable[[str | None], str], name_of: Callable | None) -> None:
    """Gradio checks and converts inputs before calling a handler; its errors there would reach the
    user as the generic "upstream app raised an exception" (or as a message listing every choice).
    Here they become one short sentence that names the input, in the reader's language."""
    original = blocks.preprocess_data

    async def preprocess_data(block_fn, inputs, state, explicit_call=False):
        try:
            if _whole_refused(block_fn, inputs):
                raise ValueError("a fraction where a whole number belongs")
            return await original(block_fn, inputs, state, explicit_call)
        except Exception as exc:
            index, value = _failing_input(block_fn, inputs, state)
            lang = lang_of(_SESSION.get())
            name = block = None
            if index is not None:
                block = _as_in_session(block_fn.inputs[index], state)
                name = name_of(block_fn.inputs[index], lang) if name_of is not None else None
            said = lessons.say(lang, input_sentence(block_fn, index, value, exc, name=name, block=block))
            # what the handler adds to its refusals; not for a slider, whose box moves to its end and is read then
            note = None if type(block).__name__ == "Slider" else getattr(block_fn.fn, "refusal_note", None)
            raise refusal(f"{said} {note(lang)}" if note else said, str(block_fn.api_name or ""), lang) from None
    blocks.preprocess_data = preprocess_data

    process = blocks.process_api

    async def process_api(*args, **kwargs):
        token = _SESSION.set(kwargs.get("session_hash"))
        try:
            return await process(*args, **kwargs)
        finally:
            _SESSION.reset(token)
    blocks.process_api = process_api


def _as_in_session(block, state):
    """The component as this session has it: gradio checks a value against the session's copy (a
    dropdown whose choices a handler changed), not the page's first one."""
    try:
        return state[block._id] if state is not None and block._id in state else block
    except Exception:           # a state that cannot say: the page's component
        return block


def _failing_input(block_fn, inputs, state=None) -> tuple[int | None, object]:
    """Which input gradio failed on: the first that its component's own data model or preprocess refuses."""
    if not isinstance(inputs, list) or len(inputs) != len(block_fn.inputs):
        return None, inputs
    for i, (block, value) in enumerate(zip(block_fn.inputs, inputs)):
        if getattr(block, "stateful", False):
            continue                # a gr.State holds the server's own value: the page sends none
        if getattr(block, "whole", False) and _fraction(value) and block_fn.preprocess:
            return i, value
        block = _as_in_session(block, state)
        try:
            model = getattr(block, "data_model", None)
            checked = model.model_validate(value) if model is not None and value is not None else value
            if block_fn.preprocess:
                block.preprocess(checked)
        except Exception:
            return i, value
    return None, inputs


# A number box (a slider's, the policy threshold) sent each keystroke to the server, and a half-typed value
# ("-", the "1" of "1.5") got its own refusal: typing counts when it is committed (Enter, leaving the box;
# the arrows commit at once), and the drag of a slider itself still streams.
COMMIT_TYPED_JS = """() => {
  if (window.__svTypedCommit) { return; }
  window.__svTypedCommit = true;
  const numberBox = (el) => el instanceof HTMLInputElement && el.type === 'number';
  let passing = false;
  const commit = (el) => {
    if (el.value !== '' && el.dataset.svHeld !== undefined && inside(el)) { el.dataset.svHeld = el.value; }
    passing = true;
    try { el.dispatchEvent(new Event('input', {bubbles: true})); } finally { passing = false; }
  };
  window.addEventListener('input', (e) => { if (!passing && numberBox(e.target)) { e.stopImmediatePropagation(); } }, true);
  // a Persian keyboard types ۰–۹ and ٫, which a number box drops (it read as empty): typed or pasted,
  // they enter as the digits and the point the box reads
  const persian = /[۰-۹٠-٩٫]/g;
  const LATIN = {'٫': '.'};
  for (const digits of ['۰۱۲۳۴۵۶۷۸۹', '٠١٢٣٤٥٦٧٨٩']) { [...digits].forEach((c, i) => { LATIN[c] = String(i); }); }
  // a decimal comma ("0,7" for the dial) was dropped, and 07 refused as 7: in a box whose step is a
  // fraction it is the point; elsewhere (whole numbers, a GPU's 1,979 TFLOP/s) it stays a thousands mark
  const fractional = (el) => !Number.isInteger(Number(el.step));
  const typed = (el, text) => (fractional(el) ? text.replace(/,/g, '.') : text).replace(persian, (c) => LATIN[c]);
  window.addEventListener('beforeinput', (e) => {
    const text = e.data ?? e.dataTransfer?.getData('text/plain');
    if (!numberBox(e.target) || !text || typed(e.target, text) === text) { return; }
    e.preventDefault();
    document.execCommand('insertText', false, typed(e.target, text));
  }, true);
  // a slider's box left empty (or holding no number) went to the slider's low end while the figures kept
  // the value before: after its refusal it goes back to the value it held
  const sliderBox = (el) => numberBox(el) && !!(el.closest('.block') || el.parentElement).querySelector('input[type=range]');
  const hold = (el) => { if (sliderBox(el) && el.value !== '') { el.dataset.svHeld = el.value; } };
  const emptied = (el) => sliderBox(el) && el.value === '' && el.dataset.svHeld !== undefined;
  const restore = (el) => { el.value = el.dataset.svHeld; commit(el); };
  window.addEventListener('focusin', (e) => hold(e.target), true);
  // a fraction in a box of whole numbers (step 1) is sent as typed, to be refused with its sentence, and
  // the box then moves to the nearest whole number (the range beside it showed that already)
  // (a fraction past an end is the end's business: the blur moves the box there, with one sentence)
  const fraction = (el) => el.step === '1' && bounded(el) && inside(el) && !Number.isInteger(Number(el.value));
  const snap = (el) => {
    if (!fraction(el)) { return; }
    setTimeout(() => { if (fraction(el)) { el.value = String(Math.round(Number(el.value))); commit(el); } }, 150);
  };
  window.addEventListener('change', (e) => { if (numberBox(e.target)) { commit(e.target); snap(e.target); } }, true);
  const inside = (el) => Number(el.value) >= Number(el.min) && Number(el.value) <= Number(el.max);
  // a slider's box: the range beside it moves the box to its nearest end when the box loses focus
  const bounded = (el) => el.value !== '' && el.max && el.min && sliderBox(el);
  // Enter commits at once (a number box's own 'change' waits for it to lose focus); a number past a
  // slider's end leaves the box as Tab does, so the box moves to the end its refusal names
  window.addEventListener('keydown', (e) => {
    if (e.key !== 'Enter' || !numberBox(e.target)) { return; }
    const el = e.target;
    if (emptied(el)) {
      commit(el);                 // its refusal, then the value it held, at once (the knob sat mid-slider)
      setTimeout(() => { if (el.value === '') { restore(el); } }, 150);
      return;
    }
    if (bounded(el) && !inside(el)) { el.blur(); } else { commit(el); snap(el); }
  }, true);
  // a slider moves its box to the nearest end as it loses focus, before the typed number reached the
  // server, so 1.5 typed and Tab went to 0.99 without a word: the box loses focus a moment later; the end
  // it moved to is then committed too (what reads the slider's .input showed the figures of the old value)
  // a slider's ↺ sends its .change alone, and what reads the slider's .input kept the figures of the value
  // before it: the box it reset is committed too
  // ↺ went back to the value a link had set (gradio takes the first value it drew as the default): it
  // goes to the page's own default, from the config the page was built with
  const byDefault = (block) => {
    const c = (window.gradio_config?.components || []).find((c) => block.id && c.props?.elem_id === block.id);
    return c && typeof c.props.value === 'number' ? String(c.props.value) : null;
  };
  window.addEventListener('click', (e) => {
    const reset = e.target instanceof Element ? e.target.closest('button[data-testid=reset-button]') : null;
    const block = reset && (reset.closest('.block') || reset.parentElement);
    const box = block && block.querySelector('input[type=number]');
    if (box) {
      setTimeout(() => { const d = byDefault(block); if (d !== null) { box.value = d; } commit(box); }, 100);
    }
  }, true);
  window.addEventListener('blur', (e) => {
    const el = e.target;
    if (!passing && emptied(el)) {
      restore(el);                // before the slider's own blur moves an empty box to its low end
      return;
    }
    if (passing || !numberBox(el) || !bounded(el) || inside(el)) { return; }
    e.stopImmediatePropagation();
    setTimeout(() => {
      passing = true;
      try { el.dispatchEvent(new FocusEvent('blur')); } finally { passing = false; }
      setTimeout(() => { if (el.value !== '' && inside(el)) { commit(el); } }, 100);
    }, 300);
  }, true);
}"""


def refuse_as_typed(*components) -> None:
    """Settings read only when something starts (a Run, an experiment): a number typed outside a slider's
    bounds is refused as it is typed, by gradio's input check on this event. Without an event the slider
    moves to its nearest bound in silence, and the next Run uses a value the reader never chose."""
    for component in components:
        # queued: gradio's input check, and so its refusal, runs only on the queue's path
        component.change(_read_when_it_starts, [component], None, api_name=False, concurrency_limit=None,
                         show_progress="hidden")


def _read_when_it_starts(value) -> None:
    """The value passed gradio's input check; what reads it reads it when it starts."""


def guard_blocks(blocks: gr.Blocks, lang_of: Callable[[str | None], str],
                 name_of: Callable[[object, str], str | None] | None = None) -> gr.Blocks:
    """Install the boundary on every handler of the page (call once, after the page is built). `name_of
    (component, lang)` names an input in a refusal (its label in that language)."""
    for block_fn in blocks.fns.values():
        if block_fn.fn is not None and not getattr(block_fn.fn, "_specviz_guarded", False):
            block_fn.fn = guard(block_fn.fn, str(block_fn.api_name or block_fn.name), lang_of)
            block_fn.fn._specviz_guarded = True
    _guard_preprocess(blocks, lang_of, name_of)
    return blocks
