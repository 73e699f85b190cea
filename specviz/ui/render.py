"""HTML for the token stream and the per-row view. Pure functions of step events; every piece of model
text goes through html.escape, so a token such as `<script>` shows as text, never as markup."""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from specviz import lessons
from specviz.ui.i18n import t

CLASS = {"accepted": "tok-accepted", "rejected": "tok-rejected", "bonus": "tok-bonus", "plain": "tok-plain"}


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

    def add_step(self, step: int, rs, decode, pieces: list | None = None) -> list:
        """Append one step of this row. `pieces` ([kept, rejected, own] texts, e.g. from a recording)
        replace decoding; returns the pieces shown."""
        ok = rs.drafted[: rs.accepted]
        bad = rs.drafted[rs.accepted:]
        own = rs.emitted[len(ok):]
        title = (t(self.lang, "playground.rows.step_kept", step=step + 1, kept=rs.accepted, drafted=len(rs.drafted))
                 if rs.drafted else t(self.lang, "playground.rows.step_plain", step=step + 1))
        if pieces is None:
            pieces = [piece_texts(decode, self.ids, ok), piece_texts(decode, self.ids + ok, bad),
                      piece_texts(decode, self.ids + ok, own)]
        ok_txt, bad_txt, own_txt = pieces
        if self.parts:
            self.parts.append('<i class="step-sep"></i>')
        self.parts += [_span("accepted", t, title) for t in ok_txt]
        self.parts += [_span("rejected", t, title) for t in bad_txt]
        kind = "plain" if rs.last_kind == "plain" else "bonus"
        self.parts += [_span(kind, t, title) for t in own_txt]
        self.ids += rs.emitted
        self.drafted += len(rs.drafted)
        self.accepted += rs.accepted
        return pieces

    def html(self) -> str:
        return "".join(self.parts)


def _span(kind: str, text: str, title: str) -> str:
    return f'<span class="{CLASS[kind]}" title="{html.escape(title)}">{html.escape(text)}</span>'


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
              lang: str = lessons.DEFAULT_LANG) -> str:
    """Compact view of every row: tokens so far and a kept/drafted bar."""
    lines = []
    for row in sorted(views)[:limit]:
        v = views[row]
        share = v.accepted / v.drafted if v.drafted else 0.0
        width = int(round(100 * share))
        name = html.escape(t(lang, "playground.rows.row", n=row + 1))
        bar = html.escape(t(lang, "playground.rows.bar", kept=v.accepted, drafted=v.drafted))
        stat = html.escape(t(lang, "playground.rows.stat", tokens=len(v.ids), kept=v.accepted, drafted=v.drafted))
        lines.append(
            f'<div class="row-line"><div class="row-name">{name}</div>'
            f'<div class="row-bar" title="{bar}">'
            f'<div class="row-fill" style="width:{width}%"></div></div>'
            f'<div class="row-stat" dir="auto">{stat} {html.escape(status.get(row, ""))}</div></div>')
    return '<div class="rows" dir="auto">' + "".join(lines) + "</div>"
