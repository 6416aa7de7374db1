"""``moedispatch compare``: one model under several variants, side by side per layer group, with why they differ."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest

from moedispatch.render.compare import Variant, parse_variants
from moedispatch.core.errors import UsageError


SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "docs" / "schemas" / "compare.schema.json").read_text())


def _json(cli, *args, env=None):
    """Run compare --format json; every document it prints is valid against docs/schemas/compare.schema.json."""
    proc = cli("compare", *args, "--format", "json", env=env)
    doc = json.loads(proc.stdout) if proc.stdout.strip() else None
    if doc is not None:
        jsonschema.validate(doc, SCHEMA)
    return proc, doc


def test_parse_variants_is_the_product_of_the_lists_and_names_the_varying_axes():
    variants, axes = parse_variants(target="MI300X,MI355X", tp="4,8")
    assert axes == ["target", "tp"]
    assert variants == [Variant("MI300X", None, 4, 1), Variant("MI300X", None, 8, 1),
                        Variant("MI355X", None, 4, 1), Variant("MI355X", None, 8, 1)]
    assert parse_variants(aiter_version="0.1.10,none", target="gfx950")[0] == [
        Variant("gfx950", "0.1.10", 1, 1), Variant("gfx950", "none", 1, 1)]


@pytest.mark.parametrize("kwargs, message", [
    ({"target": "MI355X"}, "compare needs at least two variants"),
    ({}, "compare needs at least two variants"),
    ({"tp": "4,x"}, "--tp takes comma-separated positive integers, got 'x'"),
    ({"ep": "0,8"}, "--ep takes comma-separated positive integers, got 0"),
    ({"target": "MI300X,,MI355X"}, "--target takes a comma-separated list without empty items"),
    ({"tp": "8,8"}, "--tp lists a value twice"),
    ({"target": "a,b,c", "tp": "1,2,4,8,16"}, "compare takes at most 12 variants; --target 3 × --tp 5 = 15"),
])
def test_bad_variant_lists_are_one_line_usage_errors(kwargs, message):
    with pytest.raises(UsageError) as err:
        parse_variants(**kwargs)
    assert str(err.value).startswith(message)


def test_mi300x_or_mi355x_differs_in_backend_with_the_reasons_by_kind(cli):
    proc, doc = _json(cli, "--model", "MiniMax-M3-MXFP4", "--target", "MI300X,MI355X", "--tp", "8")
    assert proc.returncode == 0, proc.stderr
    assert doc["schema"] == "moedispatch.compare/1"
    assert doc["axes"] == ["target"]
    assert [(v["target"], v["product"], v["tp"], v["ep"]) for v in doc["variants"]] == [
        ("gfx942", "MI300X", 8, 1), ("gfx950", "MI355X", 8, 1)]
    assert all(len(v["fingerprint"]) == 16 for v in doc["variants"])
    assert [g["layers"] for g in doc["groups"]] == [[0, 1, 2], list(range(3, 60))]
    dense, moe = doc["groups"]
    assert dense["differs"] is False and dense["why"] == [] and [d["backend"] for d in dense["decisions"]] == [None,
                                                                                                           None]
    assert moe["differs"] is True and moe["differs_in"] == ["backend", "padding"]
    assert [d["backend"] for d in moe["decisions"]] == ["emulation", "aiter-flydsl"]
    assert moe["decisions"][1]["padding"]["intermediate_per_rank"] == 512
    why = moe["why"]
    # Each variant's decision reason, and the failed reason of the backend the other variant chose.
    assert why[0] == "gfx942 (MI300X): emulation: the only backend that is correct for this layer"
    assert why[1].startswith("gfx942 (MI300X): not aiter-flydsl: needs gfx950 for weights mxfp4 × activations mxfp4")
    assert any(w.startswith("gfx950 (MI355X): aiter-flydsl: correct for this layer") for w in why)
    assert any(w.startswith("gfx950 (MI355X): not emulation: supported, ") for w in why)


def test_the_same_decision_everywhere_is_one_group_that_does_not_differ(cli):
    proc, doc = _json(cli, "--model", "Mixtral-8x7B", "--target", "MI300X,MI325X", "--tp", "8")
    assert proc.returncode == 0, proc.stderr
    (group,) = doc["groups"]
    assert group["layers"] == list(range(32))
    assert [d["backend"] for d in group["decisions"]] == ["aiter-ck", "aiter-ck"]
    assert group["differs"] is False and group["why"] == []


def test_tp4_or_tp8_differs_in_padding_and_says_why_with_padding_reasons(cli):
    proc, doc = _json(cli, "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "4,8")
    assert proc.returncode == 0, proc.stderr
    moe = doc["groups"][1]
    assert moe["differs_in"] == ["padding"]
    assert [d["padding"]["intermediate_per_rank"] for d in moe["decisions"]] == [768, 512]
    assert moe["why"] and all(w.startswith("TP8: padding: ") for w in moe["why"])


def test_tp_or_ep_that_pads_in_neither_variant_does_not_differ_in_padding(cli):
    """Neither TP4 nor TP8 pads Qwen3-235B on MI300X: only the per-rank sizes differ, which is the layout, not a
    padding; the group differs in what AITER runs (block_m 64 vs 32 at 512 tokens), and compare must say that."""
    proc, doc = _json(cli, "--model", "Qwen3-235B-A22B", "--target", "MI300X", "--tp", "4,8", "--aiter-version",
                      "0.1.18")
    assert proc.returncode == 0, proc.stderr
    (moe,) = doc["groups"]
    assert [d["padding"]["intermediate_per_rank"] for d in moe["decisions"]] == [384, 192]
    assert moe["differs_in"] == ["dispatch"]
    table = cli("compare", "--model", "Qwen3-235B-A22B", "--target", "MI300X", "--tp", "4,8", "--aiter-version",
                "0.1.18").stdout
    assert "(94 MoE): DIFFERS in dispatch\n" in table and "DIFFERS in padding" not in table


def test_dispatch_and_cost_come_from_the_plan_entries_when_present(cli):
    """compare computes no prediction: it carries the plan's own per-layer aiter_dispatch/cost entries."""
    proc, doc = _json(cli, "--model", "gpt-oss-120b", "--target", "MI355X", "--aiter-version", "0.1.10,0.1.15.post3",
                      "--tokens", "1,512")
    assert proc.returncode == 0, proc.stderr
    explain = json.loads(cli("explain", "--model", "gpt-oss-120b", "--target", "MI355X", "--aiter-version",
                             "0.1.15.post3", "--tokens", "1,512", "--format", "json").stdout)
    layer = explain["layers"][0]
    new = doc["groups"][0]["decisions"][1]
    assert new["backend"] == layer["backend"]
    for key in ("aiter_dispatch", "cost"):
        if key in layer:
            assert new[key] == layer[key]
    if "cost_total" in explain:
        assert doc["variants"][1]["cost_total"] == explain["cost_total"]
    assert doc["groups"][0]["differs"] is True


