"""In-process boundary cases of small rule-bearing modules that mutation testing found under-tested: the fleet's
engine check (engines/fleet.py, otherwise reached only through the CLI in a subprocess), AITER release pinning
(aiter/pin.py), the tuned-row lookup (aiter/lookup.py), the backend registry (selector/plugins.py) and the run-time
what-if switches (selector/runtime.py). Each test pins one rule on a real model, target and release."""

from __future__ import annotations

import pytest

from moedispatch.core.errors import UsageError

# -- moedispatch/engines/fleet.py: check_engine and _lost_env -----------------------------------------------------

MINIMAX = "MiniMax-M3-MXFP4"
A20 = "0.1.20.post1"
GPTOSS = "GPTOSS_SWIGLU_MXFP4_BF16_BOUND"
EXTRA_P = "VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY"
EXTRA_N = "VLLM_RAY_EXTRA_ENV_VARS_TO_COPY"


def _fleet(model, nodes, *roles):
    """A fleet report planned in-process, as `moedispatch fleet --from` makes it from probe files."""
    from moedispatch.plan.fleet import Node, plan_fleet
    from moedispatch.plan.roles import parse_role
    from moedispatch.sources.models import load_model

    made = [Node(name, target, aiter, tuple(sorted(env.items())), f"{name}.json") for name, target, aiter, env in nodes]
    return plan_fleet(load_model(model), made, [parse_role(r) for r in roles])


def _ray_env():
    from moedispatch.engines.recipes import engine_data

    return engine_data("vllm")["vllm"]["ray_env"]


def test_fleet_engine_names_the_release_each_node_launches():
    """check_engine records `engine version` of the recipes it built (the release a bare `--engine vllm` resolves to
    is the newest capability_db knows, vLLM 0.33.0), and a release the user pins stays pinned."""
    from moedispatch.engines.fleet import check_engine

    report = check_engine(_fleet(MINIMAX, [("n1", "MI355X", A20, {})], "decode:tp=8,tokens=1-512"), "vllm")
    assert report.engine == "vllm 0.33.0" and report.engine_errors == {} and report.launch_problems == []
    report = check_engine(_fleet(MINIMAX, [("n1", "MI355X", A20, {})], "decode:tp=8,tokens=1-512"), "vllm@0.32.0")
    assert report.engine == "vllm 0.32.0"


def test_fleet_engine_without_any_plan_still_names_the_engine():
    """A report with no node plan built no recipe: the engine is named without a release (`report.engine or
    engine`)."""
    from moedispatch.engines.fleet import check_engine
    from moedispatch.plan.fleet import FleetReport

    assert check_engine(FleetReport(nodes=[], roles=[]), "sglang").engine == "sglang"


def test_fleet_engine_refusal_is_the_recipes_first_reason_per_role_and_node():
    """A plan the engine cannot launch (MiniMax-M3-MXFP8 on MI300X TP2 under vLLM: ~397 GiB of BF16-dequantized
    experts per rank vs 177 GiB usable, vllm/config/cache.py gpu_memory_utilization) is the fleet's problem, keyed
    (role, node), with the recipe's first refusal as its text."""
    from moedispatch.engines.fleet import check_engine
    from moedispatch.engines.recipes import build_recipe

    report = _fleet("MiniMax-M3-MXFP8", [("m1", "MI300X", "0.1.15.post3", {})], "all:tp=2,tokens=1-8192")
    recipe = build_recipe(report.roles[0].plans["m1"], "vllm", alternatives=False)
    check_engine(report, "vllm")
    assert not recipe.ok
    assert report.engine_errors == {("all", "m1"): recipe.refusals[0].text}
    assert report.engine_errors[("all", "m1")].startswith("weights do not fit: ~397 GiB per rank")
    assert any("cannot launch its plan: weights do not fit" in p for p in report.problems())


