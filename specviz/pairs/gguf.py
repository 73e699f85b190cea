"""A `.gguf` file → a safetensors model directory in SpecViz's cache, converted once.

Dequantising takes ~25 s on a laptop CPU and writes ~0.5 GB, so each conversion is kept in
`cache_root()/gguf/NAME-KEY`, KEY a digest of the file's bytes: a copy of the same file in another
virtual environment reuses it. Each conversion lists the files that used it (`sources.txt`); a new one
removes the conversions of the same file name that no living file uses any more (a fresh clone's venv,
deleted, had left 0.5 GB behind each time) or that this very file used before it changed.
"""
from __future__ import annotations

import functools
import hashlib
import re
import shutil
import tempfile
import threading
from pathlib import Path

from specviz.lessons import Said
from specviz.machine import cache_root

SOURCES = "sources.txt"
_lock = threading.Lock()      # one conversion at a time in a process: a second caller finds the first's


class GgufError(ValueError):
    """A GGUF that cannot be read (its argument is a Said)."""


@functools.lru_cache(maxsize=8)
def _content_key(path: str, size: int, mtime_ns: int) -> str:
    """A digest of the file's bytes (~0.1 s for the offline GGUF), once per file version and process."""
    digest = hashlib.blake2b(digest_size=8)
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def cache_dir(path: Path) -> Path:
    st = path.stat()
    key = _content_key(str(path.resolve()), st.st_size, st.st_mtime_ns)
    return cache_root() / "gguf" / f"{path.stem}-{key}"


def _complete(out: Path) -> bool:
    return (out / "config.json").is_file() and (out / "tokenizer.json").is_file()


def _sources(folder: Path) -> list[str]:
    try:
        return [line for line in (folder / SOURCES).read_text().splitlines() if line]
    except OSError:
        return []


def _record(out: Path, source: Path) -> None:
    """Name `source` among the files that use `out` (kept from pruning while any of them lives)."""
    if str(source) not in _sources(out):
        try:
            with open(out / SOURCES, "a") as fh:
                fh.write(f"{source}\n")
        except OSError:       # a read-only cache still serves the conversion
            pass


def _prune(out: Path, source: Path) -> None:
    """Remove the other conversions of this file name that no living file other than `source` uses."""
    stem = out.name.rsplit("-", 1)[0]
    ours = re.compile(re.escape(stem) + r"-[0-9a-f]{16}")     # not another file whose name extends this one
    for old in out.parent.iterdir():
        if old == out or not old.is_dir() or not ours.fullmatch(old.name):
            continue
        users = [s for s in _sources(old) if s != str(source) and Path(s).is_file()]
        if not users:
            shutil.rmtree(old, ignore_errors=True)


def convert(path: Path) -> Path:
    """The converted model directory for the GGUF at `path`, converting it first if needed."""
    source, out = path.resolve(), cache_dir(path)
    with _lock:
        if not _complete(out):
            _write(path, out)
            _prune(out, source)
        _record(out, source)
    return out


def _write(path: Path, out: Path) -> None:
    # on first use: transformers is slow to import
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name)
    except ImportError as exc:
        raise GgufError(Said("errors.needs_gguf", file=path.name, detail=str(exc))) from exc
    except Exception as exc:  # a corrupt or unsupported file
        raise GgufError(Said("errors.bad_gguf", path=str(path), detail=str(exc))) from exc
    # The weights are already dequantised to float; drop the quantizer so save_pretrained accepts them.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        (tmp / SOURCES).write_text(f"{path.resolve()}\n")     # in before it is seen: never pruned as unused
        if out.exists() and not _complete(out):     # a half one from before atomic renames
            shutil.rmtree(out, ignore_errors=True)
        try:
            tmp.rename(out)   # atomic: a crash mid-write never leaves a half cache behind
        except OSError:       # another process renamed its identical conversion there first: use that
            if not _complete(out):
                raise
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
