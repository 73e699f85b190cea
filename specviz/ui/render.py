"""HTML for the token stream and the per-row view. Pure functions of step events; every piece of model
text goes through html.escape, so a token such as `<script>` shows as text, never as markup."""
from __future__ import annotations

import html
from dataclasses import dataclass, field

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

    def add_step(self, step: int, rs, decode, pieces: list | None = None) -> list:
        """Append one step of this row. `pieces` ([kept, rejected, own] texts, e.g. from a recording)
        replace decoding; returns the pieces shown."""
        ok = rs.drafted[: rs.accepted]
        bad = rs.drafted[rs.accepted:]
        own = rs.emitted[len(ok):]
        title = (f"step {step + 1}: kept {rs.accepted} of {len(rs.drafted)} drafts" if rs.drafted
                 else f"step {step + 1}: plain decoding")
        if pieces is None:
            # a negative id is a rejected draft counted but not returned (vLLM): a mark, never invented text
            bad_txt = (["✗"] * len(bad) if any(t < 0 for t in bad) else piece_texts(decode, self.ids + ok, bad))
            pieces = [piece_texts(decode, self.ids, ok), bad_txt, piece_texts(decode, self.ids + ok, own)]
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
    return f'<div class="tok-stream">{body}</div>{hint}'


def legend_html(lang: str = "en") -> str:
    from specviz import lessons

    def txt(key: str) -> str:
        return html.escape(lessons.text(lang, "playground." + key))
    return (f'<div class="legend"><b>{txt("legend")}</b> '
            f'<em class="lg-accepted">{txt("legend_accepted")}</em> <em class="lg-rejected">{txt("legend_rejected")}</em> '
            f'<em class="lg-bonus">{txt("legend_bonus")}</em> <em class="lg-plain">{txt("legend_plain")}</em></div>')



def rows_html(views: dict[int, RowView], status: dict[int, str], limit: int = 64) -> str:
    """Compact view of every row: tokens so far and a kept/drafted bar."""
    lines = []
    for row in sorted(views)[:limit]:
        v = views[row]
        share = v.accepted / v.drafted if v.drafted else 0.0
        width = int(round(100 * share))
        lines.append(
            f'<div class="row-line"><div class="row-name">row {row + 1}</div>'
            f'<div class="row-bar" title="{v.accepted} of {v.drafted} drafts kept">'
            f'<div class="row-fill" style="width:{width}%"></div></div>'
            f'<div class="row-stat">{len(v.ids)} tokens · {v.accepted}/{v.drafted} kept '
            f'{html.escape(status.get(row, ""))}</div></div>')
    return '<div class="rows">' + "".join(lines) + "</div>"
