"""Tests that go red for one-line changes to the rules, each on a real deployment with the source of its answer.

Every test here was proven to fail against the change named in its docstring (planted in a copy of the tree, the
test run, the change reverted). They are also the first tests ``benchmarks/mutation.py`` runs per mutant.
Targets are simulated from capability_db (no GPU).
"""

from __future__ import annotations

import re
import subprocess

import pytest

from conftest import ROOT, TREE_PACKAGES, run_cli, tree_python
from moedispatch.core.layers import MoELayer
from moedispatch.sources.models import expand_layers, load_model
from moedispatch.plan.plan import plan_model
from moedispatch.engines.recipes import engine_padding
from moedispatch.kit.rules import _version_in, issues_for
from moedispatch.selector.pure import select

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
    assert "vllm-pr#46419" in issue_ids(old.reasons) and "aiter-pr#3538" not in issue_ids(old.reasons)


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
    code = ("import moedispatch, moedispatch_plugins.aiter_ck, moedispatch.capability_db, moedispatch.selector.pure\n"
            "for m in (moedispatch, moedispatch_plugins.aiter_ck, moedispatch.capability_db, moedispatch.selector.pure):\n"
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


# -- engine padding branches (capability_db/engines.toml [[vllm.allocation]] / [[sglang.allocation]]) -------------

@pytest.mark.parametrize("model,tp,engine,version,family,expected", [
    # vLLM >= 0.31 pads bf16 for AITER with its CK tile rule, 64 when <= 192 else 128 (oracle/unquantized.py,
    # vllm-project/vllm#55368): Qwen3-30B-A3B TP8 96 -> 128; <= 0.30 it does not pad (the #55368 crash).
    ("Qwen3-30B-A3B", 8, "vllm", "0.33.0", "ck", (2048, 128, 0, 0)),
    ("Qwen3-30B-A3B", 8, "vllm", "0.30.0", "ck", (2048, 96, 0, 0)),
    ("Qwen3-235B-A22B-Instruct-2507", 8, "vllm", "0.33.0", "ck", (4096, 192, 0, 0)),
    ("Qwen3-30B-A3B", 8, "vllm", "0.33.0", "triton", (2048, 96, None, None)),
    # SGLang pads fp8 AITER intermediates to 128 (AITER_PADDING_SIZE) and passes the difference: 192 -> 256, pad 64
    ("Qwen3-235B-A22B-Instruct-2507-FP8", 8, "sglang", "0.5.23", "ck", (4096, 256, 0, 64)),
    ("Qwen3-30B-A3B", 8, "sglang", "0.5.23", "triton", (2048, 96, None, None)),
])
def test_engine_padding_per_release(model, tp, engine, version, family, expected):
    """The allocation and kernel pads each engine release uses for a real layer (sources in engines.toml rows)."""
    assert engine_padding(engine, moe_layer(model, tp), family, version) == expected


def test_vllm_kernel_pads_double_the_intermediate_at_tp1_and_zero_for_minimax():
    """vLLM passes hidden_pad//128*128 and intermediate_pad//64*64, doubled at TP 1 (the fused gate/up rows), to
    AITER (experts/rocm_aiter_moe.py); MiniMax-M3 passes intermediate_pad=0 (vllm-project/vllm#46419)."""
    fields = dict(hidden=2880, intermediate=2880, experts=32, top_k=4, weight="mxfp4", act="mxfp4",
                  activation="silu")
    assert engine_padding("vllm", MoELayer.build(tp=1, **fields), "flydsl", "0.31.0") == (3072, 3072, 128, 384)
    assert engine_padding("vllm", MoELayer.build(tp=2, **fields), "flydsl", "0.31.0") == (3072, 1536, 128, 64)
    minimax = MoELayer.build(tp=1, model_type="minimax_m3", **fields)
    assert engine_padding("vllm", minimax, "flydsl", "0.31.0") == (3072, 3072, 128, 0)
    assert engine_padding("sglang", MoELayer.build(tp=1, **fields), "flydsl", "0.5.23") == (2880, 3072, 0, 192)


# -- kernel tile rules of the AITER families --------------------------------------------------------------------

def test_ck_intermediate_tiles():
    """CK 2-stage: stage-1 N tile 64 when inter_dim <= 192 else 128 (vllm-project/vllm#55368, ROCm/aiter#5444),
    for fp8 on gfx942 too; fp8 needs 256 on gfx950 (KPerBlock=64 instances disabled, ROCm/aiter
    csrc/ck_gemm_moe_2stages_codegen)."""
    from moedispatch_plugins.aiter_ck import _a8w8_inter, _bf16_inter

    assert [_bf16_inter(i, "gfx942") for i in (64, 192, 193, 2048)] == [64, 64, 128, 128]
    assert [_a8w8_inter(i, "gfx942") for i in (64, 192, 193)] == [64, 64, 128]
    assert [_a8w8_inter(i, None) for i in (192, 193)] == [64, 128]
    assert [_a8w8_inter(i, "gfx950") for i in (64, 192, 2048)] == [256, 256, 256]


@pytest.mark.parametrize("tag,gfx", [("pertokenFp8", "gfx942"), ("blockscaleFp8", "gfx942"),
                                     ("blockscaleFp8", "gfx950"), ("pertokenMXfp4", "gfx950")])
def test_asm_subgu_multiple_is_the_minimal_padding(tag, gfx):
    """ASM 1-stage picks a kernel whose subGU_n divides inter_dim (hsa/<gfx>/fmoe/*.csv at ROCm/aiter v0.1.15.post3):
    the plan pads to the smallest size some listed subGU_n divides — no more, no less."""
    from moedispatch.core.backend import round_up
    from moedispatch_plugins.aiter_asm import SUBGU_N, _subgu

    multiple = _subgu(tag)
    sizes = SUBGU_N[(tag, gfx)]
    for inter in (64, 128, 192, 200, 320, 352, 704, 1408, 1536, 2048):
        n = multiple(inter, gfx)
        assert n in sizes
        assert round_up(inter, n) == min(-(-inter // s) * s for s in sizes), (inter, n)
    assert multiple(704, "gfx90a") == 1 and multiple(704, None) == 1


def test_asm_table_tags():
    """Each ASM combo names its kernel table (hsa/<gfx>/fmoe/<tag> CSVs): pertokenFp8, blockscaleFp8, pertokenMXfp4."""
    from moedispatch_plugins.aiter_asm import COMBOS, _table_tag

    assert [_table_tag(c) for c in COMBOS] == ["pertokenFp8", "blockscaleFp8", "pertokenMXfp4"]


# -- known_issues.toml validation: a broken entry is one clear line naming the file, entry, key and problem ----------

def _issues_doc():
    import copy

    from moedispatch.data import capdb

    return copy.deepcopy(capdb.load_toml("known_issues.toml"))


def _load_issues_from(monkeypatch, doc):
    from moedispatch.data import capdb
    from moedispatch.kit import rules

    real = capdb.load_toml
    monkeypatch.setattr(capdb, "load_toml", lambda name: doc if name == "known_issues.toml" else real(name))
    rules.known_issues.cache_clear()
    try:
        return rules.known_issues()
    finally:
        monkeypatch.undo()
        rules.known_issues.cache_clear()


def _set_path(entry, path, value):
    *parents, last = path
    for key in parents:
        entry = entry[key]
    if value is _DELETE:
        del entry[last]
    else:
        entry[last] = value


_DELETE = object()
_WHERE = "capability_db/known_issues.toml: issue[0] (aiter#5233)"


@pytest.mark.parametrize("path,value,message", [
    (("families",), _DELETE, "missing key 'families'"),
    (("source",), _DELETE, "missing key 'source'"),
    (("title",), 3, "title must be a string, got int"),
    (("status",), ["open"], "status must be a string, got list"),
    (("families",), [], "families must be a non-empty array of backend names"),
    (("families",), "aiter-cktile", "families must be a non-empty array of backend names"),
    (("predicate",), "gfx950", "predicate must be a table, got str"),
    (("workaround",), [], "workaround must be a table, got list"),
    (("predicate", "gfx"), "gfx950", "predicate.gfx must be an array of strings"),
    (("predicate", "has_bias"), "yes", "predicate.has_bias must be a boolean"),
    (("predicate", "inter_mod"), 0, "predicate.inter_mod must be a positive integer"),
    (("predicate", "inter_mod"), True, "predicate.inter_mod must be a positive integer"),
    (("predicate", "inter_in"), [384, "512"], "predicate.inter_in must be an array of integers"),
    (("predicate", "kernel_inter_pad_gt"), -1, "predicate.kernel_inter_pad_gt must be a non-negative integer"),
    (("workaround", "route"), 5, "workaround.route must be a string"),
    (("workaround", "reject"), "yes", "workaround.reject must be a boolean"),
    (("workaround", "pad_intermediate_to"), 0, "workaround.pad_intermediate_to must be a positive integer"),
    (("workaround", "kernel_intermediate_pad"), -1, "workaround.kernel_intermediate_pad must be a non-negative"),
    (("effect",), "garbage", "effect 'garbage' not one of wrong_output, crash, hang, slow, unsupported"),
    (("predicate", "vram"), [1], "unknown predicate key(s) vram"),
    (("workaround", "reboot"), True, "unknown workaround key(s) reboot"),
    (("confidence",), "sure", "confidence 'sure' not one of confirmed, derived, unconfirmed"),
    (("aiter",), ">>0.1", "aiter '>>0.1' is not a release range: '>0.1' is not a PEP 440 version"),
])
def test_broken_known_issue_entry_is_one_clear_line(monkeypatch, path, value, message):
    """Each malformed field of a known issue fails at load time with the file, the entry and the problem (never
    later, mid-selection, with a TypeError)."""
    from moedispatch.core.errors import CapabilityDBError

    doc = _issues_doc()
    _set_path(doc["issue"][0], path, value)
    with pytest.raises(CapabilityDBError) as err:
        _load_issues_from(monkeypatch, doc)
    assert str(err.value).startswith(_WHERE + ": ") and message in str(err.value), str(err.value)


def test_broken_known_issue_table_shapes(monkeypatch):
    """A duplicate id, an empty id, a non-table entry and a non-array [[issue]] are named precisely too."""
    from moedispatch.core.errors import CapabilityDBError

    doc = _issues_doc()
    doc["issue"][1]["id"] = doc["issue"][0]["id"]
    with pytest.raises(CapabilityDBError, match=r"issue\[1\] \(aiter#5233\): duplicate id 'aiter#5233' \(also "
                                                r"issue\[0\]\)"):
        _load_issues_from(monkeypatch, doc)
    doc = _issues_doc()
    doc["issue"][0]["id"] = "  "
    with pytest.raises(CapabilityDBError, match=r"issue\[0\] \(  \): id must not be empty"):
        _load_issues_from(monkeypatch, doc)
    doc = _issues_doc()
    doc["issue"][2] = "aiter#1"
    with pytest.raises(CapabilityDBError, match=r"known_issues.toml: issue\[2\] must be a table$"):
        _load_issues_from(monkeypatch, doc)
    with pytest.raises(CapabilityDBError, match=r"issue must be an array of tables \(\[\[issue\]\]\)"):
        _load_issues_from(monkeypatch, {"issue": {"id": "x"}})
    assert _load_issues_from(monkeypatch, {}) == ()


def test_known_issues_are_frozen_values():
    """Loaded issues are hashable values (lists frozen to tuples, keys sorted); confidence defaults to confirmed."""
    from moedispatch.kit.rules import known_issues

    issues = {i.id: i for i in known_issues()}
    cktile = issues["aiter#5233"]
    assert hash(cktile) and cktile.pred == {"gfx": ("gfx950",), "weight": ("mxfp4",), "inter_mod": 256}
    assert [k for k, _ in cktile.predicate] == sorted(cktile.pred) and cktile.fix == {"pad_intermediate_to": 256}
    assert (cktile.families, cktile.aiter, cktile.effect, cktile.confidence) == (("aiter-cktile",), ">=0.1.12",
                                                                                 "wrong_output", "confirmed")
    assert issues["vllm-pr#46419"].confidence == "derived"


# -- plugin failures are reported precisely (a third-party backend's mistakes never crash selection) ---------------

class _Plugin:
    """A third-party backend (module outside moedispatch_plugins, so it runs under the plugin deadline)."""

    def __new__(cls, name, *, check=None, plan=None, preference=5):
        from moedispatch.core.backend import Backend, Padding, Verdict

        class ThirdParty(Backend):
            def check(self, layer, caps):
                return check(layer, caps) if check else Verdict.supported("runs anywhere")

            def plan_padding(self, layer, caps):
                return plan(layer, caps) if plan else Padding.none(layer)

        backend = ThirdParty()
        backend.name, backend.preference = name, preference
        return backend


def _raise(exc):
    def fn(layer, caps):
        raise exc
    return fn


@pytest.mark.parametrize("check,plan,expected", [
    (_raise(ValueError("boom\nsecond line")), None, "plugin error: check() raised ValueError: boom"),
    (_raise(KeyError()), None, "plugin error: check() raised KeyError"),
    (_raise(RuntimeError("   ")), None, "plugin error: check() raised RuntimeError"),
    (lambda la, c: "yes", None, "plugin error: check() returned str, not a Verdict"),
    (None, _raise(ZeroDivisionError("pads")), "plugin error: plan_padding() raised ZeroDivisionError: pads"),
    (None, lambda la, c: {"hidden": 1}, "plugin error: plan_padding() returned dict, not a Padding"),
])
def test_plugin_errors_name_the_method_and_exception(caps, builtins, check, plan, expected):
    """A plugin that raises or returns garbage is rejected with ``plugin error: <method>() …`` (first line of the
    exception only) and selection goes on with the built-ins; ``strict=True`` raises PluginError instead."""
    from moedispatch.core.errors import PluginError

    layer = moe_layer("Mixtral-8x7B", 8)
    acme = _Plugin("acme", check=check, plan=plan, preference=1000)
    d = select(layer, caps("gfx942", AITER), tuple(builtins) + (acme,))
    assert d.backend != "acme"
    rejection = d.rejection("acme")
    assert [r.text for r in rejection.reasons] == [expected] and rejection.reasons[0].kind == "failed"
    with pytest.raises(PluginError, match="backend 'acme': " + re.escape(expected[len("plugin error: "):])):
        select(layer, caps("gfx942", AITER), tuple(builtins) + (acme,), strict=True)


def test_plugin_padding_inconsistent_with_the_layer_is_rejected(caps, builtins):
    """Allocated sizes must be the layer's plus the pads: a plan that says otherwise is a plugin error."""
    from moedispatch.core.backend import Padding

    layer = moe_layer("Mixtral-8x7B", 8)
    acme = _Plugin("acme", plan=lambda la, c: Padding(hidden=la.hidden + 64, intermediate_per_rank=
                                                      la.intermediate_per_rank), preference=1000)
    d = select(layer, caps("gfx942", AITER), tuple(builtins) + (acme,))
    text = d.rejection("acme").reasons[0].text
    assert text == (f"plugin error: plan_padding() returned sizes inconsistent with the layer (hidden "
                    f"{layer.hidden + 64} - pad 0 != {layer.hidden} or intermediate {layer.intermediate_per_rank} - "
                    f"pad 0 != {layer.intermediate_per_rank})")


def test_verdict_and_padding_values():
    """Verdict.unsupported needs a reason; from_checks is supported iff nothing failed; str reasons become Reasons
    of the verdict's kind; Padding refuses impossible values."""
    from moedispatch.core.backend import Backend, Padding, Verdict
    from moedispatch.core.reason import Reason

    with pytest.raises(ValueError) as err:
        Verdict.unsupported()
    assert str(err.value) == "an unsupported verdict needs at least one reason"
    v = Verdict.unsupported("needs gfx950")
    assert v.supported is False and v.reasons == (Reason("needs gfx950", "failed"),)
    assert Verdict.from_checks([], ["fine"]) == Verdict(True, (Reason("fine", "supports"),))
    assert Verdict.from_checks(["bad"], ["fine"]) == Verdict(False, (Reason("bad", "failed"),))
    assert Verdict.supported("ok").reasons == (Reason("ok", "supports"),)
    assert Padding(hidden=8, intermediate_per_rank=8, notes=("why",)).notes == (Reason("why", "padding"),)
    with pytest.raises(ValueError, match="pad_semantics must be one of compute, skip, trim, got 'zero'"):
        Padding(hidden=8, intermediate_per_rank=8, pad_semantics="zero")
    with pytest.raises(ValueError, match="Padding.hidden must be a positive int"):
        Padding(hidden=0, intermediate_per_rank=8)
    with pytest.raises(ValueError, match="Padding.kernel_hidden_pad must be a non-negative int, got -1"):
        Padding(hidden=8, intermediate_per_rank=8, kernel_hidden_pad=-1)
    with pytest.raises(ValueError) as err:
        Padding(hidden=8, intermediate_per_rank=8, hidden_pad=1, kernel_hidden_pad=2)
    assert str(err.value) == "a kernel pad cannot exceed the allocated pad"
    b = Backend()
    b.name, b.preference = "acme", 7
    assert repr(b) == "<Backend 'acme' preference=7>"
    with pytest.raises(NotImplementedError, match="backend 'acme' does not implement check()"):
        b.check(None, None)


# -- AITER version floors ---------------------------------------------------------------------------------------

def test_need_feature_names_the_floor_its_source_and_confidence(caps, monkeypatch):
    """A missing AITER feature fails with the version floor, the short name, the target's AITER (or that there is
    none), the feature's citation and its confidence; a derived floor (swiglu_limit: fused_moe(swiglu_limit=) read
    at ROCm/aiter@v0.1.15.post3, the first release not pinned down) says so in the text."""
    from moedispatch.data import capdb
    from moedispatch.kit.rules import need_feature

    assert need_feature(caps("gfx950", "0.1.15.post3"), "gate_mode", "x") is None
    r = need_feature(caps("gfx950", "0.1.13.post1"), "gate_mode", "swigluoai_uninterleave")
    assert r.text == ("swigluoai_uninterleave needs AITER >= 0.1.14 for fused_moe(gate_mode=) with "
                      "GateMode.SEPARATED; target AITER is 0.1.13.post1")
    assert (r.kind, r.source, r.issue, r.confidence) == ("failed", "ROCm/aiter#3123; vllm-project/vllm#46419", None,
                                                         "confirmed")
    r = need_feature(caps("gfx950", "0.1.14"), "swiglu_limit", "clamp")
    assert r.text == ("clamp needs AITER >= 0.1.15 (derived floor) for fused_moe(swiglu_limit=); target AITER is "
                      "0.1.14") and r.confidence == "derived"
    r = need_feature(caps("gfx950", "none"), "gate_mode", "x")
    assert r.text.endswith("; AITER is not installed")
    bare = {"since": "0.1.30", "what": "a future kernel", "source": "ROCm/aiter#1"}
    monkeypatch.setattr(capdb, "feature_info", lambda name: {**bare, "confidence": "unconfirmed"})
    r = need_feature(caps("gfx950", "0.1.15.post3"), "future", "y")
    assert r.text == ("y needs AITER >= 0.1.30 (unconfirmed floor) for a future kernel; target AITER is "
                      "0.1.15.post3") and (r.source, r.confidence) == ("ROCm/aiter#1", "unconfirmed")


def test_plugin_timeout_is_reported_as_the_deadline_says(caps, builtins, monkeypatch):
    """A third-party check() that hangs is abandoned at MOEDISPATCH_PLUGIN_TIMEOUT and reported with the
    deadline's own text; selection goes on."""
    import threading

    monkeypatch.setenv("MOEDISPATCH_PLUGIN_TIMEOUT", "0.2")
    release = threading.Event()
    acme = _Plugin("acme", check=lambda la, c: release.wait(5), preference=1000)
    try:
        d = select(moe_layer("Mixtral-8x7B", 8), caps("gfx942", AITER), tuple(builtins) + (acme,))
    finally:
        release.set()
    assert d.backend == "aiter-ck"
    assert [r.text for r in d.rejection("acme").reasons] == ["plugin error: check() timed out after 0.2s"]


def test_arch_reason_explains_missing_mx_instructions(builtins):
    """MXFP4 kernels exist only on gfx950: on gfx942 (CDNA3, no MX/FP4 scaled MFMA; ROCm precision-support docs) the
    rejection says so, naming the family when the target knows it and never printing a missing one."""
    from moedispatch.testing import fake_capabilities

    flydsl = next(b for b in builtins if b.name == "aiter-flydsl")
    layer = moe_layer("MiniMax-M3-MXFP4", 8)
    known = flydsl.check(layer, fake_capabilities("gfx942", AITER)).reasons[0].text
    assert known == ("needs gfx950 for weights mxfp4 × activations mxfp4 (FlyDSL a4w4 (flydsl_moe*_afp4_wfp4_*)); "
                     "target is gfx942 (MI300X) — gfx942 (CDNA3) has no MX/FP4 scaled-MFMA matrix instructions")
    unknown = flydsl.check(layer, fake_capabilities("gfx942", AITER, family=None)).reasons[0].text
    assert unknown.endswith("— gfx942 has no MX/FP4 scaled-MFMA matrix instructions")
    native = flydsl.check(layer, fake_capabilities("gfx942", AITER, native_mx=True)).reasons[0].text
    assert native.endswith("target is gfx942 (MI300X)")
    # A kernel that also runs on gfx942 (CK a16w16) is not missing MX instructions on gfx90a (newcomer review: a bf16
    # layer's rejection blamed MX/FP4 scaled MFMA).
    ck = next(b for b in builtins if b.name == "aiter-ck")
    bf16 = ck.check(moe_layer("Mixtral-8x7B", 1), fake_capabilities("gfx90a", AITER)).reasons
    assert any("needs gfx942 or gfx950 for weights bf16" in r.text for r in bf16)
    assert not any("scaled-MFMA" in r.text for r in bf16)


def test_emulation_runner_is_built_for_the_layer():
    """The emulation backend runs the layer it planned (moedispatch.numerics.runner.EmulationRunner; needs torch)."""
    pytest.importorskip("torch")
    from moedispatch_plugins.emulation import Emulation

    layer = moe_layer("MiniMax-M3-MXFP4", 8)
    runner = Emulation().runner(layer)
    assert runner.layer is layer and runner.activation == layer.activation == "swigluoai_uninterleave"


def test_third_party_backend_is_costed_with_the_runtime(caps, builtins):
    """With a Runtime, a correct third-party backend (no moe_cost hook) is costed on the roofline like the built-ins
    and its decision says how it compares; the AITER winner's dispatch is not asked of it."""
    from moedispatch.core.workload import Runtime

    acme = _Plugin("acme", preference=1000)
    acme.family = "acme"
    layer = moe_layer("Mixtral-8x7B", 8)
    d = select(layer, caps("gfx942", AITER), tuple(builtins) + (acme,), runtime=Runtime.build((1, 8192), env={}))
    assert d.backend == "acme" and d.dispatch is None
    assert [(c.tokens, c.basis) for c in d.cost] == [(1, "roofline"), (8192, "roofline")]
    assert all(c.low <= c.us <= c.high for c in d.cost) and d.cost[0].us < d.cost[1].us
    head = d.reasons[0].text
    assert head.startswith("acme: correct for this layer, highest preference (1000) among supported [acme, aiter-ck")
    assert " vs aiter-ck " in head and head.endswith(" at 1 token")
    ck = d.rejection("aiter-ck")
    assert ck.supported and [(c.tokens, c.basis) for c in ck.cost] == [(1, "roofline"), (8192, "roofline")]


@pytest.mark.parametrize("version, says", [("0.1.15", "below both"), ("0.1.16", "below the higher one"),
                                           ("0.1.16.post2", None), ("0.1.20.post1", None)])
def test_the_aiter_floor_conflict_says_which_floors_the_target_misses(version, says):
    """MiniMax-M3's AITER floor: 0.1.15.post3 (vllm#46419) vs 0.1.16.post2 (the vLLM recipes). A target below both
    said "below the higher one" (newcomer review)."""
    from moedispatch.testing import fake_capabilities
    from moedispatch_plugins._aiter import version_floor_notes

    layer = moe_layer("MiniMax-M3-MXFP4", 8)
    notes = [r.text for r in version_floor_notes(layer, fake_capabilities("MI355X", version))]
    if says is None:
        assert notes == []
    else:
        (text,) = notes
        assert f"target AITER {version} is {says} — moedispatch enforces only" in text
