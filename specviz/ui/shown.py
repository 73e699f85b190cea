"""What each session's Playground shows, so the language switch can draw it again in the other language:
a finished Run's or replay's last frame (`Shown`), or a Run or replay under way (its `Streaming` mark; it
follows the switch at its own next update). Per session; one lock; the newest SHOWN_KEEP sessions' frames
are kept (a frame holds its Run's steps and charts); an older one's page keeps the words it has. Also a
small table of each page's latest value of something (`SessionTable`)."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Callable, Iterator

from specviz.serve.live import LiveRun

SHOWN_KEEP = 64
# and at most this many row-steps in all: a frame holds about 2 kB a row-step (its texts and views;
# scripts/frame-memory.py), so a class's largest Runs stay near 200 MB
ROW_STEPS_KEEP = 100_000
MARKS_KEEP = 10_000  # sessions remembered at all (a mark is a few bytes; a class's server runs for days)


class Shown:
    """A finished Run's or replay's last frame: `draw(lang, **first)` gives the Playground's outputs
    (ui.stream.OUTPUTS), in `lang_now()` when `lang` is None; `live` holds its charts' data (the pass-time
    chart the timer drew); `verdict(lang)` the lossless check's answer about it, once asked."""

    def __init__(self, draw: Callable[..., tuple], live: LiveRun, lang_now: Callable[[], str], row_steps: int = 0):
        self._draw, self.live, self._lang_now, self.row_steps = draw, live, lang_now, row_steps
        self.verdict: Callable[[str], str] | None = None
        self._lock = threading.Lock()      # its first drawing and a language switch may meet

    def draw(self, lang: str | None = None, **first) -> tuple:
        # the language is read under the lock: a switch that lands meanwhile draws after, in its language
        with self._lock:
            return self._draw(lang or self._lang_now(), **first)


class Streaming:
    """A Run or replay streaming into a page: the mark it holds in the table while it does. `drew`: it sent
    the page something (its page no longer shows the frame before it)."""

    def __init__(self):
        self.drew = False


GONE = object()     # a frame forgotten for newer ones, or a page the table cannot draw again


class ShownRuns:
    def __init__(self, keep: int = SHOWN_KEEP, row_steps: int = ROW_STEPS_KEEP):
        self._lock = threading.Lock()
        self._table: dict[str, object] = {}
        self._keep, self._row_steps = keep, row_steps

    @contextmanager
    def streaming(self, session: str) -> Iterator[Streaming]:
        """A Run or replay for `session`. It may `keep` its frame while its mark is there; a later one (Run
        pressed during a replay) takes the mark over, and the earlier one's frame is then no longer kept.
        One that ends with no frame: a page it drew on cannot be drawn again (GONE); one that drew nothing
        (refused at the door) leaves the frame before it."""
        mark = Streaming()
        with self._lock:
            before = self._table.get(session)
            self._put(session, mark)
        try:
            yield mark
        finally:
            with self._lock:
                if self._table.get(session) is mark:
                    if mark.drew:
                        self._table[session] = GONE
                    elif before is None or isinstance(before, Streaming):
                        del self._table[session]
                    else:
                        self._table[session] = before

    def keep(self, session: str, shown: Shown, mark: Streaming) -> bool:
        """The stream's frame, while the stream still holds the session's mark."""
        with self._lock:
            if self._table.get(session) is not mark:
                return False
            self._put(session, shown)
            return True

    def _put(self, session: str, value) -> None:
        """Set the session's entry as the newest, and forget old frames (the lock held)."""
        keep_newest(self._table, session, value, MARKS_KEEP)
        frames = [(k, v.row_steps) for k, v in self._table.items() if isinstance(v, Shown)]
        held = sum(n for _, n in frames)
        for n, (old, weight) in enumerate(frames[:-1]):       # the newest frame always stays
            if len(frames) - n <= self._keep and held <= self._row_steps:
                break
            self._table[old] = GONE       # its page keeps the words it has (not the waiting page's)
            held -= weight

    def get(self, session: str):
        """The session's Shown, its Streaming mark, GONE, or None (nothing drawn yet)."""
        with self._lock:
            return self._table.get(session)


def keep_newest(table: dict, key, value, keep: int) -> None:
    """Set `key`'s entry (a session, or a session's chapter) as the newest; past `keep` entries the oldest
    goes first."""
    table.pop(key, None)
    table[key] = value
    while len(table) > keep:
        del table[next(iter(table))]


class SessionTable:
    """A page's latest value of something, for the newest `keep` pages (one lock)."""

    def __init__(self, keep: int = 500):
        self._lock = threading.Lock()
        self._table: dict[str, object] = {}
        self._keep = keep

    def put(self, session, value) -> None:
        with self._lock:
            keep_newest(self._table, session, value, self._keep)

    def get(self, session):
        with self._lock:
            return self._table.get(session)
