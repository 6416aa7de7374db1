"""The guard inside SGLang (issue 24): an ``sglang.srt.plugins`` entry point.

SGLang runs general plugins in every process (sgl-project/sglang@v0.5.23:python/sglang/srt/plugins/__init__.py:103-141,
called from ``launch_server``, ``Engine.__init__``, each scheduler) and logs-and-skips a plugin that raises, so a
plugin cannot stop a launch by raising in ``register()``. It can from a **server-args resolution hook**:
``register_resolution_hook("handle_moe_kernel_config")`` wraps the named step of process 0's resolution pipeline
(python/sglang/srt/arg_groups/resolution_hooks.py:107-139; run from arg_groups/pipeline.py:294), and an exception
there propagates out of ``ServerArgs.resolve_once`` before any scheduler exists (server_args.py:294-296).

After SGLang's own step (its quantization-driven runner constraints run first), the launch the resolved server args
describe is checked as ``moedispatch exec`` checks a command line (:mod:`moedispatch.guard.process0`): ``refuse``
raises, ``fix`` declares the corrected ``moe_runner_backend`` through SGLang's own ``declare_resolution``
(arg_groups/overrides.py:110) and sets the environment. Because SGLang skips a failing hook with only a log line, the
guard confirms its hook is registered and says so loudly when it is not.

Not here yet: SGLang's per-layer check (an AFTER hook on ``FusedMoE.__init__``), which vLLM's guard has.
"""

from __future__ import annotations

from typing import Any

from moedispatch.core.errors import UsageError
from moedispatch.guard import process0 as p0

__all__ = ["register", "STEP"]

#: The resolution step the guard wraps (one of SGLang 0.5.23's ``_OVERRIDABLE_HOOKS``).
STEP = "handle_moe_kernel_config"
_STATE: dict[str, Any] = {}


def register() -> None:
    """SGLang's entry point: register the resolution hook and confirm it is in SGLang's table."""
    try:
        version = p0.installable("sglang", _STATE)
    except UsageError as exc:
        p0.say(f"{p0.PREFIX}: {exc} — not installed")
        raise
    if version is None:
        return
    from sglang.srt.arg_groups import resolution_hooks as rh

    rh.register_resolution_hook(STEP)(moe_step)
    if moe_step not in rh._HOOKS.get(STEP, ()):
        p0.say(f"{p0.PREFIX}: NOT ACTIVE — SGLang {version} did not register the {STEP} hook; launches are unchecked")


def moe_step(server_args: Any, previous: Any) -> None:
    """SGLang's ``handle_moe_kernel_config``, then the guard's check of the resolved launch."""
    previous(server_args)
    process0(server_args)


def launch_from(server_args: Any) -> list[str]:
    """The command line that resolves to these server args (what ``lint`` reads)."""
    from sglang.srt.arg_groups.overrides import resolved_view

    v = resolved_view(server_args)
    return p0.launch_argv(
        "sglang", str(v.model_path), tp=int(v.tp_size), dp=int(getattr(v, "dp_size", 1) or 1),
        ep=int(getattr(v, "ep_size", 1) or 1), dp_attention=bool(getattr(v, "enable_dp_attention", False)),
        moe_backend=str(getattr(v, "moe_runner_backend", None) or "auto"),
        max_batched_tokens=getattr(v, "chunked_prefill_size", None) or None,
        quantization=getattr(v, "quantization", None) or None)


def process0(server_args: Any) -> None:
    """The process-0 check of resolved server args (see the module docstring)."""

    def apply_fix(verdict: p0.Verdict) -> str:
        if not verdict.moe_backend:
            return ""
        from sglang.srt.arg_groups.overrides import declare_resolution

        declare_resolution(server_args, "moedispatch.guard", moe_runner_backend=verdict.moe_backend)
        return f"--moe-runner-backend {verdict.moe_backend}"

    p0.guard_process0("sglang", _STATE["version"], None, lambda: (launch_from(server_args), None), apply_fix)
