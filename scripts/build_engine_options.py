#!/usr/bin/env python3
"""Build ``capability_db/engines/options.json``: the command-line options of each modelled engine release, read from
the engine's REAL argument parser, so ``moedispatch lint`` reads a launch as the engine would (a misspelled flag is an
error with a did-you-mean, and a flag's value is never mistaken for the model).

Runs in ``.peers-venv`` (``tests/peers/setup_env.sh``: vLLM 0.33.0 and SGLang 0.5.23 installed ``--no-deps`` beside the
CPU torch)::

    .peers-venv/bin/python scripts/build_engine_options.py            # writes the file
    .peers-venv/bin/python scripts/build_engine_options.py --check    # exit 1 when the committed file differs

Parsers: vLLM ``vllm.entrypoints.common.cli_args.make_arg_parser(FlexibleArgumentParser())`` (the ``vllm serve``
parser; its defaults need a platform, so vLLM's CPU platform is set — parsing does not depend on it) and SGLang
``ServerArgs.add_cli_args(argparse.ArgumentParser())`` (``sglang.launch_server``). Kept per option: its strings and
whether it takes a value. ``tests/peers/test_engine_options.py`` rebuilds it and compares.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import version
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "capability_db" / "engines" / "options.json"


def _dests(parser: argparse.ArgumentParser) -> dict[str, str]:
    """option string → the argparse dest it sets (aliases share one: SGLang's --tp-size / --tensor-parallel-size)."""
    return {o: a.dest for o, a in sorted(parser._option_string_actions.items())  # noqa: SLF001
            if not isinstance(a, argparse._HelpAction)}  # noqa: SLF001


def _options(parser: argparse.ArgumentParser) -> tuple[list[str], list[str]]:
    """(options taking a value, options taking none), sorted — every option string the parser resolves, hidden
    aliases included (vLLM's EnableDisableAction keeps --no-enable-x registered but out of help)."""
    values, flags = set(), set()
    for option, action in parser._option_string_actions.items():  # noqa: SLF001 - argparse's own lookup table
        if isinstance(action, argparse._HelpAction):  # noqa: SLF001
            continue
        takes = action.nargs != 0 and not isinstance(action, (argparse._StoreTrueAction,  # noqa: SLF001
                                                                argparse._StoreFalseAction,  # noqa: SLF001
                                                                argparse._StoreConstAction,  # noqa: SLF001
                                                                argparse.BooleanOptionalAction))
        (values if takes else flags).add(option)
    return sorted(values), sorted(flags)


def build() -> str:
    import vllm.platforms as platforms
    from vllm.platforms.cpu import CpuPlatform

    platforms._current_platform = CpuPlatform()  # noqa: SLF001 - the parser's defaults ask for a platform
    from sglang.srt.server_args import ServerArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    sp = argparse.ArgumentParser()
    ServerArgs.add_cli_args(sp)
    doc = {"schema": "moedispatch.engine_options/1",
           "generated_by": "scripts/build_engine_options.py (the engines' own argument parsers); do not edit",
           "vllm": {}, "sglang": {}}
    for engine, parser, source in (
            ("vllm", make_arg_parser(FlexibleArgumentParser()),
             "vllm-project/vllm@v{v}:vllm/entrypoints/common/cli_args.py make_arg_parser (vllm serve)"),
            ("sglang", sp, "sgl-project/sglang@v{v}:python/sglang/srt/server_args.py ServerArgs.add_cli_args")):
        v = version(engine)
        takes, none = _options(parser)
        doc[engine][v] = {"source": source.format(v=v), "value_options": takes, "flag_options": none,
                          "allow_abbrev": bool(parser.allow_abbrev), "dest": _dests(parser),
                          # FlexibleArgumentParser reads --tensor_parallel_size as --tensor-parallel-size
                          "underscores": engine == "vllm"}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    text = build()
    if args.check:
        same = OUT.is_file() and OUT.read_text() == text
        print(f"{OUT}: {'identical to a rebuild' if same else 'DIFFERS from a rebuild'}")
        return 0 if same else 1
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
