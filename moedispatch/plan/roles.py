"""Roles of a deployment (issue 25 item 2): ``--role NAME:tp=…,ep=…,dp=…,tokens=LO-HI``.

Prefill and decode run different token buckets (InferenceX's AMD disaggregated recipes give decode budgets 16–128×
smaller), so AITER may run other kernels in each, with other known issues, and the least allocation every kernel can
tile (the padding) may differ. Each role is planned for its own range: its :class:`~moedispatch.core.workload.Runtime`
carries the range (``serving``) and the planned counts are AITER's buckets in it.

Who calls what::

    from moedispatch.plan.roles import parse_role, plan_roles, role_differences
    roles = [parse_role("decode:tp=8,tokens=1-512"), parse_role("prefill:tp=8,tokens=1024-16384")]
    plans = plan_roles(model, caps, roles, env=os.environ)      # [(Role, Plan), …]
    role_differences(plans)                                      # what differs between the roles, per layer group
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from moedispatch.core.errors import UsageError
from moedispatch.core.workload import Runtime, parse_tokens
from moedispatch.plan.plan import Plan, plan_model, plan_to_json

__all__ = ["Role", "parse_role", "check_roles", "plan_roles", "role_differences", "roles_to_json", "group_view",
           "MAX_ROLES"]

#: More roles than any disaggregated deployment has (prefill, decode, an encoder, a spare).
MAX_ROLES = 8
_KEYS = {"tp", "ep", "dp", "tokens", "nodes"}
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_.-]{0,31}")


@dataclass(frozen=True)
class Role:
    name: str
    tp: int = 1
    ep: int = 1
    dp: int = 1
    lo: int = 1
    hi: int = 8192
    #: Which nodes of a fleet run the role (a glob on node names; ``moedispatch fleet``).
    nodes: str = "*"

    def describe(self) -> str:
        where = f", nodes {self.nodes}" if self.nodes != "*" else ""
        return f"{self.name}: tp={self.tp} ep={self.ep} dp={self.dp}, tokens {self.lo}–{self.hi}{where}"

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "tp": self.tp, "ep": self.ep, "dp": self.dp, "tokens": [self.lo, self.hi],
                "nodes": self.nodes}


def parse_role(text: str) -> Role:
    """``NAME:tp=8,ep=1,dp=1,tokens=LO-HI[,nodes=GLOB]`` (every key optional but ``tokens``); bad input is a one-line
    UsageError."""
    name, sep, body = str(text).partition(":")
    name = name.strip()
    if not sep or not _NAME.fullmatch(name):
        raise UsageError(f"--role {text!r}: expected NAME:tp=…,ep=…,dp=…,tokens=LO-HI (e.g. "
                         "decode:tp=8,tokens=1-512)")
    values: dict[str, str] = {}
    for item in body.split(","):
        key, eq, value = item.strip().partition("=")
        if not eq or key not in _KEYS:
            raise UsageError(f"--role {text!r}: {item.strip()!r} is not one of {', '.join(sorted(_KEYS))}=VALUE")
        if key in values:
            raise UsageError(f"--role {text!r}: {key} given twice")
        values[key] = value.strip()
    if "tokens" not in values:
        raise UsageError(f"--role {text!r}: tokens=LO-HI is required (the token range this role serves)")
    ints: dict[str, int] = {}
    for key in ("tp", "ep", "dp"):
        if key in values:
            try:
                ints[key] = int(values[key])
            except ValueError:
                raise UsageError(f"--role {text!r}: {key}={values[key]!r} is not an integer") from None
            if not 1 <= ints[key] <= 1024:
                raise UsageError(f"--role {text!r}: {key}={ints[key]} is outside 1–1024")
    lo_s, dash, hi_s = values["tokens"].partition("-")
    try:
        lo, hi = int(lo_s), int(hi_s if dash else lo_s)
    except ValueError:
        raise UsageError(f"--role {text!r}: tokens={values['tokens']!r} is not LO-HI") from None
    parse_tokens(f"{lo}-{hi}")  # the same bounds as --tokens (positive, increasing, a batch an engine can form)
    nodes = values.get("nodes", "*")
    if not nodes:
        raise UsageError(f"--role {text!r}: nodes= needs a glob on node names (e.g. nodes=prefill-*)")
    return Role(name, ints.get("tp", 1), ints.get("ep", 1), ints.get("dp", 1), lo, hi, nodes)


def check_roles(roles: Sequence[Role]) -> None:
    """At least one role, at most :data:`MAX_ROLES`, no name twice (what ``explain --role`` and ``fleet --role``
    both accept); a one-line UsageError otherwise."""
    if not roles:
        raise UsageError("no roles to plan")
    if len(roles) > MAX_ROLES:
        raise UsageError(f"{len(roles)} roles; at most {MAX_ROLES}")
    names = [r.name for r in roles]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"--role names must differ: {', '.join(dup)} given twice")


def plan_roles(model: Any, caps: Any, roles: Sequence[Role], *, env: Mapping[str, str] | None = None,
               overrides: Mapping[str, str] | None = None, **plan_kwargs: Any) -> list[tuple[Role, Plan]]:
    """One plan per role, each for AITER's buckets in the role's token range and padded for that range."""
    check_roles(roles)
    out = []
    for role in roles:
        runtime = Runtime.build(parse_tokens(f"{role.lo}-{role.hi}"), env=env, overrides=overrides,
                                serving=(role.lo, role.hi))
        out.append((role, plan_model(model, caps, role.tp, role.ep, runtime=runtime, **plan_kwargs)))
    return out


def group_view(plan: Plan) -> list[dict[str, Any]]:
    seen: dict[tuple, dict[str, Any]] = {}
    for d in plan.decisions:
        if d.layer.kind != "moe":
            continue
        key = d.layer.signature()
        if key in seen:
            seen[key]["layers"].append(d.layer.index)
            continue
        runs = [] if d.dispatch is None else [
            f"{s.family} {s.tokens[0]}–{s.tokens[1]}" for s in d.dispatch.steps]
        issues = [] if d.dispatch is None else sorted({h.issue for h in d.dispatch.issues})
        why = next((r.text for r in d.padding.notes if r.text.startswith(("padded to", "no padding", "allocate"))),
                   None)
        seen[key] = {"layers": [d.layer.index], "backend": d.backend, "padding_why": why,
                     "allocation": [d.padding.hidden, d.padding.intermediate_per_rank],
                     "runs": runs, "issues": issues,
                     "env": sorted({f"{k}={v}" for h in (d.dispatch.issues if d.dispatch else ())
                                    for k, v in h.workaround_env})}
    return list(seen.values())


def role_differences(plans: Sequence[tuple[Role, Plan]]) -> list[str]:
    """One line per thing that differs between the roles' plans (backend, allocation, the families AITER runs, the
    known issues met, the environment workarounds), per MoE layer group; [] when the roles agree."""
    views = [(role, group_view(plan)) for role, plan in plans]
    out: list[str] = []
    if len(views) < 2:
        return out
    width = max(len(v) for _, v in views)
    for i in range(width):
        groups = [(role, v[i]) for role, v in views if i < len(v)]
        for field, what in (("backend", "backend"), ("allocation", "allocation hidden × intermediate/rank"),
                            ("issues", "known kernel × bucket issues met"), ("env", "environment workarounds")):
            vals = {role.name: g[field] for role, g in groups}
            if len({repr(v) for v in vals.values()}) > 1:
                first = groups[0][1]["layers"]
                out.append(f"layers {first[0]}–{first[-1]}: {what} differ — "
                           + "; ".join(f"{n}: {_fmt(v)}" for n, v in vals.items()))
                if field == "allocation":
                    out += [f"  {role.name}: {g['padding_why']}" for role, g in groups if g["padding_why"]]
    return out


def _fmt(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(x, int) for x in value):
        return " × ".join(map(str, value))
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def roles_to_json(plans: Sequence[tuple[Role, Plan]]) -> dict[str, Any]:
    return {"schema": "moedispatch.roles/1",
            "roles": [{**role.to_dict(), "decision_fingerprint": plan.decision_fingerprint,
                       "groups": group_view(plan), "plan": plan_to_json(plan)} for role, plan in plans],
            "differences": role_differences(plans)}
