"""The decision fingerprint (issue 25 item 1, issue 27 major 1): what must agree across ranks, whatever the naming.

The plan fingerprint hashes the whole plan as shown (how the target was named, the token counts planned, reason
wording); the decision fingerprint hashes only what ranks must agree on — so it is computable offline for an expected
target and equal on every rank that will run the same kernels.
"""

from __future__ import annotations

import json

import pytest

MODEL = ("--model", "MiniMax-M3-MXFP4", "--aiter-version", "0.1.20.post1", "--format", "json")


def _doc(cli, *args, env=None):
    out = cli("explain", *MODEL, *args, env=env)
    assert out.returncode in (0, 3), out.stderr
    return json.loads(out.stdout)


def test_same_decisions_same_fingerprint_whatever_the_naming_and_tokens(cli):
    """--target MI355X, --target gfx950, MOEDISPATCH_TARGET and the no-GPU default plan the same: one decision
    fingerprint (the plan fingerprint, which hashes the naming and the token counts, differs)."""
    docs = [_doc(cli, "--target", "MI355X"), _doc(cli, "--target", "gfx950"),
            _doc(cli, env={"MOEDISPATCH_TARGET": "MI355X"}), _doc(cli),
            _doc(cli, "--target", "MI355X", "--tokens", "1,2,3")]
    assert {d["target"]["source"] for d in docs} >= {"flag", "env", "default"}
    assert len({d["decision_fingerprint"] for d in docs}) == 1
    assert len({d["fingerprint"] for d in docs}) > 1


@pytest.mark.parametrize("change", [("--tp", "8"), ("--target", "MI300X"), ("--aiter-env", "AITER_KSPLIT=-1"),
                                    ("--aiter-env", "GPTOSS_SWIGLU_MXFP4_BF16_BOUND=0")])
def test_a_different_decision_or_env_changes_it(cli, change):
    base = _doc(cli, "--target", "MI355X")
    other = _doc(cli, *(change if change[0] == "--target" else ("--target", "MI355X", *change)))
    assert other["decision_fingerprint"] != base["decision_fingerprint"]


def test_another_aiter_release_changes_it(cli):
    a = _doc(cli, "--target", "MI355X")
    out = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X", "--aiter-version", "0.1.18",
              "--format", "json")
    assert json.loads(out.stdout)["decision_fingerprint"] != a["decision_fingerprint"]


def test_table_shows_both(cli):
    out = cli("explain", "--model", "MiniMax-M3-MXFP4", "--target", "MI355X")
    layout = next(line for line in out.stdout.splitlines() if line.startswith("layout"))
    assert "plan fingerprint" in layout and "decision fingerprint" in layout


def test_a_variable_the_dispatch_model_does_not_read_leaves_it_and_a_typo_is_named(cli):
    """AITER_LOG_MORE=1 in one rank's shell, or a mistyped --aiter-env key, changed the decision fingerprint (a
    correct multi-rank launch then "plans differently"; newcomer review) and the typo was planned silently. Now only
    the variables the dispatch model reads (core.workload.AITER_ENV) enter it; the others are still shown, and an
    --aiter-env key outside AITER_ENV is a warning with the closest name."""
    base = _doc(cli, "--target", "MI355X")
    logged = _doc(cli, "--target", "MI355X", env={"AITER_LOG_MORE": "1"})
    typo = _doc(cli, "--target", "MI355X", "--aiter-env", "AITER_BYPAS_TUNE_CONFIG=1")
    assert base["decision_fingerprint"] == logged["decision_fingerprint"] == typo["decision_fingerprint"]
    assert logged["aiter_env"] == {"AITER_LOG_MORE": "1"}
    assert any("--aiter-env AITER_BYPAS_TUNE_CONFIG: not a variable" in w and "'AITER_BYPASS_TUNE_CONFIG'" in w
               for w in typo["warnings"])
    real = _doc(cli, "--target", "MI355X", "--aiter-env", "AITER_BYPASS_TUNE_CONFIG=1")
    assert real["decision_fingerprint"] != base["decision_fingerprint"]
    assert not [w for w in real["warnings"] if "--aiter-env" in w]
