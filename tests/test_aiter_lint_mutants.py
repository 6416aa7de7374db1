"""Boundary cases of the AITER tuned-CSV lint (moedispatch/aiter/lint.py, ``moedispatch aiter-configs``), each pinning
a rule the sampled mutation run found unpinned. Built on AITER's real tuned rows: the bundled HEAD snapshot
(ROCm/aiter@e4048607, moedispatch's own index) and, where a test reads AITER's files, ../shared/aiter/<tag>/."""

from __future__ import annotations

import argparse
import json
from dataclasses import replace

import pytest

from moedispatch.aiter import lint as aiter_lint
from moedispatch.core.errors import UsageError
from moedispatch.data import aiter_configs as ac
from moedispatch.data import capdb

FP4 = "torch.float4_e2m1fn_x2"
KIMI_K2_FP4 = "ROCm/aiter@e4048607:aiter/configs/model_configs/kimik2_fp4_tuned_fmoe.csv"
DSV4 = "ROCm/aiter@e4048607:aiter/configs/model_configs/dsv4_fp8fp4_tuned_fmoe.csv"
KIMI_K3_A8W4 = "ROCm/aiter@e4048607:aiter/configs/model_configs/kimik3_a8w4_tuned_fmoe.csv"
DS_V3_BLOCK = "ROCm/aiter@e4048607:aiter/configs/model_configs/a8w8_blockscale_tuned_fmoe_ds_v3.csv"


@pytest.fixture(scope="module")
def head():
    return ac.load_config_set("head")


@pytest.fixture
def head_report(head):
    # per test, not per module: mutmut maps each test to the functions it calls, and a module-scoped report would be
    # computed under the first test only
    return aiter_lint.lint(head)


def _set(head, rows, **kw):
    return replace(head, rows=tuple(rows), warnings=(), merge_error=None, **kw)


def _row(head, **want):
    """The first untagged, timed row of the HEAD snapshot whose fields equal ``want``."""
    return next(r for r in head.rows if not r.tag and r.us and all(getattr(r, k) == v for k, v in want.items()))


def _fp8_950(head):
    # a8w8_blockscale_tuned_fmoe_ds_v3.csv:331: 4096x384 E128 top-8, fp8 per_1x128, gfx950 cu_num 256, token 1
    return _row(head, gfx="gfx950", token=1, q_type="QuantType.per_1x128", model_dim=4096, inter_dim=384)


def _fnuz_942(head):
    # a8w8_blockscale_tuned_fmoe_ds_v3.csv:382: 7168x2048 E33 top-9, fnuz fp8 per_1x128, gfx942 cu_num 304, token 1
    return _row(head, gfx="gfx942", cu_num=304, token=1, q_dtype_w="torch.float8_e4m3fnuz")


def _checks(report, check):
    return [f for f in report.findings if f.check == check]


def _peak(product):
    return capdb.gpus()["peak"][product]


# -- the real HEAD snapshot ----------------------------------------------------------------------------------------

def test_head_snapshot_rows_faster_than_hbm_are_the_fp4_decode_rows(head_report):
    """faster-than-hbm (lint.py docstring): at HEAD, exactly these rows beat 8 TB/s on cu_num 256 (MI355X's
    hbm_tbps, capability_db/gpus.toml [peak.MI355X]), cited with that table's source."""
    found = _checks(head_report, "faster-than-hbm")
    assert sorted(f.rows[0] for f in found) == sorted(
        [f"{DSV4}:47", f"{DSV4}:48", f"{KIMI_K2_FP4}:39", f"{KIMI_K2_FP4}:40", f"{KIMI_K2_FP4}:41",
         f"{KIMI_K2_FP4}:71", f"{KIMI_K2_FP4}:72", f"{KIMI_K2_FP4}:73", f"{KIMI_K3_A8W4}:36"])
    assert {(f.severity, f.source, f.confidence) for f in found} == {
        ("error", _peak("MI355X")["source"], "confirmed")}
    one = next(f for f in found if f.rows == (f"{KIMI_K2_FP4}:39",))
    assert one.message == ("us=143.211 at token 32 is below 149.4 us, the time to read the activated experts' "
                           "weights at 8 TB/s (MI355X, the fastest product with cu_num 256)")


def test_head_snapshot_rows_faster_than_compute_are_two_mi308x_rows(head_report):
    """faster-than-compute (lint.py docstring): two cu_num-80 rows of the DeepSeek-V3 block-scale table beat the
    MI308X fp8 peak (gpus.toml [peak.MI308X], confidence derived); no other HEAD row does."""
    found = _checks(head_report, "faster-than-compute")
    assert [f.rows for f in found] == [(f"{DS_V3_BLOCK}:215",), (f"{DS_V3_BLOCK}:235",)]
    assert {(f.severity, f.source, f.confidence) for f in found} == {
        ("error", _peak("MI308X")["source"], "derived")}
    assert found[0].message == ("us=723.085 at token 16384 is below 2097.2 us, the time for its useful FLOPs at "
                                "MI308X's peak for these dtypes")