def test_fleet_engine_reference_only_launch_is_a_problem_with_its_reason():
    """A launch that is realizable only on the slow reference path (Backend.reference_only: emulation) is not
    servable: DeepSeek-V4-Pro TP8 with AITER_BF16_FP8_MOE_BOUND=0 on vLLM 0.33 (FlyDSL at vLLM's 512 allocation is
    aiter-pr#3538) — the error names the backend and the recipe's "cannot carry out" warning."""
    from moedispatch.engines.fleet import check_engine

    report = _fleet("DeepSeek-V4-Pro", [("n1", "MI355X", A20, {"AITER_BF16_FP8_MOE_BOUND": "0"})],
                    "all:tp=8,tokens=1-8192")
    check_engine(report, "vllm")
    why = report.engine_errors[("all", "n1")]
    assert why.startswith("only the slow reference path (emulation, do not serve): vllm 0.33.0 cannot carry out "
                          "the plan's first choice — recipe uses emulation instead.")
    assert "aiter-pr#3538" in why


def test_fleet_engine_reference_only_first_choice_is_a_problem_without_a_reason():
    """MiniMax-M3-MXFP8 TP8 on MI300X (gfx942: no native MX matrix ops) plans emulation itself, the slow reference
    path (vllm-project/vllm#50817): no "cannot carry out" warning exists, so the error is the bare do-not-serve line."""
    from moedispatch.engines.fleet import check_engine

    report = _fleet("MiniMax-M3-MXFP8", [("m1", "MI300X", "0.1.15.post3", {})], "all:tp=8,tokens=1-8192")
    check_engine(report, "vllm")
    assert report.engine_errors == {("all", "m1"): "only the slow reference path (emulation, do not serve)"}


def test_fleet_ray_is_modelled_for_vllm_only():
    """--data-parallel-backend ray models vLLM's Ray DP actors only (capability_db/engines.toml [vllm.ray_env]):
    another engine is a one-line UsageError before anything is planned."""
    from moedispatch.engines.fleet import check_engine

    report = _fleet(MINIMAX, [("n1", "MI355X", A20, {})], "decode:tp=8,tokens=1-512")
    with pytest.raises(UsageError, match=r"only vLLM's Ray data-parallel actors are modelled "
                                         r"\(capability_db/engines.toml \[vllm.ray_env\]\), not sglang's"):
        check_engine(report, "sglang", data_parallel_backend="ray", environ={})
    check_engine(report, "sglang", data_parallel_backend="mp", environ={})  # another backend: no Ray check
    assert report.launch_problems == []


def test_fleet_ray_outside_the_modelled_vllm_releases_is_an_error():
    """[vllm.ray_env] versions (>=0.33,<0.34, read at v0.33.0): what vLLM 0.32 copies to its actors is not modelled,
    so a launchable plan there is a UsageError naming the covered releases."""
    from moedispatch.engines.fleet import check_engine

    report = _fleet(MINIMAX, [("n1", "MI355X", A20, {})], "decode:tp=8,tokens=1-512")
    with pytest.raises(UsageError, match=r"what vLLM 0.32.0 copies to its Ray actors is not modelled "
                                         r"\(capability_db/engines.toml \[vllm.ray_env\] covers >=0.33,<0.34\)"):
        check_engine(report, "vllm@0.32.0", data_parallel_backend="ray", environ={})


def test_fleet_ray_release_check_only_for_launchable_plans():
    """The Ray environment check applies to a recipe that launches: a refused plan (MiniMax-M3-MXFP8 TP2 on MI300X
    does not fit) at an unmodelled vLLM release reports the refusal, not the Ray modelling gap."""
    from moedispatch.engines.fleet import check_engine

    report = _fleet("MiniMax-M3-MXFP8", [("m1", "MI300X", "0.1.15.post3", {})], "all:tp=2,tokens=1-8192")
    check_engine(report, "vllm@0.32.0", data_parallel_backend="ray", environ={})
    assert list(report.engine_errors) == [("all", "m1")] and report.launch_problems == []


