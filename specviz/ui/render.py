"""HTML for the token stream and the per-row view. Pure functions of step events; every piece of model
text goes through html.escape, so a token such as `<script>` shows as text, never as markup."""
from __future__ import annotations

import html
import re
from dataclasses import dataclass, field

from specviz import lessons
from specviz.ui.i18n import t

CLASS = {"accepted": "tok-accepted", "rejected": "tok-rejected", "bonus": "tok-bonus", "plain": "tok-plain"}

# Chat-template and control tokens (`<|im_start|>`, `</s>`, …) are markup, not text a model "says":
# they show as small neutral badges so a student never reads them as words. A bare `<s>` is left out on
# purpose: it is also an HTML tag a model may legitimately write.
_SPECIAL = re.compile(r"<\|[^|<>\s]{1,40}\|>|</s>|<unk>|<pad>|<eos>|<bos>")
_HEADER_OPEN = "<|im_start|>"     # ChatML: `<|im_start|>ROLE\n` — the role line is markup as well
_ROLE_PIECES = 3                  # a role name is a few pieces (`ass` + `istant`); text after that is text


def piece_texts(decode, context: list[int], new: list[int], window: int = 6) -> list[str]:
    """Text of each token in `new` as it reads after `context` (byte-level BPE pieces only make sense
    in context, so each piece is the difference of two decodes of a short window)."""
    out = []
    ctx = context[-window:]
    for tok in new:
        before = decode(ctx)
        ctx = ctx + [tok]
        after = decode(ctx)
        out.append(after[len(before):] if after.startswith(before) else decode([tok]))
        ctx = ctx[-window:]
    return out


@dataclass
class RowView:
    """The growing coloured transcript of one row."""

    parts: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    lang: str = lessons.DEFAULT_LANG     # the reader's language, for the tooltips
    header_left: int = 0           # role pieces still expected after a kept `<|im_start|>`
    prompt: str = ""               # the row's prompt text, where known (a replay knows only row 1's)

    def add_step(self, step: int, rs, decode, pieces: list | None = None) -> list:
        """Append one step of this row. `pieces` ([kept, rejected, own] texts, e.g. from a recording)
        replace decoding; returns the pieces shown."""
        ok = rs.drafted[: rs.accepted]
        bad = rs.drafted[rs.accepted:]
        own = rs.emitted[len(ok):]
        title = (t(self.lang, "playground.rows.step_kept", step=step + 1, kept=rs.accepted, drafted=len(rs.drafted))
                 if rs.drafted else t(self.lang, "playground.rows.step_plain", step=step + 1))
        if pieces is None:
            # a negative id is a rejected draft counted but not returned (vLLM): a mark, never invented text
            bad_txt = (["✗"] * len(bad) if any(t < 0 for t in bad) else piece_texts(decode, self.ids + ok, bad))
            pieces = [piece_texts(decode, self.ids, ok), bad_txt, piece_texts(decode, self.ids + ok, own)]
        ok_txt, bad_txt, own_txt = pieces
        kind = "plain" if rs.last_kind == "plain" else "bonus"
        spans, after_ok = _spans("accepted", ok_txt, title, self.header_left)
        rejected, _ = _spans("rejected", bad_txt, title, after_ok)      # drafts continue the kept prefix
        own_spans, self.header_left = _spans(kind, own_txt, title, after_ok)   # so does the target's own
        # one part a step, its tooltip said once for all its tokens: the page receives the whole transcript
        # five times a second, and a tooltip repeated on every token made most of its bytes
        sep = '<i class="step-sep"></i>' if self.parts else ""
        self.parts.append(f'{sep}<i class="step" title="{html.escape(title)}">{"".join(spans + rejected + own_spans)}</i>')
        self.ids += rs.emitted
        self.drafted += len(rs.drafted)
        self.accepted += rs.accepted
        return pieces

    def html(self, tail: int | None = None) -> str:
        """The transcript, or its last `tail` parts after a mark that says it is cut."""
        if tail is None or len(self.parts) <= tail:
            return "".join(self.parts)
        return '<i class="row-cut">…</i>' + "".join(self.parts[-tail:])


def special_name(text: str) -> str | None:
    """The badge name of a piece that is a control token (`<|im_start|>` → `im_start`), else None."""
    core = text.strip()
    return core.strip("<>|/") if core and _SPECIAL.fullmatch(core) else None


def _spans(kind: str, texts: list[str], title: str, header: int) -> tuple[list[str], int]:
    """Spans for consecutive pieces; `header` > 0: they start inside a `<|im_start|>ROLE` line, whose role
    pieces show as markup too (up to the newline). Returns the spans and the state after."""
    out = []
    for text in texts:
        name = special_name(text)
        if name is not None:
            out.append(_span(kind, text, title, special=name))
            header = _ROLE_PIECES if text.strip() == _HEADER_OPEN else 0
        elif header and "\n" not in text:
            out.append(_span(kind, text, title, role=True))
            header -= 1
        else:
            out.append(_span(kind, text, title))
            header = 0
    return out, header


