"""What an engine release does on its own for one MoE layer: :func:`engine_choice` → :class:`EngineChoice`.

The engine's decision is modelled from data (``capability_db/engines/<engine>.toml``: the oracles' priority lists,
the ``--moe-backend`` maps, what each expert class accepts, what the engine allocates) plus the small rules below —
never by importing the engine. ``tests/peers/`` checks the vLLM model against the real vLLM 0.33.0 oracles.

:func:`compare_plan` puts the engine's own choice next to moedispatch's per layer group: ``same``, ``slower``
(the engine's pick is correct for the layer but moedispatch prefers another), ``wrong`` (moedispatch rejects the
engine's pick for this layer: the reasons and sources say why) or ``refused`` (the engine raises).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping, NoReturn

from packaging.version import InvalidVersion

from moedispatch.data import capdb
from moedispatch.core.errors import UsageError
from moedispatch.core.reason import Reason, texts
from moedispatch.aiter import dispatch as aiter_dispatch
from moedispatch.core.backend import Padding
from moedispatch.core.families import FUSED_MOE_BACKENDS, FUSED_MOE_FAMILIES, family_of
from moedispatch.core.capabilities import parse_version
from moedispatch.core.fields import layer_from_fields
from moedispatch.plan.plan import layer_span
from moedispatch.probe.targets import cli_aiter_version, resolve_capabilities
from moedispatch.core.workload import SERVING_BUCKETS

if TYPE_CHECKING:  # pragma: no cover
    from moedispatch.core.capabilities import Capabilities
    from moedispatch.core.layers import MoELayer
    from moedispatch.plan.plan import Plan

__all__ = ["EngineChoice", "engine_choice", "choice_for_layer", "compare_plan", "compare_decision", "ENGINES",
           "parse_engine_spec", "render_comparison", "findings", "recipe_engine_groups"]

#: Engine → {release: capability_db file}. The newest release is the default.
ENGINES = {"vllm": {"0.33.0": "engines/vllm.toml"}, "sglang": {"0.5.23": "engines/sglang.toml"}}


@dataclass(frozen=True)
class EngineChoice:
    """One engine release's own choice for one layer.

    ``backend`` is the engine's own name (vLLM's backend enum member, e.g. ``AITER_MXFP4_MXFP4``, ``TRITON``,
    ``EMULATION``; SGLang's MoE runner); ``family`` the moedispatch backend it corresponds to (``None`` when there is
    none); ``hidden`` / ``intermediate_per_rank`` the padded sizes the engine allocates; ``error`` the engine's
    refusal (at selection or at weight creation) and ``stage`` where it happens. ``kernel_class`` is the expert class
    that accepted the layer; ``rejected`` the (backend, reason) pairs the engine tried before it.
    """

    engine: str
    version: str
    moe_backend: str
    backend: str | None
    family: str | None
    hidden: int | None
    intermediate_per_rank: int | None
    error: str | None = None
    stage: str | None = None
    kernel_class: str | None = None
    rejected: tuple[tuple[str, str], ...] = ()
    reasons: tuple[Reason, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        return {"engine": self.engine, "engine_version": self.version, "moe_backend": self.moe_backend,
                "backend": self.backend, "family": self.family, "kernel_class": self.kernel_class,
                "hidden": self.hidden, "intermediate_per_rank": self.intermediate_per_rank,
                "error": self.error, "stage": self.stage,
                "rejected": [{"backend": b, "reason": r} for b, r in self.rejected],
                "reasons": texts(self.reasons), "reason_details": [r.to_dict() for r in self.reasons]}


def parse_engine_spec(spec: str) -> tuple[str, str | None]:
    """``vllm`` / ``vllm@0.33.0`` → (engine, version or None); a one-line UsageError otherwise."""
    name, _, version = spec.partition("@")
    name = name.strip().lower()
    if name not in ENGINES:
        raise UsageError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    return name, (version.strip() or None)


def _data(engine: str, version: str | None) -> tuple[str, dict[str, Any]]:
    if engine not in ENGINES:
        raise UsageError(f"unknown engine {engine!r}; known: {', '.join(ENGINES)}")
    releases = ENGINES[engine]
    if version is None:
        version = max(releases, key=lambda v: tuple(int(x) for x in v.split(".")))
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        wanted = Version(version)
    except InvalidVersion:
        raise UsageError(f"{engine} version {version!r} is not a PEP 440 version") from None
    for release, path in releases.items():
        doc = capdb.load_toml(path)
        if wanted in SpecifierSet(doc["versions"]):
            return version, doc
    recipes = capdb.load_toml("engines.toml").get(engine, {}).get("releases", [])
    covered = bool(recipes) and wanted >= Version(recipes[0])   # newer than the newest: assumed, with a warning
    raise UsageError(f"no model of {engine} {version}: capability_db/engines knows "
                     + ", ".join(f"{engine} {r}" for r in releases)
                     + ((f" (a recipe for it: --recipe {engine} --engine-version {version}; recipes cover {engine} "
                         f"{recipes[0]} … {recipes[-1]})") if covered else
                        f" (recipes cover {engine} {recipes[0]} … {recipes[-1]})" if recipes else ""))


# -- layer → what the engine sees --------------------------------------------------------------------------------

def _scheme(layer: "MoELayer") -> str:
    w, a = layer.weight, layer.act
    if not w.quantized:
        return "bf16"
    if w.dtype == "fp8":
        if w.block:
            return "fp8_block"
        if w.granularity == "channel":
            return "fp8_channel"
        return "fp8_tensor"
    if w.dtype == "mxfp4":
        if a.dtype == "mxfp4":
            return "mxfp4_a4"
        if a.dtype == "fp8":
            return "mxfp4_afp8"
        return "mxfp4_a16"
    if w.dtype == "mxfp8":
        return "mxfp8"
    raise UsageError(f"engine_choice: no engine model for {w.dtype} weights with {a.dtype} activations")


def _env_flag(env: Mapping[str, str], name: str, default: bool) -> bool:
    return env.get(name, "True" if default else "False").strip().lower() in ("true", "1")


def _act_param(layer: "MoELayer", name: str, default: float | None) -> float | None:
    return layer.param(name, default)


# -- vLLM ----------------------------------------------------------------------------------------------------------

class _Refusal(Exception):
    def __init__(self, message: str, stage: str, backend: str | None = None, source: str | None = None):
        super().__init__(message)
        self.stage, self.backend, self.source = stage, backend, source


def _vllm_gates(caps: "Capabilities", env: Mapping[str, str]) -> dict[str, bool]:
    gfx = caps.gfx or ""
    aiter_found = caps.aiter_version is not None
    cdna3 = gfx in ("gfx942", "gfx950")
    master = _env_flag(env, "VLLM_ROCM_USE_AITER", False)
    moe = _env_flag(env, "VLLM_ROCM_USE_AITER_MOE", True)
    gate_mode = True
    if caps.aiter_version is not None:
        try:
            gate_mode = parse_version(caps.aiter_version) >= parse_version("0.1.14")
        except InvalidVersion:  # an unparsable local version: assume the signature is there
            gate_mode = True
    return {
        "aiter": master and aiter_found and cdna3,
        "aiter_moe": master and moe and aiter_found and cdna3,
        "gate_mode": gate_mode,
        "mx": gfx in ("gfx950", "gfx1250"),
        "gfx950": gfx == "gfx950",
        "gfx942_or_gfx950": gfx in ("gfx942", "gfx950", "gfx1250"),
        "gfx1250": gfx == "gfx1250",
        "gfx9": gfx.startswith("gfx9"),
        "triton_kernels": True,  # vLLM's ROCm image ships triton_kernels (docker/Dockerfile.rocm)
        "quark": True,           # requirements/rocm.txt pins amd-quark
        "batched": False,        # no batched activation format without DP/EP all-to-all
    }


def _class_check(cls: Mapping[str, Any], layer: "MoELayer", scheme: str, gates: Mapping[str, bool]) -> str | None:
    """None when the expert class accepts the layer, else vLLM's reason ('kernel does not support …')."""
    for need in cls.get("needs", ()):
        if not gates.get(need, False):
            return f"kernel does not support current device ({need})"
    if layer.activation not in cls["activations"]:
        return f"kernel does not support MoEActivation.{layer.activation.upper()} activation"
    if "any" not in cls["schemes"] and scheme not in cls["schemes"]:
        return f"kernel does not support quantization scheme {scheme}"
    if "max_padded_experts" in cls and (layer.experts + 31) // 32 * 32 > cls["max_padded_experts"]:
        return "kernel's moe_align_block_size requires fewer than 1024 padded experts"
    if "swiglu_alpha" in cls and layer.activation == "swigluoai_uninterleave":
        alpha, beta = _act_param(layer, "alpha", 1.702), _act_param(layer, "beta", 1.0)
        if alpha is None or beta is None or not math.isclose(alpha, cls["swiglu_alpha"]) \
                or not math.isclose(beta, cls["swiglu_beta"]):
            return (f"kernel hardcodes SwiGLU-OAI with alpha={cls['swiglu_alpha']} and beta={cls['swiglu_beta']}; "
                    f"got swiglu_alpha={alpha} and swiglu_beta={beta}")
    return None


