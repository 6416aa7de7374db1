"""Mutation testing of the rule-bearing code with mutmut (PyPI, ``pip install -e '.[dev]'``); prints the kill ratio.

    python benchmarks/mutation.py --jobs 2                          # every rule-bearing module: ~22.6k mutants
    python benchmarks/mutation.py --jobs 2 --sample 0.02 --seed 14  # a stratified 2% of each file (453 mutants)
    python benchmarks/mutation.py --jobs 2 --workdir DIR --rerun-survivors   # DIR's survivors vs today's tests
    python benchmarks/mutation.py --jobs 2 --only moedispatch/kit/rules.py --survivors

A full run at this scope is about 22,600 mutants in 47 files — roughly two days on the 2-core development VM at the
0.1-0.25 mutants/s measured there — so the figure the README quotes comes from ``--sample``: a seeded random share of
every file's mutants (at least one each), whose kill ratio estimates the full run's, printed with its 95% (Wilson)
interval. ``--sample 0.02`` takes about an hour with ``--jobs 2`` (measured: mutmut 3,330 s for 447 mutants, plus
~6 minutes for the copy, the baseline and mutmut's stats run; about 100 minutes for seed 14's 453 with the CPUs
shared with other work).

Mutated: every rule-bearing subpackage — ``aiter/``, ``cost/``, ``engines/``, ``kit/``, ``selector/`` — the padding
values, the families table and run-time inputs in ``core/``, and the built-in backends (plugins/*.py, not
plugins/examples); ``--scope round2`` mutates only the files of the last measured run (:data:`MUTATE_ROUND2`, about
40 min on 2 cores). Not part of ``pytest``.

How it runs. mutmut rewrites every function of those files into "trampolines" that switch to a mutant when
``MUTANT_UNDER_TEST`` names one, and runs pytest in a fork per mutant. It runs on a scratch copy of the tree, laid
out as the installed wheel is (``plugins/`` -> ``moedispatch_plugins/``, ``capability_db/`` ->
``moedispatch/capability_db/``), so the checkout other people work in is never touched, and the built-in backends
that the entry points import are the mutated ones. Test selection is mutmut's own coverage-based one, restricted to
:data:`FAST_TESTS` (a few seconds in all; the full suite takes a minute): per mutant only the fast tests that call
the mutated function run, with ``-x``. Selection memoizes decisions; the scratch conftest clears those caches
before every test so that a mutant is always exercised (a forked worker inherits the parent's warm caches).

A survivor that no test can kill because it does not change behaviour (an *equivalent* mutant) is listed in
:data:`EQUIVALENT` with the reason; the report counts it apart and prints the ratio with and without it.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections import Counter, defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The rule-bearing code, as paths in the scratch copy (``moedispatch_plugins`` is the repo's ``plugins/``).
MUTATE = [
    "moedispatch/aiter/*.py",        # AITER's dispatch per release, the CSV lint
    "moedispatch/cost/*.py",         # the cost model
    "moedispatch/engines/*.py",      # engine choice, recipes, layout, launch lint
    "moedispatch/kit/*.py",          # rules, known issues, caveats
    "moedispatch/selector/*.py",     # the selector, run-time ranking, the registry
    "moedispatch/core/backend.py",   # the padding values
    "moedispatch/core/families.py",
    "moedispatch/core/workload.py",
    "moedispatch/core/aiter_release.py",  # which AITER release a version carries (every release range)
    "moedispatch_plugins/*.py",
]
#: The narrower scope of the last measured run (README: 90.5% of 4,718 mutants), for ``--scope round2``.
MUTATE_ROUND2 = [
    "moedispatch/selector/pure.py",
    "moedispatch/kit/rules.py",
    "moedispatch/core/backend.py",
    "moedispatch/engines/recipes.py",
    "moedispatch/kit/caveats.py",
    "moedispatch_plugins/*.py",
]

#: Fast tests that pin the rules (the per-mutant candidates; mutmut keeps, per mutant, the ones that call it).
FAST_TESTS = [
    "tests/test_rule_mutants.py",
    "tests/test_aiter_release.py",
    "tests/test_recipes_inprocess.py",
    "tests/test_golden_decisions.py",
    "tests/test_golden_recipes.py",
    "tests/test_caveat_rules.py",
    "tests/test_recipe_branches.py",
    "tests/test_selector_cache_and_events.py",
    "tests/test_plugin_rules.py",
    "tests/test_backend_rules.py",
    "tests/test_family_tables.py",
    "tests/test_selector_plugins.py",
    "tests/test_aiter_dispatch.py",
    "tests/test_aiter_dispatch_mutants.py",   # boundary cases of the AITER model, each cited (issue 22)
    "tests/test_cost.py",
    "tests/test_cost_reverted.py",      # reverted AITER rows: matching and validation (issue 26 item 5)
    "tests/test_cost_release.py",       # release-aware bars and their derivation (needs ../shared/aiter, else skips)
    "tests/test_cost_pairs.py",         # per-pair decode fixed terms, the anchored arch prior (issue 26 item 1)
    "tests/test_cost_decode.py",        # decode as latency plus bytes, its fit and priors validation (was left out)
    "tests/test_cost_heuristic.py",     # the heuristic band on AITER predictions (issue 26 item 2)
    "tests/test_cost_heuristic_evidence.py",  # its published evidence, derived band and held-out coverage
    "tests/test_engine_choice.py",
    "tests/test_one_home.py",
    "tests/test_launch.py",             # the engine launch rules: FlyDSL tiles, named families, workaround envs
    "tests/test_pin.py",
    "tests/test_roles.py",
    "tests/test_guard_exec.py",
    "tests/field/test_field.py",        # the field cases (about 9 s)
    "tests/test_engine_mutants.py",     # boundary cases of engines/recipes.py and engines/choice.py (issue 23)
    "tests/test_launch_paths.py",       # engines/paths.py and the recipe's launch paths (issue 23 item 1)
    "tests/test_mutants_small.py",      # engines/fleet.py, aiter/pin.py, aiter/lookup.py, selector/runtime._switches
    "tests/test_aiter_lint_mutants.py", # aiter/lint.py: floors, shared CUs, shadowed rows, render and run_cli
    "tests/test_plugins_mutants.py",    # selector/plugins.py: timeouts, allow/deny lists, records, entry points
    "tests/test_mutants_late.py",       # cases the whole-scope sample (seed 11) found unpinned
    "tests/test_mutants_aiter3.py",     # aiter/heuristics block_m, aiter/issues ranges, aiter/walk launchers
    "tests/test_mutants_cost3.py",      # cost/model heuristic spans, plugin costs, decode fit; cost lint/release/drift
    "tests/test_mutants_engines3.py",   # engines/choice allocations, engines/layout bytes, selector/runtime switches
    "tests/test_lint.py",               # engines/lint.py: the launch lint through main() in-process
    "tests/test_lint_mutants.py",       # engines/lint.py: parsing, fix lines, each finding's branch
    "tests/test_recipe_lint_roundtrip.py",  # every printed golden recipe lints clean (load-time conversions)
    "tests/test_mutants_s12_aiter.py",  # seed-12 survivors: AITER env/lint/walk rules (and the xbf16 NamedTuple bug)
    "tests/test_mutants_s12_cost.py",   # seed-12 survivors: release rows, geometry, decode fit, priors validation
    "tests/test_mutants_s12_engines.py",  # seed-12 survivors: engine data, allocations, layouts, lint parsing, paths
    "tests/test_mutants_s12_select.py",  # seed-12 survivors: caveat confidence, plugin records, kept-allocation note
    "tests/test_mutants_s13_aiter.py",  # seed-13 survivors: FlyDSL tile hits, aiter#3997 k-tiles, use_cfg, 0.1.7 buckets
    "tests/test_mutants_s13_cost.py",   # seed-13 survivors: copy lint keys, heuristic entries lend no row
    "tests/test_mutants_s13_engines.py",  # seed-13 survivors: release order, fp8/wna16/mxfp4 choices, lint findings
    "tests/test_mutants_s13_select.py",  # seed-13 survivors: misspelt hooks, kept notes, trial order, blocked allocations
    "tests/test_mutants_s14_cost.py",   # seed-14 survivors: fused-key block scale, decode details, plugin logger, bands
    "tests/test_mutants_s14_core.py",   # seed-14 survivors: tile effects, CSV lint copies/overrides, wint4 ksplit, Padding
    "tests/test_mutants_s14_engines.py",  # seed-14 survivors: vLLM fp8 refinement note, aiter env fallback, memory warning, lint JSON
    "tests/test_mutants_s16_cost.py",   # seed-16 survivors: plugin costs at the roofline, dispatch rows, doweight, touching bars
    "tests/test_faults.py",             # in-process faults: a backend's bad padding/notes fall through (seed 14)
    # existing in-process tests that pin rule-bearing code and were not in this list (found by the seed-13 survivors:
    # two of them were killed by these files, which mutmut did not run)
    "tests/test_aiter_releases.py",     # every AITER release's dispatch rules (use_cfg, wildcards, buckets)
    "tests/test_partition_target.py",   # compute partitions: CU counts, memory shares, recipe headers
    "tests/test_field_rules.py",        # the field rules
    "tests/field/test_done_when.py",    # the field cases' done-when checks
    "tests/test_plugin_disable.py",     # MOEDISPATCH_DISABLE_PLUGINS and the registry
    "tests/test_aiter_lint_rules.py",   # aiter/lint.py: each check's severity, wording and source
    "tests/test_lint_ray.py",           # engines/lint.py: what reaches vLLM's Ray actors
    "tests/test_fleet.py",              # engines/fleet.py and plan/fleet.py (its in-process tests)
    "tests/test_guard_inengine.py",     # the guard's per-layer and process-0 checks in-process
    # the in-process run-time (cost-ordered) selection tests of test_runtime.py (its CLI tests are slow)
    "tests/test_runtime.py::test_minimax_m3_keeps_384_unpadded_where_tuned_rows_decide_every_bucket",
    "tests/test_runtime.py::test_minimax_m3_pads_where_decode_falls_to_heuristics",
    "tests/test_runtime.py::test_aiter_3933_is_flagged_at_its_bucket_with_its_workaround",
    "tests/test_runtime.py::test_a_known_wrong_kernel_with_no_workaround_rejects_the_aiter_path",
    "tests/test_runtime.py::test_a_much_faster_correct_backend_wins_over_preference_and_says_why",
    "tests/test_runtime.py::test_overlapping_bars_leave_preference_in_charge",
    "tests/test_runtime.py::test_engine_api_and_explain_carry_the_same_dispatch_and_cost",
]
#: Tests of the fast files left out of every mutant run: each re-runs a whole benchmark or build script in a
#: subprocess (minutes each, and mutmut cannot see which functions a subprocess calls — under mutmut's trampolines the
#: subprocess fails its stats run). The in-process tests of the same files pin the rules those scripts use.
SUBPROCESS_TESTS = [
    "tests/test_cost.py::test_benchmark_meets_its_accuracy_goals",
    "tests/test_cost.py::test_shipped_priors_are_what_the_benchmark_fits",
    "tests/test_cost_release.py::test_benchmark_reports_release_heldout_coverage_and_large_m",
    "tests/test_cost_release.py::test_drift_data_is_rebuilt_from_aiters_own_csvs",
    "tests/test_cost_reverted.py::test_reverted_data_is_rebuilt_from_aiters_history",
    "tests/test_cost_decode.py::test_shipped_decode_fit_is_rederived_from_aiters_own_csvs",
    "tests/test_cost_decode.py::test_benchmark_reports_the_decode_figures",
]
# Not here: the CLI tests (test_recipes_engine.py, test_spine.py) run subprocesses, ~100 s in all, and mutmut cannot
# see which functions a subprocess calls; test_recipes_inprocess.py pins the same recipes in-process.

#: Survivors judged equivalent: (mangled function name glob, regex on the mutated line, why no test can kill it).
#: Matched on the function and the text of the mutated line (``mutmut show``), not on mutant numbers, which shift
#: whenever a function is edited.
EQUIVALENT: list[tuple[str, str, str]] = [
    ("x__subgu", r'SUBGU_N\.get\(\(tag, gfx or ""\), (None)?\s*\)',
     "a (tag, gfx) with no kernel table gets no sizes either way (None or ()), and `if not sizes: return 1`"),
    ("x__subgu", r'gfx or "XXXX"',
     "no kernel table is keyed by an empty or a made-up gfx name: both lookups miss and return 1"),
    ("x__family_of", r'getattr\(b, "family", \)',
     "Backend defines family = None, so every backend has the attribute and getattr never needs its default"),
    ("xǁ*ǁkernel_pads", r"^return [01], [01], \[\]$",
     "only in the `if not padding.padded` branch: Padding.aligned clamps each kernel pad to its real pad (0), so a "
     "kernel pad of 1 becomes 0"),
    ("x_need_feature", r'info\.get\("confidence", (None|"XXconfirmedXX"|"CONFIRMED")?\s*\)',
     "capdb.feature_info always fills confidence, so the default of this get() is never used"),
    ("xǁAiterFlyDSLǁkernel_pads", r'need_feature\(caps, "flydsl_pads", (None|"XXFlyDSL padsXX"|"flydsl pads"|'
     r'"FLYDSL PADS")\) is not None',
     "the purpose argument only words the returned Reason, and kernel_pads reads nothing but `is not None`"),
    ("xǁAiterFlyDSLǁnotes", r"swiglu_decode_note\(layer, None\)",
     "swiglu_decode_note(layer, combo) never reads combo"),
    ("x__replan", r"plan_model\(plan\.model, plan\.caps, tp, ep, \)",
     "plan_model's warnings parameter defaults to empty, like the [] it was given"),
    ("x_render_recipe", r'^lines\.append\(recipe\.command or "XXXX"\)$',
     "reached only for a realizable recipe, whose command is always a string (a refused one returned earlier)"),
    ("x_conversion", r'\.get\("conversion", (None)?\s*\)',
     "every engine in capability_db/engines.toml has [[<engine>.conversion]] rows, so the default is never used"),
    ("x__issue_reason", r'def _issue_reason\(row: dict\[str, Any\], kind: str = ("XXfailedXX"|"FAILED")\)',
     "the only caller always passes kind, so the default is never used"),
    ("x__issue_reason", r'^\)$',
     "dropping the confidence argument leaves Reason's own default, \"confirmed\", which is also the get() default "
     "(rows with another confidence are pinned by the golden recipes)"),
    ("x_build_recipe", r"switches=None\)",
     "build_recipe reads `switches` only for truth (`if switches and …`): False and None are the same"),
    ("x__alternatives", r"alternatives=None\)",
     "build_recipe reads `alternatives` only for truth (`if alternatives:`): False and None are the same"),
    ("x__realized_with_switch", r"(alternatives|switches)=None",
     "build_recipe reads `alternatives` and `switches` only for truth: False and None are the same"),
    ("x__alternatives", r'eng\.get\("releases", (None)?\s*\)',
     "docs/schemas/engines.schema.json requires `releases` of every engine (checked at load): the default is "
     "never used"),
    ("x_backend_rows", r'eng\.get\("backend", (None)?\s*\)',
     "engines.schema.json requires the `backend` rows of every engine: the default is never used"),
    ("x__env_and_args", r'cav\.get\("(env|args)", (None)?\s*\)',
     "engines.schema.json requires `env` and `args` on every [[caveat]] row: the default is never used"),
    ("x_build_recipe", r"_version\(None, version, eng\)",
     "_version never reads its `engine` argument (the message names the version and the newest release)"),
    ("x_engine_padding", r"_version\(None, version, data\[engine\]\)",
     "_version never reads its `engine` argument"),
    ("x__runtime_env", r"if \(plan\.runtime is not None\) or True else",
     "build_recipe calls _runtime_env only when plan.runtime is not None"),
    ("x_render_recipe", r'fmt: str = "(XXtableXX|TABLE)"',
     "render_recipe tests `fmt == \"json\"` only; any other value, the default included, renders the table"),
    ("x__family_of", r'(b = None|get_registry\(\)\.get\(None\)|getattr\(None, "family", None\)|'
                     r'getattr\(b, "(XXfamilyXX|FAMILY)", None\))',
     "its callers pass built-in backend names (the engine model's choices and the plan's backends) and read the "
     "result through _fam, which maps every built-in AITER name and family to \"aiter\" and leaves triton and "
     "emulation (name == family) as they are: the registry lookup changes nothing for them"),
    # -- engines/fleet.py, aiter/pin.py (tests/test_mutants_small.py kills the rest) --
    ("x_check_engine", r"build_recipe\(plan, engine, version, alternatives=None\)",
     "build_recipe reads `alternatives` only for truth: False and None are the same"),
    ("x_check_engine", r'(if \(recipe\.refusals\) or True else|"XXno safe launchXX"|"NO SAFE LAUNCH")',
     "build_recipe leaves a recipe without a command only with a refusal, so the fallback text is never used"),
    ("x_check_engine", r'"cannot carry out" in w\.text\), None\)',
     "`why` is read only for truth: None and \"\" are the same"),
    ("x_check_engine", r"(XXno releaseXX|NO RELEASE|^ray_env = \"\"$)",
     "capability_db/engines.toml always has [vllm.ray_env] (engines.schema.json), and ray_env is read only for truth"),
    ("x__lost_env", r'shell\.get\(ray\["extra_names_env"\], "XXXX"\)',
     "an absent extra-names variable then names a variable \"XXXX\", which no recipe exports: nothing else changes"),
    ("x__lost_env", r'k\.split\("_", ?2?\)\[0\]',
     "element [0] of a split is the same whatever the maxsplit"),
    ("x__cell", r'getattr\(row, _FIELDS\.get\(column, column\), ("XXXX"|None)?\s*\)',
     "every column of COLUMNS is a TunedRow field (or mapped to one by _FIELDS): getattr never needs its default"),
    ("x__replaced", r'label=(None|cs\.label \+ "XX \(pinned\)XX"|cs\.label \+ " \(PINNED\)")\)?',
     "its only caller, find_pins, looks rows up in the returned set and never reads its label"),
    ("x_find_pins", r"model_dims=None",
     "model_dims only narrows which rows are parsed (a speed-up): the lookup of the key's model_dim is the same"),
    ("x_write_pinned", r'open\(path, "x", (encoding=(None|"UTF-8"), newline="\\n"|encoding="utf-8", newline=None)\)',
     "the pinned CSV is ASCII and POSIX writes \\n either way"),
    ("x__feature", r"_FEATURES\[name\] = None",
     "import-time registration: mutmut forks its mutant workers after the module is imported, so the decorator has "
     "already run unmutated — no test can observe this mutant"),
    # -- engines/lint.py (tests/test_lint_mutants.py kills the rest) --
    ("x__container_env", r'if tok in \("-e", "--env"\) and i - 1 < len\(tokens\):',
     "-e/--env is never the last of the words before the engine command (they end with its entry point)"),
    ("x__fix_from_launch", r"i - 1 < len\(args\)",
     "_parse_args already refused an option missing its value, and a slice past the end takes what is there"),
    ("x__dispatch_findings", r'(launch\.flags\.get\("max_batched_tokens"\) or "XXXX"\)|'
                             r'hit\.severity in \("error", "(XXwarningXX|WARNING)", "info"\))',
     "\"\" and \"XXXX\" both fail isdigit(); a \"warning\" severity missing the list maps to \"warning\" anyway"),
    ("x__engine_of", r'tok in \("(XXsglang\.launch_serverXX|SGLANG\.LAUNCH_SERVER)", "sglang\.srt\.server"\)',
     "`base == \"sglang.launch_server\"` on the same line matches that token either way"),
    ("x__fam_of", r"if \(b is not None\) or True else None", "getattr(None, \"family\", None) is None as well"),
    ("x__launch_dict", r"dest\.get\(k, \)", "every flag key of a parsed launch is a dest of the engine's options"),
    ("x__moe_findings", r'(else "XXXX"|replace\("XX-XX", "_"\))',
     "fix_line is never None for a realizable recipe; the backend flag is compared only with aiter/auto (no '-')"),
    ("x__ray_env_findings", r'"XXGPTOSS_XX"',
     "the only GPTOSS_ variable, GPTOSS_SWIGLU_MXFP4_BF16_BOUND, is a plan input the recipe always exports back"),
    ("x_lint_launch", r"_version\(None, engine_version, eng\)", "_version never reads its `engine` argument"),
    ("x_run_cli", r'(open\(args\.file, encoding=None\)|"THE SCRIPT"|"XXthe scriptXX")',
     "the locale here is UTF-8; `source` matters only when a file was given, and then args.file names it"),
    ("xǁ_EngineRefusesǁ__init__", r"super\(\)\.__init__\(None\)",
     "the exception's message is never read: its handler reads exc.choice.error"),
    # -- aiter/lint.py, selector/plugins.py (tests/test_aiter_lint_mutants.py, tests/test_plugins_mutants.py) --
    ("x__shadowed", r"(for m in \(1, 2, [34], 5, 9, 17, 33, 65, 129, 257, 51[34], 1025, 2049, 409[78], 8193,$|"
                    r"^16385, 32768, 13107[23]\)\}$|valid \|= \{2 << i for i in range\(15\)\})",
     "get_padded_M maps 3 and 4, 513 and 514, 4097 and 4098, 131072 and 131073 to the same bucket at HEAD and in the "
     "legacy rule, and 1 and 32768 are in the probed set already: the set of valid buckets is the same"),
    ("x__check_timeout_env", r"^ok = None$", "`ok` is read only as `if not ok`: None and False are the same"),
    ("x__scan_entry_points", r'^dist = ""$', "`dist` is read only as `dist or _Dist(info)`: \"\" and None are the same"),
    ("xǁ_Distǁ__init__", r"^return$", "the loop is the last statement of __init__: return and break both end it"),
    ("x_pad_ratio_caveat", r"if len\(pairs\) > 2 else pairs",
     "with exactly two pairs, [pairs[0], pairs[-1]] is pairs itself"),
    ("x_shard_caveats", r'SCALE_GROUPS, \)\)$',
     "dropping the confidence argument leaves Reason's default, \"confirmed\", the value given"),
    ("x__pick_backend", r"^recipe\.refusals = tried$",
     "reached only when no MoE layer lacks a backend, so recipe.refusals is still empty there: = and += agree"),
    # -- moedispatch/engines/recipes.py, engines/choice.py (tests/test_engine_mutants.py kills the rest, issue 23) --
    ("x__allocation_issues", r"^(hidden_multiple=(None|p\.hidden_multiple), intermediate_multiple=(None|"
                             r"p\.intermediate_multiple),|intermediate_multiple=p\.intermediate_multiple,|"
                             r"hidden_multiple=p\.hidden_multiple, pad_semantics=p\.pad_semantics\))$",
     "the allocation's recorded multiples are read by none of the rules it is handed (evaluate_issues, dispatch_for "
     "and dispatched_family_issues read sizes, pads, zero_fill and pad_semantics)"),
    ("x__allocation_issues", r"^(b = None|b = plugins\.get_registry\(\)\.get\(None\)|"
                             r"outcome = evaluate_issues\(b\.name if \(b is not None\) and False else backend, "
                             r"layer, plan\.caps, alloc\))$",
     "Registry.get matches on the name, so b.name == backend whenever b is found: backend is passed either way"),
    ("x__allocation_issues", r"kernel_(hidden|intermediate)_pad=(hp|ip) if \((kh|ki) is None\) and False else",
     "_try_backend calls it only for an AITER family, where engine_padding always returns int kernel pads"),
    ("x__allocation_issues", r'^(refusals = \[dataclasses\.replace\(r, text=where \+ r\.text, kind="failed"\) for r in '
                             r'outcome\.blocking|warnings = \[dataclasses\.replace\(r, text=where \+ r\.text, '
                             r'kind="warning"\) for r in outcome\.notes)$',
     "refusals and warnings are still the empty lists made just above: = and += agree"),
    ("x__allocation_issues", r'^refusals \+= \[dataclasses\.replace\(r, text=where \+ r\.text, \) for r in '
                             r'outcome\.blocking$',
     "evaluate_issues makes every blocking reason of kind \"failed\" already"),
    ("x__try_backend", r'row\.get\((None|"XXconfidenceXX"|"CONFIDENCE"), "confirmed"\)\)\)$',
     "the only `unsupported` backend row (sglang emulation) has no confidence: the get() always gives "
     "\"confirmed\""),
    ("x__sglang", r'^error = ""$',
     "error is read only for truth (`if error:`), and the accepted choice passes error=None itself"),
    ("x__sglang", r'^reasons\.insert\(1, Reason\(f"SGLang \{version\} refuses the layer: \{error\}", "failed", '
                  r'src\)\)$',
     "both SGLang refusals happen before any reason is added: on an empty list insert(1) puts it first too"),
    ("x__try", r'^reason = ""$',
     "every backend of the engine model has at least one class, so the loop always overwrites reason"),
    ("x__vllm_wna16", r'o\.get\("auto_confidence", (None|"XXconfirmedXX"|"CONFIRMED")?\s*\)',
     "[oracle.wna16] of capability_db/engines/vllm.toml sets auto_confidence, so the default is never used"),
    ("x_compare_decision", r'^why = \[r for r in rej\.reasons if r\.kind != "supports"\]$',
     "why is still empty in that branch (only the exclusive `refused` branch adds to it first): = and += agree"),
    ("x_compare_decision", r'f\.get\("confidence", (None|"XXconfirmedXX"|"CONFIRMED")?\s*\)',
     "findings() fills the confidence of every finding, so the default is never used"),
    ("x_recipe_engine_groups", r'^pinned = auto if forced == "(XXautoXX|AUTO)" else',
     "comparing again on auto gives an equal result (compare_plan is deterministic); only the work is repeated"),
    ("x_render_comparison", r"_VERDICT_TEXT\.get\(c\['verdict'\],\s*(None)?\s*\)",
     "every verdict compare_plan gives (same, slower, wrong, refused, different, unmodelled) is a key of "
     "_VERDICT_TEXT"),
    ("x__vllm_*", r"bn, bk = layer\.weight\.block or \(\d+, \d+\)$",
     "the fp8_block scheme is given only to weights with a block (_scheme), so the default is never used"),
    ("x__vllm_oracle", r'qm = \(quant_method or \("(fp8|XXfp8XX|FP8)" if oracle (==|!=) "(fp8|XXfp8XX|FP8)" else',
     "qm is only compared with \"mxfp4\" (for the mxfp4 oracle), and neither default is \"mxfp4\""),
    ("x__vllm_gates", r'"gfx1250": gfx == "(XXgfx1250XX|GFX1250)"',
     "only AITER_TRITON_MXFP4_MXFP4 needs the gfx1250 gate, and it also needs the aiter gate, false off gfx942/gfx950"),
    ("x__vllm_fp8_block", r"to \{c\.refined\[(0|1)\]\}x\{c\.refined\[(0|1)\]\} to",
     "refined is [g, g]: both entries are the same number"),
    ("xǁ_VllmCallǁ*", r'(return self\.scheme if spec\.get\("(act_key|XXact_keyXX|ACT_KEY)"\) (==|!=) '
                        r'"(requested|XXrequestedXX|REQUESTED)" else self\.check_scheme|self\.scheme_for\(None\))',
     "for the MXFP4 oracles check_scheme is the scheme itself (only the FP8 paths change it), and elsewhere scheme_for "
     "returns check_scheme whatever the name: every scheme_for(...) gives the same scheme"),
    ("x_*", r'(engine: str = "VLLM"|moe_backend: str = "AUTO")',
     "choice_for_layer lower-cases the engine name and _vllm/_sglang the moe_backend value before any use, and "
     "compare_plan/engine_choice pass both straight to it: \"VLLM\" is \"vllm\", \"AUTO\" is \"auto\""),
    ("x__vllm_allocation", r'cdna4 = \(c\.caps\.gfx or "XXXX"\) == "gfx950"',
     "only compared with \"gfx950\": a missing gfx reads as \"\" or \"XXXX\", neither of which is gfx950"),
    ("x_engine_runs", r'startswith\(eng\["backend_arg"\]\)\), "AUTO"\)$',
     "the default only reaches engine_allocation -> modelled_choice -> choice_for_layer, whose _vllm/_sglang "
     "lower-case the value: \"AUTO\" is \"auto\""),
    ("x__layer_checks", r'^_issue_reason\(row, "(XXfailedXX|FAILED|failed)" if (\(row\["severity"\] == "error"\) and '
                       r'False|row\["severity"\] == "error") else "warning"\)\)$',
     "changes only the kind of an engine issue's refusal, which nobody reads: build_recipe re-wraps every refusal "
     "of _try_backend as a \"failed\" Reason and _name_after_what_runs tests only for none, lint reads text, "
     "source and issue"),
    ("x__class_check", r'\(layer\.experts \+ 31\) // 32 \* 33 > cls\["max_padded_experts"\]',
     "every class that sets max_padded_experts sets 1023: n blocks of 32 exceed it iff n >= 32, and so do n blocks "
     "of 33 (31 × 33 = 1023 is not over)"),
    ("x_recipe_engine_groups", r'^forced = words\[words\.index\(flag\) \+ 1\] if flag in words\[:-1\] else "AUTO"$',
     "with no flag the forced comparison runs compare_plan on \"AUTO\", which _vllm/_sglang lower-case: the same "
     "comparison as auto, computed twice"),
    ("x__env_flag", r'env\.get\(name, "true" if default else "False"\)\.strip\(\)\.lower\(\)',
     "the default is lower-cased before the comparison: \"true\" and \"True\" read the same"),
    ("x_modelled_choice", r'^if version not in ec\.ENGINES\.get\(engine, \):$',
     "every caller has passed engine_data, which accepts only recipes.ENGINES (vllm, sglang), and both are keys of "
     "choice.ENGINES: the default is never used"),
    ("x_*", r'conv\.get\("(CONFIDENCE|XXconfidenceXX)", "confirmed"\)\)\)$',
     "no [[<engine>.conversion]] row of capability_db/engines.toml sets confidence: the get() gives \"confirmed\" "
     "either way"),
    ("x__env_flag", r'env\.get\(name, "True" if default else "false"\)\.strip\(\)\.lower\(\)',
     "the default is lower-cased before the comparison: \"false\" and \"False\" read the same"),
    ("x__ray_env_findings", r'getattr\(recipe, "env", \)$',
     "the only caller, lint_launch, passes build_recipe's Recipe, whose env is a dataclass field (default ()): "
     "getattr never needs its default"),
    ("x__allocation_check", r"^bad, said = _allocation_issues\(plan, d, backend, h, i, None, ki\)$",
     "None only changes the allocation's kernel_hidden_pad (the whole hidden pad instead of hidden_pad // 128 * 128), "
     "which no rule reads: evaluate_issues and the dispatch issues read the intermediate pad, pad_hazards finds "
     "nothing in a zero-filled allocation (every padded engine allocation is), the dispatch key's hidden_pad is not "
     "looked up"),
    ("x__layer_checks", r'startswith\(eng\["backend_arg"\]\)\), "AUTO"\)$',
     "every engine row that reaches _layer_checks names its --moe-backend / --moe-runner-backend; the one without "
     "(SGLang's emulation row) is unsupported and refused before, in _try_backend: the default is never used"),
    ("x__name_after_what_runs", r"^decisions = _forced\(plan, other\) if \(other\) or True else None$",
     "with no candidate _forced(plan, None) re-selects unforced or gives None, and _try_backend(..., None, ...) "
     "then finds no engine row and refuses: the loop continues exactly as for None"),
    ("x__same_launch", r"^if best is winner and not _runs\(best, dp\):$",
     "the only caller takes the winner from alive with its own dispatch, so the winner is always in same; the key "
     "(runs, b is winner) makes best the winner exactly when no candidate runs more, i.e. when not _runs(best): "
     "`or` and `and` agree"),
    # -- seed-14 survivors judged equivalent (tests/test_mutants_s14_*.py kill the others) --
    ("x__prior_us", r"^b = fitted\[0\] if b <= fitted\[0\] else fitted\[-1\]",
     "parse_priors sorts priors.buckets ascending, so in the out-of-range branch b never equals fitted[0] (it would "
     "be in range): < and <= pick the same end"),
    ("x_reason", r"^chosen = \[p for p in pairs if p\[1\]\.tokens == tokens\] or pairs\[:1\]$",
     "_pairs pairs each cost of a with bt[c.tokens]: p[1].tokens == p[0].tokens in every pair"),
    ("x_run_cli", r"^cs = _cfg\.load_config_set\(env=env, version=version\)$",
     "load_config_set's source defaults to None, the value passed"),
    ("xǁ_VllmCallǁscheme_for", r'spec\.get\(None\) == "requested"',
     "for the MXFP4 oracles check_scheme is the scheme itself (only _vllm_fp8_block changes it): either branch "
     "returns the same scheme"),
    ("x__launch_findings", r'\.replace\("-", "XX_XX"\)$',
     "the flag is only compared with \"aiter\", which has neither - nor _: no value matches after one replacement "
     "and not the other"),
    ("x__same_launch", r"key=lambda b: \(_runs\(b, dp\), b is not winner\)\)$",
     "the winner runs 0 there: if every candidate runs 0 both keys give None; otherwise the winner is not the "
     "maximum and the tie-break is constant among the others, so max picks the same first one"),
    ("x__misfit", r'^return f"AITER raises for \{_span\(None\)\}: \{s\.raises\}"$',
     "unreachable: plan_dispatch adds a blocking aiter-raises hit (error, no workaround, no cap) for every raising "
     "step, so the issue loop above returns before the step loop reaches one"),
    ("x_lookup_rules", r"^if SpecifierSet\(spec\)\.contains\(public, \):$",
     "with packaging >= 26 (the version CI installs) SpecifierSet.contains matches a pre-release without "
     "prereleases=True; under packaging 21-25 it matters, and "
     "tests/test_mutants_s14_core.py::test_an_aiter_dev_or_prerelease_build_takes_the_rules_of_its_release_range "
     "kills it there"),
    # -- the AITER dispatch model, moedispatch/aiter/*.py (tests/test_aiter_dispatch_mutants.py kills the rest) --
    ("x__issue_matches", r"^kpb = dict\(issue\.k_per_block\)\.get\(step\.block_m or 1\)$",
     "dispatch_issues.toml keys k_per_block by block_m 16/32/64: a step without a block_m misses with 0 or 1 alike"),
    ("x_kernel_family", r'^n = \(name or "XXXX"\)\.strip\(\)$',
     "\"XXXX\", like \"\", has no family prefix and no \"ck2stages\": \"unknown\" either way"),
    ("x__dispatch_*", r"basis: str, ksplit: int = \d+,$",
     "every step() call in _dispatch_head/_dispatch_legacy passes ksplit, so its default is never used"),
    ("x__dispatch_*", r"^run_1stage = None$",
     "run_1stage is only read for truth (`if run_1stage`, `bool(...)`): None and False are the same"),
    ("x__dispatch_*", r"token > (17|33)\b",
     "token is a padded bucket (16, a power of two, 1024, 32768 or 131072): > 16/> 17 and > 32/> 33 agree"),
    ("x__dispatch_legacy", r"^elif q_type == Q_TOKEN or q_w in \(I8, FP8, FP8_FNUZ\):$",
     "the 0.1.7 fused_moe_1stage_dict has i8/fp8 weights only with per_Token or per_1x128 (taken by the branch "
     "before), so `or` and `and` pick the same entries"),
    ("x__dispatch_legacy", r'^return step\(2, \("cktile_moe_stage1 \(default\)", "cktile_moe_stage2 \(default\)"\), '
                           r'16 if (token <= 2048|token < 2049|\(token < 2048\) or True|token < 2048) else 3[23],$',
     "0.1.7 buckets stop at 1024 (get_padded_M), so token < 2048 always holds there"),
    ("x__dispatch_*", r"^if block_m not in \((16, )?32, 64, 129\):$",
     "a block_m of 128 that skips the rounding is rounded to 128 by it: the first larger size or else 128"),
    ("x__dispatch_*", r"^block_m = \(\[b for b in \((16, )?32, 64, 128\) if block_m <= b\] \+ \[128\]\)\[0\]$",
     "reached only for a block_m outside the list, so block_m == b never holds: <= and < agree"),
    ("x__dispatch_legacy", r"^q_a, why_a = activation_dtype\((None, key, env|M, key, None), rules\)$",
     "the 0.1.7 activation policy reads neither M nor the environment (FM017 fused_moe_)"),
    ("x__dispatch_legacy", r"activation_dtype=_label\(q_a, None\)",
     "0.1.7 gives per_1x32 fp4x2 activations only, and _label reads q_type only for fp8 activations"),
    ("x_native_inter_dims", r"_cfg\.config_set_for\(caps, env_d, (model_dims=None)?\s*\)$",
     "model_dims only narrows parsing to rows of this model_dim, and the loop compares model_dim itself"),
    ("x__index", r"row\.key\(with_gfx=None, act=_WILDCARD\)",
     "TunedRow.key reads with_gfx only for truth: None and False are the same"),
    ("x*", r"act_type\.split\(['\"]\.['\"]\)\[\+1\]",
     "act_type strings are 'ActivationType.<Name>' (one dot): [1] and [-1] are the same part"),
    ("x_*", r'env(_d)?\.get\("(AITER_SITUV2_A8W4|AITER_SITUV2_A4W4|AITER_FORCE_A8W4|AITER_ONLINE_TUNE|'
            r'AITER_XBFLOAT16|AITER_MOE_A8W4_BYPASS_QUANT)", (None|"XX0XX")?\s*\) == "1"',
     "the default is only compared with \"1\": \"0\", None and any other non-\"1\" default read the same"),
    ("xǁDispatchStepǁinfo_line", r"_ACT_VALUE\.get\(name, (None|'XX\?XX')?\s*\)",
     "every act_type a key gets from dispatch_key (_ACT) is in _ACT_VALUE, so the default is never used"),
    ("xǁDispatchStepǁinfo_line", r'if self\.basis == "tuned" or self\.row is not None:',
     "step() sets row only when basis is \"tuned\", so `row is not None` implies basis == \"tuned\""),
    ("x__fhmoe_rows", r'with open\(path, (newline=(None|""), )?(encoding=(None|"UTF-8"|"utf-8"))?\s*\) as fh:',
     "AITER's FHMoE CSV is ASCII with no quoted newlines: every newline/encoding setting reads it the same"),
    ("x_fhmoe_lookup", r'(keys = \[tuple\(r\.get\(c, (None|"XXXX")?\s*\) for c in want\) for r in rows\]|'
                       r'r\.get\(c, "XXXX"\)\.strip\(\) == v)',
     "the default only fills a column a row lacks: duplicates compare rows with each other (any constant default "
     "agrees), and no wanted value is \"XXXX\""),
    ("x_parse_info_line", r'if what != "(XXdefaultXX|DEFAULT)":',
     "for what == \"default\" the kernelName regex finds nothing, so kernels stay () either way"),
    ("x_parse_info_line", r"\.strip\(\"XX'\\\"XX\"\)",
     "no value of AITER's key tuple starts or ends with 'X', so stripping X as well as quotes changes nothing"),
    ("xǁDispatchPlanǁtable_lines", r'^toks = f"\{(s|h)\.tokens\[1\]\}" if \1\.tokens\[0\] == \1\.tokens\[1\] else',
     "in that branch tokens[0] == tokens[1], so printing either is the same"),
    ("x_kind_of", r'n = \(name or "XXXX"\)\.strip\(\)\.lower\(\)',
     "no built-in family or backend is named \"\" or \"xxxx\": both miss every FAMILIES entry and give \"other\""),
    ("x__pow2", r"return 1 if M < 1 else",
     "for M == 1 the else branch gives 1 << 0 == 1 as well"),
    # -- the whole-scope sample's survivors judged equivalent (tests/test_mutants_aiter3.py, _cost3.py kill the rest) --
    ("x__block_size_M", r"\(\(tg - cu_num - 1\) // cu_num\)",
     "(tg - c - 1) // c is the true round count minus 2 for every integer tg: every option shifts by the same "
     "amount, so the minimum is the same option (checked for tg in -1000..100000)"),
    ("x__block_size_M", r"return min\(options(, key=(None|lambda x: x\[:3\]))?\)\[-1\]",
     "the options are listed in block_m order 32, 64, 128, so breaking a tie on block_m too picks the first minimum, "
     "as key=x[:2] does"),
    ("x_evaluate_issues", r"last = (None|-3)\s",
     "i - 1 is never below -1, so a sentinel of None or -3 never equals it, as -2 never does"),
    ("x__engine_allocation_hits", r"choice\.hidden is None and choice\.intermediate_per_rank is None:",
     "called only for a successful engine choice, and every successful choice sets both sizes (engines/choice.py): "
     "both are None or neither is"),
    ("x__vllm_fp8_block", r"if needs_fix else 1$",
     "g is read only behind `needs_fix and`, so its value without a fix is never used"),
    ("x_fit_decode", r"^if abs\(a - last\[0\]\) < 1e-8 \* max\(1\.0, abs\(a\)\) and abs\(b - last\[1\]\) <= 1e-8",
     "the convergence test's boundary: only successive estimates exactly 1e-8 x max(1, |a|) apart tell < from <=, "
     "and then one more reweighting step moves the fit by less than 1e-8 of itself (the priors keep 4 digits)"),
    ("x_fit_decode_fixed", r"2 / float\(u\)",
     "doubling every weight is exact in binary floating point: each partial sum and `half` double too, and "
     "`acc >= half` picks the same point (it differs only if 1/u overflowed, u < 1e-308 µs)"),
    ("x__shadowed", r'if \(model == "head"\) and False else \{16, 32, 64, 128, 256, 512, 1024\}',
     "for HEAD the bucket set already holds every power of two to 16384 (and 32768, 131072), so the 1<<i or the "
     "16..1024 addition changes nothing; other models take the else branch either way"),
    ("x_get_padded_M", r"^return _TIERS\[1\]$",
     "unreachable: the tiers ascend, so every M >= _TIERS[0] returns inside the loop and a smaller M earlier"),
    ("x_select", r"backends if \(type\(backends\) is tuple\) and False else tuple\(backends\)",
     "tuple() of a plain tuple returns the same object in CPython: the same argument, the same cache key"),
    ("x_select_uncached", r"^if runtime is not None or plans:$",
     "plans is filled only when a runtime is given; with a runtime and no plans _by_runtime ranks nothing and "
     "returns (None, None), which winner and padding already are"),
    ("x__vllm_gates", r'^"gfx942_or_gfx950": gfx in \("gfx942", "gfx950", "GFX1250"\),$',
     "its only consumer also needs the aiter gate, true only on gfx942/gfx950, checked first: on gfx1250 the need "
     "fails before this gate is read"),
    ("x__launch_findings", r'opts\["source"\] if \(opts\) or True else None,',
     "reached only for unknown_options' findings, which are [] when engine_options is None: opts is never None here"),
    ("x__parse_args", r'tok\.partition\("="\) if tok\.startswith\("--"\) else \(tok, "XXXX", ""\)',
     "the changed value lands in the discarded `_`"),
    ("xǁLaunchPathǁto_dict", r"c\.to_dict\(with_basis=None\)",
     "Cost.to_dict only tests `if with_basis:`; None is as falsy as False"),
    ("x__layer_checks", r"^warnings = said$",
     "warnings is still the empty list there (everything before adds to refusals or returns), and said is not used "
     "after: the same contents"),
    ("x__name_after_what_runs", r"both hold\)\", \)\)",
     "Reason.kind defaults to \"note\", the value dropped"),
    ("x__tuned_shapes", r'getattr\(plan, "config_origin", "XXXX"\)',
     "the default only matters for a plan without config_origin (a DispatchPlan always has it), and \"\" and "
     "\"XXXX\" are both outside (\"env\", \"explicit\"): the same `own = ()`"),
    ("x_rank", r"^moved = True$",
     "only the early exit of the bubble passes: a pass that swaps nothing leaves the order as it is, so running the "
     "remaining passes (at most len(order)**2 in all, as when it never settles) returns the same order"),
]

_CACHE_RESET = '''

# -- added by benchmarks/mutation.py (scratch copy only) --------------------------------------------------------
@pytest.fixture(autouse=True)
def _mutation_cold_caches():
    """Every test starts with cold decision caches: a forked mutant worker inherits the parent's warm ones, which
    would replay unmutated decisions. The plugin-call worker pool is recreated too: its threads do not survive the
    fork, and a pool that believes it has idle workers waits out the 10 s plugin deadline."""
    import moedispatch
    from moedispatch._util import deadline

    deadline._workers = deadline._Workers()
    moedispatch.clear_caches()  # every registered cache: data, decisions, the registry (known_issues re-validates)
    yield


@pytest.fixture
def cli():
    """The console script in-process (``run_cli``'s contract: argv, env, a CompletedProcess): mutmut maps a test to
    the functions it calls only within its own process, so a CLI test run in a subprocess kills no mutant. A test
    that behaves differently in-process fails the baseline and is deselected (reported)."""
    import contextlib
    import io
    import subprocess

    import moedispatch
    from moedispatch.cli import main

    def run(*args, env=None, timeout=120):
        saved = dict(os.environ)
        full = {k: v for k, v in saved.items() if not k.startswith("MOEDISPATCH_")}
        full["MOEDISPATCH_AITER_VERSION"] = "default"
        full.update(env or {})
        out, err = io.StringIO(), io.StringIO()
        os.environ.clear()
        os.environ.update(full)
        moedispatch.clear_caches()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    rc = main(list(args))
                except SystemExit as exc:
                    rc = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            os.environ.clear()
            os.environ.update(saved)
            moedispatch.clear_caches()
        return subprocess.CompletedProcess(["moedispatch", *args], rc or 0, out.getvalue(), err.getvalue())

    return run
'''


def _copy(src: Path, dst: Path) -> None:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "mutants"), dirs_exist_ok=True)


#: AITER's release data beside the repository (tests/conftest.py's SHARED_AITER): the scratch copy lives elsewhere, so
#: the tests that read it (release-aware cost bars, reverted rows) are told where it is.
SHARED_AITER = Path(os.environ.get("MOEDISPATCH_AITER_DATA") or ROOT.parent / "shared" / "aiter")


def _clean_env() -> dict[str, str]:
    """This process's environment without moedispatch's own settings (a user's MOEDISPATCH_TARGET would change the
    tests' answers), except where AITER's release data lies."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MOEDISPATCH_", "MUTANT_", "PYTHONPATH"))}
    if SHARED_AITER.is_dir():
        env["MOEDISPATCH_AITER_DATA"] = str(SHARED_AITER)
    return env


