"""SpecViz web app: `python app.py [--target REF] [--draft REF] [--host H] [--port P]`.

Env: SPECVIZ_TARGET, SPECVIZ_DRAFT, SPECVIZ_HOST, SPECVIZ_PORT, SPECVIZ_COMPILE (the fast path:
auto | static | on | off, default auto; `--compile`), and SPECVIZ_ALLOW_CUSTOM=1 to let
visitors type their own "draft → target" pair (off by default: on a shared Space any hub id would load),
SPECVIZ_VLLM_URL (`--vllm-url`: a vLLM server whose model the pair list then offers), `--vllm-launch`
(start a local vLLM server for the offline n-gram pair from .venv-vllm; SPECVIZ_VLLM_PORT picks its port).
Serves on 127.0.0.1:7860 by default
(on Hugging Face Spaces, where SPACE_ID is set, on 0.0.0.0 as Spaces expects)."""
from __future__ import annotations

import argparse
import os


def parse_args(argv=None):
    from specviz.cli.args import int_in
    from specviz.limits import MAX_DEPTH

    port = int_in(1, 65535)
    on_space = bool(os.environ.get("SPACE_ID"))
    p = argparse.ArgumentParser(description="SpecViz: speculative decoding, measured")
    p.add_argument("--target", default=os.environ.get("SPECVIZ_TARGET"))
    p.add_argument("--draft", default=os.environ.get("SPECVIZ_DRAFT"))
    p.add_argument("--host", default=os.environ.get("SPECVIZ_HOST", "0.0.0.0" if on_space else "127.0.0.1"))
    p.add_argument("--port", type=port, default=None, help="default 7860, or SPECVIZ_PORT")
    p.add_argument("--compile", default=os.environ.get("SPECVIZ_COMPILE", "auto"),
                   help="fast path (static KV cache, compact forward; CUDA graphs on CUDA): auto | static | on | off. "
                        "Pairs are served eagerly while it warms up in the background; auto switches where "
                        "it measured faster here (default auto; off on ZeroGPU)")
    p.add_argument("--vllm-url", action="append", default=None,
                   help="a vLLM server (http://HOST:PORT) to offer as pairs labelled 'vLLM (…)'; repeatable. "
                        "Env SPECVIZ_VLLM_URL (comma-separated). Operator only: the page never takes a URL")
    p.add_argument("--vllm-launch", action="store_true",
                   help="start a local vLLM server (offline SmolLM2-135M, n-gram draft, k = --vllm-depth) from "
                        ".venv-vllm (bash scripts/vllm-setup); moving the depth slider starts one for that k "
                        "(kept while memory allows); all stopped when the app stops")
    p.add_argument("--vllm-depth", type=int_in(0, MAX_DEPTH), default=4,
                   help=f"k of the first launched vLLM server, 0 to {MAX_DEPTH} (default 4; 0: no speculation)")
    p.add_argument("--vllm-eager", action="store_true",
                   help="launch it with --enforce-eager: no compile at start (minutes sooner on a busy CPU, slower)")
    args = p.parse_args(argv)
    if args.port is None:
        try:
            args.port = port(os.environ.get("SPECVIZ_PORT", "7860"))
        except argparse.ArgumentTypeError as exc:
            p.error(f"SPECVIZ_PORT {exc}")
    if args.vllm_url is None:
        args.vllm_url = [u for u in os.environ.get("SPECVIZ_VLLM_URL", "").split(",") if u.strip()]
    from specviz.fastpath import CompileError, check_compile

    try:
        args.compile = check_compile(args.compile)
    except CompileError as exc:
        p.error(str(exc))
    if bool(args.target) != bool(args.draft):
        p.error("give both --target and --draft (or neither, for the presets)")
    return args


def _exit_cleanly_on_sigterm() -> None:
    """SIGTERM (a stopped Space, a test tearing down) exits through Python's normal shutdown, so
    multiprocessing ends the daemon workers this process forked instead of leaving them orphaned."""
    import signal
    import sys

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))


