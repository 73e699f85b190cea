"""A recording is untrusted input: a teacher shares it, so it can arrive from anywhere.

Before anything is drawn, `check` walks the parsed JSON once, field by field (never recursively: a
hostile file may nest thousands deep, and every field has a fixed shape; a stored sentence nests at most
lessons.stored.MAX_NESTING deep), and refuses — with a sentence naming the
field — wrong types, non-finite numbers, lone surrogates and anything beyond the size limits below.
The checked data then builds the dataclasses (specviz.serve.recordings). Plain Python: no gradio, no torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from specviz.lessons import stored
from specviz.limits import MAX_DEPTH, brief


@dataclass(frozen=True)
class RecordingLimits:
    """What one recording may hold. The shipped ones are 9–16 kB with 8–30 steps; a 512-token Run at
    batch 16 records about 600 steps and 0.5–1 MB."""

    max_bytes: int = 4_000_000          # refused before it is read (a 35 MB file never reaches the parser)
    max_steps: int = 5_000
    max_rows: int = 64                   # rows in one step of one request
    max_tokens: int = 200_000            # token ids in all steps together
    max_samples: int = 20_000            # hardware readings
    max_text: int = 20_000               # characters in one text field (the prompt limit)
    max_piece: int = 1_000               # characters in one token's text
    max_said: int = 50_000               # values of stored sentences (a forward path's label holds 13)


LIMITS = RecordingLimits()
ROW_KINDS = ("plain", "correction", "bonus")
EVENT_INTS = ("step", "batch_size", "depth", "tokens_per_pass", "context", "users", "shared_emitted")
# newer fields (adaptive verification's slots, the pass's real and padded width): 0 in older recordings
EVENT_INTS_LATER = ("slots_drafted", "slots_verified", "real_tokens", "padded_tokens")
EVENT_FLOATS = ("draft_s", "verify_s", "overhead_s", "wall_s", "prefill_s", "draft_flops", "draft_bytes",
                "target_flops", "target_bytes", "plain_flops", "share")
TOTAL_INTS = ("steps", "tokens", "row_steps", "drafted", "accepted", "shared_batch_max", "users_max", "proposed", "reached")
TOTAL_FLOATS = ("wall_s", "prefill_s", "draft_s", "verify_s", "spent_flops", "plain_flops")


class Bad(ValueError):
    """One field of a recording is wrong; the message names it."""


def _fail(where: str, what: str, value) -> Bad:
    return Bad(f"{where} must be {what}, not {brief(value)}")


def text(value, where: str, limit: int = LIMITS.max_text) -> str:
    if not isinstance(value, str):
        raise _fail(where, "text", value)
    if len(value) > limit:
        raise Bad(f"{where} is {len(value):,} characters long; at most {limit:,} fit")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise Bad(f"{where} holds a broken character (a lone surrogate)") from None
    return value


def whole(value, where: str, lo: int = 0, hi: int = 2**53) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, "a whole number", value)
    if not lo <= value <= hi:
        raise Bad(f"{where} must be from {lo} to {hi}, not {brief(value)}")
    return value


def number(value, where: str, lo: float = 0.0, hi: float = 1e30) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(where, "a number", value)
    if not math.isfinite(value) or not lo <= value <= hi:
        raise Bad(f"{where} must be a finite number from {lo:g} to {hi:g}, not {brief(value)}")
    return float(value)


def listof(value, where: str, limit: int) -> list:
    if not isinstance(value, list):
        raise _fail(where, "a list", value)
    if len(value) > limit:
        raise Bad(f"{where} has {len(value):,} entries; at most {limit:,} fit")
    return value


def mapping(value, where: str) -> dict:
    if not isinstance(value, dict):
        raise _fail(where, "an object", value)
    return value


def ids(value, where: str, budget: list[int]) -> list[int]:
    """Token ids; `budget` counts every id of the recording against max_tokens."""
    out = [whole(v, f"{where}[{i}]", 0, 10_000_000) for i, v in enumerate(listof(value, where, 100_000))]
    budget[0] += len(out)
    if budget[0] > LIMITS.max_tokens:
        raise Bad(f"the recording holds more than {LIMITS.max_tokens:,} tokens")
    return out


def row_step(d, where: str, budget: list[int]) -> dict:
    d = mapping(d, where)
    drafted = ids(d.get("drafted"), f"{where} 'drafted'", budget)
    kind = d.get("last_kind")
    if kind not in ROW_KINDS:
        raise _fail(f"{where} 'last_kind'", "plain, correction or bonus", kind)
    done = d.get("done", False)
    if not isinstance(done, bool):
        raise _fail(f"{where} 'done'", "true or false", done)
    return {"row": whole(d.get("row"), f"{where} 'row'", 0, 100_000),
            "drafted": drafted,
            "accepted": whole(d.get("accepted"), f"{where} 'accepted'", 0, len(drafted)),
            "emitted": ids(d.get("emitted"), f"{where} 'emitted'", budget),
            "last_kind": kind, "done": done, "finish": text(d.get("finish", ""), f"{where} 'finish'", 20),
            "proposed": whole(d.get("proposed", 0), f"{where} 'proposed'", 0, 100_000)}


def event(d, where: str, budget: list[int], said_budget: stored.Budget) -> dict:
    d = mapping(d, where)
    out = {k: whole(d.get(k), f"{where} '{k}'", 0, 10_000_000) for k in EVENT_INTS}
    out.update({k: whole(d.get(k, 0), f"{where} '{k}'", 0, 10_000_000) for k in EVENT_INTS_LATER})
    budget_b = d.get("budget")
    out["budget"] = None if budget_b is None else whole(budget_b, f"{where} 'budget'", 0, 10_000_000)
    out["depth"] = whole(d.get("depth"), f"{where} 'depth'", 0, MAX_DEPTH)
    out.update({k: number(d.get(k), f"{where} '{k}'") for k in EVENT_FLOATS})
    out["share"] = number(d.get("share"), f"{where} 'share'", 0.0, 1.0)
    out["policy"] = text(d.get("policy"), f"{where} 'policy'", 40)
    out["path"] = text(d.get("path", ""), f"{where} 'path'", 200)
    rows = listof(d.get("rows"), f"{where} 'rows'", LIMITS.max_rows)
    out["rows"] = [row_step(r, f"{where}, row {i + 1}", budget) for i, r in enumerate(rows)]
    out["changes"] = [text(c, f"{where} 'changes'", 200) for c in listof(d.get("changes", []), f"{where} 'changes'", 64)]
    out["retired"] = [whole(r, f"{where} 'retired'", 0, 100_000)
                      for r in listof(d.get("retired", []), f"{where} 'retired'", 100)]
    if "said" in d:
        out["said"] = said(d["said"], f"{where} 'said'", said_budget)
    return out


# the sentences a recording stores (specviz.lessons.stored): the forward path, the knob changes
RECORDED_SAYINGS = ("playground.fast.", "playground.chart.change_", "policy_label.")


def said(d, where: str, budget: stored.Budget) -> dict:
    """The event's sentences as `Said`s: 'path' one, 'changes' a list. One this version cannot say (a newer
    version's, a hand-edited one) is left out, and the replay shows the recorded English."""
    d = mapping(d, where)
    out = {}
    try:
        path = _said(d["path"], budget) if "path" in d else None
        changes = [_said(c, budget) for c in listof(d.get("changes", []), f"{where} 'changes'", 64)]
    except stored.TooMany as exc:
        raise Bad(f"{where}: {exc} (at most {LIMITS.max_said:,} in a recording)") from None
    if path is not None:
        out["path"] = path
    if changes and None not in changes:
        out["changes"] = changes
    return out


