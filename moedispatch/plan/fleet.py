"""A fleet from probe files (issue 25 item 4): one plan per node and role, and whether the nodes of a role agree.

``moedispatch probe --format json`` on each node (Slurm ``srun``, an init container) writes what the node is (GPUs,
partition, AITER release) and the AITER/engine environment its processes see; ``moedispatch fleet --from
'probes/*.json' --model REF [--role …]`` plans each node for each role and compares their decision fingerprints
(:attr:`moedispatch.plan.plan.Plan.decision_fingerprint`: what must agree across ranks, not how a target was named).
A role whose nodes disagree, or a node that cannot run its role's plan, makes the fleet exit 3 with what differs.

``moedispatch fleet --ray [ADDRESS|auto]`` (:mod:`moedispatch.plan.fleet_ray`) gathers the same probe documents from
every alive node of a Ray cluster instead of from files; everything after the nodes are collected is this module.
"""

from __future__ import annotations

import fnmatch
import glob
import json
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from moedispatch.core.errors import MoedispatchError, UsageError
from moedispatch.core.workload import Runtime, parse_tokens
from moedispatch.data.aiter_configs import split_env_paths
from moedispatch.data.capdb import default_aiter_version, parse_aiter_version, target_capabilities
from moedispatch.plan.plan import Plan, plan_model
from moedispatch.plan.roles import Role, check_roles

__all__ = ["Node", "load_nodes", "node_from_probe", "plan_fleet", "selects", "FleetReport", "MAX_NODES", "names"]

MAX_NODES = 4096
#: A probe document is a few KB; anything much larger is not one (and /dev/zero would never end).
MAX_PROBE_BYTES = 16 << 20
#: How many node names one line of the text report lists before it counts the rest (the JSON lists every node).
NAMES_SHOWN = 5
PROBE_SCHEMA = "moedispatch.probe/1"
#: The node's own choice of AITER release to plan for (README "explain"; moedispatch.probe.targets.cli_aiter_version).
AITER_VERSION_ENV = "MOEDISPATCH_AITER_VERSION"
TARGET_ENV = "MOEDISPATCH_TARGET"


@dataclass(frozen=True)
class Node:
    """One node as its probe file describes it: ``target`` (product[:partition] or gfx), the AITER release it serves
    with (None: no AITER on the node — planned without AITER, as its engines will run, not as the newest release), the
    environment its engine processes see, and the file it came from."""

    name: str
    target: str
    aiter_version: str | None
    env: tuple[tuple[str, str], ...]
    source: str
    #: Labels of the node (a Ray node's labels; ``node.labels`` of a probe file): ``--role …,nodes=label:K=V``.
    labels: tuple[tuple[str, str], ...] = ()

    def describe(self) -> str:
        return f"{self.target}, AITER {self.aiter_version or 'none'}"


def node_from_probe(doc: Any, source: str) -> Node:
    """A :class:`Node` from a ``moedispatch.probe/1`` document; a file that is not one is a one-line UsageError."""
    if not isinstance(doc, dict) or doc.get("schema") != PROBE_SCHEMA:
        raise UsageError(f"{source}: not a moedispatch probe file (schema {PROBE_SCHEMA}); write one with "
                         "`moedispatch probe --format json > FILE` on the node")
    override = doc.get("target_override")
    gpus = doc.get("gpus") or []
    if not isinstance(gpus, list) or not all(isinstance(g, dict) for g in gpus):
        raise UsageError(f"{source}: gpus must be a list of objects ({{\"gfx\": …, \"product\": …}})")
    if override:
        target = override.get("value") if isinstance(override, dict) else override
        if not isinstance(target, str) or not target.strip():
            raise UsageError(f"{source}: target_override.value is not a target name (got {target!r:.60}); "
                             "`moedispatch probe --format json` writes {\"value\": \"MI300X\", …}")
        target = target.strip()
    elif gpus:
        archs = sorted({str(g.get("gfx")) for g in gpus})
        if len(archs) > 1:
            raise UsageError(f"{source}: GPUs of different archs ({', '.join(archs)}) on one node: plan "
                             "each with MOEDISPATCH_TARGET, or split the node")
        g = gpus[0]
        target = g.get("product") or g.get("gfx")
        if not isinstance(target, str) or not target:
            raise UsageError(f"{source}: gpus[0] names no gfx or product")
        if g.get("partition") and g.get("product"):
            target = f"{g['product']}:{g['partition']}"
    else:
        raise UsageError(f"{source}: the probe found no GPU and no MOEDISPATCH_TARGET: the node cannot be planned")
    aiter = doc.get("aiter") or {}
    if not isinstance(aiter, dict):
        raise UsageError(f"{source}: aiter must be an object ({{\"installed\": …, \"version\": {{\"value\": …}}}})")
    version = None   # no AITER on the node: planned without it (never as the newest release)
    if not isinstance(aiter.get("installed", False), bool):
        raise UsageError(f"{source}: aiter.installed must be true or false (got {aiter.get('installed')!r:.60})")
    if aiter.get("installed"):
        found = aiter.get("version")
        value = found.get("value") if isinstance(found, dict) else None
        if not isinstance(value, str) or not value.strip():
            raise UsageError(f"{source}: aiter.installed is true but aiter.version.value is not a version string "
                             f"(got {found!r:.60})")
        version = value.strip()
        try:
            parse_aiter_version(version)
        except MoedispatchError:
            raise UsageError(f"{source}: aiter.version.value {version!r:.60} is not a PEP 440 version "
                             "(e.g. 0.1.20.post1)") from None
    env = doc.get("env") or {}
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise UsageError(f"{source}: env must map variable names to strings")
    # The node plans for the AITER its own CLI would: MOEDISPATCH_AITER_VERSION in its environment wins over the
    # probed files ('default' = the newest capability_db knows), as moedispatch.probe.targets.cli_aiter_version does.
    override = env.get(AITER_VERSION_ENV, "").strip()
    if override and override.lower() != "installed":
        version = default_aiter_version() if override.lower() == "default" else \
            None if override.lower() in ("none", "absent", "no") else override
    node = doc.get("node") or {}
    if not isinstance(node, dict):
        raise UsageError(f"{source}: node must be an object ({{\"host\": …}})")
    labels = node.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise UsageError(f"{source}: node.labels must map label names to strings")
    name = str(node.get("name") or node.get("host") or os.path.splitext(os.path.basename(source))[0])
    if not name.isprintable():   # a name is printed as is: no terminal escapes, no line breaks in the report
        raise UsageError(f"{source}: node name {name!r:.80} has control characters")
    return Node(name, str(target), version, tuple(sorted(env.items())), source, tuple(sorted(labels.items())))


