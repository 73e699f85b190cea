"""Shipping checks: the Spacefile, the Spaces front matter, offline start."""
import re
import urllib.request
from pathlib import Path

import yaml
from apphelp import start_app, stop_app

ROOT = Path(__file__).resolve().parents[1]


def app_env_names() -> set[str]:
    """Every SPECVIZ_* setting the app reads: app.py and the classroom limits."""
    text = (ROOT / "app.py").read_text() + (ROOT / "specviz" / "limits.py").read_text()
    return set(re.findall(r"SPECVIZ_[A-Z_]+", text))


def test_spacefile_is_valid_and_in_sync():
    spec = yaml.safe_load((ROOT / "Spacefile").read_text())
    assert spec["v"] == 0
    (micro,) = spec["micros"]
    assert micro["primary"] is True and "app.py" in micro["run"]
    assert micro["engine"].startswith("python")
    names = {e["name"] for e in micro["presets"]["env"]}
    assert names == app_env_names() == {"SPECVIZ_TARGET", "SPECVIZ_DRAFT", "SPECVIZ_HOST", "SPECVIZ_PORT",
                                        "SPECVIZ_ALLOW_CUSTOM", "SPECVIZ_COMPILE", "SPECVIZ_THREADS",
                                        "SPECVIZ_MAX_ROWS_PER_USER",
                                        "SPECVIZ_MAX_SHARED_ROWS", "SPECVIZ_MAX_QUEUE", "SPECVIZ_VLLM_URL",
                                        "SPECVIZ_VLLM_PORT"}
    assert all(e.get("description") and "default" in e for e in micro["presets"]["env"])


def test_readme_front_matter_for_spaces():
    text = (ROOT / "README.md").read_text()
    assert text.startswith("---\n")
    meta = yaml.safe_load(text.split("---\n")[1])
    import gradio

    assert meta["sdk"] == "gradio" and meta["sdk_version"] == gradio.__version__
    assert (ROOT / meta["app_file"]).is_file()
    assert str(meta["python_version"]).startswith("3.11")
    for key in ("short_description", "tags", "models", "preload_from_hub", "suggested_hardware"):
        assert meta.get(key), key
    assert len(meta["short_description"]) <= 60


def test_requirements_pin_a_cpu_friendly_torch():
    reqs = (ROOT / "requirements.txt").read_text()
    assert re.search(r"^torch==\d", reqs, re.M)
    import gradio

    assert f"gradio=={gradio.__version__}" in reqs


def test_app_starts_offline_without_cache(tmp_path):
    env = {"HF_HOME": str(tmp_path / "hf"), "SPECVIZ_CACHE": str(tmp_path / "cache")}
    proc, url = start_app("", "", tmp_path / "app.log", env)
    try:
        page = urllib.request.urlopen(url, timeout=10).read().decode()
        assert "SpecViz" in page
        config = urllib.request.urlopen(url + "config", timeout=10).read().decode()
        assert "Offline classroom mode" in config
        assert "SmolLM2-135M (offline)" in config
        assert "HuggingFaceTB/SmolLM2-360M" not in config       # hub presets hidden: not cached
    finally:
        stop_app(proc)
