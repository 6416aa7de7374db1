"""Declarative support rules shared by the built-in backends (and usable by third-party ones).

A backend declares its support as data — :class:`Combo` rows (weight × activation quant, archs, AITER feature,
alignment) — plus a few small predicates that each return a reason string or ``None``. Known issues come from
capability_db/known_issues.toml and are evaluated against the *planned* padding, so an issue whose workaround the
plan applies is reported as avoided, and one it does not fix rejects (wrong output) or warns (crash at run time).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Iterable

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from moedispatch import capdb
from moedispatch.backend import Backend, Padding, Verdict
from moedispatch.capabilities import Capabilities
from moedispatch.errors import CapabilityDBError
from moedispatch.layers import MoELayer

__all__ = [
    "Combo",
    "KnownIssue",
    "known_issues",
    "IssueOutcome",
    "evaluate_issues",
    "find_combo",
    "need_feature",
    "RuleBackend",
]


@dataclass(frozen=True)
class Combo:
    """One supported weight × activation quant combination of a kernel family.

    ``weight``/``act`` are quant labels; ``weight_granularity``/``act_granularity`` restrict granularities (empty
    = any); ``archs`` the gfx targets with a kernel; ``feature`` the AITER feature (capability_db/aiter.toml) the
    path needs; ``hidden_multiple``/``inter_multiple`` the alignment (``inter_multiple`` may be a callable of
    (inter_per_rank, gfx)); ``kernel`` a short name of the kernel path; ``source`` where the fact comes from.
    """

    weight: str
    act: str
    archs: tuple[str, ...]
    kernel: str
    source: str
    weight_granularity: tuple[str, ...] = ()
    act_granularity: tuple[str, ...] = ()
    feature: str | None = None
    hidden_multiple: int = 1
    inter_multiple: Any = 1
    note: str | None = None

    def matches(self, layer: MoELayer) -> bool:
        if layer.weight.dtype != self.weight or layer.act.dtype != self.act:
            return False
        if self.weight_granularity and layer.weight.granularity not in self.weight_granularity:
            return False
        if self.act_granularity and layer.act.granularity not in self.act_granularity:
            return False
        return True

    def inter_multiple_for(self, layer: MoELayer, gfx: str | None) -> int:
        if callable(self.inter_multiple):
            return int(self.inter_multiple(layer.intermediate_per_rank, gfx))
        return int(self.inter_multiple)


def find_combo(combos: Iterable[Combo], layer: MoELayer) -> list[Combo]:
    return [c for c in combos if c.matches(layer)]


def need_feature(caps: Capabilities, feature: str, purpose: str) -> str | None:
    """``None`` if the target AITER has ``feature``, else a reason naming version and source."""
    if caps.has_feature(feature):
        return None
    info = capdb.feature_info(feature)
    have = f"target AITER is {caps.aiter_version}" if caps.aiter_version else "AITER is not installed"
    return (f"{purpose} needs AITER >= {info['since']} for {info.get('short', info['what'])} "
            f"({info.get('cite', info['source'])}); {have}")


# -- known issues ----------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class KnownIssue:
    id: str
    title: str
    families: tuple[str, ...]
    aiter: str
    status: str
    effect: str
    predicate: tuple[tuple[str, Any], ...]
    workaround: tuple[tuple[str, Any], ...]
    source: str

    @property
    def pred(self) -> dict[str, Any]:
        return dict(self.predicate)

    @property
    def fix(self) -> dict[str, Any]:
        return dict(self.workaround)


_EFFECTS = ("wrong_output", "crash", "hang", "slow", "unsupported")
_PRED_KEYS = {"gfx", "weight", "act", "activation", "has_bias", "inter_mod", "inter_in", "unpadded_inter_in",
              "kernel_inter_pad_gt", "model_type", "tokens", "weight_granularity"}
_FIX_KEYS = {"pad_intermediate_to", "kernel_intermediate_pad", "route", "reject", "caveat"}


# Value types of predicate / workaround keys (a wrong type would otherwise fail later, mid-selection).
_STR_LIST, _INT_LIST = "an array of strings", "an array of integers"
_PRED_TYPES: dict[str, str] = {
    "gfx": _STR_LIST, "weight": _STR_LIST, "act": _STR_LIST, "activation": _STR_LIST, "model_type": _STR_LIST,
    "weight_granularity": _STR_LIST, "has_bias": "a boolean", "inter_mod": "a positive integer",
    "inter_in": _INT_LIST, "unpadded_inter_in": _INT_LIST, "kernel_inter_pad_gt": "a non-negative integer",
    "tokens": _INT_LIST,
}
_FIX_TYPES: dict[str, str] = {
    "pad_intermediate_to": "a positive integer", "kernel_intermediate_pad": "a non-negative integer",
    "route": "a string", "reject": "a boolean", "caveat": "a string",
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _type_ok(value: Any, kind: str) -> bool:
    if kind == _STR_LIST:
        return isinstance(value, list) and all(isinstance(v, str) for v in value)
    if kind == _INT_LIST:
        return isinstance(value, list) and all(_is_int(v) for v in value)
    if kind == "a boolean":
        return isinstance(value, bool)
    if kind == "a string":
        return isinstance(value, str)
    if kind == "a positive integer":
        return _is_int(value) and value > 0
    if kind == "a non-negative integer":
        return _is_int(value) and value >= 0
    return True  # pragma: no cover


def _check_issue_types(raw: dict[str, Any], where: str) -> None:
    for key in ("id", "title", "aiter", "status", "effect", "source"):
        if not isinstance(raw[key], str):
            raise CapabilityDBError(f"{where}: {key} must be a string, got {type(raw[key]).__name__} {raw[key]!r:.60}")
    if not raw["id"].strip():
        raise CapabilityDBError(f"{where}: id must not be empty")
    if not _type_ok(raw["families"], _STR_LIST) or not raw["families"]:
        raise CapabilityDBError(f"{where}: families must be a non-empty array of backend names, got "
                                f"{raw['families']!r:.60}")
    for table, types in (("predicate", _PRED_TYPES), ("workaround", _FIX_TYPES)):
        if not isinstance(raw[table], dict):
            raise CapabilityDBError(f"{where}: {table} must be a table, got {type(raw[table]).__name__}")
        for key, value in raw[table].items():
            kind = types.get(key)
            if kind is not None and not _type_ok(value, kind):
                raise CapabilityDBError(f"{where}: {table}.{key} must be {kind}, got {value!r:.60}")


def _freeze(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


@functools.lru_cache(maxsize=None)
def known_issues() -> tuple[KnownIssue, ...]:
    data = capdb.load_toml("known_issues.toml")
    issues = []
    seen: dict[str, int] = {}
    entries = data.get("issue", [])
    if not isinstance(entries, list):
        raise CapabilityDBError("capability_db/known_issues.toml: issue must be an array of tables ([[issue]])")
    for n, raw in enumerate(entries):
        if not isinstance(raw, dict):
            raise CapabilityDBError(f"capability_db/known_issues.toml: issue[{n}] must be a table")
        where = f"capability_db/known_issues.toml: issue[{n}]" + (f" ({raw.get('id')})" if raw.get("id") else "")
        for key in ("id", "title", "families", "aiter", "status", "effect", "predicate", "workaround", "source"):
            if key not in raw:
                raise CapabilityDBError(f"{where}: missing key {key!r}")
        _check_issue_types(raw, where)
        if raw["id"] in seen:
            raise CapabilityDBError(f"{where}: duplicate id {raw['id']!r} (also issue[{seen[raw['id']]}])")
        seen[raw["id"]] = n
        if raw["effect"] not in _EFFECTS:
            raise CapabilityDBError(f"{where}: effect {raw['effect']!r} not one of {', '.join(_EFFECTS)}")
        bad = set(raw["predicate"]) - _PRED_KEYS
        if bad:
            raise CapabilityDBError(f"{where}: unknown predicate key(s) {', '.join(sorted(bad))}")
        bad = set(raw["workaround"]) - _FIX_KEYS
        if bad:
            raise CapabilityDBError(f"{where}: unknown workaround key(s) {', '.join(sorted(bad))}")
        if raw["aiter"]:
            try:
                SpecifierSet(raw["aiter"])
            except InvalidSpecifier:
                raise CapabilityDBError(f"{where}: aiter {raw['aiter']!r} is not a PEP 440 specifier") from None
        issues.append(KnownIssue(
            id=raw["id"], title=raw["title"], families=tuple(raw["families"]), aiter=raw["aiter"],
            status=raw["status"], effect=raw["effect"],
            predicate=tuple(sorted((k, _freeze(v)) for k, v in raw["predicate"].items())),
            workaround=tuple(sorted((k, _freeze(v)) for k, v in raw["workaround"].items())),
            source=raw["source"],
        ))
    return tuple(issues)


@functools.lru_cache(maxsize=1024)  # pure; parsing PEP 440 specifiers dominated uncached selection
def _version_in(spec: str, version: str | None) -> bool:
    if not spec:
        return True
    if version is None:
        return False
    try:
        return Version(Version(version).public) in SpecifierSet(spec)
    except InvalidVersion:
        return True  # unknown version string: assume affected (conservative)


# One test per predicate key: (value from the issue, layer, caps, padded inter, kernel inter pad) -> matches.
_PRED_TESTS: dict[str, Any] = {
    "gfx": lambda v, la, c, inter, kpad: c.gfx in v,
    "weight": lambda v, la, c, inter, kpad: la.weight.dtype in v,
    "weight_granularity": lambda v, la, c, inter, kpad: la.weight.granularity in v,
    "act": lambda v, la, c, inter, kpad: la.act.dtype in v,
    "activation": lambda v, la, c, inter, kpad: la.activation in v,
    "has_bias": lambda v, la, c, inter, kpad: la.has_bias == v,
    "inter_mod": lambda v, la, c, inter, kpad: inter % v != 0,
    "inter_in": lambda v, la, c, inter, kpad: inter in v,
    "unpadded_inter_in": lambda v, la, c, inter, kpad: la.intermediate_per_rank in v,
    "kernel_inter_pad_gt": lambda v, la, c, inter, kpad: kpad > v,
    "model_type": lambda v, la, c, inter, kpad: la.model_type in v,
}


def _matches(issue: KnownIssue, layer: MoELayer, caps: Capabilities, padding: Padding,
             kernel_inter_pad: int) -> bool:
    inter = padding.intermediate_per_rank
    for key, value in issue.predicate:
        test = _PRED_TESTS.get(key)  # "tokens" is decided at run time: reported as a caveat, never matched here
        if test is not None and not test(value, layer, caps, inter, kernel_inter_pad):
            return False
    return True


@dataclass(frozen=True)
class IssueOutcome:
    """What a known issue means for one planned layer: ``blocking`` reasons reject; ``notes`` inform."""

    blocking: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def issues_for(family: str, caps: Capabilities) -> list[KnownIssue]:
    return [i for i in known_issues() if family in i.families and _version_in(i.aiter, caps.aiter_version)]


def evaluate_issues(family: str, layer: MoELayer, caps: Capabilities, padding: Padding) -> IssueOutcome:
    """Evaluate every known issue of ``family`` against the planned padding.

    An issue is *avoided* when its predicate matches the unpadded/raw situation but not the plan (the plan applied
    its workaround); it *applies* when it matches the plan. Applying wrong-output issues block; crash/hang issues
    that depend on run-time token counts become caveats; other applying issues block.
    """
    blocking: list[str] = []
    notes: list[str] = []
    avoided: dict[str, list[str]] = {}
    raw = Padding.none(layer)
    for issue in issues_for(family, caps):
        pred = issue.pred
        applies = _matches(issue, layer, caps, padding, padding.kernel_intermediate_pad)
        raw_pad = padding.intermediate_pad
        would = _matches(issue, layer, caps, raw, 0) or (
            "kernel_inter_pad_gt" in pred and _matches(issue, layer, caps, padding, raw_pad))
        tag = f"[{issue.id}]"
        if applies:
            if "tokens" in pred:
                notes.append(f"caveat {tag} {issue.title} ({issue.effect} at M in {list(pred['tokens'])}); "
                             f"{issue.fix.get('caveat', 'no workaround known')}")
            else:
                blocking.append(f"{tag} {issue.title} ({issue.effect.replace('_', ' ')}, {issue.status}; "
                                f"{issue.source})")
        elif would:
            fix = issue.fix
            how = (f"pads intermediate to a multiple of {fix['pad_intermediate_to']}" if "pad_intermediate_to" in fix
                   else "passes intermediate_pad=0 and computes over the zero-filled pad"
                   if "kernel_intermediate_pad" in fix else "the plan")
            avoided.setdefault(how, []).append(f"{tag} ({issue.title})")
    # One line per workaround, naming every issue it avoids.
    notes += [f"avoids {', '.join(tags)}: the plan {how}" for how, tags in avoided.items()]
    return IssueOutcome(tuple(blocking), tuple(notes))


def kernel_pad_workaround(family: str, layer: MoELayer, caps: Capabilities, padding: Padding) -> str | None:
    """The id of a known issue (for ``family``) whose workaround is passing ``intermediate_pad=0``, if it applies."""
    for issue in issues_for(family, caps):
        if issue.fix.get("kernel_intermediate_pad") == 0 and padding.intermediate_pad > 0:
            if _matches(issue, layer, caps, padding, padding.intermediate_pad):
                return issue.id
    return None


# -- a base class for table-driven backends --------------------------------------------------------------------

class RuleBackend(Backend):
    """A backend whose support is a table of :class:`Combo` plus small predicates.

    Subclasses set ``combos``, ``activations`` (name -> source), ``requires_aiter`` and may override
    :meth:`extra_checks` and :meth:`kernel_pads`. ``check`` collects every failing rule, then plans padding and
    evaluates known issues against the plan.
    """

    combos: tuple[Combo, ...] = ()
    activations: dict[str, str] = {}
    bias_supported: bool = True
    bias_source: str = ""
    requires_aiter: bool = False
    min_cdna: int = 0
    arch_source: str = ""

    # -- hooks for subclasses ---------------------------------------------------------------------------------
    def extra_checks(self, layer: MoELayer, caps: Capabilities, combo: Combo | None) -> list[str]:
        return []

    def kernel_pads(self, layer: MoELayer, caps: Capabilities, padding: Padding) -> tuple[int, int, list[str]]:
        """(kernel_hidden_pad, kernel_intermediate_pad, notes) for an aligned plan; default: the real pads."""
        return padding.hidden_pad, padding.intermediate_pad, []

    def notes(self, layer: MoELayer, caps: Capabilities, combo: Combo) -> list[str]:
        return []

    # -- rules --------------------------------------------------------------------------------------------------
    def combo_for(self, layer: MoELayer, caps: Capabilities) -> tuple[Combo | None, list[str]]:
        matches = find_combo(self.combos, layer)
        scheme = f"weights {layer.weight.dtype} × activations {layer.act.dtype}"
        if not matches:
            supported = sorted({f"{c.weight}×{c.act}" for c in self.combos})
            reasons = [f"no {self.name} kernel for {scheme} (supports weight×activation: {', '.join(supported)})"]
            archs = sorted({a for c in self.combos if c.weight == layer.weight.dtype for a in c.archs})
            if archs and caps.gfx not in archs:
                reasons.append(self._arch_reason(archs, f"{layer.weight.dtype} weights", caps))
            return None, reasons
        on_arch = [c for c in matches if caps.gfx in c.archs]
        if not on_arch:
            archs = sorted({a for c in matches for a in c.archs})
            return None, [self._arch_reason(archs, f"{scheme} ({matches[0].kernel})", caps)]
        return on_arch[0], []

    @staticmethod
    def _arch_reason(archs: list[str], what: str, caps: Capabilities) -> str:
        why = ""
        if any(a == "gfx950" for a in archs) and not caps.native_mx and caps.gfx is not None:
            why = f" — {caps.gfx}" + (f" ({caps.family})" if caps.family else "") + \
                " has no MX/FP4 scaled-MFMA matrix instructions"
        return f"needs {' or '.join(archs)} for {what}; target is {caps.arch_label}{why}"

    def check(self, layer: MoELayer, caps: Capabilities) -> Verdict:
        failures: list[str] = []
        if self.requires_aiter and caps.aiter_version is None:
            failures.append("AITER (PyPI/ROCm distribution amd-aiter) is not available on the target"
                            + (f": {caps.why_unknown('aiter_version')}" if caps.why_unknown("aiter_version") else ""))
        if self.min_cdna and caps.cdna < self.min_cdna:
            failures.append(f"needs CDNA{self.min_cdna} or newer ({self.arch_source}); target is {caps.arch_label}"
                            + (f", {caps.family}" if caps.family else ""))
        combo, why = self.combo_for(layer, caps)
        failures += why
        if layer.activation not in self.activations:
            failures.append(f"activation {layer.activation} not supported (supports "
                            f"{', '.join(sorted(self.activations))})")
        if layer.has_bias and not self.bias_supported:
            failures.append(f"expert bias not supported ({self.bias_source})")
        if combo is not None and combo.feature and self.requires_aiter and caps.aiter_version is not None:
            reason = need_feature(caps, combo.feature, f"{combo.kernel}")
            if reason:
                failures.append(reason)
        failures += self.extra_checks(layer, caps, combo)
        if failures:
            return Verdict(False, tuple(failures))
        assert combo is not None
        padding = self.plan_padding(layer, caps)
        outcome = evaluate_issues(self.name, layer, caps, padding)
        if outcome.blocking:
            return Verdict(False, outcome.blocking)
        notes = [f"{combo.kernel} supports weights {layer.weight.describe()} × activations {layer.act.describe()} "
                 f"on {caps.gfx} ({combo.source})"]
        if combo.note:
            notes.append(combo.note)
        for spec, what in ((layer.weight, "weights"), (layer.act, "activations")):
            if spec.dtype == "fp8" and spec.fmt == "e4m3fn" and caps.fp8_format == "e4m3fnuz":
                notes.append(f"fp8 {what} are OCP e4m3fn in the checkpoint; {caps.gfx} computes in e4m3fnuz (max 240), "
                             "so they are converted at load (bit pattern reused, scales ×2: vLLM "
                             "normalize_e4m3fn_to_e4m3fnuz; models_hw.md §B.2)")
                break
        notes += self.notes(layer, caps, combo)
        notes += outcome.notes
        return Verdict(True, tuple(notes))

    def plan_padding(self, layer: MoELayer, caps: Capabilities) -> Padding:
        # check() plans padding to evaluate known issues and the selector asks again for the winner: plan once.
        return _planned(self, layer, caps)

    def _plan_padding(self, layer: MoELayer, caps: Capabilities) -> Padding:
        combo = next(iter(find_combo([c for c in self.combos if caps.gfx in c.archs], layer)), None)
        if combo is None:
            return Padding.none(layer)
        inter_multiple = combo.inter_multiple_for(layer, caps.gfx)
        hidden_multiple = combo.hidden_multiple
        # Known-issue workarounds that demand a larger multiple (pad_intermediate_to) raise the alignment.
        notes = []
        for issue in issues_for(self.name, caps):
            to = issue.fix.get("pad_intermediate_to")
            if to and to > inter_multiple and _matches(
                    issue, layer, caps, Padding.aligned(layer, hidden_multiple=hidden_multiple,
                                                        intermediate_multiple=inter_multiple), 0):
                inter_multiple = to
                notes.append(f"intermediate padded to a multiple of {to} to avoid [{issue.id}]")
        plan = Padding.aligned(layer, hidden_multiple=hidden_multiple, intermediate_multiple=inter_multiple)
        kh, ki, pad_notes = self.kernel_pads(layer, caps, plan)
        issue_id = kernel_pad_workaround(self.name, layer, caps,
                                         Padding.aligned(layer, hidden_multiple=hidden_multiple,
                                                         intermediate_multiple=inter_multiple,
                                                         kernel_intermediate_pad=ki))
        if issue_id and ki:
            ki = 0
            pad_notes = [n for n in pad_notes if "kernel pads" in n and "0" in n.split(":")[0]]

        if plan.padded:
            notes += _scale_notes(layer, plan)
        if plan.padded:
            notes.insert(0, f"alignment: hidden to a multiple of {hidden_multiple}, intermediate per rank to a "
                            f"multiple of {inter_multiple} ({combo.kernel} tiles); pad regions must be zero-filled "
                            f"(allocate with torch.zeros: vLLM #55251)")
        return Padding.aligned(layer, hidden_multiple=hidden_multiple, intermediate_multiple=inter_multiple,
                               kernel_hidden_pad=kh, kernel_intermediate_pad=ki, notes=tuple(notes + pad_notes))


@functools.lru_cache(maxsize=4096)
def _planned(backend: RuleBackend, layer: MoELayer, caps: Capabilities) -> Padding:
    return backend._plan_padding(layer, caps)


def _scale_notes(layer: MoELayer, plan: Padding) -> list[str]:
    """How the scale tensors follow the padded weights (pad at the end of each gate/up half, aiter_sglang.md §5)."""
    h, i = plan.hidden, plan.intermediate_per_rank
    e = layer.experts_per_rank
    if layer.weight.is_mx:
        return [f"scales: one E8M0 byte per 32 elements along K — w13 scales [{e}, 2×{i}, {h // 32}], w2 scales "
                f"[{e}, {h}, {i // 32}]; pad scale entries must be finite (0x00 = 2^-127 or 0x7F = 1.0), never 0xFF: "
                f"that is NaN in E8M0 and NaN × 0 = NaN (OCP MX v1.0)"]
    if layer.weight.block:
        bn, bk = layer.weight.block
        return [f"block scales: fp32 per {bn}×{bk} tile of the padded weights — w13 [{e}, 2×{-(-i // bn)}, "
                f"{-(-h // bk)}], w2 [{e}, {-(-h // bn)}, {-(-i // bk)}]; tiles that cover only padding hold zeros"]
    return []


def shard_caveats(layer: MoELayer) -> tuple[str, ...]:
    """Layer-level caveats of the TP sharding itself (independent of the backend): a shard that splits the
    checkpoint's scale blocks. The planner pads the *allocation*; it cannot re-block scales a loader slices."""
    out = []
    block = layer.weight.block
    if block and layer.moe_tp > 1 and (layer.intermediate_per_rank % block[0] or layer.intermediate_per_rank % block[1]):
        text = (f"caveat [scale tiles]: the TP shard {layer.intermediate_per_rank} of intermediate {layer.intermediate} "
                f"splits the checkpoint's {block[0]}×{block[1]} scale tiles. vLLM refuses this shape ('output_size of "
                f"gate's and up's weight = {layer.intermediate_per_rank} is not divisible by weight quantization "
                f"block_n = {block[0]}', quantization/fp8.py create_weights); SGLang accepts it only on AITER with "
                f"128-padding (PRs #18684/#21097, GSM8K 0.980 for Qwen3-235B-FP8 at TP8, reference seeds/003)")
        if layer.intermediate % block[0] == 0:
            text += (f". Safer: expert parallelism (--ep {layer.tp}) keeps every expert whole ({layer.intermediate} = "
                     f"{layer.intermediate // block[0]}×{block[0]})")
        out.append(text)
    if layer.weight.is_mx and layer.moe_tp > 1 and layer.intermediate_per_rank % 32:
        out.append(
            f"caveat [scale groups]: the TP shard {layer.intermediate_per_rank} of intermediate {layer.intermediate} "
            f"is not a multiple of the 32-element MX scale group, so an even split cuts E8M0 groups of w2; the loader "
            f"must shard in whole groups (vLLM gpt_oss.py slices cdiv(I/32, tp)*32 per rank, vllm.md §12.6) or use "
            f"expert parallelism")
    return tuple(out)
