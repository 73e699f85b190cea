"""Persian never falls behind English silently (issue 50): `specviz/lessons/fa.sources.json` records, per
key, a hash of the English string the Persian was written against; this fails, naming the keys, when an
English string changed and its Persian was not updated (and recorded with `python -m specviz.lessons.sync`)."""
import json
import shutil

import pytest

from specviz.lessons import sync


def test_persian_is_current_with_english():
    found = sync.drift(sync.read_lang("en"), sync.read_lang("fa"), sync.read_sidecar())
    assert not found, "\n" + found.report()


def test_the_sidecar_sits_beside_fa_toml_and_is_sorted_json():
    text = sync.SIDECAR.read_text(encoding="utf-8")
    record = json.loads(text)
    assert sync.SIDECAR.parent == sync.DIR and list(record) == sorted(record)
    assert all(len(h) == 12 and int(h, 16) >= 0 for h in record.values())
    assert "fa.sources.json" in (sync.DIR / "fa.toml").read_text(encoding="utf-8")     # teachers are told


def test_drift_names_a_changed_english_string_a_missing_persian_and_a_missing_record():
    en = {"a.one": "One token", "a.two": "Two tokens", "a.three": "Three"}
    fa = {"a.one": "یک token", "a.two": "دو token"}
    record = {"a.one": sync.source_hash("One token"), "a.two": sync.source_hash("Two tokens"), "gone": "0" * 12}
    assert not sync.drift({"a.one": en["a.one"]}, fa, {"a.one": record["a.one"]})
    found = sync.drift({**en, "a.two": "Two tokens, now per pass"}, fa, record)
    assert found.changed == ["a.two"] and found.no_persian == ["a.three"] and found.unrecorded == ["a.three"]
    assert found.orphaned == ["gone"]
    report = found.report()
    assert "a.two" in report and "a.three" in report and sync.COMMAND in report
    # a rewrapped string is the same text
    assert sync.source_hash("One  token\n") == sync.source_hash("One token")


@pytest.fixture
def lessons_copy(tmp_path):
    for name in ("en.toml", "fa.toml", "fa.sources.json"):
        shutil.copy(sync.DIR / name, tmp_path / name)
    return tmp_path


def _edit_english(directory, key_line: str, new_line: str) -> None:
    path = directory / "en.toml"
    text = path.read_text(encoding="utf-8")
    assert text.count(key_line) == 1
    path.write_text(text.replace(key_line, new_line), encoding="utf-8")


def test_changing_english_alone_fails_until_the_persian_is_recorded(lessons_copy, capsys):
    """The drift check on a copy of the lesson files: English edited alone is caught; recording the key
    (after updating its Persian) clears it, and only that key's record changes."""
    assert sync.main(["--all-current"], lessons_copy) == 0          # the copy starts current, whatever main is
    assert sync.main(["--check"], lessons_copy) == 0
    before = json.loads((lessons_copy / "fa.sources.json").read_text(encoding="utf-8"))
    _edit_english(lessons_copy, 'label_stop = "Stop"', 'label_stop = "Stop now"')
    assert sync.main(["--check"], lessons_copy) == 1
    assert "app.label_stop" in capsys.readouterr().out
    assert sync.main(["app.label_stop"], lessons_copy) == 0
    after = json.loads((lessons_copy / "fa.sources.json").read_text(encoding="utf-8"))
    assert {k for k in after if after[k] != before.get(k)} == {"app.label_stop"}
    assert sync.main(["--check"], lessons_copy) == 0


def test_sync_takes_patterns_and_new_keys_and_refuses_what_it_cannot_record(lessons_copy, capsys):
    sidecar = lessons_copy / "fa.sources.json"
    assert sync.main(["--all-current"], lessons_copy) == 0
    record = json.loads(sidecar.read_text(encoding="utf-8"))
    # a key added to both files on another branch: --new records it, and nothing else changes
    for lang, value in (("en", "A new line"), ("fa", "یک خط تازه")):
        with open(lessons_copy / f"{lang}.toml", "a", encoding="utf-8") as f:
            f.write(f'\n[zz_new]\nline = "{value}"\n')
    assert sync.main(["--check"], lessons_copy) == 1
    assert sync.main(["--new"], lessons_copy) == 0
    after = json.loads(sidecar.read_text(encoding="utf-8"))
    assert set(after) - set(record) == {"zz_new.line"} and all(after[k] == v for k, v in record.items())
    # patterns, and refusals that leave the record as it was
    assert sync.main(["chapter.frontier.*"], lessons_copy) == 0
    unchanged = sidecar.read_text(encoding="utf-8")
    assert sync.main(["no.such.key"], lessons_copy) == 2
    with open(lessons_copy / "en.toml", "a", encoding="utf-8") as f:
        f.write('only_english = "No Persian yet"\n')
    assert sync.main(["zz_new.only_english"], lessons_copy) == 2
    assert "fa.toml has no: zz_new.only_english" in capsys.readouterr().err
    assert sidecar.read_text(encoding="utf-8") == unchanged
    with pytest.raises(SystemExit):
        sync.main([], lessons_copy)                       # nothing named: argparse's one-line usage error
