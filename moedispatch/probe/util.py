"""Isolation helpers for the probe: silence a call at the file-descriptor level, bound it in time, run tools.

Why fd level: ``import amdsmi`` without ``libamd_smi.so`` PRINTS two lines to stdout and then raises ``KeyError``
(https://pypi.org/project/amdsmi/7.0.2/ ``amdsmi/amdsmi_wrapper.py`` line 211). C code writes to fd 1 directly and a
host may have replaced ``sys.stdout``, so both the fds 1/2 and ``sys.stdout``/``sys.stderr`` are swapped.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")

MARKER = "@@MOEDISPATCH_PROBE@@"


class ProbeTimeout(Exception):
    """A probe step ran past its time limit."""


@dataclass
class Captured:
    """What a silenced block wrote to stdout/stderr (filled in when the block exits)."""

    text: str = ""

    def summary(self, limit: int = 240) -> str:
        lines = [ln.strip() for ln in self.text.splitlines() if ln.strip()]
        joined = " | ".join(lines)
        return joined if len(joined) <= limit else joined[: limit - 1] + "…"


def _flush_all() -> None:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        try:
            if stream is not None:
                stream.flush()
        except Exception:  # noqa: BLE001 - a closed/odd stream must not break the probe
            pass
    try:  # C stdio buffers (printf from a shared library)
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # noqa: BLE001
        pass


@contextlib.contextmanager
def silenced() -> Iterator[Captured]:
    """Send everything written to fd 1/2 and sys.stdout/sys.stderr into a buffer while the block runs."""
    captured = Captured()
    buffer = io.StringIO()
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        _flush_all()
        saved: list[tuple[int, int]] = []
        for fd in (1, 2):
            try:
                saved.append((fd, os.dup(fd)))
                os.dup2(tmp.fileno(), fd)
            except OSError:  # fd not open (daemonized host): nothing to protect
                pass
        try:
            with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
                yield captured
        finally:
            _flush_all()
            for fd, dup in saved:
                try:
                    os.dup2(dup, fd)
                finally:
                    os.close(dup)
            tmp.seek(0)
            captured.text = tmp.read().decode("utf-8", errors="replace") + buffer.getvalue()


def call_with_timeout(fn: Callable[[], T], timeout: float, name: str) -> T:
    """Run ``fn`` in a daemon thread; raise :class:`ProbeTimeout` if it is not done in ``timeout`` seconds.

    The exception ``fn`` raised (anything but KeyboardInterrupt) is re-raised here. A timed-out thread is left
    behind (it cannot be killed); callers must not retry the same library in this process.
    """
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name=f"moedispatch-probe-{name}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ProbeTimeout(f"{name} did not answer within {timeout:g}s")
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass(frozen=True)
class RunResult:
    returncode: int
    stdout: str
    stderr: str


def run_tool(argv: list[str], timeout: float, env: dict[str, str] | None = None) -> RunResult:
    """Run a command in its own process group; on timeout kill the whole group and raise :class:`ProbeTimeout`.

    Raises ``OSError`` (e.g. FileNotFoundError) when it cannot start.
    """
    proc = subprocess.Popen(  # argv is built by the probe, never from user text
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
        start_new_session=True,
        env=env,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            proc.communicate(timeout=2)
        raise ProbeTimeout(f"{os.path.basename(argv[0])} did not finish within {timeout:g}s (killed)") from None
    return RunResult(proc.returncode, out or "", err or "")


def run_python(script: str, timeout: float) -> tuple[dict[str, Any] | None, RunResult]:
    """Run ``script`` in a fresh interpreter that sees this process's ``sys.path``; parse its marker JSON line.

    The script receives the parent's sys.path as JSON in argv[1] and must print ``MARKER + json`` on a line.
    """
    paths = [p for p in sys.path if p]
    result = run_tool([sys.executable, "-c", script, json.dumps(paths)], timeout)
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(MARKER):
            try:
                data = json.loads(line[len(MARKER):])
            except ValueError:
                return None, result
            return (data if isinstance(data, dict) else None), result
    return None, result


def last_error_line(text: str) -> str:
    """The last non-empty line of a traceback-ish text (the ``Type: message`` line)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def describe(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