def test_fleet_ray_lost_switch_is_one_line_per_role_naming_its_nodes():
    """MiniMax-M3-MXFP4 TP8 decode on vLLM 0.33 needs GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 (tests/test_fleet.py): vLLM
    copies only VLLM_… (and the other default prefixes) to its Ray DP actors (vllm/ray/ray_env.py), so nodes that do
    not set it share one line; a node that sets it itself, and the prefill role (no such switch), are not named."""
    from moedispatch.engines.fleet import check_engine

    report = _fleet(MINIMAX, [("n1", "MI355X", A20, {}), ("n2", "MI355X", A20, {}),
                              ("n3", "MI355X", A20, {GPTOSS: "0"})],
                    "decode:tp=8,tokens=1-512", "prefill:tp=8,tokens=1024-16384")
    existing = "role x: a problem found before the engine check"
    report.launch_problems.append(existing)
    check_engine(report, "vllm", data_parallel_backend="ray", environ={})
    assert report.engine_errors == {}
    assert report.launch_problems[0] == existing and len(report.launch_problems) == 2
    line = report.launch_problems[1]
    assert line.startswith(f"role decode: node(s) n1, n2: the vLLM recipe for its plan exports {GPTOSS}=0 (the launch "
                           "realizes the plan only with it), which vLLM's Ray data-parallel actors will not receive")
    assert f"fix: export {EXTRA_P}=GPTOSS_ where vLLM is launched" in line
    assert line.endswith(f"[{_ray_env()['source']}]")


@pytest.mark.parametrize("shell", [{EXTRA_P: "GPTOSS_"}, {EXTRA_P: " NCCL_ , GPTOSS_ ,"}, {EXTRA_N: GPTOSS},
                                   {EXTRA_N: f" {GPTOSS} ,"}])
def test_fleet_ray_extra_copy_variables_of_the_shell_reach_the_actors(shell):
    """vLLM adds the comma-separated prefixes/names of VLLM_RAY_EXTRA_ENV_VAR_PREFIXES_TO_COPY /
    VLLM_RAY_EXTRA_ENV_VARS_TO_COPY (whitespace stripped, empty items dropped) to what it copies from the launching
    shell (vllm/ray/ray_env.py get_env_vars_to_copy): the switch then reaches every node."""
    from moedispatch.engines.fleet import check_engine

    report = _fleet(MINIMAX, [("n1", "MI355X", A20, {})], "decode:tp=8,tokens=1-512")
    check_engine(report, "vllm", data_parallel_backend="ray", environ=shell)
    assert report.launch_problems == []


def test_fleet_ray_default_shell_is_this_process_environment(monkeypatch):
    """environ=None reads the launching shell from os.environ: an exported extra prefix there fixes the loss."""
    from moedispatch.engines.fleet import check_engine

    monkeypatch.setenv(EXTRA_P, "GPTOSS_")
    report = _fleet(MINIMAX, [("n1", "MI355X", A20, {})], "decode:tp=8,tokens=1-512")
    assert check_engine(report, "vllm", data_parallel_backend="ray").launch_problems == []
    monkeypatch.delenv(EXTRA_P)
    monkeypatch.delenv(EXTRA_N, raising=False)
    report = _fleet(MINIMAX, [("n1", "MI355X", A20, {})], "decode:tp=8,tokens=1-512")
    assert len(check_engine(report, "vllm", data_parallel_backend="ray").launch_problems) == 1


def test_ray_lost_env_copied_prefixes_and_names_reach_the_actors():
    """[vllm.ray_env] prefixes (VLLM_, NCCL_, HF_ …) and names (PYTHONHASHSEED) are copied from the launching shell
    (vllm/ray/ray_env.py DEFAULT_ENV_VAR_PREFIXES, DEFAULT_EXTRA_ENV_VARS): nothing is lost."""
    from moedispatch.engines.fleet import _lost_env

    needed = [{"name": "VLLM_ROCM_USE_AITER", "value": "1"}, {"name": "NCCL_MIN_NCHANNELS", "value": "112"},
              {"name": "PYTHONHASHSEED", "value": "0"}]
    assert _lost_env(_ray_env(), needed, {}, {}) is None


def test_ray_lost_env_node_must_set_the_same_value():
    """A variable reaches the actors from the node's own environment only with the value the recipe needs: a node
    exporting GPTOSS_SWIGLU_MXFP4_BF16_BOUND=1 still loses =0."""
    from moedispatch.engines.fleet import _lost_env

    needed = [{"name": GPTOSS, "value": "0"}]
    assert _lost_env(_ray_env(), needed, {GPTOSS: "0"}, {}) is None
    line = _lost_env(_ray_env(), needed, {GPTOSS: "1"}, {})
    assert line is not None and line.startswith(
        f"the vLLM recipe for its plan exports {GPTOSS}=0 (the launch realizes the plan only with it), which")


