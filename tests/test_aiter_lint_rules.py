"""The AITER tuned-CSV lint (moedispatch/aiter/lint.py, `moedispatch aiter-configs`) on hand-made sets derived from
the bundled HEAD rows: each check's severity, wording and source, found by the sampled mutation run (issue 21) to be
reached by no test."""

from __future__ import annotations

import os
from dataclasses import replace

import pytest

from moedispatch.aiter import lint as aiter_lint
from moedispatch.data import aiter_configs as ac


@pytest.fixture(scope="module")
def head():
    return ac.load_config_set("head")


def _set(head, rows, **kw):
    return replace(head, rows=tuple(rows), warnings=(), merge_error=None, **kw)


def _base(head):
    return next(r for r in head.rows if not r.tag and r.us and r.gfx == "gfx950" and r.token == 1)


def test_copied_timing_names_the_quant_type_by_its_short_name(head):
    r = _base(head)
    cs = _set(head, [r, r._replace(token=2, line=r.line + 1)])
    (f,) = [f for f in aiter_lint.lint(cs).findings if f.check == "copied-timing"]
    assert f.severity == "warning" and f" {r.q_type.split('.')[-1]} cu_num" in f.message and "QuantType" not in f.message


def test_malformed_files_are_errors_and_shifted_rows_warnings(head):
    r = _base(head)
    cs = replace(_set(head, [r._replace(defects=("q_type shifted",))]), warnings=("x.csv:3: 7 columns, 22 expected",))
    got = [(f.check, f.severity) for f in aiter_lint.lint(cs).findings if f.check == "malformed"]
    assert got == [("malformed", "error"), ("malformed", "warning")]


def test_findings_are_ordered_errors_warnings_then_info(head):
    r = _base(head)
    cs = replace(_set(head, [r, r._replace(token=2, line=r.line + 1)]), warnings=("x.csv:3: bad",))
    sev = [f.severity for f in aiter_lint.lint(cs).findings]
    assert sev == sorted(sev, key=("error", "warning", "info").index) and {"error", "warning", "info"} <= set(sev)


def test_a_token_no_bucket_produces_is_never_looked_up(head):
    r = _base(head)
    (f,) = [f for f in aiter_lint.lint(_set(head, [r, r._replace(token=24, line=r.line + 1)])).findings
            if f.check == "shadowed"]
    assert f.severity == "warning" and "(24)" in f.message and f.source == ac.SOURCE_LOOKUP
    # 16384 is a HEAD bucket (1 << 14); the legacy dispatch's buckets stop at 1024 plus get_padded_M's own
    assert not [f for f in aiter_lint.lint(_set(head, [r._replace(token=16384)])).findings if f.check == "shadowed"]
    legacy = _set(head, [r._replace(token=2048), r._replace(token=2, line=r.line + 1)], dispatch="legacy")
    assert any(f.check == "shadowed" and "never looked up" in f.message for f in aiter_lint.lint(legacy).findings)


def test_rows_differing_only_in_act_type_shadow_each_other_per_gfx_at_head(head):
    r = _base(head)
    other = "ActivationType.Gelu" if r.act_type != "ActivationType.Gelu" else "ActivationType.Silu"
    cs = _set(head, [r, r._replace(act_type=other, line=r.line + 1)])
    (f,) = [f for f in aiter_lint.lint(cs).findings if f.check == "shadowed" and "act_type" in f.message]
    assert f"({other.split('.')[-1]}) behind" in f.message and "ActivationType." not in f.message
    assert f.confidence == "derived"
    # the same shape on another gfx is another lookup key at HEAD: nothing shadowed
    cs2 = _set(head, [r, r._replace(act_type=other, gfx="gfx942", cu_num=304, line=r.line + 1)])
    assert not [f for f in aiter_lint.lint(cs2).findings if f.check == "shadowed" and "act_type" in f.message]


def test_an_override_says_what_of_the_default_set_it_replaces(head):
    r = _base(head)
    cs = _set(head, [r], origin="env")
    (f,) = [f for f in aiter_lint.lint(cs, {"AITER_CONFIG_FMOE": "/x.csv"}).findings
            if f.check == "shadowed" and "replaces the default set" in f.message]
    assert f.source == "https://github.com/sgl-project/sglang/pull/37072" and "are overridden by rows" in f.message
    assert not [f for f in aiter_lint.lint(cs, {}).findings if "replaces the default set" in f.message]


# -- a newcomer's review: rows no key matches, untimed rows, a BOM, --strict -------------------------------------