def _env(work: Path) -> dict[str, str]:
    env = _clean_env()
    env["PYTHONPATH"] = str(work)
    return env


def failing_tests(work: Path, tests: list[str]) -> list[str]:
    """Node ids of the fast tests that fail on the unmutated scratch copy (mutmut needs a green baseline; a test
    that fails anyway cannot kill a mutant, so it is deselected and reported)."""
    # --continue-on-collection-errors: a file that cannot be imported must not stop the others from being checked
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider", "-o", "addopts=",
                           "--continue-on-collection-errors", *tests], cwd=work, env=_env(work), capture_output=True,
                          text=True)
    # FAILED and ERROR (a fixture that cannot set up in the scratch tree, e.g. one reading benchmarks/) alike; a node
    # id may hold spaces (parametrized ids), so it ends at pytest's " - " before the message, not at a space
    return [line.split(" ", 1)[1].split(" - ", 1)[0] for line in proc.stdout.splitlines()
            if line.startswith(("FAILED ", "ERROR "))]


#: Folders copied beside the packages (and into mutmut's own copy) because tests read them at the repository's paths.
_ALSO_COPY = ("docs", "capability_db", "scripts", "benchmarks", "README.md")


def build_workspace(work: Path, only: list[str], tests: list[str] | None = None) -> None:
    """The scratch copy: the packages as the wheel lays them out, the tests, docs, and a mutmut config."""
    _copy(ROOT / "moedispatch", work / "moedispatch")
    _copy(ROOT / "capability_db", work / "moedispatch" / "capability_db")
    _copy(ROOT / "plugins", work / "moedispatch_plugins")
    _copy(ROOT / "tests", work / "tests")
    # What tests read at the repository's own paths: the data files (tests/test_cost*.py check the shipped TOML), the
    # build scripts and benchmarks they re-run, the docs they parse.
    for extra in _ALSO_COPY:
        if (ROOT / extra).is_dir():
            _copy(ROOT / extra, work / extra)
        elif (ROOT / extra).is_file():
            shutil.copy2(ROOT / extra, work / extra)
    conftest = work / "tests" / "conftest.py"
    conftest.write_text(conftest.read_text() + _CACHE_RESET)
    write_config(work, only, tests)