def test_a_variant_with_no_backend_exits_3_and_still_prints_everything(cli):
    env = {"MOEDISPATCH_LOAD_PLUGINS": "aiter-flydsl"}
    proc, doc = _json(cli, "--model", "MiniMax-M3-MXFP4", "--target", "MI300X,MI355X", "--tp", "8", env=env)
    assert proc.returncode == 3
    assert [v["ok"] for v in doc["variants"]] == [False, True]
    moe = doc["groups"][1]
    assert [d["backend"] for d in moe["decisions"]] == [None, "aiter-flydsl"]
    assert moe["why"][0] == "gfx942 (MI300X): no correct backend"
    assert proc.stderr.startswith("moedispatch: gfx942 (MI300X): 57 MoE layer(s) have no correct backend; layer 3:")
    table = cli("compare", "--model", "MiniMax-M3-MXFP4", "--target", "MI300X,MI355X", "--tp", "8", env=env)
    assert table.returncode == 3
    assert "NO BACKEND" in table.stdout and "A gfx942 (MI300X): 57 MoE layer(s) have no correct backend" in table.stdout


def test_table_shows_variants_groups_and_summary(cli):
    proc = cli("compare", "--model", "Llama-4-Maverick-17B-128E-Instruct-FP8", "--target", "MI300X,MI355X")
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("model   Llama-4-Maverick-17B-128E-Instruct-FP8 (builtin")
    assert "  A  gfx942 (MI300X)" in out and "  B  gfx950 (MI355X)" in out
    # Alternating dense and MoE layers group across non-adjacent layers.
    assert "layers 0,2,…,46 (24 dense) → dense MLP in every variant" in out
    assert "layers 1,3,…,47 (24 MoE): " in out
    assert "summary " in out and " of 24 MoE layers differ between the variants" in out