def test_ray_lost_env_names_every_lost_variable_and_keeps_the_users_prefixes_first():
    """Every lost variable is named in order; the fix keeps the prefixes the shell already copies, then adds each
    missing prefix (its name up to the first `_`) sorted, once (tests/test_lint_ray.py words the same fix)."""
    from moedispatch.engines.fleet import _lost_env

    ray = _ray_env()
    needed = [{"name": GPTOSS, "value": "0"}, {"name": "AITER_LOG_MORE", "value": "1"},
              {"name": "AITER_BF16_FP8_MOE_BOUND", "value": "0"}, {"name": "VLLM_ROCM_USE_AITER", "value": "1"}]
    line = _lost_env(ray, needed, {}, {})
    assert line == (f"the vLLM recipe for its plan exports {GPTOSS}=0, AITER_LOG_MORE=1, AITER_BF16_FP8_MOE_BOUND=0 (the "
                    "launch realizes the plan only with it), which vLLM's Ray "
                    "data-parallel actors will not receive: this node's environment does not set it and vLLM copies "
                    f"only {', '.join(ray['prefixes'])} variables (and {EXTRA_P}) from the launching shell; fix: "
                    f"export {EXTRA_P}=AITER_,GPTOSS_ where vLLM is launched (or set it in the node's environment) "
                    f"[{ray['source']}]")
    line = _lost_env(ray, needed, {}, {EXTRA_P: "MORI_, GPTOSS_", EXTRA_N: "AITER_LOG_MORE"})
    assert line is not None and line.startswith(
        "the vLLM recipe for its plan exports AITER_BF16_FP8_MOE_BOUND=0 (the launch realizes the plan only with it), which")
    assert f"export {EXTRA_P}=MORI_,GPTOSS_,AITER_ where" in line
    line = _lost_env(ray, needed, {}, {EXTRA_N: "AITER_LOG_MORE,AITER_BF16_FP8_MOE_BOUND"})
    assert line is not None and line.startswith(
        f"the vLLM recipe for its plan exports {GPTOSS}=0 (the launch realizes the plan only with it), which")


# -- moedispatch/aiter/pin.py: the pinned tuned set for ROCm/aiter#3933 ------------------------------------------

PIN_ENV = {"AITER_BF16_FP8_MOE_BOUND": "0"}


def _dsv4_a8w4():
    """DeepSeek-V4 a8w4 at 7168 × 512/rank, 384 experts, top-6 (tests/test_pin.py's motivating layer)."""
    from moedispatch.testing import layer

    return layer(hidden_size=7168, intermediate_size=3072, num_experts=384, top_k=6, tp_size=6, weight_quant="mxfp4",
                 activation_quant="fp8", activation_granularity="group32", model_type="deepseek_v4")


@pytest.fixture(scope="module")
def pin_case():
    from moedispatch.aiter import dispatch as ad
    from moedispatch.aiter import pin
    from moedispatch.data import aiter_configs as cfg
    from moedispatch.testing import fake_capabilities

    caps = fake_capabilities("MI355X", A20)
    lay = _dsv4_a8w4()
    dp = ad.plan_dispatch(lay, caps, tokens=(1, 2, 4, 8, 16), env=PIN_ENV)
    cs = cfg.config_set_for(caps, PIN_ENV, model_dims=frozenset({7168}))
    return caps, lay, dp, cs, pin.find_pins(lay, caps, dp, env=PIN_ENV)


def test_pin_describes_both_rows_and_the_issue(pin_case):
    """A pin names the pinned bucket, the neighbour row's kernels and place, the replaced row's kernels and place,
    and the issue (ROCm/aiter#3933: bucket 4's _xcd4 stage-1 kernel, pinned to bucket 2's)."""
    *_, (p,) = pin_case
    good, bad = p.good, p.bad
    assert p.describe() == (f"bucket 4: {good.kernel1} + {good.kernel2} (the bucket-2 row, {good.file}:{good.line}) "
                            f"instead of {bad.kernel1} + {bad.kernel2} ({bad.file}:{bad.line}, [ROCm/aiter#3933])")
    one_stage = p.__class__(p.issue, 4, bad._replace(kernel2=""), good._replace(kernel2=""))
    assert one_stage.describe() == (f"bucket 4: {good.kernel1} (the bucket-2 row, {good.file}:{good.line}) instead "
                                    f"of {bad.kernel1} ({bad.file}:{bad.line}, [ROCm/aiter#3933])")


