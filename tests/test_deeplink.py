"""Deep links (specviz.ui.deeplink): what a link asks for and the page cannot give is named, with what it
should have been; a good link, and a copied link's empty parameters, say nothing."""
from types import SimpleNamespace

from specviz import lessons
from specviz.limits import Limits
from specviz.ui.deeplink import ignored, notice


def _app():
    return SimpleNamespace(limits=Limits(), choices=[SimpleNamespace(label="tiny pair")], dials=[])


def _request(**query):
    return SimpleNamespace(query_params=query)


def test_a_good_link_and_empty_parameters_say_nothing():
    app = _app()
    assert notice(app, _request(tab="playground", batch="2", depth="6", pair="tiny pair", policy="fixed",
                                acceptance="0.5", lang="fa"), "en") is None
    assert notice(app, _request(tab="lesson", chapter="", pair="", policy=""), "en") is None


def test_each_bad_parameter_is_named_with_what_it_wants():
    app = _app()
    said = notice(app, _request(tab="nope", batch="abc", depth="-3", policy="bogus", pair="gone",
                                acceptance="2", lang="xx", chapter="zzz"), "en")
    for part in ("tab = nope", "batch = abc", "depth = -3", "policy = bogus", "pair = gone", "acceptance = 2",
                 "lang = xx", "chapter = zzz", "a whole number from 1 to", "a pair this server offers"):
        assert part in said, (part, said)
    assert len(ignored(app, {"batch": "2.5", "depth": "1e9"})) == 2       # not whole, out of range
    cut = notice(app, _request(prompt="x" * (Limits().max_prompt_chars + 1)), "en")
    assert cut and "cut to its first" in cut


def test_the_notice_is_in_the_readers_language():
    said = notice(_app(), _request(batch="abc"), "fa")
    assert said.startswith(lessons.text("fa", "app.link_ignored", items="")[:10]) and "abc" in said


def test_the_playground_settings_and_the_what_if_knobs_ride_the_link():
    app = _app()
    good = dict(tab="whatif", temperature="0.5", max_new="256", gpu="Custom GPU (bandwidth and FLOP/s below)",
                target="Qwen2.5-7B", draft="EAGLE:Qwen2.5-7B", alpha="0.85", context="4096", overhead="1.5",
                model="ideal", bandwidth="2.5", flops="989")
    assert notice(app, _request(**good), "en") is None
    said = notice(app, _request(gpu="GTX 480", target="GPT-9", alpha="2", model="magic", max_new="99999",
                                bandwidth="0"), "en")
    for part in ("gpu = GTX 480", "target = GPT-9", "alpha = 2", "model = magic", "max_new = 99999",
                 "bandwidth = 0", "one of the choices in its list on the What if? tab", "a number from 0 to 0.99"):
        assert part in said, (part, said)


def test_the_draft_comes_with_the_list_of_the_links_target():
    """The draft's list is sent with its value: events the load fired checked a link's EAGLE:Qwen head
    against the default target's list and refused it four times (under load, in CI)."""
    from specviz.ui.deeplink import EXTRA, restore
    from specviz.ui.whatif_views import DEFAULTS, draft_choices

    def draft(lang="en", **query):
        return restore(_app(), _request(**query), lang)[9 + EXTRA.index("draft")]
    linked = draft(target="Qwen2.5-7B", draft="Qwen2.5-0.5B")
    assert linked["value"] == "Qwen2.5-0.5B"
    assert [v for _, v in linked["choices"]] == draft_choices("Qwen2.5-7B")
    assert draft(target="Qwen2.5-7B")["value"] == "EAGLE:Qwen2.5-7B"      # a target alone brings its own head
    assert draft(draft="EAGLE:Qwen2.5-7B")["value"] == DEFAULTS["draft"]  # a head follows the page's target
    plain = draft("fa")                                                    # no knobs: the list, in the language
    assert "value" not in plain and [v for _, v in plain["choices"]] == draft_choices(DEFAULTS["target"])
    assert any(lessons.ARABIC_SCRIPT.search(label) for label, _ in plain["choices"])     # n-gram's label
