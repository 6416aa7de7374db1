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

Per layer, in every scheduler: an AFTER hook on ``FusedMoE.__init__`` (SGLang's ``HookRegistry``,
python/sglang/srt/plugins/hook_registry.py:69-166) sees the runner SGLang resolved for the layer
(``self.runner_backend``, set at fused_moe_triton/layer.py:577 after ``create_weights``, before the checkpoint loads)
and compares it with moedispatch's prediction (:mod:`moedispatch.guard.layers`): a difference is the stale-model alarm.
It never raises (SGLang would only log it and skip).
"""

from __future__ import annotations

from typing import Any

import os
import time

from moedispatch.core.errors import UsageError
from moedispatch.guard import process0 as p0
from moedispatch.guard.layers import LayerModel, stale_pick
from moedispatch.sources.models import load_model

__all__ = ["register", "STEP"]

#: The resolution step the guard wraps (one of SGLang 0.5.23's ``_OVERRIDABLE_HOOKS``).
STEP = "handle_moe_kernel_config"
#: The layer whose construction the per-layer check follows.
LAYER = "sglang.srt.layers.moe.fused_moe_triton.layer.FusedMoE.__init__"
_STATE: dict[str, Any] = {}


def _on_rocm() -> bool:
    from sglang.srt.utils import is_hip

    return bool(is_hip())


def register() -> None:
    """SGLang's entry point: register the resolution hook and confirm it is in SGLang's table."""
    from sglang.srt.arg_groups import resolution_hooks as rh

    try:
        version = p0.installable("sglang", _STATE, _on_rocm)
    except UsageError as exc:
        # SGLang only logs a plugin that raises here, and would then start unguarded: the launch is stopped where
        # SGLang does propagate an error instead — its server-args resolution (as refuse does).
        p0.say(f"{p0.PREFIX}: {exc} — the launch is stopped at server-args resolution")
        rh.register_resolution_hook(STEP)(_refusing(f"{p0.PREFIX}: {exc}"))
        return
    if version is None:
        return

    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    rh.register_resolution_hook(STEP)(moe_step)
    if moe_step not in rh._HOOKS.get(STEP, ()):
        p0.say(f"{p0.PREFIX}: NOT ACTIVE — SGLang {version} did not register the {STEP} hook; launches are unchecked")
    HookRegistry.register(LAYER, after_layer, HookType.AFTER)


def _refusing(message: str) -> Any:
    """A ``handle_moe_kernel_config`` step that runs SGLang's own and then stops the launch with ``message``."""
    def refuse(server_args: Any, previous: Any) -> None:
        previous(server_args)
        raise ValueError(message)
    return refuse


def _layer_hook_applied() -> bool:
    from sglang.srt.plugins.hook_registry import HookRegistry

    return LAYER in HookRegistry._patched


def moe_step(server_args: Any, previous: Any) -> None:
    """SGLang's ``handle_moe_kernel_config``, then the guard's check of the resolved launch."""
    previous(server_args)
    process0(server_args)


def launch_from(server_args: Any) -> list[str]:
    """The command line that resolves to these server args (what ``lint`` reads)."""
    from sglang.srt.arg_groups.overrides import resolved_view

    v = resolved_view(server_args)
    dp_attention = bool(getattr(v, "enable_dp_attention", False))
    return p0.launch_argv(
        "sglang", str(v.model_path), tp=int(v.tp_size), dp=int(getattr(v, "dp_size", 1) or 1),
        ep=int(getattr(v, "ep_size", 1) or 1), dp_attention=dp_attention,
        # 0.5.22+ resolves `--dp-size N --enable-dp-attention` to attn_dp_size = N, dp_size = 1 and the flag off
        # (arg_groups/parallel_hook.py _handle_deprecated_dp_attention): the resolved width is attn_dp_size. Before
        # 0.5.22 the flag stays on and attn_dp_size is derived from it, with no flag of its own
        # (sglang@v0.5.21 arg_groups/fields/parallel.py:285-286): the old spelling alone says it.
        attn_dp=1 if dp_attention else int(getattr(v, "attn_dp_size", 1) or 1),
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

    verdict = p0.guard_process0("sglang", _STATE["version"], None, lambda: (launch_from(server_args), None),
                                apply_fix)
    if verdict is not None and not _layer_hook_applied():  # SGLang logs and skips a hook it cannot apply
        p0.say(f"{p0.PREFIX}: per-layer check NOT ACTIVE — SGLang did not apply the hook on {LAYER}")


def _scheduler() -> dict | None:
    """This scheduler's model of the launch (once), from the server args SGLang published in this process."""
    if "scheduler" in _STATE:
        return _STATE["scheduler"]
    from sglang.srt.runtime_context import get_context

    start = time.perf_counter()
    state = None
    try:
        cfg = p0.settings(os.environ)
        if cfg.mode != "off":
            sa = get_context().server_args
            argv = launch_from(sa)
            model = LayerModel("sglang", _STATE["version"], argv, load_model(str(sa.model_path)), p0.environ(),
                               cfg.target)
            runner = argv[argv.index("--moe-runner-backend") + 1]
            state = {"model": model, "runner": runner}
            p0.say(f"{p0.PREFIX}: layer check ready in {time.perf_counter() - start:.2f} s ({len(model.layers)} MoE "
                   f"layer(s) planned, {cfg.mode} mode)")
    except Exception as exc:  # the hook must never stop SGLang (it would log and skip it anyway)
        p0.say(f"{p0.PREFIX}: cannot check this scheduler's MoE layers ({type(exc).__name__}: {exc}); they run "
               "unchecked")
    _STATE["scheduler"] = state
    return state


def after_layer(result: object, layer: object, *args: object, **kwargs: object) -> None:
    """SGLang built one FusedMoE: compare its resolved runner with moedispatch's prediction."""
    state = _scheduler()
    if state is None:
        return
    try:
        modelled = state["model"].layers.get(int(getattr(layer, "layer_id", -1)))
        backend = getattr(layer, "runner_backend", None)
        if modelled is None or backend is None:
            return
        picked = str(getattr(backend, "name", backend)).upper()
        line = stale_pick("sglang", str(getattr(layer, "layer_name", "")), modelled, picked,
                          state["model"].predict(modelled, state["runner"]))
        said = _STATE.setdefault("said", set())
        if line and picked not in said:
            said.add(picked)
            p0.say(line)
    except Exception as exc:  # the guard's own failure never stops SGLang's layer construction: it says so
        p0.say(f"{p0.PREFIX}: per-layer check failed ({type(exc).__name__}: {exc}); the layer is unchecked")