def _span(kind: str, text: str, title: str, special: str | None = None, role: bool = False) -> str:
    """One token, one span, one `tok-*` class (a contract); its tooltip is its step's (`RowView.add_step`).
    Markup keeps its class and is marked by `data-special` (a badge, its raw text in a tooltip of its own)
    or `data-role` (the role name after it)."""
    if special is not None:
        raw = text.strip()      # model output: left-to-right inside a Persian tooltip
        tip = html.escape(f"{title} · {lessons.isolate_ltr(raw) if lessons.ARABIC_SCRIPT.search(title) else raw}")
        return f'<span class="{CLASS[kind]}" data-special="1" title="{tip}">⟨{html.escape(special)}⟩</span>'
    mark = ' data-role="1"' if role else ""
    return f'<span class="{CLASS[kind]}"{mark}>{html.escape(text)}</span>'


def tokens_html(view: RowView | None, note: str = "") -> str:
    body = view.html() if view else ""
    hint = f'<div class="tok-note">{html.escape(note)}</div>' if note else ""
    # dir="auto": model output (mostly English) keeps its punctuation on the right side in a Persian page
    return f'<div class="tok-stream" dir="auto">{body}</div>{hint}'


def legend_html(lang: str = "en") -> str:
    def txt(key: str) -> str:
        return html.escape(lessons.text(lang, "playground." + key))
    return (f'<div class="legend"><b>{txt("legend")}</b> '
            f'<em class="lg-accepted">{txt("legend_accepted")}</em> <em class="lg-rejected">{txt("legend_rejected")}</em> '
            f'<em class="lg-bonus">{txt("legend_bonus")}</em> <em class="lg-plain">{txt("legend_plain")}</em></div>')



def rows_html(views: dict[int, RowView], status: dict[int, str], limit: int = 64,
              lang: str = lessons.DEFAULT_LANG, tail: int | None = None) -> str:
    """Every row: a line with its tokens so far and a kept/drafted bar, which opens (a click) on the row's
    prompt and its coloured text, the last `tail` parts of it while a Run streams (the page receives the
    whole view at every update: 16 rows' whole texts would be a megabyte a fifth of a second). The page
    keeps a row open while the Run updates it (KEEP_ROWS_JS)."""
    # the reader's direction, not dir="auto": a Persian stat starts with a number ("24 token · 3 از 5 …"),
    # and auto would lay it out left-to-right, splitting "3 از 5"
    way = lessons.direction(lang)
    lines = [_row_html(row, views[row], status.get(row, ""), lang, way, tail) for row in sorted(views)[:limit]]
    hint = f'<div class="rows-hint">{html.escape(t(lang, "playground.rows.hint"))}</div>' if lines else ""
    return f'<div class="rows" dir="{way}">' + hint + "".join(lines) + "</div>"


def _row_html(row: int, v: RowView, status: str, lang: str, way: str, tail: int | None) -> str:
    share = v.accepted / v.drafted if v.drafted else 0.0
    width = int(round(100 * share))
    name = html.escape(t(lang, "playground.rows.row", n=row + 1))
    # a row that drafted nothing (depth 0, a policy that turned drafting off) is not a row of rejections
    none = "_none" if not v.drafted else ""
    bar = html.escape(t(lang, f"playground.rows.bar{none}", kept=v.accepted, drafted=v.drafted))
    stat = html.escape(t(lang, f"playground.rows.stat{none}", tokens=len(v.ids), kept=v.accepted, drafted=v.drafted))
    prompt = (f'<div class="row-prompt"><b>{html.escape(t(lang, "playground.rows.prompt"))}</b> '
              f'<span dir="auto">{html.escape(v.prompt)}</span></div>') if v.prompt else ""
    return (f'<details class="row" data-row="{row}"><summary class="row-line"><span class="row-name">{name}</span>'
            f'<span class="row-bar{" row-bar-none" if none else ""}" title="{bar}"><span class="row-fill" style="width:{width}%"></span></span>'
            f'<span class="row-stat" dir="{way}">{stat} {html.escape(status)}</span></summary>'
            f'<div class="row-body">{prompt}<div class="tok-stream" dir="auto">{v.html(tail)}</div></div></details>')


# Gradio re-renders the rows view at every update of a Run, morphing the page's HTML into the new one,
# which drops a row's `open`: remember which rows the reader opened, and open them again after each update.
KEEP_ROWS_JS = """() => {
  if (window.__svRowsKept) { return; }
  window.__svRowsKept = true;
  const open = new Set();
  // a click on a row's line, not its toggle event: an update may replace the row before that event fires
  document.addEventListener('click', (e) => {
    const row = e.target.closest && e.target.closest('#rows details.row > summary') && e.target.closest('details.row');
    if (row) { row.open ? open.delete(row.dataset.row) : open.add(row.dataset.row); }
  }, true);
  new MutationObserver(() => {
    for (const el of document.querySelectorAll('#rows details.row')) {
      if (open.has(el.dataset.row) && !el.open) { el.open = true; }
    }
  }).observe(document.body, {subtree: true, childList: true, attributes: true, attributeFilter: ['open']});
}"""
