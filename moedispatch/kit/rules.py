"""Declarative support rules shared by the built-in backends (and usable by third-party ones).

A backend declares its support as data — :class:`Combo` rows (weight × activation quant, archs, AITER feature,
alignment) — plus a few small predicates that each return a reason string or ``None``. Known issues come from
capability_db/known_issues.toml and are evaluated against the *planned* padding, so an issue whose workaround the
plan applies is reported as avoided, and one it does not fix rejects (wrong output) or warns (crash at run time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from moedispatch._util.caches import memoize
from moedispatch.aiter.issues import dispatch_issues
from moedispatch.data import capdb
from moedispatch.core.backend import Backend, Padding, Verdict
from moedispatch.core.aiter_release import in_range, range_problem, release_of
from moedispatch.core.capabilities import Capabilities
from moedispatch.core.errors import CapabilityDBError
from moedispatch.core.layers import MoELayer
from moedispatch.core.reason import Reason

#: How a family table's alignment note starts (a dispatch-derived plan replaces it: it says which kernels tile).
ALIGNMENT_NOTE = "alignment:"
#: The OCP Microscaling Formats (MX) v1.0 specification (E8M0 0xFF is NaN).
OCP_MX_SPEC = "https://www.opencompute.org/documents/ocp-microscaling-formats-mx-v1-0-spec-final-pdf"
#: SGLang's AITER MoE weight and scale padding (pads each gate/up half and its scales at the end).
SGLANG_SCALE_PAD = "https://github.com/sgl-project/sglang/pull/18684"
#: vLLM converts OCP e4m3fn checkpoints to e4m3fnuz on gfx942 (bit pattern reused, scales doubled).
FP8_FNUZ_SOURCE = ("https://github.com/vllm-project/vllm/blob/017e9f4448/vllm/model_executor/layers/quantization/utils/"
                   "w8a8_utils.py (normalize_e4m3fn_to_e4m3fnuz)")

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
    confidence: str = "confirmed"

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


def need_feature(caps: Capabilities, feature: str, purpose: str) -> Reason | None:
    """``None`` if the target AITER has ``feature``, else a failed Reason naming the version floor, its source and
    its confidence (a derived floor says so)."""
    if caps.has_feature(feature):
        return None
    info = capdb.feature_info(feature)
    have = f"target AITER is {caps.aiter_version}" if caps.aiter_version else "AITER is not installed"
    confidence = info.get("confidence", "confirmed")
    floor = f"AITER >= {info['since']}" + (f" ({confidence} floor)" if confidence != "confirmed" else "")
    return Reason(f"{purpose} needs {floor} for {info.get('short', info['what'])}; {have}", "failed",
                  info.get("cite", info["source"]), None, confidence)


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
    confidence: str = "confirmed"
    #: A dispatch issue (capability_db/dispatch_issues.toml id) that decides this issue per tuned row and bucket: where
    #: the plan reads a tuned set the user named (AITER_CONFIG_FMOE, --pin-file) instead of the one AITER ships, it (a
    #: hit, or none) replaces this issue's token caveat.
    dispatch: str | None = None

    @property
    def pred(self) -> dict[str, Any]:
        return dict(self.predicate)

    @property
    def fix(self) -> dict[str, Any]:
        return dict(self.workaround)


_EFFECTS = ("wrong_output", "crash", "hang", "slow", "unsupported")
_PRED_KEYS = {"gfx", "weight", "act", "activation", "has_bias", "inter_mod", "inter_in", "unpadded_inter_in",
              "kernel_inter_pad_gt", "model_type", "tokens", "weight_granularity", "pad_semantics"}
_FIX_KEYS = {"pad_intermediate_to", "kernel_intermediate_pad", "route", "reject", "caveat"}
_CONFIDENCES = ("confirmed", "derived", "unconfirmed")


# Value types of predicate / workaround keys (a wrong type would otherwise fail later, mid-selection).
_STR_LIST, _INT_LIST = "an array of strings", "an array of integers"
_PRED_TYPES: dict[str, str] = {
    "gfx": _STR_LIST, "weight": _STR_LIST, "act": _STR_LIST, "activation": _STR_LIST, "model_type": _STR_LIST,
    "weight_granularity": _STR_LIST, "pad_semantics": _STR_LIST, "has_bias": "a boolean", "inter_mod": "a positive integer",
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


@memoize(maxsize=None)
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
        confidence = raw.get("confidence", "confirmed")
        if confidence not in _CONFIDENCES:
            raise CapabilityDBError(f"{where}: confidence {confidence!r} not one of {', '.join(_CONFIDENCES)}")
        if raw["aiter"] and range_problem(raw["aiter"]):
            raise CapabilityDBError(f"{where}: aiter {raw['aiter']!r} is not a release range: "
                                    f"{range_problem(raw['aiter'])}")
        if "dispatch" in raw and not (isinstance(raw["dispatch"], str) and raw["dispatch"].strip()):
            raise CapabilityDBError(f"{where}: dispatch must be a dispatch issue id, got {raw['dispatch']!r:.60}")
        if raw.get("dispatch"):
            if raw["dispatch"] not in {d.id for d in dispatch_issues()}:
                raise CapabilityDBError(f"{where}: dispatch {raw['dispatch']!r} is no capability_db/"
                                        "dispatch_issues.toml id")
        issues.append(KnownIssue(
            id=raw["id"], title=raw["title"], families=tuple(raw["families"]), aiter=raw["aiter"],
            status=raw["status"], effect=raw["effect"],
            predicate=tuple(sorted((k, _freeze(v)) for k, v in raw["predicate"].items())),
            workaround=tuple(sorted((k, _freeze(v)) for k, v in raw["workaround"].items())),
            source=raw["source"], confidence=confidence, dispatch=raw.get("dispatch"),
        ))
    return tuple(issues)


@memoize(maxsize=1024)  # pure; parsing PEP 440 specifiers dominated uncached selection
def _version_in(spec: str, version: str | None) -> bool:
    if not spec:
        return True
    if version is None:
        return False
    if release_of(version) is None:
        return True  # unknown version string: assume affected (conservative)
    return in_range(version, spec)   # 0.1.19rc2 → 0.1.19, as the dispatch rules and issues decide ranges


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
        if key == "pad_semantics":  # how the planned kernel reads its pads (Padding.pad_semantics)
            if padding.pad_semantics not in value:
                return False
            continue
        test = _PRED_TESTS.get(key)  # "tokens" is decided at run time: reported as a caveat, never matched here
        if test is not None and not test(value, layer, caps, inter, kernel_inter_pad):
            return False
    return True


@dataclass(frozen=True)
class IssueOutcome:
    """What a known issue means for one planned layer: ``blocking`` reasons reject; ``notes`` inform."""

    blocking: tuple[Reason, ...] = ()
    notes: tuple[Reason, ...] = ()


def issues_for(family: str, caps: Capabilities) -> list[KnownIssue]:
    return [i for i in known_issues() if family in i.families and _version_in(i.aiter, caps.aiter_version)]


def evaluate_issues(family: str, layer: MoELayer, caps: Capabilities, padding: Padding) -> IssueOutcome:
    """Evaluate every known issue of ``family`` against the planned padding.

    An issue is *avoided* when its predicate matches the unpadded/raw situation but not the plan (the plan applied
    its workaround); it *applies* when it matches the plan. Applying wrong-output issues block; crash/hang issues
    that depend on run-time token counts become caveats unless the entry says ``reject = true``; other applying
    issues block. Every outcome is a Reason carrying the issue id, its source and its confidence.
    """
    blocking: list[Reason] = []
    notes: list[Reason] = []
    avoided: dict[str, list[KnownIssue]] = {}
    raw = Padding.none(layer)
    for issue in issues_for(family, caps):
        pred = issue.pred
        applies = _matches(issue, layer, caps, padding, padding.kernel_intermediate_pad)
        raw_pad = padding.intermediate_pad
        would = _matches(issue, layer, caps, raw, 0) or (
            "kernel_inter_pad_gt" in pred and _matches(issue, layer, caps, padding, raw_pad))
        tag = f"[{issue.id}]"
        fix = issue.fix
        if applies:
            route = f"; route to {fix['route']}" if "route" in fix else ""
            if "tokens" in pred and not fix.get("reject"):
                notes.append(Reason(f"caveat {tag} {issue.title} ({issue.effect.replace('_', ' ')} at M in "
                                    f"{list(pred['tokens'])}); {fix.get('caveat', 'no workaround known')}{route}",
                                    "caveat", issue.source, issue.id, issue.confidence))
            else:
                blocking.append(Reason(f"{tag} {issue.title} ({issue.effect.replace('_', ' ')}, {issue.status}"
                                       f"{route})", "failed", issue.source, issue.id, issue.confidence))
        elif would:
            how = (f"pads intermediate to a multiple of {fix['pad_intermediate_to']}" if "pad_intermediate_to" in fix
                   else "passes intermediate_pad=0 and computes over the zero-filled pad"
                   if "kernel_intermediate_pad" in fix else "the plan")
            avoided.setdefault(how, []).append(issue)
    # One line per workaround, naming every issue it avoids.
    for how, avoided_issues in avoided.items():
        tags = ", ".join(f"[{i.id}] ({i.title})" for i in avoided_issues)
        confidence = next((c for c in ("unconfirmed", "derived") if any(i.confidence == c for i in avoided_issues)),
                          "confirmed")
        notes.append(Reason(f"avoids {tags}: the plan {how}", "note", "; ".join(i.source for i in avoided_issues),
                            ",".join(i.id for i in avoided_issues), confidence))
    return IssueOutcome(tuple(blocking), tuple(notes))


def dispatch_decided() -> frozenset[str]:
    """Ids of the known issues a dispatch issue decides (``dispatch = …``): their token caveats give way to the
    dispatch model's per-row answer where a plan reads a tuned set the user named."""
    return frozenset(i.id for i in known_issues() if i.dispatch)


