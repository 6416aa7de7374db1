"""Pinning a kernel AITER would pick wrong (issue 23 item 3; moedispatch/aiter/pin.py, moedispatch/plan/pinning.py).

Motivating case: ROCm/aiter#3933 — DeepSeek-V4 a8w4 (7168 × 512, 384 experts, top-6) bucket 4's tuned stage-1 kernel
is the wrong ``_xcd4`` one; the issue's fix is to point bucket 4 at the kernel the neighbouring buckets use, in a copy
of the FULL tuned set. The peer test (tests/peers/test_aiter_pin.py) runs AITER's own merge and lookup on the file.
"""

from __future__ import annotations

import json

import pytest

from moedispatch.aiter import dispatch as ad
from moedispatch.aiter import issues as aiter_issues
from moedispatch.aiter.issues import dispatch_issues
from moedispatch.aiter import pin
from moedispatch.core.errors import UsageError
from moedispatch.data import aiter_configs as cfg
from moedispatch.testing import fake_capabilities, layer

A20 = "0.1.20.post1"
TOKENS = (1, 2, 4, 8, 16)
ENV = {"AITER_BF16_FP8_MOE_BOUND": "0"}


def _dsv4_512():
    return layer(hidden_size=7168, intermediate_size=3072, num_experts=384, top_k=6, tp_size=6, weight_quant="mxfp4",
                 activation_quant="fp8", activation_granularity="group32", model_type="deepseek_v4")


@pytest.fixture(scope="module")
def case():
    caps = fake_capabilities("MI355X", A20)
    lay = _dsv4_512()
    dp = ad.plan_dispatch(lay, caps, tokens=TOKENS, env=ENV)
    return caps, lay, dp, pin.find_pins(lay, caps, dp, env=ENV)


def test_the_bad_bucket_is_pinned_to_its_nearest_clean_neighbour(case):
    _, _, dp, pins = case
    assert [(p.issue, p.bucket) for p in pins] == [("ROCm/aiter#3933", 4)]
    p = pins[0]
    assert "xcd4" in p.bad.kernel1 and "xcd4" not in p.good.kernel1
    assert p.good.token == 2                        # log2 distance 1 on both sides: the smaller bucket first
    assert pin._same_key(p.good, p.bad) and p.row().token == 4 and p.row().kernel1 == p.good.kernel1
    assert "bucket 4:" in p.describe() and "[ROCm/aiter#3933]" in p.describe()
    assert p.to_dict()["from_bucket"] == 2


def test_the_file_round_trips_through_moedispatchs_reading_of_aiter(case, tmp_path):
    caps, lay, dp, pins = case
    rows = cfg.config_set_for(caps, ENV).rows
    path = tmp_path / "pinned.csv"
    pin.write_pinned(str(path), rows, pins)
    text = path.read_text()
    assert text.splitlines()[0] == ",".join(pin.COLUMNS) and len(text.splitlines()) == len(rows) + 1
    again = ad.plan_dispatch(lay, caps, tokens=TOKENS, env={**ENV, "AITER_CONFIG_FMOE": str(path)})
    before = {s.tokens[0]: s.kernels for s in dp.steps}
    after = {s.tokens[0]: s.kernels for s in again.steps}
    assert after[4] == (pins[0].good.kernel1, pins[0].good.kernel2)
    assert {m: k for m, k in after.items() if m != 4} == {m: k for m, k in before.items() if m != 4}
    assert not [h for h in again.issues if h.issue == "ROCm/aiter#3933"]
    assert all(s.basis == "tuned" for s in again.steps)


def test_a_pin_needs_the_issue_to_name_one(case, monkeypatch):
    caps, lay, dp, _ = case
    from dataclasses import replace

    issues = tuple(replace(i, pin=None) for i in dispatch_issues())
    monkeypatch.setattr(aiter_issues, "dispatch_issues", lambda: issues)
    assert pin.find_pins(lay, caps, dp, env=ENV) == ()


def test_no_pin_where_no_clean_neighbour(case, monkeypatch):
    caps, lay, dp, _ = case
    monkeypatch.setattr(pin, "_neighbours", lambda rows, bad: [bad._replace(token=8)])  # the bad kernel again
    assert pin.find_pins(lay, caps, dp, env=ENV) == ()


def test_pin_data_is_checked():
    from moedispatch.core.errors import CapabilityDBError

    good = [i for i in dispatch_issues() if i.pin]
    assert [i.id for i in good] == ["ROCm/aiter#3933"]
    with pytest.raises(CapabilityDBError, match="pin must be"):
        _load_with({"pin": "any-row"})


