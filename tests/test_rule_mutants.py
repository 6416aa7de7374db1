"""Tests that go red for one-line changes to the rules, each on a real deployment with the source of its answer.

Every test here was proven to fail against the change named in its docstring (planted in a copy of the tree, the
test run, the change reverted). They are also the first tests ``benchmarks/mutation.py`` runs per mutant.
Targets are simulated from capability_db (no GPU).
"""

from __future__ import annotations

import subprocess

import pytest

from conftest import ROOT, TREE_PACKAGES, run_cli, tree_python
from moedispatch.layers import MoELayer
from moedispatch.models import expand_layers, load_model
from moedispatch.plan import plan_model
from moedispatch.recipes import engine_padding
from moedispatch.rules import _version_in, issues_for
from moedispatch.selector import select

AITER = "0.1.15.post3"
FLYDSL_PADDING = "ROCm/aiter@v0.1.15.post3:aiter/fused_moe.py (_get_padding_for_flydsl); ROCm/aiter#3401"


def moe_layer(model: str, tp: int, ep: int = 1) -> MoELayer:
    return next(la for la in expand_layers(load_model(model), tp, ep) if la.kind == "moe")


def issue_ids(reasons) -> set[str]:
    return {i for r in reasons if r.issue for i in r.issue.split(",")}


# -- (a) known issues hold only inside their AITER version range ------------------------------------------------

def test_version_in_reads_pep440_ranges_and_local_versions():
    """A known issue applies only to AITER versions in its PEP 440 range; ROCm local tags (+rocm7.1) compare as
    the public version; no AITER matches no ranged issue; an unparsable version is assumed affected."""
    assert _version_in("", None) and _version_in("", "0.1.14")
    assert _version_in(">=0.1.15", "0.1.15") and _version_in(">=0.1.15", "0.1.21.post2+rocm7.1")
    assert not _version_in(">=0.1.15", "0.1.14.post1")
    assert not _version_in(">=0.1.15", "0.1.14.post1+rocm7.1")
    assert not _version_in(">=0.1.15", None)
    assert _version_in(">=0.1.15", "not-a-version")


def test_flydsl_tail_tile_issue_is_outside_aiter_0_1_14(caps):
    """ROCm/aiter#3538 (FlyDSL stage 1 leaves the padded tail tile unwritten) needs pads forwarded to FlyDSL, which
    AITER does only from 0.1.15 (ROCm/aiter#3184): known_issues.toml gives it aiter >= 0.1.15. Ignoring the range
    (``_version_in`` always True) makes MiniMax-M3-MXFP4 TP8 on AITER 0.1.14 claim it avoids that issue."""
    assert "aiter-pr#3538" in {i.id for i in issues_for("aiter-flydsl", caps("gfx950", "0.1.15"))}
    assert "aiter-pr#3538" not in {i.id for i in issues_for("aiter-flydsl", caps("gfx950", "0.1.14.post1"))}
    assert "aiter#5233" not in {i.id for i in issues_for("aiter-cktile", caps("gfx950", "0.1.10.post2"))}
    assert "aiter#5233" in {i.id for i in issues_for("aiter-cktile", caps("gfx950", "0.1.12"))}


def test_flydsl_tail_tile_issue_cited_only_where_it_exists(caps, builtins):
    """MiniMax-M3-MXFP4 TP8 (384 -> 512/rank) on FlyDSL: on AITER 0.1.15.post3 the plan passes intermediate_pad=0
    as the workaround of ROCm/aiter#3538 and vllm-project/vllm#46419; on 0.1.14 only #46419 can apply."""
    layer = moe_layer("MiniMax-M3-MXFP4", 8)
    new = select(layer, caps("gfx950", AITER), builtins)
    old = select(layer, caps("gfx950", "0.1.14"), builtins)
    assert new.backend == old.backend == "aiter-flydsl"
    assert {"aiter-pr#3538", "vllm-pr#46419"} <= issue_ids(new.reasons)
    assert issue_ids(old.reasons) == {"vllm-pr#46419"}


# -- (b) the engine's allocation round-up -----------------------------------------------------------------------

