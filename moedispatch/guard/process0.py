"""The process-0 check inside an engine (issue 24 item 2), engine-agnostic: the same decision as ``moedispatch exec``.

The engine's own configuration (vLLM's ``VllmConfig``, SGLang's ``ServerArgs``) is written back as the command line
that would produce it (:func:`launch_argv`), and that command line goes through exactly what ``exec`` does:
``moedispatch lint``'s findings, then :func:`moedispatch.guard.launch.decide` for the mode. In-process, ``fix`` can
change only what the engine still reads after process 0 — its MoE backend flag and the environment its workers
inherit; a fix that is another layout (TP/EP) or engine refuses, as in ``exec``.

Pure apart from planning (no engine import); :mod:`moedispatch.guard.vllm` and :mod:`moedispatch.guard.sglang`
read the engine's config into :func:`launch_argv`'s arguments and apply :class:`Verdict` to it.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from moedispatch.core.errors import UsageError
from moedispatch.core.workload import engine_env
from moedispatch.data import capdb
from moedispatch.engines import lint
from moedispatch.engines.choice import ENGINES, _data
from moedispatch.guard.launch import GUARD_ENV, MODES, decide

__all__ = ["Settings", "Verdict", "settings", "mode_is", "unmodelled", "launch_argv", "check", "refusal_message", "say",
           "installable", "guard_process0", "PREFIX"]

PREFIX = "moedispatch guard"
#: The engine config channel's key (vLLM ``--additional-config '{"moedispatch": {"mode": "refuse"}}'``).
CONFIG_KEY = "moedispatch"
_TARGET_ENV = "MOEDISPATCH_TARGET"


@dataclass(frozen=True)
class Settings:
    """The guard's mode, an optional target override (a multi-node launch's process 0 may run on a node without the
    GPUs it plans for) and where the mode came from (for the report)."""

    mode: str
    target: str | None = None
    where: str = "default"


def settings(env: Mapping[str, str], extra: Any = None) -> Settings:
    """The engine config channel (``{"moedispatch": {"mode": …, "target": …}}``, carried to every process) wins over
    ``MOEDISPATCH_GUARD`` / ``MOEDISPATCH_TARGET``; without either the guard warns. A value it cannot honour raises
    :class:`UsageError` (one line): a guard that was asked for ``refuse`` never silently becomes ``warn``."""
    own = extra.get(CONFIG_KEY) if isinstance(extra, Mapping) else None
    if own is not None and not isinstance(own, Mapping):
        raise UsageError(f"additional config {CONFIG_KEY!r} must be an object like {{\"mode\": \"refuse\"}}, "
                         f"got {own!r}")
    own = dict(own or {})
    unknown = sorted(set(own) - {"mode", "target"})
    if unknown:
        raise UsageError(f"additional config {CONFIG_KEY!r}: unknown key(s) {', '.join(unknown)} (known: mode, target)")
    if "mode" in own:
        mode, where = own["mode"], f"additional config {CONFIG_KEY}.mode"
    elif GUARD_ENV in env:
        mode, where = env[GUARD_ENV], GUARD_ENV
    else:
        mode, where = "warn", "default"
    if not isinstance(mode, str) or mode.strip().lower() not in MODES:
        raise UsageError(f"{where}={mode!r}: expected one of {', '.join(MODES)}")
    target = own.get("target", env.get(_TARGET_ENV))
    if target is not None and (not isinstance(target, str) or not target.strip()):
        raise UsageError(f"moedispatch guard target must be a GPU name like MI355X, got {target!r}")
    if target is not None:
        named = f"additional config {CONFIG_KEY}.target" if "target" in own else _TARGET_ENV
        try:   # a target the guard cannot plan for is a setting it cannot honour, not a launch it could not check
            capdb.target_capabilities(target.strip(), None)
        except UsageError as exc:
            raise UsageError(f"{named}={target!r}: {exc}") from None
    return Settings(mode.strip().lower(), target.strip() if target else None, where)


def mode_is(cfg: Settings, value: str) -> str:
    """How to ask for mode ``value`` through the channel that chose ``cfg``'s: the config channel wins over
    ``MOEDISPATCH_GUARD``, so advice to set the environment would change nothing there."""
    if cfg.where.startswith("additional config"):
        return f"--additional-config '{json.dumps({CONFIG_KEY: {'mode': value}})}'"
    return f"{GUARD_ENV}={value}"


def unmodelled(engine: str, version: str) -> str | None:
    """Why the guard cannot judge this engine release (its rules are not modelled), or None when they are."""
    try:
        _data(engine, version)
    except UsageError:
        known = ", ".join(f"{engine} {v}" for v in ENGINES.get(engine, {}))
        return (f"{engine} {version} is outside the releases moedispatch models ({known}); the guard is off for this "
                "launch rather than judge it by another release's rules")
    return None


def launch_argv(engine: str, model: str, *, tp: int = 1, dp: int = 1, ep: int | None = None, ep_flag: bool = False,
                moe_backend: str | None = None, max_batched_tokens: int | None = None,
                data_parallel_backend: str | None = None, dp_attention: bool = False, attn_dp: int = 1,
                quantization: str | None = None) -> list[str]:
    """The command line that makes ``engine`` build this configuration (what ``lint`` and ``exec`` read)."""
    if engine == "vllm":
        argv = ["vllm", "serve", model, "--tensor-parallel-size", str(tp)]
        if dp > 1:
            argv += ["--data-parallel-size", str(dp)]
        if ep_flag:
            argv.append("--enable-expert-parallel")
        if moe_backend:
            argv += ["--moe-backend", moe_backend]
        if max_batched_tokens:
            argv += ["--max-num-batched-tokens", str(max_batched_tokens)]
        if data_parallel_backend and dp > 1:
            argv += ["--data-parallel-backend", data_parallel_backend]
    elif engine == "sglang":
        argv = ["python", "-m", "sglang.launch_server", "--model-path", model, "--tp-size", str(tp)]
        if dp > 1:
            argv += ["--dp-size", str(dp)]
        if ep and ep > 1:
            argv += ["--ep-size", str(ep)]
        if dp_attention:
            argv.append("--enable-dp-attention")
        if attn_dp > 1:
            argv += ["--attn-dp-size", str(attn_dp)]
        if moe_backend:
            argv += ["--moe-runner-backend", moe_backend]
        if max_batched_tokens:
            argv += ["--chunked-prefill-size", str(max_batched_tokens)]
    else:
        raise UsageError(f"unknown engine {engine!r}")
    if quantization:
        argv += ["--quantization", quantization]
    return argv


@dataclass(frozen=True)
class Verdict:
    """What the guard does in process 0: ``action`` ``pass`` (launch as configured), ``refuse`` (raise before any
    worker), ``fix`` (``moe_backend`` / ``env`` set, then launch); ``report`` the lines it prints."""

    action: str
    report: tuple[str, ...]
    moe_backend: str | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    doc: dict[str, Any] | None = field(default=None, compare=False)


def _visible(env: Mapping[str, str]) -> dict[str, str]:
    return engine_env(env)


def check(engine: str, version: str, argv: Sequence[str], env: Mapping[str, str], cfg: Settings, *,
          spec: Any = None, prefix: str = "moedispatch guard") -> Verdict:
    """The process-0 verdict for the launch ``argv`` (from :func:`launch_argv`) in ``env``: ``exec``'s decision,
    restricted to what an engine can still change in-process."""
    def _lint(a: Sequence[str], e: Mapping[str, str], **kw: Any) -> dict[str, Any]:
        launch = lint.parse_launch(None, list(a), _visible(e), dict(e))
        return lint.lint_launch(launch, spec=spec, engine_version=version, target=cfg.target, **kw)

    out = decide(argv, env, cfg.mode, _lint, lambda value: mode_is(cfg, value))
    report = tuple(line.replace("moedispatch exec", prefix, 1) for line in out.report)
    if out.action == "launch":
        return Verdict("pass", report, doc=out.doc)
    if out.action == "refuse":
        return Verdict("refuse", report, doc=out.doc)
    before = lint.parse_launch(None, list(argv), {}, {})
    after = lint.parse_launch(None, list(out.argv), {}, {})
    changed = {k for k in set(before.flags) | set(after.flags) if before.flags.get(k) != after.flags.get(k)}
    if after.model != before.model or changed - {"moe_backend"}:
        return Verdict("refuse", report[:-1] + (
            f"{prefix}: the fix changes {', '.join(sorted(changed - {'moe_backend'})) or 'the model'}, which this "
            f"engine process cannot change once configured — relaunch with: {' '.join(out.argv)}",), doc=out.doc)
    added = {k: v for k, v in out.env.items() if env.get(k) != v}
    backend = str(after.flags["moe_backend"]) if "moe_backend" in changed else None
    return Verdict("fix", report, moe_backend=backend, env=added, doc=out.doc)


def refusal_message(engine: str, verdict: Verdict, cfg: Settings | None = None) -> str:
    """One paragraph for the exception that stops the launch: each error finding with its source and fix, and how to
    launch anyway (through the channel that chose ``cfg``'s mode)."""
    doc = verdict.doc or {}
    errors = [f for f in doc.get("findings", ()) if f["severity"] == "error"]
    parts = [f["message"] + (f" [{f['source']}]" if f.get("source") else "") + (f" (fix: {f['fix']})" if f.get("fix")
                                                                                 else "") for f in errors]
    if not parts:  # a fix this process cannot apply (another layout): its line says what to relaunch with
        parts = [verdict.report[-1].split(": ", 1)[-1]]
    return (f"moedispatch guard (refuse): this {engine} {doc.get('engine_version', '')} launch of "
            f"{doc.get('model', 'the model')} is known-wrong for its MoE layers — " + " | ".join(parts)
            + f" — not started. To start it anyway: {mode_is(cfg or Settings('refuse'), 'warn')}.")


def environ() -> dict[str, str]:
    """This process's environment (one place, so tests can see what the guard reads)."""
    return dict(os.environ)


def say(line: str) -> None:
    """One line of the guard's report on stderr (stdout belongs to the engine)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def installable(engine: str, state: dict[str, Any], on_rocm: Callable[[], bool]) -> str | None:
    """The engine's release when the guard should install its hooks in this process (once), else None: off by
    ``MOEDISPATCH_GUARD``, already installed, an engine not running on ROCm (``on_rocm``; a target given with
    ``MOEDISPATCH_TARGET`` still plans for it) or a release outside the model (said in one line). A mode it cannot
    honour raises :class:`UsageError`."""
    cfg = settings(os.environ)
    if cfg.mode == "off" or state.get("registered"):
        return None
    state["registered"] = True
    if cfg.target is None and not on_rocm():
        say(f"{PREFIX}: off — {engine} is not running on ROCm here (set MOEDISPATCH_TARGET to check a launch for an "
            "AMD GPU anyway)")
        return None
    version = str(importlib.import_module(engine).__version__).split("+", 1)[0]
    why = unmodelled(engine, version)
    if why:
        say(f"{PREFIX}: off — {why}")
        return None
    state["version"] = version
    return version


def guard_process0(engine: str, version: str, extra: Any, launch: Callable[[], tuple[list[str], Any]],
                   apply_fix: Callable[[Verdict], str]) -> Verdict | None:
    """Process 0's check inside an engine: settings (``extra``: the engine's config channel), the verdict on
    ``launch()`` (argv, model spec or None), the report; ``refuse`` raises ``ValueError`` (one paragraph); ``fix``
    calls ``apply_fix`` (which changes the engine's config and says what, as a phrase), re-checks the corrected launch
    and raises if it is still known-wrong. A launch the guard cannot read starts unchecked, with one line."""
    start = time.perf_counter()
    try:
        cfg = settings(os.environ, extra)
    except UsageError as exc:
        raise ValueError(f"{PREFIX}: {exc}") from None
    if cfg.mode == "off":
        say(f"{PREFIX}: off ({cfg.where}) — this launch is not checked")
        return None

    def verdict_now() -> Verdict:
        argv, spec = launch()
        return check(engine, version, argv, environ(), cfg, spec=spec, prefix=PREFIX)

    try:
        verdict = verdict_now()
    except Exception as exc:  # the guard never breaks an engine's start-up by its own failure: it says so
        say(f"{PREFIX} ({cfg.mode}): could not check this launch ({type(exc).__name__}: {exc}); it starts unchecked")
        return None
    for line in verdict.report:
        say(line)
    if verdict.action == "refuse":
        raise ValueError(refusal_message(engine, verdict, cfg))
    if verdict.action == "fix":
        os.environ.update(verdict.env)
        parts = [apply_fix(verdict)] + [f"{k}={v}" for k, v in verdict.env.items()]
        say(f"{PREFIX} (fix): set {', '.join(p for p in parts if p) or 'nothing'} for this launch and its workers")
        verdict = verdict_now()
        if verdict.action != "pass":  # the corrected launch is still known-wrong: never start it
            raise ValueError(refusal_message(engine, verdict, cfg) + " (after the guard's fix)")
        say(f"{PREFIX} (fix): the corrected launch checks clean")
    say(f"{PREFIX}: process-0 check took {time.perf_counter() - start:.2f} s")
    return verdict
