"""``moedispatch lint``: read a launch people already have — a shell script, or ``vllm serve …`` /
``python -m sglang.launch_server …`` arguments, with env from the script, the environment or ``--env K=V`` — and
report each known-wrong or risky combination (severity, what goes wrong, source, the corrected line).

Never executes anything: the script is read as text (``export K=V`` lines, ``K=V cmd`` prefixes, backslash
continuations). The launch is re-planned with moedispatch (same model, target, TP/EP as the launch) and compared with
what that engine release would run given those flags and env (engine facts: capability_db/engines.toml).
Schema ``moedispatch.lint/1``: ``{"schema", "engine", "engine_version", "model", "target", "parallel", "env",
"launch": {"from", "argv", "model", "options"}, "findings": [{"severity": "error"|"warning"|"info", "message",
"source", "fix"}]}`` (docs/schemas/lint.schema.json).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from packaging.version import Version

from moedispatch._util.suggest import did_you_mean
from moedispatch._util.width import wrap, wrap_shell
from moedispatch.core.families import FUSED_MOE_BACKENDS
from moedispatch.core.errors import CapabilityDBError, MoedispatchError, UsageError
from moedispatch.data import capdb
from moedispatch.core.workload import engine_env, parse_env_args
from moedispatch.engines.recipes import _forced, _in, _match, _try_backend, _version, build_recipe, conversion, converted_plan, engine_data, matching_issues, modelled_choice, prerelease_note
from moedispatch.engines.layout import has_attn_dp_flag
from moedispatch.plan.plan import plan_model
from moedispatch.probe.targets import cli_aiter_version, resolve_capabilities
from moedispatch.selector import plugins
from moedispatch.core.workload import Runtime
from moedispatch.sources.models import ModelSpec, load_model
from moedispatch.sources.checkpoint import is_repo_id

__all__ = ["Launch", "Finding", "parse_launch", "lint_launch", "render_lint", "SCHEMA"]

SCHEMA = "moedispatch.lint/1"
_TRUE = ("1", "true", "yes", "on")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")


@dataclass
class Launch:
    """One engine launch as read from a script or argv: engine, model, flags, env."""

    engine: str
    model: str | None
    flags: dict[str, str | bool] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)
    argv: list[str] = field(default_factory=list)
    origin: str = "arguments"  # where the launch was read: a script's name, "stdin", or "arguments" (argv)
    #: the assignments written on the engine's own line before its command (``K=V vllm serve …``): part of the
    #: command, so a fix line that replaces the command repeats them (an ``export`` stays set and is not repeated)
    prefix_env: dict[str, str] = field(default_factory=dict)
    #: what follows the engine's arguments on its line as shell syntax (``> server.log 2>&1 &``, ``| tee log``): not
    #: the engine's, kept at the end of a fix line
    shell_tail: list[str] = field(default_factory=list)
    #: what lint could not read exactly (a script's branches, a container's --env-file), said as warnings
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Finding:
    severity: str
    message: str
    source: str | None
    fix: str | None

    def to_dict(self) -> dict[str, Any]:
        return {"severity": self.severity, "message": self.message, "source": self.source, "fix": self.fix}


# -- reading the launch ---------------------------------------------------------------------------------------------

def _logical_lines(text: str) -> list[str]:
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        out.append(cur)
        cur = ""
    if cur:
        out.append(cur)
    return out


#: A word that ends the engine's arguments: a redirection, a pipe, a list operator or `&` (shlex.split keeps them
#: as words when they stand apart, e.g. `--disable-log-requests > /tmp/server.log 2>&1 &`).
_SHELL_OP = re.compile(r"^(\d*(>>?|<|>&\d*|<&\d*)\S*|&>>?\S*|\|\|?|&&?|;)$")


def _split_shell_tail(tokens: list[str]) -> tuple[list[str], list[str]]:
    """(the command's own words, the shell syntax after them)."""
    at = next((i for i, t in enumerate(tokens) if _SHELL_OP.match(t)), len(tokens))
    return tokens[:at], tokens[at:]


_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def _expand(line: str, variables: Mapping[str, str]) -> str:
    """``$X``, ``${X}``, ``${X:-default}`` from the script's own assignments (and the given env); unknown ones stay."""
    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        if name in variables:
            return variables[name]
        if m.group(2) is not None:
            return m.group(2)
        return m.group(0)

    return _VAR.sub(sub, line)


def _engine_of(tokens: list[str]) -> tuple[str, int] | None:
    """(engine, index of the first engine argument) when ``tokens`` launch vLLM or SGLang."""
    for k, tok in enumerate(tokens):
        base = os.path.basename(tok)
        if base == "vllm" and k + 1 < len(tokens) and tokens[k + 1] == "serve":
            return "vllm", k + 2
        if tok == "vllm.entrypoints.cli.main" and k + 1 < len(tokens) and tokens[k + 1] == "serve":
            return "vllm", k + 2   # `python -m vllm.entrypoints.cli.main serve MODEL`: the CLI's own entry point
        if tok in ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.cli.main"):
            return "vllm", k + 1
        if tok in ("sglang.launch_server", "sglang.srt.server") or base == "sglang.launch_server":
            return "sglang", k + 1
        if base == "sglang" and k + 1 < len(tokens) and tokens[k + 1] == "serve":
            return "sglang", k + 2
    return None


#: What lint reads from a launch, by the argparse ``dest`` the engine's own parser gives the option (aliases and
#: abbreviations resolve to it: capability_db/engines/options.json ``dest``).
_DEST_KEYS = {
    "vllm": {"model": "model", "tensor_parallel_size": "tp", "data_parallel_size": "dp", "moe_backend": "moe_backend",
             "pipeline_parallel_size": "pp", "quantization": "quantization",
             "max_num_batched_tokens": "max_batched_tokens", "enable_expert_parallel": "ep_flag",
             "data_parallel_backend": "data_parallel_backend"},
    "sglang": {"model_path": "model", "tp_size": "tp", "ep_size": "ep", "dp_size": "dp",
               "moe_runner_backend": "moe_backend", "quantization": "quantization", "pp_size": "pp",
               "chunked_prefill_size": "max_batched_tokens", "enable_dp_attention": "dp_attention",
               "attn_dp_size": "attn_dp", "enable_ep_moe": "ep_flag", "moe_dp_size": "moe_dp"},
}


def _newest_options(engine: str) -> dict[str, Any]:
    releases = capdb.load_db_json("engines/options.json").get(engine) or {}
    if not releases:
        raise CapabilityDBError(f"capability_db/engines/options.json has no {engine} release")
    return releases[max(releases, key=capdb.parse_aiter_version)]


def _parse_args(engine: str, args: Sequence[str]) -> tuple[str | None, dict[str, str | bool]]:
    """(model, flags) as the engine's parser reads them: every spelling of an option (alias, ``_`` for ``-``, unique
    prefix) resolves to its dest; ``--disable-x`` / ``--no-x`` set a boolean off."""
    flags: dict[str, str | bool] = {}
    model = None
    opts = _newest_options(engine)
    values, dests, keys = set(opts["value_options"]), opts["dest"], _DEST_KEYS[engine]
    i = 0
    args = list(args)
    while i < len(args):
        tok = args[i]
        name, _, inline = tok.partition("=") if tok.startswith("--") else (tok, "", "")
        name = _canonical(engine, name)
        key = keys.get(dests.get(name, ""))
        if name in values:
            if inline:
                val = inline
            elif i + 1 < len(args):
                val = args[i + 1]
                i += 1
            else:
                raise UsageError(f"{tok} needs a value")
            if key:
                flags[key] = val
        elif name in dests:
            if key:
                flags[key] = not name.startswith(("--disable-", "--no-"))
        elif tok.startswith("--") and _typo_takes_value(opts, tok, did_you_mean(name, sorted(dests))) and \
                i + 1 < len(args) and not args[i + 1].startswith("-"):
            i += 1   # a misspelled option's value (said by unknown_options), not the model
        elif not tok.startswith("-") and model is None and engine == "vllm":
            model = tok   # vLLM serve's positional model_tag, before or after the options (argparse intermixes)
        i += 1
    model = str(flags.pop("model")) if "model" in flags else model
    return model, flags


def _resolve(opts: Mapping[str, Any], name: str) -> tuple[str, bool]:
    """(the option as argparse resolves ``name``, whether it is one of ``opts``): vLLM reads ``_`` as ``-``; a unique
    prefix of a known option (``--tensor-parallel``) is that option when the parser allows abbreviations."""
    if not name.startswith("--"):
        return name, name in opts["dest"]
    if opts.get("underscores"):
        name = "--" + name[2:].replace("_", "-")
    if name in opts["dest"]:
        return name, True
    if opts.get("allow_abbrev"):
        prefixed = [o for o in opts["dest"] if o.startswith(name)]
        if len(prefixed) == 1:
            return prefixed[0], True
    return name, False


def _canonical(engine: str, name: str) -> str:
    """An option as the engine's argparse resolves it, per the newest modelled release's options."""
    return _resolve(_newest_options(engine), name)[0]


def _container_env(tokens: Sequence[str], host: Mapping[str, str]) -> dict[str, str]:
    """The engine's environment inside ``docker run`` / ``podman run`` (``tokens``: the words before the engine
    command): ``-e K=V`` / ``--env K=V`` / ``--env=K=V``, and ``-e K`` without a value passes the host's ``K`` when
    ``host`` has it (docker run reference, "Set environment variables": "-e VAR" copies the variable from the
    environment docker runs in). Nothing else of the host's environment reaches the container."""
    out: dict[str, str] = {}
    for i, tok in enumerate(tokens):
        pair = None
        if tok in ("-e", "--env") and i + 1 < len(tokens):
            pair = tokens[i + 1]
        elif tok.startswith("--env="):
            pair = tok[len("--env="):]
        m = _ASSIGN.match(pair or "")
        if m:
            out[m.group(1)] = m.group(2)
        elif pair and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", pair) and pair in host:
            out[pair] = host[pair]
    return out


def engine_options(engine: str, version: str) -> dict[str, Any] | None:
    """The engine release's command-line options (capability_db/engines/options.json, read from its own argument
    parser by scripts/build_engine_options.py); None when that release is not in the file."""
    doc = capdb.load_db_json("engines/options.json")
    return (doc.get(engine) or {}).get(version)


def _typo_takes_value(opts: Mapping[str, Any], tok: str, hint: str) -> bool:
    """Whether an option the parser rejects (``tok``, with its did-you-mean ``hint``) is read with the next word as
    its value: written without ``=``, and the option it most likely misspells takes a value."""
    guess = hint.split("'")[1] if "'" in hint else ""
    return "=" not in tok and guess in set(opts["value_options"])


def unknown_options(launch: "Launch", version: str) -> list[tuple[str, str]]:
    """(option as written, did-you-mean text) for every option the engine release's parser would reject, as argparse
    reads it (exact, then a unique prefix when the parser allows abbreviations; vLLM also reads ``_`` as ``-``)."""
    opts = engine_options(launch.engine, version)
    found = _engine_of(list(launch.argv))
    if opts is None or found is None:
        return []
    values, flags = set(opts["value_options"]), set(opts["flag_options"])
    known = values | flags
    out = []
    args = list(launch.argv)[found[1]:]
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if not tok.startswith("-") or tok in ("-", "--") or re.fullmatch(r"-\d.*", tok):
            continue
        name, ok = _resolve(opts, tok.partition("=")[0] if tok.startswith("--") else tok)
        hit = name if ok else None
        if hit is None:
            hint = did_you_mean(name, sorted(known))
            out.append((tok, hint))
            if _typo_takes_value(opts, tok, hint) and i < len(args) and not args[i].startswith("-"):
                i += 1  # the misspelled option's value
        elif hit in values and "=" not in tok:
            i += 1
    return out


def parse_launch(text: str | None = None, argv: Sequence[str] | None = None,
                 env: Mapping[str, str] | None = None, variables: Mapping[str, str] | None = None, *,
                 source: str = "the script") -> Launch:
    """A :class:`Launch` from a script's text or from argv (``vllm serve …``); ``env`` overrides the script's;
    ``source`` names the script in messages (its file name, ``stdin``).

    ``$X`` / ``${X}`` / ``${X:-default}`` in a script expand from its own assignments, then ``env``, then
    ``variables`` (e.g. the caller's environment); unknown ones stay as written. The launch's environment is what the
    engine reads: the script's exports and the command line's own assignments — or, for an engine inside ``docker
    run`` / ``podman run``, only the container's ``-e`` (:func:`_container_env`)."""
    caller = dict(variables or {})   # the environment the launch runs in (what `docker run -e K` can pass)
    notes: list[str] = []
    flow: list[str] = []   # the branches and loops the script is inside
    in_branch: dict[str, str] = {}   # variables a branch or loop sets → the branch's first line
    engine_line = ""
    script_env: dict[str, str] = {}
    line_env: dict[str, str] = {}
    tokens: list[str] | None = None
    if text is not None:
        variables = {**dict(variables or {}), **dict(env or {})}
        for line in _logical_lines(text):
            stripped = _expand(line.strip(), variables)
            if not stripped or stripped.startswith("#"):
                continue
            try:
                toks = shlex.split(stripped, comments=True)
            except ValueError as exc:
                raise UsageError(f"cannot read the script line {stripped[:60]!r}: {exc}") from None
            word = toks[0].rstrip(";") if toks else ""
            if word in ("if", "case", "for", "while", "until"):
                flow.append(stripped)
            elif word in ("fi", "esac", "done") and flow:
                flow.pop()
            if flow and toks and (toks[0] == "export" or all(_ASSIGN.match(t) for t in toks)):
                for t in toks[1:] if toks[0] == "export" else toks:
                    m = _ASSIGN.match(t)
                    if m:
                        in_branch.setdefault(m.group(1), flow[0])
            if toks and toks[0] == "export":
                for t in toks[1:]:
                    m = _ASSIGN.match(t)
                    if m:
                        script_env[m.group(1)] = variables[m.group(1)] = m.group(2)
                continue
            prefix: dict[str, str] = {}
            rest = list(toks[1:] if toks and toks[0] == "env" else toks)
            while rest and _ASSIGN.match(rest[0]):
                m = _ASSIGN.match(rest.pop(0))
                assert m
                prefix[m.group(1)] = m.group(2)
            if _engine_of(rest) is not None and tokens is None:
                tokens = rest
                script_env.update(prefix)
                line_env = prefix
                engine_line = line
            elif not rest:  # a plain assignment line: a shell variable (exported only with `export`)
                variables.update(prefix)
        if tokens is None:
            raise UsageError(f"no `vllm serve …` or `python -m sglang.launch_server …` line in {source}")
        if tokens[0].endswith(":") or tokens[0] == "-":   # `command: vllm serve …` (compose), `- vllm …` (a list)
            raise UsageError(f"{source} reads as YAML (`{engine_line.strip()[:40]} …`), not a shell script: lint "
                             "would miss its environment — give the command after `--` and its variables with --env "
                             "K=V")
        # a branch that sets what the launch reads (its environment, or a variable its line uses): the conditions
        # are not evaluated, so say which value was taken
        read = sorted(k for k in in_branch if engine_env({k: ""}) or re.search(rf"\$\{{?{k}\b", engine_line))
        if read:
            notes.append(f"{source} sets {', '.join(read)} inside a branch or loop (`{in_branch[read[0]][:50]}`): "
                         "lint reads every assignment in order and ignores the conditions — check the values it "
                         "used (the JSON report's env) or give them with --env K=V")
    else:
        tokens = list(argv or [])
        if tokens and tokens[0] == "env":
            tokens.pop(0)
        while tokens and _ASSIGN.match(tokens[0]):
            m = _ASSIGN.match(tokens.pop(0))
            assert m
            script_env[m.group(1)] = line_env[m.group(1)] = m.group(2)
        if not tokens:
            raise UsageError("lint needs a FILE or engine arguments after `--` (e.g. -- vllm serve MODEL --tensor-parallel-size 8)")
    found = _engine_of(tokens)
    if found is None:
        raise UsageError(f"not a vLLM or SGLang launch: {' '.join(tokens[:4])!r} (expected `vllm serve …` or "
                         "`python -m sglang.launch_server …`)")
    engine, start = found
    tokens, tail = _split_shell_tail(tokens)
    model, flags = _parse_args(engine, tokens[start:])
    files = [t.partition("=")[2] or (tokens[i + 1] if i + 1 < start else "")
             for i, t in enumerate(tokens[:start]) if t == "--env-file" or t.startswith("--env-file=")]
    notes += [f"{tokens[_container_run(tokens[:start]) or 0]} run --env-file {f}: lint does not read it — give its "
              "variables with --env K=V" for f in files]
    if _container_run(tokens[:start]) is not None:
        # the engine reads the container's environment: its -e/--env, not what the host exports or sets before
        # `docker` (https://docs.docker.com/reference/cli/docker/container/run/#env)
        merged = _container_env(tokens[:start], {**caller, **script_env})
    else:
        merged = dict(script_env)
    merged.update(env or {})
    return Launch(engine, model, flags, merged, tokens, source if text is not None else "arguments", line_env, tail,
                  notes)


# -- checking -------------------------------------------------------------------------------------------------------

#: How a message names each parallel size lint reads (the option spellings differ per engine).
_SIZE_NAMES = {"tp": "tensor-parallel size", "dp": "data-parallel size", "ep": "expert-parallel size",
               "pp": "pipeline-parallel size", "moe_dp": "MoE data-parallel size (--moe-dp-size)",
               "attn_dp": "attention data-parallel size (--attn-dp-size)"}


def _int(flags: Mapping[str, Any], key: str, default: int = 1) -> int:
    name = _SIZE_NAMES.get(key, key)
    raw = flags.get(key, default)
    try:
        value = int(raw)
    except (TypeError, ValueError):
        hint = (" — a variable the launch does not set? give it with --env NAME=VALUE"
                if isinstance(raw, str) and "$" in raw else "")
        raise UsageError(f"the launch's {name} must be an integer, got {raw!r}{hint}") from None
    if value < 1:
        raise UsageError(f"the launch's {name} must be positive, got {value}")
    return value


def _plan_layout(launch: Launch) -> tuple[int, int, int]:
    """(plan tp, plan ep, attention tp) of the launch: the plan's tensor-parallel degree (its MoE TP is
    ``moe_tp_size(plan tp, plan ep)``), the expert-parallel degree and the attention's TP
    (:attr:`moedispatch.plan.plan.Plan.attention_tp`). vLLM: ``--data-parallel-size`` without
    ``--enable-expert-parallel`` shards the experts tensor-parallel over every rank (MoE TP = TP × DP), with it EP =
    TP × DP. SGLang: the MoE's TP is ``tp_size // ep_size`` whatever data-parallel attention does to the attention:
    attention TP = tp_size // attn_dp_size, where ``--attn-dp-size N`` (0.5.23's spelling) sets attn_dp_size and the
    deprecated ``--dp-size N --enable-dp-attention`` resolves to attn_dp_size = N when ``--attn-dp-size`` is not given
    (sgl-project/sglang@v0.5.23:python/sglang/srt/arg_groups/parallel_hook.py _handle_deprecated_dp_attention;
    runtime_context.py derive_attn_tp_size); ``--moe-dp-size`` > 1 is not modelled (:func:`_unmodelled_layout`)."""
    f = launch.flags
    tp, dp = _int(f, "tp"), _int(f, "dp")
    if launch.engine == "vllm":
        if f.get("ep_flag"):
            return tp, tp * dp, tp
        return tp * dp, 1, tp
    attn_dp = _int(f, "attn_dp")
    if attn_dp == 1 and f.get("dp_attention"):
        attn_dp = dp
    attn_tp = tp // attn_dp if tp % attn_dp == 0 else tp
    ep = _int(f, "ep")
    ep = tp if f.get("ep_flag") and ep == 1 else ep
    return tp, ep, attn_tp


def _unmodelled_layout(launch: Launch) -> str | None:
    """Why lint cannot plan this launch's MoE sharding, or None: SGLang's ``--moe-dp-size`` > 1 (the MoE
    data-parallel over context-parallel groups: MoE TP = tp_size // moe_dp_size // ep_size, sgl-project/sglang@v0.5.23
    runtime_context.py derive_spawn_ranks) is not modelled."""
    if launch.engine == "sglang" and _int(launch.flags, "moe_dp") > 1:
        return (f"--moe-dp-size {launch.flags['moe_dp']} (the MoE data-parallel over context-parallel groups: MoE TP = "
                "tp-size / moe-dp-size / ep-size) is not modelled: only the command line and its environment were "
                "checked — none of the MoE plan's checks ran")
    return None


_MOE_DP_SOURCE = ("sgl-project/sglang@v0.5.23:python/sglang/srt/runtime_context.py (derive_spawn_ranks: moe_tp_rank = "
                  "tp_rank % (tp_size // moe_dp_size // moe_ep_size))")


def _outside_releases(engine: str, version: str, eng: Mapping[str, Any]) -> str | None:
    """Why ``version`` cannot be judged — older than the oldest release capability_db models (a newer one is judged
    by the newest's rules, with a warning: _launch_findings) — or None."""
    known = [Version(v) for v in eng.get("releases", [])]
    if not known:
        return None
    v, oldest, newest = Version(version), min(known), max(known)
    if v < oldest:
        return (f"{engine} {version} is outside the releases moedispatch models ({oldest}–{newest}): only the command "
                "line and its environment were checked — none of the engine's MoE path checks ran (pass "
                "--engine-version with a modelled release to judge the launch by its rules)")
    return None


#: Where each engine shards a data-parallel launch's experts over every rank without expert parallelism.
_DP_MOE_SOURCE = {
    "vllm": "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/config.py (FusedMoEParallelConfig.make: "
            "flatten_tp_across_dp_and_pcp when enable_expert_parallel is off)",
    "sglang": "sgl-project/sglang@v0.5.23:python/sglang/srt/model_executor/model_runner_components/moe_ep_setup.py "
              "(moe_tp_size = tp_size // moe_ep_size // moe_dp_size; --enable-dp-attention splits only the attention)",
}


#: Where each engine requires the expert-parallel size to divide the tensor-parallel one.
_EP_SOURCE = {
    "vllm": "vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/config.py (FusedMoEParallelConfig.make: "
            "EP size = TP × DP with --enable-expert-parallel)",
    "sglang": "sgl-project/sglang@v0.5.23:python/sglang/srt/runtime_context.py (derive_spawn_ranks: moe_tp_rank = "
              "tp_rank % (tp_size // moe_dp_size // moe_ep_size)); sgl-project/sglang@v0.5.23:python/sglang/srt/"
              "model_executor/model_runner_components/moe_ep_setup.py (tp_size must be divisible by ep_size)",
}


class _EngineRefuses(Exception):
    def __init__(self, choice: Any) -> None:
        super().__init__(choice.error)
        self.choice = choice


def _family_run(launch: Launch, plan: Any, version: str) -> str | None:
    """The MoE path family the engine runs for this launch ("aiter", "triton", "emulation"), before conversions."""
    eng = engine_data(launch.engine)[launch.engine]
    on = launch.env.get(eng["aiter_switch"], eng["aiter_switch_default"]).lower() in _TRUE
    backend = str(launch.flags.get("moe_backend", "auto")).lower().replace("-", "_")
    if launch.engine == "vllm":
        d0 = next(d for d in plan.decisions if d.layer.kind == "moe")
        choice = modelled_choice("vllm", version, d0.layer, plan.caps, dict(launch.env), backend,
                                 plan.model.quant_method)
        if choice is not None:  # the engine model of this release (checked against vLLM's own oracles)
            if not choice.ok:
                raise _EngineRefuses(choice)
            return _fam_of(choice.family) if choice.family else None
        moe_on = launch.env.get("VLLM_ROCM_USE_AITER_MOE", "1").lower() in _TRUE
        if backend == "aiter":
            return "aiter"
        if backend in ("triton", "triton_unfused"):
            return "triton"
        if backend == "emulation":
            return "emulation"
        if backend == "auto":
            if on and moe_on and plan.caps.gfx in ("gfx942", "gfx950"):
                return "aiter"
            # Without AITER, auto walks vLLM's non-AITER list; take the plan's best correct non-AITER path as what
            # it lands on (moedispatch.engines.choice models the oracles themselves).
            d0 = next(d for d in plan.decisions if d.layer.kind == "moe")
            for b in [d0.backend] + [r.backend for r in d0.rejected if r.supported]:
                fam = _fam_of(b) if b else None
                if fam in ("triton", "emulation"):
                    return fam
            return "triton"
        return None
    d0 = next(d for d in plan.decisions if d.layer.kind == "moe")
    choice = modelled_choice(launch.engine, version, d0.layer, plan.caps, dict(launch.env), backend,
                             plan.model.quant_method)
    if choice is not None and not choice.ok:  # SGLang refuses the runner itself (e.g. Quark MXFP4 needs AITER)
        raise _EngineRefuses(choice)
    if backend == "aiter" or (backend == "auto" and on):
        if backend == "auto" and _gate_fails(launch.engine, version, plan):
            return "triton"  # SGLang's own gate routes the layer to Triton (and skips the AITER shuffle)
        return "aiter"
    if backend in ("triton", "auto"):
        return "triton"
    return None


def _family_run_or_none(launch: Launch, plan: Any, version: str) -> str | None:
    """:func:`_family_run`, None where the engine refuses the launch."""
    try:
        return _family_run(launch, plan, version)
    except _EngineRefuses:
        return None


def _gate_fails(engine: str, version: str, plan: Any) -> Any:
    """The engine's own AITER gate row that this plan's first MoE layer fails (or None)."""
    moe = [d for d in plan.decisions if d.layer.kind == "moe"]
    if not moe:
        return None
    layer = moe[0].layer
    for gate in engine_data(engine)[engine].get("gate", []):
        if _match(gate, version, layer, plan.caps.gfx) and layer.intermediate_per_rank % gate["intermediate_multiple"]:
            return gate
    return None


def lint_launch(launch: Launch, *, target: str | None = None, aiter_version: str | None = None,
                model: str | None = None, engine_version: str | None = None,
                spec: ModelSpec | None = None) -> dict[str, Any]:
    """Findings for one launch (the ``moedispatch.lint/1`` document). ``spec``: the model as the engine itself
    loaded it (the in-engine guard parses the engine's own config), instead of reading ``model`` / the launch's."""
    engine = launch.engine
    data = engine_data(engine)
    eng = data[engine]
    version = _version(engine, engine_version, eng)
    ref = model or launch.model
    if spec is None and not ref:
        raise UsageError("the launch names no model: pass --model REF")
    unreadable = None
    try:
        spec = spec if spec is not None else load_model(ref)
    except MoedispatchError as exc:
        if model or not is_repo_id(str(ref).strip()):  # a --model the user typed, a path, a name: bad input
            raise UsageError(f"cannot read the launch's model {ref!r} ({exc}); pass --model with a built-in name, "
                             "a checkpoint folder or config.json") from None
        unreadable = exc  # the launch's HF repo id, not in the local cache: check what needs no model
    caps, first_line = resolve_capabilities(target, aiter_version)
    tp, ep, attn_tp = _plan_layout(launch)
    findings = _launch_findings(launch, engine, version, eng)
    findings += [Finding("warning", note, None, None) for note in launch.notes]
    if attn_tp != tp and ep == 1:
        findings.append(Finding("info", f"data-parallel attention without expert parallelism: {engine} {version} "
                                f"shards the experts tensor-parallel over all {tp} ranks (MoE TP {tp}, attention TP "
                                f"{attn_tp}); the MoE is planned at TP {tp}", _DP_MOE_SOURCE[engine], None))
    elif attn_tp != tp and engine == "sglang":
        findings.append(Finding("info", f"data-parallel attention with expert parallelism: {engine} {version} shards "
                                f"the MoE by its own sizes (TP {tp} / EP {ep}: MoE TP {tp // ep if tp % ep == 0 else 1}"
                                f"), the attention at TP {attn_tp}", _DP_MOE_SOURCE[engine], None))
    warnings = [first_line] if first_line else []
    if unreadable is not None:
        # What needs only the command line and its environment is still checked (newcomer minor 20); the plan is not.
        findings.append(Finding("warning", f"cannot read the launch's model {ref!r} ({unreadable}): only the command "
                                "line and its environment were checked — none of the MoE plan's checks ran", None,
                                f"fetch its config.json first (hf download {ref} config.json) or pass --model with a "
                                "built-in name, a checkpoint folder or config.json"))
        findings += [Finding("info", first_line, None, None)] if first_line else []  # the target it assumed
        return _doc(launch, version, str(ref), caps, tp, ep, findings)
    outside = _outside_releases(engine, version, eng)
    where = "capability_db/engines.toml"
    if outside is None:
        outside, where = _unmodelled_layout(launch), _MOE_DP_SOURCE
    if outside is not None:   # judged by no other release's rules (as the in-engine guard turns itself off)
        findings.append(Finding("warning", outside, where, None))
        findings += [Finding("info", first_line, None, None)] if first_line else []
        return _doc(launch, version, spec.name, caps, tp, ep, findings)
    try:
        # The launch's own AITER environment decides what AITER runs (and so the padding its kernels need).
        plan = plan_model(spec, caps, tp, ep, warnings=warnings, runtime=Runtime.build(env=launch.env))
        if attn_tp != tp:
            plan = dataclasses.replace(plan, attention_tp=attn_tp)
    except UsageError as exc:
        # core.layers' two expert-parallel refusals: "ep E must divide tp T …", "N experts cannot be split … ep E"
        ep_wrong = ep > 1 and (str(exc).startswith("ep ") or "split evenly over ep" in str(exc))
        findings.append(Finding("error", f"TP {tp} / EP {ep} cannot shard {spec.name}: {exc}",
                                _EP_SOURCE[engine] if ep_wrong else eng.get("heads_source"),
                                "pick an expert-parallel size that divides the tensor-parallel size and the expert "
                                "count" if ep_wrong else "pick a TP that divides the model (e.g. 1, 2, 4, 8)"))
        findings += [Finding("info", first_line, None, None)] if first_line else []
        return _doc(launch, version, spec.name, caps, tp, ep, findings)
    recipe = build_recipe(plan, engine, version)
    fix_line = _fix_from_launch(launch, recipe) or _fix(recipe)
    if fix_line is not None and _is_the_launch(launch, fix_line):
        fix_line = None   # the recipe is this very launch: nothing to change (a finding then says its workaround)
    for r in recipe.layout.errors if recipe.layout else []:
        findings.append(Finding("error", r.text, r.source, fix_line))
    dies = False  # at load, before the converted experts serve a token: nothing further to check on them
    converted = converted_plan(plan, engine, version)
    if converted is not None:  # the engine serves converted experts: those are what the launch runs (as the recipe)
        plan, conv = converted
        said = _conversion_findings(launch, conv, version, plan.caps.gfx, fix_line)
        findings += said
        dies = any(f.severity == "error" for f in said)
    moe = [d for d in plan.decisions if d.layer.kind == "moe"]
    family: str | None = "aiter"
    refused = False   # the engine refuses the launch at start-up: AITER never runs a token of it
    if moe and not dies and all(d.backend for d in moe):
        said, family, refused = _moe_findings(launch, plan, recipe, version, eng, ep, fix_line)
        findings += said
    elif moe and not dies:
        findings.append(Finding("error", "some MoE layer has no correct backend on this target: no launch runs it "
                                "correctly", None, "see `moedispatch explain`"))
    findings += _ray_env_findings(launch, version, eng, recipe)
    if family in (None, "aiter") and not refused:
        still = {i for r in recipe.runs for i in r.get("issues", ())}   # what the recipe's own launch still hits
        forwarded = _dispatch_findings(plan, launch, fix_line, findings, still)
    else:   # the engine runs another family, or none: what AITER's dispatcher would run does not apply to this launch
        forwarded = {hit.issue for d in plan.decisions if d.layer.kind == "moe" and getattr(d, "dispatch", None)
                     for hit in d.dispatch.issues}
    for w in plan.warnings:
        if w.issue is not None and w.issue in forwarded:
            continue  # said above with the severity its data declares
        # The plan's other warnings (model facts, caveats the launch cannot change, a guessed target): said, as info.
        findings.append(Finding("info", w.text, w.source, None))
    return _doc(launch, version, spec.name, caps, tp, ep, findings)


def _conversion_findings(launch: Launch, conv: Mapping[str, Any], version: str, gfx: str,
                         fix_line: str | None) -> list[Finding]:
    """A load-time conversion the engine applies to every MoE layer (capability_db/engines.toml ``conversion`` with
    ``to``): said as info, and an error when the launch's runner is not the one the engine serves the converted
    experts with (SGLang 0.5.23 resolves any other MXFP8 runner on gfx942 to flashinfer_trtllm: dies at load)."""
    engine = launch.engine
    to = conv["to"]
    out = [Finding("info", f"{engine} {version}: {conv['what']}; the launch is checked as the converted experts "
                   f"({to['weight']} {to['weight_granularity']})", conv["source"], None)]
    runner = str(launch.flags.get("moe_backend", "auto")).lower().replace("-", "_")
    if conv.get("runner") and _in(conv["runner_versions"], version) and runner != conv["runner"]:
        out.append(Finding("error", f"{engine} {version} serves these converted experts on {gfx} only with an explicit "
                           f"--moe-runner-backend {conv['runner']}: {conv['runner_else']} (the launch has "
                           f"{'no --moe-runner-backend' if 'moe_backend' not in launch.flags else runner})",
                           conv["to_source"], fix_line))
    return out


def _moe_findings(launch: Launch, plan: Any, recipe: Any, version: str, eng: Mapping[str, Any], ep: int,
                  fix_line: str | None) -> tuple[list[Finding], str | None, bool]:
    """The MoE layers of a launch whose every layer has a correct backend: what the engine runs under the launch's
    flags and AITER switch against the plan (silently slower, wrong, refused), SGLang's own gate, the engine
    issues the launch's env meets — the family the engine runs (None: it refuses the launch, or not known), and
    whether it refuses the launch."""
    engine, caps = launch.engine, plan.caps
    findings: list[Finding] = []
    d0 = next(d for d in plan.decisions if d.layer.kind == "moe")
    switch = eng["aiter_switch"]
    on = launch.env.get(switch, eng["aiter_switch_default"]).lower() in _TRUE
    backend_flag = str(launch.flags.get("moe_backend", "auto")).lower().replace("-", "_")
    refused = False
    try:
        family = _family_run(launch, plan, version)
    except _EngineRefuses as exc:
        src = next((r.source for r in exc.choice.reasons if r.source), None)
        findings.append(Finding("error", f"{engine} {version} refuses this launch for the MoE layers: "
                                f"{exc.choice.error}", src or eng["source"], fix_line))
        family = None
        refused = True
    conv = conversion(engine, version, d0.layer, caps.gfx)
    if conv and family != "emulation":
        family = conv["family"]
    plan_aiter = d0.family in ("ck", "cktile", "flydsl", "asm")
    env_src = next((e["source"] for r in eng.get("backend", []) for e in r["env"] if e["name"] == switch), None)
    refused_flag = engine == "vllm" and backend_flag == "aiter" and not on  # said by _launch_findings
    forced = backend_flag not in ("auto", "aiter") and (engine == "vllm" or not conv)
    # vLLM's own pick for the quant method that stays off AITER with the switch on (Kimi-K2.5 INT4 without
    # --moe-backend flydsl runs TritonWNA16): the switch is not the cause, and exporting it changes nothing
    own_src = None
    own_pick = engine == "vllm" and not forced and family not in (None, "aiter") and \
        _family_run_or_none(dataclasses.replace(launch, env={**launch.env, switch: "1"}), plan, version) not in (
            None, "aiter")
    if not refused_flag and plan_aiter and family not in (None, "aiter") and (forced or not on or own_pick) and (
            family == "emulation" or recipe.ok and (
            recipe.backend == d0.backend or {recipe.backend, d0.backend} <= FUSED_MOE_BACKENDS)):
        # (a recipe named after the family AITER runs at the engine's allocation is the same aiter.fused_moe launch)
        causes = [] if on or own_pick else [f"{switch}={launch.env[switch]}" if switch in launch.env
                                            else f"{switch} is unset"]
        if forced:   # the launch names the other path itself: the switch alone does not change it
            causes.append(f"{eng['backend_arg']} {launch.flags.get('moe_backend')}")
        elif own_pick:
            choice = modelled_choice(engine, version, d0.layer, caps, dict(launch.env), backend_flag,
                                     plan.model.quant_method)
            own_src = next((r.source for r in choice.reasons if r.source), None) if choice else None
            causes.append(f"{eng['backend_arg']} {launch.flags.get('moe_backend', 'auto')} ({engine} {version}'s own "
                          f"pick for {plan.model.quant_method or 'these'} experts, whatever {switch} says)")
        fix = (_set_env(launch, switch, "1") + (f"; the full recipe: {fix_line}" if fix_line else "")
               if not forced and not own_pick else fix_line)
        findings.append(Finding("warning", f"{' and '.join(causes)}: {engine} runs the MoE on {family} while the "
                                f"plan's correct fastest path is {d0.backend} (AITER) — silently slower"
                                + (" (emulation dequantizes to BF16: the slow reference path, not for serving)"
                                   if family == "emulation" else ""), own_src if own_pick else
                                env_src if not on else eng["source"], fix))
    gate = _gate_fails(engine, version, plan) if on and family == "triton" and engine == "sglang" else None
    if gate is not None and backend_flag == "auto":
        findings.append(Finding("info", f"{engine} {version} runs this MoE on Triton itself with {switch}=1: "
                                f"{gate['what']}", gate["source"], None))
    if family is not None:
        findings += _family_findings(plan, engine, version, d0, family, fix_line)
    runner = str(launch.flags.get("moe_backend", "auto")) if engine == "sglang" else None
    for row in matching_issues(engine, version, d0.layer, caps.gfx, ep=ep, family=family, env=launch.env,
                               runner=runner):
        findings.append(Finding(row["severity"], row["message"] + (" (unconfirmed)" if row.get("confidence") ==
                                                                     "unconfirmed" else ""),
                                row["source"], row["fix"]))
    return findings, family, refused


def _family_findings(plan: Any, engine: str, version: str, d0: Any, family: str,
                     fix_line: str | None) -> list[Finding]:
    """What is wrong with the engine running the MoE on ``family``: a family the plan rejects for the layer (with its
    reasons), or the engine's own refusals and confirmed warnings of realizing it."""
    findings: list[Finding] = []
    candidates = [d0.backend] + [r.backend for r in d0.rejected if r.supported]
    picked = next((b for b in candidates if _fam_of(b) == family), None)
    if picked is None:
        why = next((r for r in d0.rejected if _fam_of(r.backend) == family), None)
        reason = "; ".join(why.reasons[i].text for i in range(min(2, len(why.reasons)))) if why else \
            "no backend of that family is registered"
        findings.append(Finding("error", f"{engine} runs this MoE on {family}, which is wrong for the layer: "
                                f"{reason}", (why.reasons[0].source if why and why.reasons else None),
                                fix_line))
    else:
        decisions = _forced(plan, picked) or [d0]
        refusals, _, warns = _try_backend(plan, engine, version, picked, decisions)
        for r in refusals:
            if r.issue is None:  # engine issues are re-matched below with the launch's own env
                findings.append(Finding("error", r.text, r.source, fix_line))
        for w in warns:
            if w.issue is None and w.confidence == "confirmed":
                findings.append(Finding("warning", w.text, w.source, fix_line))
    return findings


def _launch_findings(launch: Launch, engine: str, version: str, eng: Mapping[str, Any]) -> list[Finding]:
    """What needs only the command line and its environment (no model, no plan): an engine release beyond the data,
    options the engine's parser rejects, ``--moe-backend aiter`` without vLLM's AITER switch, an AITER_CONFIG_FMOE
    that replaces AITER's whole tuned set."""
    findings: list[Finding] = []
    if Version(version) > Version(eng["newest"]):  # as the recipe says it: assumed, never silently
        findings.append(Finding("warning", f"--engine-version {version}: {engine} {version} is newer than the newest "
                                f"release capability_db knows ({eng['newest']}); its rules and options are assumed "
                                f"from {eng['newest']}", None, None))
    pre = prerelease_note(engine, version)
    if pre:
        findings.append(Finding("warning", pre, None, None))
    opts = engine_options(engine, version)
    for tok, hint in unknown_options(launch, version):
        findings.append(Finding("error", f"{engine} {version} has no option {tok}{hint}: its argument parser rejects "
                                "the launch (and moedispatch planned without it)", opts["source"] if opts else None,
                                None))
    findings += _attn_dp_spelling(launch, engine, version, eng)
    switch = eng["aiter_switch"]
    on = launch.env.get(switch, eng["aiter_switch_default"]).lower() in _TRUE
    backend_flag = str(launch.flags.get("moe_backend", "auto")).lower().replace("-", "_")
    if engine == "vllm" and backend_flag == "aiter" and not on:
        env_src = next((e["source"] for r in eng.get("backend", []) for e in r["env"] if e["name"] == switch), None)
        findings.append(Finding("error", f"--moe-backend aiter without {switch}=1: vLLM's AiterExperts refuses "
                                "(the master switch defaults to off) and the launch fails", env_src,
                                _set_env(launch, switch, "1")))
    override = launch.env.get("AITER_CONFIG_FMOE", "").strip()
    if override:
        findings.append(Finding("warning", f"AITER_CONFIG_FMOE={override} replaces AITER's whole tuned set (the "
                                "default tuned_fmoe.csv and every model_configs/*tuned_fmoe*.csv are not merged): "
                                "every shape missing from it runs untuned heuristics", "sgl-project/sglang#37072",
                                "unset AITER_CONFIG_FMOE, or list the default tuned CSVs with it (':'-separated)"))
    return findings


def _attn_dp_spelling(launch: Launch, engine: str, version: str, eng: Mapping[str, Any]) -> list[Finding]:
    """SGLang's data-parallel attention spelled for the release (``attn_dp_versions``): ``--attn-dp-size`` before
    the release that added it is refused by its parser; ``--enable-dp-attention`` from that release on is deprecated
    (SGLang removes it after 2026-12-31)."""
    spec = eng.get("attn_dp_versions")
    if engine != "sglang" or not spec:
        return []
    f = launch.flags
    new = has_attn_dp_flag(eng, version)
    if "attn_dp" in f and not new:
        n = f["attn_dp"]
        return [Finding("error", f"sglang {version} has no --attn-dp-size (added in {spec.lstrip('>=')}): its "
                        "argument parser rejects the launch", eng["attn_dp_absent_source"],
                        (f"--dp-size {n} --enable-dp-attention" if str(n) != "1" else "remove --attn-dp-size 1")
                        + " (or --engine-version with the release you run)")]
    if f.get("dp_attention") and new and "attn_dp" not in f:
        n = f.get("dp", "N")
        return [Finding("info", f"--dp-size {n} --enable-dp-attention is deprecated in sglang {version} (removed "
                        f"after 2026-12-31): it resolves to --attn-dp-size {n}", eng["attn_dp_source"],
                        f"--attn-dp-size {n} instead of --dp-size {n} --enable-dp-attention")]
    return []


def _ray_env_findings(launch: Launch, version: str, eng: Mapping[str, Any], recipe: Any) -> list[Finding]:
    """vLLM's Ray data-parallel actors copy only some of the driver's variables (capability_db/engines.toml
    ``[vllm.ray_env]``): an AITER/GPTOSS variable the launch sets or the plan needs (the recipe's environment) that
    is not copied never reaches the remote ranks — they plan (and pad, and dispatch) without it."""
    ray = eng.get("ray_env")
    if not ray or not _in(ray["versions"], version):
        return []
    if str(launch.flags.get(ray["backend_dest"], "")).lower() != ray["backend_value"]:
        return []
    extra_p = [p.strip() for p in launch.env.get(ray["extra_prefixes_env"], "").split(",") if p.strip()]
    extra_n = [n.strip() for n in launch.env.get(ray["extra_names_env"], "").split(",") if n.strip()]
    prefixes, names = tuple(ray["prefixes"]) + tuple(extra_p), set(ray["names"]) | set(extra_n)
    wanted = {k: "the launch sets it" for k in launch.env if k.startswith(("AITER_", "GPTOSS_")) or k == "CU_NUM"}
    wanted.update({e["name"]: "the plan assumed it" for e in getattr(recipe, "env", [])
                   if e["name"].startswith(("AITER_", "GPTOSS_"))})
    lost = sorted(k for k in wanted if not k.startswith(prefixes) and k not in names)
    if not lost:
        return []
    need = sorted({k.split("_", 1)[0] + "_" for k in lost})
    have = ",".join(extra_p + [p for p in need if p not in extra_p])
    why = "; ".join(f"{k} ({wanted[k]})" for k in lost)
    return [Finding("error" if any(wanted[k] == "the plan assumed it" for k in lost) else "warning",
                    f"--data-parallel-backend ray: vLLM's Ray data-parallel actors copy only {', '.join(ray['prefixes'])} "
                    f"variables (and {ray['extra_prefixes_env']}) from this shell: {why} will not reach the remote "
                    "ranks, which then run another AITER configuration than this node", ray["source"],
                    f"export {ray['extra_prefixes_env']}={have}")]


#: The option that caps the tokens per forward (what an issue's ``token_cap`` workaround sets; the flags above map
#: both to ``max_batched_tokens``).
_CAP_FLAG = {"vllm": "--max-num-batched-tokens", "sglang": "--chunked-prefill-size"}


def _dispatch_findings(plan: Any, launch: Any, fix_line: str | None, findings: list[Finding],
                       recipe_hits: set[str] = frozenset()) -> set[str]:
    """The known kernel × bucket issues and AITER refusals the launch's own AITER dispatch hits, with the severity
    their data declares (capability_db/dispatch_issues.toml); one whose environment workaround the launch already
    sets is handled and not reported. The recipe's line is offered as a fix only where the recipe's own launch does
    not hit the issue (``recipe_hits``). Returns the issue ids seen (the plan's warnings repeat them)."""
    seen: set[str] = set()
    for d in plan.decisions:
        dispatch = getattr(d, "dispatch", None)
        if d.layer.kind != "moe" or dispatch is None:
            continue
        for hit in dispatch.issues:
            if hit.issue in seen:
                continue
            seen.add(hit.issue)
            env = dict(hit.workaround_env)
            cap = str(launch.flags.get("max_batched_tokens") or "")
            if hit.handled_by(launch.env, int(cap) if cap.isdigit() else None):
                continue  # the launch applies the workaround or caps the batch below the bug
            toks = f"token {hit.tokens[0]}" if hit.tokens[0] == hit.tokens[1] else \
                f"tokens {hit.tokens[0]}–{hit.tokens[1]}"
            severity = hit.severity if hit.severity in ("error", "warning", "info") else "warning"
            recipe_fixes = fix_line is not None and hit.issue not in recipe_hits
            cap_fix = [_with_args(launch, [_CAP_FLAG[launch.engine], str(hit.token_cap)])] \
                if hit.token_cap and launch.engine in _CAP_FLAG else []
            fix = "; ".join([_set_env(launch, k, v) for k, v in env.items()] + cap_fix
                            + ([fix_line] if recipe_fixes else [])) or None
            findings.append(Finding(severity, f"AITER runs {hit.kernel} for {toks} (bucket {hit.bucket}): "
                                    f"{hit.effect}. Workaround: {hit.workaround}", hit.source, fix))
    return seen


def _fam_of(backend: str) -> str | None:
    b = plugins.get_registry().get(backend)
    fam = getattr(b, "family", None) if b is not None else None
    return "aiter" if fam in ("ck", "cktile", "flydsl", "asm") else fam


#: SGLang's data-parallel attention has two spellings of one setting (attn_dp_size; the deprecated dp_size with
#: enable_dp_attention, capability_db/engines.toml ``attn_dp_source``): a recipe's spelling drops the user's other
#: one — {recipe's dest: (the dest that marks the user's other spelling, the dests that spelling consists of)}.
_OTHER_SPELLING = {"attn_dp_size": ("enable_dp_attention", ("enable_dp_attention", "dp_size")),
                   "enable_dp_attention": ("attn_dp_size", ("attn_dp_size",))}


def _fix_from_launch(launch: Launch, recipe: Any) -> str | None:
    """The user's own command with the recipe's minimal changes: every option the recipe sets replaces the user's
    spelling of the same option (same dest), the others are added; every other user option, the model id as written
    and the launcher prefix (``docker run …``) stay; the recipe's environment is prefixed where the launch differs.
    None when the recipe has no launch (its alternatives are the fix then)."""
    found = _engine_of(list(launch.argv))
    if not recipe.ok or found is None:
        return None
    opts = _newest_options(launch.engine)
    dests, values = opts["dest"], set(opts["value_options"])
    head, args = list(launch.argv[:found[1]]), list(launch.argv[found[1]:])
    # the user's options as (dest, tokens) runs; positional tokens stay as they are; an option the engine release's
    # parser rejects (said as its own error) is left out: the corrected command must start
    unknown = dict(unknown_options(launch, recipe.version))
    release_opts = engine_options(launch.engine, recipe.version) or opts
    runs: list[tuple[str | None, list[str]]] = []
    i = 0
    while i < len(args):
        tok = args[i]
        if tok in unknown:   # with its value, as unknown_options reads it
            i += 2 if _typo_takes_value(release_opts, tok, unknown[tok]) and i + 1 < len(args) and \
                not args[i + 1].startswith("-") else 1
            continue
        name = _canonical(launch.engine, tok.partition("=")[0] if tok.startswith("--") else tok)
        if name in dests:
            take = 2 if name in values and "=" not in tok and i + 1 < len(args) else 1
            runs.append((dests[name], args[i:i + take]))
            i += take
        else:
            runs.append((None, [tok]))
            i += 1
    for a in recipe.args:
        toks = shlex.split(a["arg"])
        name = _canonical(launch.engine, toks[0])
        dest = dests.get(name)
        marker, spelled = _OTHER_SPELLING.get(dest, (None, ()))   # the recipe's spelling replaces the user's other
        if marker is not None and any(d == marker for d, _ in runs):
            runs = [r for r in runs if r[0] not in spelled]
        at = next((k for k, (d, _) in enumerate(runs) if d is not None and d == dest), None)
        if at is None:
            runs.append((dest, toks))
        else:
            runs[at] = (dest, toks)
            runs[at + 1:] = [r for r in runs[at + 1:] if r[0] is None or r[0] != dest]
    env = [f"{e['name']}={e['value']}" for e in recipe.env if launch.env.get(e["name"]) != e["value"]]
    inside = _into_container(head, env)
    if inside is None:
        line = dict(launch.prefix_env)
        line.update(kv.split("=", 1) for kv in env)
        words = [f"{k}={v}" for k, v in line.items()] + head
    else:   # the user's own assignments before `docker run` reach only the docker CLI: kept as written
        words = [f"{k}={v}" for k, v in launch.prefix_env.items()] + inside
    words += [t for _, toks in runs for t in toks]
    return " ".join([_shell_word(w) for w in words] + [t if _SHELL_OP.match(t) else _shell_word(t)
                                                        for t in launch.shell_tail])


def _with_args(launch: Launch, extra: Sequence[str]) -> str:
    """The launch's own command line (its assignments, argv, shell syntax after it) with ``extra`` appended to the
    engine's arguments: a fix that is this launch corrected (exec --guard fix runs it)."""
    words = [f"{k}={v}" for k, v in launch.prefix_env.items()] + list(launch.argv) + list(extra)
    return " ".join([_shell_word(w) for w in words] + [t if _SHELL_OP.match(t) else _shell_word(t)
                                                        for t in launch.shell_tail])


def _is_the_launch(launch: Launch, line: str) -> bool:
    """Whether ``line`` is the launch's own command line, word for word (its assignments, argv, shell syntax)."""
    try:
        words = shlex.split(line)
    except ValueError:
        return False
    return words == [f"{k}={v}" for k, v in launch.prefix_env.items()] + list(launch.argv) + list(launch.shell_tail)


#: The shell's special parameters (``"$@"``: the script's own arguments passed on; ``$1``), which lint never expands.
_SPECIAL = re.compile(r"\$(?:[@*#0-9]|\{[@*#0-9]+\})")


def _shell_word(word: str) -> str:
    """``word`` as the shell reads it back: as is when plain, in double quotes when it still holds a ``$VAR`` (or a
    special parameter such as ``$@``) the script left unexpanded (so the pasted line expands it as the script did),
    else single-quoted."""
    if word and re.fullmatch(r"[\w@%+=:,./-]+", word):
        return word
    if (_VAR.search(word) or _SPECIAL.search(word)) and not re.search(r'["\\`]', word):
        return f'"{word}"'
    return shlex.quote(word)


def in_container(launch: Launch) -> bool:
    """Whether the engine runs inside ``docker run`` / ``podman run`` (its environment is the container's)."""
    found = _engine_of(list(launch.argv))
    return found is not None and _container_run(launch.argv[:found[1]]) is not None


def _container_run(head: Sequence[str]) -> int | None:
    """Where ``docker run`` / ``podman run`` starts in the words before the engine command (None: no container)."""
    return next((i for i, tok in enumerate(head[:-1]) if os.path.basename(tok) in ("docker", "podman")
                 and head[i + 1] == "run"), None)


def _set_env(launch: Launch, name: str, value: str) -> str:
    """How the launch sets one variable for the engine: ``export K=V``, ``-e K=V`` on its container's run line (what
    is exported on the host never reaches the container), or the new value in place of the assignment the command's
    own line makes (``K=0 vllm serve …``: an export would not change it)."""
    found = _engine_of(list(launch.argv))
    head = list(launch.argv[:found[1]]) if found else []
    at = _container_run(head)
    if at is not None:
        return f"add -e {name}={value} to `{head[at]} run`"
    if name in launch.prefix_env:   # an assignment on the command's own line wins over an export
        return f"write {name}={value} for {name}={launch.prefix_env[name]} before the command"
    return f"export {name}={value}"


def _into_container(head: list[str], env: list[str]) -> list[str] | None:
    """``docker run …`` / ``podman run …`` with ``env`` (``K=V`` items) as its ``-e`` options — the container's
    environment is what the engine reads; a variable set before ``docker`` reaches only the docker CLI — replacing the
    launch's own ``-e``/``--env`` of the same names; None when ``head`` runs no container."""
    at = _container_run(head)
    if at is None:
        return None
    names = {kv.partition("=")[0] for kv in env}
    kept: list[str] = []
    i = 0
    while i < len(head):
        tok = head[i]
        if tok in ("-e", "--env") and i + 1 < len(head) and head[i + 1].partition("=")[0] in names:
            i += 2
            continue
        if tok.startswith("--env=") and tok[len("--env="):].partition("=")[0] in names:
            i += 1
            continue
        kept.append(tok)
        i += 1
    return kept[:at + 2] + [w for kv in env for w in ("-e", kv)] + kept[at + 2:]


def _fix(recipe: Any) -> str | None:
    if recipe.ok:
        env = " ".join(f"{e['name']}={e['value']}" for e in recipe.env)
        return (env + " " if env else "") + recipe.command.replace(" \\\n    ", " ")
    if recipe.alternatives:
        a = recipe.alternatives[0]
        env = " ".join(f"{k}={v}" for k, v in a["env"].items())
        return f"{a['change']}: " + (env + " " if env else "") + a["command"].replace(" \\\n    ", " ")
    return None


def _doc(launch: Launch, version: str, model: str, caps: Any, tp: int, ep: int,
         findings: list[Finding]) -> dict[str, Any]:
    order = {"error": 0, "warning": 1, "info": 2}
    unique = list(dict.fromkeys(findings))
    unique.sort(key=lambda f: order[f.severity])
    return {"schema": SCHEMA, "engine": launch.engine, "engine_version": version, "model": model,
            "target": capdb.target_entry(caps), "parallel": {"tp": tp, "ep": ep},
            "env": engine_env(launch.env),
            "launch": _launch_dict(launch), "findings": [f.to_dict() for f in unique]}


def _launch_dict(launch: Launch) -> dict[str, Any]:
    """What lint parsed (newcomer minor 19): where from, the engine command line as read (script variables expanded,
    continuations joined, leading ``K=V`` / ``env`` taken off; a ``docker run`` wrapper kept), the model as written, and the options lint reads, each under the
    ``dest`` the engine's own argument parser gives it (aliases and abbreviations resolved)."""
    dest = {key: d for d, key in _DEST_KEYS[launch.engine].items()}
    return {"from": launch.origin, "argv": list(launch.argv), "model": launch.model,
            "options": {dest.get(k, k): launch.flags[k] for k in sorted(launch.flags, key=lambda k: dest.get(k, k))}}


def render_lint(doc: dict[str, Any], fmt: str = "table", width: int | None = None) -> str:
    """The lint report; ``width``: the columns each line of the table fits in (``None``: unwrapped)."""
    if fmt == "json":
        return json.dumps(doc, indent=2) + "\n"
    t = doc["target"]
    part = f" {t['partition']}, {t['compute_units']} CUs" if t.get("partition") else ""
    lines = wrap(f"lint {doc['engine']} {doc['engine_version']} launch of {doc['model']} on {t['gfx']} "
                 f"({t.get('product') or '?'}{part}), AITER {t.get('aiter_version') or 'none'}, tp={doc['parallel']['tp']} "
                 f"ep={doc['parallel']['ep']}", "", width, hang=4)
    if not doc["findings"]:
        lines.append("  no findings")
    for f in doc["findings"]:
        lines += wrap(f["message"], f"  {f['severity'].upper():<7} ", width, hang=0)
        if f["source"]:
            lines += wrap(f["source"], "          source: ", width, hang=0)
        if f["fix"]:   # pasted into a shell: wrapped only between shell words, with ` \` continuations
            lines += wrap_shell(f["fix"], "          fix:    ", width)
    return "\n".join(lines) + "\n"


def run_cli(args: Any, out: Any) -> int:
    """The ``lint`` subcommand: exit 0 no error finding, 3 an error finding (2 is raised as UsageError)."""
    env = engine_env(os.environ)
    text = None
    if args.file == "-":  # the launch on stdin, as ruff and shellcheck read `-`
        try:
            text = sys.stdin.read()
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise UsageError(f"cannot read the launch from stdin: {exc}") from None
        if not text.strip():
            raise UsageError("lint -: stdin is empty; pipe a launch script or a `vllm serve …` line into it")
    elif args.file:
        try:
            with open(args.file, encoding="utf-8") as fh:
                text = fh.read()
        except (OSError, UnicodeDecodeError) as exc:
            raise UsageError(f"cannot read {args.file}: {exc}") from None
    engine_args = list(args.engine_args or [])
    if engine_args and engine_args[0] == "--":
        engine_args = engine_args[1:]
    if text is not None and engine_args:
        raise UsageError(f"lint takes a FILE or engine arguments after `--`, not both (got {args.file!r} and "
                         f"{shlex.join(engine_args[:3])}{' …' if len(engine_args) > 3 else ''})")
    if text is None and not engine_args:
        raise UsageError("lint needs a FILE or engine arguments after `--` (e.g. -- vllm serve MODEL --tensor-parallel-size 8)")
    given = parse_env_args(args.env or [], "--env")
    source = "stdin" if args.file == "-" else (args.file or "the script")
    launch = parse_launch(text, engine_args if text is None else None, None, {**os.environ, **given}, source=source)
    if in_container(launch):
        env = {}   # the caller's own environment does not reach the container (parse_launch read its -e K)
    env.update(launch.env)
    env.update(given)
    launch.env = env
    doc = lint_launch(launch, target=args.target, aiter_version=cli_aiter_version(args.aiter_version),
                      model=args.model,
                      engine_version=args.engine_version)
    out(render_lint(doc, args.format, getattr(args, "width", None)))
    return 3 if any(f["severity"] == "error" for f in doc["findings"]) else 0