def load_nodes(pattern: str) -> list[Node]:
    """The nodes of every probe file matching ``pattern`` (a glob); names must differ (a host twice is an error)."""
    paths = sorted(glob.glob(pattern))
    if not paths:
        raise UsageError(f"--from {pattern!r}: no file matches")
    if len(paths) > MAX_NODES:
        raise UsageError(f"--from {pattern!r}: {len(paths)} files; at most {MAX_NODES}")
    nodes = []
    seen: dict[str, str] = {}
    for path in paths:
        node = node_from_probe(_read_probe(path), path)
        if node.name in seen:
            raise UsageError(f"--from {pattern!r}: node {node.name} appears in two probe files ({seen[node.name]} "
                             f"and {path})")
        seen[node.name] = path
        nodes.append(node)
    return nodes


def _read_probe(path: str) -> Any:
    """The JSON of one probe file: a regular file (a FIFO would block ``open`` for ever) of at most
    :data:`MAX_PROBE_BYTES`; anything else is a one-line UsageError naming the file."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise UsageError(f"{path}: not a regular file (a probe file is what `moedispatch probe --format json` "
                             "writes)")
        if st.st_size > MAX_PROBE_BYTES:
            raise UsageError(f"{path}: {st.st_size} bytes is too large for a probe file (at most {MAX_PROBE_BYTES})")
        with open(path, "rb") as fh:
            raw = fh.read(MAX_PROBE_BYTES + 1)
        return json.loads(raw.decode("utf-8"))
    except RecursionError:
        raise UsageError(f"{path}: cannot read a probe file: its JSON nests too deeply") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UsageError(f"{path}: cannot read a probe file: {exc}") from None


@dataclass
class RoleResult:
    role: Role
    plans: dict[str, Plan] = field(default_factory=dict)      # node name → plan
    errors: dict[str, str] = field(default_factory=dict)      # node name → why it cannot be planned
    #: node name → what the ``--engine`` recipe for its plan warns beyond the plan's own warnings (a release newer
    #: than capability_db knows, a switch the launch needs): what ``explain --recipe`` prints on that node.
    launch_warnings: dict[str, list[str]] = field(default_factory=dict)

    def failed(self) -> dict[str, list[str]]:
        """Why nodes cannot be planned → those nodes (nodes that read alike fail alike: one line per reason)."""
        out: dict[str, list[str]] = {}
        for name, why in self.errors.items():
            out.setdefault(why, []).append(name)
        return out

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
    #: Where the nodes came from, for the report's first line ("probe files", "Ray cluster at ADDRESS").
    origin: str = "probe files"
    #: ``fleet --ray``: the decision fingerprint each node computed itself for each role, (role, node) → fingerprint,
    #: and the moedispatch release it runs; a node whose own plan differs from the plan made here from its probe runs
    #: another moedispatch or capability_db (or reads files this host cannot see).
    node_plans: dict[tuple[str, str], str] = field(default_factory=dict)
    node_tools: dict[str, str] = field(default_factory=dict)
    #: Launch problems found by the engine check that are not the recipe's own refusals (one line each, e.g. an
    #: AITER switch vLLM's Ray data-parallel actors will not receive).
    launch_problems: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """Why the fleet is not ready (exit 3), one line each; [] when every role's nodes agree and run."""
        by_name = {n.name: n for n in self.nodes}
        out: list[str] = []
        for r in self.roles:
            for why, who in r.failed().items():
                out.append(f"role {r.role.name}: node{'s' if len(who) > 1 else ''} {names(who)} cannot be planned: "
                           f"{why}")
            for name, plan in r.plans.items():
                missing = [d.layer.index for d in plan.decisions if d.layer.kind == "moe" and d.backend is None]
                if missing:
                    out.append(f"role {r.role.name}: node {name} ({by_name[name].describe()}) has no correct MoE "
                               f"backend for {len(missing)} layer(s)")
                emulated = [d.layer.index for d in plan.decisions if d.layer.kind == "moe" and d.backend == "emulation"]
                if emulated:   # the reference dequantize-to-BF16 path: correct, ~20x slower, not for serving
                    out.append(f"role {r.role.name}: node {name} ({by_name[name].describe()}) runs {len(emulated)} MoE "
                               "layer(s) only on the reference emulation (dequantize to BF16, not for serving): no "
                               "native kernel is correct there — see `moedispatch explain` on that node")
            for (role, name), why in self.engine_errors.items():
                if role == r.role.name:
                    out.append(f"role {r.role.name}: node {name}: {self.engine} cannot launch its plan: {why}")
            for name, plan in r.plans.items():
                own = self.node_plans.get((r.role.name, name))
                if own is not None and own != plan.decision_fingerprint:
                    tool = self.node_tools.get(name)
                    out.append(f"role {r.role.name}: node {name} plans itself differently (decision fingerprint {own} "
                               f"on the node, {plan.decision_fingerprint} here from its probe): it runs "
                               f"{'moedispatch ' + tool if tool else 'another moedispatch'} (here: {_own_version()}) "
                               "or reads other AITER files; install the same moedispatch on every node")
            out += _unhandled_issues(r, by_name)
            for name in r.plans:
                unread = _unreadable_tuned_files(by_name[name])
                if unread and self.origin == "probe files":
                    out.append(f"role {r.role.name}: node {name}: its AITER_CONFIG_FMOE names file(s) this host "
                               f"cannot read ({', '.join(unread)}): the plan made here is not the node's own — run "
                               "`moedispatch fleet --ray` (each node plans itself) or make the files readable here")
            groups = r.groups()
            if len(groups) > 1:
                ranked = sorted(groups.values(), key=len, reverse=True)
                major = ranked[0]
                for other in ranked[1:]:
                    out.append(f"role {r.role.name}: node(s) {', '.join(other)} plan differently from "
                               f"{names(major)}: " + _what_differs(by_name[major[0]], by_name[other[0]],
                                                                   r.plans[major[0]], r.plans[other[0]]))
        return out + list(self.launch_problems)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": "moedispatch.fleet/1", "engine": self.engine,
                "nodes": [{"name": n.name, "target": n.target, "aiter_version": n.aiter_version,
                           "env": dict(n.env), "labels": dict(n.labels), "source": n.source,
                           **({"moedispatch": self.node_tools[n.name]} if n.name in self.node_tools else {})}
                          for n in self.nodes],
                "roles": [{**r.role.to_dict(), "errors": r.errors,
                           "warnings": [{"message": text, "nodes": who} for text, who in plan_warnings(r)],
                           "nodes": {name: {"decision_fingerprint": p.decision_fingerprint,
                                            **({"planned_on_node": self.node_plans[(r.role.name, name)]}
                                               if (r.role.name, name) in self.node_plans else {}),
                                            "moe": _moe_summary(p)} for name, p in r.plans.items()},
                           "agree": len(r.groups()) <= 1 and not r.errors} for r in self.roles],
                "problems": self.problems()}


