"""Roles (issue 25 item 2): ``explain --role NAME:tp=…,ep=…,dp=…,tokens=LO-HI`` plans each role for its own token range.

Motivating case: MiniMax-M3-MXFP4 TP8 on MI355X (AITER 0.1.20.post1). Decode (1–512 tokens) meets CK-Tile heuristics
at 384/rank below 256 tokens (ROCm/aiter#5233: wrong output), so its allocation is 512; prefill (1k–16k) runs FlyDSL
kernels whose tiles divide 384 at every bucket it serves, so it runs unpadded — the roles differ, and say why.
"""

from __future__ import annotations

import json

import pytest

from moedispatch.core.errors import UsageError
from moedispatch.core.workload import Runtime
from moedispatch.plan.roles import Role, parse_role, plan_roles, role_differences, roles_to_json
from moedispatch.sources.models import load_model
from moedispatch.testing import fake_capabilities

A20 = "0.1.20.post1"
DECODE, PREFILL = "decode:tp=8,tokens=1-512", "prefill:tp=8,tokens=1024-16384"


@pytest.fixture(scope="module")
def minimax():
    roles = [parse_role(DECODE), parse_role(PREFILL)]
    return plan_roles(load_model("MiniMax-M3-MXFP4"), fake_capabilities("MI355X", A20), roles, env={})


def _moe(plan):
    return next(d for d in plan.decisions if d.layer.kind == "moe")


def test_parse_role():
    assert parse_role("decode:tp=8,tokens=1-512") == Role("decode", 8, 1, 1, 1, 512)
    assert parse_role("p:tokens=4096,ep=8,dp=2") == Role("p", 1, 8, 2, 4096, 4096)


@pytest.mark.parametrize("text, message", [
    ("decode", "expected NAME:"), (":tp=8,tokens=1-2", "expected NAME:"), ("d:tp=8", "tokens=LO-HI is required"),
    ("d:tp=x,tokens=1-2", "tp='x' is not an integer"), ("d:tp=0,tokens=1-2", "outside 1–1024"),
    ("d:tokens=5-2", "increasing range"), ("d:tokens=a-b", "not LO-HI"), ("d:pp=2,tokens=1-2", "is not one of"),
    ("d:tp=2,tp=4,tokens=1-2", "given twice"), ("d:tokens=1-99999999", "beyond any engine's batch"),
])
def test_bad_roles_are_one_line_errors(text, message):
    with pytest.raises(UsageError, match=message.replace("(", r"\(")):
        parse_role(text)


def test_decode_and_prefill_get_their_own_allocation_and_say_why(minimax):
    (dec_role, dec), (pre_role, pre) = minimax
    d, p = _moe(dec), _moe(pre)
    assert d.padding.intermediate_per_rank == 512 and p.padding.intermediate_per_rank == 384
    assert {s.family for s in d.dispatch.steps} >= {"cktile"} and {s.family for s in p.dispatch.steps} == {"flydsl"}
    assert max(s.tokens[1] for s in d.dispatch.steps) == 512 and min(s.tokens[0] for s in p.dispatch.steps) == 1024
    diff = role_differences(minimax)
    assert diff[0].startswith("layers 3–59: allocation hidden × intermediate/rank differ — decode: 6144 × 512; "
                              "prefill: 6144 × 384")
    assert any("ROCm/aiter#5233" in line and line.strip().startswith("decode:") for line in diff)
    assert dec.decision_fingerprint != pre.decision_fingerprint


def test_a_role_serves_only_its_range():
    assert Runtime.build((1, 512), env={}, serving=(1, 512)).serving_buckets()[-1] == 512
    assert Runtime.build((1, 512), env={}).serving_buckets()[-1] == 8192
    assert Runtime.build((4096,), env={}, serving=(4096, 16384)).serving_buckets() == (4096, 8192)


def test_roles_that_agree_say_so():
    roles = [parse_role("a:tp=8,tokens=1024-8192"), parse_role("b:tp=8,tokens=2048-8192")]
    plans = plan_roles(load_model("MiniMax-M3-MXFP4"), fake_capabilities("MI355X", A20), roles, env={})
    assert role_differences(plans) == []


def test_the_json_document(minimax):
    doc = json.loads(json.dumps(roles_to_json(minimax)))
    assert doc["schema"] == "moedispatch.roles/1" and [r["name"] for r in doc["roles"]] == ["decode", "prefill"]
    assert doc["roles"][0]["groups"][0]["allocation"] == [6144, 512] and doc["differences"]
    assert doc["roles"][1]["plan"]["schema"].startswith("moedispatch.")


def test_explain_roles_cli(cli):
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--aiter-version", A20,
               "--role", DECODE, "--role", PREFILL)
    assert proc.returncode == 0, proc.stderr
    assert "role    decode: tp=8 ep=1 dp=1, tokens 1–512" in proc.stdout and "roles   differ:" in proc.stdout
    assert "AITER runs for layers 3–59: cktile 1–128, flydsl 256–512" in proc.stdout
    js = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--aiter-version", A20,
             "--role", DECODE, "--role", PREFILL, "--format", "json")
    assert json.loads(js.stdout)["schema"] == "moedispatch.roles/1"
    # Where AITER runs nothing (an AITER older than every modelled release: emulation), no empty "AITER runs" line.
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--aiter-version", "0.1.7.post2.dev18",
               "--role", DECODE, "--role", PREFILL)
    assert proc.returncode == 0 and "emulation" in proc.stdout and "AITER runs for layers" not in proc.stdout


@pytest.mark.parametrize("extra, message", [
    (["--tp", "4"], "does not combine with --tp"), (["--recipe", "vllm"], "does not combine with --recipe"),
    (["--role", "decode:tp=2,tokens=1-4"], "decode given twice"),
])
def test_explain_roles_bad_combinations(cli, extra, message):
    proc = cli("explain", "--model", "MiniMax-M3-MXFP4", "--role", DECODE, *extra)
    assert proc.returncode == 2 and message in proc.stderr and proc.stderr.count("\n") == 1
