"""The ``moedispatch`` command line. Exit 0 ok; 2 bad input or usage (one line on stderr); 3 a layer has no backend.

Only this module configures logging: structlog events go to stderr (console on a TTY, JSON otherwise or with
``--log-format json``); stdout carries only the report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from typing import Any, Callable, Iterator, Sequence

from moedispatch._util.suggest import did_you_mean
from moedispatch._util.width import fit, terminal_width, wrap
from moedispatch.core.errors import MoedispatchError, PluginError, UsageError
from moedispatch.core.decision import NoBackendError

__all__ = ["main"]

EXIT_OK, EXIT_USAGE, EXIT_NO_BACKEND = 0, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2, no usage dump
        raise UsageError(f"{self.prog}: {message}")


class _Once(argparse.Action):
    """A single-value option given twice is an error (``--tokens 1 --tokens 4`` took the last one silently)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        seen = getattr(namespace, "_given_once", set())
        if self.dest in seen:
            parser.error(f"{option_string} given twice (last {values!r}): give it once")
        namespace._given_once = seen | {self.dest}
        setattr(namespace, self.dest, values)


def _target_entry(caps):
    """The JSON ``target`` object (``partition`` added for a compute-partition target)."""
    from moedispatch.data.capdb import target_entry

    return target_entry(caps)


def _positive(text: str) -> int:
    try:
        if not text.isascii():   # int() reads full-width digits ("８" is 8): a count is written in ASCII digits
            raise ValueError(text)
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _seed(text: str) -> int:
    """``--seed``: what torch.Generator.manual_seed takes without overflow, as a non-negative integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer 0 … 2**63-1, got {text!r}") from None
    if not 0 <= value < 2 ** 63:
        raise argparse.ArgumentTypeError(f"expected an integer 0 … 2**63-1, got {value}")
    return value


def _build_parser() -> _Parser:
    parser = _Parser(prog="moedispatch", description="Which MoE kernel is correct on an AMD GPU, per layer, and why.",
                     epilog="Text reports fit the terminal on a TTY (COLUMNS, else the terminal's width, clamped to "
                            "80-200 columns) and are never wrapped when piped; --format json is never wrapped.")
    parser.add_argument("--version", action="store_true",
                        help="print the version, the capability_db snapshot and the releases it knows, and exit")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log decisions to stderr (-v info, -vv debug); default: warnings only")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress lines on stderr (verify, fleet --ray) and no -v logging; warnings and "
                             "errors still show (logging is warnings-only without -v anyway)")
    parser.add_argument("--log-format", choices=["console", "json"], default=None,
                        help="log rendering on stderr (default: console on a TTY, else JSON)")
    sub = parser.add_subparsers(dest="command", parser_class=_Parser)

    _add_explain(sub)
    _add_compare(sub)
    _add_simple(sub)
    _add_verify(sub)
    _add_lint(sub)
    _add_fleet(sub)
    _add_exec(sub)
    _add_aiter_configs(sub)
    return parser


def _common(p: argparse.ArgumentParser, *, target: bool = True) -> None:
    """The options every subcommand takes: logging before or after it, --format, and the target ones."""
    # The logging options work before or after the subcommand (SUPPRESS keeps the top-level value otherwise).
    p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    p.add_argument("--log-format", choices=["console", "json"], default=argparse.SUPPRESS,
                   help=argparse.SUPPRESS)
    p.add_argument("--format", choices=["table", "json"], default="table",
                   help="table for people (default), json for programs (only JSON on stdout)")
    if target:
        p.add_argument("--target", action=_Once, help="GPU arch or product, optionally one compute partition: gfx942, "
                                        "gfx950, MI300X, MI355X, MI355X:CPX, …")
        p.add_argument("--aiter-version", action=_Once,
                       help="AITER version on the target (e.g. 0.1.15.post3; 'installed' for the AITER in this "
                            "Python; 'none')")
        p.add_argument("--aiter-configs", metavar="DIR",
                       help="read AITER's tuned CSVs from this folder (a ROCm/aiter checkout, an aiter package or "
                            "its configs/) instead of the installed or bundled ones; env MOEDISPATCH_AITER_CONFIGS")


def _add_explain(sub: Any) -> None:
    """explain: plan every layer of a model and say why."""
    explain = sub.add_parser("explain", help="plan every layer of a model and say why")
    explain.add_argument("--model", required=True, action=_Once, help="built-in name, checkpoint folder or config.json")
    _common(explain)
    explain.add_argument("--tp", type=_positive, default=1, action=_Once, help="tensor-parallel degree (default 1)")
    explain.add_argument("--ep", type=_positive, default=1, action=_Once, help="expert-parallel degree (default 1)")
    explain.add_argument("--backend", help="force one backend (exit 3 with its reasons if it cannot run)")
    explain.add_argument("--brief", action="store_true", help="one line per group of identical layers; with "
                         "--format json, each reason once (moedispatch.explain-brief/1)")
    explain.add_argument("--tokens", action=_Once,
                         help="token counts per call to plan AITER's dispatch and cost for, comma-separated "
                         "(default 1,4,64,512,8192: decode and prefill)")
    explain.add_argument("--what-if", action="store_true",
                         help="per layer group, the cheapest change (AITER env switch, newer AITER) that makes it "
                              "faster, with the predicted gain, and what its padding costs")
    explain.add_argument("--tuning-list", action="store_true",
                         help="print only the shapes AITER runs on heuristics, ranked by predicted time, as AITER's "
                              "untuned fused-MoE CSV (feed it to AITER's tuner)")
    explain.add_argument("--aiter-env", action="append", default=[], metavar="KEY=VALUE",
                         help="AITER environment to assume on top of this shell's (repeatable), e.g. "
                              "AITER_BYPASS_TUNE_CONFIG=1")
    explain.add_argument("--role", action="append", default=[], metavar="NAME:tp=…,ep=…,dp=…,tokens=LO-HI",
                         help="plan each role of a deployment for its own token range (repeatable), e.g. "
                              "--role decode:tp=8,tokens=1-512 --role prefill:tp=8,tokens=1024-16384; padding, "
                              "kernels and known issues can differ per role")
    explain.add_argument("--pin-file", metavar="FILE",
                         help="where a known issue names the fix, write AITER's tuned set with the wrong tuned rows "
                              "pinned to a correct kernel to this NEW file and plan (and --recipe) under "
                              "AITER_CONFIG_FMOE=FILE")
    explain.add_argument("--recipe", choices=["vllm", "sglang"], help="print an engine launch recipe")
    explain.add_argument("--engine-version", help="engine release the recipe targets (default: newest known)")
    explain.add_argument("--engine", metavar="ENGINE[@VERSION]",
                         help="also show what that engine does on its own per layer group (vllm, vllm@0.33.0, "
                              "sglang@0.5.23): its --moe-backend auto choice and allocation, and whether it differs. "
                              "Modelled for the newest release of each engine only (vllm 0.33.0, sglang 0.5.23); "
                              "--recipe --engine-version covers older ones (vllm from 0.23.0, sglang from 0.5.18)")
    explain.add_argument("--engine-env", action="append", default=[], metavar="KEY=VALUE",
                         help="the engine's environment for --engine (repeatable), e.g. VLLM_ROCM_USE_AITER=1; "
                              "absent variables take the engine's defaults")
    explain.add_argument("--strict-plugins", action="store_true", help="a failing plugin is an error")
    explain.add_argument("--html", metavar="FILE", help="also write the plan as one self-contained HTML page (layer "
                         "map, dispatch, predicted time, rejected backends, warnings)")


def _add_compare(sub: Any) -> None:
    """compare: one model under several targets, AITER versions or TP/EP."""
    compare = sub.add_parser("compare", help="one model under several targets, AITER versions or TP/EP, side by side",
                             description="Plan one model per variant and show, per group of layers, each variant's "
                             "backend, padding, AITER dispatch and predicted time, and why they differ. Give two or "
                             "more comma-separated values to at least one of --target, --aiter-version, --tp, --ep "
                             "(several lists: every combination).")
    compare.add_argument("--model", required=True, help="built-in name, checkpoint folder or config.json")
    _common(compare, target=False)
    compare.add_argument("--target", help="GPU archs or products to compare, comma-separated (e.g. MI300X,MI355X "
                                          "or MI355X,MI355X:CPX)")
    compare.add_argument("--aiter-version", help="AITER versions to compare, comma-separated (e.g. 0.1.10,0.1.15.post3)")
    compare.add_argument("--tp", help="tensor-parallel degrees to compare, comma-separated (e.g. 4,8; default 1)")
    compare.add_argument("--ep", help="expert-parallel degrees to compare, comma-separated (default 1)")
    compare.add_argument("--tokens", action=_Once,
                         help="token counts per call to plan dispatch and cost for, comma-separated")
    compare.add_argument("--aiter-env", action="append", default=[], metavar="KEY=VALUE",
                         help="AITER environment to assume (repeatable)")
    compare.add_argument("--strict-plugins", action="store_true", help="a failing plugin is an error")


def _add_simple(sub: Any) -> None:
    """probe, backends, models: what this machine, the registry and the built-ins hold."""
    probe = sub.add_parser("probe", help="what this machine has: GPUs, AITER, packages (with provenance)")
    _common(probe, target=False)

    backends = sub.add_parser("backends", help="registered backends and plugins")
    _common(backends, target=False)

    models = sub.add_parser("models", help="built-in models")
    _common(models, target=False)


def _add_verify(sub: Any) -> None:
    """verify: a layer's plan checked numerically through emulation."""
    verify = sub.add_parser("verify", help="check a layer's plan numerically through emulation (needs torch)")
    verify.add_argument("--model", required=True, help="built-in name, checkpoint folder or config.json")
    _common(verify)
    verify.add_argument("--tp", type=_positive, default=1, help="tensor-parallel degree (default 1)")
    verify.add_argument("--ep", type=_positive, default=1, help="expert-parallel degree (default 1)")
    verify.add_argument("--layer", type=int, default=None, help="layer index (default: first MoE layer)")
    verify.add_argument("--experts", type=_positive, default=None, help="fewer experts to keep it fast")
    verify.add_argument("--tokens", type=_positive, default=8, action=_Once,
                        help="tokens routed through the layer (default 8)")
    verify.add_argument("--seed", type=_seed, default=None, help="random seed of the layer's weights and inputs "
                                                                 "(0 … 2**63-1)")
    verify.add_argument("--backend", help="verify this backend's plan (forced, as explain's --backend; exit 3 with "
                                          "its reasons if it cannot run the layer)")


