"""``moedispatch fleet``: node × role report — which nodes agree on each role's plan, and what differs."""

from __future__ import annotations

import json

from moedispatch._util.width import fit
from moedispatch.plan.fleet import FleetReport, _moe_summary, names, plan_warnings

__all__ = ["render_fleet"]


def render_fleet(report: FleetReport, *, fmt: str = "table", width: int | None = None) -> str:
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2) + "\n"
    by_name = {n.name: n for n in report.nodes}
    lines = [f"fleet   {len(report.nodes)} node(s) from {report.origin}; {len(report.roles)} role(s)"
             + (f"; engine {report.engine}" if report.engine else "")]
    for n in report.nodes:
        env = ", ".join(f"{k}={v}" for k, v in n.env if not k.startswith("MOEDISPATCH_")) or "no AITER/engine env"
        labels = "; labels " + ", ".join(f"{k}={v}" for k, v in n.labels) if n.labels else ""
        tool = f"; moedispatch {report.node_tools[n.name]}" if n.name in report.node_tools else ""
        lines.append(f"node    {n.name}: {n.describe()}; {env}{labels}{tool} ({n.source})")
    for r in report.roles:
        lines.append("")
        lines.append(f"role    {r.role.describe()}")
        for fp, who in sorted(r.groups().items(), key=lambda kv: -len(kv[1])):
            summary = "; ".join(_moe_summary(r.plans[who[0]]))
            lines.append(f"        decision fingerprint {fp}: {names(who)} — {summary}")
        for why, who in r.failed().items():
            lines.append(f"        {names(who)}: cannot be planned — {why}")
        everyone = len(r.plans)
        for text, where in plan_warnings(r):   # what explain would print on each node, once per role
            who = "all nodes" if len(where) == everyone else names(where)
            lines.append(f"        warning ({who}): {text}")
    problems = report.problems()
    lines.append("")
    lines.append("verdict " + ("NOT READY:" if problems else "ready: every role's nodes agree and run"))
    lines += [f"        {p}" for p in problems]
    del by_name
    return fit("\n".join(lines) + "\n", width)
