"""Data-parallel attention as the REAL SGLang 0.5.23 resolves it, read back by the guard and lint.

SGLang 0.5.23 deprecates ``--dp-size N --enable-dp-attention`` for ``--attn-dp-size N`` (server_args.py) and resolves
the old spelling to ``attn_dp_size = N, dp_size = 1`` with the flag turned off (arg_groups/parallel_hook.py
``_handle_deprecated_dp_attention``). The guard reads the *resolved* server args (``launch_from``): it saw
``--tp-size 8`` and planned attention TP 8 for a launch whose attention runs at TP 2; lint ignored ``--attn-dp-size``.
Here both spellings go through ``ServerArgs.resolve_once`` and the command line the guard rebuilds from them is
planned by lint's layout: attention TP = tp_size // attn_dp_size (runtime_context.py derive_attn_tp_size)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from peers import has_sglang, peers_python

HERE = Path(__file__).resolve().parent
PY = peers_python()
pytestmark = pytest.mark.skipif(PY is None or not has_sglang(PY), reason="no engine environment with SGLang")

_SIDE = r"""
import json, logging, os, sys, warnings
logging.disable(logging.WARNING); warnings.simplefilter("ignore")
import transformers.utils.import_utils as iu
iu.is_torchvision_available()   # decide "no torchvision" before the stand-in (as sglang_guard_side.py)
sys.path.insert(0, os.path.join(sys.argv[1], "stubs_sglang"))
from sglang.srt.server_args import ServerArgs
from moedispatch.guard import sglang as g
from moedispatch.engines import lint as L
out = {}
for name, kw in json.loads(sys.argv[3]).items():
    sa = ServerArgs(model_path=sys.argv[2], tp_size=8, skip_tokenizer_init=True, device="cpu", **kw)
    sa.resolve_once()
    argv = g.launch_from(sa)
    out[name] = {"argv": argv, "layout": list(L._plan_layout(L.parse_launch(None, argv))),
                 "attn_dp_size": sa.attn_dp_size if hasattr(sa, "attn_dp_size") else None}
print(json.dumps(out))
"""

CASES = {"deprecated": {"dp_size": 4, "enable_dp_attention": True}, "new": {"attn_dp_size": 4}, "plain": {}}


@pytest.fixture(scope="module")
def resolved(tmp_path_factory):
    config = json.loads((HERE.parents[1] / "capability_db" / "models" / "Qwen3-30B-A3B.json").read_text())["config"]
    folder = tmp_path_factory.mktemp("qwen3")
    (folder / "config.json").write_text(json.dumps(config))
    proc = subprocess.run([PY, "-c", _SIDE, str(HERE), str(folder), json.dumps(CASES)], capture_output=True,
                          text=True, timeout=600, cwd="/tmp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("case", ["deprecated", "new"])
def test_both_spellings_plan_attention_tp_over_the_resolved_width(resolved, case):
    r = resolved[case]
    assert "--attn-dp-size" in r["argv"] and r["argv"][r["argv"].index("--attn-dp-size") + 1] == "4"
    assert r["layout"] == [8, 1, 2]          # MoE TP 8 (no EP), attention TP 8 // 4


def test_without_data_parallel_attention_attention_runs_over_the_whole_tp(resolved):
    assert "--attn-dp-size" not in resolved["plain"]["argv"] and resolved["plain"]["layout"] == [8, 1, 8]


_RESOLVE = r"""
import json, logging, os, sys, warnings
logging.disable(logging.WARNING); warnings.simplefilter("ignore")
import transformers.utils.import_utils as iu
iu.is_torchvision_available()
sys.path.insert(0, os.path.join(sys.argv[1], "stubs_sglang"))
from sglang.srt.server_args import prepare_server_args
from sglang.srt.arg_groups.overrides import resolved_view
out = {}
for name, argv in json.loads(sys.argv[2]).items():
    try:
        sa = prepare_server_args(argv + ["--skip-tokenizer-init", "--device", "cpu"])
        sa.resolve_once()
    except (ValueError, SystemExit) as exc:
        out[name] = {"error": str(exc)}
        continue
    v = resolved_view(sa)
    out[name] = {k: getattr(v, k, None) for k in ("tp_size", "ep_size", "dp_size", "attn_dp_size")}
print(json.dumps(out))
"""


def test_recipes_and_lint_fixes_spell_data_parallel_attention_for_the_release(tmp_path):
    """Recipes printed the deprecated ``--dp-size N --enable-dp-attention`` for SGLang 0.5.23 (removed after
    2026-12-31), and lint's "full recipe" for a launch written the other way kept both spellings — a command SGLang
    refuses ("--dp-size 8 with --attn-dp-size 8: data-parallel replicas combined with attention data parallelism are
    not supported"). The 0.5.23 recipe, the 0.5.21 recipe and lint's fix of the deprecated spelling all resolve, through
    SGLang 0.5.23's real parser and resolution, to the same layout."""
    import shlex

    from moedispatch import plan_model, target
    from moedispatch.engines.lint import lint_launch, parse_launch
    from moedispatch.engines.recipes import build_recipe

    config = json.loads((HERE.parents[1] / "capability_db" / "models" / "Qwen3-30B-A3B.json").read_text())["config"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    plan = plan_model("Qwen3-30B-A3B", target("MI355X", "0.1.20"), tp=1, ep=8)
    cases = {}
    for version in ("0.5.23", "0.5.21"):
        args = [t for a in build_recipe(plan, "sglang", version).args for t in shlex.split(a["arg"])]
        cases[version] = ["--model-path", str(tmp_path)] + args
    user = f"python3 -m sglang.launch_server --model-path {tmp_path} --tp-size 8 --dp-size 8 --enable-dp-attention " \
           "--ep-size 8"
    doc = lint_launch(parse_launch(user), target="MI355X", aiter_version="0.1.20")
    fixes = {f["fix"].split("the full recipe: ", 1)[1] for f in doc["findings"] if "the full recipe: " in (f["fix"] or "")}
    assert len(fixes) == 1, doc["findings"]
    fix = shlex.split(fixes.pop())
    cases["lint fix"] = fix[fix.index("sglang.launch_server") + 1:]
    cases["both spellings"] = cases["0.5.23"] + ["--dp-size", "8", "--enable-dp-attention"]
    proc = subprocess.run([PY, "-c", _RESOLVE, str(HERE), json.dumps(cases)], capture_output=True, text=True,
                          timeout=600, cwd="/tmp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "--attn-dp-size" in cases["0.5.23"] and "--enable-dp-attention" not in cases["0.5.23"]
    assert "--enable-dp-attention" in cases["0.5.21"] and "--attn-dp-size" not in cases["0.5.21"]
    assert "--enable-dp-attention" not in cases["lint fix"]
    want = {"tp_size": 8, "ep_size": 8, "dp_size": 1, "attn_dp_size": 8}
    assert out["0.5.23"] == out["0.5.21"] == out["lint fix"] == want, out
    assert "not supported" in out["both spellings"]["error"]     # what the old merge printed: the check can fail
