"""The guard inside vLLM (issue 24): a ``vllm.general_plugins`` entry point, loaded by vLLM in every process.

``register()`` is what vLLM calls (``vllm/plugins/__init__.py`` ``load_general_plugins``: process 0 from
``EngineArgs.__post_init__``, each engine core, each worker — vllm-project/vllm@v0.33.0:vllm/plugins/__init__.py:77-90).
It installs two checks and does nothing else; importing this module imports nothing of vLLM.

* **Process 0**: the current platform's ``check_and_update_config`` (called once from ``VllmConfig.__post_init__``,
  vllm-project/vllm@v0.33.0:vllm/config/vllm.py:2067, before any engine core or worker exists) is wrapped: after
  vLLM's own, the launch the config describes is checked as ``moedispatch exec`` checks a command line
  (:mod:`moedispatch.guard.process0`). ``refuse`` raises there (vLLM reports it as a config error; nothing is spawned);
  ``fix`` sets ``kernel_config.moe_backend`` (which every layer's ``FusedMoEConfig`` reads,
  vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/layer.py:371) and the environment the workers inherit.
* **Each MoE layer, in every worker**: ``RoutedExperts`` is a ``PluggableLayer`` that vLLM instantiates through its
  out-of-tree registry (vllm-project/vllm@v0.33.0:vllm/model_executor/custom_op.py:46-99); the guard registers a
  subclass whose ``_get_quant_method`` sees vLLM's oracle pick (before ``create_weights``) and whose ``__init__`` sees
  the allocation (before the checkpoint loads). Both are compared with moedispatch's model of that vLLM release
  (:func:`moedispatch.engines.choice.choice_for_layer`); a difference is the alarm "moedispatch's model of vLLM X is
  stale here", with both values. A worker whose own check (its own environment, e.g. a remote Ray node) refuses
  raises before the first layer's weights; padding is compared, never changed.

Guards on the guard: in ``warn`` mode nothing here raises (vLLM does not catch plugin errors); a vLLM release outside
the modelled range turns the guard off with one line; another plugin owning the ``RoutedExperts`` replacement makes
the layer check step aside and say so (before or after this one registers).
"""

from __future__ import annotations

import hashlib
import os
import time
from typing import Any

from moedispatch.core.errors import UsageError
from moedispatch.guard import process0 as p0
from moedispatch.guard.layers import LayerModel, stale_allocation, stale_pick
from moedispatch.sources.models import load_model, parse_config

__all__ = ["register"]

_PREFIX = p0.PREFIX
_say = p0.say
#: The attribute each vLLM 0.33 MoE quant method stores its oracle's pick under (unquantized_fused_moe_method.py,
#: quantization/fp8.py, quantization/mxfp4.py, quark/quark_moe.py, compressed_tensors_moe*.py).
_PICK_ATTRS = ("unquantized_backend", "fp8_backend", "mxfp4_backend", "mxfp8_backend", "wna16_backend")
_STATE: dict[str, Any] = {}
#: Process 0's findings digest, inherited by its workers: a worker whose own check differs says so.
_P0_ENV = "MOEDISPATCH_GUARD_CHECKED"


def _rank() -> int:
    """This worker's global rank (torch.distributed once vLLM has set it up, else ``RANK``; 0 when neither says)."""
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank())
    except Exception:  # pragma: no cover - a torch without distributed
        pass
    try:
        return int(os.environ.get("RANK", "0"))
    except ValueError:
        return 0


def _info(line: str) -> None:
    """A line that reads the same on every worker (the check's cost, an all-clear): said by rank 0 only, so a TP-8
    launch prints it once, not eight times. Findings (STALE, a worker that differs, a failure) are said everywhere."""
    if _rank() == 0:
        _say(line)


def _once(key: Any, line: str) -> None:
    seen = _STATE.setdefault("said", set())
    if key not in seen:
        seen.add(key)
        _say(line)


def _on_rocm() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_rocm())