def kernel_pad_workaround(family: str, layer: MoELayer, caps: Capabilities,
                          padding: Padding) -> "KnownIssue | None":
    """The known issue (for ``family``) whose workaround is passing ``intermediate_pad=0``, if it applies."""
    for issue in issues_for(family, caps):
        if issue.fix.get("kernel_intermediate_pad") == 0 and padding.intermediate_pad > 0:
            if _matches(issue, layer, caps, padding, padding.intermediate_pad):
                return issue
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
    bias_confidence: str = "confirmed"
    #: How the kernel reads padded weights (``Padding.pad_semantics``); see :meth:`pad_semantics_for`.
    pad_semantics: str = "compute"

    #: (text, source) appended to the "activation not supported" failure, saying where the activation does run.
    activation_hint: tuple[str, str] | None = None

    # -- hooks for subclasses ---------------------------------------------------------------------------------
    def extra_checks(self, layer: MoELayer, caps: Capabilities, combo: Combo | None) -> list[Reason | str]:
        """Further failed rules (Reasons, or strings wrapped as kind ``failed``)."""
        return []

    def kernel_pads(self, layer: MoELayer, caps: Capabilities,
                    padding: Padding) -> tuple[int, int, list[Reason | str]]:
        """(kernel_hidden_pad, kernel_intermediate_pad, notes) for an aligned plan; default: the real pads."""
        return padding.hidden_pad, padding.intermediate_pad, []

    def notes(self, layer: MoELayer, caps: Capabilities, combo: Combo) -> list[Reason | str]:
        """Notes for a supported verdict (strings are wrapped as kind ``note``)."""
        return []

    def scheme_failure(self, layer: MoELayer, caps: Capabilities) -> Reason | None:
        """A specific reason replacing the generic "no kernel for weights × activations" one, or None.

        Default: a known issue of this backend (capability_db/known_issues.toml) that matches the unpadded layer
        and rejects — the table, not the plugin, holds facts such as "Triton's MXFP4 MoE skips activation QDQ"."""
        blocking = evaluate_issues(self.name, layer, caps, Padding.none(layer)).blocking
        return blocking[0] if blocking else None

    def pad_semantics_for(self, layer: MoELayer, caps: Capabilities, kernel_hidden_pad: int,
                          kernel_intermediate_pad: int) -> str:
        """How the kernel reads this plan's pads; default: the class's ``pad_semantics``."""
        return self.pad_semantics

    # -- rules --------------------------------------------------------------------------------------------------
    def combo_for(self, layer: MoELayer, caps: Capabilities) -> tuple[Combo | None, list[Reason]]:
        matches = find_combo(self.combos, layer)
        scheme = f"weights {layer.weight.dtype} × activations {layer.act.dtype}"
        if not matches:
            archs = sorted({a for c in self.combos if c.weight == layer.weight.dtype for a in c.archs})
            reasons = []
            if archs and caps.gfx not in archs:
                reasons.append(self._arch_reason(archs, f"{layer.weight.dtype} weights", caps))
            specific = self.scheme_failure(layer, caps)
            if specific is not None:
                reasons.append(specific)
            else:
                supported = sorted({f"{c.weight}×{c.act}" for c in self.combos})
                reasons.append(Reason(f"no {self.name} kernel for {scheme} (supports weight×activation: "
                                      f"{', '.join(supported)})", "failed"))
            return None, reasons
        on_arch = [c for c in matches if caps.gfx in c.archs]
        if not on_arch:
            archs = sorted({a for c in matches for a in c.archs})
            return None, [self._arch_reason(archs, f"{scheme} ({matches[0].kernel})", caps, matches[0].source)]
        return on_arch[0], []

    @staticmethod
    def _arch_reason(archs: list[str], what: str, caps: Capabilities, source: str | None = None) -> Reason:
        why = ""
        # Only when the kernel is gfx950-only is MX the reason (a16w16 CK also runs on gfx942: no MX involved).
        if archs and all(a == "gfx950" for a in archs) and not caps.native_mx and caps.gfx is not None:
            why = f" — {caps.gfx}" + (f" ({caps.family})" if caps.family else "") + \
                " has no MX/FP4 scaled-MFMA matrix instructions"
        return Reason(f"needs {' or '.join(archs)} for {what}; target is {caps.arch_label}{why}", "failed", source)

    def check(self, layer: MoELayer, caps: Capabilities) -> Verdict:
        failures: list[Reason] = []
        if self.requires_aiter and caps.aiter_version is None:
            failures.append(Reason("AITER (PyPI/ROCm distribution amd-aiter) is not available on the target"
                                   + (f": {caps.why_unknown('aiter_version')}" if caps.why_unknown("aiter_version")
                                      else ""), "failed"))
        if self.min_cdna and caps.cdna < self.min_cdna:
            failures.append(Reason(f"needs CDNA{self.min_cdna} or newer; target is {caps.arch_label}"
                                   + (f", {caps.family}" if caps.family else ""), "failed", self.arch_source or None))
        combo, why = self.combo_for(layer, caps)
        failures += why
        if layer.activation not in self.activations:
            text = f"activation {layer.activation} not supported (supports {', '.join(sorted(self.activations))})"
            source = None
            if self.activation_hint is not None:
                text, source = f"{text} — {self.activation_hint[0]}", self.activation_hint[1]
            failures.append(Reason(text, "failed", source))
        if layer.has_bias and not self.bias_supported:
            failures.append(Reason("expert bias not supported", "failed", self.bias_source or None,
                                   confidence=self.bias_confidence))
        if combo is not None and combo.feature and self.requires_aiter and caps.aiter_version is not None:
            reason = need_feature(caps, combo.feature, f"{combo.kernel}")
            if reason:
                failures.append(reason)
        failures += [Reason.coerce(r, "failed") for r in self.extra_checks(layer, caps, combo)]
        if failures:
            return Verdict(False, tuple(failures))
        assert combo is not None
        padding = self.plan_padding(layer, caps)
        outcome = evaluate_issues(self.name, layer, caps, padding)
        if outcome.blocking:
            return Verdict(False, outcome.blocking)
        notes: list[Reason] = [Reason(
            f"{combo.kernel} supports weights {layer.weight.describe()} × activations {layer.act.describe()} on "
            f"{caps.gfx}", "supports", combo.source, None, combo.confidence)]
        if combo.note:
            notes.append(Reason(combo.note, "note", combo.source, None, combo.confidence))
        for spec, what in ((layer.weight, "weights"), (layer.act, "activations")):
            if spec.dtype == "fp8" and spec.fmt == "e4m3fn" and caps.fp8_format == "e4m3fnuz":
                notes.append(Reason(
                    f"fp8 {what} are OCP e4m3fn in the checkpoint; {caps.gfx} computes in e4m3fnuz (max 240), so they "
                    "are converted at load (bit pattern reused, scales ×2: vLLM normalize_e4m3fn_to_e4m3fnuz)", "note",
                    FP8_FNUZ_SOURCE))
                break
        notes += [Reason.coerce(n, "note") for n in self.notes(layer, caps, combo)]
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
        notes: list[Reason] = []
        for issue in issues_for(self.name, caps):
            to = issue.fix.get("pad_intermediate_to")
            if to and to > inter_multiple and _matches(
                    issue, layer, caps, Padding.aligned(layer, hidden_multiple=hidden_multiple,
                                                        intermediate_multiple=inter_multiple), 0):
                inter_multiple = to
                notes.append(Reason(f"intermediate padded to a multiple of {to} to avoid [{issue.id}]", "padding",
                                    issue.source, issue.id, issue.confidence))
        alignment = Reason(
            f"{ALIGNMENT_NOTE} hidden to a multiple of {hidden_multiple}, intermediate per rank to a multiple of "
            f"{inter_multiple} ({combo.kernel} tiles); pad regions must be zero-filled (allocate with torch.zeros, "
            f"vLLM #55251)", "padding", combo.source, None, combo.confidence)
        return self.padding_at(layer, caps, hidden_multiple, inter_multiple, notes=tuple(notes),
                               alignment=alignment)

    def padding_at(self, layer: MoELayer, caps: Capabilities, hidden_multiple: int, inter_multiple: int, *,
                   notes: tuple[Reason, ...] = (), alignment: Reason | None = None) -> Padding:
        """The plan for an allocation rounded to these multiples: this backend's kernel pads (and the known-issue
        workaround that zeroes them), its pad semantics and the scale layout. ``alignment`` says why the multiples
        (the family's table, or the kernels AITER dispatches: :func:`moedispatch.selector.runtime.dispatched_padding`)."""
        plan = Padding.aligned(layer, hidden_multiple=hidden_multiple, intermediate_multiple=inter_multiple)
        kh, ki, raw_pad_notes = self.kernel_pads(layer, caps, plan)
        pad_notes = [Reason.coerce(n, "padding") for n in raw_pad_notes]
        issue = kernel_pad_workaround(self.name, layer, caps,
                                      Padding.aligned(layer, hidden_multiple=hidden_multiple,
                                                      intermediate_multiple=inter_multiple,
                                                      kernel_intermediate_pad=ki))
        if issue is not None and ki:
            ki = 0
            pad_notes = [Reason(f"kernel intermediate pad 0 (the workaround of [{issue.id}]): the kernel computes "
                                f"over the zero-filled intermediate pad" + (f"; hidden pad {kh} is still passed"
                                                                            if kh else ""),
                                "padding", issue.source, issue.id, issue.confidence)]
        out = list(notes)
        if plan.padded:
            if alignment is not None:
                out.insert(0, alignment)
            out += _scale_notes(layer, plan)
        return Padding.aligned(layer, hidden_multiple=hidden_multiple, intermediate_multiple=inter_multiple,
                               kernel_hidden_pad=kh, kernel_intermediate_pad=ki, notes=tuple(out + pad_notes),
                               pad_semantics=self.pad_semantics_for(layer, caps, kh, ki))