def test_head_snapshot_summary_counts(head, head_report):
    """lint() summary: rows, files, rows whose us was copied, rows faster than HBM / compute, findings (one of them the
    13 hand-pinned us=0 rows: unmatchable, info)."""
    assert dict(head_report.counts) == {"rows": len(head.rows), "files": len(head.files), "rows_copied_timing": 598,
                                        "rows_faster_than_hbm": 9, "rows_faster_than_compute": 2, "findings": 140}
    assert sum(len(f.rows) for f in _checks(head_report, "copied-timing")) == 598


def test_head_snapshot_shared_cu_findings(head, head_report):
    """shared-cu-num (AITER PR 5500): 304 is MI300X and MI325X, 256 MI355X and MI350X, each with its bandwidth."""
    found = _checks(head_report, "shared-cu-num")
    n304 = sum(1 for r in head.rows if (r.gfx, r.cu_num) == ("gfx942", 304))
    assert [f.message for f in found] == [
        f"{n304} rows keyed gfx942 cu_num=304 apply to MI300X (5.3 TB/s) and MI325X (6 TB/s): AITER cannot tell them "
        "apart, so timings tuned on one are used on the other",
        f"{len(head.rows) - n304 - sum(1 for r in head.rows if r.cu_num == 80)} rows keyed gfx950 cu_num=256 apply "
        "to MI355X (8 TB/s) and MI350X (8 TB/s): AITER cannot tell them apart, so timings tuned on one are used on "
        "the other"]
    assert {(f.severity, f.source, f.confidence, len(f.rows)) for f in found} == {
        ("info", "https://github.com/ROCm/aiter/pull/5500", "confirmed", 1)}


def test_head_snapshot_json_report_carries_every_field(head_report):
    """render --format json: schema, configs, summary and every finding's check/severity/message/rows/source."""
    data = json.loads(aiter_lint.render(head_report, "json"))
    assert data["schema"] == "moedispatch.aiter_configs/1" and data["summary"] == dict(head_report.counts)
    assert data["configs"]["rows"] == len(head_report.configs.rows)
    assert len(data["findings"]) == len(head_report.findings)
    for got, f in zip(data["findings"], head_report.findings):
        assert got == {"check": f.check, "severity": f.severity, "message": f.message, "rows": list(f.rows),
                       "source": f.source, "confidence": f.confidence}


# -- the physical and compute floors -------------------------------------------------------------------------------

def test_physical_floor_of_one_decode_token_reads_topk_experts(head):
    """faster-than-hbm: at M=1 the tuner's uniform routing activates exactly top-k experts; fp8 weights are 1 byte,
    gate+up (g1u1) is 2·I rows plus I for down: 8 × 4096 × 1152 bytes at 8 TB/s = 4.718592 us."""
    r = _fp8_950(head)
    assert (r.expert, r.topk, r.model_dim, r.inter_dim, r.use_g1u1) == (128, 8, 4096, 384, 1)
    assert aiter_lint.physical_floor_us(r, 8.0) == pytest.approx(8 * 4096 * 1152 / 8e12 * 1e6, rel=1e-14)
    # without g1u1 the gate is absent: I + I rows
    assert aiter_lint.physical_floor_us(r._replace(use_g1u1=0), 8.0) == pytest.approx(
        8 * 4096 * 768 / 8e12 * 1e6, rel=1e-14)


def test_physical_floor_counts_fp4_at_half_a_byte_plus_e8m0_scales(head):
    """faster-than-hbm: fp4 at ½ byte plus 1/32 byte of E8M0 scale per element (per_1x32) — not dtype2bpe_dict's 1."""
    r = _fp8_950(head)._replace(q_dtype_a=FP4, q_dtype_w=FP4, q_type="QuantType.per_1x32")
    assert aiter_lint.physical_floor_us(r, 8.0) == pytest.approx(8 * 4096 * 1152 * (0.5 + 1 / 32) / 8e12 * 1e6,
                                                                 rel=1e-14)


def test_physical_floor_at_many_tokens_approaches_every_expert(head):
    """faster-than-hbm: E·(1-(1-k/E)^M) experts at M tokens (M=2: 128·(1-(15/16)²) = 15.5 of 128)."""
    r = _fp8_950(head)._replace(token=2)
    assert aiter_lint.physical_floor_us(r, 8.0) == pytest.approx(15.5 * 4096 * 1152 / 8e12 * 1e6, rel=1e-14)