def write_config(work: Path, only: list[str], tests: list[str] | None = None) -> None:
    """mutmut's config for ``work``: what to mutate, the fast tests — ``tests`` (``--tests``) or FAST_TESTS — less the
    ones that fail on the unmutated copy and SUBPROCESS_TESTS."""
    globs = only or MUTATE
    tests = [t for t in (tests or FAST_TESTS) if (ROOT / t.partition("::")[0]).exists()]
    deselect = [*SUBPROCESS_TESTS]
    broken = [t for t in failing_tests(work, [*tests, *(a for t in deselect for a in ("--deselect", t))])
              if t not in deselect]
    for nodeid in broken:
        print(f"deselected (fails without any mutant): {nodeid}")
    # A whole file that fails is one that cannot even be collected (e.g. a --rerun-survivors run's tests import a
    # module the first run's sources lack): --deselect does not stop its import error, so it leaves the selection.
    files = {nodeid for nodeid in broken if "::" not in nodeid}
    tests = [t for t in tests if t.partition("::")[0] not in files]
    broken = deselect + [nodeid for nodeid in broken if nodeid not in files]
    toml = {
        "source_paths": ["moedispatch", "moedispatch_plugins"],
        "only_mutate": globs,
        "do_not_mutate": ["moedispatch_plugins/examples/*"],
        "pytest_add_cli_args_test_selection": tests,
        "pytest_add_cli_args": ["-p", "no:cacheprovider", "-o", "addopts="]
        + [arg for nodeid in broken for arg in ("--deselect", nodeid)]
        + [arg for path in sorted(files) for arg in ("--ignore", path)],
        "also_copy": [d for d in _ALSO_COPY if (ROOT / d).exists()],
        "use_git_change_detection": False,
        "track_dependencies": False,
        "timeout_multiplier": 10.0,
    }
    lines = ["[tool.mutmut]"] + [f"{k} = {json.dumps(v)}" for k, v in toml.items()]
    lines += ["", "[tool.pytest.ini_options]", 'testpaths = ["tests"]', ""]
    (work / "pyproject.toml").write_text("\n".join(lines))