def _backends(doc: dict[str, Any], oracle: str) -> dict[str, Any]:
    """The backend table an oracle walks (the DeepSeek-V4 MXFP4 oracle shares the MXFP4 one)."""
    return doc["backend"].get(doc["oracle"][oracle].get("backends", oracle), {})


_ACT_KEY_SCHEME = {"a16": "mxfp4_a16", "a4": "mxfp4_a4", "afp8": "mxfp4_afp8"}


def _try(doc: dict[str, Any], oracle: str, backend: str, layer: "MoELayer", scheme: str,
         gates: Mapping[str, bool]) -> tuple[str | None, str | None]:
    """(accepting class, None) or (None, reason)."""
    spec = _backends(doc, oracle).get(backend)
    if spec is None:
        return None, "kernel does not support current device (not a ROCm backend)"
    if oracle.startswith("mxfp4"):
        key = spec.get("act_key", "a16")
        if key != "requested":
            scheme = _ACT_KEY_SCHEME[key]
    reason = None
    for cls in spec["classes"]:
        reason = _class_check(cls, layer, scheme, gates)
        if reason is None:
            return cls["name"], None
    return None, reason


def _vllm_wna16(doc: dict[str, Any], version: str, layer: "MoELayer", caps: "Capabilities", moe_backend: str,
                quant_method: str | None) -> EngineChoice:
    """Weight-only INT experts (bf16 activations): compressed-tensors' own FlyDSL W4A16 gate, else the WNA16 oracle
    (``[oracle.wna16]`` in the engine model)."""
    o = doc["oracle"]["wna16"]
    src = o["source"]
    mb = moe_backend.strip().lower().replace("-", "_")
    fly = o["flydsl"]
    w = layer.weight
    group = int(w.granularity[5:]) if w.granularity.startswith("group") else None
    qm = (quant_method or "").lower()
    if (mb == fly["value"] and qm == fly["quant_method"] and (caps.gfx or "") in fly["gfx"]
            and group == fly["group"] and w.dtype == f"int{fly['bits']}"):
        return EngineChoice("vllm", version, mb, fly["backend"], fly["family"], layer.hidden,
                            layer.intermediate_per_rank, None, None, fly["kernel_class"], (), (Reason(
                                f"vLLM {version} runs {fly['kernel_class']} (compressed-tensors INT4 group-32 on "
                                f"gfx950 with --moe-backend flydsl): AITER's FlyDSL a16wi4 kernels called directly",
                                "decision", fly["source"]),))
    if mb in o["as_auto"]:
        name = o["auto"][0]
        why = (f"vLLM {version} picks {name} ({o['classes'][name]}; the first backend of the ROCm auto list whose "
               "kernels run there)")
        return EngineChoice("vllm", version, mb, name, o["families"].get(name), layer.hidden,
                            layer.intermediate_per_rank, None, None, o["classes"][name], (),
                            (Reason(why, "decision", src, None, o.get("auto_confidence", "confirmed")),))
    if mb not in o["map"]:
        msg = (f"moe_backend='{mb}' is not supported for WNA16 MoE. Expected one of {list(o['map'])}."
               + (" (FlyDSL W4A16 needs --moe-backend flydsl, compressed-tensors INT4 group 32, gfx950)"
                  if mb != fly["value"] else " (FlyDSL W4A16 needs compressed-tensors INT4 group 32 on gfx950)"))
        return EngineChoice("vllm", version, mb, None, None, None, None, msg, "select", None, (), (Reason(
            f"vLLM {version} refuses the layer: {msg}", "failed", src),))
    name = o["map"][mb]
    return EngineChoice("vllm", version, mb, name, o["families"].get(name), layer.hidden, layer.intermediate_per_rank,
                        None, None,
                        o["classes"][name], (), (Reason(f"vLLM {version} picks {name} (forced by --moe-backend {mb})",
                                                        "decision", src),))


