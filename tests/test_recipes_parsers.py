"""Issue 14 (6): every recipe the tests print is accepted by the argument parser of the real engine release.

The real vLLM 0.33.0 (``vllm.entrypoints.common.cli_args.make_arg_parser``, the ``vllm serve`` parser) and SGLang
0.5.23 (``ServerArgs.add_cli_args``, the ``sglang.launch_server`` parser) run in ``.peers-venv`` (built by
``tests/peers/setup_env.sh``: the engines installed ``--no-deps`` beside the CPU torch). vLLM's parser needs a
platform to compute its defaults; on this CPU machine vLLM finds none, so the check sets its CPU platform — argument
parsing does not depend on it. Skipped when the venv is absent.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]
PEERS = ROOT / ".peers-venv" / "bin" / "python"

pytestmark = pytest.mark.skipif(not PEERS.exists(), reason="no .peers-venv (tests/peers/setup_env.sh builds it)")

_CHECK = r"""
import argparse, json, sys
cases = json.load(sys.stdin)
out = []
import vllm, sglang
from importlib.metadata import version
assert version("vllm") == "0.33.0" and version("sglang") == "0.5.23", (version("vllm"), version("sglang"))
import vllm.platforms as P
from vllm.platforms.cpu import CpuPlatform
P._current_platform = CpuPlatform()
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.common.cli_args import make_arg_parser
from sglang.srt.server_args import ServerArgs
vp = make_arg_parser(FlexibleArgumentParser())
sp = argparse.ArgumentParser(); ServerArgs.add_cli_args(sp)
class Bad(Exception): pass
def fail(msg): raise Bad(msg)
vp.error = fail; sp.error = fail
for engine, argv in cases:
    try:
        ns = (vp if engine == "vllm" else sp).parse_args(argv)
        out.append({"ok": True, "ns": {k: v for k, v in vars(ns).items() if k in (
            "tensor_parallel_size", "data_parallel_size", "enable_expert_parallel", "moe_backend", "tp_size",
            "ep_size", "dp_size", "enable_dp_attention", "attn_dp_size", "moe_runner_backend", "model_path", "model_tag",
            "attention_backend")}})
    except (Bad, SystemExit) as exc:
        out.append({"ok": False, "error": str(exc)})
json.dump(out, sys.stdout, default=str)
"""


def _parse(cases: list[tuple[str, list[str]]]) -> list[dict]:
    proc = subprocess.run([str(PEERS), "-c", _CHECK], input=json.dumps(cases), capture_output=True, text=True,
                          timeout=600, cwd="/tmp")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _argv(command: str) -> tuple[str, list[str]]:
    toks = shlex.split(command.replace("\\\n", " "))
    if toks[:2] == ["vllm", "serve"]:
        return "vllm", toks[2:]
    assert toks[:3] == ["python3", "-m", "sglang.launch_server"], toks
    return "sglang", toks[3:]


RECIPES = [
    ("MiniMax-M3-MXFP4", "gfx950", 8, 1, "vllm", "0.31.0"),
    ("MiniMax-M3-MXFP4", "gfx950", 8, 1, "sglang", None),
    ("MiniMax-M3-MXFP8", "MI300X", 8, 1, "vllm", None),
    ("Qwen3-30B-A3B", "MI355X", 8, 1, "vllm", None),
    ("Qwen3-30B-A3B", "MI355X", 8, 1, "vllm", "0.30.0"),
    ("Qwen3-30B-A3B", "MI355X", 8, 1, "sglang", None),
    ("Qwen3-30B-A3B", "MI355X", 8, 1, "sglang", "0.5.20"),
    ("Qwen3-30B-A3B", "MI355X", 1, 8, "vllm", None),
    ("Qwen3-30B-A3B", "MI355X", 1, 8, "sglang", None),
    ("Qwen3-30B-A3B", "MI355X", 1, 8, "sglang", "0.5.21"),
    ("Qwen3-30B-A3B", "MI355X", 8, 8, "vllm", None),
    ("Qwen3-30B-A3B", "MI355X", 8, 2, "sglang", None),
    ("DeepSeek-V3", "MI300X", 8, 1, "vllm", None),
    ("DeepSeek-V3", "MI300X", 8, 8, "sglang", None),
    ("gpt-oss-120b", "MI355X", 8, 1, "vllm", None),
    ("gpt-oss-120b", "MI355X", 8, 1, "sglang", None),
    ("gpt-oss-20b", "MI300X", 4, 1, "vllm", None),
    ("gpt-oss-20b", "MI300X", 4, 1, "vllm", "0.29.0"),
]


def test_the_real_engine_parsers_accept_every_recipe(cli):
    """Each recipe command (and each alternative a refused recipe offers) parses with vLLM 0.33.0 / SGLang 0.5.23,
    and the parsed layout is the one the recipe meant (EP over TP×DP for vLLM; world, EP, DP attention for SGLang)."""
    cases, expect = [], []
    for model, target, tp, ep, engine, version in RECIPES:
        argv = ["explain", "--model", model, "--target", target, "--tp", str(tp), "--ep", str(ep), "--recipe", engine,
                "--format", "json"] + (["--engine-version", version] if version else [])
        data = json.loads(cli(*argv).stdout)
        commands = [data["command"]] if data["command"] else []
        commands += [a["command"] for a in data["alternatives"] if a["engine"] in ("vllm", "sglang")]
        assert commands, (model, target, tp, ep, engine, data["reasons"])
        for c in commands:
            cases.append(_argv(c))
            expect.append((engine if c == data["command"] else None, tp, ep, c, version))
    results = _parse(cases)
    assert len(results) == len(cases)
    for (engine, tp, ep, command, version), res in zip(expect, results):
        assert res["ok"], f"{command!r}: {res.get('error')}"
        ns = res["ns"]
        if engine == "vllm":
            assert (ns["tensor_parallel_size"], bool(ns["enable_expert_parallel"])) == (tp, ep > 1), command
            assert ns["tensor_parallel_size"] * ns["data_parallel_size"] == max(tp, ep), command
        elif engine == "sglang":
            assert ns["tp_size"] == max(tp, ep) and ns["ep_size"] == ep, command
            # data-parallel attention: --attn-dp-size from 0.5.22 (the deprecated --dp-size N
            # --enable-dp-attention before it; sglang@v0.5.22 server_args.py:415-422)
            new = version is None or tuple(map(int, version.split("."))) >= (0, 5, 22)
            width = ns["attn_dp_size"] if new else (ns["dp_size"] if ns["enable_dp_attention"] else 1)
            assert width == (ep // tp if ep > tp else 1), command
            assert not (new and ns["enable_dp_attention"]), command


def test_the_real_parsers_reject_what_the_engines_reject():
    """The check can fail: a flag the engine does not have, or a --moe-backend value it does not accept."""
    results = _parse([("vllm", ["m", "--moe-backend", "ck"]), ("vllm", ["m", "--tp-size", "8"]),
                      ("sglang", ["--model-path", "m", "--moe-runner-backend", "emulation"])])
    assert [r["ok"] for r in results] == [False, False, False]