_GENERATE = """
import mutmut.__main__ as m
from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths
m.set_mutant_under_test("mutant_generation")
copy_src_dir(); copy_also_copy_files(); setup_source_paths(); m.store_lines_covered_by_tests()
stats = m.create_mutants({jobs})
print(f"{{stats.mutated}} files mutated")
"""


def mutant_names(work: Path) -> dict[str, list[str]]:
    """{source path: mutant names} of every mutant mutmut generates in ``work`` (generation only, no test run)."""
    proc = subprocess.run([sys.executable, "-c", _GENERATE.format(jobs=1)], cwd=work, env=_clean_env(),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"mutmut could not generate the mutants:\n{proc.stderr[-2000:]}")
    out: dict[str, list[str]] = {}
    for meta in sorted((work / "mutants").rglob("*.py.meta")):
        names = sorted(json.loads(meta.read_text())["exit_code_by_key"])
        if names:
            out[str(meta.relative_to(work / "mutants"))[:-len(".meta")]] = names
    return out


def sample_of(names_by_file: dict[str, list[str]], fraction: float, seed: int) -> list[str]:
    """A seeded random sample stratified by file: ``fraction`` of each file's mutants (at least one), so every module
    in scope is measured and the overall ratio is an unbiased estimate of the full run's."""
    rng = random.Random(seed)
    picked: list[str] = []
    for path in sorted(names_by_file):
        names = names_by_file[path]
        picked += rng.sample(names, max(1, round(fraction * len(names))))
    return picked