def _add_lint(sub: Any) -> None:
    """lint: a vLLM/SGLang launch checked for known-wrong or risky combinations."""
    lint = sub.add_parser("lint", help="check a vLLM/SGLang launch (script or `-- vllm serve …`) for known-wrong or "
                                       "risky combinations; exit 3 on an error finding")
    lint.add_argument("file", nargs="?", help="a shell script with the launch (read, never executed); - reads it "
                                              "from stdin")
    _common(lint)
    lint.add_argument("--model", help="the model when the launch names a local path (built-in name, folder, config.json)")
    lint.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                      help="environment of the launch (repeatable; wins over the script and this shell)")
    lint.add_argument("--engine-version", help="engine release of the launch (default: newest known)")
    lint.set_defaults(engine_args=[])


def _add_fleet(sub: Any) -> None:
    """fleet: every node of a deployment planned per role."""
    fleet = sub.add_parser("fleet", help="plan every node of a deployment (probe files or a Ray cluster) for each "
                                         "role and check that the nodes of a role agree (exit 3 when not)")
    _common(fleet, target=False)
    where = fleet.add_mutually_exclusive_group(required=True)
    where.add_argument("--from", dest="probes", metavar="GLOB",
                       help="probe files, one per node: `moedispatch probe --format json > probes/$(hostname).json`")
    where.add_argument("--ray", nargs="?", const="auto", metavar="ADDRESS",
                       help="probe and plan on every alive node of this Ray cluster (HOST:PORT, ray://HOST:PORT or "
                            "auto, the default: RAY_ADDRESS or the cluster started here); needs "
                            "pip install 'moedispatch[ray]'")
    fleet.add_argument("--ray-timeout", type=_positive, default=120, metavar="SECONDS",
                       help="--ray: give up (exit 2) when the cluster or a node has not answered by then (default 120)")
    fleet.add_argument("--save-probes", metavar="DIR",
                       help="--ray: also write each node's probe document to DIR/NODE.json (replay with --from)")
    fleet.add_argument("--data-parallel-backend", choices=["ray", "mp"], default=None,
                       help="with --engine vllm: how the launch starts its data-parallel ranks; ray checks that every "
                            "AITER/GPTOSS switch a node's plan needs reaches vLLM's Ray actors there")
    fleet.add_argument("--model", required=True, help="built-in name, checkpoint folder or config.json")
    fleet.add_argument("--role", action="append", default=[],
                       metavar="NAME:tp=…,ep=…,tokens=LO-HI[,nodes=GLOB|label:K=V]",
                       help="a role and the nodes it runs on (repeatable; default one role on every node at --tp/--ep)")
    fleet.add_argument("--engine", metavar="ENGINE[@VERSION]",
                       help="the engine release the nodes launch (vllm, vllm@0.33.0, sglang): a node whose plan it "
                            "cannot launch is a problem of the fleet")
    fleet.add_argument("--tp", type=_positive, default=1, help="tensor-parallel degree without --role (default 1)")
    fleet.add_argument("--ep", type=_positive, default=1, help="expert-parallel degree without --role (default 1)")