def test_physical_floor_without_experts_or_known_dtype(head):
    """physical_floor_us: no experts read nothing (0 us); an unknown weight dtype or no bandwidth has no floor."""
    r = _fp8_950(head)
    assert aiter_lint.physical_floor_us(r._replace(expert=0), 8.0) == 0.0
    assert aiter_lint.physical_floor_us(r._replace(q_dtype_w="torch.float64"), 8.0) is None
    assert aiter_lint.physical_floor_us(r, 0.0) is None


@pytest.mark.parametrize("dtypes, product, tflops", [
    (("torch.float8_e4m3fn", "torch.float8_e4m3fn"), "MI355X", "fp8_tflops"),
    (("torch.bfloat16", "torch.bfloat16"), "MI355X", "bf16_tflops"),
    ((FP4, FP4), "MI355X", "fp4_tflops"),
    (("torch.float8_e4m3fn", FP4), "MI355X", "fp4_tflops"),       # a8w4: the fp4 MFMA
    (("torch.bfloat16", "torch.int4"), "MI355X", "fp8_tflops"),     # kimik2_i4: int4 weights, the fp8 rate
    (("torch.bfloat16", "torch.uint32"), "MI355X", "fp8_tflops"),
    (("torch.float8_e4m3fnuz", "torch.float8_e4m3fnuz"), "MI300X", "fp8_tflops"),
    (("torch.int8", "torch.int8"), "MI300X", "fp8_tflops"),
    ((FP4, FP4), "MI300X", "fp8_tflops"),                          # no fp4 peak on gfx942: the next most generous
])
def test_compute_floor_uses_the_most_generous_peak_for_the_operand_dtypes(head, dtypes, product, tflops):
    """faster-than-compute: 2·M·k·D·(n1+I) FLOPs at the product's peak for the row's dtypes (gpus.toml [peak])."""
    r = _fp8_950(head)._replace(q_dtype_a=dtypes[0], q_dtype_w=dtypes[1], token=16)
    flops = 2 * 16 * 8 * 4096 * (2 * 384 + 384)
    assert aiter_lint.compute_floor_us(r, product) == pytest.approx(flops / (_peak(product)[tflops] * 1e12) * 1e6,
                                                                    rel=1e-12)


def test_compute_floor_needs_peak_figures(head):
    """compute_floor_us: None for a product with no peak figures (MI210 has no [peak] table nor datasheet entry)."""
    assert aiter_lint.compute_floor_us(_fp8_950(head), "MI210") is None
    assert aiter_lint.compute_floor_us(_fp8_950(head), "MI355X") is not None


# -- hand-made sets from real rows ---------------------------------------------------------------------------------

def test_the_fastest_product_sharing_a_cu_num_sets_the_hbm_floor(head):
    """faster-than-hbm: cu_num 304 is MI300X (5.3 TB/s) and MI325X (6 TB/s); the floor is MI325X's, cited with
    its source and its 'unconfirmed' confidence (gpus.toml [peak.MI325X])."""
    r = _fnuz_942(head)._replace(us=0.5)
    (f,) = _checks(aiter_lint.lint(_set(head, [r])), "faster-than-hbm")
    floor = aiter_lint.physical_floor_us(r, 6.0)
    assert f.message == (f"us=0.5 at token 1 is below {floor:.1f} us, the time to read the activated experts' "
                         "weights at 6 TB/s (MI325X, the fastest product with cu_num 304)")
    assert (f.severity, f.rows, f.source, f.confidence) == ("error", (r.where,), _peak("MI325X")["source"],
                                                            "unconfirmed")


def test_compute_floor_of_a_shared_cu_num_names_the_fastest_product(head):
    """faster-than-compute: MI300X and MI325X share cu_num 304 and their fp8 peak; the lowest floor's product
    (MI300X, confirmed) is named and cited."""
    r = _fnuz_942(head)._replace(token=16384, us=1.0, line=9999)
    (f,) = _checks(aiter_lint.lint(_set(head, [r])), "faster-than-compute")
    floor = aiter_lint.compute_floor_us(r, "MI300X")
    assert f.message == (f"us=1 at token 16384 is below {floor:.1f} us, the time for its useful FLOPs at MI300X's "
                         "peak for these dtypes")
    assert (f.check, f.severity, f.rows, f.source, f.confidence) == (
        "faster-than-compute", "error", (r.where,), _peak("MI300X")["source"], "confirmed")