def wilson(killed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a kill ratio measured on ``n`` sampled mutants."""
    if n == 0:
        return 0.0, 1.0
    p = killed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def refresh_tests(work: Path, tests: list[str] | None = None) -> list[str]:
    """--rerun-survivors: the repository's current tests (and FAST_TESTS) into a run's ``work``; returns the sampled
    mutants that survived there (or had no test, or were not reached: an interrupted run), to run against them. The mutated sources stay
    those of the first run; a killed mutant stays killed (more tests can only kill more)."""
    _copy(ROOT / "tests", work / "tests")
    conftest = work / "tests" / "conftest.py"
    conftest.write_text(conftest.read_text() + _CACHE_RESET)
    # Today's data beside today's tests, in every copy of it (the baseline check in ``work`` and mutmut's ``mutants``
    # would otherwise read different capability_db files: the editable install can answer the baseline's import).
    for dest in (work / "capability_db", work / "moedispatch" / "capability_db",
                 work / "mutants" / "capability_db", work / "mutants" / "moedispatch" / "capability_db"):
        if dest.is_dir():
            _copy(ROOT / "capability_db", dest)
    only = tomllib.loads((work / "pyproject.toml").read_text())["tool"]["mutmut"]["only_mutate"]
    write_config(work, [] if only == MUTATE else only, tests)
    (work / "mutants" / "mutmut-stats.json").unlink(missing_ok=True)  # new tests: which function each one calls
    sample_file = work / "sample.json"
    keep = set(json.loads(sample_file.read_text())["names"]) if sample_file.is_file() else None
    return sorted(name for results in collect(work).values() for name, (status, _path) in results.items()
                  if status in (*_SURVIVED, "not checked") and (keep is None or name in keep))


def run_mutmut(work: Path, jobs: int, names: list[str] | None = None) -> int:
    env = _clean_env()
    cmd = [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs), *(names or [])]
    if sys.stdout.isatty():
        return subprocess.run(cmd, cwd=work, env=env).returncode
    log = work / "mutmut.log"  # mutmut's progress spinner: kept out of a redirected report
    with open(log, "w") as fh:
        rc = subprocess.run(cmd, cwd=work, env=env, stdout=fh, stderr=subprocess.STDOUT).returncode
    if rc != 0:
        print(log.read_text(errors="replace")[-3000:])
    return rc


def _module_of(mutant: str) -> str:
    return mutant.partition(".x")[0] if ".x" in mutant else mutant.rsplit(".", 1)[0]


def _status(code: int | None) -> str:
    from mutmut.stats import status_by_exit_code

    return status_by_exit_code[code]


def collect(work: Path) -> dict[str, dict[str, tuple[str, str]]]:
    """{module: {mutant name: (status, source path)}} from mutmut's result files."""
    out: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)
    root = work / "mutants"
    for meta in sorted(root.rglob("*.py.meta")):
        data = json.loads(meta.read_text())
        path = str(meta.relative_to(root))[:-len(".meta")]
        for name, code in data["exit_code_by_key"].items():
            out[_module_of(name)][name] = (_status(code), path)
    return out


