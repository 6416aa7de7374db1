"""Known kernel × token-bucket issues (``capability_db/dispatch_issues.toml``): the entry (:class:`DispatchIssue`),
what a plan reports when it hits one (:class:`IssueHit`), loading and checking the table (:func:`dispatch_issues`),
matching an entry against one simulated step (:func:`_issue_matches`) and the hits over a plan's steps
(:func:`evaluate_issues`)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any, Iterable

from moedispatch._util.caches import memoize
from moedispatch.aiter.activation import acting_env
from moedispatch.aiter.key import DispatchKey
from moedispatch.core.aiter_release import in_range, range_problem
from moedispatch.aiter.steps import DispatchStep
from moedispatch.core.errors import CapabilityDBError
from moedispatch.data import capdb


@dataclass(frozen=True)
class DispatchIssue:
    """One known issue keyed on kernel × token bucket × AITER version (capability_db/dispatch_issues.toml)."""

    id: str
    title: str
    source: str
    status: str
    kernel: str
    effect: str
    workaround: str
    confidence: str
    severity: str
    stage: int | None = None
    buckets: tuple[int, ...] = ()
    tokens_min: int | None = None
    tokens_max: int | None = None
    gfx: tuple[str, ...] = ()
    aiter: str = ""
    basis: str | None = None
    stages: int | None = None
    q_type: str | None = None
    q_dtype_a: tuple[str, ...] = ()
    q_dtype_w: str | None = None
    act_type: str | None = None
    shape: tuple[tuple[str, int], ...] = ()
    inter_dim_multiple_of: int | None = None
    inter_dim_not_multiple_of: int | None = None
    intermediate_pad_min: int | None = None
    block_m: int | None = None
    ep: bool | None = None
    workaround_env: tuple[tuple[str, str], ...] = ()
    token_cap: int | None = None
    fixed_by: str | None = None
    #: step.ksplit at least this (split-K in use)
    ksplit_min: int | None = None
    #: model_dim // (ksplit * k_per_block[block_m]) at most this: k-tiles per split (CK stage 1's KBatch)
    k_tiles_per_split_max: int | None = None
    k_per_block: tuple[tuple[int, int], ...] = ()
    #: the deciding tuned row has flat >= 1 (a FLAT 1-stage ASM kernel: no external moe_sort)
    row_flat: bool | None = None
    #: AITER raises (or refuses to launch) instead of computing: see IssueHit.raises
    raises: bool = False
    #: How a plan may pin a correct kernel for the bucket instead (:mod:`moedispatch.aiter.pin`): ``neighbour`` =
    #: the kernel the same key's nearest clean bucket uses, written to an AITER_CONFIG_FMOE file. None: no pin.
    pin: str | None = None


@dataclass(frozen=True)
class IssueHit:
    """A known issue that AITER's dispatch would hit: which tokens/bucket, what happens, what to do."""

    issue: str
    tokens: tuple[int, int]
    bucket: int
    kernel: str
    effect: str
    workaround: str
    workaround_env: tuple[tuple[str, str], ...]
    token_cap: int | None
    source: str
    confidence: str
    severity: str
    #: The change that fixes it upstream (dispatch_issues.toml ``fixed_by``), when one is known.
    fixed_by: str | None = None
    #: AITER raises (or cannot launch) for these tokens instead of running: the path is rejected whatever the
    #: workaround (which then names the configuration that does run).
    raises: bool = False

    @property
    def has_workaround(self) -> bool:
        return bool(self.workaround_env or self.token_cap or self.workaround)

    @property
    def blocking(self) -> bool:
        """The path cannot be planned: AITER raises and no environment/token cap makes it run (a recipe exports
        those), or a known wrong-output kernel has no workaround at all."""
        if self.severity != "error":
            return False
        if self.raises:
            return not (self.workaround_env or self.token_cap)
        return not self.has_workaround

    def handled_by(self, env: Any, max_tokens: int | None) -> bool:
        """Whether a launch with this environment and batch cap stays clear of the issue: it sets every variable of
        the environment workaround, or caps the batch (``--max-num-batched-tokens`` / ``--chunked-prefill-size``, a
        role's largest token count) at or below the issue's token cap."""
        env_fix = dict(self.workaround_env)
        if env_fix and all(str(env.get(k, "")) == v for k, v in env_fix.items()):
            return True
        return bool(self.token_cap and max_tokens is not None and max_tokens <= self.token_cap)

    def to_dict(self) -> dict[str, Any]:
        return {"issue": self.issue, "tokens": list(self.tokens), "bucket": self.bucket, "kernel": self.kernel,
                "effect": self.effect, "workaround": self.workaround, "workaround_env": dict(self.workaround_env),
                "token_cap": self.token_cap, "source": self.source, "confidence": self.confidence,
                "severity": self.severity, "fixed_by": self.fixed_by, "raises": self.raises}