def test_rows_without_a_timing_or_a_known_product_are_not_judged(head):
    """faster-than-hbm / -compute / shared-cu-num judge only timed rows (us > 0) on a (gfx, cu_num) gpus.toml knows;
    a 38-CU gfx942 row (an MI300X CPX partition) matches no product — and does not stop the rows after it."""
    r = _fp8_950(head)
    fast = _fnuz_942(head)._replace(token=16384, us=0.5, line=9000)
    rows = [r._replace(cu_num=38, us=0.5, gfx="gfx942", line=1), r._replace(us=None, line=2),
            r._replace(us=0.0, line=3), fast]
    report = aiter_lint.lint(_set(head, rows))
    assert [f.rows for f in _checks(report, "faster-than-hbm")] == [(fast.where,)]
    assert [f.rows for f in _checks(report, "faster-than-compute")] == [(fast.where,)]
    assert [f.message.split(" apply")[0] for f in _checks(report, "shared-cu-num")] == [
        "1 rows keyed gfx942 cu_num=304", "2 rows keyed gfx950 cu_num=256"]


def test_a_cu_num_shared_by_products_without_bandwidth_names_them_plainly(head):
    """shared-cu-num: MI210 and MI250 (gfx90a, 104 CUs) have no bandwidth figure: named without one."""
    r = _fp8_950(head)._replace(gfx="gfx90a", cu_num=104)
    (f,) = _checks(aiter_lint.lint(_set(head, [r])), "shared-cu-num")
    assert f.message.startswith("1 rows keyed gfx90a cu_num=104 apply to MI210 and MI250: AITER cannot tell")


def test_a_copied_timing_is_reported_once_not_again_as_impossible(head):
    """copied-timing (lint.py docstring): a us pasted from token 1 into token 16384 is reported as copied, not again
    as faster than HBM or compute at the bucket it was pasted into; the token-1 row itself is judged as usual."""
    r = _fp8_950(head)._replace(us=10.0)
    big = r._replace(token=16384, line=r.line + 1)
    assert aiter_lint.physical_floor_us(big, 8.0) > 10.0 and aiter_lint.compute_floor_us(big, "MI355X") > 10.0
    report = aiter_lint.lint(_set(head, [r, big]))
    (f,) = _checks(report, "copied-timing")
    assert f.rows == (r.where, big.where)
    assert not _checks(report, "faster-than-hbm") and not _checks(report, "faster-than-compute")
    assert dict(report.counts)["rows_copied_timing"] == 2


def test_copied_timing_compares_us_to_four_decimals(head):
    """copied-timing: the same us to 4 decimals is a copy; a difference in the 4th decimal is a measurement."""
    r = _fp8_950(head)
    copy = aiter_lint.lint(_set(head, [r._replace(us=101.81791), r._replace(us=101.81789, token=2, line=2)]))
    (f,) = _checks(copy, "copied-timing")
    assert f.message == ("4096x384 E128 top-8 per_1x128 cu_num 256: us=101.818 for token buckets 1, 2 "
                         "(copied, not measured)") and f.severity == "warning"
    measured = aiter_lint.lint(_set(head, [r._replace(us=101.8179), r._replace(us=101.8181, token=2, line=2)]))
    assert not _checks(measured, "copied-timing")


def test_malformed_lines_and_shifted_rows(head):
    """malformed: each reader warning is an error, verbatim; shifted rows are one warning naming the first (its
    defects) and at most 20 rows — here HEAD's 19 real shifted rows plus two more."""
    shifted = [r for r in head.rows if r.defects]
    assert len(shifted) == 19
    extra = [shifted[0]._replace(line=900 + i) for i in range(2)]
    warning = "x.csv:3: 7 columns, 22 expected"
    cs = replace(_set(head, shifted + extra), warnings=(warning,))
    err, warn = _checks(aiter_lint.lint(cs), "malformed")
    assert (err.severity, err.message, err.rows) == ("error", warning, ())
    assert warn.message == (f"21 rows have missing or shifted trailing columns (pandas reads them with NaN/shifted "
                            f"values), e.g. {shifted[0].where}: {'; '.join(shifted[0].defects)}")
    assert warn.rows == tuple(r.where for r in shifted + extra[:1])


# -- shadowed ------------------------------------------------------------------------------------------------------

def _distinct(head, n, key=lambda r: r.key()):
    """n real HEAD rows with distinct lookup keys (or ``key``), untagged, from gfx950."""
    seen, out = set(), []
    for r in head.rows:
        if r.gfx == "gfx950" and not r.tag and key(r) not in seen:
            seen.add(key(r))
            out.append(r)
        if len(out) == n:
            return out
    raise AssertionError("not enough rows")


