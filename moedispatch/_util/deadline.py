"""Deadlines for third-party plugin calls: a plugin that hangs cannot hang selection or discovery, a plugin that
hung once is not asked again, and a plugin that prints cannot corrupt our stdout.

Calls run on a small pool of daemon worker threads; the caller waits at most ``MOEDISPATCH_PLUGIN_TIMEOUT`` seconds
(default 10) and gets :class:`PluginTimeout`. Built-in backends are called directly (no thread).

* **Disabled after a timeout.** A call made for a backend (``owner=``) that times out disables that backend's
  plugin for the rest of the run: every later call for any backend of the same plugin fails at once with
  :class:`PluginDisabled` (``disabled after timing out in check() on layer 3``), so a run costs at most one timeout
  per plugin. :func:`reset_disabled` (called by :func:`moedispatch.selector.plugins.reset_registry`) forgets it.
* **Stdout stays ours.** While plugin calls are running, ``sys.stdout`` is a proxy that routes writes made on a
  plugin worker thread into that call's capture buffer and passes every other thread's writes through. Captured
  text is reported as a plugin warning (``plugin 'acme' printed to stdout during check(): …``): into the
  :func:`collect_plugin_notices` collector the caller holds (the plan's warnings), else once per plugin and call
  as a ``plugin_printed`` log warning. :func:`fd_stdout_captured` additionally catches writes to file descriptor 1
  (C extensions, ``os.write``) during discovery; it is switched on by the CLI only (:func:`set_fd_capture`), since a
  host process's own threads may write to fd 1 at the same time.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator
from moedispatch._util.log import get_logger

__all__ = ["DEFAULT_PLUGIN_TIMEOUT_S", "PluginTimeout", "PluginDisabled", "plugin_timeout", "call_with_deadline",
           "register_owner", "registered_third_party", "owner_name", "reset_disabled", "disabled_reason",
           "collect_plugin_notices",
           "PluginNotices", "first_time", "fd_stdout_captured", "set_fd_capture", "snippet"]

DEFAULT_PLUGIN_TIMEOUT_S = 10.0

#: Characters of a plugin's stdout kept per call (the rest is counted, not stored).
_CAPTURE_CHARS = 4096
#: Characters of captured output quoted in a warning.
_SNIPPET_CHARS = 160


class PluginTimeout(Exception):
    """A third-party plugin call did not return in time; ``str()`` is ``"<what> timed out after <N>s"``."""


class PluginDisabled(PluginTimeout):
    """The plugin timed out earlier in this run and is not called again; ``str()`` is ``"disabled after timing out
    in <what> on <where>"``."""


def plugin_timeout() -> float:
    """The deadline for one third-party plugin call: ``MOEDISPATCH_PLUGIN_TIMEOUT`` seconds, else the default."""
    raw = os.environ.get("MOEDISPATCH_PLUGIN_TIMEOUT")
    if raw:
        try:
            value = float(raw)
            if value > 0:
                # "inf" (or 1e300) means no deadline; threading's waits overflow past TIMEOUT_MAX.
                return min(value, threading.TIMEOUT_MAX)
        except ValueError:
            pass
    return DEFAULT_PLUGIN_TIMEOUT_S


# -- stdout capture ----------------------------------------------------------------------------------------------

_tls = threading.local()  # .capture on a worker thread while it runs a plugin call; .notices on a caller thread


class _Capture:
    """What one plugin call wrote to ``sys.stdout`` (the first ``_CAPTURE_CHARS`` characters, and the total)."""

    __slots__ = ("parts", "kept", "total")

    def __init__(self) -> None:
        self.parts: list[str] = []
        self.kept = 0
        self.total = 0

    def write(self, text: str) -> None:
        self.total += len(text)
        room = _CAPTURE_CHARS - self.kept
        if room > 0:
            self.parts.append(text[:room])
            self.kept += min(room, len(text))

    def text(self) -> str:
        return "".join(self.parts)