# -- known dispatch issues ----------------------------------------------------------------------------------------

_ISSUE_FIELDS = {"id": str, "title": str, "source": str, "status": str, "kernel": str, "effect": str,
                 "workaround": str, "confidence": str, "severity": str}


@memoize(maxsize=1)
def dispatch_issues() -> tuple[DispatchIssue, ...]:
    """capability_db/dispatch_issues.toml, checked at load (a broken entry raises CapabilityDBError naming it)."""
    where = "capability_db/dispatch_issues.toml"
    data = capdb.load_toml("dispatch_issues.toml")
    items = data.get("issue")
    if not isinstance(items, list) or not items:
        raise CapabilityDBError(f"{where}: no [[issue]] entries")
    out = []
    for n, raw in enumerate(items):
        at = f"{where}: issue[{n}]"
        if not isinstance(raw, dict):
            raise CapabilityDBError(f"{at} must be a table")
        for name, kind in _ISSUE_FIELDS.items():
            if not isinstance(raw.get(name), kind):
                raise CapabilityDBError(f"{at} ({raw.get('id', '?')}): {name} must be a string")
        if raw["confidence"] not in ("confirmed", "derived", "unconfirmed"):
            raise CapabilityDBError(f"{at} ({raw['id']}): confidence must be confirmed|derived|unconfirmed")
        if raw["severity"] not in ("error", "warning", "info"):
            raise CapabilityDBError(f"{at} ({raw['id']}): severity must be error|warning|info")
        try:
            re.compile(raw["kernel"])
        except re.error as exc:
            raise CapabilityDBError(f"{at} ({raw['id']}): kernel is not a regular expression: {exc}") from None
        if raw.get("aiter") and range_problem(raw["aiter"]):
            raise CapabilityDBError(f"{at} ({raw['id']}): aiter = {raw['aiter']!r} is not a release range: "
                                    f"{range_problem(raw['aiter'])}")
        if raw.get("pin") not in (None, "neighbour"):
            raise CapabilityDBError(f"{at} ({raw['id']}): pin must be \"neighbour\" (or absent)")
        known = set(DispatchIssue.__dataclass_fields__)
        extra = set(raw) - known
        if extra:
            raise CapabilityDBError(f"{at} ({raw['id']}): unknown key(s) {', '.join(sorted(extra))}")
        values = dict(raw)
        for name in ("buckets", "gfx", "q_dtype_a"):
            if name in values:
                values[name] = tuple(values[name])
        if "shape" in values:
            values["shape"] = tuple(sorted(values["shape"].items()))
        if "workaround_env" in values:
            values["workaround_env"] = tuple(sorted((k, str(v)) for k, v in values["workaround_env"].items()))
        if "k_per_block" in values:
            try:
                values["k_per_block"] = tuple(sorted((int(k), int(v)) for k, v in values["k_per_block"].items()))
            except (AttributeError, ValueError):
                raise CapabilityDBError(f"{at} ({raw['id']}): k_per_block must map block_m to K per block") from None
        try:
            out.append(DispatchIssue(**values))
        except TypeError as exc:
            raise CapabilityDBError(f"{at} ({raw['id']}): {exc}") from None
    return tuple(out)


