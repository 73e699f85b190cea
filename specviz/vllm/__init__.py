"""SpecViz on vLLM: a serving engine SpecViz talks to over HTTP (no gradio here, no vLLM import either —
vLLM lives in its own venv, `.venv-vllm`, made by `bash scripts/vllm-setup`).

- `client`: a vLLM OpenAI-compatible server's /v1/models, /health and streamed /v1/completions with the
  prompt as token ids; every failure becomes one sentence (`VllmError`).
- `steps`: a streamed completion → the step events the playground draws (accepted drafts, the target's
  own token, rejected-draft *counts*: vLLM does not return rejected drafts' text).
- `metrics`: the server's Prometheus /metrics → numbers and live series (batch, waiting, acceptance…).
- `launcher`: starts a local server for a SpecViz pair from `.venv-vllm` and stops it with SpecViz.
- `run`: N concurrent requests (the batch slider) → one merged stream of step events.
- `lesson`: a recorded vLLM sweep (assets/sweeps/) as the lesson's sweep and policies charts read it.
"""