def test_repeated_lookup_keys_keep_the_first(head):
    """shadowed (aiter/fused_moe.py get_2stage_cfgs): a repeated key is never used; AITER keeps the first — 21
    repeats are counted, 20 named, the first one with the row it hides behind."""
    rows = _distinct(head, 21)
    again = [r._replace(line=r.line + 5000) for r in rows]
    (f,) = [f for f in _checks(aiter_lint.lint(_set(head, rows + again)), "shadowed") if "repeat" in f.message]
    assert f.message == (f"21 rows repeat an earlier lookup key; AITER keeps the first (e.g. {again[0].where} behind "
                         f"{rows[0].where})")
    assert (f.severity, f.rows, f.source, f.confidence) == (
        "warning", tuple(r.where for r in again[:20]), ac.SOURCE_LOOKUP, "confirmed")


def test_head_keys_on_gfx_and_legacy_does_not(head):
    """shadowed: HEAD's lookup key includes gfx (_INDEX_COLS), 0.1.7's does not: the same row on two gfx is two
    keys at HEAD and a repeat at legacy — for exact keys and for the act-wildcard match alike."""
    r = _fp8_950(head)
    other = "ActivationType.Gelu"
    rows = [r, r._replace(gfx="gfx942", line=r.line + 1), r._replace(gfx="gfx942", act_type=other, line=r.line + 2)]
    at_head = [f.message for f in _checks(aiter_lint.lint(_set(head, rows)), "shadowed")]
    assert not [m for m in at_head if "repeat" in m]
    (act,) = [m for m in at_head if "act_type" in m]
    assert act.startswith("1 rows differ from an earlier row only in act_type")
    assert f"(e.g. {rows[2].where} (Gelu) behind {rows[1].where} (Silu))" in act
    legacy = aiter_lint.lint(_set(head, rows[:2], dispatch="legacy"))
    (dup,) = [f for f in _checks(legacy, "shadowed") if "repeat" in f.message]
    assert dup.rows == (rows[1].where,)


def test_act_type_duplicates_name_both_activations(head):
    """shadowed (act wildcard, HEAD): 21 rows differing only in act_type: counted, 20 named, both act types short."""
    rows = _distinct(head, 21)
    gelu = [r._replace(act_type="ActivationType.Gelu", line=r.line + 5000) for r in rows]
    (f,) = [f for f in _checks(aiter_lint.lint(_set(head, rows + gelu)), "shadowed") if "act_type" in f.message]
    assert f.message.startswith("21 rows differ from an earlier row only in act_type; AITER HEAD e4048607 (v0.1.20+)'s "
                                "exact lookup keys on the ActivationType enum and cannot match the CSV's strings, so the act-wildcard "
                                "match returns the earlier row (e.g. ")
    assert f.message.endswith(f"(e.g. {gelu[0].where} (Gelu) behind {rows[0].where} "
                              f"({rows[0].act_type.split('.')[-1]}))")
    assert (f.severity, f.rows, f.source, f.confidence) == (
        "warning", tuple(r.where for r in gelu[:20]), ac.SOURCE_LOOKUP, "derived")


def test_act_type_rows_are_separate_keys_where_the_release_keys_on_the_string(head):
    """v0.1.19 (and v0.1.13.x and older) key the exact dict on str(activation) (Rules.act_exact): a Gelu row beside a
    Silu row of the same shape is matched exactly there — not shadowed (it was reported as HEAD's act-wildcard shadow
    for every release; newcomer review). v0.1.19.post1 keys on the enum again."""
    rows = _distinct(head, 3)
    gelu = [r._replace(act_type="ActivationType.Gelu", line=r.line + 5000) for r in rows]
    for version, shadowed in (("0.1.19", False), ("0.1.19.post1", True), ("0.1.10.post2", False), (None, True)):
        found = _checks(aiter_lint.lint(_set(head, rows + gelu, version=version)), "shadowed")
        assert bool([f for f in found if "act_type" in f.message]) is shadowed, version
    # flydsl_fallback rows: dropped at HEAD (and v0.1.18+); v0.1.11-v0.1.17 read them when flydsl is missing — no
    # "never used" there, and never a repeat of the row they stand in for.
    tagged = [r._replace(tag="flydsl_fallback", line=r.line + 9000) for r in rows]
    for version, dropped in (("0.1.15", False), ("0.1.18", True), (None, True)):
        found = _checks(aiter_lint.lint(_set(head, rows + tagged, version=version)), "shadowed")
        assert bool([f for f in found if "flydsl_fallback" in f.message]) is dropped, version
        assert not [f for f in found if "repeat" in f.message], version