@memoize(maxsize=4096)
def _planned(backend: RuleBackend, layer: MoELayer, caps: Capabilities) -> Padding:
    return backend._plan_padding(layer, caps)


def _scale_notes(layer: MoELayer, plan: Padding) -> list[Reason]:
    """How the scale tensors follow the padded weights (pad at the end of each gate/up half)."""
    h, i = plan.hidden, plan.intermediate_per_rank
    e = layer.experts_per_rank
    if layer.weight.is_mx:
        return [Reason(
            f"scales: one E8M0 byte per 32 elements along K — w13 scales [{e}, 2×{i}, {h // 32}], w2 scales "
            f"[{e}, {h}, {i // 32}]; pad scale entries must be finite (0x00 = 2^-127 or 0x7F = 1.0), never 0xFF: "
            f"that is NaN in E8M0 and NaN × 0 = NaN", "padding", OCP_MX_SPEC)]
    if layer.weight.block:
        bn, bk = layer.weight.block
        return [Reason(
            f"block scales: fp32 per {bn}×{bk} tile of the padded weights — w13 [{e}, 2×{-(-i // bn)}, "
            f"{-(-h // bk)}], w2 [{e}, {-(-h // bn)}, {-(-i // bk)}]; tiles that cover only padding hold zeros",
            "padding", SGLANG_SCALE_PAD, None, "derived")]
    return []