def _log_to_stderr() -> None:
    """The app's own notes (which forward path serves a pair, and why) on stderr; libraries stay quiet."""
    import logging

    log = logging.getLogger("specviz")
    if not log.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s specviz: %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)


def _leave_a_core_for_the_server() -> None:
    """On a CPU, run the models on all cores but one (SPECVIZ_THREADS overrides): the web server, and often
    the browser on the same laptop, need a core while a Run streams. Measured on 2 cores with the page
    open beside it (fast path, default Run): two model threads 17.5 tok/s and 0.57× plain decoding, as
    OpenMP's threads wait for each other whenever the page takes a core; one thread 52.2 tok/s and 1.24×."""
    import torch

    if torch.cuda.is_available():
        return
    want = os.environ.get("SPECVIZ_THREADS", "")
    n = int(want) if want.isdigit() and int(want) > 0 else max(1, torch.get_num_threads() - 1)
    torch.set_num_threads(n)
    import logging

    logging.getLogger("specviz").info("model threads on this CPU: %d of %d cores", n, os.cpu_count() or 0)


def _build_cpu_kernel() -> None:
    """Build (or load from the user cache) our CPU kernel before serving (specviz/fastpath/rows.py): built
    later, by the first pair's warm-up, its ~1 s of compiling fell on the moment a class connects (two of
    fifty connections timed out in the load test)."""
    if os.environ.get("SPECVIZ_COMPILE", "") == "off":          # the eager path uses no kernel
        return
    from specviz.fastpath import rows
    from specviz.hardware.threads import own_thread

    own_thread(rows.library)      # its check runs a parallel product: no OpenMP pool left in the main thread


def _vllm_endpoints(args) -> list:
    """The operator's vLLM servers (none unless asked for: the default stays our own engine)."""
    if not args.vllm_url and not args.vllm_launch:
        return []
    from specviz.vllm.backend import Endpoint
    from specviz.vllm.launcher import free_port
    from specviz.vllm.pool import LaunchedPool

    eps = [Endpoint.from_url(u.strip()) for u in args.vllm_url]
    if args.vllm_launch:
        first = int(os.environ.get("SPECVIZ_VLLM_PORT", "0")) or free_port()
        ports = iter([first])             # the first server on the operator's port, later ones on free ports

        def launch(k: int) -> Endpoint:
            return Endpoint.launch("smollm2-135m-offline", "ngram", k, next(ports, None) or free_port(),
                                   eager=args.vllm_eager)
        eps.append(LaunchedPool("smollm2-135m-offline", "ngram", args.vllm_depth, launch))
    return eps


def main(argv=None) -> None:
    args = parse_args(argv)
    _log_to_stderr()
    if os.environ.get("SPACES_ZERO_GPU"):
        args.compile = "off"       # ZeroGPU supports no torch.compile; its workers run the eager path
    # every pair the app loads (specviz.serve.catalog.PairCache) reads the forward path from here
    os.environ["SPECVIZ_COMPILE"] = args.compile
    _exit_cleanly_on_sigterm()
    from specviz.serve.heap import limit_arenas

    limit_arenas()       # a classroom runs handlers on many threads: not one malloc arena each
    if os.environ.get("SPACES_ZERO_GPU"):
        try:
            import spaces  # noqa: F401  (ZeroGPU: must be imported before anything initialises CUDA)
        except ImportError:
            pass
    else:
        _leave_a_core_for_the_server()
        _build_cpu_kernel()
    from specviz.ui import SpecVizApp, build_blocks
    from specviz.ui.server import launch_kwargs

    allow_custom = os.environ.get("SPECVIZ_ALLOW_CUSTOM", "0").lower() in ("1", "true", "yes")
    app = SpecVizApp(args.target, args.draft, allow_custom=allow_custom, vllm=_vllm_endpoints(args))
    blocks = build_blocks(app)
    # Runs share one batch per pair (specviz.serve.scheduler), so many may stream at once; the generate
    # event sets its own limit from the classroom limits
    blocks.queue(default_concurrency_limit=8, max_size=256)
    blocks.launch(server_name=args.host, server_port=args.port, show_error=False, **launch_kwargs())


if __name__ == "__main__":
    main()
