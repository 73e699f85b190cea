"""Lesson text (specviz/lessons) and the bundled Persian font (assets/fonts): pure data checks."""
import json
import re
import string
import tomllib
from pathlib import Path

import pytest

from specviz import lessons
from specviz.chapters import KEYS

ROOT = Path(__file__).resolve().parents[1]
LESSON_DIR = ROOT / "specviz" / "lessons"
FONT_DIR = ROOT / "assets" / "fonts"
ARABIC_SCRIPT = re.compile(r"[\u0600-\u06FF]")


def flat(table: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for key, value in table.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flat(value, path + "."))
        else:
            out[path] = value
    return out


def fields(template: str) -> set[tuple[str, str | None, str]]:
    """(name, conversion, format spec) of every replacement field."""
    return {(name, conv, spec) for _, name, spec, conv in string.Formatter().parse(template) if name is not None}


def sample(name: str, spec: str, conv: str | None):
    if conv == "r":
        return "tok"
    if spec and spec[-1] in "f%eg":
        return 0.25
    return 3


@pytest.fixture(scope="module")
def tables():
    return {lang: flat(lessons.load(lang)) for lang in lessons.LANGS}


def test_files_ship_beside_the_module_and_parse():
    assert lessons.LANGS == ("en", "fa")
    for lang in lessons.LANGS:
        with open(LESSON_DIR / f"{lang}.toml", "rb") as f:
            assert tomllib.load(f) == lessons.load(lang)


def test_same_keys_in_every_language(tables):
    en = set(tables["en"])
    for lang, table in tables.items():
        assert set(table) == en, f"{lang}: missing {sorted(en - set(table))}, extra {sorted(set(table) - en)}"
    assert all(isinstance(v, str) and v.strip() for t in tables.values() for v in t.values())


def test_structure_follows_the_argument(tables):
    data = lessons.load("en")
    assert tuple(data["chapter"]) == KEYS
    for chapter in KEYS:
        for part in ("title", "body", "button", "running"):
            assert f"chapter.{chapter}.{part}" in tables["en"]
    for chapter in KEYS[1:]:
        assert any(k.startswith(f"chapter.{chapter}.conclusion_") for k in tables["en"]), chapter
    from specviz.engine.policies import POLICIES   # the registry names each policy's label and help line
    assert set(data["policies"]) == set(data["policy_label"]) == set(POLICIES)
    for spec in POLICIES.values():
        assert spec.label_key in tables["en"] and spec.help_key in tables["en"], spec.name
        assert spec.threshold is None or spec.threshold.label_key in tables["en"], spec.name


def test_placeholders_match_and_format(tables):
    for key, en_text in tables["en"].items():
        want = fields(en_text)
        for lang, table in tables.items():
            assert fields(table[key]) == want, f"{lang} {key}"
            values = {name: sample(name, spec, conv) for name, conv, spec in want}
            table[key].format(**values)        # strict str.format: must not raise


def test_conclusion_templates_carry_their_numbers(tables):
    en = tables["en"]
    expect = {
        "chapter.race.conclusion_faster": {"flops_ratio", "speedup"},
        "chapter.race.conclusion_slower": {"flops_ratio", "slowdown", "draft_cost"},
        "chapter.knee.conclusion_flat": {"knee", "flat_to", "flat_ratio", "one_token_ms"},
        "chapter.knee.conclusion_not_memory_bound": {"ratio2"},
        "chapter.breadth_depth.conclusion_stops": {"n"},
        "chapter.ledger.conclusion_waste": {"waste"},
        "chapter.ledger.conclusion_theory": {"theory", "measured", "measured_speedup_end_to_end"},   # which speed-up
        "chapter.sweep.conclusion_crossover": {"crossover"},
        "chapter.sweep.conclusion_no_crossover": {"max_batch"},
        "app.lossless_identical": {"n"},
        "lossless.row_near_tie": {"row", "pos", "target_tok", "ours_tok", "margin"},
        "lossless.row_bug": {"row", "pos", "target_tok", "ours_tok", "margin"},
        "errors.prompt_too_long": {"tokens", "limit"},
        "errors.busy": {"seconds"},
        "errors.step_out_of_memory": {"rows", "depth"},
    }
    for key, names in expect.items():
        assert names <= {name for name, _, _ in fields(en[key])}, key


def test_a_workload_says_its_token_limit_is_a_limit(tables):
    """The race said "48 new tokens" and stopped at 27, where the lesson's answer ends: a workload names
    its limit as "up to" (en) / "حداکثر" (fa)."""
    for lang, word in (("en", "up to {max_new}"), ("fa", "حداکثر {max_new}")):
        workloads = {k: v for k, v in flat(tables[lang]).items() if k.endswith(".workload") and "{max_new}" in v}
        assert len(workloads) >= 4 and all(word in v for v in workloads.values()), workloads


