"""Argument types the commands share: each refuses a bad value at parse time, before any model loads or any
measurement runs, with one sentence that argparse prefixes with the flag ("argument --repeats: must be a
whole number from 1 to 20, not 0")."""
from __future__ import annotations

import argparse
import os
import re
import tempfile
from pathlib import Path

_DEVICE = re.compile(r"(cpu|cuda)(:\d+)?")
_NEGATIVE = re.compile(r"-\d")


def negatives_attached(argv: list[str]) -> list[str]:
    """`--depths -1,2` as `--depths=-1,2`: argparse reads a value that starts like a negative number list as
    a flag and says only "expected one argument"; attached, the flag's own check names what is wrong."""
    out: list[str] = []
    for tok in argv:
        prev = out[-1] if out else ""
        if _NEGATIVE.match(tok) and prev.startswith("--") and prev != "--" and "=" not in prev:
            out[-1] = f"{prev}={tok}"
        else:
            out.append(tok)
    return out


def device(value: str) -> str:
    """cpu, cuda or cuda:N; cuda only where torch sees a GPU (a calibration is stored under its device)."""
    text = value.strip().lower()
    if not _DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"must be cpu, cuda or cuda:N, not {value!r}")
    if text.startswith("cuda"):
        # on first use: torch is slow to import
        import torch

        if not torch.cuda.is_available():
            raise argparse.ArgumentTypeError("this machine has no CUDA GPU that torch can use; use cpu")
        index = int(text.split(":")[1]) if ":" in text else 0
        if index >= torch.cuda.device_count():
            raise argparse.ArgumentTypeError(f"there is no {text}: torch sees {torch.cuda.device_count()} GPU(s)")
    return text


def int_in(lo: int, hi: int):
    """A whole number from lo to hi."""
    def parse(value: str) -> int:
        try:
            n = int(value)
        except ValueError:
            n = None
        if n is None or not lo <= n <= hi:
            raise argparse.ArgumentTypeError(f"must be a whole number from {lo} to {hi}, not {value!r}")
        return n
    parse.__name__ = f"whole number {lo}-{hi}"
    return parse


def whole_numbers(text: str, lo: int, hi: int) -> list[int]:
    """"1,4,16" → [1, 4, 16]: whole numbers from lo to hi separated by commas, sorted, each once; else
    ValueError with the sentence (without the flag, which its caller names)."""
    try:
        values = sorted({int(x) for x in str(text).split(",")})
    except ValueError:
        values = []
    if not values or any(not lo <= v <= hi for v in values):
        raise ValueError(f"must be whole numbers from {lo} to {hi} separated by commas (like {lo},{hi}), "
                         f"not {text!r}")
    return values


def int_list(lo: int, hi: int):
    """`whole_numbers` as an argument type: argparse names the flag in the refusal."""
    def parse(value: str) -> list[int]:
        try:
            return whole_numbers(value, lo, hi)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    parse.__name__ = f"whole numbers {lo}-{hi}"
    return parse


def model_ref(env: str | None = None):
    """A model reference; one written as a path (/…, ./…, ../…, ~…) must exist, so a typo is named by its
    flag at once, not after the other model has loaded (and by `env` where that variable gave it)."""
    def parse(value: str) -> str:
        text = value.strip()
        if text.startswith(("/", "./", "../", "~")) and not _exists(text):
            given = f" (given by {env})" if env and os.environ.get(env) == value else ""
            raise argparse.ArgumentTypeError(f"there is no model at {text}{given}: the path does not exist")
        return value
    parse.__name__ = "model reference"
    return parse


def _exists(path: str) -> bool:
    try:
        return Path(path).expanduser().exists()
    except RuntimeError:            # ~someone with no home directory here
        return False


def given_flags(args, defaults: dict[str, object]) -> list[str]:
    """The flags among `defaults` (dest → its default) whose value differs from it, as typed: --batch-sizes."""
    return ["--" + dest.replace("_", "-") for dest, default in defaults.items() if getattr(args, dest) != default]


def _writable_at(path: Path) -> None:
    """Refuse `path` unless a folder can be made there: its nearest existing parent is a writable folder
    (tried by making and removing a folder in it, which is what counts; permission bits can say yes to
    root where the filesystem says no)."""
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{parent} is a file, so nothing can be written under it")
    try:
        os.rmdir(tempfile.mkdtemp(dir=parent, prefix=".specviz-probe-"))
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot write under {parent}: the system refused ({exc.strerror or exc})") from None


def out_folder(value: str) -> str:
    """A folder to write results into (made if missing; files in it are replaced)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("needs a folder name, not an empty string")
    path = Path(value).expanduser()
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a file, not a folder")
    _writable_at(path)
    return value


def new_folder(value: str) -> str:
    """A folder to write a model into: missing or empty (a model's files would replace what is there)."""
    out_folder(value)
    path = Path(value).expanduser()
    if path.is_dir() and any(path.iterdir()):
        raise argparse.ArgumentTypeError(f"{value} is not empty; name a new or empty folder")
    return value


def out_file(value: str) -> str:
    """A file to write (replaced if it exists)."""
    if not value.strip():
        raise argparse.ArgumentTypeError("needs a file name, not an empty string")
    path = Path(value).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{value} is a folder, not a file")
    _writable_at(path.parent)
    return value
