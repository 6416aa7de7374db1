"""Cases found by the whole-scope sampled mutation run (benchmarks/mutation.py --sample 0.02 --seed 11): rules no
test pinned on the branch a survivor changed."""

from __future__ import annotations

from moedispatch import plan_model
from moedispatch.testing import fake_capabilities


def _moe(plan):
    return next(d for d in plan.decisions if d.layer.kind == "moe")


def test_a_partition_is_never_predicted_faster_than_its_whole_device():
    """cost/model.py _no_faster_than_the_whole_device: Qwen3-30B-A3B TP8 on an MI300X CPX partition (38 CUs) falls to
    the arch-wide prior at decode, which undercuts the whole MI300X's tuned rows; the partition's cost is raised to
    the whole device's at those token counts (and says so), its token counts kept."""
    cpx = _moe(plan_model("Qwen3-30B-A3B", fake_capabilities("MI300X:CPX", "0.1.20.post1"), 8, 1))
    whole = _moe(plan_model("Qwen3-30B-A3B", fake_capabilities("MI300X", "0.1.20.post1"), 8, 1))
    assert [c.tokens for c in cpx.cost] == [c.tokens for c in whole.cost] == [1, 4, 64, 512, 8192]
    raised = [c for c in cpx.cost if "raised to the whole MI300X's prediction" in c.detail]
    assert [c.tokens for c in raised] == [1, 4]
    for c, w in zip(cpx.cost, whole.cost):
        assert c.us >= w.us * 0.999 and c.low <= c.us <= c.high
    assert all(c.us == w.us for c, w in zip(cpx.cost[:2], whole.cost[:2]))
