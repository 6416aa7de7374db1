"""``fleet --engine E[@V]``: can that engine release launch each node's plan of each role (its recipe)?"""

from __future__ import annotations

from moedispatch.engines.choice import parse_engine_spec
from moedispatch.engines.recipes import _reference_only, build_recipe
from moedispatch.plan.fleet import FleetReport

__all__ = ["check_engine"]


def check_engine(report: FleetReport, spec: str) -> FleetReport:
    """Fill ``report.engine`` and ``report.engine_errors``: a node whose plan the engine release has no safe launch
    for (the recipe's refusal, first reason), or only the slow reference path, is a problem of the fleet. Bad
    ``spec``: a one-line UsageError."""
    engine, version = parse_engine_spec(spec)
    for r in report.roles:
        for name, plan in r.plans.items():
            recipe = build_recipe(plan, engine, version, alternatives=False)
            report.engine = f"{engine} {recipe.version}"
            if not recipe.ok:
                report.engine_errors[(r.role.name, name)] = recipe.refusals[0].text if recipe.refusals else \
                    "no safe launch"
            elif _reference_only(recipe.backend):
                why = next((w.text for w in recipe.warnings if "cannot carry out" in w.text), "")
                report.engine_errors[(r.role.name, name)] = (f"only the slow reference path ({recipe.backend}, do not "
                                                             f"serve)" + (f": {why}" if why else ""))
    report.engine = report.engine or engine
    return report