def register() -> None:
    """vLLM's entry point. Raises only for a guard setting it cannot honour (``MOEDISPATCH_GUARD=refsue``)."""
    try:
        version = p0.installable("vllm", _STATE, _on_rocm)
    except UsageError as exc:
        raise RuntimeError(f"{_PREFIX}: {exc}") from None
    if version is None:
        return
    try:
        _wrap_platform_check()
        _register_layer_check()
    except Exception as exc:  # never stop vLLM for the guard's own failure in warn mode
        if p0.settings(os.environ).mode != "warn":
            raise
        _say(f"{_PREFIX}: could not install ({type(exc).__name__}: {exc}); vLLM starts unguarded")


# -- process 0 --------------------------------------------------------------------------------------------------------

def _wrap_platform_check() -> None:
    from vllm.platforms import current_platform

    cls = type(current_platform)
    original = cls.check_and_update_config
    if getattr(original, "__moedispatch__", False):
        return

    def check_and_update_config(klass: Any, vllm_config: Any) -> None:
        original(vllm_config)
        process0(vllm_config)

    check_and_update_config.__moedispatch__ = True  # type: ignore[attr-defined]
    cls.check_and_update_config = classmethod(check_and_update_config)  # type: ignore[assignment]
    cls.check_and_update_config.__func__.__moedispatch__ = True  # type: ignore[attr-defined]


def launch_from(vllm_config: Any) -> tuple[list[str], Any]:
    """(the command line that builds this config, the model as vLLM loaded it)."""
    mc, par = vllm_config.model_config, vllm_config.parallel_config
    model = str(mc.model)
    argv = p0.launch_argv(
        "vllm", model, tp=int(par.tensor_parallel_size), dp=int(par.data_parallel_size),
        ep_flag=bool(par.enable_expert_parallel), moe_backend=str(vllm_config.kernel_config.moe_backend),
        max_batched_tokens=getattr(vllm_config.scheduler_config, "max_num_batched_tokens", None),
        data_parallel_backend=getattr(par, "data_parallel_backend", None))
    return argv, _spec(model, mc)


def _spec(model: str, mc: Any) -> Any:
    """A checkpoint folder is read as ``lint`` reads it (config.json and safetensors headers); otherwise the config
    vLLM itself built (``hf_config``, with any ``--hf-overrides``)."""
    if os.path.isdir(model):
        return load_model(model)
    return parse_config(mc.hf_config.to_dict(), name=model, source="hf-cache", where="vLLM's model config")


def process0(vllm_config: Any) -> None:
    """The process-0 check of one ``VllmConfig`` (see the module docstring)."""
    if getattr(vllm_config, "model_config", None) is None:
        return  # a bare VllmConfig() (vLLM's own tests and helpers): no launch to judge

    def apply_fix(verdict: p0.Verdict) -> str:
        if verdict.env:
            from vllm._aiter_ops import rocm_aiter_ops

            rocm_aiter_ops.refresh_env_variables()  # vLLM's own helper to re-read the AITER switches
        if verdict.moe_backend:
            vllm_config.kernel_config.moe_backend = verdict.moe_backend
            return f"--moe-backend {verdict.moe_backend}"
        return ""

    verdict = p0.guard_process0("vllm", _STATE["version"], getattr(vllm_config, "additional_config", None),
                                lambda: launch_from(vllm_config), apply_fix)
    if verdict is not None:
        os.environ[_P0_ENV] = digest(verdict)


def digest(verdict: p0.Verdict) -> str:
    """A short hash of a verdict's findings (what process 0 hands its workers to compare with their own)."""
    found = sorted((f["severity"], f["message"]) for f in (verdict.doc or {}).get("findings", ()))
    return hashlib.sha256(repr((verdict.action, found)).encode()).hexdigest()[:16]


# -- each MoE layer ---------------------------------------------------------------------------------------------------

