"""A plan that pins kernels AITER would pick wrong: ``explain --pin-file FILE`` (issue 23 item 3).

The pins come from :func:`moedispatch.aiter.pin.find_pins` for every MoE layer group on an aiter.fused_moe backend;
the file is the planned release's merged tuned set with the pins applied (``AITER_CONFIG_FMOE`` replaces AITER's
set); the plan is then made again under ``AITER_CONFIG_FMOE=FILE`` so what it shows — and the recipe it renders,
which exports that variable — is what AITER runs from the file.
"""

from __future__ import annotations

import os
from dataclasses import replace

from moedispatch.aiter import pin as aiter_pin
from moedispatch.aiter.key import Assumptions
from moedispatch.core.errors import UsageError
from moedispatch.core.reason import Reason
from moedispatch.core.workload import Runtime
from moedispatch.data import aiter_configs as cfg
from moedispatch.plan.plan import Plan, plan_model

__all__ = ["pin_plan"]


def pin_plan(plan: Plan, path: str, **plan_kwargs) -> tuple[Plan, tuple[aiter_pin.Pin, ...]]:
    """(the plan made again under ``AITER_CONFIG_FMOE=path``, the pins written there). UsageError (one line) when the
    plan has no runtime, nothing to pin, or ``path`` exists."""
    if plan.runtime is None:
        raise UsageError("--pin-file needs AITER's dispatch in the plan (token counts and environment)")
    env = plan.runtime.env_dict
    if env.get("AITER_CONFIG_FMOE"):
        raise UsageError("--pin-file writes the tuned set AITER_CONFIG_FMOE points at; unset AITER_CONFIG_FMOE "
                         f"(now {env['AITER_CONFIG_FMOE']}) to pin on the release's own set")
    pins: list[aiter_pin.Pin] = []
    seen: set = set()
    for d in plan.decisions:
        if d.dispatch is None or d.layer.signature() in seen:
            continue
        seen.add(d.layer.signature())
        for p in aiter_pin.find_pins(d.layer, plan.caps, d.dispatch, padding=d.padding, env=env,
                                     assumptions=Assumptions.from_engine_env(d.layer, env)):
            if p not in pins:
                pins.append(p)
    if not pins:
        raise UsageError("--pin-file: nothing to pin — no tuned row this plan's AITER would pick is marked wrong by "
                         "a known issue that names a pin (capability_db/dispatch_issues.toml pin = ...)")
    rows = cfg.config_set_for(plan.caps, env).rows
    aiter_pin.write_pinned(path, rows, pins)
    full = os.path.abspath(path)
    runtime = Runtime.build(plan.runtime.tokens, env={}, overrides={**env, "AITER_CONFIG_FMOE": full})
    again = plan_model(plan.model, plan.caps, plan.tp, plan.ep, runtime=runtime, **plan_kwargs)
    note = Reason(f"pinned {len(pins)} tuned row(s) in {full} (AITER_CONFIG_FMOE; the planned release's whole merged "
                  "set with these rows replaced): " + "; ".join(p.describe() for p in pins), "warning",
                  "moedispatch/aiter/pin.py; " + "; ".join(dict.fromkeys(p.issue for p in pins)))
    return replace(again, warnings=(note,) + again.warnings), tuple(pins)
