"""The playground's outputs, built from engine steps: the token stream, the per-row view, the counters and
the charts (`Streamer`, one per Run, replay or baseline), packed in the order the page's outputs take them."""
from __future__ import annotations

import time

import gradio as gr

from specviz import lessons
from specviz.serve.live import LiveRun
from specviz.ui import counters
from specviz.ui.render import RowView, rows_html, tokens_html

ROW_TAIL = 12      # a row's last steps the rows view shows while a Run streams
OUTPUTS = ("tokens", "rows", "counters", "chart_t", "chart_h", "chart_a", "status", "csv", "save", "result")


def pack(**values) -> tuple:
    """The handler's outputs in the order of OUTPUTS; anything not given stays as it is on the page."""
    unknown = set(values) - set(OUTPUTS)
    if unknown:
        raise KeyError(f"not playground outputs: {sorted(unknown)}")
    return tuple(values.get(name, gr.skip()) for name in OUTPUTS)


class Streamer:
    """Turns engine steps into the playground's outputs (one object per Run or replay)."""

    def __init__(self, app, live: LiveRun, tokenizer, session: str, lang: str = "en", choice=None,
                 prompts: list[str] | None = None):
        self.app, self.live, self.session, self.lang = app, live, session, lang
        self.prompts = prompts or []                       # the prompt texts rows cycle through, where known
        self.choice = choice                               # the live pair (its fast path's state); None on replay
        self.decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)
        self.views: dict[int, RowView] = {}
        self.state: dict[int, str] = {}
        self.batch, self.users = 1, 1
        # (seconds since start, event, the texts each row showed): the recording, and what `follow` redraws
        self.steps: list[tuple[float, object, dict]] = []
        self.t0 = time.perf_counter()
        self.note = ""                                     # a line under the counters (a synthetic Run's)

    def fast_status(self):
        return None if self.choice is None else self.app.pairs.fast_status(self.choice)

    def add(self, ev, pieces: dict | None = None) -> None:
        """Fold one step into the per-row transcripts (`pieces`: the texts recorded with it, on replay)."""
        self.steps.append((time.perf_counter() - self.t0, ev, self._fold(ev, pieces)))

    def _fold(self, ev, pieces: dict | None) -> dict:
        shown = {}
        self.batch, self.users = ev.batch_size, ev.users
        for rs in ev.rows:
            shown[rs.row] = self.views.setdefault(rs.row, self._view(rs.row)).add_step(
                ev.step, rs, self.decode, None if pieces is None else pieces.get(rs.row))
            if rs.done:
                key = "playground.finished_eos" if rs.finish == "eos" else "playground.finished_length"
                self.state[rs.row] = "· " + lessons.text(self.lang, key)
        for row in ev.retired:
            self.state[row] = "· " + lessons.text(self.lang, "playground.retired")
        return shown

    def row_steps(self) -> int:
        """How many (row, step) pieces the transcript holds: what keeping it costs (ui.shown)."""
        return sum(len(ev.rows) for _, ev, _ in self.steps)

    def follow(self, lang: str) -> str:
        """Redraw the transcript so far in `lang` (the reader switched language), from the texts each step
        showed (nothing decoded again); its charts follow too. Returns `lang`."""
        if lang != self.lang:
            self.lang = self.live.lang = lang
            self.views, self.state = {}, {}
            for _, ev, shown in self.steps:
                self._fold(ev, shown)
        return lang

    def _view(self, row: int) -> RowView:
        prompt = self.prompts[row % len(self.prompts)] if self.prompts else ""
        return RowView(lang=self.lang, prompt=prompt)

    def recording(self, packet):
        return {"steps": list(self.steps), "totals": packet.totals, "outputs": packet.outputs or {},
                "samples": self.live.sample_dicts()}

    def outputs(self, totals, final: bool = False, result=None, status=None, plain=None, csv=None, save=None,
                zero_gpu: bool | None = None, during_warmup: bool = False, band=None, extra: str = "",
                read: bool = True, plain_users: int = 1):
        """The page's outputs now (`extra`: paragraphs after the counters, e.g. the theory view; `read`: see
        LiveRun.figures)."""
        lang = self.lang
        zero_gpu = self.app.runner.zero_gpu if zero_gpu is None else zero_gpu
        first = self.views.get(min(self.views)) if self.views else None
        charts = self.live.figures(read) if final else (gr.skip(),) * 3   # the timer draws them meanwhile
        live, (knee, measured) = self.live, self.live.knee_for_counters()
        regime = counters.regime_md(lang, live.regime, live.last_pass, knee, measured, live.knee_estimate())
        text = counters.counters_md(lang, totals, regime, live.latest_sample(),
                                    counters.pass_md(lang, live.last_pass, knee, measured),
                                    counters.path_md(lang, live.path, self.fast_status()))
        text += "\n\n" + (self.note or counters.sharing_md(lang, totals, zero_gpu))
        if final:
            text += "\n\n" + counters.baseline_md(lang, totals, plain, during_warmup, band or counters.Band(),
                                                   recorded=self.live.recorded, plain_users=plain_users)
        if extra:
            text += "\n\n" + extra
        rows = rows_html(self.views, self.state, lang=lang, tail=None if final else ROW_TAIL)
        values = dict(tokens=tokens_html(first), rows=rows, counters=text,
                      chart_t=charts[0], chart_h=charts[1], chart_a=charts[2])
        for name, v in (("status", status), ("result", result), ("csv", csv), ("save", save)):
            if v is not None:
                values[name] = v
        return pack(**values)
