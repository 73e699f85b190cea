"""What a curious class sends: out-of-range and wrong-typed values, huge and empty prompts, unicode, RTL,
control and zero-width characters, markup and script payloads, unknown and mismatched models — through
the Gradio API (which bypasses the sliders) and the CLI. Each gets a clear sentence or a correct result,
and the app is alive afterwards."""
import pytest
from apphelp import client, pair_label, unexpected_tracebacks
from conftest import ROWS_CAP

GENERIC = "upstream Gradio app has raised an exception"
DEFAULT = dict(prompt="the quick brown", batch=1, depth=2, policy="fixed", threshold=8, temperature=0, max_new=8)

PROMPTS_OK = ["你好，世界", "سلام دنیا، این یک آزمایش است", "שלום עולם", "🔭🚀✨", "\u200b\u200c\u200d",
              "abc \u202e evil \u202c", "\x00\x01\x07 bell", "\x1b[31mred\x1b[0m", "<script>alert(1)</script>",
              '<img src=x onerror="alert(2)">', "{{7*7}} ${7*7}", "'; DROP TABLE students; --", "%s%n%x",
              "\r\n" * 20 + "end", "a" * 1000, "مدل draft و target در یک forward pass"]
PROMPTS_BAD = ["", "   ", "\n\t", "\u00a0\u00a0", "a b " * 3000, "a" * 25_000, "x" * 200_000]
VALUES_BAD = [("batch", v) for v in (0, -1, ROWS_CAP + 1, 65, 100_000, 2.5, "two", None)] + \
             [("depth", v) for v in (-3, 17, 10**9, 1.5, "deep", None)] + \
             [("temperature", v) for v in (-0.1, 2.5, 100, "hot", None)] + \
             [("max_new", v) for v in (0, -5, 100_000, 7.5, "many", None)] + \
             [("policy", v) for v in ("bogus", "", "FIXED", "<script>x</script>", "x" * 1000, 123)] + \
             [("threshold", v, p) for v, p in ((8, "confidence"), (-1, "confidence"), ("half", "confidence"),
                                               (-2, "disable-by-batch-size"), (2.5, "disable-by-batch-size"))]
NAMED = {"batch": "batch size", "depth": "depth", "temperature": "temperature", "max_new": "new tokens",
         "policy": "policy", "threshold": "threshold"}    # what the refusal calls each parameter
PAIRS_BAD = ["no such pair", "", "../../etc/passwd", "x" * 10_000, "<b>pair</b>", "ngram",
             "foreign → target", "hf-internal-testing/not-a-model-xyz → target", "layerskip:9-1 → target"]


def call(c, label, **over):
    a = {**DEFAULT, **over}
    return c.predict(a["prompt"], over.get("pair", label), a["batch"], a["depth"], a["policy"], a["threshold"],
                     a["temperature"], a["max_new"], api_name="/generate")


def expect_sentence(fn):
    """The call fails with a readable sentence from the app (never the generic upstream message or a
    traceback). Only the app's own reply counts: a value the client refuses before sending proves nothing
    about the app."""
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError) as info:
        fn()
    msg = str(info.value)
    assert msg and GENERIC not in msg and "Traceback" not in msg and len(msg) < 600, msg
    return msg


@pytest.fixture(scope="module")
def api(classroom):
    _, url, log = classroom
    c = client(url)
    return c, pair_label(c), log


@pytest.mark.parametrize("text", PROMPTS_OK, ids=range(len(PROMPTS_OK)))
def test_api_odd_prompts_give_results(api, text):
    c, label, _ = api
    out = call(c, label, prompt=text)[-1]
    assert out["done"] and len(out["outputs"][0]) == DEFAULT["max_new"]


@pytest.mark.parametrize("text", PROMPTS_BAD, ids=range(len(PROMPTS_BAD)))
def test_api_empty_or_huge_prompts_are_refused(api, text):
    c, label, _ = api
    msg = expect_sentence(lambda: call(c, label, prompt=text))
    assert "empty" in msg or "characters" in msg or "long" in msg


