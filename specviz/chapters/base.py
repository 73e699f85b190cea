"""What a chapter is: one unit holding its experiment, its conclusion rules and its figure.

A chapter module (`specviz/chapters/<key>.py`) defines its experiment as a generator of plain JSON-able
snapshots (see `common.py` for the snapshot's fields), the small named rules that pick its conclusion from
the measured numbers, its plotly figure, and one `CHAPTER = Chapter(...)` line. `specviz/chapters/__init__.py`
lists the chapters in lesson order; the Lesson tab, deep links (`?chapter=`), the recorder and the tests read
that list and nothing else. The chapter's words live in `specviz/lessons/{en,fa}.toml` under
`[chapter.<key>]` (teachers edit those, not code).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator

Result = dict[str, Any]


@dataclass(frozen=True)
class Context:
    """What an experiment may use, built by the page for the pair the student picked."""
    pair: Any                      # specviz.pairs.pipeline.Pair, loaded and shared (read-only here)
    prompt: list[int]              # the default prompt's token ids (chat template applied)
    pool: list[list[int]]          # the default prompt, then the pool prompts (one per extra row/user)
    peaks: Any = None              # specviz.hardware.device.Peaks of this device, or None
    depth: int = 4                 # the lesson's default speculation depth
    grounded: tuple = ()           # input-grounded prompts (the answer copies the input), like the first Run's
    # the acceptance dial: run on the local target with the synthetic draft `synthetic:A` (a chapter with
    # `dial`; None: the pair's own draft). Every figure and sentence from it says "synthetic".
    acceptance: float | None = None


@dataclass(frozen=True)
class VllmPanel:
    """A recorded vLLM sweep (assets/sweeps/) shown beside the class's own measurement."""
    result: Callable[[Any, str], Result]          # (RecordedSweep, lang) -> a result the figure draws
    figure: Callable[..., Any]                    # (result, labels, dark=False) -> go.Figure
    notes: Callable[[Any], list[tuple[str, dict]]] = lambda sweep: []   # extra (lesson key, values) lines
    # the recording it shows, if not the newest vLLM sweep: a loader returning an object with the sweep's
    # engine_version, device and command (or None when nothing is recorded)
    recording: Callable[[], Any] | None = None


@dataclass(frozen=True)
class Chapter:
    key: str                                              # lesson keys chapter.<key>.*, ?chapter=<key>
    run: Callable[[Context], Iterator[Result]] | None = None     # None: a chapter of text only
    figure: Callable[..., Any] | None = None              # (result, labels, dark=False) -> go.Figure
    button_id: str | None = None                          # the experiment button's element id
    vllm: VllmPanel | None = None
    dial: bool = False                                    # the page offers the acceptance dial (Context.acceptance)

    @property
    def has_experiment(self) -> bool:
        return self.run is not None