class _RoutedStdout:
    """``sys.stdout`` while plugin calls run: a plugin worker thread's writes go to its call's capture, every other
    thread's writes to the stream that was ``sys.stdout`` before (everything else is delegated to it)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        capture = getattr(_tls, "capture", None)
        if capture is None:
            return self._stream.write(text)
        capture.write(str(text))
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        if getattr(_tls, "capture", None) is None:
            self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


_route_lock = threading.Lock()
_routed: _RoutedStdout | None = None
_active = 0


def _route_start() -> None:
    global _routed, _active
    with _route_lock:
        if sys.stdout is not None and sys.stdout is not _routed:
            _routed = _RoutedStdout(sys.stdout)
            sys.stdout = _routed
        _active += 1


def _route_end() -> None:
    global _routed, _active
    with _route_lock:
        _active -= 1
        if _active == 0 and _routed is not None:
            if sys.stdout is _routed:
                sys.stdout = _routed._stream
            _routed = None


def snippet(text: str, limit: int = _SNIPPET_CHARS) -> str:
    """Captured output as one quoted line: whitespace runs collapsed, cut at ``limit`` characters."""
    flat = " ".join(text.split())
    if len(flat) > limit:
        flat = flat[: limit - 1].rstrip() + "…"
    return repr(flat)


_fd_capture = False


def set_fd_capture(enabled: bool) -> None:
    """Also capture file-descriptor-1 writes during plugin discovery (the CLI owns its process; a library host may
    not want fd 1 redirected, even for milliseconds)."""
    global _fd_capture
    _fd_capture = bool(enabled)


@contextmanager
def fd_stdout_captured(into: list[str]) -> Iterator[None]:
    """Redirect file descriptor 1 to a temporary file for the block and append what landed there to ``into``.

    A no-op unless :func:`set_fd_capture` switched it on, or when fd 1 cannot be duplicated. C-level stdio buffers
    are flushed before fd 1 is restored so a C extension's ``printf`` lands in the capture, not in our report.
    """
    if not _fd_capture:
        yield
        return
    import tempfile

    try:
        if sys.stdout is not None:
            sys.stdout.flush()  # our own pending output belongs on the real stdout
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):
        yield
        return
    tmp = tempfile.TemporaryFile()
    try:
        os.dup2(tmp.fileno(), 1)
        try:
            yield
        finally:
            _flush_c_stdio()
            os.dup2(saved, 1)
        tmp.seek(0)
        data = tmp.read()
        if data:
            into.append(data.decode("utf-8", errors="replace"))
    finally:
        os.close(saved)
        tmp.close()


def _flush_c_stdio() -> None:
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except Exception:  # noqa: BLE001 - best effort: no libc (Windows), a sandbox without dlopen
        pass


# -- notices: what plugins printed, which were disabled -------------------------------------------------------------

class PluginNotices:
    """Plugin warnings gathered while a plan is made: output printed during calls (one entry per plugin and call
    name, with a count) and plugins disabled after a timeout. :meth:`texts` renders them for the plan's warnings."""

    def __init__(self) -> None:
        self._printed: dict[tuple[str, str], list[Any]] = {}  # (plugin, what) -> [first text, calls, chars]
        self._disabled: list[str] = []

    def printed(self, plugin: str, what: str, text: str, total: int) -> None:
        entry = self._printed.setdefault((plugin, what), [text, 0, 0])
        entry[1] += 1
        entry[2] += total

    def disabled(self, message: str) -> None:
        if message not in self._disabled:
            self._disabled.append(message)

    def texts(self) -> list[str]:
        out = []
        for (plugin, what), (text, calls, _chars) in self._printed.items():
            many = f" ({calls} calls)" if calls > 1 else ""
            out.append(f"plugin {plugin!r} printed to stdout during {what}{many}: {snippet(text)}")
        return out + list(self._disabled)

    def __bool__(self) -> bool:
        return bool(self._printed or self._disabled)


@contextmanager
def collect_plugin_notices() -> Iterator[PluginNotices]:
    """Gather the plugin notices of calls made on this thread within the block (nested blocks each see theirs)."""
    notices = PluginNotices()
    stack = getattr(_tls, "notices", None)
    if stack is None:
        stack = _tls.notices = []
    stack.append(notices)
    try:
        yield notices
    finally:
        stack.remove(notices)


_logged: set[tuple[str, ...]] = set()


def first_time(*key: str) -> bool:
    """True the first time ``key`` is seen in this run (cleared with :func:`reset_disabled`): a broken plugin hook that
    is asked for every layer group logs its warning once, not once per call."""
    with _state_lock:
        if key in _logged:
            return False
        _logged.add(key)
        return True


def _notice_printed(plugin: str, what: str, capture: _Capture) -> None:
    stack = getattr(_tls, "notices", None)
    if stack:
        for notices in stack:
            notices.printed(plugin, what, capture.text(), capture.total)
        return
    if (plugin, what) not in _logged:  # a host without a collector: one log warning per plugin and call
        _logged.add((plugin, what))
        _log().warning("plugin_printed", plugin=plugin, call=what, output=snippet(capture.text()))


def _notice_disabled(message: str, plugin: str) -> None:
    stack = getattr(_tls, "notices", None)
    if stack:
        for notices in stack:
            notices.disabled(message)
    _log().warning("plugin_disabled", plugin=plugin, reason=message)


def _log() -> Any:
    return get_logger(__name__)


# -- owners and the disabled set -------------------------------------------------------------------------------

_state_lock = threading.Lock()
# id(backend) -> (backend, plugin name, token); the token is one per plugin registration, so a rebuilt registry
# (a new token) starts with nothing disabled. The stored backend keeps the id valid.
_owners: dict[int, tuple[Any, str, object]] = {}
_third_party: dict[int, Any] = {}  # id -> backend, for every backend a registry registered as third-party
_disabled: dict[object, str] = {}  # token (or id of an unregistered backend's owner entry) -> "in check() on layer 3"