def _said(data, budget: stored.Budget):
    try:
        return stored.from_plain(data, RECORDED_SAYINGS, budget)
    except stored.TooMany:
        raise
    except stored.NotSaid:
        return None


def pieces(d, where: str) -> dict[int, list[list[str]]]:
    """{row: [kept, rejected, own]}: the texts shown for each row, three lists of token texts."""
    out = {}
    for row, parts in mapping(d, where).items():
        at = f"{where}, row {brief(row)}"
        if not (isinstance(row, str) and row.isdigit() and len(row) <= 6):
            raise _fail(f"{where}: a row key", "a row number", row)
        parts = listof(parts, at, 3)
        if len(parts) != 3:
            raise Bad(f"{at} must have three parts (kept, rejected, own), not {len(parts)}")
        out[int(row)] = [[text(p, at, LIMITS.max_piece) for p in listof(part, at, MAX_DEPTH + 1)] for part in parts]
    return out


def step(s, i: int, budget: list[int], said_budget: stored.Budget) -> tuple[float, dict, dict]:
    where = f"step {i + 1}"
    s = listof(s, where, 3)
    if len(s) != 3:
        raise Bad(f"{where} must be [seconds, event, texts], not {len(s)} parts")
    return (number(s[0], f"{where} time", 0.0, 1e7), event(s[1], where, budget, said_budget),
            pieces(s[2], f"{where} texts"))