def test_a_conclusion_from_single_cells_does_not_claim_what_it_did_not_measure(tables):
    """The sweep called its fixed 5 % rule "this machine's noise" (each cell is one measurement), and the
    policies chapter read a ±26 % band as "the choice hardly matters": a band that wide says this run cannot
    tell, and a second press of either chapter drew a different line."""
    en = flat(tables["en"])
    # now each cell runs {rounds} times, and the noise band it names is its own runs' spread
    assert "{rounds} times" in en["chapter.sweep.conclusion_best"]
    assert "noise band, the spread of its own runs" in en["chapter.sweep.conclusion_best"]
    assert "hardly matters" not in en["chapter.policies.conclusion_close"]
    assert "cannot tell" in en["chapter.policies.conclusion_close"]


def test_persian_is_persian_with_english_terms(tables):
    fa = tables["fa"]
    for chapter in KEYS:
        body = fa[f"chapter.{chapter}.body"]
        assert len(ARABIC_SCRIPT.findall(body)) > 100, chapter
        assert body != tables["en"][f"chapter.{chapter}.body"]
    everything = "\n".join(fa.values())
    assert re.search("[پچژگ]", everything)                       # Persian letters, not only Arabic
    assert not re.search("[\u064A\u0643]", everything)             # Persian ی and ک, not Arabic ي and ك
    assert "¦" not in everything
    assert "speculative decoding" in fa["chapter.intro.body"]
    assert "مدل draft" in fa["chapter.intro.body"] and "forward pass" in fa["chapter.intro.body"]
    assert "\u2066memory-bound\u2069" in fa["chapter.knee.body"] and "\u2066compute-bound\u2069" in fa["chapter.knee.body"]
    assert "batch" in fa["chapter.sweep.body"] and "throughput" in fa["chapter.sweep.body"]
    assert "breadth" in fa["chapter.breadth_depth.body"] and "depth" in fa["chapter.breadth_depth.body"]
    assert "FLOP" in fa["chapter.ledger.body"]
    # vLLM's current knob, not only its removed flag (vLLM dropped --speculative-disable-by-batch-size in
    # 2026): the lesson's vLLM history is current in both languages
    for lang in ("en", "fa"):
        assert "num_speculative_tokens_per_batch_size" in tables[lang]["chapter.policies.vllm_body"], lang


def test_direction():
    assert lessons.direction("fa") == "rtl"
    assert lessons.direction("en") == "ltr"


def test_text_formats_falls_back_and_never_raises(monkeypatch):
    assert lessons.text("en", "app.lossless_identical", n=7).startswith("Identical: 7 of 7")
    out = lessons.text("fa", "chapter.race.conclusion_faster", flops_ratio=2.345, speedup=1.5, tokens_per_pass=3.0,
                       unused=1)
    assert "2.3" in out and "1.50" in out and ARABIC_SCRIPT.search(out)
    assert lessons.text("xx", "app.title") == "SpecViz"                       # unknown language → English
    assert lessons.text("fa", "no.such.key") == "no.such.key"
    assert "{speedup:.2f}" not in lessons.text("en", "chapter.race.conclusion_faster")  # missing value: shown
    assert "{speedup}" in lessons.text("en", "chapter.race.conclusion_faster")          # as its name
    assert "abc" in lessons.text("en", "chapter.race.conclusion_faster", speedup="abc")  # bad type: as str
    bidi = lessons.text_bidi("fa", "errors.prompt_too_long", tokens=900, limit=512)
    assert lessons.LRI + "900" + lessons.PDI in bidi

    real = lessons._load
    fake_fa = lessons.load("fa")
    del fake_fa["app"]["copy_link"]
    monkeypatch.setattr(lessons, "_load", lambda lang: fake_fa if lang == "fa" else real(lang))
    assert lessons.text("fa", "app.copy_link") == "Copy link"                 # missing in fa → English


def test_font_bundle_and_licence():
    files = sorted((FONT_DIR / "vazirmatn").glob("*.woff2"))
    assert {f.name for f in files} >= {"Vazirmatn-Regular.woff2", "Vazirmatn-Bold.woff2"}
    assert all(f.read_bytes()[:4] == b"wOF2" for f in files)
    licence = (FONT_DIR / "vazirmatn" / "OFL.txt").read_text()
    assert "SIL Open Font License" in licence and "Vazirmatn" in licence
    total = sum(p.stat().st_size for p in FONT_DIR.rglob("*") if p.is_file())
    assert total < 400 * 1024


