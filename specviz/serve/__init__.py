"""The serving layer the pages and the CLI share (no gradio): the pair catalog, the shared scheduler, the
run router, live controls and state, recordings, and the vLLM router."""
