"""``fleet --engine E[@V]``: can that engine release launch each node's plan of each role (its recipe)?

With ``--data-parallel-backend ray`` (vLLM): does every environment switch a node's recipe needs reach vLLM's Ray
data-parallel engine-core actors on that node? Those actors get the node's own environment (Ray starts workers from
the raylet) plus only the driver variables vLLM copies into their ``runtime_env``: the prefixes and names in
capability_db/engines.toml ``[vllm.ray_env]`` (vllm-project/vllm@v0.33.0:vllm/ray/ray_env.py
``get_env_vars_to_copy``; vllm-project/vllm@v0.33.0:vllm/v1/engine/utils.py ``CoreEngineActorManager``), plus
``VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY`` / ``VLLM_RAY_EXTRA_ENV_VARS_TO_COPY`` from the launching shell. An
AITER_/GPTOSS_ switch exported only where ``vllm serve`` runs therefore never reaches a remote rank.
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from moedispatch.core.errors import UsageError
from moedispatch.engines.choice import parse_engine_spec
from moedispatch.engines.recipes import _in, _reference_only, build_recipe, engine_data
from moedispatch.plan.fleet import FleetReport

__all__ = ["check_engine"]


def check_engine(report: FleetReport, spec: str, *, data_parallel_backend: str | None = None,
                 environ: Mapping[str, str] | None = None) -> FleetReport:
    """Fill ``report.engine`` and ``report.engine_errors``: a node whose plan the engine release has no safe launch
    for (the recipe's refusal, first reason), or only the slow reference path, is a problem of the fleet. With
    ``data_parallel_backend="ray"`` (vLLM only) also ``report.launch_problems``: a switch a node's recipe needs that
    neither the node's environment sets nor vLLM copies from ``environ`` (the launching shell; default this process's
    environment). Bad ``spec``: a one-line UsageError."""
    engine, version = parse_engine_spec(spec)
    ray_env = None
    if data_parallel_backend == "ray":
        if engine != "vllm":
            raise UsageError(f"fleet --data-parallel-backend ray: only vLLM's Ray data-parallel actors are modelled "
                             f"(capability_db/engines.toml [vllm.ray_env]), not {engine}'s")
        ray_env = engine_data(engine)[engine].get("ray_env")
    by_name = {n.name: n for n in report.nodes}
    lost: dict[tuple[str, str], list[str]] = {}  # (role, line) → nodes, so a role's nodes share one line
    recipes: dict[int, Any] = {}   # nodes that read alike share one Plan object (plan_fleet): one recipe each
    for r in report.roles:
        for name, plan in r.plans.items():
            if id(plan) not in recipes:
                recipes[id(plan)] = build_recipe(plan, engine, version, alternatives=False)
            recipe = recipes[id(plan)]
            report.engine = f"{engine} {recipe.version}"
            own = {w.text for w in plan.warnings}
            extra = [w.text for w in recipe.warnings if w.text not in own]
            if extra:   # what explain --recipe says beyond the plan (a release newer than capability_db knows, …)
                r.launch_warnings[name] = extra
            if not recipe.ok:
                report.engine_errors[(r.role.name, name)] = recipe.refusals[0].text if recipe.refusals else \
                    "no safe launch"
            elif _reference_only(recipe.backend):
                why = next((w.text for w in recipe.warnings if "cannot carry out" in w.text), "")
                report.engine_errors[(r.role.name, name)] = (f"only the slow reference path ({recipe.backend}, do not "
                                                             f"serve)" + (f": {why}" if why else ""))
            if data_parallel_backend == "ray" and recipe.ok:
                if not ray_env or not _in(ray_env["versions"], recipe.version):
                    raise UsageError(f"fleet --data-parallel-backend ray: what vLLM {recipe.version} copies to its "
                                     "Ray actors is not modelled (capability_db/engines.toml [vllm.ray_env] covers "
                                     f"{ray_env['versions'] if ray_env else 'no release'})")
                line = _lost_env(ray_env, recipe.env, dict(by_name[name].env),
                                 os.environ if environ is None else environ)
                if line:
                    lost.setdefault((r.role.name, line), []).append(name)
    report.launch_problems += [f"role {role}: node(s) {', '.join(names)}: {line}" for (role, line), names in lost.items()]
    report.engine = report.engine or engine
    return report


def _lost_env(ray: Mapping[str, Any], needed: list[dict[str, str]], node_env: Mapping[str, str],
              shell: Mapping[str, str]) -> str | None:
    """One line when some variable of the recipe's environment is neither set (to that value) in the node's own
    environment nor copied by vLLM to its Ray actors from the launching shell; None otherwise."""
    extra_p = [p.strip() for p in shell.get(ray["extra_prefixes_env"], "").split(",") if p.strip()]
    extra_n = {n.strip() for n in shell.get(ray["extra_names_env"], "").split(",") if n.strip()}
    prefixes, names = tuple(ray["prefixes"]) + tuple(extra_p), set(ray["names"]) | extra_n
    lost = [(e["name"], e["value"]) for e in needed
            if not e["name"].startswith(prefixes) and e["name"] not in names and node_env.get(e["name"]) != e["value"]]
    if not lost:
        return None
    want = sorted({k.split("_", 1)[0] + "_" for k, _ in lost})
    have = ",".join(extra_p + [p for p in want if p not in extra_p])
    return (f"the vLLM recipe for its plan exports {', '.join(f'{k}={v}' for k, v in lost)} "
            "(the launch realizes the plan only with it), which vLLM's Ray data-parallel actors will "
            f"not receive: this node's environment does not set it and vLLM copies only "
            f"{', '.join(ray['prefixes'])} variables (and {ray['extra_prefixes_env']}) from the launching shell; fix: "
            f"export {ray['extra_prefixes_env']}={have} where vLLM is launched (or set it in the node's environment) "
            f"[{ray['source']}]")
