"""What each session's Playground shows, so the language switch can draw it again in the other language:
a finished Run's or replay's last frame (`Shown`), or a Run or replay under way (it follows the switch at
its own next update). Per session; one lock; the newest SHOWN_KEEP sessions are kept (a frame holds its
Run's steps and charts); an older one's page keeps the words it has."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable

from specviz.serve.live import LiveRun

SHOWN_KEEP = 64
# and at most this many row-steps in all: a frame holds about 2 kB a row-step (its texts and views; a
# batch-16, 512-token Run's 2,200 held 3.9 MB), so a class's largest Runs stay near 200 MB
ROW_STEPS_KEEP = 100_000


class Shown:
    """A finished Run's or replay's last frame: `draw(lang, **first)` gives the Playground's outputs
    (ui.stream.OUTPUTS); `live` holds its charts' data (the pass-time chart the timer drew)."""

    def __init__(self, draw: Callable[..., tuple], live: LiveRun, row_steps: int = 0):
        self._draw, self.live, self.row_steps = draw, live, row_steps
        self._lock = threading.Lock()      # its first drawing and a language switch may meet

    def draw(self, lang: str, **first) -> tuple:
        with self._lock:
            return self._draw(lang, **first)


BUSY = object()     # a Run or a replay streams into the page
GONE = object()     # a frame forgotten for newer ones
MARKS_KEEP = 10_000  # sessions remembered at all (a mark is a few bytes; a class's server runs for days)


class ShownRuns:
    def __init__(self, keep: int = SHOWN_KEEP, row_steps: int = ROW_STEPS_KEEP):
        self._lock = threading.Lock()
        self._table: dict[str, object] = {}
        self._keep, self._row_steps = keep, row_steps

    @contextmanager
    def streaming(self, session: str):
        """A Run or replay for `session`: the page shows it, not the frame before it. One that ends with no
        frame of its own (refused, stopped before it began) leaves what its page shows as it is."""
        before = self.get(session)
        self._set(session, BUSY)
        try:
            yield
        finally:
            with self._lock:
                if self._table.get(session) is BUSY:
                    if before is None:
                        del self._table[session]
                    else:
                        self._table[session] = GONE

    def keep(self, session: str, shown: Shown) -> None:
        self._set(session, shown)

    def _set(self, session: str, value) -> None:
        with self._lock:
            self._table.pop(session, None)
            self._table[session] = value
            frames = [(k, v.row_steps) for k, v in self._table.items() if isinstance(v, Shown)]
            held = sum(n for _, n in frames)
            for n, (old, weight) in enumerate(frames[:-1]):       # the newest frame always stays
                if len(frames) - n <= self._keep and held <= self._row_steps:
                    break
                self._table[old] = GONE       # its page keeps the words it has (not the waiting page's)
                held -= weight
            while len(self._table) > MARKS_KEEP:
                del self._table[next(iter(self._table))]

    def get(self, session: str):
        """The session's Shown, BUSY, GONE, or None (nothing drawn yet)."""
        with self._lock:
            return self._table.get(session)
