"""``moedispatch exec``: check a launch, then become it (issue 24 item 5).

Mode (``--guard``, else ``MOEDISPATCH_GUARD``, else ``warn``):

* ``warn`` — print the findings, launch the command unchanged (never stops it);
* ``refuse`` — a finding of severity ``error`` (everything ``moedispatch lint`` exits 3 for) stops the launch with
  exit 3 before any engine process exists; otherwise launch unchanged;
* ``fix`` — on an error finding, launch the corrected command lint proposes (the user's command with the minimal
  changes, its environment prefixed) when there is one and it lints clean itself, and say so; when the only fix is
  another layout or engine, or every corrected command is still known-wrong, exit 3 as ``refuse`` does;
* ``off`` — launch unchanged without checking.

The launch replaces this process (``os.execvpe``): the engine keeps moedispatch's PID, gets the same argv (or the
fixed one) and this environment (plus the fix's variables, and ``MOEDISPATCH_GUARD`` / ``MOEDISPATCH_TARGET`` set to
exec's mode and target for the guard inside the engine). Findings go to stderr; stdout belongs to the engine.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from moedispatch._util.width import terminal_width, wrap, wrap_shell
from moedispatch.core.errors import UsageError
from moedispatch.core.workload import engine_env
from moedispatch.engines import lint

__all__ = ["MODES", "GUARD_ENV", "Outcome", "mode_from", "decide", "run"]

MODES = ("warn", "refuse", "fix", "off")
GUARD_ENV = "MOEDISPATCH_GUARD"
_TARGET_ENV = "MOEDISPATCH_TARGET"
_ASSIGN_CHARS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"


@dataclass(frozen=True)
class Outcome:
    """What ``exec`` does: ``action`` is ``launch`` (``argv``/``env`` as given), ``launch-fixed`` (the fix's) or
    ``refuse`` (exit 3, nothing launched); ``report`` the lines printed to stderr; ``doc`` the lint document."""

    action: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    report: tuple[str, ...] = ()
    doc: dict[str, Any] | None = field(default=None, compare=False)


def mode_from(flag: str | None, env: Mapping[str, str]) -> str:
    """``--guard`` wins, then ``MOEDISPATCH_GUARD``, then ``warn``; an unknown value is a one-line UsageError."""
    value = flag if flag is not None else env.get(GUARD_ENV, "warn")
    value = value.strip().lower()
    if value not in MODES:
        where = "--guard" if flag is not None else GUARD_ENV
        raise UsageError(f"{where}={value!r}: expected one of {', '.join(MODES)}")
    return value


def _split_fix(fix: str, argv: Sequence[str]) -> tuple[dict[str, str], list[str]] | None:
    """(environment to add, argv) of a lint fix: ``export K=V`` parts add variables to this launch; a command part
    (``A=1 vllm serve …``, also after ``the full recipe:``) whose words lint reads as a vLLM or SGLang launch replaces
    the argv. Advice in words (``write K=1 for K=0 before the command``, ``add -e K=1 to `docker run```, ``pick a TP
    that divides the model``) is never a command: such parts are skipped. None for a fix that is another layout or
    engine (``--tp 8 --ep 8: vllm serve …``), that cannot be read, or that has neither a command nor an export — not
    this launch corrected."""
    env: dict[str, str] = {}
    command: list[str] | None = None
    for part in (p.strip() for p in fix.split("; ")):
        if part.startswith("the full recipe: "):
            part = part[len("the full recipe: "):]
        try:
            words = shlex.split(part)
        except ValueError:
            return None
        if not words:
            continue
        if words[0] == "export":
            for w in words[1:]:
                k, eq, v = w.partition("=")
                if not eq or not k or any(c not in _ASSIGN_CHARS for c in k):
                    return None
                env[k] = v
            continue
        if words[0].startswith("-") or words[0].endswith(":"):
            return None  # "--tp 8 --ep 8: …", "--engine-version 0.32.0: …": another layout or engine
        lead: dict[str, str] = {}
        while words and "=" in words[0] and all(c in _ASSIGN_CHARS for c in words[0].split("=", 1)[0]):
            k, v = words.pop(0).split("=", 1)
            lead[k] = v
        if not words or lint._engine_of(words) is None:
            continue  # advice in words, not a command line
        env.update(lead)
        command = words
    if command is None and not env:
        return None
    return env, list(command if command is not None else argv)


def _finding_lines(doc: Mapping[str, Any]) -> list[str]:
    out = []
    for f in doc["findings"]:
        out.append(f"  {f['severity'].upper()}: {f['message']}" + (f" [{f['source']}]" if f["source"] else ""))
        if f["fix"] and f["severity"] != "info":
            out.append(f"    fix: {f['fix']}")
    return out


def decide(argv: Sequence[str], env: Mapping[str, str], mode: str, lint: Callable[..., dict[str, Any]],
           switch: str | Callable[[str], str] = GUARD_ENV, **lint_args: Any) -> Outcome:
    """The outcome of ``exec`` for this launch (pure apart from ``lint``, which plans and returns the
    ``moedispatch.lint/1`` document for a launch's argv and environment). ``switch`` is how the user chose the mode
    (``--guard`` or MOEDISPATCH_GUARD, or a function spelling ``mode`` for another channel), for the advice on
    changing it.

    In fix mode each error's corrected command is linted again before it is launched: the first that has no error
    finding is launched; when none is clean (or there is none), nothing is launched — a corrected command that is
    still known-wrong never runs."""
    argv = tuple(argv)

    def mode_is(value: str) -> str:
        if callable(switch):
            return switch(value)
        return f"--guard {value}" if switch == "--guard" else f"{GUARD_ENV}={value}"

    if mode == "off":
        return Outcome("launch", argv, dict(env), (f"moedispatch exec: guard off ({mode_is('off')}): launching "
                                                   "unchecked",))
    doc = lint(argv, env, **lint_args)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    others = [f for f in doc["findings"] if f["severity"] != "error"]
    head = (f"moedispatch exec ({mode}): {doc['engine']} {doc['engine_version']} launch of {doc['model']} — "
            f"{len(errors)} error(s), {len(others)} other finding(s)")
    report = [head] + _finding_lines(doc)
    if not errors or mode == "warn":
        tail = ("launching as given" if not errors else
                f"launching as given anyway (warn mode; {mode_is('refuse')} stops it, {mode_is('fix')} corrects it)")
        return Outcome("launch", argv, dict(env), tuple(report + [f"moedispatch exec: {tail}"]), doc)
    if mode == "fix":
        tried: list[tuple[dict[str, str], list[str]]] = []
        for f in errors:
            fixed = _split_fix(f["fix"], argv) if f["fix"] else None
            if fixed is None or fixed in tried:
                continue
            tried.append(fixed)
            extra, new_argv = fixed
            new_env = {**env, **extra}
            try:
                again = [g for g in lint(tuple(new_argv), new_env, **lint_args)["findings"]
                         if g["severity"] == "error"]
            except UsageError as exc:   # a corrected command lint cannot read is not a corrected command
                again = [{"message": str(exc)}]
            if again:
                report.append(f"moedispatch exec: not the corrected command {shlex.join(new_argv)}: still "
                              f"known-wrong — {again[0]['message']}")
                continue
            changed = ", ".join(f"{k}={v}" for k, v in extra.items() if env.get(k) != v)
            return Outcome("launch-fixed", tuple(new_argv), new_env, tuple(report + [
                "moedispatch exec: launching the corrected command instead (it lints clean): " + shlex.join(new_argv)
                + (f" (environment: {changed})" if changed else "")]), doc)
        report.append("moedispatch exec: no corrected command for this launch lints clean (the nearest safe launches "
                      "are another layout or engine, above): not launched")
        return Outcome("refuse", argv, dict(env), tuple(report), doc)
    report.append(f"moedispatch exec: not launched (refuse mode): fix the errors above (each fix: line is the "
                  f"corrected launch), or launch it anyway with {mode_is('warn')}")
    return Outcome("refuse", argv, dict(env), tuple(report), doc)


def _lint(argv: Sequence[str], env: Mapping[str, str], **kw: Any) -> dict[str, Any]:
    visible = engine_env(env)
    launch = lint.parse_launch(None, list(argv), visible, dict(env))
    return lint.lint_launch(launch, **kw)


def run(argv: Sequence[str], *, guard: str | None = None, target: str | None = None,
        aiter_version: str | None = None, model: str | None = None, engine_version: str | None = None,
        env: Mapping[str, str] | None = None, execvpe: Callable[..., Any] = os.execvpe,
        err: Any = None) -> int:
    """Check, report on stderr, then ``execvpe`` the launch; returns 3 when refused (the launch never returns)."""
    env = dict(os.environ if env is None else env)
    err = err or sys.stderr
    argv = list(argv)
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        raise UsageError("exec needs the launch after `--` (e.g. moedispatch exec -- vllm serve MODEL --tensor-parallel-size 8)")
    mode = mode_from(guard, env)
    if execvpe is os.execvpe and shutil.which(argv[0], path=env.get("PATH", os.defpath)) is None:
        raise UsageError(f"cannot launch {argv[0]!r}: not found on PATH — activate the engine's environment (or give "
                         "the command's full path)")
    out = decide(argv, env, mode, _lint, "--guard" if guard is not None else GUARD_ENV, target=target,
                 aiter_version=aiter_version, model=model, engine_version=engine_version)
    width = terminal_width(err)
    for line in out.report:
        err.write(_wrap(line, width) + "\n")
    err.flush()
    if out.action == "refuse":
        return 3
    # The guard installed next to the engine reads these: it checks in exec's mode (not its default, warn, after
    # `--guard off`) and for exec's target.
    handed = {GUARD_ENV: mode, **({_TARGET_ENV: target} if target else {})}
    try:
        execvpe(out.argv[0], list(out.argv), {**out.env, **handed})
    except OSError as exc:
        raise UsageError(f"cannot launch {out.argv[0]!r}: {exc.strerror or exc}") from None
    return 0  # only reached with a stand-in execvpe


def _wrap(line: str, width: int | None) -> str:
    """A report line fitted to the terminal (continuation lines indented); a ``fix:`` line breaks only between shell
    words, with `` \\`` continuations, so it still pastes as one command."""
    if width is None or len(line) <= width:
        return line
    indent = line[: len(line) - len(line.lstrip())]
    if line.lstrip().startswith("fix: "):
        return "\n".join(wrap_shell(line.lstrip()[len("fix: "):], indent + "fix: ", width))
    return "\n".join(wrap(line.lstrip(), indent, width, hang=4))