def _issue_matches(issue: DispatchIssue, step: DispatchStep, key: DispatchKey, version: str | None) -> str | None:
    """The kernel name the issue matches in this (ungrouped) step, or None."""
    if issue.gfx and key.gfx not in issue.gfx:
        return None
    if issue.aiter:
        if version is None:
            return None
        if not in_range(version, issue.aiter):
            return None
    if issue.buckets and step.bucket not in issue.buckets:
        return None
    if issue.tokens_min is not None and step.tokens[1] < issue.tokens_min:
        return None
    if issue.tokens_max is not None and step.tokens[0] > issue.tokens_max:
        return None
    if issue.basis and step.basis != issue.basis:
        return None
    if issue.stages and step.stages != issue.stages:
        return None
    if issue.q_type and key.q_type != issue.q_type:
        return None
    if issue.q_dtype_w and key.q_dtype_w != issue.q_dtype_w:
        return None
    if issue.q_dtype_a and step.q_dtype_a not in issue.q_dtype_a:
        return None
    if issue.act_type and key.act_type != issue.act_type:
        return None
    for name, value in issue.shape:
        if getattr(key, name) != value:
            return None
    if issue.inter_dim_multiple_of and key.inter_dim % issue.inter_dim_multiple_of:
        return None
    if issue.inter_dim_not_multiple_of and key.inter_dim % issue.inter_dim_not_multiple_of == 0:
        return None
    if issue.intermediate_pad_min is not None and key.intermediate_pad < issue.intermediate_pad_min:
        return None
    if issue.block_m is not None and step.block_m != issue.block_m:
        return None
    if issue.ep is not None and key.is_ep != issue.ep:
        return None
    if issue.ksplit_min is not None and step.ksplit < issue.ksplit_min:
        return None
    if issue.k_tiles_per_split_max is not None:
        kpb = dict(issue.k_per_block).get(step.block_m or 0)
        if not kpb or step.ksplit < 2 or key.model_dim // (step.ksplit * kpb) > issue.k_tiles_per_split_max:
            return None
    if issue.row_flat is not None and (step.row is not None and step.row.flat >= 1) != issue.row_flat:
        return None
    pattern = re.compile(issue.kernel)
    kernels = step.kernels if issue.stage is None else step.kernels[issue.stage - 1: issue.stage]
    for name in kernels:
        if pattern.search(name):
            return name
    return None


def evaluate_issues(steps: Iterable[DispatchStep], key: DispatchKey, aiter_version: str | None,
                    issues: Iterable[DispatchIssue] | None = None) -> tuple[IssueHit, ...]:
    """Known issues hit by the simulated dispatch, one hit per (issue, consecutive token range)."""
    hits: list[IssueHit] = []
    steps = tuple(steps)
    for issue in (dispatch_issues() if issues is None else issues):
        last = -2  # index of the step that made hits[-1]: a range merges only consecutive steps
        for i, step in enumerate(steps):
            name = _issue_matches(issue, step, key, aiter_version)
            if name is None:
                continue
            prev = hits[-1] if hits else None
            if prev and last == i - 1 and prev.issue == issue.id and prev.kernel == name:
                hits[-1] = replace(prev, tokens=(prev.tokens[0], step.tokens[1]))
                last = i
                continue
            last = i
            hits.append(IssueHit(issue=issue.id, tokens=step.tokens, bucket=step.bucket, kernel=name,
                                 effect=issue.effect, workaround=issue.workaround,
                                 workaround_env=acting_env(issue.workaround_env, key), token_cap=issue.token_cap,
                                 source=issue.source, confidence=issue.confidence, severity=issue.severity,
                                 fixed_by=issue.fixed_by, raises=issue.raises))
    return tuple(hits)