def totals(d) -> dict:
    d = mapping(d, "'totals'")
    out = {k: whole(d.get(k, 0), f"totals '{k}'", 0, 2**53) for k in TOTAL_INTS}
    out.update({k: number(d.get(k, 0.0), f"totals '{k}'") for k in TOTAL_FLOATS})
    # α = accepted ÷ reached: the drafts reached lie between those kept and those drafted (0: not counted)
    if out["reached"] and not out["accepted"] <= out["reached"] <= out["drafted"]:
        raise Bad(f"totals 'reached' must be from {out['accepted']} to {out['drafted']}, not {out['reached']}")
    return out


def flat(d, where: str, limit: int = 64) -> dict:
    """Settings and versions: a small object of short texts, numbers, true/false or null."""
    d = mapping(d, where)
    if len(d) > limit:
        raise Bad(f"{where} has {len(d)} entries; at most {limit} fit")
    out = {}
    for k, v in d.items():
        text(k, f"{where} key", 60)
        if isinstance(v, str):
            v = text(v, f"{where} '{k}'", 200)
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            v = number(v, f"{where} '{k}'", -1e30, 1e30)
        elif v is not None and not isinstance(v, bool):
            raise _fail(f"{where} '{k}'", "text, a number, true/false or null", v)
        out[k] = v
    return out


def samples(value) -> list[dict]:
    out = []
    for i, s in enumerate(listof(value, "'samples'", LIMITS.max_samples)):
        s = mapping(s, f"sample {i + 1}")
        out.append({k: (None if v is None else number(v, f"sample {i + 1} '{k}'", 0.0, 1e30)) if k != "source"
                    else text(v, f"sample {i + 1} 'source'", 40) for k, v in s.items() if k in
                    ("t", "util", "memory", "power", "source")})
    return out


def check(data, format_name: str) -> dict:
    """The recording's fields, each checked; raises Bad naming the first wrong one."""
    data = mapping(data, "the file")
    if data.get("format") != format_name:
        raise Bad("this file is not a SpecViz recording (its 'format' is not " + format_name + ")")
    steps = listof(data.get("steps"), "'steps'", LIMITS.max_steps)
    budget, said_budget = [0], stored.Budget(LIMITS.max_said)
    checked = [step(s, i, budget, said_budget) for i, s in enumerate(steps)]
    outputs = {}
    for k, v in mapping(data.get("outputs", {}), "'outputs'").items():
        if not (isinstance(k, str) and k.isdigit() and len(k) <= 6):
            raise _fail("an 'outputs' key", "a row number", k)
        outputs[int(k)] = ids(v, f"outputs, row {k}", budget)
    prompt_ids = [ids(p, f"prompt_ids[{i}]", budget)
                  for i, p in enumerate(listof(data.get("prompt_ids", []), "'prompt_ids'", LIMITS.max_rows))]
    return {"device": text(data.get("device"), "'device'", 200), "date": text(data.get("date"), "'date'", 40),
            "pair": text(data.get("pair"), "'pair'", 400), "prompt": text(data.get("prompt"), "'prompt'"),
            "settings": flat(data.get("settings", {}), "'settings'"),
            "versions": flat(data.get("versions", {}), "'versions'"),
            "steps": checked, "samples": samples(data.get("samples", [])), "totals": totals(data.get("totals")),
            "outputs": outputs, "prompt_ids": prompt_ids}
