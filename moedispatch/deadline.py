"""Deadlines for third-party plugin calls: a plugin that hangs cannot hang selection or discovery.

Calls run on a small pool of daemon worker threads; the caller waits at most ``MOEDISPATCH_PLUGIN_TIMEOUT`` seconds
(default 10) and gets :class:`PluginTimeout`. Built-in backends are called directly (no thread).
"""

from __future__ import annotations

import os
import queue
import threading
from typing import Any

__all__ = ["DEFAULT_PLUGIN_TIMEOUT_S", "PluginTimeout", "plugin_timeout", "call_with_deadline"]

DEFAULT_PLUGIN_TIMEOUT_S = 10.0


class PluginTimeout(Exception):
    """A third-party plugin call did not return in time; ``str()`` is ``"<what> timed out after <N>s"``."""


def plugin_timeout() -> float:
    """The deadline for one third-party plugin call: ``MOEDISPATCH_PLUGIN_TIMEOUT`` seconds, else the default."""
    raw = os.environ.get("MOEDISPATCH_PLUGIN_TIMEOUT")
    if raw:
        try:
            value = float(raw)
            if value > 0:
                return value
        except ValueError:
            pass
    return DEFAULT_PLUGIN_TIMEOUT_S


class _Task:
    __slots__ = ("fn", "args", "done", "value", "error")

    def __init__(self, fn: Any, args: tuple) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.value = self.fn(*self.args)
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from a plugin are its failure too
            self.error = exc
        finally:
            self.done.set()


class _Workers:
    """Daemon worker threads for third-party plugin calls. A worker stuck in a hung plugin stays stuck (Python
    cannot kill a thread) but is daemonic, so it never blocks interpreter exit; new work gets a fresh worker."""

    def __init__(self) -> None:
        self._tasks: queue.SimpleQueue[_Task] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._idle = 0
        self._started = 0

    def _loop(self) -> None:
        while True:
            task = self._tasks.get()
            task.run()
            task = None  # type: ignore[assignment]  # drop references while idle
            with self._lock:
                self._idle += 1

    def submit(self, task: _Task) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
            else:
                self._started += 1
                threading.Thread(target=self._loop, name=f"moedispatch-plugin-{self._started}", daemon=True).start()
        self._tasks.put(task)


_workers = _Workers()


def call_with_deadline(fn: Any, args: tuple = (), *, what: str, timeout: float | None = None) -> Any:
    """``fn(*args)`` on a worker thread; its result, its exception re-raised, or :class:`PluginTimeout`.

    ``what`` names the call in the timeout message (``check()`` → ``check() timed out after 5s``). A
    ``BaseException`` such as ``SystemExit`` raised by the plugin comes back wrapped in a ``RuntimeError`` so it
    is isolated like any other plugin failure.
    """
    limit = plugin_timeout() if timeout is None else timeout
    task = _Task(fn, args)
    _workers.submit(task)
    if not task.done.wait(limit):
        raise PluginTimeout(f"{what} timed out after {limit:g}s")
    if task.error is not None:
        if isinstance(task.error, Exception):
            raise task.error
        raise RuntimeError(f"{type(task.error).__name__}: {task.error}") from task.error
    return task.value