def _unhandled_issues(r: RoleResult, nodes: Mapping[str, Node]) -> list[str]:
    """Known kernel × bucket issues of severity ``error`` that a role's token range reaches on a node and that the
    node's environment (or the role's token cap) does not handle — what ``lint`` calls an error, per role and node."""
    found: dict[tuple, list[str]] = {}
    for name, plan in r.plans.items():
        for d in plan.decisions:
            if d.layer.kind != "moe" or d.dispatch is None:
                continue
            for hit in d.dispatch.issues:
                if hit.severity == "error" and not hit.handled_by(dict(nodes[name].env), r.role.hi):
                    found.setdefault((hit.issue, hit.tokens, hit.bucket, hit.kernel, hit.effect, hit.workaround_env,
                                      hit.source), []).append(name)
    out = []
    for (issue, toks, bucket, kernel, effect, env, source), who in found.items():
        where = f"token {toks[0]}" if toks[0] == toks[1] else f"tokens {toks[0]}–{toks[1]}"
        fix = (f"; fix: export {' '.join(f'{k}={v}' for k, v in env)} on {'that node' if len(set(who)) == 1 else 'those nodes'}"
               if env else "")
        out.append(f"role {r.role.name}: node(s) {', '.join(sorted(set(who)))}: its token range reaches {issue} at "
                   f"{where} (bucket {bucket}, {kernel}): {effect} [{source}]{fix}")
    return out