def _register_layer_check() -> None:
    from vllm.model_executor.custom_op import PluggableLayer, op_registry_oot
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    owner = op_registry_oot.get("RoutedExperts")
    if owner is not None:
        _say(f"{_PREFIX}: {owner.__module__}.{owner.__qualname__} already replaces vLLM's RoutedExperts; the per-layer "
             "check steps aside (the process-0 check still runs)")
        return
    guarded = _guarded_class(RoutedExperts)
    RoutedExperts.register_oot(guarded)
    _STATE["layer_class"] = guarded
    base_register = PluggableLayer.register_oot.__func__  # type: ignore[attr-defined]

    def register_oot(cls: Any, _decorated_layer_cls: Any = None, name: str | None = None) -> Any:
        # Another plugin registering its own RoutedExperts after this one: give the slot up instead of letting
        # vLLM's duplicate-name assert stop the launch.
        reg = name if name is not None else cls.__name__
        if op_registry_oot.get(reg) is guarded:
            del op_registry_oot[reg]
            _say(f"{_PREFIX}: another plugin replaces vLLM's {reg}; the per-layer check steps aside (the process-0 "
                 "check still runs)")
        return base_register(cls, _decorated_layer_cls, name)

    RoutedExperts.register_oot = classmethod(register_oot)  # type: ignore[method-assign,assignment]
    _wrap_model_creation()


def _wrap_model_creation() -> None:
    """After vLLM built the model (``BaseModelLoader.create_model``, before its weights load,
    vllm-project/vllm@v0.33.0:vllm/model_executor/model_loader/base_loader.py:49-76), say once what the per-layer
    check saw — or that it saw nothing: a model whose MoE is another layer class is "not observed"."""
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    original = BaseModelLoader.create_model
    if getattr(original, "__moedispatch__", False):
        return

    def create_model(self: Any, *args: Any, **kwargs: Any) -> Any:
        model = original(self, *args, **kwargs)
        after_model(kwargs.get("vllm_config", args[0] if args else None))
        return model

    create_model.__moedispatch__ = True  # type: ignore[attr-defined]
    BaseModelLoader.create_model = create_model  # type: ignore[method-assign]


def after_model(vllm_config: Any) -> None:
    """The per-layer check's summary for this process (once per model built), never an exception."""
    try:
        state = _worker(vllm_config)
        if state is None or not state["model"].layers:
            return
        n = len(state["model"].layers)
        if state["observed"] == 0:
            _say(f"{_PREFIX}: not observed — none of this model's {n} MoE layer(s) was built through vLLM's "
                 "RoutedExperts (its MoE is another layer class): the per-layer check did not run, only process 0's")
        else:
            stale = sum(1 for key in _STATE.get("said", ()) if key[0] in ("stale", "alloc"))
            (_say if stale else _info)(
                f"{_PREFIX}: per-layer check compared {state['observed']} of {n} MoE layer(s): "
                + (f"{stale} STALE finding(s) above" if stale else "all as moedispatch predicted")
                + f"; {state['cost']:.2f} s in all" + (f" (rank {_rank()})" if stale and _rank() else ""))
    except Exception as exc:  # the summary is informative: its failure is said, never raised into vLLM
        _say(f"{_PREFIX}: per-layer summary failed ({type(exc).__name__}: {exc})")


def _guarded_class(base: Any) -> Any:
    class MoedispatchGuardedRoutedExperts(base):  # type: ignore[misc,valid-type]
        """vLLM's RoutedExperts, with moedispatch's check of the oracle's pick and the allocation."""

        def _get_quant_method(self, layer_name: Any, quant_config: Any, moe_config: Any) -> Any:
            before_oracle(layer_name, moe_config)
            method = super()._get_quant_method(layer_name, quant_config, moe_config)
            after_oracle(layer_name, method, moe_config)
            return method

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            after_allocation(self)

    return MoedispatchGuardedRoutedExperts