def test_rows_no_layer_key_can_match_are_named(head):
    """A q_type AITER's enum lacks (csrc/include/aiter_enum.h), topk > expert, and us <= 0 gave no finding."""
    r = _base(head)
    rows = [r._replace(q_type="QuantType.per_Tokn", line=900), r._replace(topk=r.expert + 1, line=901),
            r._replace(us=-5.0, line=902), r._replace(act_type="ActivationType.Silu2", line=903)]
    found = [f for f in aiter_lint.lint(_set(head, rows)).findings if f.check == "unmatchable"]
    text = " | ".join(f.message for f in found)
    assert "q_type 'QuantType.per_Tokn' (did you mean 'QuantType.per_Token'?)" in text
    assert "act_type 'ActivationType.Silu2'" in text
    assert f"topk {r.expert + 1} > expert {r.expert}" in text and "us=-5.0" in text
    assert [f.severity for f in found].count("info") == 1   # untimed rows are looked up as usual: info
    assert not [f for f in aiter_lint.lint(_set(head, [r])).findings if f.check == "unmatchable"]


def _write_set(tmp_path, lines, *, bom=False):
    header = open(os.path.join(os.environ.get("MOEDISPATCH_AITER_DATA", "../shared/aiter"),
                               "v0.1.20.post1/aiter/configs/tuned_fmoe.csv"), encoding="utf-8").read().splitlines()
    d = tmp_path / "cfg"
    d.mkdir()
    (d / "tuned_fmoe.csv").write_text("\n".join(header[:1] + [header[i] for i in lines]) + "\n",
                                      encoding="utf-8-sig" if bom else "utf-8")
    return str(d)


@pytest.mark.skipif(not os.path.isdir(os.environ.get("MOEDISPATCH_AITER_DATA", "../shared/aiter")),
                    reason="needs ../shared/aiter")
def test_a_byte_order_mark_is_not_a_broken_header(tmp_path):
    """pandas (AITER's reader) drops a UTF-8 BOM; the lint said 'header lacks column(s) cu_num' and explain dropped
    the file silently."""
    cs = ac.load_config_set(_write_set(tmp_path, [1, 2, 3], bom=True))
    assert len(cs.rows) == 3 and not cs.warnings


@pytest.mark.skipif(not os.path.isdir(os.environ.get("MOEDISPATCH_AITER_DATA", "../shared/aiter")),
                    reason="needs ../shared/aiter")
def test_strict_exits_3_on_an_error_finding(tmp_path):
    """`aiter-configs --strict` gates a CI step: exit 3 when a finding is an error (a row with more fields than the
    header: pandas cannot read the file); without --strict the report is the output (exit 0)."""
    import argparse

    folder = _write_set(tmp_path, [1, 2])
    with open(os.path.join(folder, "tuned_fmoe.csv"), "a", encoding="utf-8") as fh:
        fh.write("gfx950,256,1,extra" + ",x" * 40 + "\n")
    out: list[str] = []
    args = argparse.Namespace(configs=folder, aiter_version=None, aiter_env=[], format="json", strict=False)
    assert aiter_lint.run_cli(args, out.append) == 0
    assert aiter_lint.run_cli(argparse.Namespace(**{**vars(args), "strict": True}), out.append) == 3


@pytest.mark.skipif(not os.path.isdir(os.environ.get("MOEDISPATCH_AITER_DATA", "../shared/aiter")),
                    reason="needs ../shared/aiter")
def test_what_makes_aiter_raise_is_an_error(tmp_path):
    """A key repeated across merged files: AITER raises RuntimeError at the first fused_moe call and rewrites the CSVs
    (ROCm/aiter@e4048607:aiter/jit/core.py update_config_files) — an error, not a 'shadowed' warning. An
    AITER_CONFIG_FMOE naming no existing file: AITER raises FileNotFoundError (it was 'AITER skips it')."""
    folder = _write_set(tmp_path, [1, 2])
    os.mkdir(os.path.join(folder, "model_configs"))
    lines = open(os.path.join(folder, "tuned_fmoe.csv"), encoding="utf-8").read().splitlines()
    with open(os.path.join(folder, "model_configs", "x_tuned_fmoe.csv"), "w", encoding="utf-8") as fh:
        fh.write("\n".join([lines[0], lines[1]]) + "\n")
    found = aiter_lint.lint(ac.load_config_set(folder)).findings
    assert [f.severity for f in found if "duplicate shape entries" in f.message] == ["error"]
    missing = ac.load_config_set(None, env={"AITER_CONFIG_FMOE": str(tmp_path / "nope.csv")}, version="0.1.20.post1")
    (err,) = [f for f in aiter_lint.lint(missing).findings if "FileNotFoundError" in f.message]
    assert err.severity == "error" and "nope.csv" in err.message


