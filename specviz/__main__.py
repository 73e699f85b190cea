"""Command line: `python -m specviz generate | bench-hf | calibrate | roofline | sweep | kernels | …`.

Every user error ends as one line on stderr and a non-zero exit, never a traceback
(set SPECVIZ_DEBUG=1 to see tracebacks while developing)."""
from __future__ import annotations

import argparse
import os
import sys

from specviz.cli import bench, bench_vllm, classroom, download, generate, hardware_cmds, tiny, whatif
from specviz.cli.args import negatives_attached
from specviz.cli.common import CompileError, compile_from_env, naming_flag
from specviz.engine.policies import PolicyError
from specviz.limits import LimitError
from specviz.pairs.models import ModelError


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, not argparse's usage block
        raise UsageError(message)


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # on first use: transformers is slow to import
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m specviz", description="SpecViz: speculative decoding, measured.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
    generate.add_parser(sub)
    bench.add_parser(sub)
    tiny.add_parser(sub)
    download.add_parser(sub)
    hardware_cmds.add_parsers(sub)
    classroom.add_parser(sub)
    whatif.add_parser(sub)
    bench_vllm.add_parser(sub)
    from specviz.cli import kernels
    kernels.add_parser(sub)
    from specviz.cli import frontier
    frontier.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(negatives_attached(sys.argv[1:] if argv is None else argv))
        compile_from_env(args)
        _quiet_libraries()
        return int(args.func(args) or 0)
    except (UsageError, ModelError, LimitError, PolicyError, CompileError) as exc:
        print(f"specviz: error: {naming_flag(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("specviz: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # an unexpected failure still gets one readable line
        if os.environ.get("SPECVIZ_DEBUG", "0") not in ("", "0"):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        print(f"specviz: error: {type(exc).__name__}: {first}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