def _unreadable_tuned_files(node: Node) -> list[str]:
    """The paths of the node's AITER_CONFIG_FMOE that this host cannot read (a probe file carries the node's
    environment, not its files: the plan reads them here)."""
    value = dict(node.env).get("AITER_CONFIG_FMOE", "").strip()
    return [p for p in split_env_paths(value) if not os.path.isfile(p)] if value else []


def plan_warnings(r: "RoleResult") -> list[tuple[str, list[str]]]:
    """Each distinct warning of a role's node plans with the nodes whose plan carries it, in first-seen order."""
    seen: dict[str, list[str]] = {}
    for name, plan in r.plans.items():
        for text in [w.text for w in plan.warnings] + r.launch_warnings.get(name, []):
            if name not in seen.setdefault(text, []):
                seen[text].append(name)
    return list(seen.items())


def names(nodes: Sequence[str], shown: int = NAMES_SHOWN) -> str:
    """Node names for one line of text: all of them up to ``shown`` + 1, else the first ``shown`` and how many more
    (a 200-node role is one readable line; the JSON lists every node)."""
    nodes = list(nodes)
    if len(nodes) <= shown + 1:
        return ", ".join(nodes)
    return f"{', '.join(nodes[:shown])}, … and {len(nodes) - shown} more"


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
    # MOEDISPATCH_TARGET / MOEDISPATCH_AITER_VERSION are already said as the target and the AITER release.
    env = sorted(k for k in set(ea) | set(eb) if ea.get(k) != eb.get(k) and k not in (TARGET_ENV, AITER_VERSION_ENV))
    if env:
        parts.append("environment " + ", ".join(f"{k}={ea.get(k, '(unset)')} vs {eb.get(k, '(unset)')}"
                                                 for k in env))
    sa, sb = _moe_summary(pa), _moe_summary(pb)
    if sa != sb:
        parts.append(f"MoE plan {'; '.join(sa)} vs {'; '.join(sb)}")
    return "; ".join(parts) or "the decision fingerprints differ"


def _own_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return f"moedispatch {version('moedispatch')}"
    except PackageNotFoundError:
        return "moedispatch (not installed as a package)"


def selects(pattern: str, node: Node) -> bool:
    """Whether a role's ``nodes=`` selector picks ``node``: ``label:KEY=VALUE`` (that label has that value),
    ``label:WORD`` (a label named WORD or with the value WORD: ``nodes=label:prefill``), else a glob on node names."""
    if pattern.startswith("label:"):
        key, eq, value = pattern[len("label:"):].partition("=")
        labels = dict(node.labels)
        if eq:
            return labels.get(key) == value
        return key in labels or key in labels.values()
    return fnmatch.fnmatchcase(node.name, pattern)


def plan_fleet(model: Any, nodes: Sequence[Node], roles: Sequence[Role], **plan_kwargs: Any) -> FleetReport:
    """Each role planned on each node it runs on (:attr:`Role.nodes`: a glob on node names or ``label:K=V``). Nodes
    that read alike (target, AITER release, environment) share one plan: a plan depends on nothing else."""
    check_roles(roles)
    results = []
    for role in roles:
        pattern = role.nodes
        members = [n for n in nodes if selects(pattern, n)]
        if not members:
            raise UsageError(f"role {role.name}: nodes={pattern!r} matches none of {', '.join(n.name for n in nodes)}")
        res = RoleResult(role)
        made: dict[tuple, Plan | str] = {}
        for n in members:
            key = (n.target, n.aiter_version, n.env)
            if key not in made:
                try:
                    caps = target_capabilities(n.target, n.aiter_version or "none")
                    runtime = Runtime.build(parse_tokens(f"{role.lo}-{role.hi}"), env=dict(n.env),
                                            serving=(role.lo, role.hi))
                    made[key] = plan_model(model, caps, role.tp, role.ep, runtime=runtime, **plan_kwargs)
                except MoedispatchError as exc:
                    made[key] = str(exc)
            got = made[key]
            if isinstance(got, str):
                res.errors[n.name] = got
            else:
                res.plans[n.name] = got
        results.append(res)
    return FleetReport(list(nodes), results)