#: vLLM's quantization scheme → the oracle that picks its experts' backend (vllm/model_executor/layers/fused_moe/oracle/).
_VLLM_ORACLE = {"bf16": "unquantized", "fp8_tensor": "fp8", "fp8_channel": "fp8", "fp8_block": "fp8",
                "mxfp4_a16": "mxfp4", "mxfp4_a4": "mxfp4", "mxfp4_afp8": "mxfp4", "mxfp8": "mxfp8"}


@dataclass
class _VllmCall:
    """One walk of a vLLM oracle for one layer: what it reads, and the rejections and reasons it collects."""

    doc: dict[str, Any]
    version: str
    layer: "MoELayer"
    caps: "Capabilities"
    gates: Mapping[str, bool]
    scheme: str
    oracle: str
    mb: str
    intermediate: int  # per rank, after vLLM pads an FP8-block shard for a forced backend
    check_scheme: str
    refined: list[int] | None = None
    rejected: list[tuple[str, str]] = field(default_factory=list)
    reasons: list[Reason] = field(default_factory=list)

    @property
    def o(self) -> dict[str, Any]:
        return self.doc["oracle"][self.oracle]

    @property
    def src(self) -> str:
        return self.o["source"]

    @property
    def forced(self) -> bool:
        return self.mb not in self.o.get("as_auto", ["auto"])

    @property
    def requested_key(self) -> str | None:
        return {"mxfp4_a16": "a16", "mxfp4_a4": "a4", "mxfp4_afp8": "afp8"}.get(self.scheme)

    def refuse(self, msg: str, stage: str = "select", backend: str | None = None, source: str | None = None) -> NoReturn:
        raise _Refusal(msg, stage, backend, source or self.src)

    def backend_key(self, name: str) -> str:
        k = _backends(self.doc, self.oracle).get(name, {}).get("act_key", "a16")
        return "a16" if k == "requested" else k

    def scheme_for(self, name: str) -> str:
        if self.oracle.startswith("mxfp4"):
            spec = _backends(self.doc, self.oracle).get(name, {})
            return self.scheme if spec.get("act_key") == "requested" else self.check_scheme
        return self.check_scheme

    def try_backend(self, name: str) -> tuple[str | None, str | None]:
        return _try(self.doc, self.oracle, name, self.layer, self.scheme_for(name), self.gates)

    def label(self) -> str:
        return self.oracle.replace("_dsv4", "")


def _vllm_oracle(layer: "MoELayer", scheme: str, quant_method: str | None) -> str:
    """The oracle vLLM asks (DeepSeek-V4's MXFP4 checkpoints, quant_method "mxfp4" with bf16 activations, have their
    own)."""
    oracle = _VLLM_ORACLE[scheme]
    qm = (quant_method or ("fp8" if oracle == "fp8" else "quark")).lower()
    if oracle == "mxfp4" and scheme == "mxfp4_a16" and qm == "mxfp4" and layer.model_type != "gpt_oss":
        return "mxfp4_dsv4"
    return oracle