def register_owner(backend: Any, plugin: str, token: object) -> None:
    """Record that ``backend`` belongs to third-party ``plugin`` (one ``token`` per plugin registration): a timeout in
    any of the plugin's backends disables all of them, and the backend is never trusted as a built-in, whatever its
    class's module says (:func:`registered_third_party`)."""
    with _state_lock:
        _owners[id(backend)] = (backend, plugin, token)
        _third_party[id(backend)] = backend


def registered_third_party(backend: Any) -> bool:
    """Whether a plugin registry registered ``backend`` as a third-party plugin's (the registration record decides,
    not the class's module name)."""
    with _state_lock:
        return _third_party.get(id(backend)) is backend


def _owner(backend: Any) -> tuple[str, object]:
    with _state_lock:
        entry = _owners.get(id(backend))
        if entry is not None and entry[0] is backend:
            return entry[1], entry[2]
        # A backend used without a registry (tests, embedding): it is its own plugin.
        name = getattr(backend, "name", None)
        token = object()
        _owners[id(backend)] = (backend, name if isinstance(name, str) else type(backend).__name__, token)
        return _owners[id(backend)][1], token


def owner_name(backend: Any) -> str:
    """The plugin that registered ``backend`` (its own name when it came from no registry)."""
    return _owner(backend)[0]


def disabled_reason(backend: Any) -> str | None:
    """``disabled after timing out in check() on layer 3`` when ``backend``'s plugin timed out earlier, else None."""
    _, token = _owner(backend)
    with _state_lock:
        where = _disabled.get(token)
    return f"disabled after timing out {where}" if where is not None else None


def reset_disabled() -> None:
    """Forget which plugins timed out and who owns which backend (a new run; tests)."""
    with _state_lock:
        _owners.clear()
        _disabled.clear()
    _logged.clear()


# -- workers -----------------------------------------------------------------------------------------------------

class _Task:
    __slots__ = ("fn", "args", "done", "value", "error", "capture")

    def __init__(self, fn: Any, args: tuple) -> None:
        self.fn, self.args = fn, args
        self.done = threading.Event()
        self.value: Any = None
        self.error: BaseException | None = None
        self.capture = _Capture()

    def run(self) -> None:
        _tls.capture = self.capture
        try:
            self.value = self.fn(*self.args)
        except BaseException as exc:  # noqa: BLE001 - SystemExit/KeyboardInterrupt from a plugin are its failure too
            self.error = exc
        finally:
            _tls.capture = None
            _route_end()
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


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's worker threads: start from an empty pool (else its first plugin call
    would wait on an 'idle' worker that does not exist, time out and disable the plugin)."""
    global _workers
    _workers = _Workers()


if hasattr(os, "register_at_fork"):  # POSIX; registering a hook is not work at import (nothing runs until a fork)
    os.register_at_fork(after_in_child=_after_fork_in_child)


def call_with_deadline(fn: Any, args: tuple = (), *, what: str, timeout: float | None = None,
                       owner: Any = None, where: str | None = None, plugin: str | None = None,
                       output: list[str] | None = None) -> Any:
    """``fn(*args)`` on a worker thread; its result, its exception re-raised, or :class:`PluginTimeout`.

    ``what`` names the call in messages (``check()`` → ``check() timed out after 5s``). A ``BaseException`` such
    as ``SystemExit`` raised by the plugin comes back wrapped in a ``RuntimeError`` so it is isolated like any
    other plugin failure.

    ``owner`` is the backend the call is made for: if its plugin timed out before, :class:`PluginDisabled` is
    raised without calling ``fn``; if this call times out, the plugin is disabled (``where`` says where, e.g.
    ``layer 3``). What the call prints to ``sys.stdout`` is appended to ``output`` when given, else reported as a
    notice of ``plugin`` (default: the owner's plugin).
    """
    plugin_name = plugin
    token = None
    if owner is not None:
        owner_plugin, token = _owner(owner)
        plugin_name = plugin_name or owner_plugin
        with _state_lock:
            earlier = _disabled.get(token)
        if earlier is not None:
            raise PluginDisabled(f"disabled after timing out {earlier}")
    limit = plugin_timeout() if timeout is None else timeout
    task = _Task(fn, args)
    _route_start()
    try:
        _workers.submit(task)
    except BaseException:
        _route_end()
        raise
    finished = task.done.wait(limit)
    capture = task.capture
    if capture.total:
        if output is not None:
            output.append(capture.text())
        else:
            _notice_printed(plugin_name or "?", what, capture)
    if not finished:
        if token is not None:
            at = f"in {what}" + (f" on {where}" if where else "")
            with _state_lock:
                _disabled.setdefault(token, at)
            _notice_disabled(f"plugin {plugin_name!r} disabled for the rest of the run after {what} timed out after "
                             f"{limit:g}s" + (f" on {where}" if where else ""), plugin_name or "?")
        raise PluginTimeout(f"{what} timed out after {limit:g}s")
    if task.error is not None:
        if isinstance(task.error, Exception):
            raise task.error
        raise RuntimeError(f"{type(task.error).__name__}: {task.error}") from task.error
    return task.value