def test_flydsl_fallback_rows_are_dropped_at_head_only(head):
    """shadowed (get_cfg_2stages, HEAD): flydsl_fallback rows are dropped before the lookup — reported once as
    such (info; 21 counted, 20 named), never as repeats of the rows they duplicate; 0.1.7 has no such filter."""
    rows = _distinct(head, 21)
    tagged = [r._replace(tag="flydsl_fallback", line=r.line + 5000) for r in rows]
    found = _checks(aiter_lint.lint(_set(head, rows + tagged)), "shadowed")
    assert [(f.severity, f.message) for f in found] == [
        ("info", "21 rows tagged flydsl_fallback are dropped before the lookup at HEAD e4048607 (v0.1.20+) "
                 "(get_cfg_2stages): never used, even without flydsl")]
    assert (found[0].rows, found[0].source) == (tuple(r.where for r in tagged[:20]), ac.SOURCE_LOOKUP)
    legacy = _checks(aiter_lint.lint(_set(head, rows + tagged, dispatch="legacy")), "shadowed")
    assert [f.message.split(";")[0] for f in legacy if "never looked up" not in f.message] == [
        "21 rows repeat an earlier lookup key"]


@pytest.mark.parametrize("dispatch, tokens, unreachable", [
    ("head", [1, 2, 4, 8, 16, 1024, 8192, 16384, 32768, 131072], []),
    ("head", [3, 24, 40, 56, 65536], [3, 24, 40, 56, 65536]),
    ("legacy", [16, 32, 64, 128, 256, 512, 1024], []),
    ("legacy", [1, 2, 8, 65, 257, 2048], [1, 2, 8, 65, 257, 2048]),
    ("legacy", [3, 10, 129], [3, 10, 129]),   # 129 is no legacy bucket (get_padded_M(129) == 256)
    ("head", [6, 10, 129], [6, 10, 129]),
])
def test_only_get_padded_m_buckets_are_looked_up(head, dispatch, tokens, unreachable):
    """shadowed (aiter/fused_moe.py get_padded_M): HEAD pads to powers of two then 32768/131072; 0.1.7 pads every
    M ≤ 16 to 16, then powers of two up to 1024: a row at any other token is never looked up."""
    r = _fp8_950(head)
    rows = [r._replace(token=t, line=i + 1, us=1000.0 + i) for i, t in enumerate(tokens)]
    found = [f for f in _checks(aiter_lint.lint(_set(head, rows, dispatch=dispatch)), "shadowed")
             if "never looked up" in f.message]
    if not unreachable:
        assert not found
    else:
        (f,) = found
        assert f.message == (f"{len(unreachable)} rows have a token no get_padded_M bucket produces "
                             f"({', '.join(map(str, unreachable))}): never looked up")


def test_aiter_merge_error_is_a_shadowed_warning(head):
    """shadowed (aiter/jit/core.py update_config_files): what AITER's merge de-duplication would say, verbatim."""
    cs = replace(_set(head, [_fp8_950(head)]), merge_error="2 duplicate rows dropped")
    (f,) = _checks(aiter_lint.lint(cs), "shadowed")
    assert (f.severity, f.message, f.rows, f.source) == ("warning", "2 duplicate rows dropped", (), ac.SOURCE_MERGE)


def test_an_override_counts_what_it_replaces_and_loses(head):
    """shadowed (sglang PR 37072): AITER_CONFIG_FMOE replaces the default set; rows sharing a key (gfx aside) with
    the override's are overridden, the rest are no longer looked up."""
    base = ac.load_config_set(None, version=head.version)
    first = base.rows[0]
    cs = replace(base, rows=(first,), origin="env", warnings=(), merge_error=None)
    (f,) = [f for f in _checks(aiter_lint.lint(cs, {"AITER_CONFIG_FMOE": " /x.csv "}), "shadowed")
            if "replaces" in f.message]
    replaced = [r for r in base.rows if r.key(with_gfx=False) == first.key(with_gfx=False)]
    assert f.message == (f"AITER_CONFIG_FMOE replaces the default set ({base.label}): "
                         f"{len(base.rows) - len(replaced)} of its {len(base.rows)} rows are no longer looked up, "
                         f"{len(replaced)} are overridden by rows of the override")
    assert (f.severity, f.rows) == ("warning", tuple(r.where for r in replaced[:20]))
    assert not [f for f in aiter_lint.lint(cs, {"AITER_CONFIG_FMOE": "  "}).findings if "replaces" in f.message]


# -- without gpus.toml [peak] ----------------------------------------------------------------------------------------

