"""A pinned tuned set (moedispatch/aiter/pin.py, ``explain --pin-file``) through AITER's REAL merge and lookup.

ROCm/aiter#3933: at HEAD the DeepSeek-V4 a8w4 bucket-4 tuned row (7168 × 512, 384 experts, top-6) names the wrong
``_xcd4`` stage-1 kernel; moedispatch writes the whole merged set with that row pinned to the bucket-2 row's kernels.
AITER's own ``aiter/fused_moe.py`` at e4048607 (run on this CPU with stand-ins for its compiled parts, as in
test_aiter_peers.py) is given ``AITER_CONFIG_FMOE=<that file>`` and must launch exactly the pinned kernels at
bucket 4 — and the same kernels as without the pin at the other buckets. Skipped without .aiter-peer-venv.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent / "aiter"
sys.path.insert(0, str(HERE))

import harness  # noqa: E402
import model_side  # noqa: E402

from moedispatch.aiter import dispatch as ad  # noqa: E402
from moedispatch.aiter import pin  # noqa: E402
from moedispatch.aiter.key import Assumptions  # noqa: E402
from moedispatch.data import aiter_configs as cfg  # noqa: E402
from moedispatch.testing import fake_capabilities  # noqa: E402

from test_pin import ENV, TOKENS, _dsv4_512 as _layer  # noqa: E402 - the motivating layer, defined once


@pytest.fixture(scope="module")
def aiter_answers(tmp_path_factory):
    try:
        python, spec = harness.peer_source()
    except LookupError as exc:
        pytest.skip(str(exc))
    caps = fake_capabilities("MI355X", None)  # the newest release of the index: HEAD e4048607
    lay = _layer()
    dp = ad.plan_dispatch(lay, caps, tokens=TOKENS, env=ENV)
    pins = pin.find_pins(lay, caps, dp, env=ENV)
    assert [(p.issue, p.bucket) for p in pins] == [("ROCm/aiter#3933", 4)]
    path = tmp_path_factory.mktemp("pin") / "pinned_fmoe.csv"
    pin.write_pinned(str(path), cfg.config_set_for(caps, ENV).rows, pins)
    key = dp.key
    src = harness.prepare_source(python, spec)
    cases = []
    for cid, env in enumerate((ENV, {**ENV, "AITER_CONFIG_FMOE": str(path)})):
        cases.append(model_side._case(cid, "pin", "MI355X", f"pin {cid}", key, TOKENS,
                                      assumptions=Assumptions(), env=env))
    got = harness.run_aiter(python, src, cases, workers=1)["answers"]
    return pins[0], got[0], got[1], dp


def _kernels(point):
    return (point.get("stage1") or {}).get("kernel"), (point.get("stage2") or {}).get("kernel")


def test_aiter_launches_the_pinned_kernels_from_the_file(aiter_answers):
    p, plain, pinned, _ = aiter_answers
    by_m = {pt["M"]: pt for pt in pinned}
    assert _kernels(by_m[4]) == (p.good.kernel1, p.good.kernel2)
    assert "xcd4" in _kernels({pt["M"]: pt for pt in plain}[4])[0]  # without the pin AITER runs the bad row


def test_the_pin_changes_only_its_bucket(aiter_answers):
    _, plain, pinned, dp = aiter_answers
    before = {pt["M"]: _kernels(pt) for pt in plain}
    after = {pt["M"]: _kernels(pt) for pt in pinned}
    assert {m: k for m, k in after.items() if m != 4} == {m: k for m, k in before.items() if m != 4}
    # and moedispatch's model of the un-pinned set agrees with AITER there
    ours = {s.tokens[0]: tuple(s.kernels) for s in dp.steps}
    assert {m: before[m] for m in before} == {m: ours[m] for m in before}
