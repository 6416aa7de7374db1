"""Issue 15: compute-partition targets (``--target MI355X:CPX``) — a product with a share of its CUs, the mode carried
to the JSON/table target, AITER's cu_num keyed lookup and the cost model; and the GLM-5.1-MXFP4 CPX TP64 decision."""

from __future__ import annotations

import json

import jsonschema
import pytest

from moedispatch.data import capdb
from moedispatch.core.errors import TargetError
from moedispatch.sources.models import load_model
from moedispatch.plan.plan import plan_model
from moedispatch.core.workload import Runtime
from moedispatch.testing import fake_capabilities


@pytest.mark.parametrize("target, expected", [
    ("MI355X:SPX", ("gfx950", "MI355X", 256, "SPX")),
    ("MI355X:DPX", ("gfx950", "MI355X", 128, "DPX")),
    ("MI355X:QPX", ("gfx950", "MI355X", 64, "QPX")),
    ("MI355X:CPX", ("gfx950", "MI355X", 32, "CPX")),
    ("mi355x:cpx", ("gfx950", "MI355X", 32, "CPX")),
    ("MI355X-CPX", ("gfx950", "MI355X", 32, "CPX")),
    ("gfx950:CPX", ("gfx950", "MI355X", 32, "CPX")),
    ("MI300X:CPX", ("gfx942", "MI300X", 38, "CPX")),
    ("MI300X:QPX", ("gfx942", "MI300X", 76, "QPX")),
    ("gfx942:sramecc+:xnack-:CPX", ("gfx942", "MI300X", 38, "CPX")),
    ("MI300A:TPX", ("gfx942", "MI300A", 76, "TPX")),
    ("MI300A:CPX", ("gfx942", "MI300A", 38, "CPX")),
])
def test_resolve_each_mode(target, expected):
    assert capdb.resolve_partitioned_target(target) == expected
    assert capdb.resolve_target(target) == expected[:3]


@pytest.mark.parametrize("target, expected", [
    ("MI355X", ("gfx950", "MI355X", 256)),
    ("gfx942:sramecc+:xnack-", ("gfx942", "MI300X", 304)),
    ("RX 7900 XTX", ("gfx1100", "RX 7900 XTX", 96)),   # a trailing word that is no mode stays part of the name
])
def test_targets_without_a_partition_are_unchanged(target, expected):
    assert capdb.resolve_target(target) == expected
    assert capdb.resolve_partitioned_target(target)[3] is None


@pytest.mark.parametrize("target, needle", [
    ("MI355X:XPX", "modes: SPX (256 CUs), DPX (128 CUs), QPX (64 CUs), CPX (32 CUs)"),
    ("MI355X:CXP", "did you mean 'CPX'?"),
    ("MI300A:QPX", "modes: SPX (228 CUs), TPX (76 CUs), CPX (38 CUs)"),
    ("MI210:CPX", "MI210 has no compute partition modes"),
    ("MI355:CPX", "did you mean 'MI355X'?"),
])
def test_unknown_modes_name_the_known_ones(target, needle):
    with pytest.raises(TargetError) as err:
        capdb.resolve_partitioned_target(target)
    assert needle in str(err.value)


def test_unknown_mode_exits_2_with_one_line(cli):
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI355X:XPX")
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr
    assert "unknown compute partition 'XPX' for MI355X" in lines[0] and "CPX (32 CUs)" in lines[0]
    assert proc.stdout == ""


def test_partition_reaches_caps_json_and_table(cli, explain_schema):
    caps = capdb.target_capabilities("MI355X:CPX")
    assert (caps.product, caps.compute_units) == ("MI355X", 32) and caps.source_of("partition") == "flag"
    assert capdb.partition_of(caps.gfx, caps.product, caps.compute_units) == "CPX"
    assert capdb.target_label(caps) == "gfx950 (MI355X CPX)" and capdb.target_spec(caps) == "MI355X:CPX"
    whole = capdb.target_capabilities("MI355X")
    assert "partition" not in capdb.target_entry(whole)      # whole devices keep the round-1 target object
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI355X:CPX", "--tp", "8", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    jsonschema.validate(data, explain_schema)
    assert data["target"] == {"gfx": "gfx950", "product": "MI355X", "compute_units": 32,
                              "aiter_version": "0.1.20.post1", "source": "flag", "partition": "CPX"}
    table = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI355X:CPX", "--tp", "8").stdout
    target_line = next(line for line in table.splitlines() if line.startswith("target"))
    assert "gfx950 (MI355X), CPX partition: 32 CUs (1/8 of 256; derived)" in target_line


def test_env_target_takes_a_partition(cli):
    proc = cli("explain", "--model", "Mixtral-8x7B", "--format", "json", env={"MOEDISPATCH_TARGET": "MI300X:CPX"})
    assert proc.returncode == 0, proc.stderr
    target = json.loads(proc.stdout)["target"]
    assert (target["compute_units"], target["partition"], target["source"]) == (38, "CPX", "env")


