"""``explain --role …``: one brief plan per role, what AITER runs in each role's token range, what differs."""

from __future__ import annotations

import json
from typing import Any, Sequence

from moedispatch._util.width import fit
from moedispatch.plan.roles import Role, group_view, role_differences, roles_to_json
from moedispatch.render.explain import render_table

__all__ = ["render_roles"]


def _runs(runs: list[str]) -> str:
    merged: list[list[Any]] = []
    for r in runs:
        fam, _, span = r.partition(" ")
        lo, _, hi = span.partition("–")
        if merged and merged[-1][0] == fam:
            merged[-1][2] = hi
        else:
            merged.append([fam, lo, hi])
    return ", ".join(f"{f} {lo}" + (f"–{hi}" if hi != lo else "") for f, lo, hi in merged)


def render_roles(plans: Sequence[tuple[Role, Any]], *, fmt: str = "table", first_line: str | None = None,
                 width: int | None = None) -> str:
    if fmt == "json":
        return json.dumps(roles_to_json(plans), indent=2) + "\n"
    lines: list[str] = []
    for role, plan in plans:
        lines.append(f"role    {role.describe()} · decision fingerprint {plan.decision_fingerprint}")
        body = render_table(plan, first_line=first_line, brief=True, width=width)
        lines += [line for line in body.splitlines() if not line.startswith("legend")]
        for g in group_view(plan):
            if not g["runs"]:  # AITER runs nothing for these layers (another path, e.g. emulation)
                continue
            what = f"        AITER runs for layers {g['layers'][0]}–{g['layers'][-1]}: {_runs(g['runs'])}"
            if g["issues"]:
                what += f"; known issues met: {', '.join(g['issues'])}"
            lines.append(what)
        lines.append("")
    diff = role_differences(plans)
    lines.append("roles   " + ("differ:" if diff else "agree: the same backend, allocation, issues and environment"))
    lines += [f"        {d}" for d in diff]
    return fit("\n".join(lines) + "\n", width)