def test_pin_to_dict_names_what_it_replaces_and_where_the_kernels_come_from(pin_case):
    """The pin's JSON: issue, bucket, the replaced row's place, the kernels and the row (and bucket) they come from."""
    *_, (p,) = pin_case
    assert p.to_dict() == {"issue": "ROCm/aiter#3933", "bucket": 4, "replaces": p.bad.where,
                           "kernels": [p.good.kernel1, p.good.kernel2], "from": p.good.where, "from_bucket": 2}
    assert p.bad.where.endswith("dsv4_fp8fp4_tuned_fmoe.csv:4") and p.good.where.endswith("dsv4_fp8fp4_tuned_fmoe.csv:3")


@pytest.mark.parametrize("field, value", [
    ("gfx", "gfx942"), ("cu_num", 80), ("model_dim", 6144), ("inter_dim", 256), ("expert", 256), ("topk", 8),
    ("act_type", "ActivationType.Swiglu"), ("dtype", "torch.float16"), ("q_dtype_a", "torch.float4_e2m1fn_x2"),
    ("q_dtype_w", "torch.float8_e4m3fn"), ("q_type", "QuantType.per_1x128"), ("use_g1u1", 0),
    ("doweight_stage1", 1), ("tag", "flydsl_fallback")])
def test_pin_neighbour_must_share_every_merge_key_field_but_the_bucket(pin_case, field, value):
    """A neighbour is the same tuned shape at another bucket: any other key field (AITER's merge keys, and the _tag)
    makes it another shape, never a pin source."""
    from moedispatch.aiter import pin

    *_, (p,) = pin_case
    assert pin._same_key(p.good, p.bad)
    other = p.good._replace(**{field: value})
    assert not pin._same_key(other, p.bad) and not pin._same_key(p.bad, other)
    assert pin._neighbours([other], p.bad) == []


def test_pin_neighbours_nearest_in_log2_smaller_bucket_first(pin_case):
    """Neighbours are ordered by |log2 bucket - log2 4|, the smaller bucket first on a tie, the bad bucket itself
    excluded: 2, 8, 1, 16, 32, … for the bucket-4 row of ROCm/aiter#3933."""
    from moedispatch.aiter import pin

    _, _, _, cs, (p,) = pin_case
    order = [r.token for r in pin._neighbours(cs.rows, p.bad)]
    assert order[:6] == [2, 8, 1, 16, 32, 64] and 4 not in order
    assert order == sorted(order, key=lambda t: (abs(t.bit_length() - 3), t))


def test_pinned_rows_replace_only_the_bad_row_in_place(pin_case):
    """The pinned set is the whole merged set, in merge order, with the bad row swapped for the pinned one (the good
    row's kernels at the bad row's bucket, file "(pinned)")."""
    from moedispatch.aiter import pin

    _, _, _, cs, pins = pin_case
    p = pins[0]
    rows = list(cs.rows)
    out = pin.pinned_rows(rows, pins)
    i = rows.index(p.bad)
    assert len(out) == len(rows) and out[:i] == rows[:i] and out[i + 1:] == rows[i + 1:]
    assert out[i] == p.row() and (out[i].token, out[i].kernel1, out[i].file, out[i].line) == (4, p.good.kernel1,
                                                                                                "(pinned)", 0)


def test_pinned_csv_cells(pin_case):
    """AITER's tuned-fmoe CSV: the COLUMNS header, one line per row with its gfx (also a backfilled one), empty cells
    for missing timings, floats as written, and a final newline."""
    from moedispatch.aiter import pin

    _, _, _, cs, (p,) = pin_case
    text = pin.pinned_csv([p.bad], [p])
    header, line = text.splitlines()
    assert text.endswith("\n") and text.count("\n") == 2 and header == ",".join(pin.COLUMNS)
    cells = dict(zip(pin.COLUMNS, line.split(",")))
    assert len(line.split(",")) == len(pin.COLUMNS)
    r = p.row()
    assert cells["gfx"] == "gfx950" and cells["token"] == "4" and cells["kernelName1"] == r.kernel1
    assert cells["kernelName2"] == r.kernel2 and cells["us1"] == repr(r.us1) and cells["_tag"] == ""
    assert cells["q_type"] == "QuantType.per_1x32" and cells["block_m"] == str(r.block_m)
    backfilled = next(row for row in cs.rows if row.gfx_backfilled)
    assert pin._cell(backfilled, "gfx") == backfilled.gfx and backfilled.gfx
    assert pin._cell(backfilled, "token") == str(backfilled.token)      # only the gfx cell is the backfilled gfx
    assert pin._cell(backfilled, "kernelName1") == backfilled.kernel1
    assert pin._cell(r._replace(us1=None), "us1") == ""