def test_compare_whole_device_and_cpx(cli):
    proc = cli("compare", "--model", "DeepSeek-V3", "--target", "MI355X,MI355X:CPX", "--tp", "8", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    a, b = doc["variants"]
    assert (a["compute_units"], "partition" in a) == (256, False)
    assert (b["compute_units"], b["partition"], b["label"]) == (32, "CPX", "gfx950 (MI355X CPX)")
    assert a["fingerprint"] != b["fingerprint"]


def test_aiter_dispatch_at_cpx_does_not_claim_256_cu_tuned_rows(caps):
    """DeepSeek-V3 TP8 on MI355X: the installed amd-aiter 0.1.7.post2.dev18 tuned_fmoe.csv has rows for cu_num 256
    (tests/test_runtime.py); a CPX partition runs with 32 CUs, and AITER keys its lookup on get_cu_num(), so none
    of those rows applies."""
    model = load_model("DeepSeek-V3")
    runtime = Runtime()
    whole = plan_model(model, fake_capabilities("MI355X", "0.1.7.post2.dev18"), 8, 1, runtime=runtime)
    cpx = plan_model(model, fake_capabilities("MI355X:CPX", "0.1.7.post2.dev18"), 8, 1, runtime=runtime)
    d_whole = next(d for d in whole.decisions if d.layer.kind == "moe" and d.dispatch is not None)
    d_cpx = next(d for d in cpx.decisions if d.layer.index == d_whole.layer.index)
    assert any(s.basis == "tuned" for s in d_whole.dispatch.steps)           # the rows exist at 256 CUs
    assert d_cpx.dispatch is not None and d_cpx.dispatch.key.cu_num == 32
    assert all(s.basis == "heuristic" for s in d_cpx.dispatch.steps)
    assert all(c.basis != "tuned" for c in d_cpx.cost)
    # The cost model scales the matrix peaks with the partition's CUs: never faster than the whole device.
    assert all(c.us >= w.us for c, w in zip(d_cpx.cost, d_whole.cost))


def test_glm51_mxfp4_cpx_tp64_states_the_pad_its_ratio_its_source_and_the_ep_alternative(cli, explain_schema):
    """Done when: GLM-5 moe_intermediate_size 2048 at TP64 is 32 per rank; the FlyDSL kernels AITER dispatches tile
    the intermediate by 128 (stage-2 tile_k 128 where inter_dim % 256 != 0, issue 23: the least allocation every
    dispatched kernel tiles, not the family table's 256), so the plan pads 32 → 128 (4×) and says what that costs,
    why, and that --ep 64 keeps each expert whole (no pad)."""
    proc = cli("explain", "--model", "GLM-5.1-MXFP4", "--target", "MI355X:CPX", "--tp", "64", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    jsonschema.validate(data, explain_schema)
    assert data["target"]["partition"] == "CPX" and data["target"]["compute_units"] == 32
    moe = [la for la in data["layers"] if la["kind"] == "moe"]
    assert moe and all(la["shape"]["intermediate_per_rank"] == 32 for la in moe)
    layer = moe[0]
    assert layer["backend"] == "aiter-flydsl"  # the family AITER runs at every bucket names the launch
    assert layer["padding"]["intermediate_per_rank"] == 128 and layer["padding"]["zero_fill"] is True
    assert all(s["basis"] == "heuristic" for s in layer["aiter_dispatch"])     # no tuned rows at 32 CUs
    caveat = [w for w in data["warning_details"] if w["issue"] == "pad-ratio"]
    assert len(caveat) == 1
    text = caveat[0]["text"]
    assert "32→128 (4× the shard of 2048 at MoE TP 64)" in text and "75.0%" in text
    assert "--ep 64" in text and "4 experts × intermediate 2048 per rank" in text and "unpadded" in text
    assert caveat[0]["source"] and "ROCm/aiter" in caveat[0]["source"] and caveat[0]["confidence"] == "derived"
    # The EP alternative it names is what the plan itself gives at --ep 64.
    proc = cli("explain", "--model", "GLM-5.1-MXFP4", "--target", "MI355X:CPX", "--tp", "64", "--ep", "64",
               "--format", "json")
    ep = json.loads(proc.stdout)
    ep_layer = next(la for la in ep["layers"] if la["kind"] == "moe")
    assert ep_layer["padding"]["intermediate_pad"] == 0 and ep_layer["shape"]["experts_per_rank"] == 4
    assert not [w for w in ep["warning_details"] if w["issue"] == "pad-ratio"]
    table = cli("explain", "--model", "GLM-5.1-MXFP4", "--target", "MI355X:CPX", "--tp", "64").stdout
    assert "intermediate/rank 32→128 (4× the shard: see caveat [pad ratio])" in table


def test_pad_ratio_caveat_stays_quiet_below_4x():
    """MiniMax-M3-MXFP4 TP8 pads 384→512 at most (1.33×): no pad-ratio caveat."""
    plan = plan_model(load_model("MiniMax-M3-MXFP4"), fake_capabilities("MI355X"), 8, 1)
    assert not [w for w in plan.warnings if w.issue == "pad-ratio"]


def test_html_head_names_the_partition(cli, tmp_path):
    out = tmp_path / "plan.html"
    proc = cli("explain", "--model", "Mixtral-8x7B", "--target", "MI300X:CPX", "--html", str(out))
    assert proc.returncode == 0, proc.stderr
    assert "gfx942 (MI300X), CPX partition, 38 CUs" in out.read_text()


def test_a_partition_rank_gets_its_share_of_the_device_hbm():
    """The compute partitions of one device share its HBM: a recipe on MI355X:CPX budgets 1/8 of 288 GiB per rank,
    so DeepSeek-V3 FP8 at TP 8 (~78 GiB of weights per rank) does not fit there, while it fits a whole MI355X."""
    from moedispatch.engines.layout import product_memory_gib
    from moedispatch.engines.recipes import build_recipe

    whole = fake_capabilities("MI355X", "0.1.20.post1")
    cpx = fake_capabilities("MI355X:CPX", "0.1.20.post1")
    assert product_memory_gib(whole) == ("MI355X", 288.0)
    assert product_memory_gib(cpx) == ("MI355X CPX partition (1/8 of the device's HBM)", 36.0)
    assert product_memory_gib(fake_capabilities("MI355X:DPX", "0.1.20.post1"))[1] == 144.0
    model = load_model("DeepSeek-V3")
    assert build_recipe(plan_model(model, whole, 8, 1), "vllm").ok
    refused = build_recipe(plan_model(model, cpx, 8, 1), "vllm", alternatives=False)
    assert not refused.ok
    fit = next(r for r in refused.refusals if r.text.startswith("weights do not fit"))
    assert "vs 33 GiB usable on one MI355X CPX partition (1/8 of the device's HBM) (36 GiB × 0.92" in fit.text


def test_the_nearest_alternative_of_a_tp64_launch_is_expert_parallel_at_the_same_tp():
    """Alternatives try the plan's own TP with EP too: at TP 64 the nearest change is --ep 64, not TP 8."""
    from moedispatch.engines.recipes import _alternatives

    plan = plan_model(load_model("GLM-5.1-MXFP4"), fake_capabilities("MI355X:CPX", "0.1.20.post1"), 64, 1)
    alts = _alternatives(plan, "vllm", "0.33.0")
    assert alts and alts[0]["change"] == "--tp 64 --ep 64"


def test_the_aiter_upgrade_what_if_keeps_the_partition():
    """--what-if's "upgrade AITER" rebuilds the same partition (32 CUs), not the whole device."""
    from moedispatch.plan import whatif

    seen = []
    real = capdb.target_capabilities

    def spy(target, version=None):
        seen.append(target)
        return real(target, version)

    import unittest.mock as mock

    with mock.patch.object(capdb, "target_capabilities", spy):
        plan = plan_model(load_model("DeepSeek-V3"), fake_capabilities("MI355X:CPX", "0.1.15.post3"), 8, 1,
                          runtime=Runtime.build((1, 64), env={}))
        d = next(d for d in plan.decisions if d.layer.kind == "moe")
        from moedispatch.selector.plugins import build_registry

        whatif.what_if(d, plan.caps, build_registry().backends, plan.runtime)
    assert "MI355X:CPX" in seen


def test_the_recipe_header_names_the_partition():
    from moedispatch.engines.recipes import render_recipe

    plan = plan_model(load_model("GLM-5.1-MXFP4"), fake_capabilities("MI355X:CPX", "0.1.20.post1"), 64, 64)
    head = render_recipe(plan, "vllm").splitlines()[0]
    assert "on gfx950 (MI355X), CPX partition (32 CUs), AITER 0.1.20.post1, tp=64 ep=64" in head
    whole = plan_model(load_model("GLM-5.1-MXFP4"), fake_capabilities("MI355X", "0.1.20.post1"), 8, 1)
    assert "partition" not in render_recipe(whole, "vllm").splitlines()[0]


def test_the_same_launch_head_reads_as_a_sentence(cli):
    """GLM-5.1-MXFP4 TP64 on MI355X: aiter-ck and aiter-flydsl name the same launch (AITER runs FlyDSL); the decision's
    first line said "so the launch both name is named after the family it runs" (newcomer review)."""
    out = cli("explain", "--model", "GLM-5.1-MXFP4", "--target", "MI355X", "--tp", "64", "--aiter-version",
              "0.1.20.post1", env={"COLUMNS": "400"})
    assert ("aiter-flydsl: correct for this layer; AITER's dispatcher never runs the higher-preference aiter-ck's "
            "family at this allocation: both name the same launch, which is named after the family AITER runs"
            in out.stdout), out.stdout[:2000]
    # the slower backend is compared with the named winner, not with a same-launch alias (it said "aiter-asm 20 µs")
    emu = next(x for x in out.stdout.splitlines() if x.lstrip().startswith("not     emulation"))
    assert "supported, slower: aiter-flydsl " in emu and "aiter-asm" not in emu, emu