@pytest.mark.skipif(not os.path.isdir(os.environ.get("MOEDISPATCH_AITER_DATA", "../shared/aiter")),
                    reason="needs ../shared/aiter")
def test_an_override_with_a_configs_folder_is_compared_with_that_folder(tmp_path):
    """`aiter-configs --configs DIR --aiter-env AITER_CONFIG_FMOE=F`: AITER reads F instead of DIR's set; the report
    says DIR is not read and compares F with DIR (it compared with the installed AITER, silently)."""
    import argparse
    import json

    folder = _write_set(tmp_path, [1, 2, 3])
    (tmp_path / "o").mkdir()
    override = _write_set(tmp_path / "o", [1])
    out: list[str] = []
    aiter_lint.run_cli(argparse.Namespace(configs=folder, aiter_version=None, format="json", strict=False,
                                          aiter_env=[f"AITER_CONFIG_FMOE={override}/tuned_fmoe.csv"]), out.append)
    doc = json.loads(out[0])
    assert any(f"--configs {folder} is not read" in n for n in doc["configs"]["notes"])
    (f,) = [f for f in doc["findings"] if "replaces the default set" in f["message"]]
    assert f"(tuned CSVs in {folder})" in f["message"] and "2 of its 3 rows are no longer looked up" in f["message"]


@pytest.mark.skipif(not os.path.isdir(os.environ.get("MOEDISPATCH_AITER_DATA", "../shared/aiter")),
                    reason="needs ../shared/aiter")
def test_aiter_merges_whenever_two_paths_are_listed_even_if_one_is_missing(tmp_path):
    """update_config_files returns a single listed path as is, and merges — de-duplicating, within one file too —
    whenever more are listed, missing ones included (ROCm/aiter@e4048607:aiter/jit/core.py lines 267-269; the
    peer run tests/peers/test_aiter_merge.py found it): a key twice in the only existing file of
    ``A:missing`` makes AITER raise; the same file alone does not."""
    folder = _write_set(tmp_path, [1])
    path = os.path.join(folder, "tuned_fmoe.csv")
    lines = open(path, encoding="utf-8").read().splitlines()
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(lines[1] + "\n")
    alone = ac.load_config_set(None, env={"AITER_CONFIG_FMOE": path}, version="0.1.20.post1")
    beside = ac.load_config_set(None, env={"AITER_CONFIG_FMOE": path + os.pathsep + str(tmp_path / "nope.csv")},
                                version="0.1.20.post1")
    assert alone.merge_error is None
    assert beside.merge_error and beside.merge_error.startswith("AITER raises 'Found 1 duplicate shape entries")


@pytest.mark.skipif(not os.path.isdir(os.environ.get("MOEDISPATCH_AITER_DATA", "../shared/aiter")),
                    reason="needs ../shared/aiter")
def test_before_v0_1_12_aiter_merges_repeated_keys_silently_and_needs_the_first_file(tmp_path):
    """Up to v0.1.11.post1 update_config_files kept the fastest of repeated keys without raising and read the first
    listed path unconditionally; from v0.1.12 it raises on repeats and skips missing files
    (ROCm/aiter@v0.1.11.post1 vs @v0.1.12:aiter/jit/core.py; peer-run in tests/peers/test_aiter_merge.py). Every
    plan for v0.1.10–v0.1.11.post1 said "AITER raises … duplicate shape entries" of AITER's own bundled set."""
    bundled = ac.load_config_set(None, version="0.1.10")
    assert bundled.merge_error and not bundled.merge_error.startswith("AITER raises")
    assert "rows dropped" in bundled.merge_error
    assert not [f for f in aiter_lint.lint(bundled).findings if f.severity == "error" and f.check == "shadowed"]
    folder = _write_set(tmp_path, [1, 2])
    path = os.path.join(folder, "tuned_fmoe.csv")
    twice = path + os.pathsep + path
    old = ac.load_config_set(None, env={"AITER_CONFIG_FMOE": twice}, version="0.1.11.post1")
    new = ac.load_config_set(None, env={"AITER_CONFIG_FMOE": twice}, version="0.1.12")
    assert "rows dropped" in old.merge_error and new.merge_error.startswith("AITER raises 'Found")
    first_missing = str(tmp_path / "nope.csv") + os.pathsep + path
    old = ac.load_config_set(None, env={"AITER_CONFIG_FMOE": first_missing}, version="0.1.11.post1")
    new = ac.load_config_set(None, env={"AITER_CONFIG_FMOE": first_missing}, version="0.1.12")
    assert old.merge_error.startswith("AITER raises FileNotFoundError") and new.merge_error is None