@pytest.mark.parametrize("model,tp,version,family,expected", [
    # W4A16 gpt-oss on AITER / Triton: 256/256 (vllm oracle/mxfp4.py mxfp4_round_up_hidden_size_and_intermediate_size)
    ("gpt-oss-120b", 8, "0.33.0", "flydsl", (3072, 512, 128, 128)),
    ("gpt-oss-120b", 1, "0.33.0", "ck", (3072, 3072, 128, 384)),  # TP1: intermediate_pad//64*64*2
    ("gpt-oss-120b", 8, "0.33.0", "triton", (3072, 512, None, None)),
    ("gpt-oss-120b", 8, "0.33.0", "emulation", (2880, 384, None, None)),  # EMULATION: OCP_MX_BLOCK_SIZE 32
    # W4A4 MiniMax-M3 from vLLM 0.32: hidden 256, intermediate 128; MiniMax passes intermediate_pad=0 (PR #46419)
    ("MiniMax-M3-MXFP4", 8, "0.33.0", "flydsl", (6144, 384, 0, 0)),
    ("Qwen3.5-397B-A17B-MXFP4", 8, "0.33.0", "ck", (4096, 128, 0, 0)),
])
def test_vllm_mxfp4_allocation(model, tp, version, family, expected):
    """vLLM's MXFP4 allocation round-up (capability_db/engines.toml [[vllm.allocation]], sources there:
    vllm-project/vllm@v0.33.0:vllm/model_executor/layers/fused_moe/oracle/mxfp4.py): 256 for W4A16 on ROCm, so
    gpt-oss-120b TP8 allocates 3072 × 512 (a 128 round-up would give 2944 × 384)."""
    assert engine_padding("vllm", moe_layer(model, tp), family, version) == expected


def test_vllm_w4a4_hidden_round_up_by_release():
    """vLLM >= 0.32 allocates W4A4 (aiter_w4a4) MXFP4 with hidden to 256 ('W4A4 stage 1 still requires a 256-aligned
    hidden dimension') and intermediate to 128; 0.31 rounded both to 256 (vllm-project/vllm@v0.32.0 and @v0.31.0:
    vllm/model_executor/layers/fused_moe/oracle/mxfp4.py). A 2880-wide W4A4 layer at TP8 (360/rank) shows both."""
    layer = MoELayer.build(hidden=2880, intermediate=2880, experts=32, top_k=4, tp=8, weight="mxfp4", act="mxfp4",
                           activation="silu")
    assert engine_padding("vllm", layer, "flydsl", "0.33.0") == (3072, 384, 128, 0)
    assert engine_padding("vllm", layer, "flydsl", "0.31.0") == (3072, 512, 128, 128)


def test_sglang_mxfp4_allocation():
    """SGLang pads AITER MXFP4 intermediates to 256 (AITER_PADDING_SIZE 128 storage elements = 256 packed fp4,
    sgl-project/sglang@v0.5.23:python/sglang/srt/layers/moe/utils.py) and W4A16/W4A8 hidden too (SGLang PR #21097);
    it passes the real differences as kernel pads."""
    assert engine_padding("sglang", moe_layer("gpt-oss-120b", 8), "flydsl") == (3072, 512, 192, 152)
    assert engine_padding("sglang", moe_layer("MiniMax-M3-MXFP4", 8), "flydsl") == (6144, 512, 0, 128)
    assert engine_padding("sglang", moe_layer("gpt-oss-120b", 8), "triton") == (2880, 360, None, None)


# -- (c) the FlyDSL bias guard ----------------------------------------------------------------------------------