def _add_exec(sub: Any) -> None:
    """exec: lint a launch, then run it in this process."""
    exec_ = sub.add_parser("exec", help="check a vLLM/SGLang launch as lint does, then run it in this process "
                                        "(`-- vllm serve …`); --guard refuse stops a known-wrong launch (exit 3), "
                                        "fix runs the corrected one")
    _common(exec_)
    exec_.add_argument("--guard", choices=None, metavar="MODE",
                       help="warn (default: report, launch as given), refuse, fix or off; env MOEDISPATCH_GUARD")
    exec_.add_argument("--model", help="the model when the launch names a local path (built-in name, folder, "
                                       "config.json)")
    exec_.add_argument("--engine-version", help="engine release of the launch (default: newest known)")
    exec_.set_defaults(engine_args=[])


def _add_aiter_configs(sub: Any) -> None:
    """aiter-configs: lint AITER's tuned fused-MoE CSVs."""
    aiter_cfg = sub.add_parser("aiter-configs", help="lint AITER's tuned fused-MoE CSVs (installed AITER by default)")
    _common(aiter_cfg, target=False)
    aiter_cfg.add_argument("--aiter-version", help="'installed' (default when AITER is installed), an AITER version "
                           "(bundled snapshot) or a snapshot name")
    aiter_cfg.add_argument("--configs", help="a folder of tuned CSVs (an aiter package or its configs/ folder)")
    aiter_cfg.add_argument("--aiter-env", action="append", default=[], metavar="KEY=VALUE",
                           help="AITER environment to assume (repeatable), e.g. AITER_CONFIG_FMOE=/a.csv")
    aiter_cfg.add_argument("--strict", action="store_true",
                           help="exit 3 when a finding is an error (malformed rows, impossible timings), for CI")


def _configure_logging(verbose: int, fmt: str | None, quiet: bool = False) -> None:
    if fmt is None:
        fmt = "console" if sys.stderr.isatty() else "json"
    # Quiet by default, whatever stderr is: the format may follow the TTY, the level never does. With -v every
    # decision is one INFO event (backend_selected: layer, backend, reasons, padding) so a fleet's logs can be
    # queried; -vv adds the rejections; -q keeps only warnings.
    level = logging.INFO if verbose == 1 else logging.WARNING
    if verbose >= 2:
        level = logging.DEBUG
    if quiet:
        level = logging.WARNING
    renderers: list = []  # built on the first record: a run that logs nothing never imports structlog's renderers

    def renderer(*args: object) -> object:
        if not renderers:
            import structlog

            from moedispatch._util.colour import colour_enabled

            renderers.append(structlog.dev.ConsoleRenderer(colors=colour_enabled(sys.stderr)) if fmt == "console"
                             else structlog.processors.JSONRenderer(sort_keys=True))
        return renderers[0](*args)

    class _Formatter(logging.Formatter):
        def format(self, record: logging.LogRecord) -> str:
            event = dict(getattr(record, "structlog_event", None) or {"event": record.getMessage()})
            event.setdefault("level", record.levelname.lower())
            event["logger"] = record.name
            return str(renderer(None, record.levelname.lower(), event))

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter())
    logger = logging.getLogger("moedispatch")
    for old in [h for h in logger.handlers if getattr(h, "_moedispatch_cli", False)]:
        logger.removeHandler(old)
    handler._moedispatch_cli = True  # type: ignore[attr-defined]
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False


def _check_backend(name: str | None, registry: object) -> None:
    if name is not None and registry.get(name) is None:  # type: ignore[attr-defined]
        names = sorted(registry.names())  # type: ignore[attr-defined]
        raise UsageError(f"unknown backend {name!r}{did_you_mean(name, names)}; registered: {', '.join(names)}")


def _version_text() -> str:
    from importlib.metadata import version

    from moedispatch.data import aiter_index, capdb

    lines = [f"moedispatch {version('moedispatch')}"]
    try:
        known = capdb.aiter_db()["known_versions"]
        lines.append(f"capability_db: AITER {min(known, key=capdb.parse_aiter_version)} … "
                     f"{capdb.default_aiter_version()} ({len(known)} releases; default {capdb.default_aiter_version()})")
        engines = capdb.load_toml("engines.toml")
        for engine in ("vllm", "sglang"):
            if engine in engines:
                lines.append(f"capability_db: {engine} through {engines[engine].get('newest', '?')}")
        rels = aiter_index.releases()
        head = rels[-1]
        lines.append(f"capability_db: AITER tuned rows and ASM catalogs of {len(rels)} releases, {rels[0].tag} … "
                     f"{rels[-2].tag} and {head.tag} = ROCm/aiter@{head.commit[:10]} ({head.date})")
    except MoedispatchError as exc:  # a broken install still prints the version
        lines.append(f"capability_db: unreadable ({exc})")
    return "\n".join(lines)