def test_without_peak_tables_the_datasheet_figures_apply(head, monkeypatch):
    """HBM_TB_S / PEAK_TFLOPS (lint.py): a gpus.toml without [peak.*] falls back to the datasheet table, with its
    source and confidence; MI308X has no public compute peak, so nothing is compared with one."""
    gpus = {k: v for k, v in capdb.gpus().items() if k != "peak"}
    monkeypatch.setattr(capdb, "gpus", lambda: gpus)
    r = _fnuz_942(head)._replace(us=0.5)
    (f,) = _checks(aiter_lint.lint(_set(head, [r])), "faster-than-hbm")
    bw, src, conf = aiter_lint.HBM_TB_S["MI325X"]
    assert (f.source, f.confidence) == (src, conf) and f"at {bw:g} TB/s (MI325X," in f.message
    big = r._replace(token=16384, us=1.0, line=9999)
    (c,) = _checks(aiter_lint.lint(_set(head, [big])), "faster-than-compute")
    assert (c.source, c.confidence) == aiter_lint.HBM_TB_S["MI300X"][1:]
    assert aiter_lint.compute_floor_us(big, "MI300X") == pytest.approx(
        2 * 16384 * 9 * 7168 * 3 * 2048 / (aiter_lint.PEAK_TFLOPS["MI300X"][1] * 1e12) * 1e6, rel=1e-12)
    assert aiter_lint.compute_floor_us(big, "MI308X") is None


def test_a_product_level_bandwidth_key_is_read_when_peak_has_none(head, monkeypatch):
    """_products_by_cu: without [peak.*], a product's own hbm_tb_s (gpus.toml) beats the datasheet table."""
    gpus = {k: v for k, v in capdb.gpus().items() if k != "peak"}
    arch = dict(gpus["arch"])
    g = dict(arch["gfx942"])
    g["products"] = [dict(p, hbm_tb_s=7.0) if p["name"] == "MI300X" else p for p in g["products"]]
    arch["gfx942"] = g
    gpus["arch"] = arch
    monkeypatch.setattr(capdb, "gpus", lambda: gpus)
    (f,) = _checks(aiter_lint.lint(_set(head, [_fnuz_942(head)._replace(us=0.5)])), "faster-than-hbm")
    assert "at 7 TB/s (MI300X," in f.message and (f.source, f.confidence) == ("capability_db/gpus.toml", "confirmed")


def test_a_peak_table_without_source_is_cited_as_gpus_toml(head, monkeypatch):
    """_products_by_cu / _tflops: a [peak.*] table with figures but no source or confidence is cited as
    'capability_db/gpus.toml [peak]', confirmed."""
    gpus = dict(capdb.gpus())
    gpus["peak"] = {name: {k: v for k, v in pk.items() if k not in ("source", "confidence")}
                    for name, pk in gpus["peak"].items()}
    monkeypatch.setattr(capdb, "gpus", lambda: gpus)
    r = _fnuz_942(head)._replace(us=0.5)
    (f,) = _checks(aiter_lint.lint(_set(head, [r])), "faster-than-hbm")
    (c,) = _checks(aiter_lint.lint(_set(head, [r._replace(token=16384, us=1.0)])), "faster-than-compute")
    assert {(f.source, f.confidence), (c.source, c.confidence)} == {("capability_db/gpus.toml [peak]", "confirmed")}


# -- render and run_cli ----------------------------------------------------------------------------------------------

def test_render_table_lists_each_check_and_cuts_long_lists(head):
    """render (table): header, summary, then per check at most 12 findings (the rest counted), 3 rows each."""
    base = _distinct(head, 14, key=lambda r: r.shape())
    rows = []
    for i, r in enumerate(base):
        rows += [r._replace(token=t, us=5000.0 + i, line=100 * i + t) for t in (1, 2, 4, 8)]
    report = aiter_lint.lint(_set(head, rows))
    out = aiter_lint.render(report)
    lines = out.split("\n")
    assert lines[0] == f"tuned set  {head.label}"
    assert lines[1] == f"dispatch   head model; {len(rows)} rows in {len(head.files)} files"
    assert lines[2] == "summary    " + ", ".join(f"{k} {v}" for k, v in report.counts)
    assert lines[3] == "" and lines[4] == "copied-timing (14)"
    first = _checks(report, "copied-timing")[0]
    assert lines[5] == f"  warning {first.message}  [{', '.join(first.rows[:3])}, …]"
    assert "  … 2 more (use --format json)" in lines
    assert sum(1 for ln in lines if ln.startswith("  warning ")) == 12
    assert lines[-2:] == ["shared-cu-num (1)", f"  info    {_checks(report, 'shared-cu-num')[0].message}  "
                                               f"[{rows[0].where}]"]