def test_flydsl_with_bias_gets_no_pads_from_aiter_0_1_15_post3(caps, builtins):
    """gpt-oss-120b TP2 (bias, 1440 -> 1536/rank, hidden 2880 -> 3072) on FlyDSL: from AITER 0.1.15.post3
    _get_padding_for_flydsl returns (0, 0) with a bias (ROCm/aiter#3401), so the kernel gets no pads and computes over
    the zero-filled extent; on 0.1.15 it still skips the hidden pad (the intermediate one is off for aiter#3538)."""
    layer = moe_layer("gpt-oss-120b", 2)
    guarded = select(layer, caps("gfx950", AITER), builtins)
    assert guarded.backend == "aiter-flydsl"
    p = guarded.padding
    assert (p.hidden, p.intermediate_per_rank, p.hidden_pad, p.intermediate_pad) == (3072, 1536, 192, 96)
    assert (p.kernel_hidden_pad, p.kernel_intermediate_pad, p.pad_semantics, p.zero_fill) == (0, 0, "compute", True)
    assert any("_get_padding_for_flydsl" in (n.source or "") and "#3401" in (n.source or "") for n in p.notes)
    before = select(layer, caps("gfx950", "0.1.15"), builtins).padding
    assert (before.kernel_hidden_pad, before.kernel_intermediate_pad, before.pad_semantics) == (192, 0, "skip")


def test_flydsl_without_bias_keeps_its_pads(caps, builtins):
    """The guard is about the bias only: a bias-free MXFP4 layer with a hidden pad still passes it to FlyDSL."""
    layer = MoELayer.build(hidden=2880, intermediate=2880, experts=32, top_k=4, tp=2, weight="mxfp4", act="mxfp4",
                           activation="silu")
    flydsl = next(b for b in builtins if b.name == "aiter-flydsl")
    assert flydsl.check(layer, caps("gfx950", AITER)).supported
    p = flydsl.plan_padding(layer, caps("gfx950", AITER))
    assert (p.kernel_hidden_pad, p.kernel_intermediate_pad, p.pad_semantics) == (192, 0, "skip")


# -- (d) Decision.warnings --------------------------------------------------------------------------------------

def test_emulation_decision_carries_its_slow_path_warning(caps, builtins):
    """MiniMax-M3-MXFP8 on gfx942 runs only on emulation (no MXFP8 kernel there): the decision's warnings are its
    reasons of kind warning — the slow reference path (~20× slower decode, vllm-project/vllm#50817) — and the plan
    repeats it once with the layers it covers."""
    plan = plan_model(load_model("MiniMax-M3-MXFP8"), caps("gfx942", AITER), 4, 1, backends=builtins)
    d = next(d for d in plan.decisions if d.layer.kind == "moe")
    assert d.backend == "emulation"
    assert d.warnings and d.warnings == tuple(r for r in d.reasons if r.kind == "warning")
    assert any("50817" in (w.source or "") for w in d.warnings)
    assert any("run on emulation" in w.text and "50817" in (w.source or "") for w in plan.warnings)


def test_aiter_decision_without_warning_has_none(caps, builtins):
    """A correct AITER plan with no warning-kind reason has no warnings (they are not every reason)."""
    d = select(moe_layer("MiniMax-M3-MXFP4", 8), caps("gfx950", AITER), builtins)
    assert d.warnings == () and d.reasons


# -- the cli fixture runs the tree under test --------------------------------------------------------------------

def test_cli_fixture_imports_the_tree_under_test(tmp_path):
    """Neither an editable install of another checkout nor a decoy package earlier on sys.path answers: moedispatch,
    its built-in backends and capability_db all come from this checkout."""
    for name in ("moedispatch", "moedispatch_plugins"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "__init__.py").write_text("raise ImportError('decoy: not the tree under test')\n")
    code = ("import moedispatch, moedispatch_plugins.aiter_ck, moedispatch.capability_db, moedispatch.selector\n"
            "for m in (moedispatch, moedispatch_plugins.aiter_ck, moedispatch.capability_db, moedispatch.selector):\n"
            "    print(m.__file__)\n")
    proc = subprocess.run(tree_python(code), capture_output=True, text=True, timeout=60,
                          env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    files = proc.stdout.split()
    assert len(files) == 4
    roots = [str(p) for p in TREE_PACKAGES.values()]
    assert all(any(f.startswith(r) for r in roots) for f in files), files
    assert all(f.startswith(str(ROOT)) for f in files), files
    done = run_cli("models", "--format", "json", env={"PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
