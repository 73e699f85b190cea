"""The Gradio app. The only package that imports gradio; `app.py` at the top level only wires flags."""
from specviz.ui.server import SpecVizApp, build_blocks  # noqa: F401
