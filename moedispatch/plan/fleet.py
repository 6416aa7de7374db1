"""A fleet from probe files (issue 25 item 4): one plan per node and role, and whether the nodes of a role agree.

``moedispatch probe --format json`` on each node (Slurm ``srun``, an init container) writes what the node is (GPUs,
partition, AITER release) and the AITER/engine environment its processes see; ``moedispatch fleet --from
'probes/*.json' --model REF [--role …]`` plans each node for each role and compares their decision fingerprints
(:attr:`moedispatch.plan.plan.Plan.decision_fingerprint`: what must agree across ranks, not how a target was named).
A role whose nodes disagree, or a node that cannot run its role's plan, makes the fleet exit 3 with what differs.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

from moedispatch.core.errors import MoedispatchError, UsageError
from moedispatch.core.workload import Runtime, parse_tokens
from moedispatch.data.capdb import target_capabilities
from moedispatch.plan.plan import Plan, plan_model
from moedispatch.plan.roles import Role

__all__ = ["Node", "load_nodes", "node_from_probe", "plan_fleet", "FleetReport", "MAX_NODES"]

MAX_NODES = 4096
PROBE_SCHEMA = "moedispatch.probe/1"


@dataclass(frozen=True)
class Node:
    """One node as its probe file describes it: ``target`` (product[:partition] or gfx), the AITER release, the
    environment its engine processes see, and the file it came from."""

    name: str
    target: str
    aiter_version: str | None
    env: tuple[tuple[str, str], ...]
    source: str

    def describe(self) -> str:
        return f"{self.target}, AITER {self.aiter_version or 'none'}"


def node_from_probe(doc: Any, source: str) -> Node:
    """A :class:`Node` from a ``moedispatch.probe/1`` document; a file that is not one is a one-line UsageError."""
    if not isinstance(doc, dict) or doc.get("schema") != PROBE_SCHEMA:
        raise UsageError(f"{source}: not a moedispatch probe file (schema {PROBE_SCHEMA}); write one with "
                         "`moedispatch probe --format json > FILE` on the node")
    override = doc.get("target_override")
    gpus = doc.get("gpus") or []
    if override:
        target = str(override.get("value") if isinstance(override, dict) else override)
    elif gpus:
        archs = sorted({g.get("gfx") for g in gpus if isinstance(g, dict)})
        if len(archs) > 1:
            raise UsageError(f"{source}: GPUs of different archs ({', '.join(map(str, archs))}) on one node: plan "
                             "each with MOEDISPATCH_TARGET, or split the node")
        g = gpus[0]
        target = g.get("product") or g.get("gfx")
        if g.get("partition") and g.get("product"):
            target = f"{g['product']}:{g['partition']}"
    else:
        raise UsageError(f"{source}: the probe found no GPU and no MOEDISPATCH_TARGET: the node cannot be planned")
    aiter = doc.get("aiter") or {}
    version = (aiter.get("version") or {}).get("value") if aiter.get("installed") else None
    env = doc.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise UsageError(f"{source}: env must map variable names to strings")
    name = str((doc.get("node") or {}).get("host") or os.path.splitext(os.path.basename(source))[0])
    return Node(name, str(target), version, tuple(sorted(env.items())), source)


def load_nodes(pattern: str) -> list[Node]:
    """The nodes of every probe file matching ``pattern`` (a glob); names must differ (a host twice is an error)."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise UsageError(f"--from {pattern!r}: no file matches")
    if len(paths) > MAX_NODES:
        raise UsageError(f"--from {pattern!r}: {len(paths)} files; at most {MAX_NODES}")
    nodes = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as fh:
                doc = json.load(fh)
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise UsageError(f"{path}: cannot read a probe file: {exc}") from None
        nodes.append(node_from_probe(doc, path))
    names = [n.name for n in nodes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UsageError(f"--from {pattern!r}: node {dup[0]} appears in two probe files")
    return nodes


@dataclass
class RoleResult:
    role: Role
    plans: dict[str, Plan] = field(default_factory=dict)      # node name → plan
    errors: dict[str, str] = field(default_factory=dict)      # node name → why it cannot be planned

    def groups(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, plan in self.plans.items():
            out.setdefault(plan.decision_fingerprint, []).append(name)
        return out


@dataclass
class FleetReport:
    nodes: list[Node]
    roles: list[RoleResult]
    #: The engine release the nodes launch (``--engine E[@V]``) and, per (role, node), why that release cannot
    #: launch the node's plan (filled by :func:`moedispatch.engines.fleet.check_engine`).
    engine: str | None = None
    engine_errors: dict[tuple[str, str], str] = field(default_factory=dict)

    def problems(self) -> list[str]:
        """Why the fleet is not ready (exit 3), one line each; [] when every role's nodes agree and run."""
        by_name = {n.name: n for n in self.nodes}
        out: list[str] = []
        for r in self.roles:
            for name, why in r.errors.items():
                out.append(f"role {r.role.name}: node {name} cannot be planned: {why}")
            for name, plan in r.plans.items():
                missing = [d.layer.index for d in plan.decisions if d.layer.kind == "moe" and d.backend is None]
                if missing:
                    out.append(f"role {r.role.name}: node {name} ({by_name[name].describe()}) has no correct MoE "
                               f"backend for {len(missing)} layer(s)")
            for (role, name), why in self.engine_errors.items():
                if role == r.role.name:
                    out.append(f"role {r.role.name}: node {name}: {self.engine} cannot launch its plan: {why}")
            groups = r.groups()
            if len(groups) > 1:
                ranked = sorted(groups.values(), key=len, reverse=True)
                major = ranked[0]
                for other in ranked[1:]:
                    out.append(f"role {r.role.name}: node(s) {', '.join(other)} plan differently from "
                               f"{', '.join(major)}: " + _what_differs(by_name[major[0]], by_name[other[0]],
                                                                      r.plans[major[0]], r.plans[other[0]]))
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "moedispatch.fleet/1", "engine": self.engine,
                "nodes": [{"name": n.name, "target": n.target, "aiter_version": n.aiter_version,
                           "env": dict(n.env), "source": n.source} for n in self.nodes],
                "roles": [{**r.role.to_dict(), "errors": r.errors,
                           "nodes": {name: {"decision_fingerprint": p.decision_fingerprint,
                                            "moe": _moe_summary(p)} for name, p in r.plans.items()},
                           "agree": len(r.groups()) <= 1 and not r.errors} for r in self.roles],
                "problems": self.problems()}


def _moe_summary(plan: Plan) -> list[str]:
    seen: dict[tuple, str] = {}
    for d in plan.decisions:
        if d.layer.kind == "moe":
            seen.setdefault(d.layer.signature(), f"{d.backend or 'none'} {d.padding.hidden}×"
                                                 f"{d.padding.intermediate_per_rank}")
    return list(seen.values())


def _what_differs(a: Node, b: Node, pa: Plan, pb: Plan) -> str:
    parts = []
    if a.target != b.target:
        parts.append(f"target {a.target} vs {b.target}")
    if a.aiter_version != b.aiter_version:
        parts.append(f"AITER {a.aiter_version or 'none'} vs {b.aiter_version or 'none'}")
    ea, eb = dict(a.env), dict(b.env)
    env = sorted(k for k in set(ea) | set(eb) if ea.get(k) != eb.get(k))
    if env:
        parts.append("environment " + ", ".join(f"{k}={ea.get(k, '(unset)')} vs {eb.get(k, '(unset)')}"
                                                 for k in env))
    sa, sb = _moe_summary(pa), _moe_summary(pb)
    if sa != sb:
        parts.append(f"MoE plan {'; '.join(sa)} vs {'; '.join(sb)}")
    return "; ".join(parts) or "the decision fingerprints differ"


def plan_fleet(model: Any, nodes: Sequence[Node], roles: Sequence[Role], **plan_kwargs: Any) -> FleetReport:
    """Each role planned on each node it runs on (:attr:`Role.nodes`, a glob on node names)."""
    results = []
    for role in roles:
        pattern = role.nodes
        members = [n for n in nodes if fnmatch.fnmatchcase(n.name, pattern)]
        if not members:
            raise UsageError(f"role {role.name}: nodes={pattern!r} matches none of {', '.join(n.name for n in nodes)}")
        res = RoleResult(role)
        for n in members:
            try:
                caps = target_capabilities(n.target, n.aiter_version)
                runtime = Runtime.build(parse_tokens(f"{role.lo}-{role.hi}"), env=dict(n.env),
                                        serving=(role.lo, role.hi))
                res.plans[n.name] = plan_model(model, caps, role.tp, role.ep, runtime=runtime, **plan_kwargs)
            except MoedispatchError as exc:
                res.errors[n.name] = str(exc)
        results.append(res)
    return FleetReport(list(nodes), results)