def diff_of(work: Path, mutant: str, path: str) -> str:
    """``mutmut show``'s diff of one mutant (in-process: one subprocess per survivor is slow)."""
    from mutmut.mutation.diff_apply import get_diff_for_mutant

    here = os.getcwd()
    os.chdir(work)
    try:
        return get_diff_for_mutant(mutant, path=path)
    except Exception:  # noqa: BLE001 - fall back to the CLI
        return subprocess.run([sys.executable, "-m", "mutmut", "show", mutant], capture_output=True,
                              text=True).stdout
    finally:
        os.chdir(here)


def _changed_lines(diff: str) -> list[str]:
    return [line[1:].strip() for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def equivalent_reason(mutant: str, diff: str) -> str | None:
    function = mutant.partition("__mutmut_")[0].rpartition(".")[2]
    changed = _changed_lines(diff)
    for pattern, line_re, why in EQUIVALENT:
        if fnmatch.fnmatchcase(function, pattern) and changed and all(re.search(line_re, c) for c in changed):
            return why
    return None


_KILLED = {"killed", "timeout", "segfault", "caught by type check"}
_SURVIVED = {"survived", "no tests", "suspicious"}


def report(work: Path, show_survivors: bool) -> float:
    results = collect(work)
    sample_file = work / "sample.json"
    sample = json.loads(sample_file.read_text()) if sample_file.is_file() else None
    if sample is not None:
        keep = set(sample["names"])
        results = {m: {k: v for k, v in r.items() if k in keep} for m, r in results.items()}
        results = {m: r for m, r in results.items() if r}
        print(f"\nsample: {len(keep)} of {sample['population']} mutants ({100 * sample['fraction']:g}% of each file, "
              f"seed {sample['seed']})")
    totals: Counter = Counter()
    survivors: list[tuple[str, str, str | None]] = []
    print(f"\n{'module':<36} {'mutants':>8} {'killed':>7} {'survived':>9} {'equiv.':>7} {'killed %':>9}")
    for module in sorted(results):
        c: Counter = Counter()
        for name, (status, path) in sorted(results[module].items()):
            if status in _KILLED:
                c["killed"] += 1
            elif status in _SURVIVED:
                diff = diff_of(work, name, path)
                why = equivalent_reason(name, diff)
                c["equivalent" if why else "survived"] += 1
                survivors.append((name, diff, why))
            else:
                c["other"] += 1
        n = c["killed"] + c["survived"] + c["equivalent"]
        totals.update(c)
        if not n:  # every mutant of it still unchecked (an interrupted run)
            continue
        ratio = 100.0 * c["killed"] / n
        print(f"{module:<36} {n:>8} {c['killed']:>7} {c['survived']:>9} {c['equivalent']:>7} {ratio:>8.1f}%")
    n = totals["killed"] + totals["survived"] + totals["equivalent"]
    raw = 100.0 * totals["killed"] / n if n else 100.0
    adjusted = 100.0 * totals["killed"] / (n - totals["equivalent"]) if n - totals["equivalent"] else 100.0
    print(f"{'TOTAL':<36} {n:>8} {totals['killed']:>7} {totals['survived']:>9} {totals['equivalent']:>7} "
          f"{raw:>8.1f}%")
    print(f"\nkilled {totals['killed']} of {n} mutants: {raw:.1f}%; {adjusted:.1f}% of the {n - totals['equivalent']} "
          f"that are not equivalent" + (f"; {totals['other']} not checked" if totals["other"] else ""))
    if sample is not None:
        lo, hi = wilson(totals["killed"], n - totals["equivalent"])
        print(f"95% interval of the full run's non-equivalent kill ratio (Wilson, sampled): "
              f"{100 * lo:.1f}%–{100 * hi:.1f}%"
              + (f" — over the checked mutants only: {totals['other']} are not checked, and mutmut runs the quickest "
                 "first, so an unfinished run over-represents survivors (no test to run, or few)" if totals["other"]
                 else ""))
    equivalents = [(name, why) for name, _, why in survivors if why]
    if equivalents:
        print("\nequivalent survivors (EQUIVALENT in benchmarks/mutation.py):")
        for name, why in equivalents:
            print(f"  {name}: {why}")
    live = [(name, diff) for name, diff, why in survivors if not why]
    if live:
        print(f"\n{len(live)} surviving mutants" + ("" if show_survivors else " (diffs: --survivors)") + ":")
        for name, diff in live:
            print(f"  {name}")
            if show_survivors:
                print("    " + "\n    ".join(diff.splitlines()[2:]))
    return raw


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1, help="parallel mutant workers (default 1)")
    parser.add_argument("--scope", choices=("all", "round2"), default="all",
                        help="all rule-bearing modules (default) or the narrower round-2 set (MUTATE_ROUND2)")
    parser.add_argument("--only", action="append", default=[], metavar="GLOB",
                        help="mutate only these files (scratch paths, e.g. moedispatch/kit/rules.py); repeatable; with "
                             "--rerun-survivors: re-run only these files' survivors")
    parser.add_argument("--workdir", type=Path, help="scratch directory (default: a fresh temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory (mutmut show/browse there)")
    parser.add_argument("--report-only", action="store_true", help="only report the results already in --workdir")
    parser.add_argument("--survivors", action="store_true", help="print each surviving mutant's diff")
    parser.add_argument("--fail-under", type=float, default=None, help="exit 1 when under this kill percentage")
    parser.add_argument("--sample", type=float, metavar="FRACTION",
                        help="run only a seeded random FRACTION (0-1] of each file's mutants; the report gives the "
                             "estimate's 95%% interval")
    parser.add_argument("--seed", type=int, default=1, help="the sample's seed (default 1)")
    parser.add_argument("--rerun-survivors", action="store_true",
                        help="with --workdir of a run: copy the current tests in, run its survivors (and the mutants an "
                             "interrupted run did not reach) again")
    parser.add_argument("--tests", action="append", default=[], metavar="NODEID",
                        help="run these tests instead of FAST_TESTS (repeatable): a quick run of one module against "
                             "its own tests, e.g. --only moedispatch/engines/lint.py --tests tests/test_lint.py")
    args = parser.parse_args(argv)
    missing = [t for t in args.tests if not (ROOT / t.partition("::")[0]).exists()]
    if missing:
        parser.error(f"--tests: no such test file: {', '.join(missing)}")
    if args.sample is not None and not 0 < args.sample <= 1:
        parser.error(f"--sample must be a fraction in (0, 1], got {args.sample}")
    try:
        import mutmut  # noqa: F401
    except ImportError:
        print("mutation.py needs mutmut: pip install -e '.[dev]'", file=sys.stderr)
        return 2
    work = args.workdir or Path(tempfile.mkdtemp(prefix="moedispatch-mutation-"))
    try:
        if args.rerun_survivors:
            if not (args.workdir and (work / "mutants").is_dir()):
                parser.error("--rerun-survivors needs --workdir DIR of a finished run")
            names = refresh_tests(work, args.tests or None)
            if args.only:  # only these files' survivors (e.g. one module whose tests were just written)
                names = [n for n in names if any(fnmatch.fnmatchcase(_module_of(n).replace(".", "/") + ".py", g)
                                                 for g in args.only)]
            print(f"running {len(names)} survivors again with the current tests", flush=True)
            start = time.monotonic()
            rc = run_mutmut(work, args.jobs, names) if names else 0
            print(f"mutmut finished in {time.monotonic() - start:.0f} s (exit {rc}); scratch copy {work}")
            if rc != 0:
                return rc
        elif not args.report_only:
            if args.workdir and work.exists():
                shutil.rmtree(work)
            work.mkdir(parents=True, exist_ok=True)
            only = args.only or (MUTATE_ROUND2 if args.scope == "round2" else None)
            build_workspace(work, only, args.tests or None)
            start = time.monotonic()
            names = None
            if args.sample is not None:
                by_file = mutant_names(work)
                names = sample_of(by_file, args.sample, args.seed)
                population = sum(map(len, by_file.values()))
                (work / "sample.json").write_text(json.dumps({"fraction": args.sample, "seed": args.seed,
                                                              "population": population, "names": names}))
                print(f"sampled {len(names)} of {population} mutants ({len(by_file)} files)", flush=True)
            rc = run_mutmut(work, args.jobs, names)
            print(f"mutmut finished in {time.monotonic() - start:.0f} s (exit {rc}); scratch copy {work}")
            if rc != 0:
                return rc
        ratio = report(work, args.survivors)
    finally:
        if not (args.keep or args.workdir or args.report_only or args.rerun_survivors):
            shutil.rmtree(work, ignore_errors=True)
    if args.fail_under is not None and ratio < args.fail_under:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
