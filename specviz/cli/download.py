"""`python -m specviz download`: fetch the hub preset pairs into the local Hugging Face cache while
online, so the app and the CLI can use them later in an offline classroom (HF_HUB_OFFLINE=1)."""
from __future__ import annotations

from specviz.pairs.models import HUB_PRESETS, ModelError, convert_gguf, offline_gguf_path


def add_parser(sub) -> None:
    p = sub.add_parser("download", help="pre-download the preset model pairs for offline use")
    which = p.add_mutually_exclusive_group()        # --all with --preset would fetch every preset in silence
    which.add_argument("--preset", action="append", default=None,
                       help="a preset name, exactly as listed (repeatable): " + "; ".join(f"'{n}'" for n in HUB_PRESETS)
                            + "; default: the first")
    which.add_argument("--all", action="store_true", help="every preset, including the GPU-sized ones")
    p.set_defaults(func=run)


def run(args) -> int:
    # on first use: huggingface_hub is slow to import
    from huggingface_hub import snapshot_download


    names = list(HUB_PRESETS) if args.all else (args.preset or [next(iter(HUB_PRESETS))])
    unknown = [n for n in names if n not in HUB_PRESETS]
    if unknown:
        raise ModelError(f"unknown preset {unknown[0]!r}; presets: {', '.join(HUB_PRESETS)}")
    repos = sorted({r for n in names for r in HUB_PRESETS[n]})
    for repo in repos:
        print(f"downloading {repo} …", flush=True)
        try:
            path = snapshot_download(repo, allow_patterns=["*.json", "*.safetensors", "*.txt", "*.model",
                                                           "*.jinja", "tokenizer*"])
        except Exception as exc:
            raise ModelError(f"could not download {repo}: {str(exc).splitlines()[0]}") from exc
        print(f"  cached at {path}")
    try:
        print(f"offline model ready at {convert_gguf(offline_gguf_path())}")
    except ModelError as exc:
        print(f"offline model not prepared: {exc}")
    return 0