def _load_with(extra):
    from moedispatch.data import capdb

    data = capdb.load_toml("dispatch_issues.toml")
    broken = {"issue": [dict(data["issue"][0], **extra)]}
    orig = capdb.load_toml
    dispatch_issues.cache_clear()
    try:
        capdb.load_toml = lambda name, *a, **k: broken if name == "dispatch_issues.toml" else orig(name, *a, **k)
        return dispatch_issues()
    finally:
        capdb.load_toml = orig
        dispatch_issues.cache_clear()


def test_an_existing_file_is_never_overwritten(tmp_path):
    path = tmp_path / "there.csv"
    path.write_text("mine\n")
    with pytest.raises(UsageError, match="never overwrites"):
        pin.write_pinned(str(path), [], [])
    assert path.read_text() == "mine\n"
    with pytest.raises(UsageError, match="no such directory"):
        pin.write_pinned(str(tmp_path / "nope" / "x.csv"), [], [])


def test_explain_pin_file_plans_and_recipes_under_the_file(cli, tmp_path):
    path = tmp_path / "pins.csv"
    args = ["explain", "--model", "DeepSeek-V4-Pro", "--target", "MI355X", "--tp", "8", "--aiter-version", "0.1.17",
            "--aiter-env", "AITER_BF16_FP8_MOE_BOUND=0", "--pin-file", str(path), "--format", "json"]
    proc = cli(*args)
    assert proc.returncode == 0, proc.stderr
    assert path.exists()
    data = json.loads(proc.stdout)
    assert any("pinned 1 tuned row(s)" in w for w in data["warnings"])
    moe = next(la for la in data["layers"] if la["kind"] == "moe")
    assert not any(r.get("issue") == "ROCm/aiter#3933" for r in moe["reason_details"])
    # nor the known issue's coarser token caveat: the dispatch issue decides it per row (known_issues.toml
    # aiter#3933 dispatch = ...), and the pinned row no longer hits it
    assert not any(r.get("issue") == "aiter#3933" for r in moe["reason_details"])
    assert not any("aiter#3933" in w for w in data["warnings"] if "pinned" not in w)
    step4 = next(s for s in moe["aiter_dispatch"] if s["tokens"][0] <= 4 <= s["tokens"][1])
    assert step4["config"].startswith(str(path)) and "xcd4" not in step4["kernels"][0]
    recipe = cli(*args[:-2] + ["--recipe", "sglang"])  # the file exists now: a second write is refused
    assert recipe.returncode == 2 and recipe.stderr.count("\n") == 1 and "never overwrites" in recipe.stderr
    path.unlink()
    recipe = cli(*args[:-2] + ["--recipe", "sglang"])
    assert recipe.returncode == 0, recipe.stderr
    assert f"export AITER_CONFIG_FMOE={path}" in recipe.stdout


def test_the_pinned_plan_costs_the_rows_aiter_reads_from_the_file(cli, tmp_path):
    """Under AITER_CONFIG_FMOE=FILE the costs read FILE's rows — not the release's _xcd4 row the pin replaced, whose
    kernel no longer runs (the cost read the release's rows whatever the env named) — and say whose µs they are. The
    pinned bucket-4 row carries its bucket-2 neighbour's µs: a timing copied across buckets, not a measurement at
    bucket 4, so bucket 4 is interpolated between FILE's clean rows (it was shown as a measured 'tuned' 24 µs)."""
    path = tmp_path / "pins.csv"
    proc = cli("explain", "--model", "DeepSeek-V4-Pro", "--target", "MI355X", "--tp", "8", "--aiter-version", "0.1.17",
               "--aiter-env", "AITER_BF16_FP8_MOE_BOUND=0", "--pin-file", str(path), "--tokens", "1,4", "--format",
               "json")
    assert proc.returncode == 0, proc.stderr
    moe = next(la for la in json.loads(proc.stdout)["layers"] if la["kind"] == "moe")
    steps = {s["tokens"][0]: s["config"] for s in moe["aiter_dispatch"]}
    costs = {c["tokens"]: c for c in moe["cost"]}
    assert steps[1].startswith(str(path)) and steps[4].startswith(str(path))
    assert costs[1]["detail"].startswith(f"tuned row {steps[1]};"), costs[1]["detail"]
    assert costs[4]["basis"] == "interpolated" and str(path) in costs[4]["detail"], costs[4]
    assert all(f"µs of AITER_CONFIG_FMOE={path}" in c["detail"] for c in costs.values())
    release_row = "dsv4_fp8fp4_tuned_fmoe.csv"
    assert not any(release_row in c["detail"] for c in costs.values())


def test_nothing_to_pin_is_one_line(cli, tmp_path):
    proc = cli("explain", "--model", "GLM-5.1-MXFP4", "--target", "MI355X", "--tp", "16", "--pin-file",
               str(tmp_path / "p.csv"))
    assert proc.returncode == 2 and "nothing to pin" in proc.stderr and proc.stderr.count("\n") == 1
    assert not (tmp_path / "p.csv").exists()