@pytest.mark.parametrize("case", VALUES_BAD, ids=range(len(VALUES_BAD)))
def test_api_bad_values_are_refused(api, case):
    c, label, _ = api
    if case[0] == "threshold":
        over = {"threshold": case[1], "policy": case[2]}
    else:
        over = {case[0]: case[1]}
    msg = expect_sentence(lambda: call(c, label, **over))
    # the README's promise: the sentence names the parameter
    assert NAMED[case[0]] in msg.lower(), (case, msg)


@pytest.mark.parametrize("pair", PAIRS_BAD, ids=range(len(PAIRS_BAD)))
def test_api_unknown_and_mismatched_pairs_are_refused(api, pair, tiny_paths):
    c, label, _ = api
    pair = pair.replace("foreign", tiny_paths["foreign"]).replace("→ target", f"→ {tiny_paths['target']}")
    msg = expect_sentence(lambda: call(c, label, pair=pair))
    assert "pair" in msg.lower() or pair in msg, msg       # names the parameter, or quotes the pair


def test_api_still_exact_after_the_onslaught(api, greedy):
    c, label, log = api
    out = call(c, label, batch=2, depth=4, max_new=24)[-1]
    assert all(o == greedy(ids, 24) for ids, o in zip(out["prompt_ids"], out["outputs"]))
    assert not unexpected_tracebacks(log.read_text())


# --- the CLI: one line on stderr, non-zero exit, no traceback; or a correct result -----------------------
CLI_BAD = [["--batch-size", v] for v in ("0", "-1", "65", "100000", "2.5", "two", "")] + \
          [["--depth", v] for v in ("-3", "17", "1000000000", "1.5", "deep")] + \
          [["--temperature", v] for v in ("-0.1", "2.5", "100", "hot", "nan", "inf")] + \
          [["--max-new-tokens", v] for v in ("0", "-5", "100000", "many")] + \
          [["--prompt", v] for v in ("", "   ", "\u00a0", "x" * 25_000)] + \
          [["--policy", v] for v in ("bogus", "", "<script>")] + \
          [["--policy", "confidence", "--threshold", v] for v in ("8", "-1", "half", "nan")] + \
          [["--policy", "disable-by-batch-size", "--threshold", v] for v in ("-2", "2.5")] + \
          [["--policy", "batch-table", "--batch-table", v] for v in ("1:99", "0:2", "a:b", "1-2")] + \
          [["--policy", "adaptive", "--max-depth", v] for v in ("-1", "99")] + \
          [["--draft", v] for v in ("layerskip:5-1", "layerskip:a-b", "layerskip:0-99", "no/such-draft", "ngram2")] + \
          [["--target", v] for v in ("no/such-model-here", "/nonexistent/dir", "shape:SmolLM2-135M")] + \
          [["--no-such-flag"], ["--seed", "x"]]
CLI_OK = ["你好", "سلام دنیا", "<script>alert(1)</script>", "\u200b", "\x1b[31mred", "'; DROP TABLE x; --"]


def run_cli(capsys, tiny_paths, *extra):
    from specviz.__main__ import main

    base = ["generate", "--target", tiny_paths["target"], "--draft", "ngram", "--max-new-tokens", "3", "--raw"]
    rc = main(base + list(extra))
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


@pytest.mark.parametrize("args", CLI_BAD, ids=range(len(CLI_BAD)))
def test_cli_bad_input_is_one_line(capsys, tiny_paths, args):
    rc, _, err = run_cli(capsys, tiny_paths, *args)
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert rc != 0 and len(lines) == 1 and lines[0].startswith("specviz: error:"), err
    assert "Traceback" not in err and len(lines[0]) < 400


@pytest.mark.parametrize("text", CLI_OK, ids=range(len(CLI_OK)))
def test_cli_odd_prompts_give_results(capsys, tiny_paths, text):
    import json

    rc, out, err = run_cli(capsys, tiny_paths, "--prompt", text, "--json")
    assert rc == 0, err
    final = json.loads(out.strip().splitlines()[-1])
    assert final["done"] and len(final["outputs"][0]) == 3
    assert "shared_batch_max" in final and "users_max" in final