@pytest.mark.parametrize("bad", ["a,b", 'a"b', "a\nb"])
def test_pinned_csv_refuses_a_cell_it_cannot_write(pin_case, bad):
    """A value with a comma, quote or newline cannot be a plain CSV cell of AITER's reader: a UsageError naming the
    row and column, not a silently shifted file."""
    from moedispatch.aiter import pin

    *_, (p,) = pin_case
    row = p.bad._replace(kernel1=bad)
    with pytest.raises(UsageError, match=rf"tuned row {row.file}:{row.line}: kernelName1 .* cannot be written as a "
                                         "CSV cell"):
        pin.pinned_csv([row])


def test_write_pinned_writes_the_csv_with_unix_newlines(pin_case, tmp_path):
    """write_pinned writes exactly pinned_csv's text to a new file (UTF-8, "\\n" line ends)."""
    from moedispatch.aiter import pin

    _, _, _, cs, pins = pin_case
    rows = cs.rows[:20]
    path = tmp_path / "pins.csv"
    pin.write_pinned(str(path), rows, pins)
    assert path.read_bytes() == pin.pinned_csv(rows, pins).encode("utf-8")


def test_find_pins_covers_a_hit_spanning_several_tokens():
    """ROCm/aiter#3933 reaches decode batch 3-4 (bucket 4): with tokens 1-8 the step (3, 4) is pinned once, the
    clean buckets are not, and the pinned set then dispatches bucket 4 on the neighbour's kernels with no issue."""
    from moedispatch.aiter import dispatch as ad
    from moedispatch.aiter import pin
    from moedispatch.testing import fake_capabilities

    caps = fake_capabilities("MI355X", A20)
    lay = _dsv4_a8w4()
    dp = ad.plan_dispatch(lay, caps, tokens=(1, 2, 3, 4, 5, 8), env=PIN_ENV)
    (p,) = pin.find_pins(lay, caps, dp, env=PIN_ENV)
    assert (p.issue, p.bucket, p.bad.token, p.good.token) == ("ROCm/aiter#3933", 4, 4, 2)


def test_find_pins_dispatches_at_the_engines_padded_allocation():
    """DeepSeek-V4 a8w4 TP8 is 384/rank; an engine that allocates 512 (zero-filled, kernel pad 0) dispatches AITER's
    7168 × 512 key, where ROCm/aiter#3933 marks bucket 4: the pin is found only when the trial dispatch uses the same
    padding (plan/pinning.py passes the decision's padding)."""
    from moedispatch.aiter import dispatch as ad
    from moedispatch.aiter import pin
    from moedispatch.core.backend import Padding
    from moedispatch.testing import fake_capabilities, layer

    caps = fake_capabilities("MI355X", A20)
    lay = layer(hidden_size=7168, intermediate_size=3072, num_experts=384, top_k=6, tp_size=8, weight_quant="mxfp4",
                activation_quant="fp8", activation_granularity="group32", model_type="deepseek_v4")
    pad = Padding(hidden=7168, intermediate_per_rank=512, intermediate_pad=128, kernel_intermediate_pad=0,
                  zero_fill=True)
    dp = ad.plan_dispatch(lay, caps, tokens=(1, 2, 4, 8), env=PIN_ENV, padding=pad)
    assert dp.key.inter_dim == 512 and [h.issue for h in dp.issues] == ["ROCm/aiter#3933"]
    (p,) = pin.find_pins(lay, caps, dp, env=PIN_ENV, padding=pad)
    assert (p.bucket, p.good.token, p.good.inter_dim) == (4, 2, 512)