@pytest.mark.parametrize("args, message", [
    (("--model", "Mixtral-8x7B", "--target", "MI300X"), "compare needs at least two variants"),
    (("--model", "Mixtral-8x7B", "--target", "MI300X,MI999X"), "MI999X"),
    (("--model", "no-such-model", "--tp", "1,2"), "no-such-model"),
    (("--model", "Mixtral-8x7B", "--tp", "4,four"), "--tp takes comma-separated positive integers"),
])
def test_bad_input_exits_2_with_one_line(cli, args, message):
    proc = cli("compare", *args)
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_table_why_cites_sources_by_number_listed_once_at_the_end(cli):
    proc = cli("compare", "--model", "MiniMax-M3-MXFP4", "--target", "MI300X,MI355X", "--tp", "8")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    why = next(n for n, line in enumerate(lines) if line.startswith("    why gfx942 (MI300X): emulation"))
    assert "not aiter-flydsl: needs gfx950" in lines[why + 1]
    assert any("[1]" in line for line in lines[why + 1:why + 4])
    assert sum(1 for line in lines if line.startswith("[1]     ROCm/aiter@")) == 1


def test_the_readmes_compare_example_costs_are_what_compare_prints(cli):
    """README's `compare --model MiniMax-M3-MXFP4 --target MI300X,MI355X --tp 8` example shows the cost lines compare
    prints (a stale copy showed 1 and 4 tokens at the same 654 µs, from the fastest-row floor the model dropped)."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = readme.split("$ moedispatch compare --model MiniMax-M3-MXFP4 --target MI300X,MI355X --tp 8\n", 1)[1]
    block = block.split("```", 1)[0]

    def costs(text):
        return [line.split("cost", 1)[1].strip() for line in text.splitlines() if line.strip().startswith("cost ")]

    proc = cli("compare", "--model", "MiniMax-M3-MXFP4", "--target", "MI300X,MI355X", "--tp", "8")
    assert proc.returncode == 0, proc.stderr
    assert len(costs(block)) == 2 and costs(block) == costs(proc.stdout)


def test_compare_text_gives_each_cost_its_bars_in_the_point_s_unit():
    """compare's text printed bare µs ("1,927 vs 1,987 µs" read as a difference with bars that overlap); each cost now
    carries its [low, high] as explain's does, in the unit of its point (ms bars beside an ms point)."""
    from moedispatch.render.compare import _costs

    line = _costs([{"tokens": 1, "us": 34.2, "low": 25.7, "high": 61.3},
                   {"tokens": 8192, "us": 15400.0, "low": 5847.0, "high": 51012.0},
                   {"tokens": 2, "us": 5.25, "low": 4.01, "high": 7.5}])
    assert line == "1 tok 34 µs (26–61) · 8192 tok 15.4 ms (5.8–51.0) · 2 tok 5.2 µs (4.0–7.5)"


def test_a_split_k_of_minus_one_is_no_difference_in_what_runs(cli):
    """AITER 0.1.16+ hands the FlyDSL heuristic split_k = -1 where 0.1.15 handed 0; every reader tests > 0 / > 1,
    so both run alike: compare said "57 of 57 MoE layers differ" in dispatch and showed two identical lines."""
    from moedispatch.render.compare import _runs

    step = {"tokens": [512, 512], "stages": 2, "family": "flydsl", "kernels": ["k1", "k2"], "block_m": 32,
            "basis": "heuristic"}
    assert _runs([dict(step, ksplit=-1)]) == _runs([dict(step, ksplit=0)]) == _runs([step])
    assert _runs([dict(step, ksplit=2)]) != _runs([dict(step, ksplit=0)])
    proc = cli("compare", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--tp", "8", "--aiter-version",
               "0.1.15.post3,0.1.20.post1")
    assert proc.returncode == 0, proc.stderr
    assert "summary 0 of 57 MoE layers differ" in proc.stdout and "DIFFERS in dispatch" not in proc.stdout