def _worker(vc: Any = None) -> dict[str, Any] | None:
    """This process's plan of the model (once): settings, the verdict on its own environment, the layers as
    moedispatch models them, the target. None when there is no config to read. ``vc``: the config (default: the one
    vLLM set current while it builds the model)."""
    if "worker" in _STATE:
        return _STATE["worker"]
    from vllm.config import get_current_vllm_config

    start = time.perf_counter()
    state: dict[str, Any] | None = None
    try:
        vc = vc if vc is not None else get_current_vllm_config()
        cfg = p0.settings(os.environ, getattr(vc, "additional_config", None))
        if cfg.mode != "off" and getattr(vc, "model_config", None) is not None:
            argv, spec = launch_from(vc)
            env = p0.environ()
            verdict = p0.check("vllm", _STATE["version"], argv, env, cfg, spec=spec, prefix=_PREFIX)
            model = LayerModel("vllm", _STATE["version"], argv, spec, env, cfg.target)
            inherited = env.get(_P0_ENV)
            if inherited != digest(verdict):
                _say(f"{_PREFIX}: this worker's own check "
                     + ("differs from process 0's (its environment or target differs):" if inherited else
                        "(process 0's check did not reach this process, e.g. a Ray actor without its environment):"))
                for line in verdict.report:
                    _say("  " + line)
            state = {"cfg": cfg, "verdict": verdict, "model": model, "observed": 0, "cost": 0.0}
    except UsageError as exc:
        raise ValueError(f"{_PREFIX}: {exc}") from None
    except Exception as exc:  # the guard's own failure never stops a worker (a refusal is raised above)
        _say(f"{_PREFIX}: cannot check this worker's MoE layers ({type(exc).__name__}: {exc}); they run unchecked")
    _STATE["worker"] = state
    if state is not None:
        state["cost"] = time.perf_counter() - start
        _info(f"{_PREFIX}: layer check ready in {state['cost']:.2f} s ({len(state['model'].layers)} MoE layer(s) "
              f"planned, {state['cfg'].mode} mode; rank 0's — other workers print only findings)")
    return state


def before_oracle(layer_name: str, moe_config: Any) -> None:
    """Before vLLM's oracle: this worker's own verdict (its environment may not be process 0's) refuses here, before
    any weight exists, or sets this layer's backend in fix mode."""
    state = _worker()
    if state is None:
        return
    verdict = state["verdict"]
    if verdict.action == "refuse" and state["cfg"].mode != "warn":
        raise ValueError(p0.refusal_message("vllm", verdict, state["cfg"]) + f" (worker check, layer {layer_name})")
    if verdict.action == "fix" and verdict.moe_backend and moe_config.moe_backend != verdict.moe_backend:
        moe_config.moe_backend = verdict.moe_backend
        _once(("fix", verdict.moe_backend), f"{_PREFIX} (fix): this worker's MoE layers use --moe-backend "
                                            f"{verdict.moe_backend}")


def observed_pick(method: Any) -> str | None:
    """vLLM's oracle pick stored on a MoE quant method (its backend enum member's name), or None."""
    for attr in _PICK_ATTRS:
        value = getattr(method, attr, None)
        if value is not None:
            return str(getattr(value, "name", value))
    return None


def after_oracle(layer_name: str, method: Any, moe_config: Any) -> None:
    """vLLM picked: compare with moedispatch's prediction of that pick (the stale-model alarm)."""
    state = _worker()
    if state is None:
        return
    start = time.perf_counter()
    picked, layer = observed_pick(method), state["model"].layer(layer_name)
    state["observed"] += 1
    if layer is None or picked is None:
        _once(("unmodelled", layer is None), f"{_PREFIX}: layer {layer_name} "
              + ("is not a MoE layer of moedispatch's plan" if layer is None else
                 f"({type(method).__name__}) stores no backend pick moedispatch knows") + "; not compared")
    else:
        line = stale_pick("vllm", layer_name, layer, picked, state["model"].predict(layer, str(moe_config.moe_backend)))
        if line:
            _once(("stale", picked), line)
    state["cost"] += time.perf_counter() - start


def after_allocation(experts: Any) -> None:
    """vLLM allocated: compare its padded sizes with the prediction (compared, never changed)."""
    state = _worker()
    if state is None:
        return
    model = state["model"]
    layer = model.layer(experts.layer_name)
    if layer is None:
        return
    got = (int(experts.hidden_size), int(experts.intermediate_size_per_partition))
    line = stale_allocation("vllm", experts.layer_name, got, model.predict(layer, str(experts.moe_config.moe_backend)))
    if line:
        _once(("alloc", got), line)