def test_find_pins_reads_the_tuned_set_aiter_config_fmoe_names(pin_case, tmp_path):
    """AITER_CONFIG_FMOE replaces AITER's whole tuned set (ROCm/aiter@e4048607:aiter/jit/core.py): pins found under it
    take their rows from that file, not from the release's own CSVs."""
    from moedispatch.aiter import dispatch as ad
    from moedispatch.aiter import pin
    from moedispatch.data import aiter_configs as cfg

    caps, lay, _, _, _ = pin_case
    path = tmp_path / "mine.csv"
    pin.write_pinned(str(path), cfg.config_set_for(caps, PIN_ENV).rows, ())
    env = {**PIN_ENV, "AITER_CONFIG_FMOE": str(path)}
    dp = ad.plan_dispatch(lay, caps, tokens=(4,), env=env)
    (p,) = pin.find_pins(lay, caps, dp, env=env)
    assert p.bad.file == str(path) and p.good.file == str(path) and p.good.token == 2


# -- moedispatch/aiter/lookup.py: _flydsl_fallback_row (Rules.flydsl_fallback_rows, v0.1.11-v0.1.17) --------------

def _kimi_key(act):
    """Kimi-K2.5-MXFP4 TP4 on MI355X: 7168 × 512, 384 experts, top-8, MXFP4 (tests/test_aiter_releases.py's case)."""
    from moedispatch.aiter.key import DispatchKey
    from moedispatch.aiter.vocab import BF16, FP4, Q_1X32

    return DispatchKey(gfx="gfx950", cu_num=256, model_dim=7168, inter_dim=512, expert=384, topk=8, runtime_topk=8,
                       act_type=act, dtype=BF16, q_dtype_w=FP4, q_type=Q_1X32, use_g1u1=1, doweight_stage1=0,
                       gate_mode="separated", is_ep=False)


def _release_rows(tag):
    from moedispatch.data import aiter_configs as ac

    return ac.load_config_set(tag, version=tag.lstrip("v"), model_dims=frozenset({7168}))


@pytest.mark.parametrize("token", [1, 2048])
def test_flydsl_fallback_row_of_the_requested_bucket_replaces_the_flydsl_row(token):
    """flydsl not importable, tuned row names FlyDSL kernels: AITER takes the flydsl_fallback row of the same key and
    bucket (ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py lines 1062-1080) and says which row it swapped."""
    from moedispatch.aiter.lookup import _flydsl_fallback_row, _lookup
    from moedispatch.aiter.rules import lookup_rules
    from moedispatch.aiter.vocab import FP4, SILU

    cs, rules, key = _release_rows("v0.1.15.post3"), lookup_rules("0.1.15.post3"), _kimi_key(SILU)
    row, _ = _lookup(cs, key, token, FP4, rules)
    assert row is not None and row.kernel1.startswith("flydsl_") and row.tag != "flydsl_fallback"
    fb, notes = _flydsl_fallback_row(cs, key, token, FP4, rules, row)
    assert fb is not None and fb.tag == "flydsl_fallback" and fb.token == token
    assert fb.key(with_gfx=False) == row.key(with_gfx=False) and fb.where != row.where
    assert not fb.kernel1.startswith("flydsl_")
    assert notes == [f"flydsl is not importable: AITER swaps row {row.where} for its flydsl_fallback row {fb.where}"]


def test_flydsl_fallback_lookup_is_act_wildcarded_from_v0_1_14_exact_before():
    """The fallback lookup ignores the activation from v0.1.14 (act wildcard: a SwiGLU layer takes the shape's Silu
    fallback row) and matches it exactly before (v0.1.13: no fallback row, the row is dropped for the heuristics),
    as Rules.act_wildcard says per release (ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py lines 1062-1080)."""
    from moedispatch.aiter.lookup import _flydsl_fallback_row
    from moedispatch.aiter.rules import lookup_rules
    from moedispatch.aiter.vocab import FP4, SILU, SWIGLU

    for tag in ("v0.1.13", "v0.1.15.post3"):
        cs = _release_rows(tag)
        rules = lookup_rules(tag.lstrip("v"))
        row = next(r for r in cs.rows if r.tag != "flydsl_fallback" and r.key(with_gfx=False)[:7] ==
                   (256, 1, 7168, 512, 384, 8, SILU) and r.kernel1.startswith("flydsl_"))
        fb, notes = _flydsl_fallback_row(cs, _kimi_key(SWIGLU), 1, FP4, rules, row)
        if rules.act_wildcard:
            assert tag == "v0.1.15.post3" and fb is not None and fb.act_type == SILU and fb.token == 1
        else:
            assert tag == "v0.1.13" and fb is None
            assert notes == [f"flydsl is not importable and row {row.where} has no flydsl_fallback row: AITER drops "
                             "it for the default heuristics"]
        silu, _ = _flydsl_fallback_row(cs, _kimi_key(SILU), 1, FP4, rules, row)
        assert silu is not None and silu.tag == "flydsl_fallback"