def test_font_css_references_only_existing_files():
    css_path = FONT_DIR / "vazirmatn.css"
    css = css_path.read_text()
    urls = re.findall(r"url\(\s*['\"]?([^'\")]+)['\"]?\s*\)", css)
    assert len(urls) >= 2
    for url in urls:
        assert not re.match(r"^(?:[a-z]+:|/)", url), f"not relative: {url}"
        assert (css_path.parent / url).is_file(), url
    assert "@font-face" in css and "font-family: Vazirmatn, Tahoma, sans-serif" in css
    assert '[dir="rtl"]' in css and ".rtl" in css
    assert re.search(r"\.ltr, code, \.tokens[^{]*\{\s*direction: ltr;\s*unicode-bidi: isolate;", css)
    assert "vazirmatn" in css and "33.0.3" in css and "Open Font License" in css


def test_lessons_module_stays_light():
    source = (LESSON_DIR / "__init__.py").read_text()
    assert not re.search(r"^\s*(import|from)\s+(gradio|torch)", source, re.M)


def test_a_count_of_one_takes_its_singular_where_the_table_has_one():
    assert lessons.text("en", "app.n_rows", n=1) == "1 row" and lessons.text("en", "app.n_rows", n=2) == "2 rows"
    assert lessons.text("en", "app.batch_now", rows=lessons.Said("app.n_rows", n=1),
                        users=lessons.Said("app.n_users", n=1)) == "Batch now: 1 row from 1 user"
    assert lessons.say("en", lessons.Said("playground.pass_tokens", n=1, rows="1 row", drafts="0 verified drafts")).startswith("**1** token per")


def test_a_stored_sentence_comes_back_whole_and_a_strange_one_is_refused():
    """lessons.stored: a recording keeps its sentences as data a replay says in its reader's language;
    a shared file is untrusted, so a key outside the stored ones, a deep nesting, an odd value and a file
    with too many values are refused."""
    from specviz.lessons import Key, Listed, Said
    from specviz.lessons.stored import MAX_NESTING, Budget, NotSaid, TooMany, from_plain, to_plain

    prefixes = ("playground.fast.",)
    said = Said("playground.fast.in_c", weights=Said("playground.fast.weights", layouts="rows"),
                rows=Listed([Key("playground.fast.rows_one"), Key("playground.fast.rows_few")]))
    back = from_plain(json.loads(json.dumps(to_plain(said))), prefixes, Budget(100))
    assert back == said == "weights rows; layers in C (1 row, 2-16 rows)"
    assert lessons.say("fa", back) == lessons.say("fa", said) != str(said)
    assert from_plain(3, prefixes, Budget(1)) == 3 and from_plain("onednn", prefixes, Budget(1)) == "onednn"
    deep = "x"
    for _ in range(MAX_NESTING + 2):
        deep = {"listed": [deep]}
    huge = {"said": "playground.fast.graphs_n", "values": {"label": "x", "graphs": 10 ** 400}}
    for bad in ({"said": "no.such.key", "values": {}}, {"key": "playground"}, {"key": "chapter.policies.body"},
                deep, {"listed": "abc"}, {"said": "playground.fast.weights", "values": {"not a name": 1}},
                {"what": 1}, ["a"], "x" * 201, float("nan"), float("inf"), huge, "lone \ud800 surrogate"):
        with pytest.raises(NotSaid):
            from_plain(bad, prefixes, Budget(1000))
    many = {"listed": [{"listed": ["a"] * 16}] * 16}
    with pytest.raises(TooMany):
        from_plain(many, prefixes, Budget(200))


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_lesson_names_the_article_it_follows(lang):
    """Chapter 4 ended "The article's claim holds on this machine" where no chapter had named an article."""
    assert "Joe Barrow" in lessons.text(lang, "chapter.intro.body")
    assert "Why is Speculative Decoding Fast?" in lessons.text(lang, "chapter.intro.body")
    assert "Barrow" in lessons.template(lang, "chapter.breadth_depth.conclusion_holds")


@pytest.mark.parametrize("lang", ["en", "fa"])
def test_the_policies_workload_says_it_is_not_the_sweeps(lang):
    """Chapter 6 had k = 4 at 1.21× at batch 4 and chapter 7 every policy 0.80–0.88× there, with nothing to
    say the prompts differ (the lesson's prompt in every row, against the pool's)."""
    said = lessons.text(lang, "chapter.policies.workload", prompts=9, max_new=32, batches="1, 4", depth=4)
    assert "sweep" in said and "9" in said