def test_render_table_marks_unconfirmed_figures_and_notes(head):
    """render (table): a finding resting on an unconfirmed figure says so; a set's notes are printed; rows are
    bracketed only when there are some, the ellipsis only past three."""
    r = _fnuz_942(head)._replace(us=0.5)
    cs = replace(_set(head, [r], notes=("AITER_CONFIG_FMOE replaces AITER's whole tuned set",)),
                 merge_error="dup rows")
    report = aiter_lint.lint(cs)
    lines = aiter_lint.render(report, "table").split("\n")
    assert lines[2] == "note       AITER_CONFIG_FMOE replaces AITER's whole tuned set"
    (hbm,) = _checks(report, "faster-than-hbm")
    assert f"  error   {hbm.message} (unconfirmed)  [{r.where}]" in lines
    assert "  warning dup rows" in lines
    shared = _checks(report, "shared-cu-num")[0]
    assert f"  info    {shared.message}  [{r.where}]" in lines


def _args(**kw):
    base = {"aiter_env": [], "aiter_version": None, "configs": None, "format": "json"}
    base.update(kw)
    return argparse.Namespace(**base)


def _run(**kw):
    out = []
    assert aiter_lint.run_cli(_args(**kw), out.append) == 0
    (text,) = out
    return text


@pytest.mark.parametrize("version, label", [("head", "AITER main @ e4048607"), ("bundled", None),
                                            ("v0.1.12", "v0.1.12")])
def test_run_cli_reads_a_release_of_the_index(version, label):
    """aiter-configs --aiter-version: a release tag or 'bundled' reads moedispatch's per-release index."""
    data = json.loads(_run(aiter_version=version))
    assert data["configs"]["origin"] == "bundled"
    if label:
        assert label in data["configs"]["label"]


def test_run_cli_default_and_installed_read_the_same_set():
    """aiter-configs: no --aiter-version and 'installed' both lint the installed AITER's set (when one is)."""
    default, installed = json.loads(_run()), json.loads(_run(aiter_version="installed"))
    assert default == installed and default["configs"]["origin"] == ac.load_config_set(None).origin


def test_run_cli_installed_without_aiter_is_a_usage_error(monkeypatch):
    """aiter-configs --aiter-version installed: with no AITER installed it is bad input, never the bundled set."""
    monkeypatch.setattr(ac, "installed_aiter", lambda: (None, None))
    with pytest.raises(UsageError, match="no AITER"):
        _run(aiter_version="installed")
    assert json.loads(_run())["configs"]["origin"] == "bundled"


def test_run_cli_pep440_version_picks_its_release_and_junk_is_refused():
    """aiter-configs --aiter-version: a PEP 440 version plans for that AITER; anything else names the releases."""
    data = json.loads(_run(aiter_version="0.1.12"))
    assert data["configs"]["version"] == "0.1.12" and data["configs"]["origin"] in ("bundled", "installed")
    tags = [r.tag for r in ac.releases()]
    with pytest.raises(UsageError) as exc:
        _run(aiter_version="not-a-version")
    assert str(exc.value) == (f"--aiter-version 'not-a-version' is not a PEP 440 version, 'installed' or a release of "
                              f"moedispatch's AITER index ({tags[0]} … {tags[-1]})")


def test_run_cli_configs_folder_and_its_errors(shared_aiter, tmp_path):
    """aiter-configs --configs: a folder of AITER's CSVs (../shared/aiter/v0.1.12/aiter) is read as given; a path
    that is no folder is bad input, named."""
    folder = shared_aiter / "v0.1.12" / "aiter"
    data = json.loads(_run(configs=str(folder)))
    assert data["configs"]["origin"] == "explicit" and str(folder) in data["configs"]["label"]
    missing = tmp_path / "nope"
    with pytest.raises(UsageError) as exc:
        _run(configs=str(missing))
    assert str(exc.value) == f"--configs {str(missing)!r} is not a directory"


def test_run_cli_env_override_replaces_the_set(shared_aiter):
    """aiter-configs --aiter-env AITER_CONFIG_FMOE=<csv>: the override is linted, and what it replaces reported."""
    csv = shared_aiter / "v0.1.12" / "aiter" / "configs" / "tuned_fmoe.csv"
    data = json.loads(_run(aiter_env=[f"AITER_CONFIG_FMOE={csv}"]))
    assert data["configs"]["origin"] == "env"
    assert any("AITER_CONFIG_FMOE replaces the default set" in f["message"] for f in data["findings"])


def test_run_cli_renders_a_table_unless_json_is_asked():
    """aiter-configs: --format table (also when the namespace has no format) prints the table, json the JSON."""
    table = _run(aiter_version="head", format="table")
    assert table.startswith("tuned set  bundled index: AITER main @ e4048607")
    args = _args(aiter_version="head")
    del args.format
    out = []
    aiter_lint.run_cli(args, out.append)
    assert out == [table]