# -- moedispatch/selector/runtime.py: _switches (the AITER switch that keeps a smaller allocation) -----------------

@pytest.fixture(scope="module")
def minimax_384():
    """MiniMax-M3-MXFP4 TP8 on MI355X / AITER 0.1.20.post1, its decode dispatch at the unpadded 6144 × 384/rank."""
    from moedispatch.aiter import dispatch as ad
    from moedispatch.aiter.key import Assumptions
    from moedispatch.core.backend import Padding
    from moedispatch.core.workload import Runtime
    from moedispatch.plan.plan import plan_model
    from moedispatch.sources.models import load_model
    from moedispatch.testing import fake_capabilities

    caps = fake_capabilities("MI355X", A20)
    rt = Runtime.build(tokens=(1, 4, 64, 512), env={}, overrides={})
    plan = plan_model(load_model(MINIMAX), caps, 8, 1, runtime=rt)
    d = next(d for d in plan.decisions if d.layer.kind == "moe")
    pad = Padding(hidden=6144, intermediate_per_rank=384)
    tokens = rt.serving_buckets()
    dp = ad.plan_dispatch(d.layer, caps, tokens=tokens, env={}, padding=pad,
                          assumptions=Assumptions.from_engine_env(d.layer, {}))
    return d, caps, pad, dp, tokens


def test_switches_names_the_workaround_that_keeps_the_smaller_allocation(minimax_384):
    """At 384/rank AITER 0.1.20 runs CK-Tile stage 2 for decode (ROCm/aiter#5233, wrong output); its workaround
    GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0 makes every bucket FlyDSL, so the padding note says to export it."""
    from moedispatch.selector.runtime import _switches

    d, caps, pad, dp, tokens = minimax_384
    assert "ROCm/aiter#5233" in [h.issue for h in dp.issues]
    assert _switches(d.layer, caps, pad, dp, {}, tokens) == (
        f"; with {GPTOSS}=0 AITER runs 384/rank correctly at every bucket (flydsl) — export it to keep this "
        "allocation")
    assert d.padding.intermediate_per_rank == 512 and any(
        n.text.endswith(f"; with {GPTOSS}=0 AITER runs 384/rank correctly at every bucket (flydsl) — export it to "
                        "keep this allocation") for n in d.padding.notes)


def test_switches_says_nothing_when_the_switch_is_already_set(minimax_384):
    """A workaround the environment already sets is not suggested again (``""``)."""
    from moedispatch.selector.runtime import _switches

    d, caps, pad, dp, tokens = minimax_384
    assert _switches(d.layer, caps, pad, dp, {GPTOSS: "0"}, tokens) == ""
    assert _switches(d.layer, caps, pad, dp, {GPTOSS: "1"}, tokens) != ""


def test_switches_says_nothing_without_a_workaround(minimax_384):
    """A dispatch with no issue hit (the 384 allocation under the switch) has no workaround to name."""
    from moedispatch.aiter import dispatch as ad
    from moedispatch.aiter.key import Assumptions
    from moedispatch.selector.runtime import _switches

    d, caps, pad, _, tokens = minimax_384
    env = {GPTOSS: "0"}
    clean = ad.plan_dispatch(d.layer, caps, tokens=tokens, env=env, padding=pad,
                             assumptions=Assumptions.from_engine_env(d.layer, env))
    assert not clean.issues and _switches(d.layer, caps, pad, clean, {}, tokens) == ""