def _vllm_fp8_block(c: _VllmCall) -> None:
    """FP8 128x128 blocks whose TP shard is not a multiple of 128: refine or pad (oracle/fp8.py)."""
    layer, o, mb = c.layer, c.o, c.mb
    h, i, tp = layer.hidden, c.intermediate, layer.moe_tp
    bn, bk = layer.weight.block or (128, 128)
    needs_fix = not (i % bn == 0 and (tp == 1 or i % bk == 0))
    g = math.gcd(bn, bk, i, h) if needs_fix else 0
    c.refined = [g, g] if needs_fix and g >= 32 else None
    c.check_scheme = "fp8_block128" if (bn, bk) == (128, 128) else "fp8_block_refined"
    if c.forced and mb in o["map"]:
        names = o["map"][mb]
        names = names if isinstance(names, list) else [names]
        can_refine = c.refined is not None and any(
            any("fp8_block_refined" in cl["schemes"] for cl in c.doc["backend"]["fp8"].get(n, {}).get("classes", []))
            for n in names)
        if not can_refine and bn == bk and tp > 1 and i % bn:
            if layer.intermediate % bn or h % bn or layer.ep != 1 or layer.has_bias:
                c.refuse(f"Block-aligned FP8 TP sharding requires {bn}-aligned global expert dimensions, "
                         "pure TP, and no LoRA or expert bias.")
            c.intermediate = -(-i // bn) * bn
            c.refined = None
            c.reasons.append(Reason(f"vLLM pads the TP shard to whole {bn}-blocks for the forced backend "
                                    f"({layer.intermediate_per_rank} → {c.intermediate})", "padding", c.src))
    if c.refined is not None:
        c.check_scheme = "fp8_block_refined"
        c.reasons.append(Reason(f"vLLM refines the {bn}x{bk} FP8 scale blocks to {c.refined[0]}x{c.refined[1]} to "
                                f"fit intermediate/rank {c.intermediate}; only Triton takes refined blocks", "note",
                                c.src))


def _mxfp4_by_activation(c: _VllmCall, names: list[str], *, forced: bool) -> list[str]:
    """vLLM's MXFP4 oracle keeps the backends whose activation matches the requested one (_filter_by_activation):
    the bf16-activation ones for a16, else the matching ones (and emulation) before the bf16 ones — forced lists keep
    themselves when nothing bf16 is there."""
    bf16 = [n for n in names if c.backend_key(n) == "a16"]
    if c.requested_key == "a16":  # the MXFP4 oracle sees only mxfp4_a16 / _a4 / _afp8 schemes
        return (bf16 or names) if forced else bf16
    matching = [n for n in names if c.backend_key(n) == c.requested_key or n == "EMULATION"]
    return matching + [n for n in bf16 if n not in matching]


def _vllm_pick_forced(c: _VllmCall) -> tuple[str, str]:
    """--moe-backend VALUE: the first backend of its map entry that accepts the layer, else vLLM's refusal."""
    o, mb = c.o, c.mb
    if mb not in o["map"]:
        c.refuse(f"moe_backend='{mb}' is not supported for {c.label()} MoE. Expected one of {list(o['map'])}.")
    names = o["map"][mb]
    names = list(names) if isinstance(names, list) else [names]
    if c.oracle == "mxfp4":  # _get_requested_backends → _filter_by_activation
        names = _mxfp4_by_activation(c, names, forced=True)
    last = None
    for name in names:
        cls, why = c.try_backend(name)
        if cls:
            return name, cls
        c.rejected.append((name, why))
        last = (name, why)
    name, why = last
    c.refuse(f"{c.label().upper()} MoE backend {name} does not support the deployment configuration since {why}.",
             backend=name)


def _vllm_aiter_env(c: _VllmCall, env: Mapping[str, str], order: list[str]) -> tuple[list[str], tuple[str, str] | None]:
    """VLLM_ROCM_USE_AITER(_MOE) set in the environment: the FP8 oracle tries AITER first (and raises when it cannot
    take the layer), the others drop AITER when the switches turn it off or warn and fall back."""
    mode = c.o.get("env_forces_aiter")
    if not mode or not ("VLLM_ROCM_USE_AITER" in env or "VLLM_ROCM_USE_AITER_MOE" in env):
        return order, None
    if not (_env_flag(env, "VLLM_ROCM_USE_AITER", False) and _env_flag(env, "VLLM_ROCM_USE_AITER_MOE", True)):
        return [n for n in order if n != "AITER"], None
    cls, why = c.try_backend("AITER")
    if cls:
        c.reasons.append(Reason("VLLM_ROCM_USE_AITER is set: vLLM tries AITER first", "note", c.src))
        return order, ("AITER", cls)
    c.rejected.append(("AITER", why))
    if mode == "raise":
        c.refuse(f"FP8 MoE backend AITER does not support the deployment configuration since {why}.", backend="AITER")
    c.reasons.append(Reason(f"VLLM_ROCM_USE_AITER_MOE=1 was requested, but AITER does not support the layer ({why}); "
                            "vLLM warns and falls back", "warning", c.src))
    return [n for n in order if n != "AITER"], None


def _vllm_pick_auto(c: _VllmCall, env: Mapping[str, str]) -> tuple[str, str]:
    """No --moe-backend: the oracle's priority list (filtered by activation for MXFP4, steered by the AITER env)."""
    order = list(c.o["auto"])
    if c.oracle == "mxfp4":
        order = _mxfp4_by_activation(c, order, forced=False)
    order, chosen = _vllm_aiter_env(c, env, order)
    if chosen is not None:
        return chosen
    for name in order:
        cls, why = c.try_backend(name)
        if cls:
            return name, cls
        c.rejected.append((name, why))
    c.refuse(f"No {c.label().upper()} MoE backend supports the deployment configuration.")


def _vllm_allocation(c: _VllmCall, name: str) -> tuple[int, int]:
    """(hidden, intermediate/rank) vLLM allocates for the picked backend, or its create_weights refusal."""
    layer, doc, oracle = c.layer, c.doc, c.oracle
    h, i = layer.hidden, c.intermediate
    if oracle == "unquantized" and name == "AITER":
        return h, -(-i // (64 if i <= 192 else 128)) * (64 if i <= 192 else 128)
    if oracle.startswith("mxfp4"):
        if name == "EMULATION":
            return -(-h // 32) * 32, -(-i // 32) * 32
        silu = oracle == "mxfp4_dsv4" and layer.activation in ("silu", "situ")
        cdna4 = (c.caps.gfx or "") == "gfx950"
        w4a4 = name == "AITER_MXFP4_MXFP4"
        ia = 128 if w4a4 or (silu and (name == "AITER_MXFP4_BF16" or (name == "TRITON_UNFUSED" and not cdna4))) \
            else 256
        ha = 256 if w4a4 else ia
        return -(-h // ha) * ha, -(-i // ia) * ia
    if c.scheme == "fp8_block" and c.refined is None:
        bn, bk = layer.weight.block or (128, 128)
        if i % bn:
            c.refuse(f"The output_size of gate's and up's weight = {i} is not divisible by weight quantization "
                     f"block_n = {bn}.", "create_weights", name, doc["padding"]["fp8_block"]["source"])
        if layer.moe_tp > 1 and i % bk:
            c.refuse(f"The input_size of down's weight = {i} is not divisible by weight quantization block_k = "
                     f"{bk}.", "create_weights", name, doc["padding"]["fp8_block"]["source"])
    elif oracle == "mxfp8" and (h % 32 or i % 32):
        c.refuse("Quark MXFP8 MoE requires hidden_size and intermediate_size_per_partition divisible by 32, got "
                 f"{h} and {i}.", "create_weights", name, doc["padding"]["mxfp8"]["source"])
    return h, i


def _vllm(doc: dict[str, Any], version: str, layer: "MoELayer", caps: "Capabilities", env: Mapping[str, str],
          moe_backend: str, quant_method: str | None) -> EngineChoice:
    mb = moe_backend.strip().lower().replace("-", "_")
    values = doc.get("moe_backend_values")
    if values and mb not in values:  # vllm serve's parser (and KernelConfig) refuse it before any oracle runs
        msg = f"argument --moe-backend: invalid choice: '{mb}' (choose from {', '.join(sorted(values))})"
        return EngineChoice("vllm", version, mb, None, None, None, None, msg, "args", None, (), (Reason(
            f"vLLM {version} refuses the launch: {msg}", "failed", doc.get("moe_backend_values_source")),))
    if layer.weight.dtype in ("int4", "int8") and layer.act.dtype in ("bf16", "fp16"):
        return _vllm_wna16(doc, version, layer, caps, moe_backend, quant_method)
    scheme = _scheme(layer)
    c = _VllmCall(doc, version, layer, caps, _vllm_gates(caps, env), scheme, _vllm_oracle(layer, scheme, quant_method),
                  moe_backend.strip().lower().replace("-", "_"), layer.intermediate_per_rank, scheme)
    try:
        if scheme == "fp8_block":
            _vllm_fp8_block(c)
        if c.oracle == "mxfp8" and layer.has_bias:
            c.refuse("Quark MXFP8 MoE does not support biases.", source=doc["padding"]["mxfp8"]["source"])
        if layer.ep > 1:
            c.reasons.append(Reason("expert parallelism is not modelled: vLLM's all-to-all backend and DP change "
                                    "which classes accept the layer (the AITER Triton monolithic kernels refuse "
                                    "all-to-all); this is the TP-only answer", "caveat", c.src, None, "derived"))
        name, cls = _vllm_pick_forced(c) if c.forced else _vllm_pick_auto(c, env)
        hh, ii = _vllm_allocation(c, name)
    except _Refusal as exc:
        c.reasons.insert(0, Reason(f"vLLM {version} refuses the layer: {exc}", "failed", exc.source))
        c.reasons.extend(Reason(f"{b}: {why}", "failed", c.src) for b, why in c.rejected)
        fam = _backends(doc, c.oracle).get(exc.backend or "", {}).get("family")
        return EngineChoice("vllm", version, c.mb, exc.backend, fam, None, None, str(exc), exc.stage, None,
                            tuple(c.rejected), tuple(c.reasons))
    spec = _backends(doc, c.oracle)[name]
    how = "forced by --moe-backend " + c.mb if c.forced else "first backend of the auto list that accepts the layer"
    c.reasons.insert(0, Reason(f"vLLM {version} picks {name} ({cls}; {how})", "decision", f"{spec['source']}; {c.src}"))
    pad_key = {"unquantized": "unquantized_aiter" if name == "AITER" else None, "fp8": "fp8",
               "mxfp4": "mxfp4", "mxfp4_dsv4": "mxfp4", "mxfp8": "mxfp8"}[c.oracle]
    if pad_key:
        p = doc["padding"][pad_key]
        c.reasons.append(Reason(f"allocates hidden {hh} × intermediate/rank {ii}: {p['why']}", "padding", p["source"]))
    c.reasons.extend(Reason(f"{b}: {why}", "failed", c.src) for b, why in c.rejected)
    return EngineChoice("vllm", version, c.mb, name, spec.get("family"), hh, ii, None, None, cls, tuple(c.rejected),
                        tuple(c.reasons))


# -- SGLang ---------------------------------------------------------------------------------------------------------

def _sglang(doc: dict[str, Any], version: str, layer: "MoELayer", caps: "Capabilities", env: Mapping[str, str],
            moe_backend: str) -> EngineChoice:
    scheme = _scheme(layer)
    if scheme not in doc["modelled"]:
        raise UsageError(f"engine_choice: the SGLang {version} model covers bf16, FP8 and Quark MXFP4 W4A4 MoE "
                         f"layers, not {scheme}")
    kind = "bf16" if scheme == "bf16" else ("mxfp4_a4" if scheme == "mxfp4_a4" else "fp8")
    r = doc["runner"][kind]
    src = r["source"]
    use_aiter = _env_flag(env, "SGLANG_USE_AITER", False) and (caps.gfx or "").startswith("gfx9")
    mb = moe_backend.strip().lower().replace("-", "_")
    h, i = layer.hidden, layer.intermediate_per_rank
    reasons: list[Reason] = []
    rejected: list[tuple[str, str]] = []
    error = None
    if mb != "auto" and mb not in r["forced"]:
        error = (f"{'Quark MXFP4 MoE currently requires the AITER runner' if kind == 'mxfp4_a4' else 'no such runner'}"
                 f"; got {mb!r}.")
    elif kind == "bf16":
        why = None
        if use_aiter and mb in ("auto", "aiter"):
            if i % r["aiter_alignment"]:
                why = f"intermediate_size_per_partition={i} is not 128-aligned"
            elif caps.gfx == "gfx950" and layer.activation.startswith("swigluoai"):
                why = ("activation=swiglu with gemm1_alpha / gemm1_clamp_limit (SwiGLU-OAI) is not implemented by the "
                       "aiter CK bf16 fused-MoE kernels")
        if use_aiter and mb in ("auto", "aiter") and why is None:
            runner = "AITER"
        elif mb == "aiter" and use_aiter:
            runner, error = None, f"moe_runner_backend=aiter is not supported: {why}; use --moe-runner-backend triton."
        else:
            runner = "TRITON"
            if why:
                rejected.append(("AITER", why))
                reasons.append(Reason(f"aiter CK fused-MoE does not support this layer: {why}; using triton MoE "
                                      "runner", "warning", src))
    elif kind == "fp8":
        runner = "AITER" if (mb == "aiter" or (mb == "auto" and use_aiter)) else "TRITON"
        if use_aiter:
            i = -(-i // 128) * 128
    else:
        runner = "AITER"
        if use_aiter:
            i = -(-i // 256) * 256
    if error:
        reasons.insert(0, Reason(f"SGLang {version} refuses the layer: {error}", "failed", src))
        return EngineChoice("sglang", version, mb, None, None, None, None, error, "select", None, tuple(rejected),
                            tuple(reasons))
    family = "aiter-ck" if runner == "AITER" else "triton"
    how = f"--moe-runner-backend {mb}" + ("" if mb != "auto" else (" with SGLANG_USE_AITER=1" if use_aiter else
                                                                  " without SGLANG_USE_AITER"))
    reasons.insert(0, Reason(f"SGLang {version} runs the {runner} MoE runner ({how})", "decision", src))
    p = doc["padding"]["aiter"]
    reasons.append(Reason(f"allocates hidden {h} × intermediate/rank {i}: {p['why']}", "padding", p["source"]))
    return EngineChoice("sglang", version, mb, runner, family, h, i, None, None, None, tuple(rejected), tuple(reasons))


# -- public API ----------------------------------------------------------------------------------------------------

def choice_for_layer(layer: "MoELayer", caps: "Capabilities", engine: str = "vllm", engine_version: str | None = None,
                     *, env: Mapping[str, str] | None = None, moe_backend: str = "auto",
                     quant_method: str | None = None) -> EngineChoice:
    """:func:`engine_choice` for an already-built :class:`~moedispatch.core.layers.MoELayer` (plans use this)."""
    engine = engine.strip().lower()
    version, doc = _data(engine, engine_version)
    env = dict(env or {})
    if layer.kind != "moe":
        raise UsageError("engine_choice: the layer is dense (no MoE backend)")
    if engine == "vllm":
        return _vllm(doc, version, layer, caps, env, moe_backend, quant_method)
    return _sglang(doc, version, layer, caps, env, moe_backend)


def engine_choice(engine: str, engine_version: str | None = None, *, caps: "Capabilities | None" = None,
                  env: Mapping[str, str] | None = None, moe_backend: str = "auto", **layer_fields: Any) -> EngineChoice:
    """What ``engine`` (``"vllm"``, ``"sglang"``) at ``engine_version`` (default: the newest modelled) does on its own
    for one MoE layer, with ``--moe-backend`` (vLLM) / ``--moe-runner-backend`` (SGLang) ``moe_backend`` and the
    engine environment ``env`` (absent variables take the engine's defaults: vLLM's AITER switch is off).

    ``layer_fields`` are those of :func:`moedispatch.select_moe_backend` plus ``quant_method`` (the checkpoint's
    ``quantization_config.quant_method``: ``quark``, ``mxfp4``, ``fp8``, ``compressed-tensors`` …; absent, ``quark``
    for MX schemes and ``fp8`` for FP8), because engines route MX checkpoints through different code by it. ``caps``
    is the target as elsewhere (``None``: explain's — this machine's GPU, else the capability_db default target — with
    the AITER explain plans for).
    """
    fields = dict(layer_fields)
    quant_method = fields.pop("quant_method", None)
    if env is not None and not isinstance(env, Mapping):
        raise UsageError("engine_choice(): env must be a mapping of environment variables")
    if not isinstance(moe_backend, str):
        raise UsageError("engine_choice(): moe_backend must be a string")
    layer = layer_from_fields(fields)
    if caps is None:   # explain's target and AITER (MOEDISPATCH_AITER_VERSION, else the installed one)
        caps, _ = resolve_capabilities(None, cli_aiter_version(None))
    return choice_for_layer(layer, caps, engine, engine_version, env=env, moe_backend=moe_backend,
                            quant_method=None if quant_method is None else str(quant_method))


def findings(engine: str = "vllm", engine_version: str | None = None) -> list[dict[str, Any]]:
    """Where the engine release and moedispatch's selector disagree, resolved: ``id``, ``what`` the engine does,
    ``side`` (who is right for a user of that release: engine name | moedispatch | open), the ``rule`` moedispatch
    should follow, ``source`` and ``confidence`` (capability_db/engines/<engine>.toml ``[[finding]]``)."""
    _, doc = _data(engine.strip().lower(), engine_version)
    return [{"confidence": "confirmed", **f} for f in doc.get("finding", [])]


# -- plan comparison -----------------------------------------------------------------------------------------------

def _same_family(engine_family: str | None, ours: str | None) -> bool:
    if engine_family is None or ours is None:
        return False
    if engine_family in FUSED_MOE_BACKENDS and ours in FUSED_MOE_BACKENDS:
        return True  # aiter.fused_moe: AITER's own dispatcher picks CK / CK-Tile / FlyDSL / ASM
    return engine_family == ours


def _finding_applies(when: Mapping[str, Any], layer: "MoELayer", choice: EngineChoice, gfx: str | None,
                     quant_method: str | None, padding_differs: bool) -> bool:
    try:
        scheme = _scheme(layer)
    except UsageError:
        return False
    checks = (
        ("schemes", lambda v: scheme in v),
        ("activations", lambda v: layer.activation in v),
        ("not_activations", lambda v: layer.activation not in v),
        ("engine_backends", lambda v: choice.backend in v),
        ("gfx", lambda v: gfx in v),
        ("quant_methods", lambda v: (quant_method or "").lower() in v),
        ("not_model_types", lambda v: layer.model_type not in v),
        ("padding_differs", lambda v: padding_differs == v),
        ("intermediate_not_multiple_of", lambda v: layer.intermediate_per_rank % v != 0),
        ("dims_not_multiple_of", lambda v: layer.hidden % v != 0 or layer.intermediate_per_rank % v != 0),
    )
    return all(test(when[key]) for key, test in checks if key in when)


def compare_decision(decision: Any, choice: EngineChoice, *, quant_method: str | None = None) -> dict[str, Any]:
    """How the engine's own choice relates to moedispatch's decision for one layer, with the recorded findings
    (capability_db/engines ``[[finding]]``) that explain the difference and say who is right."""
    p = decision.padding
    out: dict[str, Any] = {"moedispatch": {"backend": decision.backend, "hidden": p.hidden,
                                           "intermediate_per_rank": p.intermediate_per_rank}}
    why: list[Reason] = []
    if not choice.ok:
        verdict = "refused"
        why.append(Reason(f"{choice.engine} {choice.version} raises: {choice.error}", "failed",
                          choice.reasons[0].source if choice.reasons else None))
    elif decision.backend is not None and _same_family(choice.family, decision.backend):
        verdict = "same"
    else:
        rej = decision.rejection(choice.family) if choice.family else None
        if rej is not None and rej.supported:
            verdict = "slower"
            why.append(Reason(f"{choice.family} is correct for this layer but moedispatch prefers "
                              f"{decision.backend}", "outranked"))
        elif rej is not None:
            verdict = "wrong"
            why += [r for r in rej.reasons if r.kind != "supports"]
        elif choice.family in FUSED_MOE_BACKENDS and decision.backend is not None:
            # aiter.fused_moe: correct when moedispatch accepts any AITER family for the layer.
            ok = [r for r in decision.rejected if r.backend in FUSED_MOE_BACKENDS and r.supported]
            bad = [r for r in decision.rejected if r.backend in FUSED_MOE_BACKENDS and not r.supported]
            if ok:
                verdict = "slower"
                why.append(Reason(f"aiter.fused_moe can run this layer ({ok[0].backend}) but moedispatch prefers "
                                  f"{decision.backend}", "outranked"))
            else:
                verdict = "wrong"
                for r in bad:
                    why += [x for x in r.reasons if x.kind != "supports"][:1]
        else:
            verdict = "different"
            why.append(Reason(f"moedispatch has no backend matching {choice.engine}'s {choice.backend}", "note"))
    padding_differs = choice.ok and (choice.hidden, choice.intermediate_per_rank) != (p.hidden, p.intermediate_per_rank)
    if padding_differs and verdict in ("same", "slower"):
        hits = _engine_allocation_hits(decision, choice)
        if hits:
            # moedispatch's simulation of AITER's dispatch at the engine's allocation hits a known-wrong kernel.
            verdict = "wrong"
            why += hits
    if padding_differs and verdict == "same":
        why.append(Reason(f"{choice.engine} allocates {choice.hidden} × {choice.intermediate_per_rank}, moedispatch "
                          f"plans {p.hidden} × {p.intermediate_per_rank}", "padding",
                          next((r.source for r in choice.reasons if r.kind == "padding"), None)))
    if verdict != "same" or padding_differs:
        gfx = decision.caps.gfx if decision.caps is not None else None
        for f in findings(choice.engine, choice.version):
            if "when" in f and _finding_applies(f["when"], decision.layer, choice, gfx, quant_method,
                                                bool(padding_differs)):
                side = {"moedispatch": "moedispatch is right", "open": "unresolved"}.get(
                    f["side"], f"{choice.engine} {choice.version} is right")
                why.append(Reason(f"[{f['id']}] {side}: {f['rule']}", "note", f["source"], None,
                                  f.get("confidence", "confirmed")))
    out.update(verdict=verdict, padding_differs=bool(padding_differs), why=texts(why),
               why_details=[r.to_dict() for r in why])
    return out


def _engine_allocation_hits(decision: Any, choice: EngineChoice) -> list[Reason]:
    """Known wrong-output kernels AITER's dispatcher would run for some serving token count at the sizes the engine
    allocates (its default AITER environment), as failed Reasons; [] when not an aiter.fused_moe path."""
    layer, caps = decision.layer, decision.caps
    fam = family_of(choice.family)
    if caps is None or fam not in FUSED_MOE_FAMILIES or choice.hidden is None or choice.intermediate_per_rank is None:
        return []
    if choice.hidden < layer.hidden or choice.intermediate_per_rank < layer.intermediate_per_rank:
        return []
    alloc = Padding(hidden=choice.hidden, intermediate_per_rank=choice.intermediate_per_rank,
                    hidden_pad=choice.hidden - layer.hidden,
                    intermediate_pad=choice.intermediate_per_rank - layer.intermediate_per_rank,
                    zero_fill=True)
    try:
        dp = aiter_dispatch.plan_dispatch(layer, caps, tokens=SERVING_BUCKETS, env={}, padding=alloc)
    except UsageError:  # a shape the dispatch model cannot key (its one-line refusals): no claim either way
        return []
    return [Reason(f"at the {choice.hidden} × {choice.intermediate_per_rank} the engine allocates, AITER's dispatcher "
                   f"runs {h.kernel} for tokens {h.tokens[0]}–{h.tokens[1]} (bucket {h.bucket}): {h.effect}",
                   "failed", h.source, h.issue, h.confidence) for h in dp.issues if h.severity == "error"]


def compare_plan(plan: "Plan", engine: str = "vllm", engine_version: str | None = None, *,
                 env: Mapping[str, str] | None = None, moe_backend: str = "auto",
                 quant_method: str | None = None) -> list[dict[str, Any]]:
    """Per MoE layer group of ``plan``: what ``engine`` does on ``moe_backend`` with ``env``, and how that compares
    with moedispatch's decision (``verdict``: same | slower | wrong | refused | different; ``padding_differs``)."""
    engine = engine.strip().lower()
    engine_version, _ = _data(engine, engine_version)  # an unknown engine or release is bad input, not a layer note
    out = []
    for group in plan.groups():
        d = group[0]
        if d.layer.kind != "moe":
            continue
        entry: dict[str, Any] = {"layers": [g.layer.index for g in group]}
        try:
            choice = choice_for_layer(d.layer, plan.caps, engine, engine_version, env=env, moe_backend=moe_backend,
                                      quant_method=quant_method)
        except UsageError as exc:  # a scheme the engine model does not cover: say so, never guess
            entry.update(engine=None, verdict="unmodelled", padding_differs=False, why=[str(exc)],
                         why_details=[Reason(str(exc), "note").to_dict()])
            out.append(entry)
            continue
        entry["engine"] = choice.to_dict()
        entry.update(compare_decision(d, choice, quant_method=quant_method))
        out.append(entry)
    return out


def recipe_engine_groups(plan: "Plan", recipe: Any) -> dict[str, Any]:
    """A recipe's ``engine_auto`` and ``engine_forced``: per MoE layer group, :func:`compare_plan` with the recipe's
    environment on ``auto`` and on the recipe's forced ``--moe-backend`` / ``--moe-runner-backend`` value. Both are
    ``None`` when the recipe's engine release is not modelled (capability_db/engines)."""
    try:
        version, _ = _data(recipe.engine, recipe.version)
    except UsageError:
        return {"engine_auto": None, "engine_forced": None}
    env = {e["name"]: str(e["value"]) for e in recipe.env}
    words = " ".join(a["arg"] for a in recipe.args).split()
    flag = "--moe-backend" if recipe.engine == "vllm" else "--moe-runner-backend"
    forced = words[words.index(flag) + 1] if flag in words[:-1] else "auto"
    qm = getattr(plan.model, "quant_method", None)
    auto = compare_plan(plan, recipe.engine, version, env=env, quant_method=qm)
    pinned = auto if forced == "auto" else compare_plan(plan, recipe.engine, version, env=env, moe_backend=forced,
                                                          quant_method=qm)
    return {"engine_auto": auto, "engine_forced": pinned}


_VERDICT_TEXT = {"same": "same kernel family as moedispatch", "slower": "correct, but moedispatch prefers another",
                 "wrong": "WRONG for this layer per moedispatch", "refused": "REFUSED by the engine",
                 "different": "no matching moedispatch backend", "unmodelled": "not modelled"}


def render_comparison(comparisons: list[dict[str, Any]], *, env: Mapping[str, str] | None = None) -> list[str]:
    """Text lines for explain's table: per MoE group, what the engine does on its own and how it compares."""
    lines = []
    for c in comparisons:
        e = c.get("engine")
        head = layer_span(c["layers"])
        if e is None:
            lines.append(f"engine  {head}: {c['why'][0]}")
            continue
        label = f"{e['engine']} {e['engine_version']}"
        how = f"--{'moe-backend' if e['engine'] == 'vllm' else 'moe-runner-backend'} {e['moe_backend']}"
        envs = " ".join(f"{k}={v}" for k, v in sorted((env or {}).items())) or "default environment"
        if e["error"]:
            what = f"raises at {e['stage']}: {e['error']}"
        else:
            what = (f"{e['backend']} ({e['family'] or 'no moedispatch backend'}), allocates {e['hidden']} × "
                    f"{e['intermediate_per_rank']}/rank")
        lines.append(f"engine  {head}: {label} {how} ({envs}) → {what} — {_VERDICT_TEXT.get(c['verdict'], c['verdict'])}"
                     + ("; padding differs" if c.get("padding_differs") else ""))
        for why in c.get("why", []):
            lines.append(f"        {why}")
    return lines