def _env_pairs(items: Sequence[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"{flag} takes KEY=VALUE, got {item!r}")
        out[key.strip()] = value.strip()
    return out


#: Colour the text report (a terminal, NO_COLOR unset, --format table): set per run by _main.
_COLOUR = False


def _print(text: str) -> None:
    if _COLOUR:
        from moedispatch._util.colour import colourize

        text = colourize(text)
    sys.stdout.write(text if text.endswith("\n") else text + "\n")


# -- commands --------------------------------------------------------------------------------------------------

def _cmd_explain(args: argparse.Namespace) -> int:
    from moedispatch.core.workload import Runtime, parse_tokens
    from moedispatch.probe.targets import (cli_aiter_version, default_target_warning, installed_aiter_warning,
                                           resolve_capabilities)
    from moedispatch.render.explain import plan_model
    from moedispatch.selector.plugins import get_registry
    from moedispatch.sources.models import load_model

    model = load_model(args.model)

    # Accepted (as before) but never silently: say what a flag without its partner does — nothing.
    if getattr(args, "engine_version", None) and not getattr(args, "recipe", None):
        sys.stderr.write("moedispatch: warning: --engine-version goes with --recipe vllm|sglang and is ignored "
                         "without it (for --engine use ENGINE@VERSION)\n")
    if getattr(args, "engine", None) and getattr(args, "recipe", None):
        sys.stderr.write("moedispatch: warning: --engine is ignored with --recipe (the recipe is the launch; run "
                         "explain --engine … without --recipe for the engine's own per-layer choice)\n")
    ignored = [flag for flag, on in (("--recipe", getattr(args, "recipe", None)), ("--what-if", args.what_if),
                                     ("--html", getattr(args, "html", None) is not None)) if on]
    if getattr(args, "tuning_list", None) and ignored:
        sys.stderr.write(f"moedispatch: warning: --tuning-list prints only the tuning CSV; {', '.join(ignored)} "
                         "ignored (run them without --tuning-list)\n")
    if getattr(args, "engine_env", None) and not getattr(args, "engine", None):
        sys.stderr.write("moedispatch: warning: --engine-env goes with --engine vllm|sglang[@VERSION] and is ignored "
                         "without it\n")
    caps, first_line = resolve_capabilities(args.target, cli_aiter_version(args.aiter_version))
    registry = get_registry(strict=args.strict_plugins)
    _check_backend(args.backend, registry)
    # The same default-target warning plan_model() carries (the engine API and the CLI JSON agree word for word).
    warnings = (list(default_target_warning(caps)) + [f"plugin error: {e}" for e in registry.errors]
                + list(registry.warnings) + list(installed_aiter_warning(caps)))
    if getattr(args, "role", None):
        return _explain_roles(args, model, caps, registry, warnings, first_line)
    runtime = Runtime.build(parse_tokens(args.tokens) if args.tokens is not None else None,
                            overrides=_env_pairs(args.aiter_env, "--aiter-env"))
    from moedispatch.engines.layout import heads_warning

    # In the plan's warnings (text, JSON, HTML, recipe); a TP the MoE cannot shard stays the one-line error, alone.
    heads = heads_warning(model, args.tp)
    plan = plan_model(model, caps, args.tp, args.ep, backends=registry.backends, force=args.backend,
                      strict=args.strict_plugins, warnings=warnings + ([heads] if heads else []), runtime=runtime)
    if getattr(args, "pin_file", None):
        from moedispatch.plan.pinning import pin_plan

        plan, _pins = pin_plan(plan, args.pin_file, backends=registry.backends, force=args.backend,
                               strict=args.strict_plugins, warnings=warnings)
    if args.tuning_list:
        return _explain_tuning_list(args, plan, runtime)
    if args.what_if:
        from dataclasses import replace as _replace

        from moedispatch.plan.whatif import plan_what_if

        plan = _replace(plan, what_if=plan_what_if(plan, registry.backends))
    recipe = None
    if args.recipe:
        from moedispatch.engines.recipes import build_recipe, render_recipe

        recipe = build_recipe(plan, args.recipe, args.engine_version)
    if args.html is not None:
        _explain_html(args, plan, recipe, first_line)
    if recipe is not None:
        _print(fit(render_recipe(plan, args.recipe, fmt=args.format, recipe=recipe), args.width, shell=True))
        if plan.ok and not recipe.ok:  # no safe launch: exit 3 with the reasons (never a command known to be wrong)
            sys.stderr.write(f"moedispatch: no safe {args.recipe} {recipe.version} launch for this plan: "
                             f"{recipe.refusals[0].text}\n")
            return EXIT_NO_BACKEND
    else:
        _print_explain(args, plan, first_line)
    if not plan.ok:
        missing = [d for d in plan.decisions if not d.ok]
        first = missing[0]
        sys.stderr.write(f"moedispatch: {len(missing)} MoE layer(s) have no correct backend; layer "
                         f"{first.layer.index}: {first.reasons[0]}\n")
        return EXIT_NO_BACKEND
    return EXIT_OK


def _explain_tuning_list(args: argparse.Namespace, plan: Any, runtime: Any) -> int:
    """explain --tuning-list: the shapes AITER runs on heuristics, as AITER's untuned CSV (or its JSON document)."""
    from moedispatch.plan.whatif import tuning_list

    text, count = tuning_list(plan)
    if args.format == "json":
        import csv as _csv
        import io as _io

        rows = list(_csv.DictReader(_io.StringIO(text)))
        _print(json.dumps({"schema": "moedispatch.tuning-list/1", "model": plan.model.name,
                           "target": _target_entry(plan.caps), "tokens": list(runtime.tokens), "rows": rows,
                           "untuned_csv": text}, indent=2))
    else:
        _print(text)
    sys.stderr.write(f"moedispatch: {count} shape(s) of {plan.model.name} run on AITER heuristics at the planned "
                     f"token counts ({', '.join(map(str, runtime.tokens))}), highest predicted time first; this "
                     "is AITER's untuned fused-MoE CSV format\n")
    return EXIT_OK


def _explain_html(args: argparse.Namespace, plan: Any, recipe: Any, first_line: str | None) -> None:
    """explain --html FILE: the plan as one page, with the recipe's launch paths, environment and command when there
    is one."""
    if not args.html.strip():
        raise UsageError("--html needs a file name, got ''")
    from moedispatch.render.html import write_html

    launch = None
    if recipe is not None and recipe.command:  # the recipe's environment, then its command (as the text shows)
        launch = ("".join(f"# {line}\n" for line in recipe.path_lines())
                  + "".join(f"export {e['name']}={e['value']}\n" for e in recipe.env) + recipe.command)
    existed = os.path.isfile(args.html)
    write_html(plan, args.html, first_line=first_line, launch=launch)
    if existed:  # written where asked, but never over a file without saying so
        sys.stderr.write(f"moedispatch: warning: --html {args.html}: replaced the existing file\n")


def _print_explain(args: argparse.Namespace, plan: Any, first_line: str | None) -> None:
    """The plan on stdout: with --engine, beside what the engine does on its own; else table, JSON or brief JSON."""
    from moedispatch.render.explain import render_json, render_table

    if args.engine:  # what the engine does on its own, only when asked (moedispatch.engines.choice)
        from moedispatch.engines.choice import compare_plan, parse_engine_spec, render_comparison
        from moedispatch.plan.plan import plan_to_json

        engine_env = _env_pairs(args.engine_env, "--engine-env")
        if "@" in args.engine and not args.engine.partition("@")[2].strip():
            raise UsageError(f"--engine {args.engine!r}: no version after '@' (e.g. vllm@0.33.0, or vllm for the newest)")
        name, version = parse_engine_spec(args.engine)
        comparisons = compare_plan(plan, name, version, env=engine_env,
                                   quant_method=getattr(plan.model, "quant_method", None))
        if args.format == "json":
            from moedispatch.plan.plan import plan_to_brief_json

            doc = plan_to_brief_json(plan) if args.brief else plan_to_json(plan)
            _print(json.dumps({**doc, "engine_auto": comparisons}, indent=2))
        else:
            _print(render_table(plan, first_line=first_line, brief=args.brief, width=args.width).rstrip("\n") + "\n"
                   + fit("\n".join(render_comparison(comparisons, env=engine_env)), args.width))
    elif args.format == "json" and args.brief:  # each reason once (moedispatch.explain-brief/1)
        from moedispatch.plan.plan import plan_to_brief_json

        _print(json.dumps(plan_to_brief_json(plan), indent=2))
    elif args.format == "json":
        _print(render_json(plan))
    else:
        _print(render_table(plan, first_line=first_line, brief=args.brief, width=args.width))


def _cmd_probe(args: argparse.Namespace) -> int:
    from moedispatch.probe.system import node_identity, probe, render_probe

    report = probe(allow_torch=True, try_import=True)
    _print(fit(render_probe(report, args.format, node=node_identity()), args.width))
    return EXIT_OK


def _cmd_backends(args: argparse.Namespace) -> int:
    from moedispatch.selector.plugins import get_registry

    registry = get_registry()
    rows = []
    for b in sorted(registry.backends, key=lambda b: (-b.preference, b.name)):
        rows.append({"name": b.name, "preference": b.preference, "family": b.family,
                     "plugin": registry.owner(b.name), "description": b.description})
    if args.format == "json":
        _print(json.dumps({"schema": "moedispatch.backends/1", "backends": rows,
                           "plugins": [p.to_dict() for p in registry.plugins]}, indent=2))
        return EXIT_OK
    lines = [f"{'backend':<14} {'pref':>4}  {'plugin':<14} description"]
    for r in rows:
        lines.append(f"{r['name']:<14} {r['preference']:>4}  {str(r['plugin']):<14} {r['description']}")
    lines.append("")
    lines.append("plugins:")
    for p in registry.plugins:
        origin = "built-in" if p.builtin else f"{p.package or '?'} {p.version or ''}".strip()
        status = "ok" if not p.errors else "ERROR: " + "; ".join(p.errors)
        if p.warnings:
            status += "; warning: " + "; ".join(p.warnings)
        lines.append(f"  {p.name:<14} {origin:<28} {', '.join(p.backends) or '-':<16} {status}")
    _print(fit("\n".join(lines), args.width))
    return EXIT_OK


def _cmd_models(args: argparse.Namespace) -> int:
    from moedispatch.sources.models import builtin_models, parse_config

    rows = []
    for entry in builtin_models():
        spec = parse_config(entry["config"], name=entry["name"], source="builtin")
        moe = next(t for t in spec.layers if t.kind == "moe")
        rows.append({
            "name": entry["name"], "hf_id": entry.get("hf_id"), "architecture": spec.architecture,
            "layers": len(spec.layers), "moe_layers": spec.moe_layers, "hidden": spec.hidden,
            "intermediate": moe.intermediate, "experts": moe.experts, "top_k": moe.top_k,
            "activation": spec.activation, "quant": {"weight": moe.weight.dtype, "activation": moe.act.dtype},
            "aliases": list(entry.get("aliases") or []),
        })
    if args.format == "json":
        _print(json.dumps({"schema": "moedispatch.models/1", "models": rows}, indent=2))
        return EXIT_OK
    nw = max(len("model"), *(len(r["name"]) for r in rows))  # the name column as wide as the longest name
    lines = [f"{'model':<{nw}} {'layers':>6} {'MoE':>4} {'hidden':>6} {'inter':>6} {'E':>4} {'k':>3}  "
             f"{'quant (W/A)':<12} also known as (HF id, aliases)"]
    for r in rows:
        aka = ", ".join(n for n in [r["hf_id"], *r["aliases"]] if n) or "—"
        lines.append(f"{r['name']:<{nw}} {r['layers']:>6} {r['moe_layers']:>4} {r['hidden']:>6} {r['intermediate']:>6} "
                     f"{r['experts']:>4} {r['top_k']:>3}  {r['quant']['weight'] + '/' + r['quant']['activation']:<12} "
                     f"{aka}")
    _print(fit("\n".join(lines), args.width))
    return EXIT_OK


def _cmd_verify(args: argparse.Namespace) -> int:
    from moedispatch.probe.targets import resolve_capabilities
    from moedispatch.sources.models import expand_layers, load_model
    from moedispatch.selector.plugins import get_registry
    from moedispatch.selector.pure import select

    model = load_model(args.model)
    from moedispatch.probe.targets import cli_aiter_version

    caps, first_line = resolve_capabilities(args.target, cli_aiter_version(args.aiter_version))
    layers = expand_layers(model, args.tp, args.ep)
    if args.layer is None:
        layer = next(la for la in layers if la.kind == "moe")
    else:
        if not 0 <= args.layer < len(layers):
            raise UsageError(f"--layer {args.layer} is out of range (model has layers 0–{len(layers) - 1})")
        layer = layers[args.layer]
        if layer.kind != "moe":
            raise UsageError(f"--layer {args.layer} is a dense layer; pick a MoE layer")
    if args.experts is not None and args.experts > layer.experts_per_rank:
        raise UsageError(f"--experts {args.experts} is more than the {layer.experts_per_rank} experts "
                         f"{'per rank ' if layer.experts_per_rank < layer.experts else ''}of layer {layer.index}")
    if args.experts is not None and args.experts < min(layer.top_k, layer.experts_per_rank):
        raise UsageError(f"--experts {args.experts} is fewer than the top-{layer.top_k} routing of layer "
                         f"{layer.index}; use --experts {min(layer.top_k, layer.experts_per_rank)} or more")
    registry = get_registry()
    _check_backend(args.backend, registry)
    try:  # after the flags are checked: a bad flag is reported the same with or without torch
        import torch  # noqa: F401
    except ImportError:
        raise UsageError("verify needs torch: pip install 'moedispatch[emulation]'") from None
    from moedispatch.numerics.verify import run_verify

    try:
        decision = select(layer, caps, registry.backends, force=args.backend)
        backend, padding = decision.backend, decision.padding
    except NoBackendError as exc:
        if args.backend is not None:  # a forced backend that cannot run: exit 3 with its reasons, never a fallback
            raise
        backend, padding = None, exc.decision.padding
    if first_line:
        sys.stderr.write(first_line + "\n")

    def progress(msg: str) -> None:
        if getattr(args, "quiet", False):
            return
        sys.stderr.write(msg if msg.startswith("verify") else f"verify: {msg}")
        sys.stderr.write("\n")
        sys.stderr.flush()

    checks = run_verify(layer, padding, backend=backend or "none", experts=args.experts, tokens=args.tokens,
                        seed=args.seed, progress=progress)
    if args.format == "json":
        _print(json.dumps({"schema": "moedispatch.verify/1", "model": model.name, "layer": layer.index,
                           "target": _target_entry(caps), "backend": backend, "padding": padding.to_dict(),
                           "checks": checks}, indent=2))
    else:
        aiter = f"AITER {caps.aiter_version}" if caps.aiter_version else "no AITER"
        lines = wrap(f"verify {model.name} layer {layer.index} on {caps.arch_label} with {aiter} "
                     f"({caps.source_of('aiter_version') or caps.source}): backend {backend}", "", args.width, hang=4)
        for c in checks:
            mark = {True: "PASS", False: "FAIL", None: "SKIP"}[c.get("passed")]
            lines += wrap(f"{c['name']}: {c['detail']}", f"  {mark:<4} ", args.width, hang=2)
        _print("\n".join(lines))
    return EXIT_OK if all(c.get("passed") is not False for c in checks) else 1


def _cmd_compare(args: argparse.Namespace) -> int:
    from moedispatch.render import compare

    return compare.run_cli(args, _print)


def _explain_roles(args: argparse.Namespace, model: Any, caps: Any, registry: Any, warnings: list,
                   first_line: Any) -> int:
    """``explain --role …``: one plan per role (moedispatch.plan.roles)."""
    from moedispatch.plan.roles import parse_role, plan_roles
    from moedispatch.render.roles import render_roles

    clash = [flag for flag, on in (("--tokens", args.tokens is not None), ("--tp", args.tp != 1),
                                   ("--ep", args.ep != 1), ("--recipe", args.recipe), ("--what-if", args.what_if),
                                   ("--tuning-list", args.tuning_list), ("--html", args.html),
                                   ("--pin-file", getattr(args, "pin_file", None)),
                                   ("--engine", getattr(args, "engine", None))) if on]
    if clash:
        raise UsageError(f"--role sets each role's tp/ep/dp and tokens; it does not combine with {', '.join(clash)}")
    roles = [parse_role(r) for r in args.role]
    plans = plan_roles(model, caps, roles, overrides=_env_pairs(args.aiter_env, "--aiter-env"),
                       backends=registry.backends, force=args.backend, strict=args.strict_plugins,
                       warnings=warnings)
    _print(render_roles(plans, fmt=args.format, first_line=first_line, width=getattr(args, "width", None)))
    return EXIT_OK


def _cmd_fleet(args: argparse.Namespace) -> int:
    from moedispatch.plan.fleet import load_nodes, plan_fleet
    from moedispatch.plan.roles import Role, check_roles, parse_role
    from moedispatch.render.fleet import render_fleet
    from moedispatch.sources.models import load_model

    if args.role and (args.tp != 1 or args.ep != 1):
        raise UsageError("fleet: --role sets each role's tp/ep; it does not combine with --tp/--ep")
    if args.save_probes is not None and args.ray is None:
        raise UsageError("fleet: --save-probes writes what --ray gathered; with --from the files are already there")
    if args.data_parallel_backend is not None and not args.engine:
        raise UsageError("fleet: --data-parallel-backend describes the --engine launch; pass --engine vllm[@V]")
    roles = [parse_role(r) for r in args.role] or [Role("all", args.tp, args.ep)]
    check_roles(roles)   # before any probe file is read or any Ray node is asked
    model = load_model(args.model)
    if args.ray is None:
        nodes, origin, node_plans, node_tools = load_nodes(args.probes), "probe files", {}, {}
    else:
        nodes, origin, node_plans, node_tools = _fleet_from_ray(args, model, roles)
    report = plan_fleet(model, nodes, roles)
    report.origin, report.node_plans, report.node_tools = origin, node_plans, node_tools
    if args.engine:
        from moedispatch.engines.fleet import check_engine

        check_engine(report, args.engine, data_parallel_backend=args.data_parallel_backend)
    _print(render_fleet(report, fmt=args.format, width=getattr(args, "width", None)))
    return EXIT_NO_BACKEND if report.problems() else EXIT_OK


@contextlib.contextmanager
def _c_stderr_silenced() -> Iterator[None]:
    """Writes to file descriptor 2 by C code go to /dev/null; ``sys.stderr`` (progress, our one-line errors) keeps
    the real stream. Nothing changes when stderr has no file descriptor (an in-process caller capturing it)."""
    try:
        sys.stderr.flush()
        fd = sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        yield
        return
    saved, devnull, old = os.dup(fd), os.open(os.devnull, os.O_WRONLY), sys.stderr
    sys.stderr = open(saved, "w", encoding=old.encoding, errors=old.errors, closefd=False, buffering=1)
    os.dup2(devnull, fd)
    try:
        yield
    finally:
        sys.stderr.flush()
        sys.stderr = old
        os.dup2(saved, fd)
        os.close(saved)
        os.close(devnull)


def _save_probes(folder: str, pairs: Sequence[tuple[Any, dict]], say: Callable[[str], None]) -> None:
    """``--save-probes``: each node's probe document as ``folder/NODE.json``; says which files it replaced and which
    probe files of other nodes the folder still holds (a later ``--from 'folder/*.json'`` reads those too)."""
    mine = {f"{node.name}.json" for node, _ in pairs}
    try:
        os.makedirs(folder, exist_ok=True)
        before = {f for f in os.listdir(folder) if f.endswith(".json")}
        for node, doc in pairs:
            with open(os.path.join(folder, f"{node.name}.json"), "w", encoding="utf-8") as fh:
                json.dump(doc, fh, indent=2)
    except OSError as exc:
        raise UsageError(f"fleet --save-probes {folder!r}: {exc}") from None
    replaced, others = sorted(before & mine), sorted(before - mine)
    say(f"fleet: wrote {len(mine)} probe file(s) to {folder}" + (f", replacing {len(replaced)}" if replaced else ""))
    if others:
        shown = ", ".join(others[:5]) + (f", … and {len(others) - 5} more" if len(others) > 5 else "")
        sys.stderr.write(f"moedispatch: fleet: warning: {folder} also holds {len(others)} probe file(s) of nodes this "
                         f"cluster did not answer for ({shown}): --from '{os.path.join(folder, '*.json')}' would read "
                         "them too\n")


def _fleet_from_ray(args: argparse.Namespace, model: Any, roles: Any) -> tuple[list, str, dict, dict]:
    """``fleet --ray``: the nodes (as ``--from`` would read them), where from, each node's own plan fingerprints and
    moedispatch release; progress on stderr (``-q`` silences it). Ray is imported only here."""
    from moedispatch.plan.fleet_ray import gather, import_ray, nodes_from_answers

    import_ray()  # one line naming the extra when Ray is absent; Ray sets up its "ray" logger on import
    # Ray's driver-side warnings are not ours to show: the "ray" logger (a warning when ray.init runs off the main
    # thread) and its C++ core's writes to fd 2 (GCS connection retries) while gathering.
    logging.getLogger("ray").setLevel(logging.ERROR)
    quiet = getattr(args, "quiet", False)

    def progress(text: str) -> None:
        if not quiet:
            sys.stderr.write(f"moedispatch: {text}\n")
            sys.stderr.flush()

    with _c_stderr_silenced():
        answers = gather(args.ray, model, roles, timeout=float(args.ray_timeout), progress=progress)
    pairs, skipped = nodes_from_answers(answers)
    for line in skipped:
        progress(f"fleet: {line}")
    if args.save_probes is not None:
        _save_probes(args.save_probes, pairs, progress)
    by_id = {doc["node"]["ray_node_id"]: node.name for node, doc in pairs}
    node_plans = {}
    node_tools = {}
    for a in answers:
        name = by_id.get(a.node_id)
        if name is None:
            continue
        errors = dict(a.errors)
        for role in roles:
            fp = dict(a.fingerprints).get(role.name)
            why = errors.get(role.name) or errors.get("*")
            node_plans[(role.name, name)] = fp if fp is not None else f"(none: {why})"
        if a.tool:
            node_tools[name] = a.tool
    where = args.ray if args.ray != "auto" else os.environ.get("RAY_ADDRESS") or "auto"
    return [node for node, _ in pairs], f"Ray cluster at {where}", node_plans, node_tools


def _cmd_exec(args: argparse.Namespace) -> int:
    from moedispatch.guard import launch

    if args.format == "json":
        raise UsageError("exec reports on stderr and gives stdout to the engine: no JSON report (moedispatch lint "
                         "--format json -- … gives the same check as JSON)")
    from moedispatch.probe.targets import cli_aiter_version

    return launch.run(args.engine_args, guard=args.guard, target=args.target,
                      aiter_version=cli_aiter_version(args.aiter_version),
                      model=args.model, engine_version=args.engine_version)


def _cmd_lint(args: argparse.Namespace) -> int:
    from moedispatch.engines import lint

    return lint.run_cli(args, _print)


def _cmd_aiter_configs(args: argparse.Namespace) -> int:
    from moedispatch.aiter import lint as aiter_lint

    version = args.aiter_version
    if version not in (None, "installed", "bundled") and not args.configs:
        from packaging.version import InvalidVersion, Version

        from moedispatch.data import aiter_index

        try:
            Version(version)
        except InvalidVersion:
            pass  # a release tag (v0.1.18, head) or junk, which the command itself checks
        else:
            for note in aiter_index.release_for(version)[1]:  # the release read instead, never silently
                sys.stderr.write(f"moedispatch: warning: --aiter-version {version}: {note}\n")
    return aiter_lint.run_cli(args, lambda text: _print(fit(text, args.width)))


_COMMANDS = {"explain": _cmd_explain, "probe": _cmd_probe, "backends": _cmd_backends, "models": _cmd_models,
             "verify": _cmd_verify, "aiter-configs": _cmd_aiter_configs, "compare": _cmd_compare,
             "lint": _cmd_lint, "exec": _cmd_exec, "fleet": _cmd_fleet}


_ASCII = {"–": "-", "—": "--", "→": "->", "←": "<-", "×": "x", "µ": "u", "…": "...", "≤": "<=", "≥": ">=",
          "·": "*", "’": "'", "‘": "'", "“": '"', "”": '"', "≈": "~", "−": "-", "±": "+/-", "÷": "/", "•": "*"}


def _transliterate(exc: UnicodeError) -> tuple[str, int]:
    """codecs error handler: what a terminal that cannot show a character gets instead (``→`` → ``->``, else ``?``)."""
    if not isinstance(exc, UnicodeEncodeError):
        raise exc
    return "".join(_ASCII.get(ch, "?") for ch in exc.object[exc.start:exc.end]), exc.end


@contextlib.contextmanager
def _printable_streams() -> Iterator[None]:
    """stdout/stderr that cannot encode the output's characters (``PYTHONIOENCODING=ascii``, a C locale) get ASCII
    stand-ins instead of a UnicodeEncodeError traceback."""
    import codecs

    codecs.register_error("moedispatch-ascii", _transliterate)
    changed = []
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        encoding = (getattr(stream, "encoding", None) or "utf-8").lower().replace("_", "-")
        if reconfigure is not None and encoding not in ("utf-8", "utf8", "utf-16", "utf-32"):
            changed.append((stream, stream.errors))
            reconfigure(errors="moedispatch-ascii")
    try:
        yield
    finally:
        for stream, errors in changed:
            stream.reconfigure(errors=errors)


@contextlib.contextmanager
def _aiter_configs(folder: str | None) -> Iterator[None]:
    """``--aiter-configs DIR``: MOEDISPATCH_AITER_CONFIGS for this run (restored after, for in-process callers)."""
    if folder is None:
        yield
        return
    from moedispatch.data.aiter_configs import AITER_CONFIGS_ENV

    if not os.path.isdir(folder):
        raise UsageError(f"--aiter-configs {folder!r} is not a directory")
    before = os.environ.get(AITER_CONFIGS_ENV)
    os.environ[AITER_CONFIGS_ENV] = os.path.abspath(folder)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(AITER_CONFIGS_ENV, None)
        else:
            os.environ[AITER_CONFIGS_ENV] = before


def main(argv: Sequence[str] | None = None) -> int:
    with _printable_streams():
        return _main(argv)


def _wants_json(argv: Sequence[str]) -> bool:
    """``--format json`` anywhere before a `--` (also when argument parsing itself failed)."""
    words = list(argv[:argv.index("--")] if "--" in argv else argv)
    return "--format=json" in words or any(a == "--format" and b == "json" for a, b in zip(words, words[1:]))


def _fail(argv: Sequence[str], message: str, code: int) -> int:
    """The one-line error on stderr; under ``--format json`` also a ``moedispatch.error/1`` document on stdout, so
    a program reading stdout always gets JSON."""
    sys.stderr.write(message + "\n")
    if _wants_json(argv):
        _print(json.dumps({"schema": "moedispatch.error/1", "error": message, "exit": code}))
    return code


def _main(argv: Sequence[str] | None) -> int:
    global _COLOUR
    _COLOUR = False
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = _build_parser()
        engine_args: list[str] = []
        for verb in ("lint", "exec"):  # `lint|exec [opts] -- vllm serve …`: engine args verbatim
            if verb in argv and "--" in argv[argv.index(verb):]:
                cut = argv.index("--", argv.index(verb))
                argv, engine_args = argv[:cut], argv[cut + 1:]
                break
        args = parser.parse_args(argv)
        if engine_args:
            args.engine_args = engine_args
        # The one width every text report fits in (the terminal's, 80–200 columns; none when piped or for JSON).
        args.width = None if getattr(args, "format", "table") == "json" else terminal_width(sys.stdout)
        from moedispatch._util.colour import colour_enabled

        _COLOUR = getattr(args, "format", "table") != "json" and colour_enabled(sys.stdout)
        if args.version:
            _print(_version_text())
            return EXIT_OK
        if not args.command:
            raise UsageError("moedispatch: a command is required (explain, compare, lint, exec, fleet, probe, backends, "
                             "models, verify, aiter-configs); see moedispatch --help")
        _configure_logging(args.verbose, args.log_format, args.quiet)
        for flag in ("engine_version", "aiter_version", "target", "model", "backend"):
            value = getattr(args, flag, None)
            if isinstance(value, str) and not value.strip():   # "" must not mean "the default" silently
                raise UsageError(f"--{flag.replace('_', '-')} is empty: give a value or leave the option out")
        from moedispatch._util.deadline import set_fd_capture

        set_fd_capture(True)  # the CLI owns fd 1: plugin writes to it during discovery are captured too
        try:
            with _aiter_configs(getattr(args, "aiter_configs", None)):
                return _COMMANDS[args.command](args)
        finally:
            set_fd_capture(False)  # main() called in-process (a notebook, tests) leaves the library default
    except NoBackendError as exc:
        return _fail(argv, f"moedispatch: {exc}", EXIT_NO_BACKEND)
    except (UsageError, PluginError) as exc:
        return _fail(argv, str(exc) if str(exc).startswith("moedispatch") else f"moedispatch: {exc}", EXIT_USAGE)
    except MoedispatchError as exc:
        return _fail(argv, f"moedispatch: {exc}", EXIT_USAGE)
    except KeyboardInterrupt:
        sys.stderr.write("moedispatch: interrupted\n")
        return 130
    except BrokenPipeError:
        return EXIT_OK


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
